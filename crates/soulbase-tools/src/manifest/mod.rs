//! Tool manifests (R1): the declaration every tool ships, its validation at
//! registration, schema compilation and SemVer upgrade rules.
//!
//! A [`ToolManifest`] is plain data, loaded from YAML or JSON with unknown fields
//! refused. [`compile`] checks every rule at once, reporting each problem with its
//! field path, and compiles both schemas exactly once into a [`CompiledTool`].
//! [`check_upgrade`] decides whether a new version may replace an old one.

mod compiled;
pub mod content;
pub(crate) mod problem;
mod schema;
mod upgrade;
mod validate;

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use semver::Version;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use soulbase_sandbox::{Capability, ProviderBinding};
use soulbase_types::ToolId;

pub use compiled::CompiledTool;
pub use problem::{ManifestError, Problem};
pub use upgrade::check_upgrade;
pub use validate::compile;

/// The declaration of one tool (SB-08 §3.2).
///
/// Field names are the wire names. Unknown fields are refused so that a typo (say
/// `side_efect`) is an error instead of a silently weaker manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolManifest {
    /// `<group>.<pkg>.<name>`; its resource URN is `soul:tool:<id>`.
    pub id: ToolId,
    /// The short name. Defaults to the id's last segment and, if given, must equal
    /// it: a tool has one identity, and the name models see is derived from the id.
    #[serde(default)]
    pub name: String,
    /// The tool's SemVer version (a string on the wire, e.g. `"1.2.0"`).
    pub version: Version,
    /// A human-friendly title for UIs; defaults to `name` where one is needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// What the tool does, written for the model that will choose it. Required.
    pub description: String,
    /// Free-form labels used for discovery queries (matched case-insensitively).
    #[serde(default)]
    pub tags: Vec<String>,
    /// JSON Schema of the arguments; must be an object schema (`type: object`).
    /// JSON Schema 2020-12 unless it declares another `$schema`.
    pub input_schema: Value,
    /// JSON Schema of the result, checked after every execution.
    pub output_schema: Value,
    /// Permissions the tool needs, e.g. `{resource: "soul:fs:/data", action: "read"}`.
    /// Given to the authorizer on every call and list (`resource#action`): a static
    /// rule with `require_scopes` or a Cedar policy on `context.tool_scopes` can
    /// require the caller to hold them.
    #[serde(default)]
    pub scopes: Vec<Scope>,
    /// Sandbox capabilities, the least the tool needs to run.
    #[serde(default)]
    pub capabilities: Vec<Capability>,
    /// The strongest side effect the tool has.
    pub side_effect: SideEffect,
    /// The risk class; defaults to `low`.
    #[serde(default)]
    pub safety_class: SafetyClass,
    /// Whether calls need explicit consent; defaults to not required.
    #[serde(default)]
    pub consent: ConsentPolicy,
    /// Execution limits.
    #[serde(default)]
    pub limits: Limits,
    /// Whether calls may run concurrently; defaults to `parallel`.
    #[serde(default)]
    pub concurrency: Concurrency,
    /// Whether calls carry an idempotency key; defaults to `none`.
    #[serde(default)]
    pub idempotency: Idempotency,
    /// Compatibility matrix: model provider (`openai`, `anthropic`) → the models
    /// the tool works with, as comma-separated patterns (`"gpt-4o*, o3*"`) or
    /// `none`. Exports leave the tool out where it does not fit
    /// ([`crate::discovery::compat`]).
    #[serde(default)]
    pub provider_compat: BTreeMap<String, String>,
    /// Deprecation notes with migration advice.
    #[serde(default)]
    pub deprecations: Vec<Deprecation>,
    /// How the tool executes; defaults to `builtin` with the tool id as handler.
    #[serde(default)]
    pub provider: ProviderBinding,
    /// Obligations applied to the output before it is returned.
    #[serde(default)]
    pub obligations: Vec<Obligation>,
    /// A plain name MCP clients list and call the tool by instead of its id
    /// (`test_simple_text`): letters, digits, `_` and `-`, at most 64 characters,
    /// no dots (so it is never a tool id), not a name the MCP surface reserves
    /// ([`RESERVED_MCP_NAMES`]). Unique in every tenant's view: the registry
    /// refuses a tool whose name another tool in the same view holds
    /// (`REGISTRY.CONFLICT`). Other surfaces keep calling the tool by its id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_name: Option<String>,
    /// The output carries content blocks beyond JSON: it is an object whose
    /// reserved key `content` (optional) holds an array of MCP-shaped blocks —
    /// `text`, `image` and `audio` (base64 `data` with a `mimeType`) and `resource`
    /// (an embedded resource, `text` or base64 `blob`) — checked against
    /// [`content::CONTENT_SCHEMA`]; `output_schema` (an object schema that does
    /// not declare `content`) describes the rest, the structured part. MCP
    /// answers the blocks as its content; HTTP and gRPC return the object as is;
    /// evidence keeps only the output's digest and size. Defaults to `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_content: bool,
}

/// The names a manifest's `mcp_name` may not take: the MCP surface's own skill
/// protocol tools.
pub const RESERVED_MCP_NAMES: &[&str] = &["list_skills", "get_skill_info", "run_skill"];

impl ToolManifest {
    /// Parses a manifest from YAML. Errors carry the parser's line and column, and
    /// the path of the field that does not fit (`limits.timeout_ms`).
    ///
    /// Only parses: call [`compile`] to validate. An omitted `name` is filled in.
    pub fn from_yaml_str(yaml: &str) -> Result<ToolManifest, ManifestError> {
        match serde_saphyr::from_str::<ToolManifest>(yaml) {
            Ok(mut m) => {
                m.fill_defaults();
                Ok(m)
            }
            Err(e) => {
                // The first line has "line L column C: what"; the rest is a source
                // snippet that tools can re-render from the input if they want.
                let full = e.to_string();
                let first = full
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim_start_matches("error: ");
                let path = serde_saphyr::from_str::<serde_json::Value>(yaml)
                    .ok()
                    .map(field_path)
                    .unwrap_or_default();
                Err(ManifestError::single(
                    path,
                    format!("invalid YAML manifest: {first}"),
                ))
            }
        }
    }

    /// Parses a manifest from JSON. Errors carry the line and column, and the path
    /// of the field that does not fit.
    ///
    /// Only parses: call [`compile`] to validate. An omitted `name` is filled in.
    pub fn from_json_str(json: &str) -> Result<ToolManifest, ManifestError> {
        match serde_json::from_str::<ToolManifest>(json) {
            Ok(mut m) => {
                m.fill_defaults();
                Ok(m)
            }
            Err(e) => {
                let path = serde_json::from_str::<serde_json::Value>(json)
                    .ok()
                    .map(field_path)
                    .unwrap_or_default();
                Err(ManifestError::single(
                    path,
                    format!("invalid JSON manifest: {e}"),
                ))
            }
        }
    }

    /// Fills defaults that depend on other fields (`name` from the id).
    pub(crate) fn fill_defaults(&mut self) {
        if self.name.is_empty() {
            self.name = self.id.name().to_owned();
        }
    }

    /// The display name, falling back to `name`.
    pub fn title(&self) -> &str {
        self.display_name.as_deref().unwrap_or(&self.name)
    }

    /// The deprecation notes, one per line; `None` for a tool not deprecated.
    pub fn deprecation_note(&self) -> Option<String> {
        (!self.deprecations.is_empty()).then(|| {
            self.deprecations
                .iter()
                .map(Deprecation::note)
                .collect::<Vec<_>>()
                .join("\n")
        })
    }

    /// Whether a call needs consent: the manifest says so (validation guarantees it
    /// does for `high` safety and `write`/`process` side effects).
    pub fn consent_required(&self) -> bool {
        self.consent.required
    }
}

/// A permission the tool needs: `resource` (e.g. `soul:fs:/data`) and `action`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scope {
    /// The resource URN.
    pub resource: String,
    /// The action on it, e.g. `read`.
    pub action: String,
}

impl Scope {
    /// The scope as the authorizer and subjects' scopes write it: `resource#action`
    /// (e.g. `soul:fs:/data#read`).
    pub fn name(&self) -> String {
        format!("{}#{}", self.resource, self.action)
    }
}

/// The strongest side effect a tool has.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum SideEffect {
    /// Pure computation.
    None,
    /// Reads files (needs an `fs` capability with `read`).
    Read,
    /// Writes files (needs `fs` with `write`; consent required).
    Write,
    /// Talks to the network (needs `net`).
    Network,
    /// Touches the file system in some way (needs `fs`).
    Filesystem,
    /// Drives a browser (needs `browser`).
    Browser,
    /// Starts processes (needs `proc`; consent required).
    Process,
}

impl SideEffect {
    /// The lowercase wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SideEffect::None => "none",
            SideEffect::Read => "read",
            SideEffect::Write => "write",
            SideEffect::Network => "network",
            SideEffect::Filesystem => "filesystem",
            SideEffect::Browser => "browser",
            SideEffect::Process => "process",
        }
    }
}

impl fmt::Display for SideEffect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The risk class of a tool.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum SafetyClass {
    /// The default.
    #[default]
    Low,
    /// Needs more care (policy may add obligations).
    Medium,
    /// Dangerous: consent is always required.
    High,
}

impl SafetyClass {
    /// The lowercase wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SafetyClass::Low => "low",
            SafetyClass::Medium => "medium",
            SafetyClass::High => "high",
        }
    }
}

impl fmt::Display for SafetyClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether and how explicit consent is needed for a call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsentPolicy {
    /// Whether a valid consent token must accompany each call.
    #[serde(default)]
    pub required: bool,
    /// How long a consent stays valid, in milliseconds (none: the token decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// What the consent must cover (e.g. `tool` or `session`); free-form for the
    /// consent checker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// Execution limits. Every field has a default, so `limits: {}` is valid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock limit of one call, 1..=600000 ms. Default 30000.
    pub timeout_ms: u64,
    /// Largest accepted argument document in bytes. Default 1 MiB.
    pub max_bytes_in: u64,
    /// Largest accepted output document in bytes. Default 4 MiB.
    pub max_bytes_out: u64,
    /// Most files one call may touch. Default 100.
    pub max_files: u32,
    /// Deepest JSON nesting of one call's arguments (the arguments object is
    /// level 1): a deeper call is refused before it runs, `SCHEMA.VALIDATION_FAILED`
    /// with field `args`. Default 32.
    pub max_depth: u32,
    /// Most calls of this tool running at once (per tenant). Default 16;
    /// `concurrency: serial` means 1 whatever this says.
    pub max_concurrency: u32,
    /// Memory cap of one call of a native (`process`) tool, in bytes: its heap and
    /// private writable mappings (`RLIMIT_DATA`). Default 512 MiB.
    pub max_memory_bytes: u64,
    /// Most processes one call of a native tool may have at once, itself included
    /// (`RLIMIT_NPROC` inside its user namespace). Default 64.
    pub max_processes: u32,
}

/// The longest `limits.timeout_ms` a manifest may ask for: 10 minutes.
pub const MAX_TIMEOUT_MS: u64 = 600_000;

impl Default for Limits {
    fn default() -> Self {
        Self {
            timeout_ms: 30_000,
            max_bytes_in: 1 << 20,
            max_bytes_out: 4 << 20,
            max_files: 100,
            max_depth: 32,
            max_concurrency: 16,
            max_memory_bytes: 512 << 20,
            max_processes: 64,
        }
    }
}

/// Whether calls of a tool may overlap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Concurrency {
    /// One call at a time (per tenant).
    Serial,
    /// Calls may overlap up to `limits.max_concurrency`.
    #[default]
    Parallel,
}

/// Whether a tool is idempotent under a caller-supplied key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Idempotency {
    /// Calls carry an idempotency key; a repeat returns the stored result.
    Keyed,
    /// Not idempotent: never retried automatically.
    #[default]
    None,
}

/// A deprecation note.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Deprecation {
    /// Since when (a version or a date), as written by the author.
    pub since: String,
    /// What to do instead.
    pub message: String,
    /// The tool that replaces this one, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<ToolId>,
    /// The day the tool goes away (`YYYY-MM-DD`, UTC), if announced: HTTP answers
    /// carry it as a `Sunset` header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sunset: Option<String>,
}

impl Deprecation {
    /// The note models and people read: "Deprecated since 2.0: use X. Replaced by
    /// a.b.c. Removed on 2027-01-01."
    pub fn note(&self) -> String {
        let mut out = format!("Deprecated since {}: {}", self.since, self.message.trim());
        if let Some(r) = &self.replacement {
            out.push_str(&format!(" Replaced by {r}."));
        }
        if let Some(day) = &self.sunset {
            out.push_str(&format!(" Removed on {day}."));
        }
        out
    }
}

/// Seconds since the Unix epoch at 00:00 UTC of `day` (`YYYY-MM-DD`), if it is one:
/// deprecation and sunset dates become HTTP headers with it.
pub fn day_start_secs(day: &str) -> Option<i64> {
    let b = day.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| day.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days_in = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&m) || d < 1 || d > days_in[(m - 1) as usize] {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some((era * 146_097 + doe - 719_468) * 86_400)
}

pub use soulbase_types::{Obligation, ObligationFailure, ObligationKind};

/// The dotted path (`limits.timeout_ms`, `tags[2]`) of the first field of a parsed
/// document that does not fit a manifest; empty when it is the document itself.
fn field_path(doc: serde_json::Value) -> String {
    match serde_path_to_error::deserialize::<_, ToolManifest>(doc) {
        Ok(_) => String::new(),
        Err(e) => {
            let path = e.path().to_string();
            if path == "." { String::new() } else { path }
        }
    }
}
