//! The execution seam: a planned call, its guard, and the local dispatcher.

use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::SideEffectRecord;
use soulbase_types::{CallId, TenantId, ToolId};

use crate::builtin::BuiltinExecutor;
use crate::guard::Operation;
use crate::report::Reporter;
use crate::{Profile, ProviderBinding, ProviderKind, is_valid_host};

/// One call, planned and ready for the sandbox.
#[derive(Debug)]
pub struct ExecRequest<'a> {
    /// The call.
    pub call_id: &'a CallId,
    /// The caller's tenant (paths and hosts are per tenant).
    pub tenant: &'a TenantId,
    /// The tool.
    pub tool: &'a ToolId,
    /// How the tool executes.
    pub provider: &'a ProviderBinding,
    /// The validated arguments.
    pub args: Value,
    /// What the call may do.
    pub profile: &'a Profile,
    /// The wall-clock budget (the pipeline also enforces it).
    pub timeout: Duration,
    /// The largest output accepted, in bytes.
    pub max_bytes_out: Option<u64>,
    /// The memory cap of a native tool, in bytes (the manifest's
    /// `limits.max_memory_bytes`); `None`: the executor's default.
    pub max_memory_bytes: Option<u64>,
    /// The most processes a native tool may have at once (the manifest's
    /// `limits.max_processes`); `None`: the executor's default.
    pub max_processes: Option<u32>,
    /// The most files a call may leave in its scratch space (every executor that
    /// grants one counts them when the tool ends) and, for a native tool, the most
    /// descriptors it may hold open beyond stdin, stdout and stderr
    /// (`RLIMIT_NOFILE`, never above the executor's own cap): the manifest's
    /// `limits.max_files`. `None`: the executor's defaults.
    pub max_files: Option<u32>,
    /// Where the tool's progress and log messages go while it runs
    /// ([`Reporter::none`] when the caller's surface cannot deliver them).
    pub reporter: Reporter,
}

/// What an execution produced.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecOutput {
    /// The raw output (validated against the output schema by the pipeline).
    pub output: Value,
    /// Side effects the executor observed or performed.
    pub side_effects: Vec<SideEffectRecord>,
    /// The CPU time the call used, in whole milliseconds rounded up
    /// ([`crate::cpu::cpu_ms`]), when the executor measures it: the process
    /// executor, the tool's processes (rusage); the WASM executor, the thread that
    /// ran the module; builtins, the handler's polls ([`crate::cpu::Metered`]);
    /// HTTP, `None` (the CPU is the remote service's). The pipeline records it in
    /// the End's usage and charges it to `cpu_ms` budgets (`None` counts as 0).
    pub cpu_ms: Option<u64>,
}

impl ExecOutput {
    /// An output with no side effects recorded.
    pub fn value(output: Value) -> Self {
        Self {
            output,
            side_effects: Vec::new(),
            cpu_ms: None,
        }
    }
}

/// The sandbox seam: side effects happen only through it (SB-08 invariant 3).
#[async_trait]
pub trait Sandbox: Send + Sync + 'static {
    /// Rejects, before anything runs, a call whose plan lies outside its profile
    /// (`SANDBOX.CAPABILITY_BLOCKED`) or whose provider is unavailable here.
    fn guard(&self, req: &ExecRequest<'_>) -> Result<(), SoulError>;
    /// Runs the call.
    async fn execute(&self, req: ExecRequest<'_>) -> Result<ExecOutput, SoulError>;
}

/// Does `pattern` (exact host or `*.label` wildcard) cover `host`? Compared by labels,
/// never by string suffix: `*.example.com` covers `a.example.com`, not `evilexample.com`
/// nor `example.com` itself.
pub fn host_matches(pattern: &str, host: &str) -> bool {
    let pattern = pattern.to_ascii_lowercase();
    let host = host.to_ascii_lowercase();
    match pattern.strip_prefix("*.") {
        Some(suffix) => host
            .split_once('.')
            .is_some_and(|(first, rest)| !first.is_empty() && rest == suffix),
        None => pattern == host,
    }
}

/// The host part of an URL authority: `[::1]:8080` → `::1`, `a.b:443` → `a.b`.
fn authority_host(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    match authority.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => authority,
    }
}

fn blocked(what: String) -> SoulError {
    SoulError::of(ErrorCode::SandboxCapabilityBlocked).with_note(what)
}

/// The parts of an HTTP endpoint the guard checks: `(scheme, host, port)`, the host
/// without IPv6 brackets and the port defaulted from the scheme.
pub fn endpoint_parts(endpoint: &str) -> Option<(&str, &str, u16)> {
    let (scheme, rest) = endpoint.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = authority_host(authority);
    let port = if let Some(after) = authority.strip_prefix('[') {
        after.split_once("]:").map(|(_, p)| p)
    } else {
        authority.rsplit_once(':').map(|(_, p)| p)
    };
    let port = match port {
        Some(p) => p.parse::<u16>().ok()?,
        None => match scheme {
            "https" => 443,
            "http" => 80,
            _ => return None,
        },
    };
    Some((scheme, host, port))
}

/// Checks a provider binding against a profile: the operations its provider implies
/// must be granted (an HTTP endpoint's scheme, host, port and `POST` by `net`, a
/// process's command by `proc`).
pub fn guard_provider(provider: &ProviderBinding, profile: &Profile) -> Result<(), SoulError> {
    match provider {
        ProviderBinding::Builtin { .. } | ProviderBinding::Wasm { .. } => Ok(()),
        ProviderBinding::Http { endpoint, .. } => {
            let Some((scheme, host, port)) = endpoint_parts(endpoint) else {
                return Err(blocked(format!("endpoint {endpoint:?} is not valid")));
            };
            if !is_valid_host(host) {
                return Err(blocked(format!("endpoint host {host:?} is not valid")));
            }
            profile.check(
                &Operation::Net {
                    scheme,
                    host,
                    port,
                    method: Some("POST"),
                },
                None,
            )
        }
        ProviderBinding::Process { command, .. } => {
            profile.check(&Operation::Exec { command }, None)
        }
    }
}

/// An executor for one provider kind, plugged into [`LocalSandbox`] with
/// [`LocalSandbox::with_executor`]. The edge crates (`soulbase-sandbox-http`,
/// `-wasm`, `-process`) implement it; this crate cannot depend on them.
#[async_trait]
pub trait Executor: Send + Sync + 'static {
    /// Checks, before anything runs, what this executor can know from the request
    /// alone (module present and pinned, command resolvable, …). The provider-level
    /// capability checks of [`guard_provider`] have already passed.
    fn guard(&self, req: &ExecRequest<'_>) -> Result<(), SoulError>;
    /// Runs the call under its profile.
    async fn execute(&self, req: ExecRequest<'_>) -> Result<ExecOutput, SoulError>;
}

#[async_trait]
impl Executor for BuiltinExecutor {
    fn guard(&self, req: &ExecRequest<'_>) -> Result<(), SoulError> {
        BuiltinExecutor::guard(self, req)
    }

    async fn execute(&self, req: ExecRequest<'_>) -> Result<ExecOutput, SoulError> {
        BuiltinExecutor::execute(self, req).await
    }
}

/// The in-process sandbox: guards each call and dispatches it to the executor for its
/// provider kind. Builtin tools run on the [`BuiltinExecutor`] given to [`new`];
/// other kinds run on executors plugged in with [`with_executor`]. A kind without an
/// executor refuses with `PROVIDER.UNAVAILABLE`.
///
/// [`new`]: LocalSandbox::new
/// [`with_executor`]: LocalSandbox::with_executor
#[derive(Clone, Default)]
pub struct LocalSandbox {
    builtin: Arc<BuiltinExecutor>,
    executors: HashMap<ProviderKind, Arc<dyn Executor>>,
}

impl LocalSandbox {
    /// A sandbox running builtin tools from `builtin`.
    pub fn new(builtin: BuiltinExecutor) -> Self {
        Self {
            builtin: Arc::new(builtin),
            executors: HashMap::new(),
        }
    }

    /// Plugs in (or replaces) the executor for `kind`. Plugging one in for
    /// [`ProviderKind::Builtin`] replaces the builtin executor given to `new`.
    pub fn with_executor(mut self, kind: ProviderKind, executor: Arc<dyn Executor>) -> Self {
        self.executors.insert(kind, executor);
        self
    }

    /// The builtin executor.
    pub fn builtin(&self) -> &BuiltinExecutor {
        &self.builtin
    }

    fn executor(&self, kind: ProviderKind) -> Result<&dyn Executor, SoulError> {
        if let Some(e) = self.executors.get(&kind) {
            return Ok(e.as_ref());
        }
        match kind {
            ProviderKind::Builtin => Ok(self.builtin.as_ref()),
            other => Err(SoulError::of(ErrorCode::ProviderUnavailable)
                .with_note(format!("no {} executor is configured", other.as_str()))),
        }
    }
}

#[async_trait]
impl Sandbox for LocalSandbox {
    fn guard(&self, req: &ExecRequest<'_>) -> Result<(), SoulError> {
        guard_provider(req.provider, req.profile)?;
        self.executor(req.provider.kind())?.guard(req)
    }

    async fn execute(&self, req: ExecRequest<'_>) -> Result<ExecOutput, SoulError> {
        let executor = self.executor(req.provider.kind())?;
        executor.execute(req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Capability;

    #[test]
    fn authority_parsing() {
        assert_eq!(authority_host("[::1]:8080"), "::1");
        assert_eq!(authority_host("a.example.com:443"), "a.example.com");
        assert_eq!(authority_host("a.example.com"), "a.example.com");
    }

    #[test]
    fn host_wildcards_are_label_based() {
        assert!(host_matches("example.com", "example.com"));
        assert!(host_matches("example.com", "EXAMPLE.com"));
        assert!(!host_matches("example.com", "evilexample.com"));
        assert!(host_matches("*.example.com", "api.example.com"));
        assert!(!host_matches("*.example.com", "example.com"));
        assert!(!host_matches("*.example.com", "evilexample.com"));
        assert!(!host_matches("*.example.com", "a.b.example.com"));
    }

    fn http(endpoint: &str) -> ProviderBinding {
        ProviderBinding::Http {
            endpoint: endpoint.into(),
            path: None,
            headers: Default::default(),
            timeout_ms: None,
        }
    }

    #[test]
    fn provider_guard_requires_the_matching_grant() {
        let net = Profile::new(vec![Capability::Net {
            hosts: vec!["api.example.com".into()],
            schemes: vec![],
            ports: vec![],
            methods: vec![],
        }]);
        assert!(guard_provider(&http("https://api.example.com:8443"), &net).is_ok());
        let err = guard_provider(&http("https://evilapi.example.com"), &net).unwrap_err();
        assert_eq!(err.code(), ErrorCode::SandboxCapabilityBlocked);
        let none = Profile::new(vec![]);
        assert!(guard_provider(&http("https://api.example.com"), &none).is_err());
        let proc = ProviderBinding::Process {
            command: "/usr/bin/jq".into(),
            args: vec![],
        };
        assert!(guard_provider(&proc, &none).is_err());
        let wrong_port = Profile::new(vec![Capability::Net {
            hosts: vec!["api.example.com".into()],
            schemes: vec!["https".into()],
            ports: vec![443],
            methods: vec!["GET".into()],
        }]);
        assert!(guard_provider(&http("https://api.example.com:8443"), &wrong_port).is_err());
        assert!(guard_provider(&http("https://api.example.com"), &wrong_port).is_err());
        assert_eq!(
            endpoint_parts("http://[::1]:9000/"),
            Some(("http", "::1", 9000))
        );
        assert_eq!(endpoint_parts("https://a.io"), Some(("https", "a.io", 443)));
        let granted = Profile::new(vec![Capability::Proc {
            commands: vec!["/usr/bin/jq".into()],
        }]);
        assert!(guard_provider(&proc, &granted).is_ok());
    }
}
