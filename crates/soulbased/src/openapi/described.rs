//! The schemas described in code rather than derived: bodies whose type lives
//! where no schema can be derived (`CallResult` and `PreflightReport`, in
//! `soulbase_tools::pipeline`), bodies the handlers read or pass on as free JSON
//! (a tool's arguments, an assistant turn's calls, a chat completions request
//! and answer), and documents served whole (the configuration schema, this
//! document). Each names the derived components it builds on through [`Spec`],
//! and the unit tests hold `CallResult`, `PreflightReport` and the tool-call
//! answers to real serialized values.

use serde_json::{Value, json};
use soulbase_errors::{ErrorCode, PublicError};
use soulbase_qos::BudgetSnapshot;
use soulbase_types::{CallId, EnvelopeId, Obligation, ToolId};

use super::Spec;
use crate::bodies::ConversationSummary;

/// `schema` (a reference) with a description of its own beside it.
fn with_description(mut schema: Value, description: &str) -> Value {
    schema["description"] = description.into();
    schema
}

/// `CallResult`: the normalized result of an invocation.
pub(crate) fn call_result(spec: &mut Spec) -> Value {
    let schema = json!({
        "description": "The normalized result of an invocation. `denied`: refused before execution (no `evidence_ref`); `error`: the tool ran and failed; `ok`: it ran and returned `output`.",
        "type": "object",
        "required": ["call_id", "status", "replayed"],
        "additionalProperties": false,
        "properties": {
            "call_id": spec.response::<CallId>(),
            "status": {
                "description": "`ok`, `denied` (refused before execution, whatever the code) or `error` (the tool ran and failed).",
                "type": "string",
                "enum": ["ok", "denied", "error"],
            },
            "error_code": spec.response::<ErrorCode>(),
            "error": spec.response::<PublicError>(),
            "output": {"description": "The tool's output (after obligations), when `ok`."},
            "evidence_ref": with_description(
                spec.response::<EnvelopeId>(),
                "The id of the call's Begin evidence record, when it reached execution.",
            ),
            "replayed": {
                "description": "A stored result answered again for a repeated `Idempotency-Key`.",
                "type": "boolean",
            },
            "warnings": {
                "description": "For a call that succeeded: the tool's deprecation notes. Absent when there are none.",
                "type": "array",
                "items": {"type": "string"},
            },
        },
    });
    spec.described("CallResult", schema)
}

/// `PreflightReport`: what an invocation would do.
pub(crate) fn preflight_report(spec: &mut Spec) -> Value {
    let schema = json!({
        "description": "What an invocation would do, with nothing consumed or executed.",
        "type": "object",
        "required": ["tool", "version", "profile_hash", "policy_hash", "budget", "consent_required", "obligations"],
        "additionalProperties": false,
        "properties": {
            "tool": spec.response::<ToolId>(),
            "version": {"description": "The registered version that would run.", "type": "string"},
            "profile_hash": {"description": "Hash of the capability profile the call would run under.", "type": "string"},
            "policy_hash": {"description": "Hash of the policy that allowed it.", "type": "string"},
            "budget": spec.response::<BudgetSnapshot>(),
            "consent_required": {"description": "Whether the tool requires consent (and the call's token was valid).", "type": "boolean"},
            "obligations": {
                "description": "What will be done to the output before anyone sees it.",
                "type": "array",
                "items": spec.response::<Obligation>(),
            },
        },
    });
    spec.described("PreflightReport", schema)
}

/// A tool's arguments, as an invoke or a preflight reads them.
pub(crate) fn arguments(spec: &mut Spec) -> Value {
    spec.described(
        "Arguments",
        json!({
            "description": "The tool's arguments: a JSON object checked against its input schema (an empty body is `{}`).",
            "type": "object",
        }),
    )
}

/// `POST /api/model/tool_calls`' body: an assistant turn's calls, OpenAI or
/// Anthropic (what `model_api::model_tool_calls` reads).
pub(crate) fn tool_calls(spec: &mut Spec) -> Value {
    let openai_call = spec.described(
        "OpenAiToolCall",
        json!({
            "description": "One entry of an OpenAI assistant message's `tool_calls`.",
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "type": {"const": "function"},
                "function": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "arguments": {"type": "string", "description": "The arguments as JSON text."},
                    },
                },
            },
        }),
    );
    let block = spec.described(
        "AnthropicBlock",
        json!({
            "description": "An Anthropic content block; only `tool_use` blocks are calls.",
            "type": "object",
            "properties": {
                "type": {"type": "string"},
                "id": {"type": "string"},
                "name": {"type": "string"},
                "input": {"type": "object"},
            },
        }),
    );
    let openai = spec.described(
        "OpenAiToolCalls",
        json!({
            "type": "object",
            "required": ["tool_calls"],
            "not": {"required": ["content"]},
            "properties": {"tool_calls": {"type": "array", "items": openai_call}},
        }),
    );
    let anthropic = spec.described(
        "AnthropicContent",
        json!({
            "type": "object",
            "required": ["content"],
            "not": {"required": ["tool_calls"]},
            "properties": {"content": {"type": "array", "items": block}},
        }),
    );
    spec.described(
        "ToolCalls",
        json!({
            "description": "An assistant turn's calls: `tool_calls` (an OpenAI assistant message's array) or `content` (Anthropic content blocks; blocks other than `tool_use` are ignored), not both. Other members are ignored.",
            "oneOf": [openai, anthropic],
        }),
    )
}

/// `POST /api/model/tool_calls`' answer: one answer per call, in order
/// (`soulbase_tools::pipeline::router::{openai_answer, anthropic_answer}`).
pub(crate) fn tool_call_answers(spec: &mut Spec) -> Value {
    let message = spec.described(
        "ToolMessage",
        json!({
            "description": "An OpenAI `role: tool` message answering one call.",
            "type": "object",
            "required": ["role", "tool_call_id", "content"],
            "additionalProperties": false,
            "properties": {
                "role": {"const": "tool"},
                "tool_call_id": {"type": "string"},
                "content": {"type": "string", "description": "The call's answer as JSON text: its output, or its error."},
            },
        }),
    );
    let result = spec.described(
        "ToolResultBlock",
        json!({
            "description": "An Anthropic `tool_result` block answering one call.",
            "type": "object",
            "required": ["type", "tool_use_id", "content", "is_error"],
            "additionalProperties": false,
            "properties": {
                "type": {"const": "tool_result"},
                "tool_use_id": {"type": "string"},
                "content": {"type": "string", "description": "The call's answer as JSON text: its output, or its error."},
                "is_error": {"type": "boolean"},
            },
        }),
    );
    let messages = spec.described(
        "ToolMessages",
        json!({
            "type": "object",
            "required": ["messages"],
            "additionalProperties": false,
            "properties": {"messages": {"type": "array", "items": message}},
        }),
    );
    let results = spec.described(
        "ToolResults",
        json!({
            "type": "object",
            "required": ["content"],
            "additionalProperties": false,
            "properties": {"content": {"type": "array", "items": result}},
        }),
    );
    spec.described(
        "ToolCallAnswers",
        json!({
            "description": "One answer per call, in order: `messages` for `tool_calls`, `content` for `content`.",
            "oneOf": [messages, results],
        }),
    )
}

/// `POST /v1/chat/completions`' body: an OpenAI chat completions request (the
/// members `model_api::prepare` reads; the others go to the upstream as sent).
pub(crate) fn chat_request(spec: &mut Spec) -> Value {
    spec.described(
        "ChatCompletionRequest",
        json!({
            "description": "An OpenAI chat completions request; members other than these are passed to the upstream model as sent (its `tools` are the caller's governed tools).",
            "type": "object",
            "required": ["model", "messages"],
            "additionalProperties": true,
            "properties": {
                "model": {"type": "string", "description": "A model the caller's tenant may use (`model.allow`)."},
                "messages": {"type": "array", "minItems": 1, "items": {"type": "object"}},
                "max_iterations": {"type": "integer", "minimum": 1, "description": "Model turns at most (capped by `model.max_iterations_cap`)."},
                "stream": {"type": ["boolean", "null"], "description": "Answer as server-sent events (OpenAI chunks)."},
            },
        }),
    )
}

/// `POST /v1/chat/completions`' answer: the model's last response with the
/// `soulbase` summary (`model_api::run`).
pub(crate) fn chat_completion(spec: &mut Spec) -> Value {
    let summary = spec.response::<ConversationSummary>();
    spec.described(
        "ChatCompletion",
        json!({
            "description": "The upstream model's last response (an OpenAI chat completion), with what the conversation did in `soulbase`.",
            "type": "object",
            "required": ["choices", "soulbase"],
            "additionalProperties": true,
            "properties": {
                "choices": {"type": "array", "items": {"type": "object"}},
                "soulbase": summary,
            },
        }),
    )
}

/// `GET /api/config/schema`: a JSON Schema document.
pub(crate) fn config_schema() -> Value {
    json!({
        "description": "The JSON Schema (draft 2020-12) of `config.yaml`, as `docs/config.schema.json`.",
        "type": "object",
    })
}

/// `GET /api/openapi.json`: this document.
pub(crate) fn openapi_document() -> Value {
    json!({
        "description": "An OpenAPI 3.1 document.",
        "type": "object",
        "required": ["openapi", "info", "paths"],
    })
}
