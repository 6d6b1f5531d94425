//! Routing a model's OpenAI-format `tool_calls` through the pipeline and back.
//!
//! Input: the `tool_calls` array of an assistant message
//! (`[{"id", "type": "function", "function": {"name", "arguments": "<JSON text>"}}]`).
//! Output: one `{"role": "tool", "tool_call_id", "content"}` message per call, in the
//! same order. Content is the output as JSON text, or for a failure a structured
//! `{"error": {"code", "message", "retry"}}` the model can read. Nothing here panics
//! on malformed input; a malformed entry becomes an error message.

use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{CallId, Origin, Subject};

use super::{CallResult, Invoker, ToolCall};
use crate::discovery::{NameMap, openai};

/// A `role: tool` message answering one tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolMessage {
    /// Always `tool`.
    pub role: String,
    /// The `id` of the tool call answered.
    pub tool_call_id: String,
    /// The result as JSON text.
    pub content: String,
}

impl ToolMessage {
    fn new(id: &str, content: Value) -> Self {
        Self {
            role: "tool".to_owned(),
            tool_call_id: id.to_owned(),
            content: content.to_string(),
        }
    }
}

fn error_content(err: &SoulError) -> Value {
    let p = err.public();
    json!({"error": {"code": p.code, "message": p.message, "retry": p.retry, "fields": p.fields}})
}

fn result_content(result: &CallResult) -> Value {
    match (&result.output, &result.error) {
        (Some(output), _) if result.is_ok() => output.clone(),
        (_, Some(e)) => {
            json!({"error": {"code": e.code, "message": e.message, "retry": e.retry, "fields": e.fields}})
        }
        _ => json!({"error": {"code": ErrorCode::UnknownInternal}}),
    }
}

/// Runs a model's tool calls for one subject, mapping provider-safe names back to ids.
pub struct ToolCallRouter {
    invoker: Invoker,
    names: NameMap,
    strict: bool,
}

impl ToolCallRouter {
    /// A router resolving names with `names` (the map used when exporting the tools),
    /// for tools exported without `strict`.
    pub fn new(invoker: Invoker, names: NameMap) -> Self {
        Self {
            invoker,
            names,
            strict: false,
        }
    }

    /// Declares that the tools were exported with OpenAI `strict` mode, where every
    /// optional field became required and nullable: a `null` the model sends for a
    /// field that is optional in the tool's own schema then means "absent" and is
    /// removed before validation ([`openai::restore_optional`]).
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    fn parse(&self, subject: &Subject, entry: &Value) -> Result<ToolCall, (String, SoulError)> {
        let id = entry
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let bad = |msg: &'static str, field: &'static str| {
            (
                id.clone(),
                SoulError::new(ErrorCode::SchemaValidationFailed, msg).with_field("field", field),
            )
        };
        let function = entry
            .get("function")
            .ok_or_else(|| bad("the tool call has no function", "function"))?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("the tool call has no function name", "function.name"))?;
        let tool = self.names.to_id(name).ok_or_else(|| {
            (
                id.clone(),
                SoulError::of(ErrorCode::ToolNotFound).with_field("name", name),
            )
        })?;
        let mut args = match function.get("arguments") {
            Some(Value::String(text)) if text.trim().is_empty() => json!({}),
            Some(Value::String(text)) => serde_json::from_str(text).map_err(|_| {
                bad(
                    "the tool call's arguments are not valid JSON",
                    "function.arguments",
                )
            })?,
            Some(v @ Value::Object(_)) => v.clone(),
            None => json!({}),
            Some(_) => {
                return Err(bad(
                    "the tool call's arguments must be a JSON object",
                    "function.arguments",
                ));
            }
        };
        if self.strict
            && let Ok(resolved) = self.invoker.resolve(&subject.tenant, &tool)
        {
            openai::restore_optional(&resolved.tool.manifest.input_schema, &mut args);
        }
        let call_id = CallId::new(id.as_str()).unwrap_or_else(|_| CallId::generate());
        Ok(ToolCall::new(subject.clone(), tool, args)
            .with_call_id(call_id)
            .with_origin(Origin::Llm))
    }

    /// Executes every call (concurrently) and answers each, in order.
    pub async fn route(&self, subject: &Subject, tool_calls: &[Value]) -> Vec<ToolMessage> {
        let runs = tool_calls.iter().map(|entry| async move {
            match self.parse(subject, entry) {
                Ok(call) => {
                    let id = entry
                        .get("id")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    let result = self.invoker.invoke(call).await;
                    ToolMessage::new(&id, result_content(&result))
                }
                Err((id, err)) => ToolMessage::new(&id, error_content(&err)),
            }
        });
        join_all(runs).await
    }
}
