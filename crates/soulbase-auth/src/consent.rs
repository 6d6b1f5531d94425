//! Consent tokens: proof that a person approved this subject calling this tool.
//!
//! A token is `<version>.<payload>.<signature>` with a base64url JSON [`ConsentGrant`]
//! as payload: `v1` is signed with HMAC-SHA256 ([`HmacConsent`], one shared key),
//! `e1` with Ed25519 ([`Ed25519Consent`]: the consent service holds the signing key,
//! verifiers only the public key). Verification checks the signature, then tenant,
//! actor, tool or scope, the optional arguments digest and expiry; every failure is
//! the same `CONSENT.REQUIRED`.

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{ActorId, Subject, TenantId, ToolId, UnixMillis};

const VERSION: &str = "v1";
const ED25519_VERSION: &str = "e1";

impl ConsentGrant {
    /// A grant for `subject` to call `tool`, valid for `ttl_ms` from `now`.
    pub fn for_tool(subject: &Subject, tool: &ToolId, now: UnixMillis, ttl_ms: i64) -> Self {
        Self {
            id: Some(new_token_id()),
            issued_at: Some(now),
            tenant: subject.tenant.clone(),
            actor: subject.actor.clone(),
            tool: Some(tool.clone()),
            scope: None,
            args_digest: None,
            expires_at: UnixMillis(now.0.saturating_add(ttl_ms)),
        }
    }

    /// A grant for `subject` to call any tool whose manifest declares consent `scope`.
    pub fn for_scope(subject: &Subject, scope: &str, now: UnixMillis, ttl_ms: i64) -> Self {
        Self {
            id: Some(new_token_id()),
            issued_at: Some(now),
            tenant: subject.tenant.clone(),
            actor: subject.actor.clone(),
            tool: None,
            scope: Some(scope.to_owned()),
            args_digest: None,
            expires_at: UnixMillis(now.0.saturating_add(ttl_ms)),
        }
    }

    /// Restricts the grant to calls whose arguments have this digest.
    pub fn with_args_digest(mut self, digest: impl Into<String>) -> Self {
        self.args_digest = Some(digest.into());
        self
    }

    /// Whether this (authentic) grant covers the request.
    pub fn covers(&self, req: &ConsentRequest<'_>) -> bool {
        let covers_tool = match (&self.tool, &self.scope) {
            (Some(tool), _) => tool == req.tool,
            (None, Some(scope)) => req.scope == Some(scope.as_str()),
            (None, None) => false,
        };
        // A manifest's `consent.ttl_ms` bounds how old a consent may be, whatever
        // the token's own expiry says; a token that does not say when it was
        // issued cannot show that it is young enough.
        let young_enough = req.max_age_ms.is_none_or(|max_age| {
            self.issued_at.is_some_and(|issued| {
                req.now.0
                    < issued
                        .0
                        .saturating_add(i64::try_from(max_age).unwrap_or(i64::MAX))
            })
        });
        self.tenant == req.subject.tenant
            && self.actor == req.subject.actor
            && covers_tool
            && young_enough
            && self
                .args_digest
                .as_deref()
                .is_none_or(|d| d == req.args_digest)
            && self.expires_at > req.now
    }
}

impl ConsentGrant {
    /// The grant a token carries, **without checking its signature**: for
    /// recording an already verified token in evidence, never for a decision.
    pub fn unverified(token: &str) -> Option<ConsentGrant> {
        let mut parts = token.split('.');
        let (_version, payload) = (parts.next()?, parts.next()?);
        let bytes = URL_SAFE_NO_PAD.decode(payload).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// Issues consent tokens (the "consent API" a UI calls once a person approved).
pub trait ConsentIssuer: Send + Sync + 'static {
    /// Signs `grant` into a token. Refuses an already expired grant.
    fn issue_token(&self, grant: &ConsentGrant, now: UnixMillis) -> Result<String, SoulError>;
}

fn encode_payload(grant: &ConsentGrant) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(grant).unwrap_or_default())
}

fn check_issuable(grant: &ConsentGrant, now: UnixMillis) -> Result<(), SoulError> {
    if grant.expires_at <= now {
        return Err(SoulError::new(
            ErrorCode::SchemaValidationFailed,
            "a consent grant must expire in the future",
        )
        .with_field("field", "expires_at"));
    }
    if grant.tool.is_none() && grant.scope.is_none() {
        return Err(SoulError::new(
            ErrorCode::SchemaValidationFailed,
            "a consent grant must name a tool or a scope",
        )
        .with_field("field", "tool"));
    }
    Ok(())
}

/// A fresh token id: 128 random bits, hex (what revocation names).
pub fn new_token_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// What a consent token grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsentGrant {
    /// The token's id, for revocation and evidence (`None` in tokens minted
    /// before ids existed: those cannot be revoked one by one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// When the consent was given; a manifest's `consent.ttl_ms` counts from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_at: Option<UnixMillis>,
    /// The consenting subject's tenant.
    pub tenant: TenantId,
    /// The actor allowed to make the call.
    pub actor: ActorId,
    /// The tool consented to; `None` when the grant is by `scope`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<ToolId>,
    /// A consent scope (the manifest's `consent.scope`) covering several tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// When set, the consent covers only calls with exactly these arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args_digest: Option<String>,
    /// Expiry.
    pub expires_at: UnixMillis,
}

/// One consent check.
#[derive(Debug, Clone, Copy)]
pub struct ConsentRequest<'a> {
    /// The caller.
    pub subject: &'a Subject,
    /// The tool being called.
    pub tool: &'a ToolId,
    /// The tool's consent scope, if its manifest declares one.
    pub scope: Option<&'a str>,
    /// Digest of the call's arguments.
    pub args_digest: &'a str,
    /// The token the call carried.
    pub token: Option<&'a str>,
    /// The time to check expiry against.
    pub now: UnixMillis,
    /// The manifest's `consent.ttl_ms`: the oldest consent (from its
    /// `issued_at`) the tool accepts.
    pub max_age_ms: Option<u64>,
}

/// Verifies consent; any failure is `CONSENT.REQUIRED`, without saying which check failed.
#[async_trait]
pub trait ConsentVerifier: Send + Sync + 'static {
    /// Accepts or refuses the call's consent.
    async fn verify(&self, req: ConsentRequest<'_>) -> Result<(), SoulError>;
}

type HmacSha256 = Hmac<Sha256>;

/// Issues and verifies `v1.<payload>.<signature>` tokens signed with HMAC-SHA256.
pub struct HmacConsent {
    key: Vec<u8>,
}

fn refused() -> SoulError {
    SoulError::of(ErrorCode::ConsentRequired)
}

impl HmacConsent {
    /// A signer/verifier with `key` (at least 32 bytes recommended).
    pub fn new(key: impl Into<Vec<u8>>) -> Self {
        Self { key: key.into() }
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC accepts keys of any length; the error branch cannot happen.
        HmacSha256::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"))
    }

    /// Signs `grant` into a token.
    pub fn issue(&self, grant: &ConsentGrant) -> String {
        let payload = encode_payload(grant);
        let signed = format!("{VERSION}.{payload}");
        let mut mac = self.mac();
        mac.update(signed.as_bytes());
        let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        format!("{signed}.{sig}")
    }

    /// Checks the signature (constant time) and decodes the grant.
    pub(crate) fn open(&self, token: &str) -> Result<ConsentGrant, SoulError> {
        let (signed, sig) = token.rsplit_once('.').ok_or_else(refused)?;
        let payload = signed.strip_prefix("v1.").ok_or_else(refused)?;
        let sig = URL_SAFE_NO_PAD.decode(sig).map_err(|_| refused())?;
        let mut mac = self.mac();
        mac.update(signed.as_bytes());
        mac.verify_slice(&sig).map_err(|_| refused())?;
        let bytes = URL_SAFE_NO_PAD.decode(payload).map_err(|_| refused())?;
        serde_json::from_slice(&bytes).map_err(|_| refused())
    }

    /// The decision, synchronously.
    pub fn check(&self, req: &ConsentRequest<'_>) -> Result<(), SoulError> {
        let grant = self.open(req.token.ok_or_else(refused)?)?;
        if grant.covers(req) {
            Ok(())
        } else {
            Err(refused())
        }
    }
}

impl ConsentIssuer for HmacConsent {
    fn issue_token(&self, grant: &ConsentGrant, now: UnixMillis) -> Result<String, SoulError> {
        check_issuable(grant, now)?;
        Ok(self.issue(grant))
    }
}

/// Issues and verifies `e1.<payload>.<signature>` tokens signed with Ed25519.
///
/// Verifiers need only the public key, so the preflight side cannot mint consent.
pub struct Ed25519Consent {
    verifying: VerifyingKey,
    signing: Option<SigningKey>,
}

impl Ed25519Consent {
    /// A signer (and verifier) from a 32-byte secret seed.
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        let signing = SigningKey::from_bytes(seed);
        Self {
            verifying: signing.verifying_key(),
            signing: Some(signing),
        }
    }

    /// A verifier only, from a 32-byte public key; `CONFIG.INVALID` if it is not a
    /// valid Ed25519 point.
    pub fn verifier(public_key: &[u8; 32]) -> Result<Self, SoulError> {
        let verifying = VerifyingKey::from_bytes(public_key).map_err(|_| {
            SoulError::new(
                ErrorCode::ConfigInvalid,
                "the consent public key is invalid",
            )
            .with_field("field", "consent.public_key")
        })?;
        Ok(Self {
            verifying,
            signing: None,
        })
    }

    /// The public key verifiers need.
    pub fn public_key(&self) -> [u8; 32] {
        self.verifying.to_bytes()
    }

    pub(crate) fn open(&self, token: &str) -> Result<ConsentGrant, SoulError> {
        let (signed, sig) = token.rsplit_once('.').ok_or_else(refused)?;
        let payload = signed
            .strip_prefix(ED25519_VERSION)
            .and_then(|p| p.strip_prefix('.'))
            .ok_or_else(refused)?;
        let sig = URL_SAFE_NO_PAD.decode(sig).map_err(|_| refused())?;
        let sig = Signature::from_slice(&sig).map_err(|_| refused())?;
        self.verifying
            .verify_strict(signed.as_bytes(), &sig)
            .map_err(|_| refused())?;
        let bytes = URL_SAFE_NO_PAD.decode(payload).map_err(|_| refused())?;
        serde_json::from_slice(&bytes).map_err(|_| refused())
    }

    /// The decision, synchronously.
    pub fn check(&self, req: &ConsentRequest<'_>) -> Result<(), SoulError> {
        let grant = self.open(req.token.ok_or_else(refused)?)?;
        if grant.covers(req) {
            Ok(())
        } else {
            Err(refused())
        }
    }
}

impl ConsentIssuer for Ed25519Consent {
    fn issue_token(&self, grant: &ConsentGrant, now: UnixMillis) -> Result<String, SoulError> {
        check_issuable(grant, now)?;
        let signing = self.signing.as_ref().ok_or_else(|| {
            SoulError::new(
                ErrorCode::AuthForbidden,
                "this consent service holds no signing key",
            )
        })?;
        let signed = format!("{ED25519_VERSION}.{}", encode_payload(grant));
        let sig = signing.sign(signed.as_bytes());
        Ok(format!(
            "{signed}.{}",
            URL_SAFE_NO_PAD.encode(sig.to_bytes())
        ))
    }
}

#[async_trait]
impl ConsentVerifier for Ed25519Consent {
    async fn verify(&self, req: ConsentRequest<'_>) -> Result<(), SoulError> {
        self.check(&req)
    }
}

#[async_trait]
impl ConsentVerifier for HmacConsent {
    async fn verify(&self, req: ConsentRequest<'_>) -> Result<(), SoulError> {
        self.check(&req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject(actor: &str) -> Subject {
        Subject::new(TenantId::new("acme").unwrap(), ActorId::new(actor).unwrap())
    }

    fn grant(tool: &str, expires: i64) -> ConsentGrant {
        ConsentGrant {
            id: None,
            issued_at: Some(UnixMillis(0)),
            tenant: TenantId::new("acme").unwrap(),
            actor: ActorId::new("alice").unwrap(),
            tool: Some(ToolId::new(tool).unwrap()),
            scope: None,
            args_digest: None,
            expires_at: UnixMillis(expires),
        }
    }

    fn check(
        c: &HmacConsent,
        who: &Subject,
        tool: &str,
        token: Option<&str>,
        now: i64,
    ) -> Result<(), SoulError> {
        let tool = ToolId::new(tool).unwrap();
        c.check(&ConsentRequest {
            subject: who,
            tool: &tool,
            scope: None,
            args_digest: "sha256:x",
            token,
            now: UnixMillis(now),
            max_age_ms: None,
        })
    }

    #[test]
    fn valid_token_passes() {
        let c = HmacConsent::new(b"k".repeat(32));
        let t = c.issue(&grant("fs.files.delete", 2_000));
        assert!(check(&c, &subject("alice"), "fs.files.delete", Some(&t), 1_000).is_ok());
    }

    #[test]
    fn every_bad_token_is_refused_with_the_same_code() {
        let c = HmacConsent::new(b"k".repeat(32));
        let t = c.issue(&grant("fs.files.delete", 2_000));
        let other_key = HmacConsent::new(b"j".repeat(32)).issue(&grant("fs.files.delete", 2_000));
        let mut tampered = t.clone();
        tampered.replace_range(5..6, if &t[5..6] == "A" { "B" } else { "A" });
        let cases: Vec<(&str, Result<(), SoulError>)> = vec![
            (
                "missing",
                check(&c, &subject("alice"), "fs.files.delete", None, 1_000),
            ),
            (
                "expired",
                check(&c, &subject("alice"), "fs.files.delete", Some(&t), 2_000),
            ),
            (
                "other tool",
                check(&c, &subject("alice"), "fs.files.read", Some(&t), 1_000),
            ),
            (
                "other subject",
                check(&c, &subject("bob"), "fs.files.delete", Some(&t), 1_000),
            ),
            (
                "tampered",
                check(
                    &c,
                    &subject("alice"),
                    "fs.files.delete",
                    Some(&tampered),
                    1_000,
                ),
            ),
            (
                "other key",
                check(
                    &c,
                    &subject("alice"),
                    "fs.files.delete",
                    Some(&other_key),
                    1_000,
                ),
            ),
            (
                "garbage",
                check(
                    &c,
                    &subject("alice"),
                    "fs.files.delete",
                    Some("v1.x.y"),
                    1_000,
                ),
            ),
        ];
        for (name, result) in cases {
            let err = result.expect_err(name);
            assert_eq!(err.code(), ErrorCode::ConsentRequired, "{name}");
            assert_eq!(err.message(), refused().message(), "{name} must not hint");
        }
    }

    #[test]
    fn args_digest_binds_the_arguments() {
        let c = HmacConsent::new(b"k".repeat(32));
        let mut g = grant("fs.files.delete", 2_000);
        g.args_digest = Some("sha256:other".into());
        let t = c.issue(&g);
        assert!(check(&c, &subject("alice"), "fs.files.delete", Some(&t), 1_000).is_err());
    }
}
