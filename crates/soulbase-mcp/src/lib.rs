//! Soulbase's MCP server (rmcp, pinned `~3.9`).
//!
//! [`McpServer`] is an rmcp [`ServerHandler`]:
//! - `tools/list` — the caller's governed tool list (R2 AvailableSpec: visible to
//!   its tenant, enabled, shown by the skills' terms, and permitted by policy for
//!   the caller to `list` and `invoke`), each named by its manifest's `mcp_name`
//!   when it has one, else its id, in name order, paginated by cursor, with `inputSchema`,
//!   `outputSchema` (when it describes an object) and annotations derived from the
//!   manifest (`readOnlyHint`, `destructiveHint`, `idempotentHint`, `openWorldHint`);
//! - `tools/call` — through the one governed [`Stack`] (our input schema
//!   validation runs; rmcp does none), with the request's `_meta` options
//!   (`soulbase/idempotencyKey`, `soulbase/consent`, `traceparent`), answering
//!   `structuredContent` plus a text copy, and failures as `isError` results whose
//!   structured content is the public error (R5: `code`, `message`, `retry`, …);
//!   a plain name (no dot) is resolved in the caller's tenant to the tool holding
//!   it as `mcp_name` (`Registry::mcp_tool`), and a tool with `output_content`
//!   answers its content blocks (image, audio, embedded resource, text) as the
//!   result's content and the rest of its output as `structuredContent`;
//! - `notifications/tools/list_changed` — fed from the registry's tenant-filtered
//!   event stream (`Registry::subscribe_for`), through `subscriptions/listen`
//!   (protocol 2026-07-28) and, for legacy sessions, pushed on the session after
//!   `initialized`;
//! - skills ([`McpServer::with_skills`]): the seed 002 protocol tools
//!   `list_skills`, `get_skill_info`, `run_skill`; a session's binding to a skill
//!   (the operator's over stdio, a scoped header over HTTP) makes its calls as that
//!   skill, and its list that skill's tool set (see [`skills`]);
//! - the skills as resources ([`resources`]: `skill://NAME/PATH`, verbatim,
//!   followed by `resources/subscribe` or `subscriptions/listen`) and prompts
//!   ([`prompts`]: the full SKILL.md), with `completion/complete`, only the
//!   caller's skills;
//! - per session ([`McpServer::for_session`]): `logging/setLevel` and one
//!   `notifications/message` per call, progress for a call with a
//!   `progressToken`, what the tool itself reports while it runs (progress and
//!   log messages through the call's `Reporter`, `report`), and
//!   `notifications/cancelled` dropping the governed call (its End is
//!   `cancelled`);
//! - consent through elicitation ([`McpServer::with_consent`]): a call that
//!   needs consent, from a client that declared `elicitation`, asks the user
//!   first and runs with the token minted on approval (module `consent`);
//! - a running tool's own requests to the client (module `client`): elicitation
//!   and sampling, for a client that declared them, governed by the call's
//!   profile (a `client` capability) and recorded in its End.
//!
//! Over streamable HTTP a `tools/call` that sends nothing to the client while it
//! runs is answered in its HTTP request's own task, through rmcp's own dispatch
//! (module `direct`); every other request takes rmcp's session worker. Either
//! way a response is held back up to 10 ms for its answer, so that a quick call
//! goes out in one write (`direct::SETTLE`, `polling`).
//!
//! The caller is the fixed subject given for stdio, or resolved from the HTTP
//! request's headers by the [`SubjectResolver`] (streamable HTTP). Metrics and the
//! `execute_tool` span are the stack's, like every surface's. Over HTTP the
//! live sessions are bounded in total and per tenant, and idle ones closed
//! ([`sessions::McpSessions`]).

mod client;
mod consent;
mod direct;
mod fixtures;
pub mod polling;
pub mod prompts;
mod report;
pub mod resources;
pub mod sessions;
pub mod skills;
mod tools;

use std::sync::Arc;

#[allow(deprecated)]
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams, CompleteResult,
    ContentBlock, GetPromptRequestParams, GetPromptResponse, Implementation, JsonObject,
    ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
    LoggingLevel, LoggingMessageNotification, LoggingMessageNotificationParam,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    ResourceUpdatedNotification, ResourceUpdatedNotificationParam, ServerCapabilities,
    ServerConfig, ServerNotification, SetLevelRequestParams, SubscribeRequestParams,
    SubscriptionFilter, ToolListChangedNotification, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;
use soulbase_edge::{
    Binding, CallMeta, CallRequest, ConsentDesk, SKILL_HEADER_NAME, Stack, SubjectResolver, Surface,
};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_skills::SkillTerms;
use soulbase_tools::Registry;
use soulbase_tools::pipeline::CallResult;
use soulbase_tools::registry::{AvailableSpec, TenantEvents};
use soulbase_types::{Origin, Subject};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

pub use soulbase_edge::meta::{META_CALL_ID, META_CONSENT, META_IDEMPOTENCY_KEY, META_TRACEPARENT};

/// The `_meta` key of a `tools/call` result carrying warnings (a deprecated
/// tool's notes).
pub const META_WARNINGS: &str = "soulbase/warnings";
/// The `_meta` key of a `tools/list` entry listing its deprecations.
pub const META_DEPRECATIONS: &str = "soulbase/deprecations";
pub use tools::{PAGE_SIZE, annotations, page, to_mcp_tool};

/// Re-exported rmcp transports for serving.
pub mod transport {
    pub use rmcp::transport::streamable_http_server::session::local::{
        LocalSessionManager, SessionConfig,
    };
    pub use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
}

/// The MCP server over the one governed [`Stack`]. Cheap to clone.
#[derive(Clone)]
pub struct McpServer {
    /// For `list_changed` (the tenant's registry events).
    registry: Registry,
    stack: Stack,
    auth: Option<Arc<dyn SubjectResolver>>,
    subject: Option<Subject>,
    stop: CancellationToken,
    skills: Option<Arc<SkillTerms>>,
    /// The skill a stdio session is bound to (set by the operator).
    bound_skill: Option<String>,
    /// What one MCP session holds (fresh per session: [`McpServer::for_session`]).
    session: Arc<SessionState>,
    /// Mints consent a user approves through elicitation (module `consent`).
    consent: Option<ConsentDesk>,
    /// The HTTP sessions whose call streams can be closed for polling.
    polling: Option<Arc<polling::PollingSessions>>,
    /// Serves the conformance suite's fixture resources and prompts (module
    /// `fixtures`).
    fixtures: bool,
}

/// One session's resource subscriptions (URI → what it last read as).
#[derive(Debug, Default)]
struct SessionState {
    subscribed: Subscribed,
    watching: std::sync::atomic::AtomicBool,
    /// The least severe `notifications/message` the client asked for
    /// (`logging/setLevel`); `None`: no log messages.
    #[allow(deprecated)]
    log_level: std::sync::Mutex<Option<LoggingLevel>>,
}

/// The severity of a finished call in the session's log: executed and ok → info,
/// refused before execution → warning, ran and failed → error.
#[allow(deprecated)]
fn call_level(result: &CallResult) -> LoggingLevel {
    match result.status {
        soulbase_tools::pipeline::CallStatus::Ok => LoggingLevel::Info,
        soulbase_tools::pipeline::CallStatus::Denied => LoggingLevel::Warning,
        soulbase_tools::pipeline::CallStatus::Error => LoggingLevel::Error,
    }
}

/// Severity order (rmcp's enum is declared least severe first).
#[allow(deprecated)]
fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// Followed resource URIs and what each last read as (`None`: not readable).
type Subscribed = Arc<std::sync::Mutex<std::collections::BTreeMap<String, Option<String>>>>;

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

fn rpc_error(e: &SoulError) -> ErrorData {
    let p = e.public();
    let data = serde_json::to_value(&p).ok();
    match p.code {
        ErrorCode::AuthUnauthenticated
        | ErrorCode::AuthForbidden
        | ErrorCode::ToolNotFound
        | ErrorCode::SchemaValidationFailed => {
            ErrorData::invalid_request(format!("{}: {}", p.code.as_str(), p.message), data)
        }
        _ => ErrorData::internal_error(format!("{}: {}", p.code.as_str(), p.message), data),
    }
}

impl McpServer {
    /// A server for HTTP: each request's subject comes from its headers, through
    /// `auth`, unless a gate in front has already authenticated the request and
    /// put the [`Subject`] in its extensions (as `soulbased`'s `/mcp` does); only
    /// server-side code can set extensions, so a client cannot supply one.
    pub fn for_http(registry: Registry, stack: Stack, auth: Arc<dyn SubjectResolver>) -> Self {
        Self {
            registry,
            stack,
            auth: Some(auth),
            subject: None,
            stop: CancellationToken::new(),
            skills: None,
            bound_skill: None,
            session: Arc::default(),
            consent: None,
            fixtures: false,
            polling: None,
        }
    }

    /// This server for a new session: the same seams, a session state of its own
    /// (its resource subscriptions). The streamable HTTP service makes one per
    /// session with it.
    pub fn for_session(&self) -> Self {
        Self {
            session: Arc::default(),
            ..self.clone()
        }
    }

    /// A server for stdio: every request acts for `subject` (the process's owner).
    pub fn for_subject(registry: Registry, stack: Stack, subject: Subject) -> Self {
        Self {
            registry,
            stack,
            auth: None,
            subject: Some(subject),
            stop: CancellationToken::new(),
            skills: None,
            bound_skill: None,
            session: Arc::default(),
            consent: None,
            fixtures: false,
            polling: None,
        }
    }

    /// Ends every change subscription when `stop` is cancelled (shutdown).
    pub fn with_shutdown(mut self, stop: CancellationToken) -> Self {
        self.stop = stop;
        self
    }

    /// Asks the user for consent through elicitation when a call needs it and the
    /// client can be asked, minting approved consent through `desk` (module
    /// `consent`).
    pub fn with_consent(mut self, desk: ConsentDesk) -> Self {
        self.consent = Some(desk);
        self
    }

    /// Closes a call's response stream when its tool lets the client poll
    /// (streamable HTTP over `sessions`; module [`polling`]).
    pub fn with_polling(mut self, sessions: Arc<polling::PollingSessions>) -> Self {
        self.polling = Some(sessions);
        self
    }

    /// Serves the conformance suite's fixture resources and prompts beside the
    /// skills' when `on` (`server.mcp_conformance_tools`; module `fixtures`).
    pub fn with_fixtures(mut self, on: bool) -> Self {
        self.fixtures = on;
        self
    }

    /// Serves the skill protocol tools over `terms` (the invoker's skill terms).
    pub fn with_skills(mut self, terms: Arc<SkillTerms>) -> Self {
        self.skills = Some(terms);
        self
    }

    /// Binds a stdio session to `skill` (the operator's choice): its tool list is
    /// the skill's tool set and its calls are made as that skill.
    pub fn with_bound_skill(mut self, skill: Option<String>) -> Self {
        self.bound_skill = skill;
        self
    }

    /// The skill binding of a request: the operator's over stdio, the
    /// [`SKILL_HEADER`](soulbase_edge::SKILL_HEADER) claim over HTTP (checked by the stack).
    fn binding(&self, ext: &rmcp::model::Extensions) -> Binding {
        if self.subject.is_some() {
            return self
                .bound_skill
                .clone()
                .map_or(Binding::None, Binding::Operator);
        }
        let claim = ext
            .get::<http::request::Parts>()
            .and_then(|p| p.headers.get(&SKILL_HEADER_NAME))
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        Binding::claimed(claim)
    }

    async fn subject_from(&self, ext: &rmcp::model::Extensions) -> Result<Subject, SoulError> {
        if let Some(s) = &self.subject {
            return Ok(s.clone());
        }
        let Some(auth) = &self.auth else {
            return Err(SoulError::of(ErrorCode::AuthUnauthenticated));
        };
        let Some(parts) = ext.get::<http::request::Parts>() else {
            return Err(SoulError::of(ErrorCode::AuthUnauthenticated));
        };
        // Authenticated already by a gate in front (`soulbased`'s `/mcp`).
        if let Some(s) = parts.extensions.get::<Subject>() {
            return Ok(s.clone());
        }
        auth.resolve(&parts.headers).await
    }

    /// The skill set and the caller's governed list, for the skill views
    /// (resources, prompts, completion); `None` without skills.
    async fn skill_view(
        &self,
        ext: &rmcp::model::Extensions,
    ) -> Result<Option<(Arc<soulbase_skills::SkillSet>, Vec<AvailableSpec>)>, ErrorData> {
        let Some(terms) = &self.skills else {
            return Ok(None);
        };
        let subject = self.subject_from(ext).await.map_err(|e| rpc_error(&e))?;
        let available = self
            .stack
            .available(Surface::Mcp, &subject, &self.binding(ext))
            .await
            .map_err(|e| rpc_error(&e))?;
        Ok(Some((terms.catalog().current(), available)))
    }

    /// Re-reads every subscribed resource after each skills reload and sends
    /// `notifications/resources/updated` for those whose contents changed (or that
    /// stopped being readable), until `send` fails or the server stops.
    async fn watch_resources<F, Fut>(
        self,
        ext: rmcp::model::Extensions,
        subscribed: Subscribed,
        request: CancellationToken,
        mut send: F,
    ) where
        F: FnMut(String) -> Fut,
        Fut: Future<Output = bool>,
    {
        let Some(terms) = self.skills.clone() else {
            return;
        };
        let mut reloads = terms.catalog().reloads();
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return,
                () = request.cancelled() => return,
                changed = reloads.changed() => if changed.is_err() { return },
            }
            let Ok(Some((set, available))) = self.skill_view(&ext).await else {
                continue;
            };
            let changed: Vec<String> = {
                let mut subscribed = subscribed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                subscribed
                    .iter_mut()
                    .filter_map(|(uri, seen)| {
                        let now = resources::fingerprint(&set, &available, uri);
                        (now != *seen).then(|| {
                            *seen = now;
                            uri.clone()
                        })
                    })
                    .collect()
            };
            for uri in changed {
                if !send(uri).await {
                    return;
                }
            }
        }
    }

    /// Forwards the registry changes of `rx` (one tenant's, from
    /// `Registry::subscribe_for`, taken before spawning so nothing is missed) until
    /// `send` fails or either token is cancelled.
    async fn forward_changes<F, Fut>(
        mut rx: TenantEvents,
        stop: CancellationToken,
        request: CancellationToken,
        mut send: F,
    ) where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = request.cancelled() => return,
                ev = rx.recv() => match ev {
                    Ok(_) | Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => return,
                },
            };
            if !send().await {
                return;
            }
        }
    }

    fn error_result(e: &SoulError) -> CallToolResult {
        let p = e.public();
        let body = serde_json::to_value(&p).unwrap_or(Value::Null);
        let mut r = CallToolResult::error(vec![ContentBlock::text(body.to_string())]);
        r.structured_content = Some(body);
        r
    }

    fn result_of(result: &CallResult) -> CallToolResult {
        Self::answer(result, false)
    }

    /// Whether `result`, a call of `tool`, answers content blocks: it succeeded
    /// with an output holding `content` and the tool's manifest sets
    /// `output_content` (the registry is asked only then).
    fn answers_content(
        &self,
        tenant: &soulbase_types::TenantId,
        tool: &str,
        result: &CallResult,
    ) -> bool {
        let has_blocks = result.output.as_ref().is_some_and(|o| {
            o.get(soulbase_tools::manifest::content::CONTENT_KEY)
                .is_some()
        });
        result.is_ok()
            && has_blocks
            && soulbase_types::ToolId::new(tool).is_ok_and(|id| {
                self.registry
                    .get(tenant, &id)
                    .is_ok_and(|r| r.tool.manifest.output_content)
            })
    }

    /// The MCP answer of `result`. With `blocks` (a tool with `output_content`),
    /// its content is the output's content blocks, followed by a text copy of the
    /// structured part when that is not empty, and its structured content is the
    /// structured part; otherwise a text copy of the output and the output.
    fn answer(result: &CallResult, blocks: bool) -> CallToolResult {
        match (&result.output, result.error()) {
            (Some(out), None) => {
                let mut r = match blocks.then(|| content_answer(out)).flatten() {
                    Some(r) => r,
                    None => {
                        let mut r =
                            CallToolResult::success(vec![ContentBlock::text(out.to_string())]);
                        r.structured_content = Some(out.clone());
                        r
                    }
                };
                if !result.warnings.is_empty() {
                    let mut meta = serde_json::Map::new();
                    meta.insert(META_WARNINGS.into(), serde_json::json!(result.warnings));
                    r.meta = Some(rmcp::model::MetaObject(meta));
                }
                r
            }
            (_, Some(e)) => Self::error_result(&e),
            (None, None) => Self::error_result(&SoulError::of(ErrorCode::UnknownInternal)),
        }
    }

    /// The protocol tools (`None` when `name` is not one of them or skills are off),
    /// with the governed call's result when one was made (`run_skill`).
    async fn protocol_call(
        &self,
        request: &CallToolRequestParams,
        subject: &Subject,
        meta: &CallMeta,
    ) -> Option<(CallToolResult, Option<CallResult>)> {
        let terms = self.skills.as_ref()?;
        let empty = JsonObject::new();
        let args = request.arguments.as_ref().unwrap_or(&empty);
        let name = request.name.as_ref();
        if name != skills::LIST_SKILLS
            && name != skills::GET_SKILL_INFO
            && name != skills::RUN_SKILL
        {
            return None;
        }
        if name == skills::RUN_SKILL {
            let result = match skills::run_skill_args(args) {
                Ok((skill, tool, arguments)) => match terms.run_target(&skill, tool.as_deref()) {
                    Ok(id) => {
                        self.stack
                            .invoke(CallRequest {
                                surface: Surface::Mcp,
                                subject: subject.clone(),
                                tool: id.to_string(),
                                args: arguments,
                                origin: Origin::Llm,
                                meta: meta.clone(),
                            })
                            .await
                    }
                    Err(e) => {
                        let named = format!("skills.{skill}.{}", tool.unwrap_or_default());
                        self.stack.refuse(Surface::Mcp, subject, &named, e).await
                    }
                },
                Err(e) => {
                    self.stack
                        .refuse(Surface::Mcp, subject, skills::RUN_SKILL, e)
                        .await
                }
            };
            return Some((Self::result_of(&result), Some(result)));
        }
        let available = match self
            .stack
            .available(Surface::Mcp, subject, &meta.binding)
            .await
        {
            Ok(a) => a,
            Err(e) => return Some((Self::error_result(&e), None)),
        };
        let set = terms.catalog().current();
        let answer = if name == skills::LIST_SKILLS {
            let v = skills::list_skills(&set, &available);
            let mut r = CallToolResult::success(vec![ContentBlock::text(v.to_string())]);
            r.structured_content = Some(v);
            r
        } else {
            match skills::get_skill_info(&set, &available, args) {
                Ok((v, text)) => {
                    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
                    r.structured_content = Some(v);
                    r
                }
                Err(e) => Self::error_result(&e),
            }
        };
        Some((answer, None))
    }

    /// `tools/call` for `subject`, with the options of `meta` (the request's
    /// `_meta` and binding); the answer, and the governed call's result when one
    /// was made.
    async fn call(
        &self,
        peer: &rmcp::Peer<RoleServer>,
        request: CallToolRequestParams,
        subject: Subject,
        mut meta: CallMeta,
    ) -> (CallToolResult, Option<CallResult>) {
        if let Some(r) = self.protocol_call(&request, &subject, &meta).await {
            return r;
        }
        // A plain name (no dots: never a tool id) is a manifest's `mcp_name`.
        let named = request.name.as_ref();
        let tool = if named.contains('.') {
            None
        } else {
            self.registry.mcp_tool(&subject.tenant, named)
        }
        .map_or_else(|| named.to_owned(), |id| id.to_string());
        let tenant = subject.tenant.clone();
        let args = Value::Object(request.arguments.unwrap_or_default());
        if let Some(desk) = &self.consent
            && let Some(token) =
                consent::ask(peer, &self.stack, desk, &subject, &tool, &args, &meta).await
        {
            meta.consent = Some(token);
        }
        let result = self
            .stack
            .invoke(CallRequest {
                surface: Surface::Mcp,
                subject,
                tool: tool.clone(),
                args,
                origin: Origin::Llm,
                meta,
            })
            .await;
        let blocks = self.answers_content(&tenant, &tool, &result);
        (Self::answer(&result, blocks), Some(result))
    }

    /// The `tools/call`'s response stream, when it is one this server can close
    /// for polling (streamable HTTP with a session).
    fn call_stream(&self, context: &RequestContext<RoleServer>) -> Option<report::CallStream> {
        let sessions = self.polling.clone()?;
        let session = context
            .extensions
            .get::<http::request::Parts>()?
            .headers
            .get("mcp-session-id")?
            .to_str()
            .ok()?
            .to_owned();
        Some(report::CallStream {
            sessions,
            session,
            request: context.id.clone(),
        })
    }

    /// The log level the session asked for (`logging/setLevel`).
    #[allow(deprecated)]
    fn session_level(&self) -> Option<LoggingLevel> {
        *self
            .session
            .log_level
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Tells the session's log (`notifications/message`, when the client set a
    /// level this call reaches) what a call did: its id, tool, status and code.
    #[allow(deprecated)]
    async fn log_call(
        &self,
        peer: &rmcp::Peer<RoleServer>,
        asked: Option<LoggingLevel>,
        tool: &str,
        result: &CallResult,
    ) {
        let level = call_level(result);
        // The request's own level (2026 protocol), else the session's (setLevel).
        let wanted = asked.or(self.session_level());
        if wanted.is_none_or(|w| severity(level) < severity(w)) {
            return;
        }
        let data = serde_json::json!({
            "call_id": result.call_id.as_str(),
            "tool": tool,
            "status": result.status,
            "error_code": result.error_code.map(|c| c.as_str()),
            "replayed": result.replayed,
        });
        let mut param = LoggingMessageNotificationParam::new(level, data);
        param.logger = Some("soulbase.calls".into());
        let _ = peer
            .send_notification(ServerNotification::LoggingMessageNotification(
                LoggingMessageNotification::new(param),
            ))
            .await;
    }
}

/// The answer of an `output_content` tool's output: its blocks, then a text copy
/// of the structured part when not empty; `None` when a block is not one rmcp
/// reads (the pipeline checked them, so only a newer block kind).
fn content_answer(out: &Value) -> Option<CallToolResult> {
    let (blocks, structured) = soulbase_tools::manifest::content::split(out);
    let mut content: Vec<ContentBlock> = match blocks {
        Some(b) => serde_json::from_value(b.clone()).ok()?,
        None => Vec::new(),
    };
    if structured.as_object().is_some_and(|o| !o.is_empty()) {
        content.push(ContentBlock::text(structured.to_string()));
    }
    let mut r = CallToolResult::success(content);
    r.structured_content = Some(structured);
    Some(r)
}

/// The MCP error for a resource that does not exist or is not the caller's
/// (`-32002`, as the specification names it).
fn resource_not_found(uri: &str) -> ErrorData {
    ErrorData::new(
        rmcp::model::ErrorCode::RESOURCE_NOT_FOUND,
        "resource not found",
        Some(serde_json::json!({ "uri": uri })),
    )
}

/// The `_meta` of a `tools/call`: rmcp moves the request's `_meta` into the
/// request context; one still in the parameters (a request built in-process) is
/// taken first.
fn request_meta(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Result<CallMeta, SoulError> {
    let from_context = CallMeta::from_mcp_meta(&context.meta.0.0)?;
    match &request.meta {
        Some(m) => Ok(CallMeta::from_mcp_meta(&m.0.0)?.or(from_context)),
        None => Ok(from_context),
    }
}

impl McpServer {
    /// `tools/call`: a governed tool call, or a skill's protocol tool.
    async fn governed_tool_call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let subject = match self.subject_from(&context.extensions).await {
            Ok(s) => s,
            Err(e) => {
                self.stack.observer().refused(Surface::Mcp, e.code());
                return Ok(Self::error_result(&e).into());
            }
        };
        let mut meta = match request_meta(&request, &context) {
            Ok(m) => m,
            Err(e) => {
                let refused = self
                    .stack
                    .refuse(Surface::Mcp, &subject, request.name.as_ref(), e)
                    .await;
                return Ok(Self::result_of(&refused).into());
            }
        };
        meta.binding = self.binding(&context.extensions);
        let tool = request.name.to_string();
        let asked = context.meta.log_level();
        // Progress for a request with a token; the tool's own log messages at the
        // request's level (2026 protocol), else the session's (setLevel).
        let mut notifier = report::Notifier::new(
            context.peer.clone(),
            context.meta.get_progress_token(),
            asked.or(self.session_level()),
            tool.clone(),
        )
        .with_stream(self.call_stream(&context));
        let (reporter, mut reports) = report::channel(notifier.wants_reports());
        // What the tool may ask the client, if it declared anything (the
        // pipeline decides what the tool may use).
        meta.reporter = match client::for_peer(&context.peer) {
            Some(sink) => reporter.with_client(sink),
            None => reporter,
        };
        notifier.started().await;
        // `notifications/cancelled` cancels the request's token: the governed call
        // is dropped, which ends a started execution as `cancelled` (and refunds
        // its quota hold); the client expects no answer.
        let call = self.call(&context.peer, request, subject, meta);
        tokio::pin!(call);
        let (answer, result) = loop {
            tokio::select! {
                done = &mut call => break done,
                Some(r) = async {
                    match reports.as_mut() {
                        Some(q) => q.next().await,
                        None => std::future::pending().await,
                    }
                } => notifier.send(r).await,
                () = context.ct.cancelled() => {
                    return Err(ErrorData::internal_error("cancelled by the client", None));
                }
            }
        };
        // What the tool reported last goes out before its answer.
        while let Some(r) = reports.as_mut().and_then(report::Reports::queued) {
            notifier.send(r).await;
        }
        notifier.finished().await;
        if let Some(r) = &result {
            self.log_call(&context.peer, asked, &tool, r).await;
        }
        Ok(answer.into())
    }

    /// `subscriptions/listen`: list changes and followed resources, pushed until
    /// the client or the server ends the subscription.
    async fn subscription(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let ext = context.request_context().extensions.clone();
        let subject = self.subject_from(&ext).await.map_err(|e| rpc_error(&e))?;
        let request = context.request_context().ct.clone();
        let sink = context.sink().clone();
        let accepted = context.accepted().clone();
        let tools = async {
            if accepted.tools_list_changed != Some(true) {
                return;
            }
            let sink = sink.clone();
            Self::forward_changes(
                self.registry.subscribe_for(&subject.tenant),
                self.stop.clone(),
                request.clone(),
                || {
                    let sink = sink.clone();
                    async move {
                        sink.send(ServerNotification::ToolListChangedNotification(
                            ToolListChangedNotification {
                                method: Default::default(),
                                extensions: Default::default(),
                            },
                        ))
                        .await
                        .is_ok()
                    }
                },
            )
            .await;
        };
        let followed = async {
            let uris = accepted.resource_subscriptions.clone().unwrap_or_default();
            if uris.is_empty() {
                return;
            }
            let seen = match self.skill_view(&ext).await {
                Ok(Some((set, available))) => uris
                    .into_iter()
                    .map(|u| {
                        let f = resources::fingerprint(&set, &available, &u);
                        (u, f)
                    })
                    .collect(),
                _ => return,
            };
            let subscribed: Subscribed = Arc::new(std::sync::Mutex::new(seen));
            let sink = sink.clone();
            self.clone()
                .watch_resources(ext.clone(), subscribed, request.clone(), move |uri| {
                    let sink = sink.clone();
                    async move { sink.notify_resource_updated(uri).await.is_ok() }
                })
                .await;
        };
        let idle = accepted.tools_list_changed != Some(true)
            && accepted
                .resource_subscriptions
                .as_ref()
                .is_none_or(Vec::is_empty);
        tokio::join!(tools, followed);
        if idle {
            // Nothing to send: held open until the client or the server ends it.
            tokio::select! {
                () = self.stop.cancelled() => {}
                () = request.cancelled() => {}
            }
        }
        Ok(())
    }
}

impl ServerHandler for McpServer {
    /// rmcp's `initialize`, registering an HTTP session for direct
    /// `tools/call`s (module `direct`) when its session manager asks to.
    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        if let Some(polling) = &self.polling
            && let Some(slot) = context.extensions.get::<direct::Slot>()
        {
            polling
                .direct()
                .register(slot, self.clone(), context.peer.clone());
        }
        self.negotiate_initialize(&request)
    }

    #[allow(deprecated)]
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_logging()
                .enable_completions()
                .enable_prompts()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("soulbase", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Governed tools: every call is authorized, metered, sandboxed and evidenced.",
        )
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let subject = self
            .subject_from(&context.extensions)
            .await
            .map_err(|e| rpc_error(&e))?;
        let cursor = request.and_then(|r| r.cursor);
        let binding = self.binding(&context.extensions);
        let available = self
            .stack
            .available(Surface::Mcp, &subject, &binding)
            .await
            .map_err(|e| rpc_error(&e))?;
        let mut tools: Vec<_> = available.iter().map(|s| to_mcp_tool(&s.tool)).collect();
        if self.skills.is_some() {
            tools.extend(skills::protocol_tools());
        }
        Ok(tools::page(tools, cursor.as_deref()))
    }

    /// Boxed, as [`listen`](Self::listen) is: rmcp runs each request in a task of
    /// its own whose future holds the future of whichever handler the request
    /// needs, so every request's task is as large as the largest handler's. The
    /// governed call's (~17 KB) made each one ~20 KB, copied twice as it was
    /// spawned, a request for anything else included.
    fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<CallToolResponse, ErrorData>> + Send + '_ {
        // Made in its box, not copied there (see `boxed_in_place`).
        soulbase_edge::boxed_in_place(|| self.governed_tool_call(request, context))
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        *self
            .session
            .log_level
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(request.level);
        Ok(())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let mut items = match self.skill_view(&context.extensions).await? {
            Some((set, available)) => resources::list(&set, &available),
            None => Vec::new(),
        };
        if self.fixtures {
            items.extend(fixtures::resources());
        }
        Ok(ListResourcesResult::with_all_items(items))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let mut items = if self.skills.is_some() {
            resources::templates()
        } else {
            Vec::new()
        };
        if self.fixtures {
            items.extend(fixtures::templates());
        }
        Ok(ListResourceTemplatesResult::with_all_items(items))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if let Some(contents) = self
            .fixtures
            .then(|| fixtures::read(&request.uri))
            .flatten()
        {
            return Ok(ReadResourceResult::new(vec![contents]).into());
        }
        let Some((set, available)) = self.skill_view(&context.extensions).await? else {
            return Err(resource_not_found(&request.uri));
        };
        match resources::read(&set, &available, &request.uri) {
            Ok(contents) => Ok(ReadResourceResult::new(vec![contents]).into()),
            Err(e) if e.code() == ErrorCode::ToolNotFound => Err(resource_not_found(&request.uri)),
            Err(e) => Err(rpc_error(&e)),
        }
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        // A fixture never changes: followed, never reported.
        if self.fixtures && fixtures::is_resource(&request.uri) {
            return Ok(());
        }
        let Some((set, available)) = self.skill_view(&context.extensions).await? else {
            return Err(resource_not_found(&request.uri));
        };
        // Only what the caller may read can be followed.
        let seen = resources::fingerprint(&set, &available, &request.uri)
            .ok_or_else(|| resource_not_found(&request.uri))?;
        self.session
            .subscribed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(request.uri, Some(seen));
        if !self
            .session
            .watching
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            let peer = context.peer.clone();
            let subscribed = self.session.subscribed.clone();
            let watch = self.clone().watch_resources(
                context.extensions,
                subscribed,
                CancellationToken::new(),
                move |uri| {
                    let peer = peer.clone();
                    async move {
                        peer.send_notification(ServerNotification::ResourceUpdatedNotification(
                            ResourceUpdatedNotification::new(
                                ResourceUpdatedNotificationParam::new(uri),
                            ),
                        ))
                        .await
                        .is_ok()
                    }
                },
            );
            tokio::spawn(watch);
        }
        Ok(())
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.session
            .subscribed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&request.uri);
        Ok(())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let mut items = match self.skill_view(&context.extensions).await? {
            Some((set, available)) => prompts::list(&set, &available),
            None => Vec::new(),
        };
        if self.fixtures {
            items.extend(fixtures::prompts());
        }
        Ok(ListPromptsResult::with_all_items(items))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let fixture = self
            .fixtures
            .then(|| fixtures::prompt(&request.name, request.arguments.as_ref()));
        match fixture.flatten() {
            Some(Ok(prompt)) => return Ok(prompt.into()),
            Some(Err(missing)) => {
                return Err(ErrorData::invalid_params(
                    format!("prompt {} needs argument {missing:?}", request.name),
                    None,
                ));
            }
            None => {}
        }
        let Some((set, available)) = self.skill_view(&context.extensions).await? else {
            return Err(ErrorData::invalid_params("no such prompt", None));
        };
        prompts::get(&set, &available, &request.name, request.arguments.as_ref())
            .map(Into::into)
            .map_err(|e| match e.code() {
                ErrorCode::ToolNotFound => {
                    ErrorData::invalid_params(format!("no such prompt: {}", request.name), None)
                }
                _ => rpc_error(&e),
            })
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let info = match self.skill_view(&context.extensions).await? {
            Some((set, available)) => prompts::complete(
                &set,
                &available,
                &request.r#ref,
                &request.argument.name,
                &request.argument.value,
                request.context.as_ref().and_then(|c| c.arguments.as_ref()),
            ),
            None => Default::default(),
        };
        Ok(CompleteResult::new(info))
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = requested.tools_list_changed;
        // Skill URIs only; which of them the caller may read is judged at each
        // reload (an unreadable one is never reported).
        if self.skills.is_some() {
            accepted.resource_subscriptions =
                requested.resource_subscriptions.as_ref().map(|uris| {
                    uris.iter()
                        .filter(|u| resources::parse(u).is_some())
                        .cloned()
                        .collect()
                });
        }
        Some(accepted)
    }

    /// Boxed (~6 KB, held for as long as the subscription lasts): see
    /// [`call_tool`](Self::call_tool).
    fn listen(
        &self,
        context: SubscriptionContext,
    ) -> impl Future<Output = Result<(), ErrorData>> + Send + '_ {
        soulbase_edge::boxed_in_place(|| self.subscription(context))
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        // Legacy sessions (protocol before 2026-07-28) have no subscriptions/listen:
        // push list_changed on the session for as long as it accepts messages.
        let Ok(subject) = self.subject_from(&context.extensions).await else {
            return;
        };
        let peer = context.peer.clone();
        tokio::spawn(Self::forward_changes(
            self.registry.subscribe_for(&subject.tenant),
            self.stop.clone(),
            CancellationToken::new(),
            move || {
                let peer = peer.clone();
                async move {
                    peer.send_notification(ServerNotification::ToolListChangedNotification(
                        ToolListChangedNotification {
                            method: Default::default(),
                            extensions: Default::default(),
                        },
                    ))
                    .await
                    .is_ok()
                }
            },
        ));
    }
}

/// Serves `server` over stdin/stdout until the client disconnects.
pub async fn serve_stdio(server: McpServer) -> Result<(), SoulError> {
    let running = rmcp::serve_server(server, rmcp::transport::io::stdio())
        .await
        .map_err(|e| SoulError::of(ErrorCode::ProviderUnavailable).with_note(e.to_string()))?;
    running
        .waiting()
        .await
        .map_err(|e| SoulError::of(ErrorCode::ProviderUnavailable).with_note(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use soulbase_tools::ToolManifest;
    use soulbase_types::TenantId;
    use std::sync::Mutex;

    fn manifest(id: &str) -> ToolManifest {
        let m = serde_json::json!({
            "id": id, "version": "1.0.0", "description": "d",
            "input_schema": {"type": "object"}, "output_schema": {"type": "object"},
            "side_effect": "none"
        });
        ToolManifest::from_json_str(&m.to_string()).unwrap()
    }

    /// The forwarder handles events in commit order, so when it sends for the
    /// global tool registered last, every earlier event has been judged: tenant
    /// A's registration must not have produced a send for tenant B.
    #[tokio::test]
    async fn list_changed_is_not_sent_for_another_tenants_tools() {
        let registry = Registry::new();
        let a = TenantId::new("tenant-a").unwrap();
        let b = TenantId::new("tenant-b").unwrap();
        let sent = Arc::new(Mutex::new(0usize));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let task = {
            let (sent, stop) = (sent.clone(), stop.clone());
            tokio::spawn(McpServer::forward_changes(
                registry.subscribe_for(&b),
                stop,
                CancellationToken::new(),
                move || {
                    let (sent, tx) = (sent.clone(), tx.clone());
                    async move {
                        let n = {
                            let mut n = sent.lock().unwrap();
                            *n += 1;
                            *n
                        };
                        let _ = tx.send(n);
                        true
                    }
                },
            ))
        };
        registry
            .register_for(&a, manifest("a.secret.tool"))
            .unwrap();
        registry.register(manifest("g.shared.tool")).unwrap();
        let n = rx.recv().await.unwrap();
        assert_eq!(n, 1, "the first notification B gets is for the global tool");
        // B is notified for its own tools too.
        registry.register_for(&b, manifest("b.own.tool")).unwrap();
        let n = rx.recv().await.unwrap();
        assert_eq!(n, 2);
        stop.cancel();
        task.await.unwrap();
        assert_eq!(*sent.lock().unwrap(), 2);
    }
    /// An `output_content` tool's output answers its blocks as MCP content, then a
    /// text copy of a non-empty structured part, which is the structured content.
    #[test]
    fn content_outputs_answer_their_blocks() {
        let image = serde_json::json!({"type": "image", "data": "AAEC", "mimeType": "image/png"});
        let only = content_answer(&serde_json::json!({"content": [image]})).unwrap();
        let v = serde_json::to_value(&only).unwrap();
        assert_eq!(v["content"], serde_json::json!([image]));
        assert_eq!(v["structuredContent"], serde_json::json!({}));
        let both = content_answer(&serde_json::json!({"content": [image], "n": 1})).unwrap();
        let v = serde_json::to_value(&both).unwrap();
        assert_eq!(
            v["content"][1],
            serde_json::json!({"type": "text", "text": "{\"n\":1}"})
        );
        assert_eq!(v["structuredContent"], serde_json::json!({"n": 1}));
        // A block rmcp cannot read falls back to the JSON answer.
        assert!(content_answer(&serde_json::json!({"content": [{"type": "video"}]})).is_none());
    }
}
