//! The `sandbox` role over gRPC (`soulbase.sandbox.v1`): a server over an
//! in-process [`Sandbox`], and a client implementing the same seam, so a `tools`
//! role can run its planned calls in another process.
//!
//! - [`SandboxRoleService`] serves `Sandbox.Execute`: it rebuilds the planned call
//!   from the request, narrows the caller's capability profile by this role's own
//!   grant for the tenant and ceiling (`sandbox.grants`, `sandbox.ceiling`), guards
//!   it and runs it under a wall-clock limit.
//! - [`RemoteSandbox`] is the client [`Sandbox`]: its `guard` runs the pure
//!   provider-level checks locally ([`guard_provider`]), its `execute` sends the call
//!   with a deadline of the call's timeout plus a grace period.
//!
//! Refusals travel as statuses with `ErrorDetail`, so the remote sandbox answers
//! exactly the code the local one would (`SANDBOX.CAPABILITY_BLOCKED`,
//! `PROVIDER.UNAVAILABLE`, …). When an internal token is configured, every RPC must
//! carry it in [`INTERNAL_TOKEN_HEADER`](crate::roles::INTERNAL_TOKEN_HEADER).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use soulbase_errors::ErrorCode;
use soulbase_errors::SoulError;
use soulbase_observe::SideEffectRecord;
use soulbase_proto::soulbase::sandbox::v1 as sandbox_pb;
use soulbase_sandbox::{
    Capability, ExecOutput, ExecRequest, IntersectingProfiles, Profile, ProviderBinding, Sandbox,
    guard_provider,
};
use soulbase_types::{CallId, TenantId};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::convert;
use crate::roles::{check_token, role_error, transport_error, with_token};

/// The wall-clock budget of a call whose request carries `timeout_ms = 0`.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(30);

/// How much longer than the call's own timeout the client waits for the response,
/// so the server's timeout (not the transport deadline) normally decides.
pub const EXEC_DEADLINE_GRACE: Duration = Duration::from_secs(2);

/// The longest `timeout_ms` the sandbox role accepts (the manifest's own limit).
pub const MAX_EXEC_TIMEOUT_MS: u64 = soulbase_tools::manifest::MAX_TIMEOUT_MS;

/// The largest request or response message of the sandbox role, in bytes: outputs
/// and arguments are bounded by the manifest's limits, not by tonic's 4 MiB default.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// The owned parts of one `ExecuteRequest`, parsed and validated.
struct ParsedExec {
    call_id: CallId,
    tenant: TenantId,
    tool: soulbase_types::ToolId,
    provider: ProviderBinding,
    args: Value,
    capabilities: Vec<Capability>,
    timeout: Duration,
    max_bytes_out: Option<u64>,
    max_memory_bytes: Option<u64>,
    max_processes: Option<u32>,
    max_files: Option<u32>,
}

fn parse_json<T: serde::de::DeserializeOwned>(field: &str, text: &str) -> Result<T, SoulError> {
    serde_json::from_str(text)
        .map_err(|e| convert::invalid(field, format!("{field} is not valid: {e}")))
}

fn parse_exec(r: &sandbox_pb::ExecuteRequest) -> Result<ParsedExec, SoulError> {
    Ok(ParsedExec {
        call_id: CallId::new(&r.call_id).map_err(|e| {
            convert::invalid("call_id", format!("call_id is invalid: {}", e.reason))
        })?,
        tenant: TenantId::new(&r.tenant)
            .map_err(|e| convert::invalid("tenant", format!("tenant is invalid: {}", e.reason)))?,
        tool: convert::tool_id("tool_id", &r.tool_id)?,
        provider: parse_json("provider_json", &r.provider_json)?,
        args: parse_json("arguments_json", &r.arguments_json)?,
        capabilities: parse_json("capabilities_json", &r.capabilities_json)?,
        timeout: match r.timeout_ms {
            0 => DEFAULT_EXEC_TIMEOUT,
            ms if ms > MAX_EXEC_TIMEOUT_MS => {
                return Err(convert::invalid(
                    "timeout_ms",
                    format!("timeout_ms must be at most {MAX_EXEC_TIMEOUT_MS}"),
                ));
            }
            ms => Duration::from_millis(ms),
        },
        max_bytes_out: (r.max_bytes_out > 0).then_some(r.max_bytes_out),
        max_memory_bytes: (r.max_memory_bytes > 0).then_some(r.max_memory_bytes),
        max_processes: (r.max_processes > 0).then_some(r.max_processes),
        max_files: (r.max_files > 0).then_some(r.max_files),
    })
}

fn json_text<T: serde::Serialize>(what: &str, value: &T) -> Result<String, SoulError> {
    serde_json::to_string(value).map_err(|e| transport_error(format!("{what}: {e}")))
}

/// Serves `soulbase.sandbox.v1.Sandbox` over an in-process [`Sandbox`].
///
/// Every call's profile is re-derived here before the guard runs: the capabilities
/// the caller planned, intersected with this process's own grant for the call's
/// tenant and its ceiling ([`IntersectingProfiles::compute`]). So this process never
/// grants more than its own configuration allows, whatever the calling `tools` role
/// computed — with the same `sandbox` configuration on both, the profile is unchanged.
#[derive(Clone)]
pub struct SandboxRoleService {
    sandbox: Arc<dyn Sandbox>,
    profiles: Arc<IntersectingProfiles>,
    token: Option<Arc<str>>,
}

impl std::fmt::Debug for SandboxRoleService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxRoleService").finish_non_exhaustive()
    }
}

impl SandboxRoleService {
    /// A service over `sandbox`; `profiles` (this process's `sandbox.grants` and
    /// `sandbox.ceiling`) bounds every call's profile; `token`, when set, is required
    /// on every RPC.
    pub fn new(
        sandbox: Arc<dyn Sandbox>,
        profiles: Arc<IntersectingProfiles>,
        token: Option<String>,
    ) -> Self {
        Self {
            sandbox,
            profiles,
            token: token.map(Arc::from),
        }
    }

    /// The tonic server for this service (messages up to [`MAX_MESSAGE_BYTES`]).
    pub fn into_server(self) -> sandbox_pb::sandbox_server::SandboxServer<Self> {
        sandbox_pb::sandbox_server::SandboxServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// The profile a call runs under here: its planned capabilities narrowed by this
    /// process's grant for the tenant and its ceiling.
    fn profile(&self, p: &ParsedExec) -> Profile {
        let narrowed = self.profiles.compute(&p.tenant, &p.capabilities);
        if narrowed.capabilities() != p.capabilities.as_slice() {
            tracing::warn!(
                call_id = %p.call_id,
                tenant = %p.tenant,
                tool_id = %p.tool,
                "this sandbox's grant or ceiling narrowed the call's capability profile"
            );
        }
        narrowed
    }

    async fn run(&self, r: &sandbox_pb::ExecuteRequest) -> Result<ExecOutput, SoulError> {
        let p = parse_exec(r)?;
        let profile = self.profile(&p);
        let req = ExecRequest {
            call_id: &p.call_id,
            tenant: &p.tenant,
            tool: &p.tool,
            provider: &p.provider,
            args: p.args.clone(),
            profile: &profile,
            timeout: p.timeout,
            max_bytes_out: p.max_bytes_out,
            max_memory_bytes: p.max_memory_bytes,
            max_processes: p.max_processes,
            max_files: p.max_files,
            reporter: soulbase_sandbox::Reporter::none(),
        };
        self.sandbox.guard(&req)?;
        let limit = p.timeout.saturating_add(Duration::from_secs(1));
        tokio::time::timeout(limit, self.sandbox.execute(req))
            .await
            .unwrap_or_else(|_| {
                Err(SoulError::of(ErrorCode::ProviderTimeout)
                    .with_note(format!("the sandbox role stopped the call after {limit:?}")))
            })
    }
}

#[tonic::async_trait]
impl sandbox_pb::sandbox_server::Sandbox for SandboxRoleService {
    async fn execute(
        &self,
        request: Request<sandbox_pb::ExecuteRequest>,
    ) -> Result<Response<sandbox_pb::ExecuteResponse>, Status> {
        check_token(self.token.as_deref(), &request)?;
        let out = self
            .run(request.get_ref())
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(sandbox_pb::ExecuteResponse {
            output_json: json_text("output", &out.output).map_err(|e| e.to_status())?,
            side_effects_json: json_text("side effects", &out.side_effects)
                .map_err(|e| e.to_status())?,
            cpu_ms: out.cpu_ms.unwrap_or(0),
        }))
    }
}

/// The `sandbox` role reached over gRPC, as a [`Sandbox`]. Cheap to clone.
#[derive(Clone)]
pub struct RemoteSandbox {
    client: sandbox_pb::sandbox_client::SandboxClient<Channel>,
    token: Option<Arc<str>>,
}

impl std::fmt::Debug for RemoteSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSandbox").finish_non_exhaustive()
    }
}

impl RemoteSandbox {
    /// A client over `channel`, sending `token` as the internal token when set.
    pub fn new(channel: Channel, token: Option<String>) -> Self {
        Self {
            client: sandbox_pb::sandbox_client::SandboxClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            token: token.map(Arc::from),
        }
    }

    fn body(req: &ExecRequest<'_>) -> Result<sandbox_pb::ExecuteRequest, SoulError> {
        Ok(sandbox_pb::ExecuteRequest {
            call_id: req.call_id.to_string(),
            tenant: req.tenant.to_string(),
            tool_id: req.tool.to_string(),
            provider_json: serde_json::to_string(req.provider).map_err(SoulError::internal)?,
            arguments_json: serde_json::to_string(&req.args).map_err(SoulError::internal)?,
            capabilities_json: serde_json::to_string(req.profile.capabilities())
                .map_err(SoulError::internal)?,
            timeout_ms: u64::try_from(req.timeout.as_millis()).unwrap_or(u64::MAX),
            max_bytes_out: req.max_bytes_out.unwrap_or(0),
            max_memory_bytes: req.max_memory_bytes.unwrap_or(0),
            max_processes: req.max_processes.unwrap_or(0),
            max_files: req.max_files.unwrap_or(0),
        })
    }
}

fn output_from_proto(r: sandbox_pb::ExecuteResponse) -> Result<ExecOutput, SoulError> {
    let output: Value = serde_json::from_str(&r.output_json)
        .map_err(|e| transport_error(format!("malformed output_json: {e}")))?;
    let side_effects: Vec<SideEffectRecord> = if r.side_effects_json.is_empty() {
        Vec::new()
    } else {
        serde_json::from_str(&r.side_effects_json)
            .map_err(|e| transport_error(format!("malformed side_effects_json: {e}")))?
    };
    Ok(ExecOutput {
        output,
        side_effects,
        cpu_ms: (r.cpu_ms > 0).then_some(r.cpu_ms),
    })
}

#[tonic::async_trait]
impl Sandbox for RemoteSandbox {
    /// The provider-level capability checks, locally (pure); the executor-specific
    /// checks run on the sandbox role when the call is executed.
    fn guard(&self, req: &ExecRequest<'_>) -> Result<(), SoulError> {
        guard_provider(req.provider, req.profile)
    }

    async fn execute(&self, req: ExecRequest<'_>) -> Result<ExecOutput, SoulError> {
        let deadline = req.timeout.saturating_add(EXEC_DEADLINE_GRACE);
        let mut request = with_token(self.token.as_deref(), Self::body(&req)?);
        request.set_timeout(deadline);
        let response = self
            .client
            .clone()
            .execute(request)
            .await
            .map_err(|s| role_error(&s))?;
        output_from_proto(response.into_inner())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn request() -> sandbox_pb::ExecuteRequest {
        sandbox_pb::ExecuteRequest {
            call_id: CallId::generate().to_string(),
            tenant: "acme".into(),
            tool_id: "soulbase.test.echo".into(),
            provider_json: r#"{"type":"builtin"}"#.into(),
            arguments_json: "{}".into(),
            capabilities_json: "[]".into(),
            timeout_ms: 0,
            max_bytes_out: 0,
            max_memory_bytes: 0,
            max_processes: 0,
            max_files: 0,
        }
    }

    #[test]
    fn defaults_and_field_names() {
        let p = parse_exec(&request()).unwrap();
        assert_eq!(p.timeout, DEFAULT_EXEC_TIMEOUT);
        assert_eq!(p.max_bytes_out, None);
        for (field, mutate) in [
            (
                "call_id",
                Box::new(|r: &mut sandbox_pb::ExecuteRequest| r.call_id = "bad id!".into())
                    as Box<dyn Fn(&mut sandbox_pb::ExecuteRequest)>,
            ),
            ("tenant", Box::new(|r| r.tenant = String::new())),
            ("tool_id", Box::new(|r| r.tool_id = "not a tool".into())),
            ("provider_json", Box::new(|r| r.provider_json = "{}".into())),
            (
                "arguments_json",
                Box::new(|r| r.arguments_json = "{".into()),
            ),
            (
                "capabilities_json",
                Box::new(|r| r.capabilities_json = r#"[{"kind":"gpu"}]"#.into()),
            ),
        ] {
            let mut r = request();
            mutate(&mut r);
            let e = parse_exec(&r).err().unwrap();
            assert_eq!(e.code(), ErrorCode::SchemaValidationFailed, "{field}");
            assert_eq!(e.field("field"), Some(field));
        }
    }

    #[test]
    fn malformed_responses_are_provider_errors() {
        let e = output_from_proto(sandbox_pb::ExecuteResponse {
            output_json: "{".into(),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e.code(), ErrorCode::ProviderUnavailable);
        let ok = output_from_proto(sandbox_pb::ExecuteResponse {
            output_json: "1".into(),
            side_effects_json: String::new(),
            cpu_ms: 0,
        })
        .unwrap();
        assert_eq!(ok, ExecOutput::value(serde_json::json!(1)));
    }
}
