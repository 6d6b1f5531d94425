//! JWT bearer tokens (HS256, RS256, ES256) from configured issuers.
//!
//! A token is accepted only when its header names an algorithm a configured key of
//! some issuer verifies (`alg: none` is never one), its signature verifies with that
//! key, and `iss`, `aud`, `exp` and `nbf` check out (with the issuer's leeway). `exp`,
//! `iss`, `aud` and `sub` are required. The tenant comes from the issuer's binding or
//! from its tenant claim; roles from `roles` (array), scopes from `scope` (space
//! separated) or `scp` (array).

use std::collections::HashMap;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use serde::Deserialize;
use soulbase_config::{JwtAlgorithm, JwtIssuerConfig};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{ActorId, Subject, TenantId};

struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

struct Issuer {
    keys: Vec<Key>,
    validations: HashMap<Algorithm, Validation>,
    tenant: Option<TenantId>,
    tenant_claim: String,
}

/// The verifiers of every configured issuer.
#[derive(Default)]
pub(crate) struct JwtVerifier {
    issuers: Vec<Issuer>,
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    #[serde(default)]
    roles: Vec<String>,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    scp: Vec<String>,
    #[serde(flatten)]
    extra: HashMap<String, serde_json::Value>,
}

fn bad(field: String, note: impl Into<String>) -> SoulError {
    SoulError::new(ErrorCode::ConfigInvalid, "a JWT key is invalid")
        .with_field("field", field)
        .with_note(note.into())
}

fn algorithm(a: JwtAlgorithm) -> Algorithm {
    match a {
        JwtAlgorithm::HS256 => Algorithm::HS256,
        JwtAlgorithm::RS256 => Algorithm::RS256,
        JwtAlgorithm::ES256 => Algorithm::ES256,
    }
}

fn jwks_keys(i: usize, path: &std::path::Path) -> Result<Vec<Key>, SoulError> {
    let field = format!("auth.jwt[{i}].jwks_file");
    let text = std::fs::read_to_string(path)
        .map_err(|e| bad(field.clone(), format!("{}: {e}", path.display())))?;
    let set: JwkSet = serde_json::from_str(&text)
        .map_err(|e| bad(field.clone(), format!("{}: {e}", path.display())))?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        let alg = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Algorithm::RS256,
            AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
                Algorithm::ES256
            }
            // Other key types are not accepted; skip them rather than fail the set.
            _ => continue,
        };
        let key = DecodingKey::from_jwk(jwk).map_err(|e| bad(field.clone(), e.to_string()))?;
        keys.push(Key {
            kid: jwk.common.key_id.clone(),
            alg,
            key,
        });
    }
    Ok(keys)
}

impl JwtVerifier {
    /// Compiles `auth.jwt`, reading secrets from the environment and JWKS files.
    pub(crate) fn new(issuers: &[JwtIssuerConfig]) -> Result<Self, SoulError> {
        let mut out = Vec::new();
        for (i, iss) in issuers.iter().enumerate() {
            let mut keys = Vec::new();
            for (j, k) in iss.keys.iter().enumerate() {
                let field = format!("auth.jwt[{i}].keys[{j}]");
                let alg = algorithm(k.alg);
                let key = match k.alg {
                    JwtAlgorithm::HS256 => {
                        let var = k.secret_env.as_deref().unwrap_or_default();
                        let secret = std::env::var(var).map_err(|_| {
                            bad(
                                format!("{field}.secret_env"),
                                format!("environment variable {var} is not set"),
                            )
                        })?;
                        if secret.len() < 32 {
                            return Err(bad(
                                format!("{field}.secret_env"),
                                "an HS256 secret must be at least 32 bytes",
                            ));
                        }
                        DecodingKey::from_secret(secret.as_bytes())
                    }
                    JwtAlgorithm::RS256 => DecodingKey::from_rsa_pem(
                        k.public_key_pem.as_deref().unwrap_or_default().as_bytes(),
                    )
                    .map_err(|e| bad(format!("{field}.public_key_pem"), e.to_string()))?,
                    JwtAlgorithm::ES256 => DecodingKey::from_ec_pem(
                        k.public_key_pem.as_deref().unwrap_or_default().as_bytes(),
                    )
                    .map_err(|e| bad(format!("{field}.public_key_pem"), e.to_string()))?,
                };
                keys.push(Key {
                    kid: k.kid.clone(),
                    alg,
                    key,
                });
            }
            if let Some(path) = &iss.jwks_file {
                keys.extend(jwks_keys(i, path)?);
            }
            let mut validations = HashMap::new();
            for k in &keys {
                validations.entry(k.alg).or_insert_with(|| {
                    let mut v = Validation::new(k.alg);
                    v.algorithms = vec![k.alg];
                    v.set_issuer(&[iss.issuer.as_str()]);
                    v.set_audience(&iss.audience);
                    v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
                    v.validate_nbf = true;
                    v.leeway = iss.leeway_s;
                    v
                });
            }
            let tenant = match &iss.tenant {
                Some(t) => Some(
                    TenantId::new(t.as_str())
                        .map_err(|e| bad(format!("auth.jwt[{i}].tenant"), e.to_string()))?,
                ),
                None => None,
            };
            out.push(Issuer {
                keys,
                validations,
                tenant,
                tenant_claim: iss.tenant_claim.clone(),
            });
        }
        Ok(Self { issuers: out })
    }

    /// The subject of a valid token, or `None` (callers answer `AUTH.UNAUTHENTICATED`
    /// without saying which check failed).
    pub(crate) fn verify(&self, token: &str) -> Option<Subject> {
        let header = decode_header(token).ok()?;
        for iss in &self.issuers {
            for k in iss.keys.iter().filter(|k| k.alg == header.alg) {
                if let (Some(want), Some(got)) = (&k.kid, &header.kid)
                    && want != got
                {
                    continue;
                }
                let Some(validation) = iss.validations.get(&k.alg) else {
                    continue;
                };
                let Ok(data) = decode::<Claims>(token, &k.key, validation) else {
                    continue;
                };
                return subject_of(iss, data.claims);
            }
        }
        None
    }
}

fn subject_of(iss: &Issuer, claims: Claims) -> Option<Subject> {
    let tenant = match &iss.tenant {
        Some(bound) => {
            // A token of a tenant-bound issuer may not claim another tenant.
            if let Some(claimed) = claims.extra.get(&iss.tenant_claim)
                && claimed.as_str() != Some(bound.as_str())
            {
                return None;
            }
            bound.clone()
        }
        None => TenantId::new(claims.extra.get(&iss.tenant_claim)?.as_str()?).ok()?,
    };
    let mut subject = Subject::new(tenant, ActorId::new(claims.sub).ok()?);
    subject.roles = claims.roles.into_iter().collect();
    subject.scopes = claims
        .scope
        .iter()
        .flat_map(|s| s.split_whitespace().map(str::to_owned))
        .chain(claims.scp)
        .collect();
    Some(subject)
}
