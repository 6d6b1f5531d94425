//! The one outer stack every surface calls.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_tools::discovery::{NameMap, openai};
use soulbase_tools::pipeline::{CallResult, Invoker, PreflightReport, ToolCall};
use soulbase_tools::registry::{AvailableSpec, ResolvedTool, ToolFilter};
use soulbase_types::{CallId, Origin, Subject, ToolId, TraceContext};
use tracing::Instrument;

use crate::binding::{self, Binding};
use crate::meta::CallMeta;
use crate::observe::{CallObserver, NoopObserver, Surface};

/// Makes the span an invocation runs in (e.g. an OpenTelemetry `execute_tool`
/// span). When the call fails, its stable code is recorded on the span as
/// `error.type` and `otel.status_code = "ERROR"` (fields the span must declare,
/// else the records are ignored).
pub type SpanMaker = Arc<dyn Fn(&ToolCall) -> tracing::Span + Send + Sync>;

/// `make()` in a heap block allocated before it is made, pinned. With the block
/// there first, an optimized build writes the value (a future: its few initial
/// fields) straight into it — checked in the generated assembly; not guaranteed,
/// and a debug build still copies — where `Box::pin(make())` evaluates `make()` on
/// the stack and copies all of it into the box (LLVM cannot move an allocation
/// ahead of what is evaluated before it: the MCP call's 16 KB future was copied on
/// every call).
#[inline(always)]
pub fn boxed_in_place<F>(make: impl FnOnce() -> F) -> std::pin::Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

/// One call as a surface received it: the authenticated subject, the tool as the
/// caller named it, the arguments and the options, unchecked.
#[derive(Debug, Clone)]
pub struct CallRequest {
    /// The door it came through (the metrics' label).
    pub surface: Surface,
    /// The authenticated caller.
    pub subject: Subject,
    /// The tool id as given.
    pub tool: String,
    /// The arguments (must be a JSON object).
    pub args: Value,
    /// Where the call came from (`llm` for MCP).
    pub origin: Origin,
    /// Call id, idempotency key, consent, trace context and skill binding.
    pub meta: CallMeta,
}

impl CallRequest {
    /// A request with no options, of origin `api`.
    pub fn new(surface: Surface, subject: Subject, tool: impl Into<String>, args: Value) -> Self {
        Self {
            surface,
            subject,
            tool: tool.into(),
            args,
            origin: Origin::Api,
            meta: CallMeta::default(),
        }
    }
}

struct Inner {
    invoker: Invoker,
    observer: Arc<dyn CallObserver>,
    span: Option<SpanMaker>,
    trust_dev_skills: bool,
}

/// The governed call as every surface serves it — HTTP, gRPC, MCP over HTTP and
/// stdio, the CLI's local mode: binds the skill (a claim only with its scope),
/// checks the call's options (one stable code for each bad one, whatever the
/// door), counts it in the metrics under its surface, runs it in its
/// `execute_tool` span through the one [`Invoker`], and answers listings with the
/// caller's governed tool list. A call refused here is evidenced like one the
/// pipeline refuses. Cheap to clone.
#[derive(Clone)]
pub struct Stack {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("trust_dev_skills", &self.inner.trust_dev_skills)
            .finish_non_exhaustive()
    }
}

/// Assembles a [`Stack`].
pub struct StackBuilder {
    inner: Inner,
}

impl StackBuilder {
    /// Reports every call to `observer` (metrics).
    pub fn observer(mut self, observer: Arc<dyn CallObserver>) -> Self {
        self.inner.observer = observer;
        self
    }

    /// Runs every invocation inside the span `make` returns for it.
    pub fn span(mut self, make: SpanMaker) -> Self {
        self.inner.span = Some(make);
        self
    }

    /// Honours claimed skill bindings without their scope (only for servers that
    /// trust development identities anyway).
    pub fn trust_dev_skills(mut self, trust: bool) -> Self {
        self.inner.trust_dev_skills = trust;
        self
    }

    /// The stack.
    pub fn build(self) -> Stack {
        Stack {
            inner: Arc::new(self.inner),
        }
    }
}

/// A request refused before the pipeline, with what its denial names.
struct Refusal {
    call_id: CallId,
    error: SoulError,
}

fn invalid(field: &str, message: impl Into<String>) -> SoulError {
    SoulError::new(ErrorCode::SchemaValidationFailed, message.into()).with_field("field", field)
}

impl Stack {
    /// A stack over `invoker` with no observer, no spans and no trusted claims.
    pub fn builder(invoker: Invoker) -> StackBuilder {
        StackBuilder {
            inner: Inner {
                invoker,
                observer: Arc::new(NoopObserver),
                span: None,
                trust_dev_skills: false,
            },
        }
    }

    /// The pipeline underneath.
    pub fn invoker(&self) -> &Invoker {
        &self.inner.invoker
    }

    /// The metrics observer.
    pub fn observer(&self) -> &Arc<dyn CallObserver> {
        &self.inner.observer
    }

    /// The skill `binding` makes a call for `subject` (see [`binding::authorize`]).
    pub fn bind(&self, subject: &Subject, binding: &Binding) -> Result<Option<String>, SoulError> {
        binding::authorize(binding, subject, self.inner.trust_dev_skills)
    }

    /// Checks everything a request carries and builds its [`ToolCall`].
    fn call(&self, req: CallRequest) -> Result<ToolCall, Refusal> {
        let meta = req.meta;
        let call_id = match meta.call_id.as_deref() {
            None => CallId::generate(),
            Some(id) => CallId::new(id).map_err(|e| Refusal {
                call_id: CallId::generate(),
                error: invalid("call_id", format!("the call id is malformed: {}", e.reason)),
            })?,
        };
        let refuse = |error: SoulError| Refusal {
            call_id: call_id.clone(),
            error,
        };
        // A tool id, or the plain name an export gave it (`a__b__c`).
        let tool = match ToolId::new(req.tool.as_str()) {
            Ok(t) => t,
            Err(e) => NameMap::plain_id(&req.tool).ok_or_else(|| {
                refuse(
                    SoulError::new(
                        ErrorCode::ToolNotFound,
                        format!("{:?} is not a tool id: {}", req.tool, e.reason),
                    )
                    .with_field("tool_id", req.tool.clone()),
                )
            })?,
        };
        if !req.args.is_object() {
            return Err(refuse(invalid(
                "arguments",
                "the arguments must be a JSON object",
            )));
        }
        let mut args = req.args;
        // A model's call: a `null` for a field its strict export made nullable but
        // the tool's own schema does not accept means "absent".
        if req.origin == Origin::Llm
            && let Ok(resolved) = self.inner.invoker.resolve(&req.subject.tenant, &tool)
        {
            openai::restore_optional(&resolved.tool.manifest.input_schema, &mut args);
        }
        let trace = match meta.traceparent.as_deref() {
            None => None,
            Some(tp) => Some(TraceContext::parse_traceparent(tp).map_err(|e| {
                refuse(invalid(
                    "traceparent",
                    format!("the traceparent is malformed: {}", e.reason),
                ))
            })?),
        };
        let calling_skill = self.bind(&req.subject, &meta.binding).map_err(refuse)?;
        let mut call = ToolCall::new(req.subject, tool, args)
            .with_call_id(call_id)
            .with_origin(req.origin);
        call.idempotency_key = meta.idempotency_key.filter(|k| !k.is_empty());
        call.consent = meta.consent.filter(|c| !c.is_empty());
        call.trace = trace;
        call.calling_skill = calling_skill;
        call.conversation = meta.conversation;
        call.surface = Some(req.surface);
        call.reporter = meta.reporter;
        Ok(call)
    }

    /// Answers a call the surface could not even read (malformed arguments), from
    /// `subject`, for `tool` as named: refused and evidenced like every refusal.
    pub async fn refuse(
        &self,
        surface: Surface,
        subject: &Subject,
        tool: &str,
        err: SoulError,
    ) -> CallResult {
        self.inner.observer.refused(surface, err.code());
        let call_id = CallId::generate();
        self.inner
            .invoker
            .refuse(subject, Origin::Api, &call_id, tool, err)
            .await
    }

    /// Runs one call through the governed path. Never fails: every refusal and
    /// failure is a result with a stable code, and is evidenced.
    ///
    /// The call's state (the pipeline's nested futures, ~11 KB) is made in its own
    /// heap block ([`boxed_in_place`]), so the surface's future holds a pointer:
    /// each surface's future is boxed by its framework (axum, tonic's trait, rmcp)
    /// and a box of a large future copies all of it, once per call.
    pub fn invoke(
        &self,
        req: CallRequest,
    ) -> std::pin::Pin<Box<impl Future<Output = CallResult> + Send + '_>> {
        boxed_in_place(|| self.invoke_here(req))
    }

    /// [`invoke`](Self::invoke)'s call, not yet boxed.
    async fn invoke_here(&self, req: CallRequest) -> CallResult {
        let inner = &self.inner;
        let surface = req.surface;
        let (subject, origin, raw_tool) = (req.subject.clone(), req.origin, req.tool.clone());
        let call = match self.call(req) {
            Ok(c) => c,
            Err(r) => {
                inner.observer.refused(surface, r.error.code());
                return inner
                    .invoker
                    .refuse(&subject, origin, &r.call_id, &raw_tool, r.error)
                    .await;
            }
        };
        let tool = call.tool.clone();
        let started = Instant::now();
        inner.observer.call_started(surface);
        let result = match &inner.span {
            Some(make) => {
                let span = make(&call);
                if span.is_disabled() {
                    inner.invoker.invoke(call).await
                } else {
                    let result = inner.invoker.invoke(call).instrument(span.clone()).await;
                    if let Some(code) = result.error_code {
                        span.record("error.type", code.as_str());
                        span.record("otel.status_code", "ERROR");
                    }
                    result
                }
            }
            None => inner.invoker.invoke(call).await,
        };
        inner
            .observer
            .call_finished(surface, &tool, &result, started.elapsed());
        if let Some(usage) = &result.usage {
            inner.observer.usage_charged(&subject.tenant, usage);
        }
        result
    }

    /// The dry run of a call: every check invoke makes before execution, nothing
    /// consumed, executed or recorded. A refusal carries the call id as its
    /// correlation id, and the same code invoke would answer.
    pub async fn preflight(&self, req: CallRequest) -> Result<PreflightReport, SoulError> {
        let inner = &self.inner;
        let surface = req.surface;
        let call = self.call(req).map_err(|r| {
            inner.observer.refused(surface, r.error.code());
            r.error.with_correlation_id(r.call_id.as_str())
        })?;
        match inner.invoker.preflight(&call).await {
            Ok(report) => {
                inner
                    .observer
                    .budget_seen(&call.subject.tenant, &call.tool, &report.budget);
                Ok(report)
            }
            Err(e) => {
                inner.observer.refused(surface, e.code());
                Err(e.with_correlation_id(call.call_id.as_str()))
            }
        }
    }

    /// Whether the dry run of a call is refused for want of consent alone (every
    /// check before it passed): what a surface that can ask the user for consent
    /// asks about. Nothing is consumed, recorded or counted.
    pub async fn wants_consent_only(&self, req: CallRequest) -> bool {
        let Ok(call) = self.call(req) else {
            return false;
        };
        matches!(
            self.inner.invoker.preflight(&call).await,
            Err(e) if e.code() == soulbase_errors::ErrorCode::ConsentRequired
        )
    }

    /// The tools `subject` acting through `binding` may be offered: its governed
    /// AvailableSpec ([`Invoker::available`]), in id order.
    pub async fn available(
        &self,
        surface: Surface,
        subject: &Subject,
        binding: &Binding,
    ) -> Result<Vec<AvailableSpec>, SoulError> {
        let inner = &self.inner;
        let listed = async {
            let skill = self.bind(subject, binding)?;
            inner.invoker.available(subject, skill.as_deref()).await
        };
        listed
            .await
            .inspect_err(|e| inner.observer.refused(surface, e.code()))
    }

    /// The governed listing with a filter ([`Invoker::list`]): the caller's
    /// enabled tools, or — with a state other than `enabled` — the operator's view
    /// of the tools it may administer.
    pub async fn list(
        &self,
        surface: Surface,
        subject: &Subject,
        binding: &Binding,
        filter: &ToolFilter,
    ) -> Result<Vec<ResolvedTool>, SoulError> {
        let inner = &self.inner;
        let listed = async {
            let skill = self.bind(subject, binding)?;
            inner.invoker.list(subject, skill.as_deref(), filter).await
        };
        listed
            .await
            .inspect_err(|e| inner.observer.refused(surface, e.code()))
    }
}
