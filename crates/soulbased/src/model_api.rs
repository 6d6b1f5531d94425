//! The model-facing HTTP routes: what a team whose agent speaks the OpenAI or
//! Anthropic API needs from Soulbase, served per caller through the one stack
//! ([`soulbase_edge::model`]).
//!
//! | route | what |
//! |---|---|
//! | `GET /api/model/tools?format=&model=` | the caller's governed tools as `openai`, `openai-strict`, `anthropic` or `mcp` definitions (less those whose `provider_compat` does not admit the model), the provider names used, export warnings, and the skills that show (name and short description: phase 1 of the two-phase skill use) |
//! | `POST /api/model/tool_calls` | an assistant turn's calls — `{"tool_calls": [...]}` (OpenAI) or `{"content": [...]}` (Anthropic `tool_use` blocks; other blocks ignored) — run through the governed path; answers `{"messages": [...]}` (`role: tool`) or `{"content": [...]}` (`tool_result`), one per call, in order |
//! | `GET /api/model/prompt?max_iterations=` | the system-prompt sections (seed 003): Available Tools, Skills, and Tool Calling Guidelines when a bound is given |
//! | `GET /api/skills/{name}` | phase 2: a skill that shows to the caller, with its SKILL.md verbatim (`TOOL.NOT_FOUND` otherwise) |
//!
//! The `X-Soulbase-Skill` header binds every route to a skill, as on `/api/tools`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use soulbase_edge::{Binding, CallMeta, CallStyle, ExportFormat, Surface};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_grpc::convert;
use soulbase_tools::registry::AvailableSpec;
use soulbase_types::Subject;

use crate::app::App;
use crate::bodies::{ConversationSummary, ModelTools, Prompt, ToolCallMade};
use crate::http_api::{Param, error_response, json_response, subject, typed_response};

/// The most iterations a prompt may state.
const MAX_ITERATIONS: u32 = 100;

/// The caller, its binding and its governed list; or the refusal.
async fn caller(
    app: &App,
    headers: &HeaderMap,
) -> Result<(Subject, Binding, Vec<AvailableSpec>), SoulError> {
    let subject = subject(app, headers).await?;
    let binding = CallMeta::from_headers(headers).binding;
    let available = app
        .stack
        .available(Surface::Http, &subject, &binding)
        .await?;
    Ok((subject, binding, available))
}

/// The skills that show to a caller with `available` tools (name, description).
fn skills_shown(app: &App, available: &[AvailableSpec]) -> Vec<soulbase_skills::SkillSummary> {
    let Some(skills) = &app.skills else {
        return Vec::new();
    };
    let set = skills.catalog.current();
    soulbase_skills::list_skills(&set)
        .iter()
        .filter(|s| soulbase_skills::skill_shows(&set, available, &s.name))
        .cloned()
        .collect()
}

/// `GET /api/model/tools` query.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsQuery {
    /// The format of the definitions (default `openai`).
    #[serde(default)]
    #[schemars(schema_with = "crate::openapi::export_format_schema")]
    pub format: Option<String>,
    /// The model the tools are for: tools whose `provider_compat` does not admit
    /// the format's provider and this model are left out.
    pub model: Option<String>,
}

async fn model_tools(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    query: Result<Query<ToolsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = query else {
        return error_response(&convert::invalid(
            "query",
            "unknown or malformed query parameter (format, model)",
        ));
    };
    let format = match q
        .format
        .as_deref()
        .unwrap_or("openai")
        .parse::<ExportFormat>()
    {
        Ok(f) => f,
        Err(e) => return error_response(&e),
    };
    let (subject, binding, available) = match caller(&app, &headers).await {
        Ok(c) => c,
        Err(e) => return error_response(&e),
    };
    let exported = match app
        .stack
        .export_tools(
            Surface::Http,
            &subject,
            &binding,
            format,
            q.model.as_deref(),
        )
        .await
    {
        Ok(x) => x,
        Err(e) => return error_response(&e),
    };
    let body = ModelTools {
        format: format.as_str(),
        names: exported
            .names
            .iter()
            .map(|(id, name)| (name.to_owned(), id.clone()))
            .collect(),
        tools: exported.tools,
        warnings: exported.warnings,
        skills: skills_shown(&app, &available),
    };
    typed_response(StatusCode::OK, &body)
}

async fn model_tool_calls(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let subject = match subject(&app, &headers).await {
        Ok(s) => s,
        Err(e) => return error_response(&e),
    };
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return error_response(&convert::invalid(
            "body",
            "the body must be a JSON object with tool_calls (OpenAI) or content (Anthropic)",
        ));
    };
    let (style, calls, answer_key): (CallStyle, Vec<Value>, &str) = match (
        body.get("tool_calls"),
        body.get("content"),
    ) {
        (Some(Value::Array(calls)), None) => (CallStyle::OpenAi, calls.clone(), "messages"),
        (None, Some(Value::Array(blocks))) => (CallStyle::Anthropic, blocks.clone(), "content"),
        _ => {
            return error_response(&convert::invalid(
                "body",
                "give either tool_calls (an OpenAI assistant message's array) or content (Anthropic blocks)",
            ));
        }
    };
    let binding = CallMeta::from_headers(&headers).binding;
    match app
        .stack
        .route_tool_calls(Surface::Http, &subject, &binding, style, &calls)
        .await
    {
        Ok(answers) => json_response(StatusCode::OK, &json!({ answer_key: answers })),
        Err(e) => error_response(&e),
    }
}

/// `GET /api/model/prompt` query.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptQuery {
    /// The bound on the tool-calling loop to state (1–100): with it, the Tool
    /// Calling Guidelines section.
    #[schemars(range(min = 1, max = MAX_ITERATIONS))]
    pub max_iterations: Option<u32>,
}

async fn model_prompt(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    query: Result<Query<PromptQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = query else {
        return error_response(&convert::invalid(
            "query",
            "unknown or malformed query parameter (max_iterations)",
        ));
    };
    if let Some(n) = q.max_iterations
        && !(1..=MAX_ITERATIONS).contains(&n)
    {
        return error_response(&convert::invalid(
            "max_iterations",
            "max_iterations must be between 1 and 100",
        ));
    }
    let (_, _, available) = match caller(&app, &headers).await {
        Ok(c) => c,
        Err(e) => return error_response(&e),
    };
    let tools: Vec<_> = available.iter().map(AvailableSpec::spec).collect();
    let skills = skills_shown(&app, &available);
    let prompt = soulbase_skills::system_prompt_sections(&tools, &skills, q.max_iterations);
    typed_response(StatusCode::OK, &Prompt { prompt })
}

async fn skill_info(
    State(app): State<Arc<App>>,
    Param(name): Param,
    headers: HeaderMap,
) -> Response {
    let (_, _, available) = match caller(&app, &headers).await {
        Ok(c) => c,
        Err(e) => return error_response(&e),
    };
    let not_found = || {
        error_response(
            &SoulError::new(ErrorCode::ToolNotFound, format!("skill {name:?} not found"))
                .with_field("skill", name.clone()),
        )
    };
    let Some(skills) = &app.skills else {
        return not_found();
    };
    let set = skills.catalog.current();
    if !soulbase_skills::skill_shows(&set, &available, &name) {
        return not_found();
    }
    match soulbase_skills::get_skill_info(&set, &name) {
        Ok(info) => typed_response(StatusCode::OK, &info),
        Err(e) => error_response(&e),
    }
}

/// The model-facing routes (see the module doc), for the tools role's router.
pub fn routes() -> axum::Router<Arc<App>> {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/api/model/tools", get(model_tools))
        .route("/api/model/tool_calls", post(model_tool_calls))
        .route("/api/model/prompt", get(model_prompt))
        .route("/api/skills/{name}", get(skill_info))
        .route("/v1/chat/completions", post(chat_completions))
}

/// The upstream model API of `model.upstream`, over HTTP.
struct HttpUpstream {
    url: String,
    api_key: Option<String>,
    timeout: std::time::Duration,
}

/// One client for every conversation (connections pooled, Nagle off).
fn http_client() -> &'static reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .tcp_nodelay(true)
            .build()
            .unwrap_or_default()
    })
}

#[async_trait::async_trait]
impl soulbase_edge::ModelUpstream for HttpUpstream {
    async fn complete(&self, request: &Value) -> Result<Value, SoulError> {
        let unavailable = |why: String| {
            SoulError::new(ErrorCode::ProviderUnavailable, "the model upstream failed")
                .with_field("upstream", self.url.clone())
                .with_note(why)
        };
        // A transport failure: too slow is a timeout, anything else unavailable.
        let failed = |e: reqwest::Error| {
            if e.is_timeout() {
                SoulError::new(
                    ErrorCode::ProviderTimeout,
                    "the model upstream did not answer in time",
                )
                .with_field("upstream", self.url.clone())
            } else {
                unavailable(e.to_string())
            }
        };
        let mut req = http_client()
            .post(&self.url)
            .timeout(self.timeout)
            .header("content-type", "application/json")
            .body(request.to_string());
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let response = req.send().await.map_err(failed)?;
        let status = response.status();
        let body = response.bytes().await.map_err(failed)?;
        if !status.is_success() {
            return Err(unavailable(format!(
                "status {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(512)])
            )));
        }
        serde_json::from_slice(&body).map_err(|e| unavailable(format!("not JSON: {e}")))
    }
}

/// `POST /v1/chat/completions`: a governed agent conversation (see
/// [`soulbase_edge::agent`]) with the configured upstream; with `stream: true`
/// the answer comes as server-sent events in the OpenAI chunk format, each tool
/// call announced as it finishes (an SSE comment line, which clients skip).
async fn chat_completions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let prepared = match prepare(&app, &headers, &body).await {
        Ok(p) => p,
        Err(e) => return error_response(&e),
    };
    if !prepared.stream {
        return match run(&app, &prepared, None).await {
            Ok(v) => typed_response(StatusCode::OK, &v),
            Err(e) => error_response(&e),
        };
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        let progress = {
            let tx = tx.clone();
            move |tool: &str, content: &str| {
                let status = if content.contains("\"code\"") {
                    "refused or failed"
                } else {
                    "ok"
                };
                let _ = tx.send(format!(": tool {tool} {status}\n\n"));
            }
        };
        let events = match run(&app, &prepared, Some(&progress)).await {
            Ok(response) => sse_chunks(&response),
            Err(e) => vec![
                format!("data: {}\n\n", json!({"error": e.public()})),
                "data: [DONE]\n\n".to_owned(),
            ],
        };
        for e in events {
            let _ = tx.send(e);
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|s| (Ok::<_, std::convert::Infallible>(Bytes::from(s)), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(axum::body::Body::from_stream(stream))
        .unwrap_or_else(|_| error_response(&SoulError::of(ErrorCode::UnknownInternal)))
}

/// A final chat completions response as OpenAI stream chunks: the role, the
/// content, the finish (carrying the `soulbase` summary), then `[DONE]`.
fn sse_chunks(response: &Value) -> Vec<String> {
    let choice = &response["choices"][0];
    let content = choice["message"]["content"].as_str().unwrap_or_default();
    let finish = choice["finish_reason"].as_str().unwrap_or("stop");
    let chunk = |delta: Value, finish: Value| {
        json!({
            "id": response.get("id").cloned().unwrap_or_else(|| json!("chatcmpl-soulbase")),
            "object": "chat.completion.chunk",
            "created": response.get("created").cloned().unwrap_or_else(|| json!(0)),
            "model": response.get("model").cloned().unwrap_or(Value::Null),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        })
    };
    let mut last = chunk(json!({}), json!(finish));
    last["soulbase"] = response["soulbase"].clone();
    [
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"content": content}), Value::Null),
        last,
    ]
    .iter()
    .map(|c| format!("data: {c}\n\n"))
    .chain(std::iter::once("data: [DONE]\n\n".to_owned()))
    .collect()
}

/// A checked conversation request, ready to run.
struct Prepared {
    subject: Subject,
    binding: Binding,
    request: Value,
    upstream: HttpUpstream,
    system: String,
    max_iterations: u32,
    /// `model.max_tool_calls` and `model.max_tokens` when the request came.
    max_tool_calls: u32,
    max_tokens: Option<u64>,
    stream: bool,
    /// The caller's governed list (which skills show to it).
    available: Vec<AvailableSpec>,
    /// Whether any skill shows to the caller (then the model is offered
    /// `get_skill_info`).
    has_skills: bool,
}

async fn prepare(app: &App, headers: &HeaderMap, body: &[u8]) -> Result<Prepared, SoulError> {
    let (subject, binding, available) = caller(app, headers).await?;
    let request: Value = serde_json::from_slice(body).map_err(|_| {
        convert::invalid("body", "the body must be a JSON chat completions request")
    })?;
    let snap = app.config.current();
    let cfg = snap.config();
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| convert::invalid("model", "model must be a string"))?;
    let stream = match request.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(convert::invalid("stream", "stream must be a boolean")),
    };
    if !cfg.model_allowed(subject.tenant.as_str(), model) {
        return Err(SoulError::new(
            ErrorCode::AuthForbidden,
            "this tenant may not use this model (model.allow)",
        )
        .with_field("model", model.to_owned()));
    }
    let max_iterations = match request.get("max_iterations") {
        None => cfg.model.max_iterations,
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| (1..=cfg.model.max_iterations_cap).contains(n))
            .ok_or_else(|| {
                convert::invalid(
                    "max_iterations",
                    "max_iterations must be between 1 and model.max_iterations_cap",
                )
            })?,
    };
    let Some(up) = &cfg.model.upstream else {
        return Err(SoulError::new(
            ErrorCode::ProviderUnavailable,
            "no model upstream is configured (model.upstream)",
        ));
    };
    let upstream = HttpUpstream {
        url: format!("{}/chat/completions", up.base_url.trim_end_matches('/')),
        api_key: up
            .api_key_env
            .as_deref()
            .and_then(|var| std::env::var(var).ok()),
        timeout: std::time::Duration::from_millis(up.timeout_ms),
    };
    let tools: Vec<_> = available.iter().map(AvailableSpec::spec).collect();
    let skills = skills_shown(app, &available);
    let system = soulbase_skills::system_prompt_sections(&tools, &skills, Some(max_iterations));
    let has_skills = !skills.is_empty();
    Ok(Prepared {
        available,
        has_skills,
        max_tool_calls: cfg.model.max_tool_calls,
        max_tokens: cfg.model.max_tokens,
        subject,
        binding,
        request,
        upstream,
        system,
        max_iterations,
        stream,
    })
}

/// Runs a prepared conversation; the model's last response with the `soulbase`
/// summary.
async fn run(
    app: &App,
    p: &Prepared,
    on_tool_call: Option<&soulbase_edge::agent::ToolCallHook>,
) -> Result<Value, SoulError> {
    // Phase 2 of the skill protocol: a skill's SKILL.md, for the skills that show
    // to the caller.
    let skill_info = |name: &str| -> Result<String, SoulError> {
        let not_found = || {
            SoulError::new(ErrorCode::ToolNotFound, format!("skill {name} not found"))
                .with_field("skill", name.to_owned())
        };
        let skills = app.skills.as_ref().ok_or_else(not_found)?;
        let set = skills.catalog.current();
        if !soulbase_skills::skill_shows(&set, &p.available, name) {
            return Err(not_found());
        }
        Ok(soulbase_skills::get_skill_info(&set, name)?
            .content
            .to_string())
    };
    let done = app
        .stack
        .run_conversation(
            &p.upstream,
            soulbase_edge::ConversationRequest {
                surface: Surface::Http,
                subject: &p.subject,
                binding: &p.binding,
                body: &p.request,
                system: Some(p.system.clone()),
                max_iterations: p.max_iterations,
                max_tool_calls: p.max_tool_calls,
                max_tokens: p.max_tokens,
                on_tool_call,
                skill_info: p
                    .has_skills
                    .then_some(&skill_info as &soulbase_edge::SkillInfoHook<'_>),
            },
        )
        .await?;
    let mut response = done.response;
    if let Some(obj) = response.as_object_mut() {
        let summary = ConversationSummary {
            conversation_id: done.id,
            iterations: done.iterations,
            tool_calls: done
                .tool_calls
                .into_iter()
                .map(|(tool, content)| ToolCallMade { tool, content })
                .collect(),
            reason: done.reason,
        };
        obj.insert(
            "soulbase".into(),
            serde_json::to_value(&summary).map_err(SoulError::internal)?,
        );
    }
    Ok(response)
}
