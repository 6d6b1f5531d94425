//! Reading a model's tool calls and writing its answers, in the shapes of the
//! model APIs: OpenAI `tool_calls` / `role: tool` messages ([`read_openai`],
//! [`openai_answer`]) and Anthropic `tool_use` / `tool_result` blocks
//! ([`read_anthropic`], [`anthropic_answer`]). The server's model surface
//! (`soulbase_edge::Stack::route_tool_calls`) and [`ToolCallRouter`] (for a
//! linked invoker) both read and answer through these.
//!
//! [`ToolCallRouter`] input: the `tool_calls` array of an assistant message
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

/// What a model may read of a refusal: `{"error": {code, message, retry, fields}}`.
pub fn error_content(err: &SoulError) -> Value {
    let p = err.public();
    json!({"error": {"code": p.code, "message": p.message, "retry": p.retry, "fields": p.fields}})
}

/// What a model reads of a call's result: the output, or the error as
/// [`error_content`] shapes it.
pub fn result_content(result: &CallResult) -> Value {
    match (&result.output, &result.error) {
        (Some(output), _) if result.is_ok() => output.clone(),
        (_, Some(e)) => {
            json!({"error": {"code": e.code, "message": e.message, "retry": e.retry, "fields": e.fields}})
        }
        _ => json!({"error": {"code": ErrorCode::UnknownInternal}}),
    }
}

/// One tool call of a model's turn as read from its API's shape: the call's id,
/// the tool as the model named it, the arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCall {
    /// The model's id for the call (answered back with the result).
    pub id: String,
    /// The tool name as the model gave it (a provider-safe name or a tool id).
    pub name: String,
    /// The arguments (a JSON object).
    pub args: Value,
}

/// Why an entry could not be read: its id (as far as it has one) and the refusal.
pub type Unreadable = (String, SoulError);

fn malformed(id: &str, message: &'static str, field: &'static str) -> Unreadable {
    (
        id.to_owned(),
        SoulError::new(ErrorCode::SchemaValidationFailed, message).with_field("field", field),
    )
}

/// Reads one entry of an OpenAI assistant message's `tool_calls`
/// (`{"id", "type": "function", "function": {"name", "arguments": "<JSON text>"}}`).
pub fn read_openai(entry: &Value) -> Result<ModelCall, Unreadable> {
    let id = entry
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let function = entry
        .get("function")
        .ok_or_else(|| malformed(&id, "the tool call has no function", "function"))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed(&id, "the tool call has no function name", "function.name"))?;
    let args = match function.get("arguments") {
        Some(Value::String(text)) if text.trim().is_empty() => json!({}),
        Some(Value::String(text)) => serde_json::from_str(text).map_err(|_| {
            malformed(
                &id,
                "the tool call's arguments are not valid JSON",
                "function.arguments",
            )
        })?,
        Some(v @ Value::Object(_)) => v.clone(),
        None => json!({}),
        Some(_) => {
            return Err(malformed(
                &id,
                "the tool call's arguments must be a JSON object",
                "function.arguments",
            ));
        }
    };
    if !args.is_object() {
        return Err(malformed(
            &id,
            "the tool call's arguments must be a JSON object",
            "function.arguments",
        ));
    }
    Ok(ModelCall {
        id,
        name: name.to_owned(),
        args,
    })
}

/// Reads one Anthropic `tool_use` content block (`{"type": "tool_use", "id",
/// "name", "input": {…}}`).
pub fn read_anthropic(block: &Value) -> Result<ModelCall, Unreadable> {
    let id = block
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if block.get("type").and_then(Value::as_str) != Some("tool_use") {
        return Err(malformed(&id, "the block is not a tool_use block", "type"));
    }
    let name = block
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed(&id, "the tool_use block has no name", "name"))?;
    let args = match block.get("input") {
        None => json!({}),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => {
            return Err(malformed(
                &id,
                "the tool_use block's input must be a JSON object",
                "input",
            ));
        }
    };
    Ok(ModelCall {
        id,
        name: name.to_owned(),
        args,
    })
}

/// The OpenAI `role: tool` message answering call `id` with `content`.
pub fn openai_answer(id: &str, content: &Value) -> Value {
    json!({"role": "tool", "tool_call_id": id, "content": content.to_string()})
}

/// The Anthropic `tool_result` block answering call `id` with `content`.
pub fn anthropic_answer(id: &str, content: &Value, is_error: bool) -> Value {
    json!({"type": "tool_result", "tool_use_id": id, "content": content.to_string(), "is_error": is_error})
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

    fn parse(&self, subject: &Subject, entry: &Value) -> Result<ToolCall, Unreadable> {
        let ModelCall { id, name, mut args } = read_openai(entry)?;
        let tool = self.names.to_id(&name).ok_or_else(|| {
            (
                id.clone(),
                SoulError::of(ErrorCode::ToolNotFound).with_field("name", name.as_str()),
            )
        })?;
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
