#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Consent tokens, HMAC and Ed25519: issued by the API, verified in preflight; every
//! bad token is the same `CONSENT.REQUIRED`.

use soulbase_auth::{
    ConsentGrant, ConsentIssuer, ConsentRequest, ConsentVerifier, Ed25519Consent, HmacConsent,
};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{ActorId, Subject, TenantId, ToolId, UnixMillis};

const NOW: UnixMillis = UnixMillis(1_000_000);

fn subject(tenant: &str, actor: &str) -> Subject {
    Subject::new(TenantId::new(tenant).unwrap(), ActorId::new(actor).unwrap())
}

fn tool(s: &str) -> ToolId {
    ToolId::new(s).unwrap()
}

async fn verify(
    v: &dyn ConsentVerifier,
    who: &Subject,
    tool_id: &str,
    scope: Option<&str>,
    digest: &str,
    token: Option<&str>,
    now: UnixMillis,
) -> Result<(), SoulError> {
    let t = tool(tool_id);
    v.verify(ConsentRequest {
        subject: who,
        tool: &t,
        scope,
        args_digest: digest,
        token,
        now,
        max_age_ms: None,
    })
    .await
}

fn tamper(token: &str) -> String {
    // Flip one character of the payload (the middle part).
    let (head, rest) = token.split_once('.').unwrap();
    let (payload, sig) = rest.split_once('.').unwrap();
    let mut p: Vec<char> = payload.chars().collect();
    p[3] = if p[3] == 'A' { 'B' } else { 'A' };
    format!("{head}.{}.{sig}", p.into_iter().collect::<String>())
}

async fn every_bad_token_is_refused(
    issuer: &dyn ConsentIssuer,
    verifier: &dyn ConsentVerifier,
    foreign: &str,
) {
    let alice = subject("acme", "alice");
    let grant = ConsentGrant::for_tool(&alice, &tool("fs.files.delete"), NOW, 60_000);
    let token = issuer.issue_token(&grant, NOW).unwrap();
    let ok = verify(
        verifier,
        &alice,
        "fs.files.delete",
        None,
        "sha256:x",
        Some(&token),
        NOW,
    )
    .await;
    assert!(ok.is_ok(), "a valid token passes");

    let later = UnixMillis(NOW.0 + 60_000);
    let cases: Vec<(&str, Result<(), SoulError>)> = vec![
        (
            "missing",
            verify(verifier, &alice, "fs.files.delete", None, "d", None, NOW).await,
        ),
        (
            "expired",
            verify(
                verifier,
                &alice,
                "fs.files.delete",
                None,
                "d",
                Some(&token),
                later,
            )
            .await,
        ),
        (
            "other tool",
            verify(
                verifier,
                &alice,
                "fs.files.read",
                None,
                "d",
                Some(&token),
                NOW,
            )
            .await,
        ),
        (
            "other actor",
            verify(
                verifier,
                &subject("acme", "bob"),
                "fs.files.delete",
                None,
                "d",
                Some(&token),
                NOW,
            )
            .await,
        ),
        (
            "other tenant",
            verify(
                verifier,
                &subject("beta", "alice"),
                "fs.files.delete",
                None,
                "d",
                Some(&token),
                NOW,
            )
            .await,
        ),
        (
            "tampered",
            verify(
                verifier,
                &alice,
                "fs.files.delete",
                None,
                "d",
                Some(&tamper(&token)),
                NOW,
            )
            .await,
        ),
        (
            "other key or scheme",
            verify(
                verifier,
                &alice,
                "fs.files.delete",
                None,
                "d",
                Some(foreign),
                NOW,
            )
            .await,
        ),
        (
            "garbage",
            verify(
                verifier,
                &alice,
                "fs.files.delete",
                None,
                "d",
                Some("e1.x.y"),
                NOW,
            )
            .await,
        ),
        (
            "empty",
            verify(
                verifier,
                &alice,
                "fs.files.delete",
                None,
                "d",
                Some(""),
                NOW,
            )
            .await,
        ),
    ];
    for (case, r) in cases {
        let err = r.expect_err(case);
        assert_eq!(err.code(), ErrorCode::ConsentRequired, "{case}");
        assert_eq!(
            err.public().message,
            SoulError::of(ErrorCode::ConsentRequired).public().message,
            "{case}: no hint"
        );
    }
}

fn foreign_grant() -> ConsentGrant {
    ConsentGrant::for_tool(
        &subject("acme", "alice"),
        &tool("fs.files.delete"),
        NOW,
        60_000,
    )
}

#[tokio::test]
async fn ed25519_tokens_refuse_every_bad_case() {
    let signer = Ed25519Consent::from_seed(&[1; 32]);
    let verifier = Ed25519Consent::verifier(&signer.public_key()).unwrap();
    let other_key = Ed25519Consent::from_seed(&[2; 32])
        .issue_token(&foreign_grant(), NOW)
        .unwrap();
    every_bad_token_is_refused(&signer, &verifier, &other_key).await;
    // An HMAC token is not an Ed25519 token.
    let hmac = HmacConsent::new(vec![3; 32]).issue(&foreign_grant());
    every_bad_token_is_refused(&signer, &verifier, &hmac).await;
}

#[tokio::test]
async fn hmac_tokens_refuse_every_bad_case() {
    let c = HmacConsent::new(vec![5; 32]);
    let other_key = HmacConsent::new(vec![6; 32]).issue(&foreign_grant());
    every_bad_token_is_refused(&c, &c, &other_key).await;
    let ed = Ed25519Consent::from_seed(&[1; 32])
        .issue_token(&foreign_grant(), NOW)
        .unwrap();
    every_bad_token_is_refused(&c, &c, &ed).await;
}

#[tokio::test]
async fn scope_grants_and_args_digests() {
    let c = Ed25519Consent::from_seed(&[8; 32]);
    let alice = subject("acme", "alice");
    let scoped = c
        .issue_token(
            &ConsentGrant::for_scope(&alice, "files:write", NOW, 1_000),
            NOW,
        )
        .unwrap();
    assert!(
        verify(
            &c,
            &alice,
            "fs.files.delete",
            Some("files:write"),
            "d",
            Some(&scoped),
            NOW
        )
        .await
        .is_ok()
    );
    assert!(
        verify(
            &c,
            &alice,
            "fs.files.delete",
            Some("files:read"),
            "d",
            Some(&scoped),
            NOW
        )
        .await
        .is_err()
    );
    assert!(
        verify(&c, &alice, "fs.files.delete", None, "d", Some(&scoped), NOW)
            .await
            .is_err()
    );

    let bound = c
        .issue_token(
            &ConsentGrant::for_tool(&alice, &tool("fs.files.delete"), NOW, 1_000)
                .with_args_digest("sha256:aaa"),
            NOW,
        )
        .unwrap();
    assert!(
        verify(
            &c,
            &alice,
            "fs.files.delete",
            None,
            "sha256:aaa",
            Some(&bound),
            NOW
        )
        .await
        .is_ok()
    );
    assert!(
        verify(
            &c,
            &alice,
            "fs.files.delete",
            None,
            "sha256:bbb",
            Some(&bound),
            NOW
        )
        .await
        .is_err()
    );
}

#[test]
fn the_issue_api_refuses_bad_grants_and_verifiers_cannot_sign() {
    let signer = Ed25519Consent::from_seed(&[1; 32]);
    let alice = subject("acme", "alice");
    let expired = ConsentGrant::for_tool(&alice, &tool("a.b.c"), NOW, 0);
    let err = signer.issue_token(&expired, NOW).unwrap_err();
    assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
    assert_eq!(err.field("field"), Some("expires_at"));
    let mut nothing = ConsentGrant::for_tool(&alice, &tool("a.b.c"), NOW, 10);
    nothing.tool = None;
    assert_eq!(
        HmacConsent::new(vec![1; 32])
            .issue_token(&nothing, NOW)
            .unwrap_err()
            .field("field"),
        Some("tool")
    );
    let verifier = Ed25519Consent::verifier(&signer.public_key()).unwrap();
    let grant = ConsentGrant::for_tool(&alice, &tool("a.b.c"), NOW, 10);
    assert_eq!(
        verifier.issue_token(&grant, NOW).unwrap_err().code(),
        ErrorCode::AuthForbidden
    );
}
