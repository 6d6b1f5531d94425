//! The `evidence` role over gRPC (`soulbase.evidence.v1`): a server over an
//! [`EvidenceStore`], and a client implementing the same seams, so a `tools` role
//! can write and query durable evidence kept by another process.
//!
//! - [`EvidenceRoleService`] serves `Evidence` (Append, GetCall, ListCalls, Replay)
//!   over an [`EvidenceStore`].
//! - [`RemoteEvidence`] is the client: an [`EvidenceStore`] (retention excepted: it
//!   runs on the evidence role), an [`EvidenceSink`], and
//!   [`RemoteEvidence::replay`].
//!
//! Records travel as the JSON text of their envelope. Append is idempotent by
//! envelope id, so re-sending a batch stores each record once. A transport failure
//! reaching the role is `EVIDENCE.UNAVAILABLE` on the client (the pipeline fails
//! closed). When an internal token is configured, every RPC must carry it in
//! [`INTERNAL_TOKEN_HEADER`](crate::roles::INTERNAL_TOKEN_HEADER).

use std::sync::Arc;

use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::{
    CallEvidence, CallPage, CallSummary, DenialPage, DenialSummary, EncodedRecord, EndStatus,
    EvidenceQuery, EvidenceRecord, EvidenceSink, EvidenceStore, PageCursor, Replay, replay,
};
use soulbase_proto::soulbase::evidence::v1 as evidence_pb;
use soulbase_types::{ActorId, CallId, TenantId, UnixMillis};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::convert;
use crate::roles::{TOKEN_REFUSED_HEADER, check_token, non_empty, with_token};

/// The most records one Append may carry.
pub const MAX_APPEND_BATCH: usize = 10_000;

/// The largest message of the evidence role (an Append batch, a GetCall answer),
/// in bytes.
pub const MAX_APPEND_BYTES: usize = 64 << 20;

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, Status> {
    serde_json::to_string(value).map_err(|e| SoulError::internal(e).to_status())
}

fn parse_records(records_json: &[String]) -> Result<Vec<EvidenceRecord>, SoulError> {
    if records_json.len() > MAX_APPEND_BATCH {
        return Err(convert::invalid(
            "records_json",
            format!("records_json carries more than {MAX_APPEND_BATCH} records"),
        ));
    }
    records_json
        .iter()
        .enumerate()
        .map(|(i, text)| {
            serde_json::from_str(text).map_err(|e| {
                let field = format!("records_json[{i}]");
                convert::invalid(&field, format!("{field} is not an evidence record: {e}"))
            })
        })
        .collect()
}

fn parse_call(r: &evidence_pb::GetCallRequest) -> Result<(Option<TenantId>, CallId), SoulError> {
    if r.call_id.is_empty() {
        return Err(convert::invalid("call_id", "call_id is required"));
    }
    let call_id = CallId::new(&r.call_id)
        .map_err(|e| convert::invalid("call_id", format!("call_id is invalid: {}", e.reason)))?;
    let tenant = non_empty(&r.tenant)
        .map(TenantId::new)
        .transpose()
        .map_err(|e| convert::invalid("tenant", format!("tenant is invalid: {}", e.reason)))?;
    Ok((tenant, call_id))
}

fn parse_query(r: &evidence_pb::ListCallsRequest) -> Result<EvidenceQuery, SoulError> {
    let tenant = TenantId::new(&r.tenant)
        .map_err(|e| convert::invalid("tenant", format!("tenant is invalid: {}", e.reason)))?;
    let query = EvidenceQuery {
        tenant,
        from: (r.from_ms != 0).then_some(UnixMillis(r.from_ms)),
        to: (r.to_ms != 0).then_some(UnixMillis(r.to_ms)),
        tool: non_empty(&r.tool_id)
            .map(|t| convert::tool_id("tool_id", t))
            .transpose()?,
        status: non_empty(&r.status)
            .map(|s| convert::enum_name::<EndStatus>("status", s))
            .transpose()?,
        actor: non_empty(&r.actor)
            .map(|a| {
                ActorId::new(a).map_err(|e| {
                    convert::invalid("actor", format!("actor is invalid: {}", e.reason))
                })
            })
            .transpose()?,
        code: non_empty(&r.code)
            .map(|c| {
                ErrorCode::parse(c).ok_or_else(|| {
                    convert::invalid("code", format!("{c} is not a stable error code"))
                })
            })
            .transpose()?,
        limit: r.limit,
        after: non_empty(&r.after).map(PageCursor::parse).transpose()?,
    };
    query.validate()?;
    Ok(query)
}

/// Serves `soulbase.evidence.v1.Evidence` over an [`EvidenceStore`].
#[derive(Clone)]
pub struct EvidenceRoleService {
    store: Arc<dyn EvidenceStore>,
    token: Option<Arc<str>>,
}

impl std::fmt::Debug for EvidenceRoleService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvidenceRoleService")
            .finish_non_exhaustive()
    }
}

impl EvidenceRoleService {
    /// A service over `store`; `token`, when set, is required on every RPC.
    pub fn new(store: Arc<dyn EvidenceStore>, token: Option<String>) -> Self {
        Self {
            store,
            token: token.map(Arc::from),
        }
    }

    /// The tonic server for this service.
    /// Accepts Append requests up to [`MAX_APPEND_BYTES`] (a drained spool batch of
    /// thousands of records is larger than tonic's 4 MiB default).
    pub fn into_server(self) -> evidence_pb::evidence_server::EvidenceServer<Self> {
        evidence_pb::evidence_server::EvidenceServer::new(self)
            .max_decoding_message_size(MAX_APPEND_BYTES)
            .max_encoding_message_size(MAX_APPEND_BYTES)
    }

    async fn evidence(&self, r: &evidence_pb::GetCallRequest) -> Result<CallEvidence, SoulError> {
        let (tenant, call_id) = parse_call(r)?;
        self.store.call(tenant.as_ref(), &call_id).await
    }
}

#[tonic::async_trait]
impl evidence_pb::evidence_server::Evidence for EvidenceRoleService {
    async fn append(
        &self,
        request: Request<evidence_pb::AppendRequest>,
    ) -> Result<Response<evidence_pb::AppendResponse>, Status> {
        check_token(self.token.as_deref(), &request)?;
        let records = parse_records(&request.get_ref().records_json).map_err(|e| e.to_status())?;
        self.store
            .write_batch(&records)
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(evidence_pb::AppendResponse {
            accepted: u32::try_from(records.len()).unwrap_or(u32::MAX),
        }))
    }

    async fn get_call(
        &self,
        request: Request<evidence_pb::GetCallRequest>,
    ) -> Result<Response<evidence_pb::GetCallResponse>, Status> {
        check_token(self.token.as_deref(), &request)?;
        let evidence = self
            .evidence(request.get_ref())
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(evidence_pb::GetCallResponse {
            records_json: evidence
                .records
                .iter()
                .map(to_json)
                .collect::<Result<_, _>>()?,
        }))
    }

    async fn list_calls(
        &self,
        request: Request<evidence_pb::ListCallsRequest>,
    ) -> Result<Response<evidence_pb::ListCallsResponse>, Status> {
        check_token(self.token.as_deref(), &request)?;
        let query = parse_query(request.get_ref()).map_err(|e| e.to_status())?;
        let page = self.store.list(&query).await.map_err(|e| e.to_status())?;
        Ok(Response::new(evidence_pb::ListCallsResponse {
            calls_json: page.calls.iter().map(to_json).collect::<Result<_, _>>()?,
            next_page: page.next.map(|c| c.to_string()).unwrap_or_default(),
        }))
    }

    async fn list_denials(
        &self,
        request: Request<evidence_pb::ListCallsRequest>,
    ) -> Result<Response<evidence_pb::ListDenialsResponse>, Status> {
        check_token(self.token.as_deref(), &request)?;
        let query = parse_query(request.get_ref()).map_err(|e| e.to_status())?;
        let page = self
            .store
            .list_denials(&query)
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(evidence_pb::ListDenialsResponse {
            denials_json: page.denials.iter().map(to_json).collect::<Result<_, _>>()?,
            next_page: page.next.map(|c| c.to_string()).unwrap_or_default(),
        }))
    }

    async fn replay(
        &self,
        request: Request<evidence_pb::GetCallRequest>,
    ) -> Result<Response<evidence_pb::ReplayResponse>, Status> {
        check_token(self.token.as_deref(), &request)?;
        let evidence = self
            .evidence(request.get_ref())
            .await
            .map_err(|e| e.to_status())?;
        // An unknown call has empty evidence: `replay` refuses it naming `call_id`.
        let r = replay(&evidence).map_err(|e| e.to_status())?;
        Ok(Response::new(evidence_pb::ReplayResponse {
            replay_json: to_json(&r)?,
        }))
    }
}

/// The `ListCalls` / `ListDenials` request for `query`.
fn list_request(query: &EvidenceQuery) -> evidence_pb::ListCallsRequest {
    evidence_pb::ListCallsRequest {
        tenant: query.tenant.to_string(),
        from_ms: query.from.map_or(0, |m| m.0),
        to_ms: query.to.map_or(0, |m| m.0),
        tool_id: query
            .tool
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        status: query
            .status
            .map(|s| {
                serde_json::to_value(s)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            })
            .unwrap_or_default(),
        limit: query.limit,
        after: query
            .after
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        actor: query
            .actor
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        code: query.code_text().unwrap_or_default().to_owned(),
    }
}

/// An error reaching the evidence role, or a malformed answer from it.
fn unavailable(what: impl std::fmt::Display) -> SoulError {
    SoulError::of(ErrorCode::EvidenceUnavailable).with_note(format!("evidence role: {what}"))
}

/// The error a status carries; a transport failure (a status without
/// `ErrorDetail`: connection refused, deadline, …) is `EVIDENCE.UNAVAILABLE`, the
/// code the pipeline fails closed with when evidence cannot be written.
fn status_error(status: &Status) -> SoulError {
    if status.metadata().get(TOKEN_REFUSED_HEADER).is_some() {
        return unavailable(
            "refused this process's internal token (server.internal_token_env or server.internal_token_file must give the same token on both sides)",
        );
    }
    if status.details().is_empty() {
        return unavailable(format!("{:?}: {}", status.code(), status.message()));
    }
    SoulError::from_status(status)
}

fn from_json<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T, SoulError> {
    serde_json::from_str(text).map_err(|e| unavailable(format!("malformed {what}: {e}")))
}

/// The `evidence` role reached over gRPC: an [`EvidenceStore`] and an
/// [`EvidenceSink`] (and [`replay`](Self::replay)). Cheap to clone.
#[derive(Clone)]
pub struct RemoteEvidence {
    client: evidence_pb::evidence_client::EvidenceClient<Channel>,
    token: Option<Arc<str>>,
}

impl std::fmt::Debug for RemoteEvidence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteEvidence").finish_non_exhaustive()
    }
}

impl RemoteEvidence {
    /// A client over `channel`, sending `token` as the internal token when set.
    pub fn new(channel: Channel, token: Option<String>) -> Self {
        Self {
            client: evidence_pb::evidence_client::EvidenceClient::new(channel)
                .max_decoding_message_size(MAX_APPEND_BYTES)
                .max_encoding_message_size(MAX_APPEND_BYTES),
            token: token.map(Arc::from),
        }
    }

    fn call_request(tenant: Option<&TenantId>, call_id: &CallId) -> evidence_pb::GetCallRequest {
        evidence_pb::GetCallRequest {
            call_id: call_id.to_string(),
            tenant: tenant.map(ToString::to_string).unwrap_or_default(),
        }
    }

    /// What the evidence of one call proves, as the evidence role rebuilds it
    /// (`tenant`: only that tenant's records). An unknown call is
    /// `SCHEMA.VALIDATION_FAILED` naming `call_id`, as the local [`replay`] answers.
    pub async fn replay(
        &self,
        tenant: Option<&TenantId>,
        call_id: &CallId,
    ) -> Result<Replay, SoulError> {
        let response = self
            .client
            .clone()
            .replay(with_token(
                self.token.as_deref(),
                Self::call_request(tenant, call_id),
            ))
            .await
            .map_err(|s| status_error(&s))?;
        from_json("replay_json", &response.get_ref().replay_json)
    }
}

#[tonic::async_trait]
impl EvidenceStore for RemoteEvidence {
    async fn write_batch(&self, records: &[EvidenceRecord]) -> Result<(), SoulError> {
        self.write_encoded(&EncodedRecord::encode_all(records)?)
            .await
    }

    async fn write_encoded(&self, records: &[EncodedRecord]) -> Result<(), SoulError> {
        // Text not known to be a record is checked here, so what is not one is
        // refused (and quarantined by the drain) rather than retried against the
        // role, which answers such text as a retryable error.
        for r in records {
            r.check()?;
        }
        // Larger batches go in chunks; each chunk is atomic on the role, and a
        // re-sent chunk is harmless (idempotent by envelope id).
        for chunk in records.chunks(MAX_APPEND_BATCH) {
            let body = evidence_pb::AppendRequest {
                records_json: chunk.iter().map(|r| r.as_str().to_owned()).collect(),
            };
            self.client
                .clone()
                .append(with_token(self.token.as_deref(), body))
                .await
                .map_err(|s| status_error(&s))?;
        }
        Ok(())
    }

    async fn call(
        &self,
        tenant: Option<&TenantId>,
        call_id: &CallId,
    ) -> Result<CallEvidence, SoulError> {
        let response = self
            .client
            .clone()
            .get_call(with_token(
                self.token.as_deref(),
                Self::call_request(tenant, call_id),
            ))
            .await
            .map_err(|s| status_error(&s))?;
        let records = response
            .get_ref()
            .records_json
            .iter()
            .map(|t| from_json("records_json", t))
            .collect::<Result<_, _>>()?;
        Ok(CallEvidence { records })
    }

    async fn list(&self, query: &EvidenceQuery) -> Result<CallPage, SoulError> {
        let body = list_request(query);
        let response = self
            .client
            .clone()
            .list_calls(with_token(self.token.as_deref(), body))
            .await
            .map_err(|s| status_error(&s))?
            .into_inner();
        let calls = response
            .calls_json
            .iter()
            .map(|t| from_json::<CallSummary>("calls_json", t))
            .collect::<Result<_, _>>()?;
        let next = non_empty(&response.next_page)
            .map(PageCursor::parse)
            .transpose()
            .map_err(|e| unavailable(format!("malformed next_page: {}", e.message())))?;
        Ok(CallPage { calls, next })
    }

    async fn list_denials(&self, query: &EvidenceQuery) -> Result<DenialPage, SoulError> {
        let response = self
            .client
            .clone()
            .list_denials(with_token(self.token.as_deref(), list_request(query)))
            .await
            .map_err(|s| status_error(&s))?
            .into_inner();
        let denials = response
            .denials_json
            .iter()
            .map(|t| from_json::<DenialSummary>("denials_json", t))
            .collect::<Result<_, _>>()?;
        let next = non_empty(&response.next_page)
            .map(PageCursor::parse)
            .transpose()
            .map_err(|e| unavailable(format!("malformed next_page: {}", e.message())))?;
        Ok(DenialPage { denials, next })
    }

    /// Retention is not served over gRPC: it runs on the evidence role itself.
    async fn purge_before(&self, _cutoff: UnixMillis) -> Result<u64, SoulError> {
        Err(SoulError::of(ErrorCode::EvidenceUnavailable)
            .with_note("retention runs on the evidence role, not through a remote client"))
    }
}

#[tonic::async_trait]
impl EvidenceSink for RemoteEvidence {
    async fn record(&self, record: EvidenceRecord) -> Result<(), SoulError> {
        self.write_batch(std::slice::from_ref(&record)).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn list(status: &str, after: &str, limit: u32) -> evidence_pb::ListCallsRequest {
        evidence_pb::ListCallsRequest {
            tenant: "acme".into(),
            status: status.into(),
            after: after.into(),
            limit,
            ..Default::default()
        }
    }

    #[test]
    fn queries_name_their_bad_fields() {
        let q = parse_query(&list("timeout", "", 10)).unwrap();
        assert_eq!(q.status, Some(EndStatus::Timeout));
        assert_eq!(q.from, None);
        for (req, field) in [
            (list("weird", "", 10), "status"),
            (list("", "nope", 10), "after"),
            (list("", "", 0), "limit"),
            (
                evidence_pb::ListCallsRequest {
                    tenant: String::new(),
                    limit: 1,
                    ..Default::default()
                },
                "tenant",
            ),
        ] {
            let e = parse_query(&req).unwrap_err();
            assert_eq!(e.code(), ErrorCode::SchemaValidationFailed);
            assert_eq!(e.field("field"), Some(field));
        }
    }

    #[test]
    fn batches_are_capped_and_records_named() {
        let e = parse_records(&vec![String::new(); MAX_APPEND_BATCH + 1]).unwrap_err();
        assert_eq!(e.field("field"), Some("records_json"));
        let e = parse_records(&["{}".to_owned()]).unwrap_err();
        assert_eq!(e.field("field"), Some("records_json[0]"));
        let e = parse_call(&evidence_pb::GetCallRequest::default()).unwrap_err();
        assert_eq!(e.field("field"), Some("call_id"));
    }

    #[test]
    fn transport_failures_are_evidence_unavailable() {
        let e = status_error(&Status::unavailable("connection refused"));
        assert_eq!(e.code(), ErrorCode::EvidenceUnavailable);
        let refused = SoulError::of(ErrorCode::AuthUnauthenticated).to_status();
        assert_eq!(
            status_error(&refused).code(),
            ErrorCode::AuthUnauthenticated
        );
    }
}
