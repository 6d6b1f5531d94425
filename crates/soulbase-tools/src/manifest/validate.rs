//! Registration-time validation of a manifest.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;
use sha2::{Digest, Sha256};
use soulbase_sandbox::{CapabilityDomain, FsAccess, ProviderBinding};

use super::compiled::IndexTerms;
use super::schema::{canonical_json, compile_schema};
use super::{
    CompiledTool, MAX_TIMEOUT_MS, ManifestError, Problem, SafetyClass, Scope, SideEffect,
    ToolManifest,
};
use crate::discovery::ToolSpec;

/// Validates `manifest` and compiles its schemas, reporting every problem at once.
///
/// Rules, each reported with its field path:
/// - `name` equals the id's last segment (an empty `name` is filled in); a
///   non-empty `description`; a non-empty `display_name` if given; tags non-empty,
///   at most 64 characters and unique (case-insensitively);
/// - scopes have a non-empty `resource` and `action`;
/// - both schemas compile (2020-12 unless `$schema` says otherwise; offline; no
///   remote or non-local `$ref`), and `input_schema` is an object schema
///   (`type: object`);
/// - every capability passes its syntactic check (`capabilities[i].…`);
/// - capabilities cover the side effect: `read` needs `fs` with `read`, `write`
///   needs `fs` with `write`, `filesystem` needs some `fs`, `network` needs `net`,
///   `process` needs `proc`, `browser` needs `browser`; `none` may declare only
///   `tmp` (anything else contradicts "no side effect");
/// - `safety_class: high` or a `write`/`process` side effect ⇒ `consent.required`;
///   a given `consent.ttl_ms` is positive;
/// - limits are positive and `timeout_ms` ≤ [`MAX_TIMEOUT_MS`]; an HTTP provider's
///   own `timeout_ms` does not exceed `limits.timeout_ms`;
/// - the provider binding passes its syntactic check (`provider.…`);
/// - deprecations have a `since` and a `message` and do not name the tool itself
///   as replacement; obligations have a valid JSON pointer;
/// - `provider_compat` names known providers and valid model patterns
///   ([`crate::discovery::compat::problem`]);
/// - `mcp_name` is a plain name (letters, digits, `_`, `-`; at most 64; not
///   reserved); `output_content` needs an object `output_schema` that does not
///   declare `content`.
pub fn compile(mut manifest: ToolManifest) -> Result<CompiledTool, ManifestError> {
    manifest.fill_defaults();
    let m = &manifest;
    let mut out = Vec::new();

    check_identity(m, &mut out);
    check_mcp_name(m, &mut out);
    check_output_content(m, &mut out);

    for (i, s) in m.scopes.iter().enumerate() {
        if s.resource.trim().is_empty() {
            out.push(Problem::new(
                format!("scopes[{i}].resource"),
                "must not be empty",
            ));
        }
        if s.action.trim().is_empty() {
            out.push(Problem::new(
                format!("scopes[{i}].action"),
                "must not be empty",
            ));
        }
    }

    let input = compile_schema("input_schema", &m.input_schema, &mut out);
    if m.input_schema.get("type").and_then(Value::as_str) != Some("object") {
        out.push(Problem::new(
            "input_schema",
            "must be an object schema (`type: object`): tool arguments are a JSON object",
        ));
    }
    let output = compile_schema("output_schema", &m.output_schema, &mut out);

    for (i, c) in m.capabilities.iter().enumerate() {
        for (path, problem) in c.validate() {
            out.push(Problem::new(
                join(&format!("capabilities[{i}]"), &path),
                problem,
            ));
        }
    }
    check_coverage(m, &mut out);
    check_client(m, &mut out);
    check_consent(m, &mut out);
    check_limits(m, &mut out);

    for (path, problem) in m.provider.validate() {
        out.push(Problem::new(join("provider", &path), problem));
    }
    if let ProviderBinding::Http {
        timeout_ms: Some(t),
        ..
    } = &m.provider
        && *t > m.limits.timeout_ms
    {
        out.push(Problem::new(
            "provider.timeout_ms",
            format!(
                "must not exceed limits.timeout_ms ({})",
                m.limits.timeout_ms
            ),
        ));
    }

    for (key, requirement) in &m.provider_compat {
        if let Some(why) = crate::discovery::compat::problem(key, requirement) {
            out.push(Problem::new(format!("provider_compat.{key}"), why));
        }
    }
    for (i, d) in m.deprecations.iter().enumerate() {
        if d.since.trim().is_empty() {
            out.push(Problem::new(
                format!("deprecations[{i}].since"),
                "must not be empty",
            ));
        }
        if d.message.trim().is_empty() {
            out.push(Problem::new(
                format!("deprecations[{i}].message"),
                "must not be empty",
            ));
        }
        if d.sunset
            .as_deref()
            .is_some_and(|day| super::day_start_secs(day).is_none())
        {
            out.push(Problem::new(
                format!("deprecations[{i}].sunset"),
                "must be a date, YYYY-MM-DD",
            ));
        }
        if d.replacement.as_ref() == Some(&m.id) {
            out.push(Problem::new(
                format!("deprecations[{i}].replacement"),
                "must not be the tool itself",
            ));
        }
    }
    for (i, o) in m.obligations.iter().enumerate() {
        if let Some(problem) = o.pointer_problem() {
            out.push(Problem::new(format!("obligations[{i}].pointer"), problem));
        }
    }

    match (input, output) {
        (Some(input), Some(output)) if out.is_empty() => {
            let digest = manifest_digest(&manifest);
            let haystack = format!(
                "{}\n{}\n{}",
                manifest.name,
                manifest.display_name.as_deref().unwrap_or_default(),
                manifest.description
            )
            .to_lowercase()
            .into_boxed_str();
            let spec = ToolSpec {
                name: manifest.id.clone(),
                // A deprecated tool says so wherever it is offered.
                description: match manifest.deprecation_note() {
                    Some(note) => format!("{}\n\n{note}", manifest.description),
                    None => manifest.description.clone(),
                },
                input_schema: Arc::new(manifest.input_schema.clone()),
            };
            let terms = IndexTerms::of(&manifest);
            let scope_names = manifest.scopes.iter().map(Scope::name).collect();
            Ok(CompiledTool {
                scope_names,
                terms,
                version_text: manifest.version.to_string().into_boxed_str(),
                manifest: Arc::new(manifest),
                input: Arc::new(input),
                output: Arc::new(output),
                digest,
                spec,
                haystack,
            })
        }
        _ => Err(ManifestError { problems: out }),
    }
}

/// SHA-256 hex of the canonical JSON of `m`.
pub(crate) fn manifest_digest(m: &ToolManifest) -> String {
    let value = serde_json::to_value(m).unwrap_or(Value::Null);
    hex::encode(Sha256::digest(canonical_json(&value).as_bytes()))
}

fn join(prefix: &str, rel: &str) -> String {
    if rel.is_empty() {
        prefix.to_owned()
    } else {
        format!("{prefix}.{rel}")
    }
}

fn check_identity(m: &ToolManifest, out: &mut Vec<Problem>) {
    if m.name != m.id.name() {
        out.push(Problem::new(
            "name",
            format!(
                "must equal the id's last segment {:?} (or be omitted)",
                m.id.name()
            ),
        ));
    }
    if m.description.trim().is_empty() {
        out.push(Problem::new(
            "description",
            "must not be empty: models choose tools by their description",
        ));
    }
    if let Some(d) = &m.display_name
        && d.trim().is_empty()
    {
        out.push(Problem::new("display_name", "must not be empty when given"));
    }
    let mut seen = BTreeSet::new();
    for (i, t) in m.tags.iter().enumerate() {
        if t.trim().is_empty() || t.chars().count() > 64 {
            out.push(Problem::new(
                format!("tags[{i}]"),
                "must be 1 to 64 characters",
            ));
        } else if !seen.insert(t.to_lowercase()) {
            out.push(Problem::new(
                format!("tags[{i}]"),
                format!("duplicate tag {t:?}"),
            ));
        }
    }
}

/// `mcp_name`: a plain name (never a tool id), not reserved.
fn check_mcp_name(m: &ToolManifest, out: &mut Vec<Problem>) {
    let Some(name) = &m.mcp_name else { return };
    let plain = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !plain {
        out.push(Problem::new(
            "mcp_name",
            "must be 1 to 64 letters, digits, `_` or `-` (no dots: a tool id is not a plain name)",
        ));
    } else if super::RESERVED_MCP_NAMES.contains(&name.as_str()) {
        out.push(Problem::new(
            "mcp_name",
            format!("{name:?} is reserved by the MCP surface"),
        ));
    }
}

/// `output_content`: the structured part is an object that does not claim the
/// reserved `content` key.
fn check_output_content(m: &ToolManifest, out: &mut Vec<Problem>) {
    if !m.output_content {
        return;
    }
    if m.output_schema.get("type").and_then(Value::as_str) != Some("object") {
        out.push(Problem::new(
            "output_schema",
            "must be an object schema (`type: object`) when output_content is set: the output is an object holding `content`",
        ));
    }
    if m.output_schema
        .get("properties")
        .and_then(|p| p.get(super::content::CONTENT_KEY))
        .is_some()
    {
        out.push(Problem::new(
            "output_schema.properties.content",
            "must not be declared when output_content is set: `content` is reserved for the content blocks",
        ));
    }
}

fn check_coverage(m: &ToolManifest, out: &mut Vec<Problem>) {
    let has = |d: CapabilityDomain| m.capabilities.iter().any(|c| c.domain() == d);
    let fs = |a: FsAccess| m.capabilities.iter().any(|c| c.grants_fs(a));
    let missing = match m.side_effect {
        SideEffect::None => {
            for (i, c) in m.capabilities.iter().enumerate() {
                // Scratch space and asking the caller's client change nothing.
                if !matches!(c.domain(), CapabilityDomain::Tmp | CapabilityDomain::Client) {
                    out.push(Problem::new(
                        format!("capabilities[{i}]"),
                        format!(
                            "side_effect is none, so the tool may not declare a {} capability \
                             (declare the side effect it has instead)",
                            c.domain()
                        ),
                    ));
                }
            }
            None
        }
        SideEffect::Read if !fs(FsAccess::Read) => Some("an fs capability with read access"),
        SideEffect::Write if !fs(FsAccess::Write) => Some("an fs capability with write access"),
        SideEffect::Filesystem if !has(CapabilityDomain::Fs) => Some("an fs capability"),
        SideEffect::Network if !has(CapabilityDomain::Net) => Some("a net capability"),
        SideEffect::Process if !has(CapabilityDomain::Proc) => Some("a proc capability"),
        SideEffect::Browser if !has(CapabilityDomain::Browser) => Some("a browser capability"),
        _ => None,
    };
    if let Some(what) = missing {
        out.push(Problem::new(
            "capabilities",
            format!(
                "side_effect {} needs {what}; capabilities must cover the side effect",
                m.side_effect
            ),
        ));
    }
}

/// Only a builtin handler is given the call's client channel today: a `client`
/// capability on another provider would have no effect, so it is refused.
fn check_client(m: &ToolManifest, out: &mut Vec<Problem>) {
    if matches!(m.provider, ProviderBinding::Builtin { .. }) {
        return;
    }
    for (i, c) in m.capabilities.iter().enumerate() {
        if c.domain() == CapabilityDomain::Client {
            out.push(Problem::new(
                format!("capabilities[{i}]"),
                format!(
                    "a client capability is only available to builtin tools (this tool's provider is {})",
                    m.provider.kind()
                ),
            ));
        }
    }
}

fn check_consent(m: &ToolManifest, out: &mut Vec<Problem>) {
    // What the capabilities allow counts as much as the declared side effect: a tool
    // declaring `read` but granted fs write or a command is a write/process tool.
    let grants_write = m.capabilities.iter().any(|c| c.grants_fs(FsAccess::Write));
    let grants_proc = m
        .capabilities
        .iter()
        .any(|c| c.domain() == CapabilityDomain::Proc);
    let why = if m.safety_class == SafetyClass::High {
        Some("safety_class is high")
    } else if m.side_effect == SideEffect::Write {
        Some("side_effect is write")
    } else if m.side_effect == SideEffect::Process {
        Some("side_effect is process")
    } else if grants_write {
        Some("a capability grants file system write access")
    } else if grants_proc {
        Some("a capability grants running commands (proc)")
    } else {
        None
    };
    if let Some(why) = why
        && !m.consent.required
    {
        out.push(Problem::new(
            "consent.required",
            format!("must be true because {why}"),
        ));
    }
    if m.consent.ttl_ms == Some(0) {
        out.push(Problem::new("consent.ttl_ms", "must be greater than 0"));
    }
    if let Some(s) = &m.consent.scope
        && s.trim().is_empty()
    {
        out.push(Problem::new(
            "consent.scope",
            "must not be empty when given",
        ));
    }
}

/// The smallest `limits.max_memory_bytes`: a native program needs a few MiB to start.
const MIN_MEMORY_BYTES: u64 = 16 << 20;

fn check_limits(m: &ToolManifest, out: &mut Vec<Problem>) {
    let l = &m.limits;
    if l.max_memory_bytes < MIN_MEMORY_BYTES {
        out.push(Problem::new(
            "limits.max_memory_bytes",
            format!("must be at least {MIN_MEMORY_BYTES} (16 MiB)"),
        ));
    }
    if l.timeout_ms == 0 || l.timeout_ms > MAX_TIMEOUT_MS {
        out.push(Problem::new(
            "limits.timeout_ms",
            format!("must be between 1 and {MAX_TIMEOUT_MS}"),
        ));
    }
    for (name, v) in [
        ("max_bytes_in", l.max_bytes_in),
        ("max_bytes_out", l.max_bytes_out),
        ("max_files", u64::from(l.max_files)),
        ("max_depth", u64::from(l.max_depth)),
        ("max_concurrency", u64::from(l.max_concurrency)),
        ("max_processes", u64::from(l.max_processes)),
    ] {
        if v == 0 {
            out.push(Problem::new(
                format!("limits.{name}"),
                "must be greater than 0",
            ));
        }
    }
}
