//! The `auth` and `qos` roles over gRPC (`soulbase.auth.v1`, `soulbase.qos.v1`):
//! servers over the in-process seams, and clients implementing the same seams, so a
//! `tools` role can use authorization, consent and quotas served by another process.
//!
//! - [`AuthRoleService`] serves `Auth` (Authenticate, Authorize, VerifyConsent) over
//!   an [`Authenticator`], an [`Authorizer`] and a [`ConsentVerifier`];
//!   [`RemoteAuth`] is the client: [`Authorizer`] and [`ConsentVerifier`], plus
//!   [`RemoteAuth::authenticate`].
//! - [`QosRoleService`] serves `Quota` (Check, Reserve, Settle, Refund) over a
//!   [`QuotaGate`]; [`RemoteQuotaGate`] is the client [`QuotaGate`].
//!
//! Refusals travel as statuses with `ErrorDetail`, so a remote seam answers exactly
//! the code the local one would; a transport failure is an error too (the pipeline
//! fails closed). When an internal token is configured, every RPC must carry it in
//! [`INTERNAL_TOKEN_HEADER`] (compared in constant time), else `AUTH.UNAUTHENTICATED`.

use std::sync::Arc;
use std::time::Duration;

use soulbase_auth::{
    Authenticator, Authorizer, AuthzRequest, ConsentRequest, ConsentVerifier, Credential, Decision,
};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::BudgetUsage;
use soulbase_proto::soulbase::auth::v1 as auth_pb;
use soulbase_proto::soulbase::qos::v1 as qos_pb;
use soulbase_qos::{BudgetKey, BudgetSnapshot, QuotaGate, QuotaRequest, Reservation};
use soulbase_types::{ActorId, Subject, TenantId, ToolId, UnixMillis};
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use crate::convert;

/// The metadata key carrying the internal token of the role services.
pub const INTERNAL_TOKEN_HEADER: &str = "x-soulbase-internal-token";

/// The generated `soulbase.auth.v1` messages, client and server.
pub use soulbase_proto::soulbase::auth::v1 as auth_proto;
/// The generated `soulbase.evidence.v1` messages, client and server.
pub use soulbase_proto::soulbase::evidence::v1 as evidence_proto;
/// The generated `soulbase.qos.v1` messages, client and server.
pub use soulbase_proto::soulbase::qos::v1 as qos_proto;
/// The generated `soulbase.sandbox.v1` messages, client and server.
pub use soulbase_proto::soulbase::sandbox::v1 as sandbox_proto;

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The metadata key a role service sets on a refusal of the internal token, so its
/// client can tell "this process is misconfigured" from a refusal of the end user.
pub const TOKEN_REFUSED_HEADER: &str = "x-soulbase-internal-token-refused";

/// Checks the internal token of a request, when one is required.
pub(crate) fn check_token<T>(token: Option<&str>, request: &Request<T>) -> Result<(), Status> {
    let Some(want) = token else {
        return Ok(());
    };
    let got = request
        .metadata()
        .get(INTERNAL_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if constant_time_eq(got.as_bytes(), want.as_bytes()) {
        Ok(())
    } else {
        let mut status = SoulError::new(
            ErrorCode::AuthUnauthenticated,
            "this role service requires the internal token",
        )
        .to_status();
        status
            .metadata_mut()
            .insert(TOKEN_REFUSED_HEADER, MetadataValue::from_static("1"));
        Err(status)
    }
}

/// The error a role service's status carries, as its caller should see it.
///
/// A refusal of the internal token is the deployment's fault, not the end user's:
/// it becomes `PROVIDER.UNAVAILABLE` (retryable once the token is fixed) rather than
/// the `AUTH.UNAUTHENTICATED` the end user would otherwise be told.
pub(crate) fn role_error(status: &Status) -> SoulError {
    if status.metadata().get(TOKEN_REFUSED_HEADER).is_some() {
        return SoulError::new(
            ErrorCode::ProviderUnavailable,
            "a role service refused this process's internal token",
        )
        .with_note("server.internal_token_env or server.internal_token_file must give the same token on both sides".to_owned());
    }
    SoulError::from_status(status)
}

fn subject_to_proto(s: &Subject) -> auth_pb::Subject {
    auth_pb::Subject {
        tenant: s.tenant.to_string(),
        actor: s.actor.to_string(),
        roles: s.roles.iter().cloned().collect(),
        scopes: s.scopes.iter().cloned().collect(),
    }
}

fn subject_from_proto(s: Option<&auth_pb::Subject>) -> Result<Subject, SoulError> {
    let s = s.ok_or_else(|| convert::invalid("subject", "is required"))?;
    let tenant =
        TenantId::new(&s.tenant).map_err(|_| convert::invalid("subject.tenant", "is invalid"))?;
    let actor =
        ActorId::new(&s.actor).map_err(|_| convert::invalid("subject.actor", "is invalid"))?;
    let mut subject = Subject::new(tenant, actor);
    subject.roles = s.roles.iter().cloned().collect();
    subject.scopes = s.scopes.iter().cloned().collect();
    Ok(subject)
}

pub(crate) fn non_empty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

pub(crate) fn transport_error(e: impl std::fmt::Display) -> SoulError {
    SoulError::of(ErrorCode::ProviderUnavailable).with_note(format!("role endpoint: {e}"))
}

/// How a role connection notices a peer that is gone. No limit is put on how long
/// a request may take: a call to the sandbox role runs as long as its tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoleLiveness {
    /// Longest a TCP connect may take: an address that drops packets (a node gone,
    /// a wrong IP) fails requests after this instead of after the kernel's
    /// retries, minutes later.
    pub connect_timeout: Duration,
    /// An HTTP/2 ping is sent this long after the last frame, also on an idle
    /// connection...
    pub ping_every: Duration,
    /// ...and the connection, with every request on it, fails when the ping is
    /// not answered within this: a peer that stopped answering (a partition, a
    /// frozen process) is found out instead of holding requests forever.
    pub ping_timeout: Duration,
}

impl Default for RoleLiveness {
    /// A 5 s connect timeout; pings every 10 s, answered within 5 s.
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            ping_every: Duration::from_secs(10),
            ping_timeout: Duration::from_secs(5),
        }
    }
}

/// A lazily connecting channel to `endpoint` (`http://host:port`) with the default
/// [`RoleLiveness`]; `field` names the configuration field for errors.
pub fn role_channel(endpoint: &str, field: &str) -> Result<Channel, SoulError> {
    role_channel_with(endpoint, field, RoleLiveness::default())
}

/// [`role_channel`] with the given liveness settings.
pub fn role_channel_with(
    endpoint: &str,
    field: &str,
    liveness: RoleLiveness,
) -> Result<Channel, SoulError> {
    Ok(Endpoint::from_shared(endpoint.to_owned())
        .map_err(|e| {
            SoulError::new(ErrorCode::ConfigInvalid, format!("{field} is not a URI"))
                .with_field("field", field.to_owned())
                .with_note(e.to_string())
        })?
        // tonic's default, set here so it stays (Nagle would hold a request's
        // small frames for the server's delayed ACK, ~40 ms).
        .tcp_nodelay(true)
        .connect_timeout(liveness.connect_timeout)
        .http2_keep_alive_interval(liveness.ping_every)
        .keep_alive_timeout(liveness.ping_timeout)
        .keep_alive_while_idle(true)
        .connect_lazy())
}

pub(crate) fn with_token<T>(token: Option<&str>, body: T) -> Request<T> {
    let mut request = Request::new(body);
    if let Some(t) = token
        && let Ok(v) = MetadataValue::try_from(t)
    {
        request.metadata_mut().insert(INTERNAL_TOKEN_HEADER, v);
    }
    request
}

// ---- auth ------------------------------------------------------------------

/// Serves `soulbase.auth.v1.Auth` over in-process seams.
#[derive(Clone)]
pub struct AuthRoleService {
    authenticator: Arc<Authenticator>,
    authorizer: Arc<dyn Authorizer>,
    consent: Arc<dyn ConsentVerifier>,
    token: Option<Arc<str>>,
}

impl std::fmt::Debug for AuthRoleService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthRoleService").finish_non_exhaustive()
    }
}

impl AuthRoleService {
    /// A service over the given seams; `token`, when set, is required on every RPC.
    pub fn new(
        authenticator: Arc<Authenticator>,
        authorizer: Arc<dyn Authorizer>,
        consent: Arc<dyn ConsentVerifier>,
        token: Option<String>,
    ) -> Self {
        Self {
            authenticator,
            authorizer,
            consent,
            token: token.map(Arc::from),
        }
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> auth_pb::auth_server::AuthServer<Self> {
        auth_pb::auth_server::AuthServer::new(self)
    }
}

#[tonic::async_trait]
impl auth_pb::auth_server::Auth for AuthRoleService {
    async fn authenticate(
        &self,
        request: Request<auth_pb::AuthenticateRequest>,
    ) -> Result<Response<auth_pb::AuthenticateResponse>, Status> {
        check_token(self.token.as_deref(), &request)?;
        let r = request.get_ref();
        let credential = match (non_empty(&r.api_key), non_empty(&r.bearer_token)) {
            (Some(k), _) => Credential::ApiKey(k),
            (None, Some(t)) => Credential::Bearer(t),
            (None, None) => return Err(SoulError::of(ErrorCode::AuthUnauthenticated).to_status()),
        };
        let subject = self
            .authenticator
            .authenticate(credential)
            .map_err(|e| e.to_status())?;
        Ok(Response::new(auth_pb::AuthenticateResponse {
            subject: Some(subject_to_proto(&subject)),
        }))
    }

    async fn authorize(
        &self,
        request: Request<auth_pb::AuthorizeRequest>,
    ) -> Result<Response<auth_pb::AuthorizeResponse>, Status> {
        check_token(self.token.as_deref(), &request)?;
        let r = request.get_ref();
        let subject = subject_from_proto(r.subject.as_ref()).map_err(|e| e.to_status())?;
        let tool = convert::tool_id("tool_id", &r.tool_id).map_err(|e| e.to_status())?;
        let tool_tenant = match non_empty(&r.tool_tenant) {
            None => None,
            Some(t) => Some(
                TenantId::new(t)
                    .map_err(|_| convert::invalid("tool_tenant", "is invalid").to_status())?,
            ),
        };
        if r.action.is_empty() {
            return Err(convert::invalid("action", "is required").to_status());
        }
        let action: soulbase_auth::Action =
            r.action
                .parse()
                .map_err(|e: soulbase_auth::action::UnknownAction| {
                    convert::invalid("action", e.to_string()).to_status()
                })?;
        let decision = self
            .authorizer
            .authorize(AuthzRequest {
                subject: &subject,
                tool: &tool,
                tool_tenant: tool_tenant.as_ref(),
                action,
                tool_scopes: &r.tool_scopes,
            })
            .await
            .map_err(|e| e.to_status())?;
        let obligations_json = if decision.obligations.is_empty() {
            String::new()
        } else {
            serde_json::to_string(&decision.obligations)
                .map_err(|e| SoulError::internal(e).to_status())?
        };
        Ok(Response::new(auth_pb::AuthorizeResponse {
            policy_hash: decision.policy_hash,
            obligations_json,
        }))
    }

    async fn verify_consent(
        &self,
        request: Request<auth_pb::VerifyConsentRequest>,
    ) -> Result<Response<auth_pb::VerifyConsentResponse>, Status> {
        check_token(self.token.as_deref(), &request)?;
        let r = request.get_ref();
        let subject = subject_from_proto(r.subject.as_ref()).map_err(|e| e.to_status())?;
        let tool = convert::tool_id("tool_id", &r.tool_id).map_err(|e| e.to_status())?;
        self.consent
            .verify(ConsentRequest {
                subject: &subject,
                tool: &tool,
                scope: non_empty(&r.scope),
                args_digest: &r.args_digest,
                token: non_empty(&r.token),
                now: UnixMillis(r.now_ms),
                max_age_ms: r.max_age_ms,
            })
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(auth_pb::VerifyConsentResponse {}))
    }
}

/// The `auth` role reached over gRPC: an [`Authorizer`] and a
/// [`ConsentVerifier`] (and [`authenticate`](Self::authenticate)). Cheap to clone.
#[derive(Clone)]
pub struct RemoteAuth {
    client: auth_pb::auth_client::AuthClient<Channel>,
    token: Option<Arc<str>>,
}

impl std::fmt::Debug for RemoteAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteAuth").finish_non_exhaustive()
    }
}

impl RemoteAuth {
    /// A client over `channel`, sending `token` as the internal token when set.
    pub fn new(channel: Channel, token: Option<String>) -> Self {
        Self {
            client: auth_pb::auth_client::AuthClient::new(channel),
            token: token.map(Arc::from),
        }
    }

    /// The subject of a credential, as the auth role sees it.
    pub async fn authenticate(&self, credential: Credential<'_>) -> Result<Subject, SoulError> {
        self.check(credential).await
    }

    async fn check(&self, credential: Credential<'_>) -> Result<Subject, SoulError> {
        let body = match credential {
            Credential::ApiKey(k) => auth_pb::AuthenticateRequest {
                api_key: k.to_owned(),
                ..Default::default()
            },
            Credential::Bearer(t) => auth_pb::AuthenticateRequest {
                bearer_token: t.to_owned(),
                ..Default::default()
            },
        };
        let response = self
            .client
            .clone()
            .authenticate(with_token(self.token.as_deref(), body))
            .await
            .map_err(|s| role_error(&s))?;
        subject_from_proto(response.get_ref().subject.as_ref())
            .map_err(|e| transport_error(e.message()))
    }
}

#[tonic::async_trait]
impl soulbase_edge::CredentialCheck for RemoteAuth {
    async fn authenticate(&self, credential: Credential<'_>) -> Result<Subject, SoulError> {
        self.check(credential).await
    }
}

#[tonic::async_trait]
impl Authorizer for RemoteAuth {
    async fn authorize(&self, req: AuthzRequest<'_>) -> Result<Decision, SoulError> {
        let body = auth_pb::AuthorizeRequest {
            subject: Some(subject_to_proto(req.subject)),
            tool_id: req.tool.to_string(),
            tool_tenant: req.tool_tenant.map(ToString::to_string).unwrap_or_default(),
            action: req.action.as_str().to_owned(),
            tool_scopes: req.tool_scopes.to_vec(),
        };
        let response = self
            .client
            .clone()
            .authorize(with_token(self.token.as_deref(), body))
            .await
            .map_err(|s| role_error(&s))?
            .into_inner();
        // An obligation the auth role sent but this process cannot read must not
        // be dropped: the call is refused rather than answered unprotected.
        let obligations = if response.obligations_json.is_empty() {
            Vec::new()
        } else {
            serde_json::from_str(&response.obligations_json).map_err(|e| {
                SoulError::new(
                    ErrorCode::PolicyDenyTool,
                    "the auth role's obligations cannot be read; the call is refused",
                )
                .with_source(e)
            })?
        };
        Ok(Decision {
            policy_hash: response.policy_hash,
            obligations,
        })
    }
}

#[tonic::async_trait]
impl ConsentVerifier for RemoteAuth {
    async fn verify(&self, req: ConsentRequest<'_>) -> Result<(), SoulError> {
        let body = auth_pb::VerifyConsentRequest {
            subject: Some(subject_to_proto(req.subject)),
            tool_id: req.tool.to_string(),
            scope: req.scope.unwrap_or_default().to_owned(),
            args_digest: req.args_digest.to_owned(),
            token: req.token.unwrap_or_default().to_owned(),
            now_ms: req.now.0,
            max_age_ms: req.max_age_ms,
        };
        self.client
            .clone()
            .verify_consent(with_token(self.token.as_deref(), body))
            .await
            .map_err(|s| role_error(&s))?;
        Ok(())
    }
}

// ---- qos -------------------------------------------------------------------

fn snapshot_json(s: &BudgetSnapshot) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "{}".to_owned())
}

fn snapshot_from_json(s: &str) -> BudgetSnapshot {
    if s.is_empty() {
        return BudgetSnapshot::default();
    }
    serde_json::from_str(s).unwrap_or_default()
}

fn reservation_to_proto(r: &Reservation) -> qos_pb::Reservation {
    qos_pb::Reservation {
        id: r.id,
        keys: r.keys.clone(),
        budgets: r
            .budgets
            .iter()
            .map(|b| qos_pb::BudgetKey {
                key: b.key.clone(),
                window: b.window,
            })
            .collect(),
        budget_json: snapshot_json(&r.snapshot),
    }
}

fn reservation_from_proto(r: Option<qos_pb::Reservation>) -> Result<Reservation, SoulError> {
    let r = r.ok_or_else(|| convert::invalid("reservation", "is required"))?;
    Ok(Reservation {
        id: r.id,
        keys: r.keys,
        budgets: r
            .budgets
            .into_iter()
            .map(|b| BudgetKey {
                key: b.key,
                window: b.window,
            })
            .collect(),
        snapshot: snapshot_from_json(&r.budget_json),
    })
}

struct OwnedRequest {
    tenant: TenantId,
    actor: ActorId,
    tool: ToolId,
}

fn quota_request(r: &qos_pb::QuotaRequest) -> Result<OwnedRequest, SoulError> {
    Ok(OwnedRequest {
        tenant: TenantId::new(&r.tenant).map_err(|_| convert::invalid("tenant", "is invalid"))?,
        actor: ActorId::new(&r.actor).map_err(|_| convert::invalid("actor", "is invalid"))?,
        tool: convert::tool_id("tool_id", &r.tool_id)?,
    })
}

/// Serves `soulbase.qos.v1.Quota` over a [`QuotaGate`].
#[derive(Clone)]
pub struct QosRoleService {
    gate: Arc<dyn QuotaGate>,
    token: Option<Arc<str>>,
}

impl std::fmt::Debug for QosRoleService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QosRoleService").finish_non_exhaustive()
    }
}

impl QosRoleService {
    /// A service over `gate`; `token`, when set, is required on every RPC.
    pub fn new(gate: Arc<dyn QuotaGate>, token: Option<String>) -> Self {
        Self {
            gate,
            token: token.map(Arc::from),
        }
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> qos_pb::quota_server::QuotaServer<Self> {
        qos_pb::quota_server::QuotaServer::new(self)
    }
}

#[tonic::async_trait]
impl qos_pb::quota_server::Quota for QosRoleService {
    async fn check(
        &self,
        request: Request<qos_pb::QuotaRequest>,
    ) -> Result<Response<qos_pb::CheckResponse>, Status> {
        check_token(self.token.as_deref(), &request)?;
        let r = quota_request(request.get_ref()).map_err(|e| e.to_status())?;
        let snapshot = self
            .gate
            .check(QuotaRequest {
                tenant: &r.tenant,
                actor: &r.actor,
                tool: &r.tool,
            })
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(qos_pb::CheckResponse {
            budget_json: snapshot_json(&snapshot),
        }))
    }

    async fn reserve(
        &self,
        request: Request<qos_pb::QuotaRequest>,
    ) -> Result<Response<qos_pb::Reservation>, Status> {
        check_token(self.token.as_deref(), &request)?;
        let r = quota_request(request.get_ref()).map_err(|e| e.to_status())?;
        let reservation = self
            .gate
            .reserve(QuotaRequest {
                tenant: &r.tenant,
                actor: &r.actor,
                tool: &r.tool,
            })
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(reservation_to_proto(&reservation)))
    }

    async fn settle(
        &self,
        request: Request<qos_pb::SettleRequest>,
    ) -> Result<Response<qos_pb::SettleResponse>, Status> {
        check_token(self.token.as_deref(), &request)?;
        let r = request.into_inner();
        let reservation = reservation_from_proto(r.reservation).map_err(|e| e.to_status())?;
        let u = r.usage.unwrap_or_default();
        self.gate
            .settle(
                reservation,
                BudgetUsage {
                    calls: u.calls,
                    bytes_in: u.bytes_in,
                    bytes_out: u.bytes_out,
                    cpu_ms: u.cpu_ms,
                },
            )
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(qos_pb::SettleResponse {}))
    }

    async fn refund(
        &self,
        request: Request<qos_pb::RefundRequest>,
    ) -> Result<Response<qos_pb::RefundResponse>, Status> {
        check_token(self.token.as_deref(), &request)?;
        let reservation =
            reservation_from_proto(request.into_inner().reservation).map_err(|e| e.to_status())?;
        self.gate
            .refund(reservation)
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(qos_pb::RefundResponse {}))
    }
}

/// The `qos` role reached over gRPC, as a [`QuotaGate`]. Cheap to clone.
#[derive(Clone)]
pub struct RemoteQuotaGate {
    client: qos_pb::quota_client::QuotaClient<Channel>,
    token: Option<Arc<str>>,
}

impl std::fmt::Debug for RemoteQuotaGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteQuotaGate").finish_non_exhaustive()
    }
}

impl RemoteQuotaGate {
    /// A client over `channel`, sending `token` as the internal token when set.
    pub fn new(channel: Channel, token: Option<String>) -> Self {
        Self {
            client: qos_pb::quota_client::QuotaClient::new(channel),
            token: token.map(Arc::from),
        }
    }

    fn body(req: &QuotaRequest<'_>) -> qos_pb::QuotaRequest {
        qos_pb::QuotaRequest {
            tenant: req.tenant.to_string(),
            actor: req.actor.to_string(),
            tool_id: req.tool.to_string(),
        }
    }
}

#[tonic::async_trait]
impl QuotaGate for RemoteQuotaGate {
    async fn check(&self, req: QuotaRequest<'_>) -> Result<BudgetSnapshot, SoulError> {
        let response = self
            .client
            .clone()
            .check(with_token(self.token.as_deref(), Self::body(&req)))
            .await
            .map_err(|s| role_error(&s))?;
        Ok(snapshot_from_json(&response.get_ref().budget_json))
    }

    async fn reserve(&self, req: QuotaRequest<'_>) -> Result<Reservation, SoulError> {
        let response = self
            .client
            .clone()
            .reserve(with_token(self.token.as_deref(), Self::body(&req)))
            .await
            .map_err(|s| role_error(&s))?;
        reservation_from_proto(Some(response.into_inner()))
    }

    async fn settle(&self, reservation: Reservation, usage: BudgetUsage) -> Result<(), SoulError> {
        let body = qos_pb::SettleRequest {
            reservation: Some(reservation_to_proto(&reservation)),
            usage: Some(qos_pb::Usage {
                calls: usage.calls,
                bytes_in: usage.bytes_in,
                bytes_out: usage.bytes_out,
                cpu_ms: usage.cpu_ms,
            }),
        };
        self.client
            .clone()
            .settle(with_token(self.token.as_deref(), body))
            .await
            .map_err(|s| role_error(&s))?;
        Ok(())
    }

    async fn refund(&self, reservation: Reservation) -> Result<(), SoulError> {
        let body = qos_pb::RefundRequest {
            reservation: Some(reservation_to_proto(&reservation)),
        };
        self.client
            .clone()
            .refund(with_token(self.token.as_deref(), body))
            .await
            .map_err(|s| role_error(&s))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn tokens_compare_exactly() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        let mut ok = Request::new(());
        ok.metadata_mut()
            .insert(INTERNAL_TOKEN_HEADER, "s3cret".parse().unwrap());
        assert!(check_token(Some("s3cret"), &ok).is_ok());
        assert!(check_token(None, &Request::new(())).is_ok());
        let missing = check_token(Some("s3cret"), &Request::new(())).unwrap_err();
        assert_eq!(
            SoulError::from_status(&missing).code(),
            ErrorCode::AuthUnauthenticated
        );
        // The caller is told the deployment is at fault, not the end user.
        assert_eq!(role_error(&missing).code(), ErrorCode::ProviderUnavailable);
        let user = SoulError::of(ErrorCode::AuthUnauthenticated).to_status();
        assert_eq!(role_error(&user).code(), ErrorCode::AuthUnauthenticated);
    }

    /// A role endpoint that accepts connections and never answers (a frozen
    /// process): the request fails once a ping goes unanswered, as the deployment's
    /// fault, instead of hanging.
    #[tokio::test]
    async fn a_role_that_stops_answering_fails_requests_instead_of_hanging() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let frozen = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.push(socket);
            }
        });
        let liveness = RoleLiveness {
            connect_timeout: Duration::from_secs(5),
            ping_every: Duration::from_millis(100),
            ping_timeout: Duration::from_millis(200),
        };
        let channel = role_channel_with(&format!("http://{addr}"), "f", liveness).unwrap();
        let gate = RemoteQuotaGate::new(channel, None);
        let (tenant, actor) = (TenantId::new("t").unwrap(), ActorId::new("a").unwrap());
        let tool = ToolId::new("a.b.c").unwrap();
        let reserve = gate.reserve(QuotaRequest {
            tenant: &tenant,
            actor: &actor,
            tool: &tool,
        });
        let err = tokio::time::timeout(Duration::from_secs(30), reserve)
            .await
            .expect("the request failed instead of hanging")
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ProviderUnavailable, "{err:?}");
        frozen.abort();
    }

    #[test]
    fn bad_role_endpoints_name_their_field() {
        let err = role_channel("not a uri", "server.remote.qos").unwrap_err();
        assert_eq!(err.code(), ErrorCode::ConfigInvalid);
        assert!(format!("{err:?}").contains("server.remote.qos"), "{err:?}");
    }

    #[test]
    fn reservations_round_trip() {
        let r = Reservation {
            id: 7,
            keys: vec!["k1".into(), "k2".into()],
            budgets: vec![BudgetKey {
                key: "b".into(),
                window: 42,
            }],
            snapshot: BudgetSnapshot {
                limit: Some("5/min".into()),
                remaining: Some(4),
                budgets: Vec::new(),
            },
        };
        assert_eq!(
            reservation_from_proto(Some(reservation_to_proto(&r))).unwrap(),
            r
        );
        assert_eq!(
            reservation_from_proto(None).unwrap_err().code(),
            ErrorCode::SchemaValidationFailed
        );
    }

    #[test]
    fn bad_subjects_and_requests_are_named() {
        let e = subject_from_proto(None).unwrap_err();
        assert_eq!(e.code(), ErrorCode::SchemaValidationFailed);
        let e = subject_from_proto(Some(&auth_pb::Subject {
            tenant: "bad tenant!".into(),
            actor: "a".into(),
            ..Default::default()
        }))
        .unwrap_err();
        assert_eq!(
            e.public().fields.get("field").map(String::as_str),
            Some("subject.tenant")
        );
        let e = quota_request(&qos_pb::QuotaRequest {
            tenant: "t".into(),
            actor: "a".into(),
            tool_id: "not a tool".into(),
        })
        .err()
        .unwrap();
        assert_eq!(e.code(), ErrorCode::SchemaValidationFailed);
    }
}
