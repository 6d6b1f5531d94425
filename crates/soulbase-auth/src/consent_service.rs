//! The consent service: issues consent tokens to approvers under policy, verifies
//! them with the server's limits, and revokes them by id.
//!
//! Every surface that mints consent (the HTTP and gRPC issue APIs, the CLI through
//! them, MCP elicitation) goes through [`ConsentService::issue`], so a token is
//! always authorized the same way: the approver must be allowed
//! [`Action::ConsentIssue`] on the tool, consents only for their own tenant, and
//! the lifetime is capped by the server (`auth.consent.max_ttl_ms`) and by the
//! tool's manifest (`consent.ttl_ms`). Verification adds to the signature and
//! binding checks of the keys: the server's lifetime cap, and revocation.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{ActorId, Subject, TenantId, ToolId, UnixMillis};

use crate::consent::{
    ConsentGrant, ConsentIssuer, ConsentRequest, ConsentVerifier, Ed25519Consent, HmacConsent,
};
use crate::{Action, Authorizer, AuthzRequest};

/// The resource a consent revocation is authorized on: revoking names a token,
/// not a tool, so it is asked about the server's consent service.
pub const CONSENT_RESOURCE: &str = "soulbase.server.consent";

/// The keys tokens are signed and verified with.
pub enum ConsentKeys {
    /// HMAC-SHA256 with one shared key (`v1.` tokens).
    Hmac(HmacConsent),
    /// Ed25519 (`e1.` tokens); a verifier-only key set cannot issue.
    Ed25519(Box<Ed25519Consent>),
}

impl std::fmt::Debug for ConsentKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConsentKeys::Hmac(_) => "ConsentKeys::Hmac",
            ConsentKeys::Ed25519(_) => "ConsentKeys::Ed25519",
        })
    }
}

impl ConsentKeys {
    fn open(&self, token: &str) -> Result<ConsentGrant, SoulError> {
        match self {
            ConsentKeys::Hmac(k) => k.open(token),
            ConsentKeys::Ed25519(k) => k.open(token),
        }
    }

    fn sign(&self, grant: &ConsentGrant, now: UnixMillis) -> Result<String, SoulError> {
        match self {
            ConsentKeys::Hmac(k) => k.issue_token(grant, now),
            ConsentKeys::Ed25519(k) => k.issue_token(grant, now),
        }
    }
}

/// Where revoked token ids are kept. The server keeps them with its evidence
/// backend, so every replica sees a revocation; [`MemoryRevocations`] is for a
/// process without one.
#[async_trait]
pub trait ConsentRevocations: Send + Sync + 'static {
    /// Records that token `id` (issued in `tenant`) is revoked by `by`.
    async fn revoke(
        &self,
        id: &str,
        tenant: &TenantId,
        by: &ActorId,
        at: UnixMillis,
    ) -> Result<(), SoulError>;

    /// Whether token `id` of `tenant` was revoked by an approver of that tenant
    /// (another tenant's approver cannot revoke it, even knowing its id).
    async fn is_revoked(&self, id: &str, tenant: &TenantId) -> Result<bool, SoulError>;
}

/// Revocations held in memory (lost on restart, not shared between replicas).
#[derive(Debug, Default)]
pub struct MemoryRevocations(Mutex<HashSet<(String, TenantId)>>);

#[async_trait]
impl ConsentRevocations for MemoryRevocations {
    async fn revoke(
        &self,
        id: &str,
        tenant: &TenantId,
        _by: &ActorId,
        _at: UnixMillis,
    ) -> Result<(), SoulError> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((id.to_owned(), tenant.clone()));
        Ok(())
    }

    async fn is_revoked(&self, id: &str, tenant: &TenantId) -> Result<bool, SoulError> {
        Ok(self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(id.to_owned(), tenant.clone())))
    }
}

/// A request to issue consent, as the issue APIs receive it.
#[derive(Debug, Clone)]
pub struct IssueConsent {
    /// The tool consented to.
    pub tool: ToolId,
    /// The tool's owner, when tenant-scoped (for the authorization question).
    pub tool_tenant: Option<TenantId>,
    /// The tool manifest's `consent.ttl_ms`, which caps the lifetime.
    pub tool_ttl_ms: Option<u64>,
    /// The actor allowed to make the call; the approver when `None`.
    pub actor: Option<ActorId>,
    /// Restricts the consent to calls with exactly these arguments (their digest).
    pub args_digest: Option<String>,
    /// The lifetime asked for; the service's default when `None`.
    pub ttl_ms: Option<u64>,
}

/// A token just issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedConsent {
    /// The token to send with the call.
    pub token: String,
    /// What it grants (its `id` names it for revocation).
    pub grant: ConsentGrant,
}

/// Issues, verifies and revokes consent tokens (see the module docs).
pub struct ConsentService {
    keys: ConsentKeys,
    revocations: Arc<dyn ConsentRevocations>,
    max_ttl_ms: u64,
    default_ttl_ms: u64,
}

impl std::fmt::Debug for ConsentService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsentService")
            .field("keys", &self.keys)
            .field("max_ttl_ms", &self.max_ttl_ms)
            .field("default_ttl_ms", &self.default_ttl_ms)
            .finish_non_exhaustive()
    }
}

fn invalid(field: &str, message: &'static str) -> SoulError {
    SoulError::new(ErrorCode::SchemaValidationFailed, message).with_field("field", field)
}

fn refused() -> SoulError {
    SoulError::of(ErrorCode::ConsentRequired)
}

impl ConsentService {
    /// A service signing and verifying with `keys`, keeping revocations in
    /// `revocations`; issued lifetimes default to `default_ttl_ms` and no token
    /// (issued here or not) may live longer than `max_ttl_ms`.
    pub fn new(
        keys: ConsentKeys,
        revocations: Arc<dyn ConsentRevocations>,
        max_ttl_ms: u64,
        default_ttl_ms: u64,
    ) -> Self {
        Self {
            keys,
            revocations,
            max_ttl_ms,
            default_ttl_ms: default_ttl_ms.min(max_ttl_ms),
        }
    }

    /// The longest lifetime a token may have.
    pub fn max_ttl_ms(&self) -> u64 {
        self.max_ttl_ms
    }

    /// Issues a token for `approver`'s tenant, if policy allows the approver
    /// [`Action::ConsentIssue`] on the tool. The lifetime is the one asked for (or
    /// the default), cut to the server's cap and the tool's `consent.ttl_ms`.
    pub async fn issue(
        &self,
        authorizer: &dyn Authorizer,
        approver: &Subject,
        req: IssueConsent,
        now: UnixMillis,
    ) -> Result<IssuedConsent, SoulError> {
        if req.ttl_ms == Some(0) {
            return Err(invalid("ttl_ms", "ttl_ms must be greater than 0"));
        }
        authorizer
            .authorize(AuthzRequest {
                subject: approver,
                tool: &req.tool,
                tool_tenant: req.tool_tenant.as_ref(),
                action: Action::ConsentIssue,
                tool_scopes: &[],
            })
            .await?;
        let ttl = req
            .ttl_ms
            .unwrap_or(self.default_ttl_ms)
            .min(self.max_ttl_ms)
            .min(req.tool_ttl_ms.unwrap_or(u64::MAX));
        let mut consenting = approver.clone();
        if let Some(actor) = req.actor {
            consenting.actor = actor;
        }
        let mut grant = ConsentGrant::for_tool(
            &consenting,
            &req.tool,
            now,
            i64::try_from(ttl).unwrap_or(i64::MAX),
        );
        grant.args_digest = req.args_digest;
        let token = self.keys.sign(&grant, now)?;
        Ok(IssuedConsent { token, grant })
    }

    /// Revokes token `id`: calls carrying it are refused from now on, on every
    /// replica sharing the revocation store. Needs [`Action::ConsentIssue`] on
    /// [`CONSENT_RESOURCE`].
    pub async fn revoke(
        &self,
        authorizer: &dyn Authorizer,
        approver: &Subject,
        id: &str,
        now: UnixMillis,
    ) -> Result<(), SoulError> {
        let valid = !id.is_empty()
            && id.len() <= 64
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !valid {
            return Err(invalid(
                "id",
                "a consent token id is 1–64 letters, digits or '-'",
            ));
        }
        let resource = ToolId::new(CONSENT_RESOURCE).map_err(SoulError::internal)?;
        authorizer
            .authorize(AuthzRequest {
                subject: approver,
                tool: &resource,
                tool_tenant: None,
                action: Action::ConsentIssue,
                tool_scopes: &[],
            })
            .await?;
        self.revocations
            .revoke(id, &approver.tenant, &approver.actor, now)
            .await
    }
}

#[async_trait]
impl ConsentVerifier for ConsentService {
    async fn verify(&self, req: ConsentRequest<'_>) -> Result<(), SoulError> {
        let grant = self.keys.open(req.token.ok_or_else(refused)?)?;
        if !grant.covers(&req) {
            return Err(refused());
        }
        // The server's cap applies to tokens minted elsewhere too: a lifetime
        // counted from issue when the token says when, else from now.
        let from = grant.issued_at.unwrap_or(req.now);
        let lifetime = grant.expires_at.0.saturating_sub(from.0);
        if u64::try_from(lifetime).unwrap_or(u64::MAX) > self.max_ttl_ms {
            return Err(refused());
        }
        if let Some(id) = &grant.id
            && self.revocations.is_revoked(id, &grant.tenant).await?
        {
            return Err(refused());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StaticPolicy;
    use soulbase_config::{PolicyConfig, PolicyEffect, PolicyRule};

    fn subject(tenant: &str, actor: &str) -> Subject {
        Subject::new(TenantId::new(tenant).unwrap(), ActorId::new(actor).unwrap())
    }

    fn tool(id: &str) -> ToolId {
        ToolId::new(id).unwrap()
    }

    fn policy() -> StaticPolicy {
        let rule = |tool: &str| PolicyRule {
            effect: PolicyEffect::Allow,
            tenant: "acme".into(),
            actors: vec!["approver".into()],
            tools: vec![tool.into()],
            actions: vec!["consent_issue".into()],
            require_scopes: false,
            obligations: Vec::new(),
        };
        StaticPolicy::new(&PolicyConfig {
            rules: vec![rule("fs.*"), rule(CONSENT_RESOURCE)],
        })
    }

    fn service() -> ConsentService {
        ConsentService::new(
            ConsentKeys::Ed25519(Box::new(Ed25519Consent::from_seed(&[7; 32]))),
            Arc::new(MemoryRevocations::default()),
            3_600_000,
            600_000,
        )
    }

    fn ask(t: &ToolId, ttl: Option<u64>) -> IssueConsent {
        IssueConsent {
            tool: t.clone(),
            tool_tenant: None,
            tool_ttl_ms: ttl,
            actor: Some(ActorId::new("alice").unwrap()),
            args_digest: None,
            ttl_ms: None,
        }
    }

    async fn verify(
        s: &ConsentService,
        who: &Subject,
        t: &ToolId,
        token: &str,
        now: i64,
        max_age: Option<u64>,
    ) -> Result<(), SoulError> {
        s.verify(ConsentRequest {
            subject: who,
            tool: t,
            scope: None,
            args_digest: "sha256:x",
            token: Some(token),
            now: UnixMillis(now),
            max_age_ms: max_age,
        })
        .await
    }

    #[tokio::test]
    async fn an_approver_issues_and_the_token_verifies_until_revoked() {
        let s = service();
        let t = tool("fs.files.delete");
        let issued = s
            .issue(
                &policy(),
                &subject("acme", "approver"),
                ask(&t, None),
                UnixMillis(1_000),
            )
            .await
            .unwrap();
        assert_eq!(issued.grant.expires_at, UnixMillis(601_000), "default TTL");
        assert_eq!(issued.grant.actor.as_str(), "alice");
        let alice = subject("acme", "alice");
        verify(&s, &alice, &t, &issued.token, 2_000, None)
            .await
            .unwrap();
        let id = issued.grant.id.clone().unwrap();
        s.revoke(
            &policy(),
            &subject("acme", "approver"),
            &id,
            UnixMillis(3_000),
        )
        .await
        .unwrap();
        let err = verify(&s, &alice, &t, &issued.token, 4_000, None)
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ConsentRequired);
    }

    #[tokio::test]
    async fn another_tenants_approver_cannot_revoke_a_token() {
        let s = service();
        let t = tool("fs.files.delete");
        let issued = s
            .issue(
                &policy(),
                &subject("acme", "approver"),
                ask(&t, None),
                UnixMillis(1_000),
            )
            .await
            .unwrap();
        let id = issued.grant.id.clone().unwrap();
        // An approver of another tenant may revoke (its own tokens), but its
        // revocation does not reach acme's token.
        s.revocations
            .revoke(
                &id,
                &TenantId::new("globex").unwrap(),
                &ActorId::new("approver").unwrap(),
                UnixMillis(2_000),
            )
            .await
            .unwrap();
        let alice = subject("acme", "alice");
        verify(&s, &alice, &t, &issued.token, 3_000, None)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn issuing_needs_the_consent_issue_action() {
        let s = service();
        let t = tool("fs.files.delete");
        let err = s
            .issue(
                &policy(),
                &subject("acme", "alice"),
                ask(&t, None),
                UnixMillis(0),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::PolicyDenyTool);
        let err = s
            .revoke(&policy(), &subject("acme", "alice"), "abc", UnixMillis(0))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::PolicyDenyTool);
    }

    #[tokio::test]
    async fn the_lifetime_is_capped_by_the_server_and_the_manifest() {
        let s = service();
        let t = tool("fs.files.delete");
        let approver = subject("acme", "approver");
        let mut long = ask(&t, None);
        long.ttl_ms = Some(100_000_000);
        let issued = s
            .issue(&policy(), &approver, long, UnixMillis(0))
            .await
            .unwrap();
        assert_eq!(issued.grant.expires_at, UnixMillis(3_600_000), "server cap");
        let issued = s
            .issue(&policy(), &approver, ask(&t, Some(5_000)), UnixMillis(0))
            .await
            .unwrap();
        assert_eq!(issued.grant.expires_at, UnixMillis(5_000), "manifest cap");
        // The manifest's TTL also bounds a token's age when it is verified.
        let alice = subject("acme", "alice");
        let plain = s
            .issue(&policy(), &approver, ask(&t, None), UnixMillis(0))
            .await
            .unwrap();
        verify(&s, &alice, &t, &plain.token, 4_000, Some(5_000))
            .await
            .unwrap();
        assert!(
            verify(&s, &alice, &t, &plain.token, 5_000, Some(5_000))
                .await
                .is_err()
        );
        let mut zero = ask(&t, None);
        zero.ttl_ms = Some(0);
        let err = s
            .issue(&policy(), &approver, zero, UnixMillis(0))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
    }

    #[tokio::test]
    async fn tokens_from_other_signers_living_past_the_cap_are_refused() {
        let keys = Ed25519Consent::from_seed(&[7; 32]);
        let alice = subject("acme", "alice");
        let t = tool("fs.files.delete");
        let grant = ConsentGrant::for_tool(&alice, &t, UnixMillis(0), 7_200_000);
        let token = keys.issue_token(&grant, UnixMillis(0)).unwrap();
        let err = verify(&service(), &alice, &t, &token, 1_000, None)
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ConsentRequired);
    }

    #[tokio::test]
    async fn a_verifier_only_key_cannot_issue() {
        let public = Ed25519Consent::from_seed(&[7; 32]).public_key();
        let s = ConsentService::new(
            ConsentKeys::Ed25519(Box::new(Ed25519Consent::verifier(&public).unwrap())),
            Arc::new(MemoryRevocations::default()),
            3_600_000,
            600_000,
        );
        let t = tool("fs.files.delete");
        let err = s
            .issue(
                &policy(),
                &subject("acme", "approver"),
                ask(&t, None),
                UnixMillis(0),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::AuthForbidden);
    }
}
