#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Settings of a trusted JWT issuer (`auth.jwt[]`) and their effect on which
//! tokens authenticate, for the keys `authn.rs` does not vary: `leeway_s`,
//! `tenant_claim` and a key's `kid` (issue 32: every configuration key acts).

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use p256::ecdsa::SigningKey;
use p256::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
use serde_json::{Value, json};
use soulbase_auth::{Authenticator, Credential};
use soulbase_config::{AuthConfig, JwtAlgorithm, JwtIssuerConfig, JwtKeyConfig};

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A P-256 key pair as PEM: (private, public).
fn ec_key(seed: u8) -> (String, String) {
    let signing = SigningKey::from_slice(&[seed; 32]).unwrap();
    (
        signing.to_pkcs8_pem(LineEnding::LF).unwrap().to_string(),
        signing
            .verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .unwrap(),
    )
}

fn es256(public_pem: &str, kid: Option<&str>) -> JwtKeyConfig {
    JwtKeyConfig {
        kid: kid.map(str::to_owned),
        alg: JwtAlgorithm::ES256,
        secret_env: None,
        public_key_pem: Some(public_pem.to_owned()),
    }
}

/// An issuer trusting `keys`, its other settings as given.
fn issuer(keys: Vec<JwtKeyConfig>, leeway_s: u64, tenant_claim: &str) -> JwtIssuerConfig {
    JwtIssuerConfig {
        issuer: "https://idp.example".into(),
        audience: vec!["soulbase".into()],
        keys,
        jwks_file: None,
        tenant: None,
        tenant_claim: tenant_claim.into(),
        leeway_s,
    }
}

fn authenticator(iss: JwtIssuerConfig) -> Authenticator {
    Authenticator::new(&AuthConfig {
        jwt: vec![iss],
        ..AuthConfig::default()
    })
    .unwrap()
}

/// Claims of alice of acme valid for five minutes, with `over` applied (a null
/// removes the claim).
fn claims(over: Value) -> Value {
    let mut c = json!({
        "iss": "https://idp.example", "aud": "soulbase", "sub": "alice", "tenant": "acme",
        "exp": now() + 300, "nbf": now() - 10,
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

fn token(claims: &Value, private_pem: &str, kid: Option<&str>) -> String {
    let mut header = Header::new(Algorithm::ES256);
    header.kid = kid.map(str::to_owned);
    encode(
        &header,
        claims,
        &EncodingKey::from_ec_pem(private_pem.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// `leeway_s`: a token expired 20 s ago passes with 60 s of leeway and not with
/// none (one expired 120 s ago passes neither).
#[test]
fn leeway_s_tolerates_that_much_clock_skew() {
    let (private, public) = ec_key(5);
    let late = token(&claims(json!({"exp": now() - 20})), &private, None);
    let later = token(&claims(json!({"exp": now() - 120})), &private, None);
    let lenient = authenticator(issuer(vec![es256(&public, None)], 60, "tenant"));
    assert!(lenient.authenticate(Credential::Bearer(&late)).is_ok());
    assert!(lenient.authenticate(Credential::Bearer(&later)).is_err());
    let strict = authenticator(issuer(vec![es256(&public, None)], 0, "tenant"));
    assert!(strict.authenticate(Credential::Bearer(&late)).is_err());
}

/// `tenant_claim`: the tenant is read from the claim it names (and a token
/// carrying the tenant only in the default claim has none).
#[test]
fn tenant_claim_names_the_claim_carrying_the_tenant() {
    let (private, public) = ec_key(6);
    let org = token(
        &claims(json!({"tenant": null, "org": "globex"})),
        &private,
        None,
    );
    let plain = token(&claims(json!({})), &private, None);
    let by_org = authenticator(issuer(vec![es256(&public, None)], 0, "org"));
    let who = by_org.authenticate(Credential::Bearer(&org)).unwrap();
    assert_eq!(who.tenant.as_str(), "globex");
    assert!(by_org.authenticate(Credential::Bearer(&plain)).is_err());
    let by_default = authenticator(issuer(vec![es256(&public, None)], 0, "tenant"));
    assert!(by_default.authenticate(Credential::Bearer(&org)).is_err());
    assert_eq!(
        by_default
            .authenticate(Credential::Bearer(&plain))
            .unwrap()
            .tenant
            .as_str(),
        "acme"
    );
}

/// A key's `kid`: a token naming a key id is checked against that key only — a
/// token signed with key A but naming B's id is refused, though A is trusted;
/// without ids on the keys the same token passes.
#[test]
fn kid_picks_the_key_a_token_names() {
    let (a_private, a_public) = ec_key(7);
    let (_, b_public) = ec_key(8);
    let names_a = token(&claims(json!({})), &a_private, Some("a"));
    let names_b = token(&claims(json!({})), &a_private, Some("b"));
    let with_ids = authenticator(issuer(
        vec![es256(&a_public, Some("a")), es256(&b_public, Some("b"))],
        0,
        "tenant",
    ));
    assert!(with_ids.authenticate(Credential::Bearer(&names_a)).is_ok());
    assert!(with_ids.authenticate(Credential::Bearer(&names_b)).is_err());
    let without_ids = authenticator(issuer(
        vec![es256(&a_public, None), es256(&b_public, None)],
        0,
        "tenant",
    ));
    assert!(
        without_ids
            .authenticate(Credential::Bearer(&names_b))
            .is_ok()
    );
}
