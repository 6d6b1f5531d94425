#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Authentication: API keys (hashed, revocable on reload) and JWTs (HS256, ES256,
//! JWKS rotation); every refusal is the same `AUTH.UNAUTHENTICATED`.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use p256::ecdsa::SigningKey;
use p256::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
use serde_json::{Value, json};
use soulbase_auth::{Authenticator, Credential, api_key_digest, generate_api_key};
use soulbase_config::{
    AuthConfig, Config, ConfigHandle, ConfigSnapshot, JwtAlgorithm, JwtIssuerConfig, JwtKeyConfig,
};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{ActorId, Subject, TenantId};

const SECRET_VAR: &str = "SOULBASE_TEST_AUTHN_HS256_SECRET";
const SECRET: &str = "an-hs256-test-secret-of-at-least-32-bytes!";

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn alice() -> Subject {
    Subject::new(
        TenantId::new("acme").unwrap(),
        ActorId::new("alice").unwrap(),
    )
    .with_role("agent")
    .with_scope("tools:invoke")
}

fn assert_unauthenticated(r: Result<Subject, SoulError>, case: &str) {
    let err = r.expect_err(case);
    assert_eq!(err.code(), ErrorCode::AuthUnauthenticated, "{case}");
    assert_eq!(
        err.public().message,
        SoulError::of(ErrorCode::AuthUnauthenticated)
            .public()
            .message,
        "{case}: no hint of which part failed"
    );
}

fn snapshot(auth: AuthConfig) -> ConfigSnapshot {
    let config = Config {
        auth,
        ..Config::default()
    };
    assert!(config.validate().is_empty(), "{:?}", config.validate());
    ConfigSnapshot::new(config, vec![])
}

#[test]
fn api_keys_authenticate_and_revocation_applies_on_reload() {
    let issued = generate_api_key("ci-bot", &alice());
    assert!(issued.key.starts_with("sbk_ci-bot_"));
    assert_eq!(issued.config.sha256, api_key_digest(&issued.key));
    assert!(
        !format!("{issued:?}").contains(&issued.key),
        "Debug hides the key"
    );
    let other = generate_api_key("other", &alice());
    assert_ne!(issued.key, other.key);

    let handle = ConfigHandle::new(snapshot(AuthConfig {
        api_keys: vec![issued.config.clone()],
        ..AuthConfig::default()
    }));
    let authn = Authenticator::follow(handle.clone()).unwrap();
    let who = authn.authenticate(Credential::ApiKey(&issued.key)).unwrap();
    assert_eq!(who, alice());
    assert_eq!(
        authn
            .authenticate_header(&format!("Bearer {}", issued.key))
            .unwrap(),
        alice()
    );

    let mut wrong_secret = issued.key.clone();
    wrong_secret.pop();
    wrong_secret.push('x');
    for (case, key) in [
        ("wrong secret", wrong_secret.as_str()),
        ("unknown id", other.key.as_str()),
        ("not a key", "hello"),
        ("empty", ""),
        ("prefix only", "sbk_"),
    ] {
        assert_unauthenticated(authn.authenticate(Credential::ApiKey(key)), case);
    }
    assert!(!format!("{:?}", Credential::ApiKey(&issued.key)).contains(&issued.key));

    // Revoke: a new snapshot marks the key revoked; no restart.
    let mut revoked = issued.config.clone();
    revoked.revoked = true;
    handle.publish(snapshot(AuthConfig {
        api_keys: vec![revoked],
        ..AuthConfig::default()
    }));
    assert_unauthenticated(
        authn.authenticate(Credential::ApiKey(&issued.key)),
        "revoked",
    );

    // Removing it entirely works the same.
    handle.publish(snapshot(AuthConfig::default()));
    assert_unauthenticated(
        authn.authenticate(Credential::ApiKey(&issued.key)),
        "removed",
    );
}

fn hs_issuer(tenant: Option<&str>) -> JwtIssuerConfig {
    JwtIssuerConfig {
        issuer: "https://idp.example".into(),
        audience: vec!["soulbase".into()],
        keys: vec![JwtKeyConfig {
            kid: None,
            alg: JwtAlgorithm::HS256,
            secret_env: Some(SECRET_VAR.into()),
            public_key_pem: None,
        }],
        jwks_file: None,
        tenant: tenant.map(str::to_owned),
        tenant_claim: "tenant".into(),
        leeway_s: 0,
    }
}

fn claims(over: Value) -> Value {
    let mut c = json!({
        "iss": "https://idp.example",
        "aud": "soulbase",
        "sub": "alice",
        "tenant": "acme",
        "exp": now() + 300,
        "nbf": now() - 10,
        "roles": ["agent"],
        "scope": "tools:invoke",
    });
    for (k, v) in over.as_object().unwrap() {
        if v.is_null() {
            c.as_object_mut().unwrap().remove(k);
        } else {
            c[k] = v.clone();
        }
    }
    c
}

fn hs_token(claims: &Value, secret: &str) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

fn set_secret() {
    // SAFETY-free: edition 2024 makes set_var unsafe; tests use a dedicated variable.
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var(SECRET_VAR, SECRET);
    }
}

#[test]
fn hs256_tokens_are_checked_for_signature_issuer_audience_and_time() {
    set_secret();
    let authn = Authenticator::new(&AuthConfig {
        jwt: vec![hs_issuer(None)],
        ..AuthConfig::default()
    })
    .unwrap();
    let good = hs_token(&claims(json!({})), SECRET);
    assert_eq!(
        authn.authenticate(Credential::Bearer(&good)).unwrap(),
        alice()
    );
    assert_eq!(
        authn
            .authenticate_header(&format!("Bearer {good}"))
            .unwrap(),
        alice()
    );

    let b64 = |v: &Value| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
    };
    let alg_none = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&claims(json!({})))
    );
    let mut tampered_parts: Vec<String> = good.split('.').map(str::to_owned).collect();
    tampered_parts[1] = b64(&claims(json!({"tenant": "beta"})));
    let tampered = tampered_parts.join(".");
    let cases = [
        (
            "forged",
            hs_token(&claims(json!({})), "another-secret-that-is-long-enough!!"),
        ),
        (
            "expired",
            hs_token(&claims(json!({"exp": now() - 60})), SECRET),
        ),
        (
            "not yet valid",
            hs_token(&claims(json!({"nbf": now() + 600})), SECRET),
        ),
        (
            "wrong audience",
            hs_token(&claims(json!({"aud": "other"})), SECRET),
        ),
        (
            "wrong issuer",
            hs_token(&claims(json!({"iss": "https://evil"})), SECRET),
        ),
        ("no exp", hs_token(&claims(json!({"exp": null})), SECRET)),
        (
            "no tenant",
            hs_token(&claims(json!({"tenant": null})), SECRET),
        ),
        (
            "bad tenant",
            hs_token(&claims(json!({"tenant": "no spaces allowed"})), SECRET),
        ),
        ("alg none", alg_none),
        ("tampered payload", tampered),
        ("garbage", "a.b.c".to_owned()),
    ];
    for (case, token) in &cases {
        assert_unauthenticated(authn.authenticate(Credential::Bearer(token)), case);
    }
    assert_unauthenticated(authn.authenticate_header("Basic abc"), "other scheme");
    assert_unauthenticated(authn.authenticate_header("Bearer "), "empty bearer");
}

#[test]
fn a_tenant_bound_issuer_cannot_mint_subjects_of_other_tenants() {
    set_secret();
    let authn = Authenticator::new(&AuthConfig {
        jwt: vec![hs_issuer(Some("acme"))],
        ..AuthConfig::default()
    })
    .unwrap();
    let no_claim = hs_token(&claims(json!({"tenant": null})), SECRET);
    assert_eq!(
        authn
            .authenticate(Credential::Bearer(&no_claim))
            .unwrap()
            .tenant
            .as_str(),
        "acme"
    );
    let other = hs_token(&claims(json!({"tenant": "beta"})), SECRET);
    assert_unauthenticated(
        authn.authenticate(Credential::Bearer(&other)),
        "other tenant",
    );
}

struct EcKey {
    pem_private: String,
    pem_public: String,
    x: String,
    y: String,
}

fn ec_key(seed: u8) -> EcKey {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let signing = SigningKey::from_slice(&[seed; 32]).unwrap();
    let verifying = signing.verifying_key();
    let point = verifying.to_encoded_point(false);
    EcKey {
        pem_private: signing.to_pkcs8_pem(LineEnding::LF).unwrap().to_string(),
        pem_public: verifying.to_public_key_pem(LineEnding::LF).unwrap(),
        x: b64.encode(point.x().unwrap()),
        y: b64.encode(point.y().unwrap()),
    }
}

fn es_token(claims: &Value, key: &EcKey, kid: Option<&str>) -> String {
    let mut header = Header::new(Algorithm::ES256);
    header.kid = kid.map(str::to_owned);
    encode(
        &header,
        claims,
        &EncodingKey::from_ec_pem(key.pem_private.as_bytes()).unwrap(),
    )
    .unwrap()
}

#[test]
fn es256_keys_from_pem_verify_and_refuse_other_keys() {
    let key = ec_key(7);
    let other = ec_key(9);
    let authn = Authenticator::new(&AuthConfig {
        jwt: vec![JwtIssuerConfig {
            keys: vec![JwtKeyConfig {
                kid: None,
                alg: JwtAlgorithm::ES256,
                secret_env: None,
                public_key_pem: Some(key.pem_public.clone()),
            }],
            ..hs_issuer(None)
        }],
        ..AuthConfig::default()
    })
    .unwrap();
    let good = es_token(&claims(json!({})), &key, None);
    assert_eq!(
        authn.authenticate(Credential::Bearer(&good)).unwrap(),
        alice()
    );
    let forged = es_token(&claims(json!({})), &other, None);
    assert_unauthenticated(authn.authenticate(Credential::Bearer(&forged)), "other key");
    // An HS256 token "signed" with the public key as secret (key confusion) is refused.
    let confused = hs_token(&claims(json!({})), &key.pem_public);
    assert_unauthenticated(
        authn.authenticate(Credential::Bearer(&confused)),
        "alg confusion",
    );
}

fn write_jwks(path: &std::path::Path, key: &EcKey, kid: &str) {
    let jwks = json!({"keys": [{
        "kty": "EC", "crv": "P-256", "x": key.x, "y": key.y, "kid": kid, "use": "sig", "alg": "ES256"
    }]});
    std::fs::write(path, serde_json::to_vec(&jwks).unwrap()).unwrap();
}

#[test]
fn jwks_files_rotate_on_reload() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    let (k1, k2) = (ec_key(3), ec_key(4));
    write_jwks(&jwks, &k1, "k1");
    let handle = ConfigHandle::new(snapshot(AuthConfig {
        jwt: vec![JwtIssuerConfig {
            keys: vec![],
            jwks_file: Some(jwks.clone()),
            ..hs_issuer(None)
        }],
        ..AuthConfig::default()
    }));
    let authn = Authenticator::follow(handle).unwrap();
    let t1 = es_token(&claims(json!({})), &k1, Some("k1"));
    let t2 = es_token(&claims(json!({})), &k2, Some("k2"));
    assert!(authn.authenticate(Credential::Bearer(&t1)).is_ok());
    assert_unauthenticated(
        authn.authenticate(Credential::Bearer(&t2)),
        "not yet rotated",
    );

    write_jwks(&jwks, &k2, "k2");
    authn.reload().unwrap();
    assert!(authn.authenticate(Credential::Bearer(&t2)).is_ok());
    assert_unauthenticated(authn.authenticate(Credential::Bearer(&t1)), "rotated out");

    std::fs::write(&jwks, "not json").unwrap();
    let err = authn.reload().unwrap_err();
    assert_eq!(err.code(), ErrorCode::ConfigInvalid);
    assert_eq!(err.field("field"), Some("auth.jwt[0].jwks_file"));
    assert!(
        authn.authenticate(Credential::Bearer(&t2)).is_ok(),
        "kept the last good keys"
    );
}

#[test]
fn configuration_problems_name_their_field() {
    let mut c = Config::default();
    c.auth.api_keys.push(soulbase_config::ApiKeyConfig {
        id: "bad id".into(),
        sha256: "abc".into(),
        tenant: "acme".into(),
        actor: "alice".into(),
        roles: vec![],
        scopes: vec![],
        revoked: false,
    });
    let mut iss = hs_issuer(None);
    iss.audience.clear();
    iss.keys[0].secret_env = None;
    c.auth.jwt.push(iss);
    let fields: Vec<String> = c.validate().into_iter().map(|(f, _)| f).collect();
    for want in [
        "auth.api_keys[0].id",
        "auth.api_keys[0].sha256",
        "auth.jwt[0].audience",
        "auth.jwt[0].keys[0].secret_env",
    ] {
        assert!(fields.iter().any(|f| f == want), "{want} in {fields:?}");
    }
    let missing_env = Authenticator::new(&AuthConfig {
        jwt: vec![JwtIssuerConfig {
            keys: vec![JwtKeyConfig {
                kid: None,
                alg: JwtAlgorithm::HS256,
                secret_env: Some("SOULBASE_TEST_AUTHN_UNSET_VAR".into()),
                public_key_pem: None,
            }],
            ..hs_issuer(None)
        }],
        ..AuthConfig::default()
    })
    .err()
    .unwrap();
    assert_eq!(missing_env.code(), ErrorCode::ConfigInvalid);
    assert_eq!(
        missing_env.field("field"),
        Some("auth.jwt[0].keys[0].secret_env")
    );
}

#[test]
fn the_auth_section_refuses_unknown_fields() {
    let ok: AuthConfig = serde_json::from_value(json!({
        "api_keys": [{"id": "k", "sha256": "00", "tenant": "acme", "actor": "a"}],
        "jwt": [{"issuer": "i", "audience": ["a"], "keys": [{"alg": "ES256", "public_key_pem": "x"}]}],
        "cedar": {"policies": "permit(principal, action, resource);"}
    }))
    .unwrap();
    assert_eq!(ok.jwt[0].tenant_claim, "tenant");
    assert_eq!(ok.jwt[0].leeway_s, 30);
    for bad in [
        json!({"api_key": []}),
        json!({"api_keys": [{"id": "k", "sha256": "00", "tenant": "t", "actor": "a", "secret": "x"}]}),
        json!({"jwt": [{"issuer": "i", "audience": ["a"], "keys": [{"alg": "none"}]}]}),
        json!({"cedar": {"policy": "x"}}),
    ] {
        assert!(
            serde_json::from_value::<AuthConfig>(bad.clone()).is_err(),
            "{bad}"
        );
    }
}

const RSA_A: &str = include_str!("fixtures/rsa_test_a.pem");
const RSA_A_PUB: &str = include_str!("fixtures/rsa_test_a.pub.pem");
const RSA_B: &str = include_str!("fixtures/rsa_test_b.pem");

fn rs_token(claims: &Value, private_pem: &str) -> String {
    encode(
        &Header::new(Algorithm::RS256),
        claims,
        &EncodingKey::from_rsa_pem(private_pem.as_bytes()).unwrap(),
    )
    .unwrap()
}

#[test]
fn rs256_keys_from_pem_verify_and_refuse_other_keys() {
    let authn = Authenticator::new(&AuthConfig {
        jwt: vec![JwtIssuerConfig {
            keys: vec![JwtKeyConfig {
                kid: None,
                alg: JwtAlgorithm::RS256,
                secret_env: None,
                public_key_pem: Some(RSA_A_PUB.to_owned()),
            }],
            ..hs_issuer(None)
        }],
        ..AuthConfig::default()
    })
    .unwrap();
    let good = rs_token(&claims(json!({})), RSA_A);
    assert_eq!(
        authn.authenticate(Credential::Bearer(&good)).unwrap(),
        alice()
    );
    let forged = rs_token(&claims(json!({})), RSA_B);
    assert_unauthenticated(authn.authenticate(Credential::Bearer(&forged)), "other key");
    let expired = rs_token(&claims(json!({"exp": now() - 600})), RSA_A);
    assert_unauthenticated(authn.authenticate(Credential::Bearer(&expired)), "expired");
    let wrong_audience = rs_token(&claims(json!({"aud": "someone-else"})), RSA_A);
    assert_unauthenticated(
        authn.authenticate(Credential::Bearer(&wrong_audience)),
        "wrong audience",
    );
    // Key confusion: an HS256 token "signed" with the RSA public key as the secret.
    let confused = hs_token(&claims(json!({})), RSA_A_PUB);
    assert_unauthenticated(
        authn.authenticate(Credential::Bearer(&confused)),
        "alg confusion",
    );
}
