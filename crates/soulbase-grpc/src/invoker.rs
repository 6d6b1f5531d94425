//! `soulbase.tools.v1.ToolInvoker` over the one governed [`Stack`]: preflight and
//! invoke, and the model-facing surface ([`soulbase_edge::model`]): the caller's
//! tools for a model API, a model's tool calls routed.

use std::sync::Arc;

use soulbase_edge::{
    Binding, CallMeta, CallRequest, CallStyle, ExportFormat, Stack, SubjectResolver, Surface,
};
use soulbase_errors::SoulError;
use soulbase_tools::pipeline::{CallResult, CallStatus};
use soulbase_types::Subject;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};

use crate::convert;
use crate::proto;
use crate::proto::tool_invoker_server::ToolInvoker;
use crate::{TRAILER_CALL_ID, TRAILER_EVIDENCE_REF, TRAILER_OUTCOME, TRAILER_REPLAYED};

/// Serves preflight and invoke through the stack.
#[derive(Clone)]
pub struct InvokerService {
    stack: Stack,
    auth: Arc<dyn SubjectResolver>,
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
    /// A service running calls through `stack` for subjects resolved by `auth`.
    pub fn new(stack: Stack, auth: Arc<dyn SubjectResolver>) -> Self {
        Self { stack, auth }
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> proto::tool_invoker_server::ToolInvokerServer<Self> {
        proto::tool_invoker_server::ToolInvokerServer::new(self)
    }

    /// The request's subject, and its call (or why it is malformed).
    async fn request(
        &self,
        request: &Request<proto::InvokeRequest>,
    ) -> Result<(Subject, Result<CallRequest, SoulError>), Status> {
        let headers = request.metadata().clone().into_headers();
        let subject = self.auth.resolve(&headers).await.map_err(|e| {
            self.stack.observer().refused(Surface::Grpc, e.code());
            e.to_status()
        })?;
        let meta = CallMeta::from_headers(&headers);
        let call = convert::call_request(subject.clone(), request.get_ref(), meta);
        Ok((subject, call))
    }

    /// The request's subject and skill binding.
    async fn caller<T>(&self, request: &Request<T>) -> Result<(Subject, Binding), Status> {
        let headers = request.metadata().clone().into_headers();
        let subject = self.auth.resolve(&headers).await.map_err(|e| {
            self.stack.observer().refused(Surface::Grpc, e.code());
            e.to_status()
        })?;
        Ok((subject, CallMeta::from_headers(&headers).binding))
    }
}

#[tonic::async_trait]
impl ToolInvoker for InvokerService {
    async fn preflight(
        &self,
        request: Request<proto::InvokeRequest>,
    ) -> Result<Response<proto::PreflightResponse>, Status> {
        let req = match self.request(&request).await? {
            (_, Ok(req)) => req,
            (_, Err(e)) => {
                self.stack.observer().refused(Surface::Grpc, e.code());
                return Err(e.to_status());
            }
        };
        match self.stack.preflight(req).await {
            Ok(report) => Ok(Response::new(convert::preflight_to_proto(&report))),
            Err(e) => Err(e.to_status()),
        }
    }

    async fn invoke(
        &self,
        request: Request<proto::InvokeRequest>,
    ) -> Result<Response<proto::InvokeResponse>, Status> {
        let result = match self.request(&request).await? {
            (_, Ok(req)) => self.stack.invoke(req).await,
            (subject, Err(e)) => {
                let tool = &request.get_ref().tool_id;
                self.stack.refuse(Surface::Grpc, &subject, tool, e).await
            }
        };
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
            warnings: result.warnings,
        }))
    }

    async fn export_tools(
        &self,
        request: Request<proto::ExportToolsRequest>,
    ) -> Result<Response<proto::ExportToolsResponse>, Status> {
        let (subject, binding) = self.caller(&request).await?;
        let format = match request.get_ref().format() {
            proto::ExportFormat::Unspecified | proto::ExportFormat::Openai => ExportFormat::OpenAi,
            proto::ExportFormat::OpenaiStrict => ExportFormat::OpenAiStrict,
            proto::ExportFormat::Anthropic => ExportFormat::Anthropic,
            proto::ExportFormat::Mcp => ExportFormat::Mcp,
        };
        let model = Some(request.get_ref().model.as_str()).filter(|m| !m.is_empty());
        let exported = self
            .stack
            .export_tools(Surface::Grpc, &subject, &binding, format, model)
            .await
            .map_err(|e| e.to_status())?;
        let warnings = serde_json::to_string(&exported.warnings)
            .map_err(|e| SoulError::internal(e).to_status())?;
        Ok(Response::new(proto::ExportToolsResponse {
            format: format.as_str().to_owned(),
            tools_json: serde_json::Value::Array(exported.tools).to_string(),
            names: exported
                .names
                .iter()
                .map(|(id, name)| (name.to_owned(), id.to_string()))
                .collect(),
            warnings_json: warnings,
        }))
    }

    async fn route_tool_calls(
        &self,
        request: Request<proto::RouteToolCallsRequest>,
    ) -> Result<Response<proto::RouteToolCallsResponse>, Status> {
        let (subject, binding) = self.caller(&request).await?;
        let req = request.get_ref();
        let style = match req.style() {
            proto::CallStyle::Unspecified | proto::CallStyle::Openai => CallStyle::OpenAi,
            proto::CallStyle::Anthropic => CallStyle::Anthropic,
        };
        let calls = match convert::arguments("calls_json", &req.calls_json) {
            Ok(serde_json::Value::Array(calls)) => calls,
            Ok(_) => {
                let e = convert::invalid("calls_json", "calls_json must be a JSON array");
                return Err(e.to_status());
            }
            Err(e) => return Err(e.to_status()),
        };
        let answers = self
            .stack
            .route_tool_calls(Surface::Grpc, &subject, &binding, style, &calls)
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(proto::RouteToolCallsResponse {
            answers_json: serde_json::Value::Array(answers).to_string(),
        }))
    }
}
