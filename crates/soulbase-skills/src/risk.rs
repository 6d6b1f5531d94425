//! From a skill tool's declaration to a full [`ToolManifest`].
//!
//! The mapping (documented in the crate docs):
//!
//! | provider | side effect | capability granted |
//! |---|---|---|
//! | builtin, wasm | `none` | — |
//! | http | `network` | `net` for the endpoint's host |
//! | process | `process` | `proc` for the command (consent always required, R1) |
//!
//! | risk_level | safety class | consent |
//! |---|---|---|
//! | read | low | not required |
//! | write | medium | required |
//! | destructive | high | required |

use semver::Version;
use serde_json::Value;
use soulbase_sandbox::{Capability, ProviderBinding, TemplatePart, parse_env_template};
use soulbase_tools::ToolManifest;
use soulbase_tools::manifest::{ConsentPolicy, Limits, SafetyClass, SideEffect};
use soulbase_types::ToolId;

use crate::model::RiskLevel;

/// What a skill says about one of its tools.
#[derive(Debug, Clone)]
pub struct ToolDecl {
    /// `skills.<skill>.<tool>`.
    pub id: ToolId,
    /// The skill's version, or `0.0.0`.
    pub version: Version,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON Schema of the arguments.
    pub input_schema: Value,
    /// JSON Schema of the result (`{}` accepts any JSON).
    pub output_schema: Value,
    /// How it executes.
    pub provider: ProviderBinding,
    /// Its risk.
    pub risk: RiskLevel,
    /// Its timeout, if declared.
    pub timeout_ms: Option<u64>,
    /// Discovery tags.
    pub tags: Vec<String>,
    /// The plain name MCP lists the tool under (the manifest's `mcp_name`).
    pub mcp_name: Option<String>,
    /// Whether its output carries MCP content blocks (the manifest's
    /// `output_content`).
    pub output_content: bool,
}

/// The host of an `http(s)://host[:port]` endpoint.
pub fn endpoint_host(endpoint: &str) -> Option<String> {
    let rest = endpoint.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next()?.to_owned()
    } else {
        authority
            .rsplit_once(':')
            .map_or(authority, |(h, _)| h)
            .to_owned()
    };
    (!host.is_empty()).then_some(host)
}

/// Builds the manifest for `decl` (validation happens in `compile`).
pub fn manifest(decl: ToolDecl) -> ToolManifest {
    let (side_effect, capabilities) = match &decl.provider {
        ProviderBinding::Builtin { .. } | ProviderBinding::Wasm { .. } => {
            (SideEffect::None, Vec::new())
        }
        ProviderBinding::Http { endpoint, .. } => (
            SideEffect::Network,
            endpoint_host(endpoint)
                .map(|h| {
                    vec![Capability::Net {
                        hosts: vec![h],
                        schemes: Vec::new(),
                        ports: Vec::new(),
                        methods: Vec::new(),
                    }]
                })
                .unwrap_or_default(),
        ),
        ProviderBinding::Process { command, .. } => (
            SideEffect::Process,
            vec![Capability::Proc {
                commands: vec![command.clone()],
            }],
        ),
    };
    let safety_class = match decl.risk {
        RiskLevel::Read => SafetyClass::Low,
        RiskLevel::Write => SafetyClass::Medium,
        RiskLevel::Destructive => SafetyClass::High,
    };
    let consent_required = decl.risk != RiskLevel::Read || side_effect == SideEffect::Process;
    let mut limits = Limits::default();
    if let Some(t) = decl.timeout_ms {
        limits.timeout_ms = t;
    }
    ToolManifest {
        name: decl.id.name().to_owned(),
        id: decl.id,
        version: decl.version,
        display_name: None,
        description: decl.description,
        tags: decl.tags,
        input_schema: decl.input_schema,
        output_schema: decl.output_schema,
        scopes: Vec::new(),
        capabilities,
        side_effect,
        safety_class,
        consent: ConsentPolicy {
            required: consent_required,
            ttl_ms: None,
            scope: None,
        },
        limits,
        concurrency: Default::default(),
        idempotency: Default::default(),
        provider_compat: Default::default(),
        deprecations: Vec::new(),
        provider: decl.provider,
        obligations: Vec::new(),
        mcp_name: decl.mcp_name,
        output_content: decl.output_content,
    }
}

/// Checks `${NAME}` references in a header value: returns the referenced names, or
/// a reason when the syntax is broken. Expansion itself happens at execution time
/// in the HTTP executor, so secrets never enter manifests, digests or listings.
pub fn env_refs(value: &str) -> Result<Vec<String>, String> {
    Ok(parse_env_template(value)?
        .into_iter()
        .filter_map(|p| match p {
            TemplatePart::Var(name) => Some(name.to_owned()),
            TemplatePart::Text(_) => None,
        })
        .collect())
}

/// Expands `${NAME}` references in `value` with `lookup` (for tests and tools that
/// render a template themselves; it has no allow-list — the HTTP executor's does);
/// an unset variable is an error naming it.
pub fn expand_env(value: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    for part in parse_env_template(value)? {
        match part {
            TemplatePart::Text(t) => out.push_str(t),
            TemplatePart::Var(name) => out.push_str(
                &lookup(name).ok_or_else(|| format!("environment variable {name} is not set"))?,
            ),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_references() {
        assert_eq!(env_refs("Bearer ${TOKEN}").unwrap(), ["TOKEN"]);
        assert!(env_refs("${}").is_err());
        assert!(env_refs("${A").is_err());
        assert!(env_refs("${1A}").is_err());
        let v = expand_env("Bearer ${T}-${U}", |n| Some(n.to_lowercase())).unwrap();
        assert_eq!(v, "Bearer t-u");
        assert!(
            expand_env("${NOPE}", |_| None)
                .unwrap_err()
                .contains("NOPE")
        );
    }

    #[test]
    fn hosts() {
        assert_eq!(
            endpoint_host("http://127.0.0.1:8081").as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(endpoint_host("https://[::1]:9/").as_deref(), Some("::1"));
        assert_eq!(endpoint_host("https://a.b").as_deref(), Some("a.b"));
        assert_eq!(endpoint_host("nope"), None);
    }
}
