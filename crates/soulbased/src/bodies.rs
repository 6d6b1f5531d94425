//! The JSON bodies the HTTP API answers, as types: each handler serializes one of
//! these, and the OpenAPI document ([`crate::openapi`]) derives its schema from the
//! same type, so the contract cannot drift from what is sent.
//!
//! Schemas are for what serde writes (the serialize contract): a field skipped
//! when empty is optional, an `Option` written as `null` is required and
//! nullable. Every struct here answers exactly its fields, so its schema forbids
//! others (`deny_unknown_fields` for the schema only: these are never read).

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;
use soulbase_errors::PublicError;
use soulbase_observe::{AuditRecord, ConversationEnd, ConversationReplay, EvidenceRecord, Replay};
use soulbase_skills::{SkillKind, SkillSummary};
use soulbase_tools::discovery::ExportWarning;
use soulbase_tools::manifest::{SafetyClass, SideEffect};
use soulbase_tools::{Deprecation, ResolvedTool, ToolOwner, ToolState};
use soulbase_types::{CallId, ToolId};

/// The error envelope every route answers a failure with (an invoke answers a
/// `CallResult` instead, except where its responses say otherwise).
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "Error", deny_unknown_fields)]
pub struct ErrorBody {
    /// The public view of the error: never its cause chain.
    pub error: PublicError,
}

/// One tool of the caller's governed list.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "Tool", deny_unknown_fields)]
pub struct ToolView<'a> {
    /// The tool id.
    pub id: &'a ToolId,
    /// Its registered version (semver).
    pub version: String,
    /// Its effective state for the caller's tenant.
    pub state: ToolState,
    /// `global`, or the owning tenant.
    pub owner: String,
    /// Its display name (its `name` when the manifest gives none).
    pub display_name: &'a str,
    /// Its description.
    pub description: &'a str,
    /// Its tags.
    pub tags: &'a [String],
    /// Its risk class.
    pub safety_class: SafetyClass,
    /// The strongest side effect it has.
    pub side_effect: SideEffect,
    /// Its deprecation notes (empty when it is not deprecated).
    pub deprecations: &'a [Deprecation],
    /// Whether a call needs a consent token.
    pub consent_required: bool,
    /// The JSON Schema of its arguments.
    pub input_schema: &'a Value,
    /// The JSON Schema of its output.
    pub output_schema: &'a Value,
    /// SHA-256 (hex) of the manifest's canonical JSON.
    pub digest: &'a str,
}

impl<'a> From<&'a ResolvedTool> for ToolView<'a> {
    fn from(t: &'a ResolvedTool) -> Self {
        let m = &t.tool.manifest;
        ToolView {
            id: &m.id,
            version: m.version.to_string(),
            state: t.state,
            owner: match &t.owner {
                ToolOwner::Global => "global".to_owned(),
                ToolOwner::Tenant(x) => x.to_string(),
            },
            display_name: m.title(),
            description: &m.description,
            tags: &m.tags,
            safety_class: m.safety_class,
            side_effect: m.side_effect,
            deprecations: &m.deprecations,
            consent_required: m.consent_required(),
            input_schema: &m.input_schema,
            output_schema: &m.output_schema,
            digest: &t.tool.digest,
        }
    }
}

/// `GET /api/tools`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ToolList<'a> {
    /// The tools.
    pub tools: Vec<ToolView<'a>>,
}

/// A skill as the skill routes show it.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "Skill", deny_unknown_fields)]
pub struct SkillView<'a> {
    /// The skill name.
    pub name: &'a str,
    /// Its title, if it has one.
    pub title: Option<&'a str>,
    /// Its short description.
    pub description: &'a str,
    /// Its version, if it declares one.
    pub version: Option<&'a str>,
    /// Where it came from.
    pub kind: SkillKind,
    /// Whether it is enabled.
    pub enabled: bool,
    /// Its tools' ids.
    pub tools: Vec<&'a ToolId>,
    /// The names of the tools it exports to other skills.
    pub exports: Vec<&'a str>,
    /// What it imports from other skills.
    pub imports: Vec<SkillImportView<'a>>,
}

/// One skill's import of another's exported tools (an edge of the skills
/// graph).
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "SkillImport", deny_unknown_fields)]
pub struct SkillImportView<'a> {
    /// The providing skill.
    pub from: &'a str,
    /// The imported tool names.
    pub tools: Vec<&'a str>,
}

impl<'a> SkillView<'a> {
    /// `s` as `set` has it (enabled or not).
    pub fn of(set: &soulbase_skills::SkillSet, s: &'a soulbase_skills::Skill) -> Self {
        SkillView {
            name: &s.name,
            title: s.title.as_deref(),
            description: &s.description,
            version: s.version.as_deref(),
            kind: s.kind,
            enabled: set.is_enabled(&s.name),
            tools: s.tools.iter().map(|t| t.id()).collect(),
            exports: s.exports.tools.iter().map(String::as_str).collect(),
            imports: s
                .imports
                .iter()
                .map(|i| SkillImportView {
                    from: &i.from,
                    tools: i.tools.iter().map(String::as_str).collect(),
                })
                .collect(),
        }
    }
}

/// `GET /api/skills`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct SkillList<'a> {
    /// The skills, in name order.
    pub skills: Vec<SkillView<'a>>,
    /// The generation of the loaded skill set (0 without skills).
    pub generation: u64,
}

/// `GET /api/model/tools`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ModelTools {
    /// The format asked for.
    #[schemars(schema_with = "crate::openapi::export_format_schema")]
    pub format: &'static str,
    /// One definition per tool, in the format asked for.
    #[schemars(with = "Vec<serde_json::Map<String, Value>>")]
    pub tools: Vec<Value>,
    /// Provider-safe name → tool id (empty for `mcp`, which names tools by id).
    pub names: std::collections::BTreeMap<String, ToolId>,
    /// What the export had to change or could not express.
    pub warnings: Vec<ExportWarning>,
    /// The skills that show to the caller (phase 1 of skill use).
    pub skills: Vec<SkillSummary>,
}

/// `GET /api/model/prompt`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Prompt {
    /// The system-prompt sections (Markdown); empty when there is nothing to list.
    pub prompt: String,
}

/// What `POST /api/reload` did.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReloadOutcome {
    /// The configuration did not change.
    Unchanged,
    /// A new configuration is in force.
    Applied,
}

/// `POST /api/reload`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ReloadReport {
    /// Whether the configuration changed.
    pub status: ReloadOutcome,
    /// The hash of the configuration in force.
    pub hash: String,
    /// The hash it replaced, when it changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// The skills directory's reload; `null` without skills.
    pub skills: Option<SkillsReload>,
    /// Changed keys a reload does not apply (a restart does).
    pub needs_restart: Vec<String>,
}

/// The skills directory's reload.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct SkillsReload {
    /// The generation of the set it published.
    pub generation: u64,
    /// Skills that appeared.
    pub added: Vec<String>,
    /// Skills whose definition changed.
    pub updated: Vec<String>,
    /// Skills that disappeared.
    pub removed: Vec<String>,
    /// Problems that kept a file from loading.
    pub errors: Vec<String>,
    /// Problems that did not stop a file from loading (e.g. a header variable off
    /// `sandbox.http_env_allow`: the skill loads, its calls are refused).
    pub warnings: Vec<String>,
}

impl From<&soulbase_skills::ReloadReport> for SkillsReload {
    fn from(report: &soulbase_skills::ReloadReport) -> Self {
        SkillsReload {
            generation: report.generation,
            added: report.added.clone(),
            updated: report.updated.clone(),
            removed: report.removed.clone(),
            errors: report.errors().map(ToString::to_string).collect(),
            warnings: report
                .problems
                .iter()
                .filter(|p| !p.is_error())
                .map(ToString::to_string)
                .collect(),
        }
    }
}

/// `GET /api/evidence/{call_id}`: a call's records and its replay, or an
/// agent-loop conversation's records and the conversation replayed.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "Evidence")]
pub enum EvidenceBody {
    /// A call's evidence.
    Call(CallEvidenceBody),
    /// A conversation's evidence.
    Conversation(ConversationEvidenceBody),
}

/// A call's records, oldest first, and what replay rebuilds from them.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "CallEvidence", deny_unknown_fields)]
pub struct CallEvidenceBody {
    /// The call.
    pub call_id: CallId,
    /// Its evidence records, oldest first.
    #[schemars(with = "Vec<EvidenceRecordSchema>")]
    pub records: Vec<EvidenceRecord>,
    /// What replay rebuilds from them.
    pub replay: Replay,
}

/// An agent-loop conversation's records, oldest first, and the conversation
/// rebuilt from them: each model turn with the tool calls it made (each
/// replayed from its own evidence, or `withheld` when the caller may not read
/// that tool's evidence).
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "ConversationEvidence", deny_unknown_fields)]
pub struct ConversationEvidenceBody {
    /// The conversation (`conv_…`).
    pub call_id: CallId,
    /// Its own evidence records, oldest first.
    #[schemars(with = "Vec<EvidenceRecordSchema>")]
    pub records: Vec<EvidenceRecord>,
    /// The conversation replayed.
    pub conversation: ConversationReplay,
}

/// The schema of an [`EvidenceRecord`] (an evidence event in its envelope),
/// named as the document has always named it.
pub struct EvidenceRecordSchema;

impl JsonSchema for EvidenceRecordSchema {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "EvidenceRecord".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <EvidenceRecord as JsonSchema>::json_schema(generator)
    }
}

/// `GET /api/audit`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct AuditList {
    /// The records, newest first.
    pub records: Vec<AuditRecord>,
}

/// `POST /api/consent/{id}/revoke`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RevokedConsent {
    /// The token id.
    pub id: String,
    /// Always `true`.
    #[schemars(extend("const" = true))]
    pub revoked: bool,
}

/// `/healthz` and `/readyz`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Status {
    /// `ok` (`/healthz`); `ready` or `not ready` (`/readyz`).
    pub status: &'static str,
}

/// One tool call an agent conversation made.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ToolCallMade {
    /// The tool as the model named it.
    pub tool: String,
    /// The answer's content, as the model read it.
    pub content: String,
}

/// The `soulbase` member of a `/v1/chat/completions` answer: what the
/// conversation did.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ConversationSummary {
    /// The conversation's id: its evidence is read back at
    /// `GET /api/evidence/{call_id}`.
    pub conversation_id: String,
    /// Model turns made.
    pub iterations: u32,
    /// The tool calls made, in order.
    pub tool_calls: Vec<ToolCallMade>,
    /// Why it ended.
    pub reason: ConversationEnd,
}
