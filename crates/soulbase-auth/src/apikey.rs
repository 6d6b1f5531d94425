//! API keys: `sbk_<id>_<secret>`, stored as SHA-256 digests, compared in constant time.
//!
//! The key id selects the entry; the digest of the whole presented key is compared
//! with the stored one in constant time. Keys are high-entropy (≥ 240 random bits), so
//! a plain SHA-256 is an adequate one-way store. A key never appears in logs, errors
//! or `Debug` output.

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};
use soulbase_config::ApiKeyConfig;
use soulbase_types::{ActorId, Subject, TenantId};

/// The prefix of every API key.
pub const API_KEY_PREFIX: &str = "sbk_";

/// A freshly generated key: give `key` to the client once, store `config` (the digest).
pub struct IssuedApiKey {
    /// The secret key, to be shown once and never stored.
    pub key: String,
    /// The configuration entry (`auth.api_keys[]`) holding only the digest.
    pub config: ApiKeyConfig,
}

impl std::fmt::Debug for IssuedApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedApiKey")
            .field("key", &"<redacted>")
            .field("config", &self.config)
            .finish()
    }
}

/// Lowercase hex SHA-256 of `key`, as stored in `auth.api_keys[].sha256`.
pub fn api_key_digest(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// Generates a key `sbk_<id>_<secret>` for `subject` (244 random bits from the OS RNG).
/// `id` must be letters, digits and `-`.
pub fn generate_api_key(id: &str, subject: &Subject) -> IssuedApiKey {
    let mut secret = Vec::with_capacity(32);
    secret.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    secret.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    let key = format!("{API_KEY_PREFIX}{id}_{}", URL_SAFE_NO_PAD.encode(&secret));
    IssuedApiKey {
        config: ApiKeyConfig {
            id: id.to_owned(),
            sha256: api_key_digest(&key),
            tenant: subject.tenant.to_string(),
            actor: subject.actor.to_string(),
            roles: subject.roles.iter().cloned().collect(),
            scopes: subject.scopes.iter().cloned().collect(),
            revoked: false,
        },
        key,
    }
}

/// Constant-time equality of two equal-length byte strings.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

struct Entry {
    digest: [u8; 32],
    subject: Subject,
}

/// The configured, non-revoked keys, by id.
#[derive(Default)]
pub(crate) struct ApiKeyStore {
    by_id: HashMap<String, Entry>,
}

impl ApiKeyStore {
    /// Compiles `auth.api_keys`; malformed entries are skipped (validation reports them).
    pub(crate) fn new(keys: &[ApiKeyConfig]) -> Self {
        let mut by_id = HashMap::new();
        for k in keys.iter().filter(|k| !k.revoked) {
            let (Ok(tenant), Ok(actor)) = (
                TenantId::new(k.tenant.as_str()),
                ActorId::new(k.actor.as_str()),
            ) else {
                continue;
            };
            let Ok(bytes) = hex::decode(&k.sha256) else {
                continue;
            };
            let Ok(digest) = <[u8; 32]>::try_from(bytes.as_slice()) else {
                continue;
            };
            let mut subject = Subject::new(tenant, actor);
            subject.roles = k.roles.iter().cloned().collect();
            subject.scopes = k.scopes.iter().cloned().collect();
            by_id.insert(k.id.clone(), Entry { digest, subject });
        }
        Self { by_id }
    }

    /// The subject of `key`, if it is a configured, non-revoked key.
    pub(crate) fn verify(&self, key: &str) -> Option<Subject> {
        let rest = key.strip_prefix(API_KEY_PREFIX)?;
        let (id, _secret) = rest.split_once('_')?;
        let presented = Sha256::digest(key.as_bytes());
        match self.by_id.get(id) {
            Some(entry) if ct_eq(&presented, &entry.digest) => Some(entry.subject.clone()),
            Some(_) => None,
            None => {
                // Same work for an unknown id as for a wrong secret.
                let _ = ct_eq(&presented, &[0u8; 32]);
                None
            }
        }
    }
}
