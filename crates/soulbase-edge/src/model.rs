//! The model-facing surface: a caller's governed tools in the shape a model API
//! takes them, and a model's tool calls run through the one stack and answered in
//! that API's shape.
//!
//! - [`Stack::export_tools`]: the caller's governed list ([`Stack::available`]) as
//!   OpenAI tools (plain or `strict`), Anthropic tools or MCP tool definitions,
//!   with the provider-safe names ↔ tool ids ([`NameMap`]) used, less the tools
//!   whose `provider_compat` does not fit the provider and model asked for.
//! - [`Stack::route_tool_calls`]: an assistant turn's tool calls (OpenAI
//!   `tool_calls`, Anthropic `tool_use` blocks — its other blocks left out) in,
//!   one answer per call out, in
//!   order; the calls run concurrently, each through [`Stack::invoke`] with
//!   origin `llm`, so each is governed, metered and evidenced like any other. An
//!   entry that cannot be read is answered in place with its stable code (and
//!   evidenced as a refusal); the others still run.
//!
//! Names: an exported name is accepted wherever a tool id is. Plain names
//! (`a__b__c`) decode on every surface ([`Stack::invoke`]); the hashed names of
//! very long ids are known only to the map of the caller's list, which tool-call
//! routing builds. Arguments of a call of origin `llm` have the strict export's
//! "optional ⇒ nullable" undone against the tool's own schema
//! ([`openai::restore_optional`]) on every surface.

use std::str::FromStr;

use futures_util::future::join_all;
use serde_json::{Value, json};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::ConversationRef;
use soulbase_tools::discovery::{ExportWarning, NameMap, ToolSpec, anthropic, compat, openai};
use soulbase_tools::manifest::content;
use soulbase_tools::pipeline::router::{
    ModelCall, anthropic_answer, openai_answer, read_anthropic, read_openai, result_content,
};
use soulbase_types::{CallId, Origin, Subject};

use crate::{Binding, CallRequest, Stack, Surface};

/// The shapes a caller can ask its tools in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// OpenAI function calling.
    OpenAi,
    /// OpenAI function calling with `strict: true` (structured outputs).
    OpenAiStrict,
    /// Anthropic tool use.
    Anthropic,
    /// MCP tool definitions (`name` = the tool id).
    Mcp,
}

impl ExportFormat {
    /// Every format, in the order they are documented.
    pub const ALL: [ExportFormat; 4] = [
        ExportFormat::OpenAi,
        ExportFormat::OpenAiStrict,
        ExportFormat::Anthropic,
        ExportFormat::Mcp,
    ];

    /// The model provider the format is for (the key of a manifest's
    /// `provider_compat`); `None` for MCP, which is not a model API.
    pub fn provider(self) -> Option<&'static str> {
        match self {
            ExportFormat::OpenAi | ExportFormat::OpenAiStrict => Some("openai"),
            ExportFormat::Anthropic => Some("anthropic"),
            ExportFormat::Mcp => None,
        }
    }

    /// The name a request gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            ExportFormat::OpenAi => "openai",
            ExportFormat::OpenAiStrict => "openai-strict",
            ExportFormat::Anthropic => "anthropic",
            ExportFormat::Mcp => "mcp",
        }
    }
}

impl FromStr for ExportFormat {
    type Err = SoulError;

    fn from_str(s: &str) -> Result<Self, SoulError> {
        Ok(match s {
            "openai" => ExportFormat::OpenAi,
            "openai-strict" => ExportFormat::OpenAiStrict,
            "anthropic" => ExportFormat::Anthropic,
            "mcp" => ExportFormat::Mcp,
            _ => {
                return Err(SoulError::new(
                    ErrorCode::SchemaValidationFailed,
                    format!("unknown format {s:?}: openai, openai-strict, anthropic or mcp"),
                )
                .with_field("field", "format"));
            }
        })
    }
}

/// The shape of a model's tool calls and of their answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallStyle {
    /// OpenAI `tool_calls` in, `role: tool` messages out.
    OpenAi,
    /// Anthropic `tool_use` blocks in, `tool_result` blocks out.
    Anthropic,
}

/// A caller's tools in one format.
#[derive(Debug, Clone)]
pub struct ModelTools {
    /// The format.
    pub format: ExportFormat,
    /// One definition per tool, in id order.
    pub tools: Vec<Value>,
    /// The provider-safe names used (empty for MCP, which names tools by id).
    pub names: NameMap,
    /// What the export had to change or could not express.
    pub warnings: Vec<ExportWarning>,
}

/// An MCP tool definition of `spec`.
fn mcp_tool(spec: &ToolSpec) -> Value {
    json!({
        "name": spec.name.as_str(),
        "description": spec.description,
        "inputSchema": *spec.input_schema,
    })
}

/// A routed tool call: its answer, and where its evidence is.
#[derive(Debug, Clone)]
pub(crate) struct Routed {
    /// The answer in the model API's shape.
    pub answer: Value,
    /// The call id its evidence is recorded under.
    pub call_id: CallId,
    /// The stable code when it was refused or failed.
    pub code: Option<ErrorCode>,
}

impl Stack {
    /// The tools `subject` (through `binding`) may be offered, as `format`, for
    /// `model` when the caller names the model it will use: a tool whose
    /// `provider_compat` does not admit the format's provider and model is left
    /// out ([`compat::admits`]).
    pub async fn export_tools(
        &self,
        surface: Surface,
        subject: &Subject,
        binding: &Binding,
        format: ExportFormat,
        model: Option<&str>,
    ) -> Result<ModelTools, SoulError> {
        let specs: Vec<ToolSpec> = self
            .available(surface, subject, binding)
            .await?
            .iter()
            .filter(|a| {
                format.provider().is_none_or(|provider| {
                    compat::admits(&a.tool.manifest.provider_compat, provider, model)
                })
            })
            .map(|a| a.spec())
            .collect();
        let export = match format {
            ExportFormat::OpenAi => openai::export(&specs, false),
            ExportFormat::OpenAiStrict => openai::export(&specs, true),
            ExportFormat::Anthropic => anthropic::export(&specs),
            ExportFormat::Mcp => {
                return Ok(ModelTools {
                    format,
                    tools: specs.iter().map(mcp_tool).collect(),
                    names: NameMap::default(),
                    warnings: Vec::new(),
                });
            }
        };
        Ok(ModelTools {
            format,
            tools: export.tools,
            names: export.names,
            warnings: export.warnings,
        })
    }

    /// Runs a model's tool calls for `subject` (through `binding`) and answers
    /// each, in order (see the module doc). Fails only if the caller's tool list
    /// cannot be made (the binding is refused).
    pub async fn route_tool_calls(
        &self,
        surface: Surface,
        subject: &Subject,
        binding: &Binding,
        style: CallStyle,
        calls: &[Value],
    ) -> Result<Vec<Value>, SoulError> {
        let routed = self
            .route_calls(surface, subject, binding, style, calls, None)
            .await?;
        Ok(routed.into_iter().map(|r| r.answer).collect())
    }

    /// [`route_tool_calls`](Self::route_tool_calls), each call recording the
    /// agent-loop `conversation` (and turn) that made it, and answered with the
    /// call id its evidence is under. A conversation's calls get fresh call ids
    /// (a model's ids need not be unique across conversations); other callers'
    /// calls keep the model's id when it is a valid call id.
    pub(crate) async fn route_calls(
        &self,
        surface: Surface,
        subject: &Subject,
        binding: &Binding,
        style: CallStyle,
        calls: &[Value],
        conversation: Option<&ConversationRef>,
    ) -> Result<Vec<Routed>, SoulError> {
        let available = self.available(surface, subject, binding).await?;
        let names = NameMap::new(available.iter().map(|a| a.id()));
        // Anthropic content may hold text and other blocks beside the calls: the
        // model's words, not calls.
        let calls = calls.iter().filter(|entry| match style {
            CallStyle::OpenAi => true,
            CallStyle::Anthropic => entry
                .get("type")
                .and_then(Value::as_str)
                .is_none_or(|t| t == "tool_use"),
        });
        let runs = calls.map(|entry| {
            let (names, available) = (&names, &available);
            async move {
                let read = match style {
                    CallStyle::OpenAi => read_openai(entry),
                    CallStyle::Anthropic => read_anthropic(entry),
                };
                let (id, result) = match read {
                    Ok(ModelCall { id, name, args }) => {
                        let tool = names.to_id(&name).map_or(name, |t| t.to_string());
                        // Content blocks reach a model described, not as base64.
                        let blocks = available
                            .iter()
                            .any(|a| a.id().as_str() == tool && a.tool.manifest.output_content);
                        let mut req = CallRequest::new(surface, subject.clone(), tool, args);
                        req.origin = Origin::Llm;
                        req.meta.binding = binding.clone();
                        req.meta.conversation = conversation.cloned();
                        if conversation.is_none() {
                            req.meta.call_id = CallId::new(id.as_str()).ok().map(|_| id.clone());
                        }
                        let mut result = self.invoke(req).await;
                        if let Some(output) = result.output.as_mut().filter(|_| blocks) {
                            *output = content::for_model(output);
                        }
                        (id, result)
                    }
                    Err((id, err)) => {
                        let tool = entry
                            .pointer("/function/name")
                            .or_else(|| entry.get("name"))
                            .and_then(Value::as_str)
                            .unwrap_or_default();
                        (id, self.refuse(surface, subject, tool, err).await)
                    }
                };
                let content = result_content(&result);
                let answer = match style {
                    CallStyle::OpenAi => openai_answer(&id, &content),
                    CallStyle::Anthropic => anthropic_answer(&id, &content, !result.is_ok()),
                };
                Routed {
                    answer,
                    call_id: result.call_id,
                    code: result.error_code,
                }
            }
        });
        Ok(join_all(runs).await)
    }
}
