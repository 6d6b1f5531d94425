//! Consent tokens: proof that a person approved this subject calling this tool.

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{ActorId, Subject, TenantId, ToolId, UnixMillis};

const VERSION: &str = "v1";

/// What a consent token grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsentGrant {
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
        let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(grant).unwrap_or_default());
        let signed = format!("{VERSION}.{payload}");
        let mut mac = self.mac();
        mac.update(signed.as_bytes());
        let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        format!("{signed}.{sig}")
    }

    /// Checks the signature (constant time) and decodes the grant.
    fn open(&self, token: &str) -> Result<ConsentGrant, SoulError> {
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
        let covers_tool = match (&grant.tool, &grant.scope) {
            (Some(tool), _) => tool == req.tool,
            (None, Some(scope)) => req.scope == Some(scope.as_str()),
            (None, None) => false,
        };
        let ok = grant.tenant == req.subject.tenant
            && grant.actor == req.subject.actor
            && covers_tool
            && grant
                .args_digest
                .as_deref()
                .is_none_or(|d| d == req.args_digest)
            && grant.expires_at > req.now;
        if ok { Ok(()) } else { Err(refused()) }
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
