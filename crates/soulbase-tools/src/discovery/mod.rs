//! Discovery for models (R3): the restricted tool view and provider exports.
//!
//! A model only ever sees a [`ToolSpec`] — name, description, input schema — never
//! scopes, consent rules, capabilities or provider details. Exports turn specs
//! into the shapes model APIs expect:
//!
//! - [`openai::export`] — function calling, optionally `strict` (structured outputs);
//! - [`anthropic::export`] — tool use.
//!
//! A tool's `provider_compat` decides which providers and models it is exported to
//! ([`compat::admits`]).
//!
//! Provider APIs restrict tool names to `^[a-zA-Z0-9_-]{1,64}$`, which a dotted id
//! is not; [`NameMap`] maps ids to safe names and back, so a model's tool call can
//! be routed to the right tool.

pub mod anthropic;
pub mod compat;
mod names;
pub mod openai;
mod schema_util;

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use soulbase_types::ToolId;

pub use names::NameMap;

/// What a model may know about a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The tool id (exports map it to a provider-safe name with [`NameMap`]).
    pub name: ToolId,
    /// The description from the manifest.
    pub description: String,
    /// The input JSON Schema, shared with the compiled tool.
    pub input_schema: Arc<Value>,
}

/// Something an export had to change or could not express.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ExportWarning {
    /// The tool concerned.
    pub tool: ToolId,
    /// JSON pointer into the tool's input schema (`""` for the root).
    pub location: String,
    /// What happened.
    pub message: String,
}

/// The result of an export: the provider's tool list, the name mapping used (keep
/// it to route the model's calls back), and warnings.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    /// One provider-shaped tool definition per spec, in the order given.
    pub tools: Vec<Value>,
    /// Provider names ↔ tool ids for exactly these tools.
    pub names: NameMap,
    /// Keywords stripped, strict mode fallbacks and the like.
    pub warnings: Vec<ExportWarning>,
}
