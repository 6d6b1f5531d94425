//! Soulbase's MCP server (rmcp, pinned `~3.9`).
//!
//! [`McpServer`] is an rmcp [`ServerHandler`]:
//! - `tools/list` — the caller's available tools (visible to its tenant and enabled;
//!   R2 AvailableSpec), in id order, paginated by cursor, with `inputSchema`,
//!   `outputSchema` (when it describes an object) and annotations derived from the
//!   manifest (`readOnlyHint`, `destructiveHint`, `idempotentHint`, `openWorldHint`);
//! - `tools/call` — through the governed [`Invoker`] (our input schema validation
//!   runs; rmcp does none), answering `structuredContent` plus a text copy, and
//!   failures as `isError` results whose structured content is the public error
//!   (R5: `code`, `message`, `retry`, …);
//! - `notifications/tools/list_changed` — fed from the registry's tenant-filtered
//!   event stream (`Registry::subscribe_for`), through `subscriptions/listen`
//!   (protocol 2026-07-28) and, for legacy sessions, pushed on the session after
//!   `initialized`;
//! - skills ([`McpServer::with_skills`]): the seed 002 protocol tools
//!   `list_skills`, `get_skill_info`, `run_skill`; `skills.*` calls through the
//!   [`SkillGateway`] with the session's calling skill (see [`skills`] for how a
//!   session is bound to a skill); tools of disabled skills, and of skills a bound
//!   session does not import, are not listed.
//!
//! The caller is the fixed subject given for stdio, or resolved from the HTTP
//! request's headers by the [`SubjectResolver`] (streamable HTTP). Over HTTP the
//! live sessions are bounded in total and per tenant, and idle ones closed
//! ([`sessions::McpSessions`]).

pub mod sessions;
pub mod skills;
mod tools;

use std::sync::Arc;
use std::time::Instant;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, ServerNotification,
    SubscriptionFilter, ToolListChangedNotification,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_grpc::{CallObserver, NoopObserver, SubjectResolver, Surface};
use soulbase_skills::SkillGateway;
use soulbase_tools::Registry;
use soulbase_tools::pipeline::{CallResult, Invoker, ToolCall};
use soulbase_tools::registry::TenantEvents;
use soulbase_types::{Origin, Subject, ToolId, TraceContext};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

pub use skills::SKILL_HEADER;
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

/// The `_meta` key carrying an idempotency key on `tools/call`.
pub const META_IDEMPOTENCY_KEY: &str = "soulbase/idempotencyKey";
/// The `_meta` key carrying a consent token on `tools/call`.
pub const META_CONSENT: &str = "soulbase/consent";

/// The MCP server over a registry and an invoker. Cheap to clone.
#[derive(Clone)]
pub struct McpServer {
    registry: Registry,
    invoker: Invoker,
    auth: Option<Arc<dyn SubjectResolver>>,
    subject: Option<Subject>,
    observer: Arc<dyn CallObserver>,
    stop: CancellationToken,
    skills: Option<Arc<SkillGateway>>,
    /// The skill a stdio session is bound to (set by the operator).
    bound_skill: Option<String>,
    /// Whether [`SKILL_HEADER`] is honoured without a scope (development identities).
    trust_dev_skill: bool,
    /// Makes the tracing span each `tools/call` invocation runs in.
    call_span: Option<CallSpan>,
}

/// Makes the span a `tools/call` invocation runs in (e.g. an OpenTelemetry
/// `execute_tool` span). When the call fails, its stable code is recorded on the
/// span as `error.type` and `otel.status_code = "ERROR"` (fields the span must
/// declare, else the records are ignored).
pub type CallSpan = Arc<dyn Fn(&ToolCall) -> tracing::Span + Send + Sync>;

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
    pub fn for_http(registry: Registry, invoker: Invoker, auth: Arc<dyn SubjectResolver>) -> Self {
        Self {
            registry,
            invoker,
            auth: Some(auth),
            subject: None,
            observer: Arc::new(NoopObserver),
            stop: CancellationToken::new(),
            skills: None,
            bound_skill: None,
            trust_dev_skill: false,
            call_span: None,
        }
    }

    /// A server for stdio: every request acts for `subject` (the process's owner).
    pub fn for_subject(registry: Registry, invoker: Invoker, subject: Subject) -> Self {
        Self {
            registry,
            invoker,
            auth: None,
            subject: Some(subject),
            observer: Arc::new(NoopObserver),
            stop: CancellationToken::new(),
            skills: None,
            bound_skill: None,
            trust_dev_skill: false,
            call_span: None,
        }
    }

    /// Ends every change subscription when `stop` is cancelled (shutdown).
    pub fn with_shutdown(mut self, stop: CancellationToken) -> Self {
        self.stop = stop;
        self
    }

    /// Reports every call to `observer` (metrics).
    pub fn with_observer(mut self, observer: Arc<dyn CallObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// Runs every `tools/call` invocation inside the span `make` returns for it.
    pub fn with_call_span(mut self, make: CallSpan) -> Self {
        self.call_span = Some(make);
        self
    }

    /// Serves skills: the protocol tools, and every call through `gateway`.
    /// `trust_dev` honours [`SKILL_HEADER`] without a scope (only for servers that
    /// trust development identities anyway).
    pub fn with_skills(mut self, gateway: Arc<SkillGateway>, trust_dev: bool) -> Self {
        self.skills = Some(gateway);
        self.trust_dev_skill = trust_dev;
        self
    }

    /// Binds a stdio session to `skill` (the operator's choice): its tool list is
    /// the skill's tool set and its calls are made as that skill.
    pub fn with_bound_skill(mut self, skill: Option<String>) -> Self {
        self.bound_skill = skill;
        self
    }

    /// The calling skill of a request (see [`skills`]).
    fn calling_skill(
        &self,
        ext: &rmcp::model::Extensions,
        subject: &Subject,
    ) -> Result<Option<String>, SoulError> {
        if self.subject.is_some() {
            return Ok(self.bound_skill.clone());
        }
        match ext.get::<http::request::Parts>() {
            Some(parts) => skills::skill_binding(&parts.headers, subject, self.trust_dev_skill),
            None => Ok(None),
        }
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
        match (&result.output, result.error()) {
            (Some(out), None) => {
                let mut r = CallToolResult::success(vec![ContentBlock::text(out.to_string())]);
                r.structured_content = Some(out.clone());
                r
            }
            (_, Some(e)) => Self::error_result(&e),
            (None, None) => Self::error_result(&SoulError::of(ErrorCode::UnknownInternal)),
        }
    }

    /// The protocol tools (`None` when `name` is not one of them or skills are off).
    async fn protocol_call(
        &self,
        request: &CallToolRequestParams,
        subject: &Subject,
        calling: Option<&str>,
    ) -> Option<CallToolResult> {
        let gateway = self.skills.as_ref()?;
        let empty = rmcp::model::JsonObject::new();
        let args = request.arguments.as_ref().unwrap_or(&empty);
        match request.name.as_ref() {
            skills::LIST_SKILLS => {
                let v = skills::list_skills(&self.registry, gateway, &subject.tenant);
                let mut r = CallToolResult::success(vec![ContentBlock::text(v.to_string())]);
                r.structured_content = Some(v);
                Some(r)
            }
            skills::GET_SKILL_INFO => Some(
                match skills::get_skill_info(&self.registry, gateway, &subject.tenant, args) {
                    Ok((v, text)) => {
                        let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
                        r.structured_content = Some(v);
                        r
                    }
                    Err(e) => Self::error_result(&e),
                },
            ),
            skills::RUN_SKILL => Some(match skills::run_skill_args(args) {
                Ok((skill, tool, arguments)) => {
                    let started = Instant::now();
                    self.observer.call_started(Surface::Mcp);
                    let result = gateway
                        .run_skill(subject.clone(), calling, &skill, tool.as_deref(), arguments)
                        .await;
                    if let Some(id) = tool
                        .as_deref()
                        .and_then(|t| ToolId::new(format!("skills.{skill}.{t}")).ok())
                    {
                        self.observer
                            .call_finished(Surface::Mcp, &id, &result, started.elapsed());
                    }
                    Self::result_of(&result)
                }
                Err(e) => Self::error_result(&e),
            }),
            _ => None,
        }
    }

    async fn call(
        &self,
        request: CallToolRequestParams,
        subject: Subject,
        calling: Option<String>,
    ) -> CallToolResult {
        if let Some(r) = self
            .protocol_call(&request, &subject, calling.as_deref())
            .await
        {
            return r;
        }
        let tool = match ToolId::new(request.name.as_ref()) {
            Ok(t) => t,
            Err(_) => {
                let e = SoulError::of(ErrorCode::ToolNotFound).with_field("tool_id", request.name);
                self.observer.refused(Surface::Mcp, e.code());
                return Self::error_result(&e);
            }
        };
        let args = Value::Object(request.arguments.unwrap_or_default());
        let mut call = ToolCall::new(subject, tool.clone(), args).with_origin(Origin::Llm);
        if let Some(meta) = &request.meta {
            let text = |k: &str| meta.get(k).and_then(Value::as_str).map(str::to_owned);
            call.idempotency_key = text(META_IDEMPOTENCY_KEY);
            call.consent = text(META_CONSENT);
            if let Some(tp) = text("traceparent") {
                match TraceContext::parse_traceparent(&tp) {
                    Ok(t) => call.trace = Some(t),
                    Err(_) => {
                        let e = SoulError::new(
                            ErrorCode::SchemaValidationFailed,
                            "_meta.traceparent is malformed",
                        )
                        .with_field("field", "_meta.traceparent");
                        return Self::error_result(&e);
                    }
                }
            }
        }
        let started = Instant::now();
        self.observer.call_started(Surface::Mcp);
        let span = self
            .call_span
            .as_ref()
            .map_or_else(tracing::Span::none, |make| make(&call));
        let result = match &self.skills {
            Some(gateway) => {
                gateway
                    .invoke(calling.as_deref(), call)
                    .instrument(span.clone())
                    .await
            }
            None => self.invoker.invoke(call).instrument(span.clone()).await,
        };
        if let Some(code) = result.error_code {
            span.record("error.type", code.as_str());
            span.record("otel.status_code", "ERROR");
        }
        self.observer
            .call_finished(Surface::Mcp, &tool, &result, started.elapsed());
        Self::result_of(&result)
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
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
        let Some(gateway) = &self.skills else {
            return Ok(tools::list(
                &self.registry,
                &subject.tenant,
                cursor.as_deref(),
            ));
        };
        let calling = self
            .calling_skill(&context.extensions, &subject)
            .map_err(|e| rpc_error(&e))?;
        let all =
            skills::session_tools(&self.registry, gateway, &subject.tenant, calling.as_deref())
                .map_err(|e| rpc_error(&e))?;
        Ok(tools::page(all, cursor.as_deref()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let subject = match self.subject_from(&context.extensions).await {
            Ok(s) => s,
            Err(e) => {
                self.observer.refused(Surface::Mcp, e.code());
                return Ok(Self::error_result(&e).into());
            }
        };
        let calling = match self.calling_skill(&context.extensions, &subject) {
            Ok(c) => c,
            Err(e) => {
                self.observer.refused(Surface::Mcp, e.code());
                return Ok(Self::error_result(&e).into());
            }
        };
        Ok(self.call(request, subject, calling).await.into())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = requested.tools_list_changed;
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let subject = self
            .subject_from(&context.request_context().extensions)
            .await
            .map_err(|e| rpc_error(&e))?;
        let request = context.request_context().ct.clone();
        let sink = context.sink().clone();
        Self::forward_changes(
            self.registry.subscribe_for(&subject.tenant),
            self.stop.clone(),
            request,
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
        Ok(())
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
}
