//! YAML skill descriptors (seed 001 §5.4.2): one file, one skill, one tool.
//!
//! ```yaml
//! name: search_logs
//! description: Search Kubernetes pod logs
//! provider: http                      # builtin | http | wasm | process
//! endpoint: http://127.0.0.1:8081/execute
//! timeout: 30                         # seconds (http: at most 120)
//! headers:
//!   Authorization: Bearer ${TOKEN}    # expanded at execution time
//! risk_level: read                    # read | write | destructive
//! parameters: {type: object, properties: {…}, required: […]}
//! ```
//!
//! Optional: `version`, `output_schema`, `tags`, `path` (HTTP path, or given in the
//! endpoint URL), `handler` (builtin), `module`/`sha256` (wasm, relative to the
//! skills root; the digest is computed when omitted), `command`/`args` (process),
//! `mcp_name` and `output_content` (as in a manifest: the plain name MCP lists the
//! tool under, unique in every tenant's view; content blocks in the output).
//! The tool id is `skills.<name>.<name>`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};
use soulbase_sandbox::{MAX_HTTP_TIMEOUT_MS, ProviderBinding, ProviderKind};

use crate::common::{
    check_segment, compile_tool, parse_version, prepare_provider, sha256_hex, tool_id,
};
use crate::confine::Confinement;
use crate::model::{Exports, RiskLevel, Skill, SkillKind, SkillTool};
use crate::problem::SkillProblem;
use crate::risk::ToolDecl;
use crate::yaml::{key_line, parse};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    name: String,
    description: String,
    provider: ProviderKind,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    risk_level: RiskLevel,
    #[serde(default)]
    parameters: Option<Value>,
    #[serde(default)]
    output_schema: Option<Value>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    handler: Option<String>,
    #[serde(default)]
    module: Option<String>,
    #[serde(default)]
    sha256: Option<String>,
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    mcp_name: Option<String>,
    #[serde(default)]
    output_content: bool,
}

/// The result of parsing one file: the skill (absent when there is any error) and
/// every problem found, warnings included.
#[derive(Debug, Clone, Default)]
pub struct Parsed {
    /// The skill, when the file is valid.
    pub skill: Option<Skill>,
    /// Errors and warnings.
    pub problems: Vec<SkillProblem>,
}

impl Parsed {
    pub(crate) fn failed(problems: Vec<SkillProblem>) -> Self {
        Self {
            skill: None,
            problems,
        }
    }
}

/// Splits `http://host:port/path` into (`http://host:port`, `/path`).
fn split_endpoint(url: &str) -> (String, Option<String>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_owned(), None);
    };
    match rest.find('/') {
        Some(i) if i + 1 < rest.len() => (
            format!("{scheme}://{}", &rest[..i]),
            Some(rest[i..].to_owned()),
        ),
        Some(i) => (format!("{scheme}://{}", &rest[..i]), None),
        None => (url.to_owned(), None),
    }
}

/// Parses a descriptor at `file` (under the skills root) with contents `text`.
pub fn parse_descriptor(file: &Path, text: &str, confine: &Confinement) -> Parsed {
    let raw: RawDescriptor = match parse(text, 0) {
        Ok(r) => r,
        Err(e) => {
            return Parsed::failed(vec![
                SkillProblem::error(file, format!("invalid skill descriptor: {}", e.message))
                    .at_line(e.line),
            ]);
        }
    };
    let mut problems = Vec::new();
    let line = |k: &str| key_line(text, k);
    if let Err(why) = check_segment(&raw.name) {
        problems.push(
            SkillProblem::error(file, why)
                .in_field("name")
                .at_line(line("name")),
        );
    }
    if raw.description.trim().is_empty() || raw.description.chars().count() > 1024 {
        problems.push(
            SkillProblem::error(file, "must be 1 to 1024 characters")
                .in_field("description")
                .at_line(line("description")),
        );
    }
    let version = match parse_version(raw.version.as_deref()) {
        Ok(v) => v,
        Err(why) => {
            problems.push(
                SkillProblem::error(file, why)
                    .in_field("version")
                    .at_line(line("version")),
            );
            semver::Version::new(0, 0, 0)
        }
    };
    let timeout_ms = match raw.timeout {
        None => None,
        Some(t) if t.is_finite() && t > 0.0 => Some((t * 1000.0).round() as u64),
        Some(_) => {
            problems.push(
                SkillProblem::error(file, "must be a positive number of seconds")
                    .in_field("timeout")
                    .at_line(line("timeout")),
            );
            None
        }
    };
    let mut unused = |present: bool, field: &str| {
        if present {
            problems.push(
                SkillProblem::error(
                    file,
                    format!("is not used by provider {}", raw.provider.as_str()),
                )
                .in_field(field)
                .at_line(key_line(text, field)),
            );
        }
    };
    let mut binding = match raw.provider {
        ProviderKind::Http => {
            unused(raw.handler.is_some(), "handler");
            unused(raw.module.is_some(), "module");
            unused(raw.command.is_some(), "command");
            match &raw.endpoint {
                None => {
                    problems.push(
                        SkillProblem::error(file, "is required for provider http")
                            .in_field("endpoint"),
                    );
                    None
                }
                Some(url) => {
                    let (endpoint, url_path) = split_endpoint(url);
                    if raw.path.is_some() && url_path.is_some() {
                        problems.push(
                            SkillProblem::error(file, "the endpoint URL already has a path")
                                .in_field("path")
                                .at_line(line("path")),
                        );
                    }
                    let http_timeout = timeout_ms.unwrap_or(30_000);
                    if http_timeout > MAX_HTTP_TIMEOUT_MS {
                        problems.push(
                            SkillProblem::error(
                                file,
                                "must be at most 120 seconds for provider http",
                            )
                            .in_field("timeout")
                            .at_line(line("timeout")),
                        );
                    }
                    Some(ProviderBinding::Http {
                        endpoint,
                        path: raw.path.clone().or(url_path),
                        headers: raw.headers.clone(),
                        timeout_ms: Some(http_timeout.min(MAX_HTTP_TIMEOUT_MS)),
                    })
                }
            }
        }
        ProviderKind::Builtin => {
            unused(raw.endpoint.is_some(), "endpoint");
            unused(raw.module.is_some(), "module");
            unused(raw.command.is_some(), "command");
            Some(ProviderBinding::Builtin {
                handler: raw.handler.clone(),
            })
        }
        ProviderKind::Wasm => {
            unused(raw.endpoint.is_some(), "endpoint");
            unused(raw.command.is_some(), "command");
            match &raw.module {
                None => {
                    problems.push(
                        SkillProblem::error(file, "is required for provider wasm")
                            .in_field("module"),
                    );
                    None
                }
                Some(m) => Some(ProviderBinding::Wasm {
                    module: m.clone(),
                    sha256: raw.sha256.clone().unwrap_or_default(),
                }),
            }
        }
        ProviderKind::Process => {
            unused(raw.endpoint.is_some(), "endpoint");
            unused(raw.module.is_some(), "module");
            match &raw.command {
                None => {
                    problems.push(
                        SkillProblem::error(file, "is required for provider process")
                            .in_field("command"),
                    );
                    None
                }
                Some(c) => Some(ProviderBinding::Process {
                    command: c.clone(),
                    args: raw.args.clone(),
                }),
            }
        }
    };
    if raw.provider != ProviderKind::Http && !raw.headers.is_empty() {
        problems.push(
            SkillProblem::error(file, "headers are only used by provider http")
                .in_field("headers")
                .at_line(line("headers")),
        );
    }
    let dir = confine.given_root().to_path_buf();
    if let Some(b) = binding.as_mut() {
        let mut bp = Vec::new();
        prepare_provider(b, &dir, confine, file, "provider", &mut bp);
        // Binding fields are flat in a descriptor: report them by their own names.
        for mut p in bp {
            if let Some(f) = p.field.take() {
                let flat = f.strip_prefix("provider.").unwrap_or(&f).to_owned();
                let flat = if flat == "timeout_ms" {
                    "timeout".to_owned()
                } else {
                    flat
                };
                p.line = key_line(text, flat.split('.').next().unwrap_or(&flat));
                p.field = Some(flat);
            }
            problems.push(p);
        }
    }
    if problems.iter().any(SkillProblem::is_error) {
        return Parsed::failed(problems);
    }
    let (Some(binding), Ok(id)) = (binding, tool_id(&raw.name, &raw.name)) else {
        return Parsed::failed(problems);
    };
    let decl = ToolDecl {
        id,
        version: version.clone(),
        description: raw.description.clone(),
        input_schema: raw
            .parameters
            .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
        output_schema: raw.output_schema.unwrap_or_else(|| json!({})),
        provider: binding,
        risk: raw.risk_level,
        timeout_ms,
        tags: raw.tags,
        mcp_name: raw.mcp_name,
        output_content: raw.output_content,
    };
    let Some(compiled) = compile_tool(decl, file, "", None, &mut problems) else {
        // Manifest problems name manifest fields; map the schema ones back.
        for p in problems.iter_mut() {
            if let Some(f) = &p.field
                && f.starts_with("input_schema")
            {
                let renamed = f.replacen("input_schema", "parameters", 1);
                p.line = key_line(text, "parameters");
                p.field = Some(renamed);
            }
        }
        return Parsed::failed(problems);
    };
    let skill = Skill {
        name: raw.name.clone(),
        title: None,
        description: raw.description,
        version: raw.version,
        kind: SkillKind::Descriptor,
        path: file.to_path_buf(),
        dir,
        content: Arc::from(text),
        body: None,
        tools: vec![SkillTool {
            name: raw.name,
            exported: false,
            compiled,
        }],
        exports: Exports::default(),
        imports: Vec::new(),
        resources: Vec::new(),
        extra: serde_json::Map::new(),
        digest: sha256_hex(text.as_bytes()),
    };
    Parsed {
        skill: Some(skill),
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_split() {
        assert_eq!(
            split_endpoint("http://127.0.0.1:8081/execute"),
            ("http://127.0.0.1:8081".into(), Some("/execute".into()))
        );
        assert_eq!(split_endpoint("http://a:1/"), ("http://a:1".into(), None));
        assert_eq!(split_endpoint("http://a:1"), ("http://a:1".into(), None));
    }
}
