//! Consent requests: what a call refused `CONSENT.REQUIRED` leaves behind for an
//! approver to act on.
//!
//! The pipeline opens one when it refuses a call for want of consent (one
//! pending request per tenant, actor, tool and arguments digest: a retry reuses
//! it). An approver of the tenant lists them, approves one — a token is issued
//! for the requester through [`ConsentService`](crate::ConsentService) and kept
//! with the request — or declines it; the requester follows its request by id
//! and, once approved, takes the token. A pending request not decided within
//! [`CONSENT_REQUEST_TTL_MS`] expires.
//!
//! The server keeps requests with its evidence database (soulbase-store's
//! `SqlConsentRequests`), so every replica sees the same ones;
//! [`MemoryConsentRequests`] is for a process without one.

use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{ActorId, CallId, TenantId, ToolId, UnixMillis};

/// How long a request waits for an approver: 24 hours. An older pending request
/// is `expired`: not listed as pending, not decidable; the next refusal of the
/// same call opens a new one.
pub const CONSENT_REQUEST_TTL_MS: i64 = 24 * 60 * 60 * 1000;

/// The most pending requests one actor of a tenant has open at once: a caller
/// refused for many different arguments cannot flood its approvers' queue (its
/// further refusals name no request until some are decided or expire).
pub const MAX_PENDING_PER_ACTOR: u32 = 100;

/// The longest reason a decline keeps, in characters.
pub const MAX_REASON_CHARS: usize = 500;

/// Where a request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ConsentRequestStatus {
    /// Waiting for an approver.
    Pending,
    /// Approved: a token was issued for the requester.
    Approved,
    /// Declined by an approver.
    Declined,
    /// Not decided within [`CONSENT_REQUEST_TTL_MS`].
    Expired,
}

impl ConsentRequestStatus {
    /// Every status.
    pub const ALL: [ConsentRequestStatus; 4] = [
        ConsentRequestStatus::Pending,
        ConsentRequestStatus::Approved,
        ConsentRequestStatus::Declined,
        ConsentRequestStatus::Expired,
    ];

    /// The status's stable name (as stored and on the wire).
    pub fn as_str(self) -> &'static str {
        match self {
            ConsentRequestStatus::Pending => "pending",
            ConsentRequestStatus::Approved => "approved",
            ConsentRequestStatus::Declined => "declined",
            ConsentRequestStatus::Expired => "expired",
        }
    }
}

impl fmt::Display for ConsentRequestStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ConsentRequestStatus {
    type Err = SoulError;

    /// Parses a stable name; another is `SCHEMA.VALIDATION_FAILED` naming the
    /// field `status`.
    fn from_str(s: &str) -> Result<Self, SoulError> {
        ConsentRequestStatus::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| {
                SoulError::new(
                    ErrorCode::SchemaValidationFailed,
                    "status must be one of pending, approved, declined, expired",
                )
                .with_field("field", "status")
            })
    }
}

/// What an approval covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalScope {
    /// Only calls with exactly the refused call's arguments (the token is bound
    /// to their digest).
    Call,
    /// Any call of the tool by the requester, whatever its arguments.
    Tool,
}

impl ApprovalScope {
    /// The scope's stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalScope::Call => "call",
            ApprovalScope::Tool => "tool",
        }
    }
}

impl FromStr for ApprovalScope {
    type Err = SoulError;

    /// `call` or `tool`; another is `SCHEMA.VALIDATION_FAILED` naming `scope`.
    fn from_str(s: &str) -> Result<Self, SoulError> {
        match s {
            "call" => Ok(ApprovalScope::Call),
            "tool" => Ok(ApprovalScope::Tool),
            _ => Err(SoulError::new(
                ErrorCode::SchemaValidationFailed,
                "scope must be call or tool",
            )
            .with_field("field", "scope")),
        }
    }
}

/// A refused call, as a request is opened for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewConsentRequest {
    /// The caller's tenant.
    pub tenant: TenantId,
    /// The caller.
    pub actor: ActorId,
    /// The tool it called.
    pub tool: ToolId,
    /// The digest of the call's arguments (as its evidence records it).
    pub args_digest: String,
    /// The refused call (its denial is evidenced under this id).
    pub call_id: CallId,
    /// When it was refused.
    pub at: UnixMillis,
}

/// A request as kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsentRequestRecord {
    /// `creq_` and 32 hex digits.
    pub id: String,
    /// The requester's tenant.
    pub tenant: TenantId,
    /// The requester.
    pub actor: ActorId,
    /// The tool asked for.
    pub tool: ToolId,
    /// The digest of the refused call's arguments.
    pub args_digest: String,
    /// The call whose refusal opened the request.
    pub call_id: CallId,
    /// When it was opened.
    pub requested_at: UnixMillis,
    /// Where it stands (a pending one past its time reads `expired`).
    pub status: ConsentRequestStatus,
    /// Who decided it.
    pub decided_by: Option<ActorId>,
    /// When.
    pub decided_at: Option<UnixMillis>,
    /// What an approval covers.
    pub scope: Option<ApprovalScope>,
    /// Why it was declined, when the approver said.
    pub reason: Option<String>,
    /// The token issued on approval, kept for the requester.
    pub token: Option<String>,
    /// That token's id (for revocation).
    pub token_id: Option<String>,
    /// When that token expires.
    pub token_expires_at: Option<UnixMillis>,
}

impl ConsentRequestRecord {
    /// A pending request for `new`, with a fresh id.
    pub fn opened(new: &NewConsentRequest) -> Self {
        Self {
            id: new_request_id(),
            tenant: new.tenant.clone(),
            actor: new.actor.clone(),
            tool: new.tool.clone(),
            args_digest: new.args_digest.clone(),
            call_id: new.call_id.clone(),
            requested_at: new.at,
            status: ConsentRequestStatus::Pending,
            decided_by: None,
            decided_at: None,
            scope: None,
            reason: None,
            token: None,
            token_id: None,
            token_expires_at: None,
        }
    }

    /// The record with `decision` by `by` at `at` applied.
    pub fn decided(mut self, by: &ActorId, at: UnixMillis, decision: &ConsentDecision) -> Self {
        self.decided_by = Some(by.clone());
        self.decided_at = Some(at);
        match decision {
            ConsentDecision::Approve {
                scope,
                token,
                token_id,
                expires_at,
            } => {
                self.status = ConsentRequestStatus::Approved;
                self.scope = Some(*scope);
                self.token = Some(token.clone());
                self.token_id = token_id.clone();
                self.token_expires_at = Some(*expires_at);
            }
            ConsentDecision::Decline { reason } => {
                self.status = ConsentRequestStatus::Declined;
                self.reason = reason.clone();
            }
        }
        self
    }

    /// The record as of `fresh_since`: pending and opened before it reads
    /// `expired`.
    pub fn as_of(mut self, fresh_since: UnixMillis) -> Self {
        if self.status == ConsentRequestStatus::Pending && self.requested_at < fresh_since {
            self.status = ConsentRequestStatus::Expired;
        }
        self
    }
}

/// How an approver decided a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsentDecision {
    /// Approved: this token was issued for the requester.
    Approve {
        /// What it covers.
        scope: ApprovalScope,
        /// The token.
        token: String,
        /// Its id.
        token_id: Option<String>,
        /// When it expires.
        expires_at: UnixMillis,
    },
    /// Declined.
    Decline {
        /// Why, when said.
        reason: Option<String>,
    },
}

/// A fresh request id: `creq_` and 128 random bits in hex.
pub fn new_request_id() -> String {
    format!("creq_{}", uuid::Uuid::new_v4().simple())
}

/// Whether `id` has the shape of a request id, `creq_` and 32 lowercase hex
/// digits (checked before any lookup).
pub fn is_request_id(id: &str) -> bool {
    id.strip_prefix("creq_").is_some_and(|hex| {
        hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Where consent requests are kept (see the module docs).
#[async_trait]
pub trait ConsentRequests: Send + Sync + 'static {
    /// The pending request for `new`'s tenant, actor, tool and arguments digest
    /// opened at or after `fresh_since`; else a new one, opened at `new.at` —
    /// unless the actor already has `max_pending` such pending requests, when
    /// `None` (nothing is opened).
    async fn open(
        &self,
        new: &NewConsentRequest,
        fresh_since: UnixMillis,
        max_pending: u32,
    ) -> Result<Option<ConsentRequestRecord>, SoulError>;

    /// Request `id` of `tenant` (another tenant's is `None`), as of
    /// `fresh_since` ([`ConsentRequestRecord::as_of`]).
    async fn get(
        &self,
        tenant: &TenantId,
        id: &str,
        fresh_since: UnixMillis,
    ) -> Result<Option<ConsentRequestRecord>, SoulError>;

    /// `tenant`'s requests with `status` as of `fresh_since` (every one when
    /// `None`), newest first, at most `limit`.
    async fn list(
        &self,
        tenant: &TenantId,
        status: Option<ConsentRequestStatus>,
        fresh_since: UnixMillis,
        limit: u32,
    ) -> Result<Vec<ConsentRequestRecord>, SoulError>;

    /// Records `decision` by `by` at `at` on request `id` of `tenant` if it is
    /// still pending and was opened at or after `fresh_since`. Whether it was
    /// (of two approvers deciding at once, one is told `false`).
    async fn decide(
        &self,
        tenant: &TenantId,
        id: &str,
        by: &ActorId,
        at: UnixMillis,
        decision: &ConsentDecision,
        fresh_since: UnixMillis,
    ) -> Result<bool, SoulError>;
}

/// Requests held in memory (lost on restart, not shared between replicas).
#[derive(Debug, Default)]
pub struct MemoryConsentRequests(Mutex<Vec<ConsentRequestRecord>>);

impl MemoryConsentRequests {
    fn rows(&self) -> std::sync::MutexGuard<'_, Vec<ConsentRequestRecord>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl ConsentRequests for MemoryConsentRequests {
    async fn open(
        &self,
        new: &NewConsentRequest,
        fresh_since: UnixMillis,
        max_pending: u32,
    ) -> Result<Option<ConsentRequestRecord>, SoulError> {
        let mut rows = self.rows();
        let fresh_pending = |r: &&ConsentRequestRecord| {
            r.status == ConsentRequestStatus::Pending
                && r.requested_at >= fresh_since
                && r.tenant == new.tenant
                && r.actor == new.actor
        };
        if let Some(same) = rows
            .iter()
            .filter(fresh_pending)
            .find(|r| r.tool == new.tool && r.args_digest == new.args_digest)
        {
            return Ok(Some(same.clone()));
        }
        if rows.iter().filter(fresh_pending).count() >= max_pending as usize {
            return Ok(None);
        }
        let record = ConsentRequestRecord::opened(new);
        rows.push(record.clone());
        Ok(Some(record))
    }

    async fn get(
        &self,
        tenant: &TenantId,
        id: &str,
        fresh_since: UnixMillis,
    ) -> Result<Option<ConsentRequestRecord>, SoulError> {
        Ok(self
            .rows()
            .iter()
            .find(|r| r.id == id && r.tenant == *tenant)
            .map(|r| r.clone().as_of(fresh_since)))
    }

    async fn list(
        &self,
        tenant: &TenantId,
        status: Option<ConsentRequestStatus>,
        fresh_since: UnixMillis,
        limit: u32,
    ) -> Result<Vec<ConsentRequestRecord>, SoulError> {
        let mut found: Vec<ConsentRequestRecord> = self
            .rows()
            .iter()
            .filter(|r| r.tenant == *tenant)
            .map(|r| r.clone().as_of(fresh_since))
            .filter(|r| status.is_none_or(|s| r.status == s))
            .collect();
        found.sort_by(|a, b| b.requested_at.cmp(&a.requested_at).then(b.id.cmp(&a.id)));
        found.truncate(limit as usize);
        Ok(found)
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
        let mut rows = self.rows();
        let Some(row) = rows.iter_mut().find(|r| {
            r.id == id
                && r.tenant == *tenant
                && r.status == ConsentRequestStatus::Pending
                && r.requested_at >= fresh_since
        }) else {
            return Ok(false);
        };
        *row = row.clone().decided(by, at, decision);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(actor: &str, digest: &str, at: i64) -> NewConsentRequest {
        NewConsentRequest {
            tenant: TenantId::new("acme").unwrap(),
            actor: ActorId::new(actor).unwrap(),
            tool: ToolId::new("fs.files.delete").unwrap(),
            args_digest: digest.into(),
            call_id: CallId::generate(),
            at: UnixMillis(at),
        }
    }

    #[tokio::test]
    async fn a_request_is_reused_decided_once_and_expires() {
        let store = MemoryConsentRequests::default();
        let acme = TenantId::new("acme").unwrap();
        let a = store
            .open(&new("bob", "sha256:a", 10), UnixMillis(0), 10)
            .await
            .unwrap()
            .unwrap();
        assert!(is_request_id(&a.id), "{}", a.id);
        let again = store
            .open(&new("bob", "sha256:a", 20), UnixMillis(0), 10)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(again.id, a.id, "the same call reuses its pending request");
        let other = store
            .open(&new("bob", "sha256:b", 30), UnixMillis(0), 10)
            .await
            .unwrap()
            .unwrap();
        assert_ne!(other.id, a.id);
        assert_eq!(
            store
                .open(&new("bob", "sha256:c", 30), UnixMillis(0), 2)
                .await
                .unwrap(),
            None,
            "at most max_pending"
        );
        let approver = ActorId::new("ann").unwrap();
        let decline = ConsentDecision::Decline {
            reason: Some("no".into()),
        };
        assert!(
            store
                .decide(
                    &acme,
                    &a.id,
                    &approver,
                    UnixMillis(40),
                    &decline,
                    UnixMillis(0)
                )
                .await
                .unwrap()
        );
        assert!(
            !store
                .decide(
                    &acme,
                    &a.id,
                    &approver,
                    UnixMillis(41),
                    &decline,
                    UnixMillis(0)
                )
                .await
                .unwrap(),
            "decided once"
        );
        let got = store
            .get(&acme, &a.id, UnixMillis(0))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.status, ConsentRequestStatus::Declined);
        assert_eq!(got.reason.as_deref(), Some("no"));
        let globex = TenantId::new("globex").unwrap();
        assert_eq!(
            store.get(&globex, &a.id, UnixMillis(0)).await.unwrap(),
            None
        );

        // Expired: read so, not decidable, not pending, and a new refusal of the
        // same call opens a new request.
        let late = UnixMillis(31);
        let expired = store.get(&acme, &other.id, late).await.unwrap().unwrap();
        assert_eq!(expired.status, ConsentRequestStatus::Expired);
        assert!(
            store
                .list(&acme, Some(ConsentRequestStatus::Pending), late, 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            !store
                .decide(&acme, &other.id, &approver, UnixMillis(50), &decline, late)
                .await
                .unwrap()
        );
        let fresh = store
            .open(&new("bob", "sha256:b", 60), late, 10)
            .await
            .unwrap()
            .unwrap();
        assert_ne!(fresh.id, other.id);
        let all = store.list(&acme, None, late, 10).await.unwrap();
        assert_eq!(
            all.iter().map(|r| r.status).collect::<Vec<_>>(),
            [
                ConsentRequestStatus::Pending,
                ConsentRequestStatus::Expired,
                ConsentRequestStatus::Declined
            ],
            "newest first"
        );
    }

    #[test]
    fn names_parse_and_ids_are_checked() {
        for s in ConsentRequestStatus::ALL {
            assert_eq!(s.as_str().parse::<ConsentRequestStatus>().unwrap(), s);
        }
        let e = "done".parse::<ConsentRequestStatus>().unwrap_err();
        assert_eq!(e.field("field"), Some("status"));
        assert_eq!(
            "tool".parse::<ApprovalScope>().unwrap(),
            ApprovalScope::Tool
        );
        assert_eq!(
            "all".parse::<ApprovalScope>().unwrap_err().field("field"),
            Some("scope")
        );
        assert!(is_request_id(&new_request_id()));
        assert!(!is_request_id("creq_xyz"));
        assert!(!is_request_id("../etc"));
    }
}
