//! Who is calling, what they may call, and with whose consent (R7).
//!
//! - **Authentication** ([`Authenticator`]): API keys (`sbk_<id>_<secret>`, stored as
//!   SHA-256 digests, compared in constant time) and JWT bearer tokens (HS256, RS256,
//!   ES256; issuer, audience, expiry and not-before checked; keys inline or from JWKS
//!   files) become a [`Subject`]. Every failure is the same `AUTH.UNAUTHENTICATED`.
//!   Bound to a `ConfigHandle`, a reload revokes keys and rotates JWT keys at once.
//! - **Authorization** ([`Authorizer`]): may this subject perform `action` on
//!   `soul:tool:{id}`? [`CedarPolicy`] evaluates Cedar policies validated against
//!   [`SCHEMA`] (evaluation errors deny; an empty set denies); [`StaticPolicy`]
//!   evaluates the simple `policy.rules`. Both deny by default.
//! - **Consent** ([`ConsentVerifier`], [`ConsentIssuer`]): signed tokens binding tenant,
//!   actor, tool or scope, an optional arguments digest and expiry — HMAC
//!   ([`HmacConsent`]) or Ed25519 ([`Ed25519Consent`]). [`ConsentService`] issues
//!   them to approvers under policy (action `consent_issue`), caps their lifetime
//!   and revokes them by id; [`ConsentRequests`] keeps the requests refused calls
//!   leave for approvers to approve or decline.
//!
//! Tenant isolation is structural ([`check_tenant`]): a subject is never authorized
//! for a tool owned by another tenant, whatever the policy says, and the refusal is
//! `TOOL.NOT_FOUND` so it reveals nothing.

mod apikey;
mod authn;
mod cedar;
mod consent;
mod consent_requests;
mod consent_service;
mod engine;
mod isolation;
mod jwt;
mod policy;

use async_trait::async_trait;
use soulbase_errors::SoulError;
use soulbase_types::{Subject, TenantId, ToolId};

pub use apikey::{API_KEY_PREFIX, IssuedApiKey, api_key_digest, generate_api_key};
pub use authn::{Authenticator, Credential};
pub use cedar::{CedarPolicySet, SCHEMA};
pub use consent::{
    ConsentGrant, ConsentIssuer, ConsentRequest, ConsentVerifier, Ed25519Consent, HmacConsent,
    new_token_id,
};
pub use consent_requests::{
    ApprovalScope, CONSENT_REQUEST_TTL_MS, ConsentDecision, ConsentRequestRecord,
    ConsentRequestStatus, ConsentRequests, MAX_PENDING_PER_ACTOR, MAX_REASON_CHARS,
    MemoryConsentRequests, NewConsentRequest, is_request_id, new_request_id,
};
pub use consent_service::{
    CONSENT_RESOURCE, ConsentKeys, ConsentRevocations, ConsentService, IssueConsent, IssuedConsent,
    MemoryRevocations,
};
pub use engine::{CedarPolicy, read_sources};
pub use isolation::check_tenant;
pub use policy::StaticPolicy;

pub mod action;

pub use action::Action;

/// One authorization question.
#[derive(Debug, Clone, Copy)]
pub struct AuthzRequest<'a> {
    /// Who asks.
    pub subject: &'a Subject,
    /// The tool (resource `soul:tool:{id}`).
    pub tool: &'a ToolId,
    /// The tenant owning the tool, when it is tenant-scoped (`None` for global tools).
    pub tool_tenant: Option<&'a TenantId>,
    /// The action.
    pub action: Action,
    /// The permissions the tool's manifest declares (`scopes`, each written
    /// `resource#action`): a static rule with `require_scopes` allows only a subject
    /// holding all of them, and Cedar policies see them as `context.tool_scopes`.
    /// Empty for administration and for tools that declare none.
    pub tool_scopes: &'a [String],
}

/// A positive decision, with what evidence needs to know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Hash of the policy set that allowed the call.
    pub policy_hash: String,
    /// What the policy that allowed it requires of the output (static rules'
    /// `obligations`, Cedar `@obligations` annotations of the permits that
    /// decided): applied with the manifest's before anyone sees the output.
    pub obligations: Vec<soulbase_types::Obligation>,
}

/// Decides whether a subject may act on a tool. Deny is an `Err` with a stable code
/// (`POLICY.DENY_TOOL` or `AUTH.FORBIDDEN`).
#[async_trait]
pub trait Authorizer: Send + Sync + 'static {
    /// Answers one question.
    async fn authorize(&self, req: AuthzRequest<'_>) -> Result<Decision, SoulError>;

    /// Whether `req`'s subject may perform every one of `actions` on its tool
    /// (`req.action` is not consulted): the first refusal, else the last decision.
    /// Engines that can decide them in one pass override it (the static rules).
    async fn authorize_all(
        &self,
        req: AuthzRequest<'_>,
        actions: &[Action],
    ) -> Result<Decision, SoulError> {
        let mut decision = None;
        for action in actions {
            decision = Some(
                self.authorize(AuthzRequest {
                    action: *action,
                    tool_scopes: &[],
                    ..req
                })
                .await?,
            );
        }
        decision.ok_or_else(|| SoulError::of(soulbase_errors::ErrorCode::PolicyDenyTool))
    }
}
