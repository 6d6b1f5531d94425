//! The consent desk every surface issues and revokes consent through: HTTP
//! (`POST /api/consent`), gRPC (`Consent.Issue`), the CLI through either, and MCP
//! elicitation. It turns a request as a client sends it ([`ConsentAsk`]: ids as
//! strings, arguments as JSON) into one for [`ConsentService`], after finding the
//! tool as the approver's tenant sees it (its owner for the policy question, its
//! manifest's `consent.ttl_ms` for the lifetime).
//!
//! It also answers the consent requests that calls refused `CONSENT.REQUIRED`
//! leave ([`ConsentRequests`]; the pipeline opens them): an approver lists its
//! tenant's, approves one — a token issued through the same path as
//! [`ConsentDesk::issue`], kept for the requester — or declines it, each decision
//! audited as the approver's; the requester reads its own request and, once
//! approved, its token.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;
use soulbase_auth::{
    Action, ApprovalScope, Authorizer, AuthzRequest, CONSENT_REQUEST_TTL_MS, CONSENT_RESOURCE,
    ConsentDecision, ConsentRequestRecord, ConsentRequestStatus, ConsentRequests, ConsentService,
    IssueConsent, IssuedConsent, MAX_REASON_CHARS, is_request_id,
};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::{
    AuditKind, AuditLog, AuditRecord, canonical_json, digest_bytes, state_hash,
};
use soulbase_tools::Registry;
use soulbase_types::{ActorId, CallId, Subject, TenantId, ToolId, UnixMillis};

use crate::CallObserver;

/// A request for consent, as clients send it.
#[derive(Debug, Clone, Default)]
pub struct ConsentAsk {
    /// The tool consented to (`group.pkg.name`).
    pub tool: String,
    /// The actor allowed to make the call; the approver when `None`.
    pub actor: Option<String>,
    /// When given, the consent covers only calls with exactly these arguments.
    pub args: Option<Value>,
    /// The lifetime asked for, in milliseconds; the server's default when `None`.
    pub ttl_ms: Option<u64>,
}

/// Issues and revokes consent for callers of any surface (see the module docs).
#[derive(Clone)]
pub struct ConsentDesk {
    registry: Registry,
    service: Arc<ConsentService>,
    authorizer: Arc<dyn Authorizer>,
    observer: Arc<dyn CallObserver>,
    requests: Arc<dyn ConsentRequests>,
    audit: Arc<dyn AuditLog>,
}

impl std::fmt::Debug for ConsentDesk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsentDesk").finish_non_exhaustive()
    }
}

fn invalid(field: &str, message: String) -> SoulError {
    SoulError::new(ErrorCode::SchemaValidationFailed, message).with_field("field", field)
}

impl ConsentDesk {
    /// A desk over the registry, the consent service and the authorizer; each
    /// token issued is counted by `observer`. Consent requests are read from and
    /// decided in `requests` (the store the pipeline opens them in), decisions
    /// audited in `audit`.
    pub fn new(
        registry: Registry,
        service: Arc<ConsentService>,
        authorizer: Arc<dyn Authorizer>,
        observer: Arc<dyn CallObserver>,
        requests: Arc<dyn ConsentRequests>,
        audit: Arc<dyn AuditLog>,
    ) -> Self {
        Self {
            registry,
            service,
            authorizer,
            observer,
            requests,
            audit,
        }
    }

    /// Issues a token for `approver`'s tenant (see [`ConsentService::issue`]).
    /// A tool the approver's tenant cannot see is `TOOL.NOT_FOUND`.
    pub async fn issue(
        &self,
        approver: &Subject,
        ask: ConsentAsk,
    ) -> Result<IssuedConsent, SoulError> {
        let tool = ToolId::new(ask.tool.as_str())
            .map_err(|e| invalid("tool", format!("not a tool id: {}", e.reason)))?;
        let actor = ask
            .actor
            .filter(|a| !a.is_empty())
            .map(|a| {
                ActorId::new(a.as_str())
                    .map_err(|e| invalid("actor", format!("not an actor id: {}", e.reason)))
            })
            .transpose()?;
        let args_digest = match ask.args {
            None => None,
            Some(v @ Value::Object(_)) => Some(digest_bytes(&canonical_json(&v))),
            Some(_) => {
                return Err(invalid(
                    "args",
                    "the arguments must be a JSON object".into(),
                ));
            }
        };
        self.issue_for(approver, tool, actor, args_digest, ask.ttl_ms)
            .await
    }

    /// Issues a token for `actor` (the approver when `None`) of the approver's
    /// tenant, bound to `args_digest` when given: the one path every issue takes.
    async fn issue_for(
        &self,
        approver: &Subject,
        tool: ToolId,
        actor: Option<ActorId>,
        args_digest: Option<String>,
        ttl_ms: Option<u64>,
    ) -> Result<IssuedConsent, SoulError> {
        let found = self.registry.get(&approver.tenant, &tool)?;
        let issued = self
            .service
            .issue(
                self.authorizer.as_ref(),
                approver,
                IssueConsent {
                    tool,
                    tool_tenant: found.owner.tenant_id().cloned(),
                    tool_ttl_ms: found.tool.manifest.consent.ttl_ms,
                    actor,
                    args_digest,
                    ttl_ms,
                },
                UnixMillis::now(),
            )
            .await?;
        self.observer.consent_issued();
        Ok(issued)
    }

    /// Revokes token `id` (see [`ConsentService::revoke`]).
    pub async fn revoke(&self, approver: &Subject, id: &str) -> Result<(), SoulError> {
        self.service
            .revoke(self.authorizer.as_ref(), approver, id, UnixMillis::now())
            .await
    }

    /// Whether `who` may act on its tenant's consent requests: action
    /// `consent_issue` on [`CONSENT_RESOURCE`], as revoking needs.
    async fn authorize_requests(&self, who: &Subject) -> Result<(), SoulError> {
        let resource = ToolId::new(CONSENT_RESOURCE).map_err(SoulError::internal)?;
        self.authorizer
            .authorize(AuthzRequest {
                subject: who,
                tool: &resource,
                tool_tenant: None,
                action: Action::ConsentIssue,
                tool_scopes: &[],
            })
            .await
            .map(drop)
    }

    /// Request `id` of `tenant` as of now; `CONSENT.REQUEST_NOT_FOUND` when there
    /// is none (another tenant's included).
    async fn find(&self, tenant: &TenantId, id: &str) -> Result<ConsentRequestRecord, SoulError> {
        if !is_request_id(id) {
            return Err(SoulError::new(
                ErrorCode::SchemaValidationFailed,
                "a consent request id is creq_ and 32 hex digits",
            )
            .with_field("field", "id"));
        }
        self.requests
            .get(tenant, id, fresh_since(UnixMillis::now()))
            .await?
            .ok_or_else(|| not_found(id))
    }

    /// The requests of `approver`'s tenant with `status` (every one when
    /// `None`), newest first, at most `limit`; needs `consent_issue` on
    /// [`CONSENT_RESOURCE`]. Tokens are never shown here.
    pub async fn requests(
        &self,
        approver: &Subject,
        status: Option<ConsentRequestStatus>,
        limit: u32,
    ) -> Result<Vec<ConsentRequestView>, SoulError> {
        self.authorize_requests(approver).await?;
        let found = self
            .requests
            .list(
                &approver.tenant,
                status,
                fresh_since(UnixMillis::now()),
                limit,
            )
            .await?;
        Ok(found
            .into_iter()
            .map(|r| ConsentRequestView::of(r, false))
            .collect())
    }

    /// Request `id` as `who` may see it: its requester (same tenant and actor)
    /// with the token once approved; an approver of the tenant (`consent_issue`
    /// on [`CONSENT_RESOURCE`]) without it. Anyone else is told
    /// `CONSENT.REQUEST_NOT_FOUND`, as for a request that does not exist.
    pub async fn request(&self, who: &Subject, id: &str) -> Result<ConsentRequestView, SoulError> {
        let found = self.find(&who.tenant, id).await?;
        if found.actor == who.actor {
            return Ok(ConsentRequestView::of(found, true));
        }
        match self.authorize_requests(who).await {
            Ok(()) => Ok(ConsentRequestView::of(found, false)),
            Err(e)
                if matches!(
                    e.code(),
                    ErrorCode::PolicyDenyTool | ErrorCode::AuthForbidden | ErrorCode::ToolNotFound
                ) =>
            {
                Err(not_found(id))
            }
            Err(e) => Err(e),
        }
    }

    /// Approves pending request `id` of `approver`'s tenant: issues a token for
    /// the requester through the same path as [`issue`](Self::issue) — so the
    /// approver needs `consent_issue` on the tool as well as on
    /// [`CONSENT_RESOURCE`] — bound to the refused call's arguments (`call`) or
    /// covering any (`tool`), for `ttl_ms` (capped as every token is). The token
    /// is kept for the requester; the decision is audited (`consent.approve`).
    /// A request no longer pending is `CONSENT.REQUEST_DECIDED`.
    pub async fn approve(
        &self,
        approver: &Subject,
        id: &str,
        scope: ApprovalScope,
        ttl_ms: Option<u64>,
    ) -> Result<ConsentRequestView, SoulError> {
        self.authorize_requests(approver).await?;
        let found = self.find(&approver.tenant, id).await?;
        pending(&found)?;
        let digest = match scope {
            ApprovalScope::Call => Some(found.args_digest.clone()),
            ApprovalScope::Tool => None,
        };
        let issued = self
            .issue_for(
                approver,
                found.tool.clone(),
                Some(found.actor.clone()),
                digest,
                ttl_ms,
            )
            .await?;
        let decision = ConsentDecision::Approve {
            scope,
            token: issued.token.clone(),
            token_id: issued.grant.id.clone(),
            expires_at: issued.grant.expires_at,
        };
        let decided = self.decide(approver, found, &decision).await;
        if decided.is_err()
            && let Some(token_id) = &issued.grant.id
            && let Err(e) = self.revoke(approver, token_id).await
        {
            // Another approver decided first: the token issued here is handed to
            // no one, and revoked so it never could be.
            tracing::warn!(error = ?e, token_id = %token_id, "could not revoke the token of a lost approval");
        }
        decided
    }

    /// Declines pending request `id` of `approver`'s tenant (needs
    /// `consent_issue` on [`CONSENT_RESOURCE`]), with an optional `reason` (at
    /// most [`MAX_REASON_CHARS`] characters) the requester reads; audited
    /// (`consent.decline`). A request no longer pending is
    /// `CONSENT.REQUEST_DECIDED`.
    pub async fn decline(
        &self,
        approver: &Subject,
        id: &str,
        reason: Option<String>,
    ) -> Result<ConsentRequestView, SoulError> {
        let reason = reason
            .map(|r| r.trim().to_owned())
            .filter(|r| !r.is_empty());
        if reason
            .as_ref()
            .is_some_and(|r| r.chars().count() > MAX_REASON_CHARS)
        {
            return Err(SoulError::new(
                ErrorCode::SchemaValidationFailed,
                format!("the reason is longer than {MAX_REASON_CHARS} characters"),
            )
            .with_field("field", "reason"));
        }
        self.authorize_requests(approver).await?;
        let found = self.find(&approver.tenant, id).await?;
        pending(&found)?;
        self.decide(approver, found, &ConsentDecision::Decline { reason })
            .await
    }

    /// Records `decision` on pending request `found`, then audits it; the
    /// request as decided, as `approver` sees it.
    async fn decide(
        &self,
        approver: &Subject,
        found: ConsentRequestRecord,
        decision: &ConsentDecision,
    ) -> Result<ConsentRequestView, SoulError> {
        let now = UnixMillis::now();
        let took = self
            .requests
            .decide(
                &found.tenant,
                &found.id,
                &approver.actor,
                now,
                decision,
                fresh_since(now),
            )
            .await?;
        if !took {
            // Decided by someone else meanwhile, or expired: say which.
            let now_found = self.find(&found.tenant, &found.id).await?;
            return Err(decided_already(&now_found));
        }
        let decided = found.clone().decided(&approver.actor, now, decision);
        let before = ConsentRequestView::of(found, false);
        let after = ConsentRequestView::of(decided.clone(), false);
        let (kind, detail) = match decision {
            ConsentDecision::Approve {
                scope,
                token_id,
                expires_at,
                ..
            } => (
                AuditKind::ConsentApprove,
                format!(
                    "approved {} for {} (scope {}, args {}), token {} expiring at {}",
                    decided.tool,
                    decided.actor,
                    scope.as_str(),
                    decided.args_digest,
                    token_id.as_deref().unwrap_or("without id"),
                    expires_at.0
                ),
            ),
            ConsentDecision::Decline { reason } => (
                AuditKind::ConsentDecline,
                format!(
                    "declined {} for {}{}",
                    decided.tool,
                    decided.actor,
                    reason
                        .as_deref()
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default()
                ),
            ),
        };
        let hash = |v: &ConsentRequestView| serde_json::to_value(v).ok().map(|v| state_hash(&v));
        let record = AuditRecord::new(decided.tenant.clone(), approver, kind, &decided.id)
            .hashes(hash(&before), hash(&after))
            .detail(detail);
        if let Err(e) = self.audit.append(&record).await {
            tracing::error!(
                error = %e,
                record = ?record,
                "audit record lost: the consent decision took effect but could not be audited"
            );
        }
        Ok(ConsentRequestView::of(
            decided,
            approver.actor == after.actor,
        ))
    }
}

/// Requests opened before this instant are expired at `now`.
fn fresh_since(now: UnixMillis) -> UnixMillis {
    UnixMillis(now.0.saturating_sub(CONSENT_REQUEST_TTL_MS))
}

fn not_found(id: &str) -> SoulError {
    SoulError::of(ErrorCode::ConsentRequestNotFound).with_field("id", id)
}

fn decided_already(r: &ConsentRequestRecord) -> SoulError {
    SoulError::new(
        ErrorCode::ConsentRequestDecided,
        format!("the consent request is {} already", r.status),
    )
    .with_field("id", r.id.as_str())
    .with_field("status", r.status.as_str())
}

/// `Ok` when `r` is still pending.
fn pending(r: &ConsentRequestRecord) -> Result<(), SoulError> {
    if r.status == ConsentRequestStatus::Pending {
        Ok(())
    } else {
        Err(decided_already(r))
    }
}

/// A consent request as the HTTP API answers it (`GET /api/consent/requests`,
/// `GET /api/consent/requests/{id}`, and the answers of approve and decline).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ConsentRequestView {
    /// The request id (`creq_…`), as the refusal's `fields.consent_request`
    /// named it.
    pub id: String,
    /// The requester's tenant.
    pub tenant: TenantId,
    /// The requester: the actor whose call was refused.
    pub actor: ActorId,
    /// The tool it called.
    pub tool: ToolId,
    /// The digest of the refused call's arguments (what a `call`-scoped
    /// approval binds the token to).
    pub args_digest: String,
    /// The refused call (its denial is in the evidence under this id).
    pub call_id: CallId,
    /// When the request was opened (Unix milliseconds).
    pub requested_at: UnixMillis,
    /// When it expires if not decided (Unix milliseconds).
    pub expires_at: UnixMillis,
    /// Where it stands.
    pub status: ConsentRequestStatus,
    /// Who decided it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<ActorId>,
    /// When (Unix milliseconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<UnixMillis>,
    /// What the approval covers: `call` (these arguments only) or `tool`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<ApprovalScope>,
    /// Why it was declined, when the approver said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The token issued on approval — shown to the requester only; send it as
    /// `x-soulbase-consent`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// That token's id (for revocation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_id: Option<String>,
    /// When that token expires (Unix milliseconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_expires_at: Option<UnixMillis>,
}

impl ConsentRequestView {
    /// The view of `r`, with its token only when `with_token`.
    pub fn of(r: ConsentRequestRecord, with_token: bool) -> Self {
        Self {
            expires_at: UnixMillis(r.requested_at.0.saturating_add(CONSENT_REQUEST_TTL_MS)),
            id: r.id,
            tenant: r.tenant,
            actor: r.actor,
            tool: r.tool,
            args_digest: r.args_digest,
            call_id: r.call_id,
            requested_at: r.requested_at,
            status: r.status,
            decided_by: r.decided_by,
            decided_at: r.decided_at,
            scope: r.scope,
            reason: r.reason,
            token: r.token.filter(|_| with_token),
            token_id: r.token_id,
            token_expires_at: r.token_expires_at,
        }
    }
}

/// The answer to an issue, as HTTP (`201` of `POST /api/consent`) and the CLI's
/// `--json` print it: the token and what it grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[schemars(rename = "IssuedConsent", deny_unknown_fields)]
pub struct IssuedView {
    /// The token to send as the `x-soulbase-consent` header.
    pub token: String,
    /// The token id, for revocation (`null` only for tokens minted before ids
    /// existed).
    pub id: Option<String>,
    /// The tool consented to (`null` for a grant by scope).
    pub tool: Option<ToolId>,
    /// The consenting tenant.
    pub tenant: TenantId,
    /// The actor allowed to make the call.
    pub actor: ActorId,
    /// The digest of the arguments it is bound to, if any.
    pub args_digest: Option<String>,
    /// When it was issued (Unix milliseconds).
    pub issued_at: Option<UnixMillis>,
    /// When it expires (Unix milliseconds).
    pub expires_at: UnixMillis,
}

impl From<&IssuedConsent> for IssuedView {
    fn from(issued: &IssuedConsent) -> Self {
        let g = &issued.grant;
        IssuedView {
            token: issued.token.clone(),
            id: g.id.clone(),
            tool: g.tool.clone(),
            tenant: g.tenant.clone(),
            actor: g.actor.clone(),
            args_digest: g.args_digest.clone(),
            issued_at: g.issued_at,
            expires_at: g.expires_at,
        }
    }
}

/// The JSON answer of an issue ([`IssuedView`]).
pub fn issued_json(issued: &IssuedConsent) -> Value {
    serde_json::to_value(IssuedView::from(issued)).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use soulbase_auth::{
        ConsentKeys, ConsentRevocations, Ed25519Consent, MemoryConsentRequests, MemoryRevocations,
        NewConsentRequest, StaticPolicy,
    };
    use soulbase_config::{PolicyConfig, PolicyEffect, PolicyRule};
    use soulbase_observe::{AuditFilter, MemoryAuditLog};
    use soulbase_tools::{ToolManifest, ToolOwner};

    use super::*;
    use crate::NoopObserver;

    const MANIFEST: &str = "id: demo.danger.delete\nversion: 1.0.0\ndescription: Deletes.\n\
        input_schema: {type: object}\noutput_schema: {type: object}\nside_effect: none\n\
        consent: {required: true}\n";

    fn who(actor: &str) -> Subject {
        Subject::new(TenantId::new("acme").unwrap(), ActorId::new(actor).unwrap())
    }

    /// A store where another approver always decides first: the decision
    /// tried here is kept (to see its token) and loses.
    #[derive(Default)]
    struct Racing {
        inner: MemoryConsentRequests,
        tried: Mutex<Option<ConsentDecision>>,
    }

    #[async_trait]
    impl ConsentRequests for Racing {
        async fn open(
            &self,
            new: &NewConsentRequest,
            fresh_since: UnixMillis,
            max_pending: u32,
        ) -> Result<Option<ConsentRequestRecord>, SoulError> {
            self.inner.open(new, fresh_since, max_pending).await
        }

        async fn get(
            &self,
            tenant: &TenantId,
            id: &str,
            fresh_since: UnixMillis,
        ) -> Result<Option<ConsentRequestRecord>, SoulError> {
            self.inner.get(tenant, id, fresh_since).await
        }

        async fn list(
            &self,
            tenant: &TenantId,
            status: Option<ConsentRequestStatus>,
            fresh_since: UnixMillis,
            limit: u32,
        ) -> Result<Vec<ConsentRequestRecord>, SoulError> {
            self.inner.list(tenant, status, fresh_since, limit).await
        }

        async fn decide(
            &self,
            tenant: &TenantId,
            id: &str,
            by: &ActorId,
            at: UnixMillis,
            decision: &ConsentDecision,
            fresh_since: UnixMillis,
        ) -> Result<bool, SoulError> {
            *self.tried.lock().unwrap() = Some(decision.clone());
            let first = ConsentDecision::Decline { reason: None };
            let other = ActorId::new("other-approver").unwrap();
            self.inner
                .decide(tenant, id, &other, at, &first, fresh_since)
                .await?;
            self.inner
                .decide(tenant, id, by, at, decision, fresh_since)
                .await
        }
    }

    struct Desk {
        desk: ConsentDesk,
        revocations: Arc<MemoryRevocations>,
        audit: Arc<MemoryAuditLog>,
        request: String,
    }

    /// A desk where `ann` approves for tenant `acme`, and one pending request of
    /// `bob`'s, in `requests`.
    async fn desk(requests: Arc<dyn ConsentRequests>) -> Desk {
        let registry = Registry::new();
        let tool = registry
            .register(ToolManifest::from_yaml_str(MANIFEST).unwrap())
            .unwrap();
        registry
            .enable(&ToolOwner::Global, &tool.manifest.id)
            .unwrap();
        let revocations = Arc::new(MemoryRevocations::default());
        let service = Arc::new(ConsentService::new(
            ConsentKeys::Ed25519(Box::new(Ed25519Consent::from_seed(&[7; 32]))),
            revocations.clone(),
            3_600_000,
            600_000,
        ));
        let policy = StaticPolicy::new(&PolicyConfig {
            rules: vec![PolicyRule {
                effect: PolicyEffect::Allow,
                tenant: "acme".into(),
                actors: vec!["ann".into()],
                tools: vec!["demo.*".into(), CONSENT_RESOURCE.into()],
                actions: vec!["consent_issue".into()],
                require_scopes: false,
                obligations: Vec::new(),
            }],
        });
        let audit = Arc::new(MemoryAuditLog::new());
        let opened = requests
            .open(
                &NewConsentRequest {
                    tenant: TenantId::new("acme").unwrap(),
                    actor: ActorId::new("bob").unwrap(),
                    tool: tool.manifest.id.clone(),
                    args_digest: "sha256:aa".into(),
                    call_id: CallId::generate(),
                    at: UnixMillis::now(),
                },
                UnixMillis(0),
                10,
            )
            .await
            .unwrap()
            .unwrap();
        Desk {
            desk: ConsentDesk::new(
                registry,
                service,
                Arc::new(policy),
                Arc::new(NoopObserver),
                requests,
                audit.clone(),
            ),
            revocations,
            audit,
            request: opened.id,
        }
    }

    #[tokio::test]
    async fn an_approval_keeps_the_token_for_the_requester_and_is_audited() {
        let d = desk(Arc::new(MemoryConsentRequests::default())).await;
        let ann = who("ann");
        let approved = d
            .desk
            .approve(&ann, &d.request, ApprovalScope::Tool, Some(60_000))
            .await
            .unwrap();
        assert_eq!(approved.status, ConsentRequestStatus::Approved);
        assert_eq!(approved.token, None, "the token is the requester's");
        let mine = d.desk.request(&who("bob"), &d.request).await.unwrap();
        assert!(mine.token.is_some(), "{mine:?}");
        assert_eq!(mine.scope, Some(ApprovalScope::Tool));
        let nosy = d.desk.request(&who("carol"), &d.request).await.unwrap_err();
        assert_eq!(nosy.code(), ErrorCode::ConsentRequestNotFound);
        let records = d.audit.list(&AuditFilter::newest(10)).await.unwrap();
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(records[0].kind, AuditKind::ConsentApprove);
        assert_eq!(records[0].actor.as_str(), "ann");
        assert_eq!(records[0].target, d.request);
        assert!(
            !records[0].detail.contains(mine.token.as_deref().unwrap()),
            "never the token"
        );
        let long = "x".repeat(MAX_REASON_CHARS + 1);
        let e = d
            .desk
            .decline(&ann, &d.request, Some(long))
            .await
            .unwrap_err();
        assert_eq!(e.field("field"), Some("reason"));
        let e = d.desk.decline(&ann, &d.request, None).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::ConsentRequestDecided);
        assert_eq!(e.field("status"), Some("approved"));
    }

    #[tokio::test]
    async fn an_approval_that_loses_a_race_revokes_its_token_and_says_who_won() {
        let racing = Arc::new(Racing::default());
        let d = desk(racing.clone()).await;
        let e = d
            .desk
            .approve(&who("ann"), &d.request, ApprovalScope::Call, None)
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::ConsentRequestDecided);
        assert_eq!(e.field("status"), Some("declined"));
        let Some(ConsentDecision::Approve {
            token_id: Some(token_id),
            ..
        }) = racing.tried.lock().unwrap().clone()
        else {
            panic!("no approval was tried");
        };
        let acme = TenantId::new("acme").unwrap();
        assert!(
            d.revocations.is_revoked(&token_id, &acme).await.unwrap(),
            "the token handed to no one is revoked"
        );
        assert!(
            d.audit
                .list(&AuditFilter::newest(10))
                .await
                .unwrap()
                .is_empty(),
            "a lost decision is not audited"
        );
    }
}
