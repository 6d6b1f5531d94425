//! Authentication: API keys and JWT bearer tokens → a [`Subject`].

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use soulbase_config::{AuthConfig, ConfigHandle};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::Subject;

use crate::apikey::{API_KEY_PREFIX, ApiKeyStore};
use crate::jwt::JwtVerifier;

/// A credential as presented by a caller.
#[derive(Clone, Copy)]
pub enum Credential<'a> {
    /// An API key `sbk_<id>_<secret>` (e.g. from an `X-Api-Key` header).
    ApiKey(&'a str),
    /// A JWT (e.g. from `Authorization: Bearer <token>`).
    Bearer(&'a str),
}

impl std::fmt::Debug for Credential<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        match self {
            Credential::ApiKey(_) => f.write_str("ApiKey(<redacted>)"),
            Credential::Bearer(_) => f.write_str("Bearer(<redacted>)"),
        }
    }
}

impl<'a> Credential<'a> {
    /// Reads an `Authorization` header value: `Bearer <jwt>`, or `Bearer sbk_…` /
    /// `ApiKey sbk_…` for an API key. `None` when it is neither.
    pub fn from_authorization(value: &'a str) -> Option<Self> {
        let (scheme, rest) = value.trim().split_once(' ')?;
        let rest = rest.trim();
        if rest.is_empty() {
            return None;
        }
        if scheme.eq_ignore_ascii_case("bearer") {
            Some(if rest.starts_with(API_KEY_PREFIX) {
                Credential::ApiKey(rest)
            } else {
                Credential::Bearer(rest)
            })
        } else if scheme.eq_ignore_ascii_case("apikey") {
            Some(Credential::ApiKey(rest))
        } else {
            None
        }
    }
}

struct Compiled {
    config_hash: String,
    keys: Arc<ApiKeyStore>,
    jwt: Arc<JwtVerifier>,
}

fn compile(config: &AuthConfig, config_hash: String) -> Result<Compiled, SoulError> {
    Ok(Compiled {
        config_hash,
        keys: Arc::new(ApiKeyStore::new(&config.api_keys)),
        jwt: Arc::new(JwtVerifier::new(&config.jwt)?),
    })
}

/// The one refusal: it never says whether the key was unknown, revoked, malformed, or
/// the token expired, forged or for another audience.
fn unauthenticated() -> SoulError {
    SoulError::of(ErrorCode::AuthUnauthenticated)
}

/// Turns credentials into subjects. Bound to a [`ConfigHandle`] it picks up each new
/// configuration snapshot on the next call: a key removed or marked `revoked` stops
/// working without a restart, and JWT keys (inline or JWKS files) rotate. A snapshot
/// whose keys fail to load is refused (logged) and the previous keys stay.
pub struct Authenticator {
    compiled: ArcSwap<Compiled>,
    handle: Option<ConfigHandle>,
    reload: Mutex<()>,
}

impl Authenticator {
    /// An authenticator for a fixed `auth` section.
    pub fn new(config: &AuthConfig) -> Result<Self, SoulError> {
        Ok(Self {
            compiled: ArcSwap::from_pointee(compile(config, String::new())?),
            handle: None,
            reload: Mutex::new(()),
        })
    }

    /// An authenticator following `handle`'s `auth` section.
    pub fn follow(handle: ConfigHandle) -> Result<Self, SoulError> {
        let snap = handle.current();
        let compiled = compile(&snap.config().auth, snap.hash().to_owned())?;
        Ok(Self {
            compiled: ArcSwap::from_pointee(compiled),
            handle: Some(handle),
            reload: Mutex::new(()),
        })
    }

    fn current(&self) -> Arc<Compiled> {
        let compiled = self.compiled.load_full();
        let Some(handle) = &self.handle else {
            return compiled;
        };
        let snap = handle.current();
        if snap.hash() == compiled.config_hash {
            return compiled;
        }
        if let Ok(_guard) = self.reload.lock()
            && self.compiled.load().config_hash != snap.hash()
        {
            match compile(&snap.config().auth, snap.hash().to_owned()) {
                Ok(next) => self.compiled.store(Arc::new(next)),
                Err(e) => {
                    tracing::warn!(
                        error = %e.audit().causes.join("; "),
                        "auth keys rejected; keeping the previous ones"
                    );
                    // Keep serving the old keys; stop retrying this snapshot.
                    let old = self.compiled.load_full();
                    self.compiled.store(Arc::new(Compiled {
                        config_hash: snap.hash().to_owned(),
                        keys: old.keys.clone(),
                        jwt: old.jwt.clone(),
                    }));
                }
            }
        }
        self.compiled.load_full()
    }

    /// Re-reads keys now (environment secrets and JWKS files included), e.g. after a
    /// JWKS file was rotated without the configuration changing, or on SIGHUP. On error
    /// the current keys stay and the error is returned.
    pub fn reload(&self) -> Result<(), SoulError> {
        let Some(handle) = &self.handle else {
            return Ok(());
        };
        let snap = handle.current();
        let next = compile(&snap.config().auth, snap.hash().to_owned())?;
        self.compiled.store(Arc::new(next));
        Ok(())
    }

    /// Replaces the `auth` section of an authenticator that follows no handle.
    pub fn update(&self, config: &AuthConfig) -> Result<(), SoulError> {
        let next = compile(config, self.compiled.load().config_hash.clone())?;
        self.compiled.store(Arc::new(next));
        Ok(())
    }

    /// The subject of `credential`, or `AUTH.UNAUTHENTICATED`.
    pub fn authenticate(&self, credential: Credential<'_>) -> Result<Subject, SoulError> {
        let compiled = self.current();
        let subject = match credential {
            Credential::ApiKey(key) => compiled.keys.verify(key),
            Credential::Bearer(token) => compiled.jwt.verify(token),
        };
        subject.ok_or_else(unauthenticated)
    }

    /// The subject of an `Authorization` header value, or `AUTH.UNAUTHENTICATED`.
    pub fn authenticate_header(&self, authorization: &str) -> Result<Subject, SoulError> {
        let credential =
            Credential::from_authorization(authorization).ok_or_else(unauthenticated)?;
        self.authenticate(credential)
    }
}
