//! `soulbase.tools.v1.ToolInvoker` over an in-process [`Invoker`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use soulbase_errors::SoulError;
use soulbase_tools::pipeline::{CallResult, CallStatus, Invoker, ToolCall};
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};

use crate::auth::SubjectResolver;
use crate::convert::{self, CallMeta};
use crate::observe::{CallObserver, NoopObserver, Surface};
use crate::proto;
use crate::proto::tool_invoker_server::ToolInvoker;
use crate::{TRAILER_CALL_ID, TRAILER_EVIDENCE_REF, TRAILER_OUTCOME, TRAILER_REPLAYED};

/// What runs an invocation for a server: the [`Invoker`] itself, or a wrapper in
/// front of it (e.g. the skills gateway, which enforces cross-skill contracts for
/// `skills.*` tools and passes every other call straight to the invoker).
pub trait CallRunner: Send + Sync + 'static {
    /// Runs `call` through the governed pipeline (and whatever the runner adds).
    fn run(&self, call: ToolCall) -> Pin<Box<dyn Future<Output = CallResult> + Send + '_>>;
}

impl CallRunner for Invoker {
    fn run(&self, call: ToolCall) -> Pin<Box<dyn Future<Output = CallResult> + Send + '_>> {
        Box::pin(self.invoke(call))
    }
}

/// Serves preflight and invoke through the governed pipeline.
#[derive(Clone)]
pub struct InvokerService {
    invoker: Invoker,
    runner: Arc<dyn CallRunner>,
    auth: Arc<dyn SubjectResolver>,
    observer: Arc<dyn CallObserver>,
}

impl std::fmt::Debug for InvokerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InvokerService").finish_non_exhaustive()
    }
}

/// The gRPC status for a failed call: the error's status (code, safe message,
/// `ErrorDetail`) plus trailers naming the call, the outcome and its evidence.
pub fn result_status(result: &CallResult) -> Status {
    let err = result
        .error()
        .unwrap_or_else(|| SoulError::of(soulbase_errors::ErrorCode::UnknownInternal));
    let mut status = err.to_status();
    let md = status.metadata_mut();
    if let Ok(v) = MetadataValue::try_from(result.call_id.as_str()) {
        md.insert(TRAILER_CALL_ID, v);
    }
    let outcome = match result.status {
        CallStatus::Denied => "denied",
        _ => "error",
    };
    md.insert(TRAILER_OUTCOME, MetadataValue::from_static(outcome));
    if let Some(r) = &result.evidence_ref
        && let Ok(v) = MetadataValue::try_from(r.as_str())
    {
        md.insert(TRAILER_EVIDENCE_REF, v);
    }
    if result.replayed {
        md.insert(TRAILER_REPLAYED, MetadataValue::from_static("true"));
    }
    status
}

impl InvokerService {
    /// A service running calls on `invoker` for subjects resolved by `auth`.
    pub fn new(invoker: Invoker, auth: Arc<dyn SubjectResolver>) -> Self {
        Self {
            runner: Arc::new(invoker.clone()),
            invoker,
            auth,
            observer: Arc::new(NoopObserver),
        }
    }

    /// Runs invocations through `runner` instead of the invoker directly (preflight
    /// still asks the invoker: it consumes nothing and runs every check).
    pub fn with_runner(mut self, runner: Arc<dyn CallRunner>) -> Self {
        self.runner = runner;
        self
    }

    /// Reports every call to `observer` (metrics).
    pub fn with_observer(mut self, observer: Arc<dyn CallObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> proto::tool_invoker_server::ToolInvokerServer<Self> {
        proto::tool_invoker_server::ToolInvokerServer::new(self)
    }

    async fn call(&self, request: Request<proto::InvokeRequest>) -> Result<ToolCall, Status> {
        let headers = request.metadata().clone().into_headers();
        let subject = self.auth.resolve(&headers).await.map_err(|e| {
            self.observer.refused(Surface::Grpc, e.code());
            e.to_status()
        })?;
        let meta = CallMeta::from_headers(&headers);
        convert::call(subject, request.get_ref(), meta).map_err(|e| {
            self.observer.refused(Surface::Grpc, e.code());
            e.to_status()
        })
    }
}

#[tonic::async_trait]
impl ToolInvoker for InvokerService {
    async fn preflight(
        &self,
        request: Request<proto::InvokeRequest>,
    ) -> Result<Response<proto::PreflightResponse>, Status> {
        let call = self.call(request).await?;
        match self.invoker.preflight(&call).await {
            Ok(report) => {
                self.observer
                    .budget_seen(&call.subject.tenant, &call.tool, &report.budget);
                Ok(Response::new(convert::preflight_to_proto(&report)))
            }
            Err(e) => {
                self.observer.refused(Surface::Grpc, e.code());
                Err(e.with_correlation_id(call.call_id.as_str()).to_status())
            }
        }
    }

    async fn invoke(
        &self,
        request: Request<proto::InvokeRequest>,
    ) -> Result<Response<proto::InvokeResponse>, Status> {
        let call = self.call(request).await?;
        let tool = call.tool.clone();
        let started = Instant::now();
        self.observer.call_started(Surface::Grpc);
        let result = self.runner.run(call).await;
        self.observer
            .call_finished(Surface::Grpc, &tool, &result, started.elapsed());
        if !result.is_ok() {
            return Err(result_status(&result));
        }
        Ok(Response::new(proto::InvokeResponse {
            call_id: result.call_id.to_string(),
            output_json: result
                .output
                .as_ref()
                .map(|o| serde_json::to_string(o).unwrap_or_default())
                .unwrap_or_else(|| "null".to_owned()),
            evidence_ref: result
                .evidence_ref
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            replayed: result.replayed,
        }))
    }
}
