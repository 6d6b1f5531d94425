//! The governed agent loop (seed 003): a conversation sent to a model with the
//! caller's governed tools and prompt sections, the model's tool calls run through
//! the one stack ([`Stack::route_tool_calls`]), their answers appended, and the
//! model asked again — until it answers or the iteration bound is reached.
//!
//! The model is behind [`ModelUpstream`] (an OpenAI-compatible chat completions
//! API; the HTTP client lives in an edge crate), so the loop knows no wire but the
//! OpenAI message shapes it reads and writes.

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::{
    BudgetUsage, ConversationEnd, ConversationEvent, ConversationRef, ConversationStep, TokenUsage,
    TurnCall, digest_json,
};
use soulbase_types::{CallId, Subject};

use soulbase_tools::pipeline::router::{openai_answer, result_content};

use crate::model::Routed;
use crate::{Binding, CallStyle, ExportFormat, Stack, Surface};

/// One model turn: an OpenAI chat completions request in, its response out.
#[async_trait]
pub trait ModelUpstream: Send + Sync {
    /// Sends `request` (a chat completions body) and returns the response body.
    /// Unreachable → `PROVIDER.UNAVAILABLE`; too slow → `PROVIDER.TIMEOUT`.
    async fn complete(&self, request: &Value) -> Result<Value, SoulError>;
}

/// Why a conversation ended: the reason its evidence records
/// ([`ConversationEnd`]); a finished conversation's is `answered`,
/// `max_iterations` or `budget`.
pub type StopReason = ConversationEnd;

/// A finished conversation.
#[derive(Debug, Clone)]
pub struct Conversation {
    /// The conversation's id, named by the evidence of every call it made
    /// (`conversation.id` in their Begins).
    pub id: String,
    /// The response to give the caller: the model's last response (for
    /// [`StopReason::MaxIterations`], with a final message saying so).
    pub response: Value,
    /// Model turns made.
    pub iterations: u32,
    /// Tool calls the model made, in order: `(tool as named by the model, the
    /// answer's content)`.
    pub tool_calls: Vec<(String, String)>,
    /// Why it ended.
    pub reason: StopReason,
}

/// The final message of a conversation stopped by its bound.
pub const MAX_ITERATIONS_MESSAGE: &str = "Stopped: the conversation reached its maximum number of iterations with tool calls still pending.";

/// The final message of a conversation stopped by its token budget.
pub const BUDGET_MESSAGE: &str = "Stopped: the conversation used its token budget.";

/// `response` with its message replaced by `message` (finish `length`): how a
/// conversation stopped by a bound answers.
fn stopped(mut response: Value, message: &str) -> Value {
    if let Some(choice) = response.pointer_mut("/choices/0") {
        choice["message"] = json!({"role": "assistant", "content": message});
        choice["finish_reason"] = json!("length");
    }
    response
}

/// The length of `value` as JSON text, the bytes a model turn is charged.
fn json_len(value: &Value) -> u64 {
    serde_json::to_vec(value).map_or(0, |v| v.len() as u64)
}

/// The tokens a model turn reports having used (OpenAI `usage`), when it reports.
fn turn_tokens(response: &Value) -> Option<TokenUsage> {
    let usage = response.get("usage")?;
    let n = |k: &str| usage.get(k).and_then(Value::as_u64);
    let (prompt, completion) = (n("prompt_tokens"), n("completion_tokens"));
    let total = n("total_tokens").or(match (prompt, completion) {
        (None, None) => None,
        (p, c) => Some(p.unwrap_or(0).saturating_add(c.unwrap_or(0))),
    })?;
    Some(TokenUsage {
        prompt: prompt.unwrap_or(0),
        completion: completion.unwrap_or(0),
        total,
    })
}

fn invalid(field: &str, message: &'static str) -> SoulError {
    SoulError::new(ErrorCode::SchemaValidationFailed, message).with_field("field", field)
}

/// The assistant message of a chat completions response.
fn assistant_message(response: &Value) -> Result<&Map<String, Value>, SoulError> {
    response
        .pointer("/choices/0/message")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            SoulError::new(
                ErrorCode::ProviderUnavailable,
                "the model's response has no choices[0].message",
            )
        })
}

/// What a conversation tells of each tool call as it is answered: the tool and
/// the answer's content.
pub type ToolCallHook = dyn Fn(&str, &str) + Send + Sync;

/// Phase 2 of the skill protocol (seed 002) for the caller: a skill's name in,
/// its full usage document (SKILL.md, verbatim) out; `TOOL.NOT_FOUND` for a
/// skill that does not show to the caller.
pub type SkillInfoHook<'a> = dyn Fn(&str) -> Result<String, SoulError> + Send + Sync + 'a;

/// The tool a conversation offers the model when the caller has skills: it
/// reads a skill's instructions (answered in place, a read of instructions like
/// MCP's `get_skill_info`, not a governed call).
pub const SKILL_INFO_TOOL: &str = "get_skill_info";

/// The OpenAI definition of [`SKILL_INFO_TOOL`].
fn skill_info_tool() -> Value {
    json!({"type": "function", "function": {
        "name": SKILL_INFO_TOOL,
        "description": "Phase 2 of the skill protocol: the full instructions (SKILL.md) of a \
                        skill listed under Skills. Read them before using the skill's tools.",
        "parameters": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "description": "The skill's name"}},
            "additionalProperties": false
        }
    }})
}

/// The answer to a [`SKILL_INFO_TOOL`] call: the document, or the refusal in
/// the shape governed calls are answered with (and its code).
fn skill_info_answer(hook: &SkillInfoHook<'_>, call: &Value) -> (Value, Option<ErrorCode>) {
    let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
    let name = call
        .pointer("/function/arguments")
        .and_then(Value::as_str)
        .and_then(|a| serde_json::from_str::<Value>(a).ok())
        .and_then(|a| a.get("name").and_then(Value::as_str).map(str::to_owned));
    let content = match name {
        None => Err(invalid("name", "get_skill_info needs {\"name\": skill}")),
        Some(name) => hook(&name),
    };
    let (content, code) = match content {
        Ok(text) => (text, None),
        Err(e) => {
            let p = e.public();
            let text = json!({"error": {"code": p.code, "message": p.message, "fields": p.fields}})
                .to_string();
            (text, Some(e.code()))
        }
    };
    (
        json!({"role": "tool", "tool_call_id": id, "content": content}),
        code,
    )
}

/// Where a conversation's own evidence goes: its id, its caller, and what it
/// has done so far (for its End).
struct Journal<'a> {
    stack: &'a Stack,
    subject: &'a Subject,
    id: CallId,
    iterations: u32,
    tool_calls: u32,
    tokens: u64,
}

impl Journal<'_> {
    /// Records `step`. Only the End is waited for: the sink writes in order, so
    /// a durable End (or a durable Begin of a call the conversation makes)
    /// means every step before it is durable too.
    async fn record(&self, step: ConversationStep) -> Result<(), SoulError> {
        let wait = matches!(step, ConversationStep::End { .. });
        let event = ConversationEvent {
            conversation_id: self.id.clone(),
            step,
        };
        self.stack
            .invoker()
            .record_conversation(self.subject, event, wait)
            .await
    }

    /// Records model turn `iteration` (its response, usage and calls).
    async fn turn(
        &mut self,
        response: &Value,
        tokens: Option<TokenUsage>,
        tool_calls: Vec<TurnCall>,
    ) -> Result<(), SoulError> {
        self.tool_calls = self
            .tool_calls
            .saturating_add(u32::try_from(tool_calls.len()).unwrap_or(u32::MAX));
        self.record(ConversationStep::Turn {
            iteration: self.iterations,
            response_digest: digest_json(response),
            tokens,
            tool_calls,
        })
        .await
    }

    /// Records the End of a conversation that ended with `reason`.
    async fn end(
        &self,
        reason: ConversationEnd,
        error_code: Option<ErrorCode>,
    ) -> Result<(), SoulError> {
        self.record(ConversationStep::End {
            reason,
            iterations: self.iterations,
            tool_calls: self.tool_calls,
            tokens: self.tokens,
            error_code,
        })
        .await
    }

    /// The conversation answered: its End recorded first (no answer without it).
    async fn finish(
        &self,
        response: Value,
        reason: ConversationEnd,
        made: Vec<(String, String)>,
    ) -> Result<Conversation, SoulError> {
        self.end(reason, None).await?;
        Ok(Conversation {
            id: self.id.as_str().to_owned(),
            response,
            iterations: self.iterations,
            tool_calls: made,
            reason,
        })
    }

    /// The conversation failed with `err`: its End records why, and `err`,
    /// naming the conversation (`conversation_id`, to replay it), is the answer
    /// (a failure to record the End is logged; the answer is an error either way).
    async fn fail(&self, reason: ConversationEnd, err: SoulError) -> SoulError {
        if let Err(e) = self.end(reason, Some(err.code())).await {
            tracing::error!(error = ?e, conversation = %self.id, "the End of a failed conversation could not be recorded");
        }
        err.with_field("conversation_id", self.id.as_str())
    }
}

/// A conversation to run: who asks, and what.
pub struct ConversationRequest<'a> {
    /// The surface it came through (metrics).
    pub surface: Surface,
    /// The caller.
    pub subject: &'a Subject,
    /// The skill binding of the caller's request.
    pub binding: &'a Binding,
    /// An OpenAI chat completions body: `model`, `messages`, other sampling
    /// fields passed through; no `tools` of its own (the caller's governed tools
    /// are given).
    pub body: &'a Value,
    /// The system prompt put first (the prompt sections).
    pub system: Option<String>,
    /// Model turns at most.
    pub max_iterations: u32,
    /// Tool calls at most (`model.max_tool_calls`): past it, calls are refused
    /// in place with `QUOTA.BUDGET_EXCEEDED`.
    pub max_tool_calls: u32,
    /// Tokens at most (`model.max_tokens`, summed from the turns' reported usage);
    /// past it the conversation ends with [`StopReason::Budget`].
    pub max_tokens: Option<u64>,
    /// Told of each tool call as it is answered: the tool (as an id when the
    /// model named one of the caller's tools) and the answer's content.
    pub on_tool_call: Option<&'a ToolCallHook>,
    /// The caller's skills' instructions: with it, the model is offered
    /// [`SKILL_INFO_TOOL`].
    pub skill_info: Option<&'a SkillInfoHook<'a>>,
}

impl std::fmt::Debug for ConversationRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConversationRequest")
            .field("surface", &self.surface)
            .field("subject", &self.subject)
            .field("max_iterations", &self.max_iterations)
            .finish_non_exhaustive()
    }
}

impl Stack {
    /// Runs a conversation through `upstream` (see the module doc).
    pub async fn run_conversation(
        &self,
        upstream: &dyn ModelUpstream,
        req: ConversationRequest<'_>,
    ) -> Result<Conversation, SoulError> {
        let ConversationRequest {
            surface,
            subject,
            binding,
            body: request,
            system,
            max_iterations,
            max_tool_calls,
            max_tokens,
            on_tool_call,
            skill_info,
        } = req;
        let Some(body) = request.as_object() else {
            return Err(invalid("body", "the body must be a JSON object"));
        };
        for own in ["tools", "functions", "tool_choice"] {
            if body.contains_key(own) {
                return Err(invalid(
                    own,
                    "the tools are the caller's governed tools: do not send tools, functions or tool_choice",
                ));
            }
        }
        let mut messages = match body.get("messages") {
            Some(Value::Array(m)) if !m.is_empty() => m.clone(),
            _ => return Err(invalid("messages", "messages must be a non-empty array")),
        };
        if let Some(text) = system {
            messages.insert(0, json!({"role": "system", "content": text}));
        }
        let exported = self
            .export_tools(
                surface,
                subject,
                binding,
                ExportFormat::OpenAi,
                body.get("model").and_then(Value::as_str),
            )
            .await?;
        let mut turn = body.clone();
        turn.remove("stream");
        turn.remove("stream_options");
        turn.remove("max_iterations");
        let mut tools = exported.tools.clone();
        if skill_info.is_some() {
            tools.push(skill_info_tool());
        }
        if !tools.is_empty() {
            turn.insert("tools".into(), Value::Array(tools));
        }
        // Names the conversation in its own evidence and that of every call it makes.
        let id = CallId::generate().as_str().replacen("call_", "conv_", 1);
        let mut journal = Journal {
            stack: self,
            subject,
            id: CallId::new(id).map_err(SoulError::internal)?,
            iterations: 0,
            tool_calls: 0,
            tokens: 0,
        };
        let caller_messages = body.get("messages").unwrap_or(&Value::Null);
        journal
            .record(ConversationStep::Start {
                model: body
                    .get("model")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                messages: caller_messages
                    .as_array()
                    .map_or(0, |m| u32::try_from(m.len()).unwrap_or(u32::MAX)),
                messages_digest: digest_json(caller_messages),
                max_iterations,
                tools_offered: u32::try_from(exported.tools.len()).unwrap_or(u32::MAX),
            })
            .await?;
        let mut made = Vec::new();
        let mut governed_calls: u32 = 0;
        loop {
            turn.insert("messages".into(), Value::Array(messages.clone()));
            // Each turn is charged through the quota seam, like a call.
            let invoker = self.invoker();
            let held = match invoker.reserve_model_turn(subject).await {
                Ok(r) => r,
                Err(e) => return Err(journal.fail(ConversationEnd::Refused, e).await),
            };
            let request = Value::Object(turn.clone());
            let response = match upstream.complete(&request).await {
                Ok(r) => {
                    let usage = BudgetUsage {
                        calls: 1,
                        bytes_in: json_len(&request),
                        bytes_out: json_len(&r),
                        cpu_ms: 0,
                    };
                    invoker.settle_model_turn(held, Some(usage)).await;
                    r
                }
                Err(e) => {
                    invoker.settle_model_turn(held, None).await;
                    return Err(journal.fail(ConversationEnd::UpstreamError, e).await);
                }
            };
            journal.iterations += 1;
            let usage = turn_tokens(&response);
            journal.tokens = journal.tokens.saturating_add(usage.map_or(0, |u| u.total));
            if max_tokens.is_some_and(|max| journal.tokens > max) {
                journal.turn(&response, usage, Vec::new()).await?;
                let response = stopped(response, BUDGET_MESSAGE);
                return journal
                    .finish(response, ConversationEnd::Budget, made)
                    .await;
            }
            let message = match assistant_message(&response) {
                Ok(m) => m.clone(),
                Err(e) => {
                    journal.turn(&response, usage, Vec::new()).await?;
                    return Err(journal.fail(ConversationEnd::UpstreamError, e).await);
                }
            };
            let calls = match message.get("tool_calls") {
                Some(Value::Array(c)) if !c.is_empty() => c.clone(),
                _ => {
                    journal.turn(&response, usage, Vec::new()).await?;
                    return journal
                        .finish(response, ConversationEnd::Answered, made)
                        .await;
                }
            };
            if journal.iterations >= max_iterations {
                journal.turn(&response, usage, Vec::new()).await?;
                let response = stopped(response, MAX_ITERATIONS_MESSAGE);
                return journal
                    .finish(response, ConversationEnd::MaxIterations, made)
                    .await;
            }
            messages.push(Value::Object(message));
            // The skill-info calls are answered in place; the others through the
            // governed path; the answers in the order of the calls.
            let is_info = |c: &Value| {
                skill_info.is_some()
                    && c.pointer("/function/name").and_then(Value::as_str) == Some(SKILL_INFO_TOOL)
            };
            // Governed calls within the conversation's budget run; the rest are
            // refused in place (and evidenced as refusals).
            let room = max_tool_calls.saturating_sub(governed_calls) as usize;
            // For each call: whether it is past the budget.
            let mut seen = 0usize;
            let over: Vec<bool> = calls
                .iter()
                .map(|c| {
                    if is_info(c) {
                        return false;
                    }
                    seen += 1;
                    seen > room
                })
                .collect();
            let governed: Vec<Value> = calls
                .iter()
                .zip(&over)
                .filter(|(c, past)| !is_info(c) && !**past)
                .map(|(c, _)| c.clone())
                .collect();
            governed_calls =
                governed_calls.saturating_add(u32::try_from(governed.len()).unwrap_or(u32::MAX));
            let at = ConversationRef {
                id: journal.id.as_str().to_owned(),
                iteration: journal.iterations,
            };
            let mut routed = self
                .route_calls(
                    surface,
                    subject,
                    binding,
                    CallStyle::OpenAi,
                    &governed,
                    Some(&at),
                )
                .await?
                .into_iter();
            // Each call's answer, and where its evidence is (none for one
            // answered in place).
            let mut answers: Vec<(Value, Option<CallId>, Option<ErrorCode>)> =
                Vec::with_capacity(calls.len());
            for (call, past) in calls.iter().zip(&over) {
                if *past {
                    let r = self
                        .over_budget(surface, subject, call, max_tool_calls)
                        .await;
                    answers.push((r.answer, Some(r.call_id), r.code));
                    continue;
                }
                match skill_info.filter(|_| is_info(call)) {
                    Some(hook) => {
                        let (answer, code) = skill_info_answer(hook, call);
                        answers.push((answer, None, code));
                    }
                    None => {
                        answers.extend(routed.next().map(|r| (r.answer, Some(r.call_id), r.code)))
                    }
                }
            }
            let mut record = Vec::with_capacity(answers.len());
            for (call, (answer, call_id, code)) in calls.iter().zip(&answers) {
                let name = call
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let tool = exported
                    .names
                    .to_id(name)
                    .map_or_else(|| name.to_owned(), |id| id.to_string());
                let content = answer
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                if let Some(tell) = on_tool_call {
                    tell(&tool, &content);
                }
                record.push(TurnCall {
                    id: call
                        .get("id")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    tool: tool.clone(),
                    call_id: call_id.clone(),
                    code: *code,
                });
                made.push((tool, content));
            }
            journal.turn(&response, usage, record).await?;
            messages.extend(answers.into_iter().map(|(answer, _, _)| answer));
        }
    }
}

impl Stack {
    /// The answer to a tool call past the conversation's `max_tool_calls`: refused
    /// `QUOTA.BUDGET_EXCEEDED` (evidenced as a refusal), in the shape governed
    /// calls are answered with.
    async fn over_budget(
        &self,
        surface: Surface,
        subject: &Subject,
        call: &Value,
        max_tool_calls: u32,
    ) -> Routed {
        let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
        let tool = call
            .pointer("/function/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let err = SoulError::new(
            ErrorCode::QuotaBudgetExceeded,
            "the conversation has made its maximum number of tool calls",
        )
        .with_field("max_tool_calls", max_tool_calls.to_string());
        let result = self.refuse(surface, subject, tool, err).await;
        Routed {
            answer: openai_answer(id, &result_content(&result)),
            call_id: result.call_id,
            code: result.error_code,
        }
    }
}
