//! [`RemoteInvoker`]: the invoker over gRPC, a drop-in for the in-process one.

use soulbase_errors::{ErrorCode, SoulError};
use soulbase_tools::pipeline::{CallResult, CallStatus, PreflightReport, ToolCall, is_denial};
use soulbase_types::{CallId, EnvelopeId, Origin};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::{Channel, Endpoint};

use crate::convert;
use crate::proto;
use crate::proto::tool_invoker_client::ToolInvokerClient;
use crate::{TRAILER_CALL_ID, TRAILER_EVIDENCE_REF, TRAILER_OUTCOME, TRAILER_REPLAYED};
use soulbase_edge::subject::{API_KEY_HEADER, DEV_ACTOR_HEADER, DEV_TENANT_HEADER};

/// How the client authenticates.
#[derive(Clone)]
pub enum Credentials {
    /// Sends nothing (the server will answer `AUTH.UNAUTHENTICATED`).
    None,
    /// `x-api-key: sbk_<id>_<secret>`.
    ApiKey(String),
    /// `authorization: Bearer <jwt>`.
    Bearer(String),
    /// The insecure development headers, taken from each call's subject; accepted
    /// only by a server started with `server.dev_insecure: true`.
    DevHeaders,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a secret.
        f.write_str(match self {
            Credentials::None => "None",
            Credentials::ApiKey(_) => "ApiKey(<redacted>)",
            Credentials::Bearer(_) => "Bearer(<redacted>)",
            Credentials::DevHeaders => "DevHeaders",
        })
    }
}

/// Runs calls on a remote `soulbased` with the in-process [`Invoker`]'s signatures:
/// `invoke` never fails (every failure is a [`CallResult`] with a stable code,
/// transport failures as `PROVIDER.UNAVAILABLE`), `preflight` returns the same
/// [`PreflightReport`] or [`SoulError`].
///
/// The subject is established by the server from the credentials; with
/// [`Credentials::DevHeaders`] it is the call's own subject.
///
/// [`Invoker`]: soulbase_tools::pipeline::Invoker
#[derive(Debug, Clone)]
pub struct RemoteInvoker {
    client: ToolInvokerClient<Channel>,
    credentials: Credentials,
}

fn unavailable(e: impl std::fmt::Display) -> SoulError {
    SoulError::of(ErrorCode::ProviderUnavailable).with_note(e.to_string())
}

impl RemoteInvoker {
    /// Connects to `endpoint` (e.g. `http://127.0.0.1:50051`).
    pub async fn connect(endpoint: &str, credentials: Credentials) -> Result<Self, SoulError> {
        let channel = Endpoint::from_shared(endpoint.to_owned())
            .map_err(|e| {
                SoulError::new(
                    ErrorCode::ConfigInvalid,
                    "the invoker endpoint is not a URI",
                )
                .with_field("field", "endpoint")
                .with_note(e.to_string())
            })?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(unavailable)?;
        Ok(Self::new(channel, credentials))
    }

    /// A client over an existing channel (TLS, timeouts and balancing configured by
    /// the caller).
    pub fn new(channel: Channel, credentials: Credentials) -> Self {
        Self {
            client: ToolInvokerClient::new(channel),
            credentials,
        }
    }

    fn request(&self, call: &ToolCall) -> tonic::Request<proto::InvokeRequest> {
        let body = proto::InvokeRequest {
            tool_id: call.tool.to_string(),
            arguments_json: serde_json::to_string(&call.args).unwrap_or_default(),
            call_id: call.call_id.to_string(),
            idempotency_key: call.idempotency_key.clone().unwrap_or_default(),
            consent_token: call.consent.clone().unwrap_or_default(),
            traceparent: call.trace.map(|t| t.to_string()).unwrap_or_default(),
            origin: match call.origin {
                Origin::Llm => proto::Origin::Llm,
                Origin::Api => proto::Origin::Api,
                Origin::System => proto::Origin::System,
            } as i32,
            calling_skill: call.calling_skill.clone().unwrap_or_default(),
        };
        let mut req = tonic::Request::new(body);
        let md = req.metadata_mut();
        let mut put = |k: &'static str, v: &str| {
            if let Ok(v) = MetadataValue::try_from(v) {
                md.insert(k, v);
            }
        };
        match &self.credentials {
            Credentials::None => {}
            Credentials::ApiKey(k) => put(API_KEY_HEADER, k),
            Credentials::Bearer(t) => put("authorization", &format!("Bearer {t}")),
            Credentials::DevHeaders => {
                put(DEV_TENANT_HEADER, call.subject.tenant.as_str());
                put(DEV_ACTOR_HEADER, call.subject.actor.as_str());
            }
        }
        req
    }

    /// Runs `call` remotely. Never fails: errors are results with a stable code.
    pub async fn invoke(&self, call: ToolCall) -> CallResult {
        let mut client = self.client.clone();
        match client.invoke(self.request(&call)).await {
            Ok(resp) => {
                let r = resp.into_inner();
                let output = match serde_json::from_str(&r.output_json) {
                    Ok(v) => v,
                    Err(e) => {
                        let err = SoulError::of(ErrorCode::UnknownInternal)
                            .with_note(format!("the server's output is not JSON: {e}"));
                        return failed(call.call_id, &err, &MetadataMap::new());
                    }
                };
                CallResult {
                    call_id: CallId::new(r.call_id).unwrap_or(call.call_id),
                    status: CallStatus::Ok,
                    error_code: None,
                    error: None,
                    output: Some(output),
                    evidence_ref: EnvelopeId::new(r.evidence_ref).ok(),
                    replayed: r.replayed,
                    warnings: r.warnings,
                    // Charged (and counted) by the server that ran it.
                    usage: None,
                }
            }
            Err(status) => failed(
                call.call_id,
                &SoulError::from_status(&status),
                status.metadata(),
            ),
        }
    }

    /// The dry run, remotely.
    pub async fn preflight(&self, call: &ToolCall) -> Result<PreflightReport, SoulError> {
        let mut client = self.client.clone();
        let resp = client
            .preflight(self.request(call))
            .await
            .map_err(|s| SoulError::from_status(&s))?;
        convert::preflight_from_proto(resp.into_inner())
    }
}

fn failed(call_id: CallId, err: &SoulError, md: &MetadataMap) -> CallResult {
    let get = |k: &str| md.get(k).and_then(|v| v.to_str().ok());
    let status = match get(TRAILER_OUTCOME) {
        Some("denied") => CallStatus::Denied,
        Some(_) => CallStatus::Error,
        None if is_denial(err.code()) => CallStatus::Denied,
        None => CallStatus::Error,
    };
    let mut public = err.public();
    if public.correlation_id.is_none() {
        public.correlation_id = Some(call_id.to_string());
    }
    CallResult {
        call_id: get(TRAILER_CALL_ID)
            .and_then(|c| CallId::new(c).ok())
            .unwrap_or(call_id),
        status,
        error_code: Some(err.code()),
        error: Some(public),
        output: None,
        evidence_ref: get(TRAILER_EVIDENCE_REF).and_then(|r| EnvelopeId::new(r).ok()),
        replayed: get(TRAILER_REPLAYED) == Some("true"),
        warnings: Vec::new(),
        usage: None,
    }
}
