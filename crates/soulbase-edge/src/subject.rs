//! The authentication seam: request metadata → [`Subject`].
//!
//! gRPC metadata and HTTP headers are both an [`http::HeaderMap`], so one resolver
//! serves the gRPC services, the HTTP/JSON API and MCP over HTTP. Credentials:
//! `x-api-key: sbk_<id>_<secret>` or `authorization: Bearer <jwt>`, checked by an
//! in-process [`Authenticator`] (which follows configuration reloads) or by the auth
//! role elsewhere (a [`CredentialCheck`]: `soulbase-grpc`'s `RemoteAuth`, when this
//! process does not serve that role: the keys and JWT settings then live with the
//! auth role only). The development headers
//! `x-soulbase-tenant` / `x-soulbase-actor` are honoured **only** when the resolver
//! was built with `dev_headers = true` (`server.dev_insecure` in configuration),
//! and then a request naming no one may stand for a default development identity
//! (`server.dev_identity`); otherwise a request without valid credentials is
//! `AUTH.UNAUTHENTICATED`.

use std::sync::Arc;

use async_trait::async_trait;
use http::HeaderMap;
use soulbase_auth::{Authenticator, Credential};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{ActorId, Subject, TenantId};

/// Header carrying an API key.
pub const API_KEY_HEADER: &str = "x-api-key";
/// Development-only header naming the tenant.
pub const DEV_TENANT_HEADER: &str = "x-soulbase-tenant";
/// Development-only header naming the actor.
pub const DEV_ACTOR_HEADER: &str = "x-soulbase-actor";

// The identity headers, parsed once (see [`crate::SKILL_HEADER_NAME`]).
static API_KEY: http::HeaderName = http::HeaderName::from_static(API_KEY_HEADER);
static DEV_TENANT: http::HeaderName = http::HeaderName::from_static(DEV_TENANT_HEADER);
static DEV_ACTOR: http::HeaderName = http::HeaderName::from_static(DEV_ACTOR_HEADER);

/// Maps request metadata to the authenticated subject.
///
/// Implementations must answer every refused credential with
/// `AUTH.UNAUTHENTICATED` and never reveal why (unknown key, expired token, …); a
/// checker that cannot be reached is `PROVIDER.UNAVAILABLE`, so a caller is not told
/// its good key is bad during an outage.
#[async_trait]
pub trait SubjectResolver: Send + Sync + 'static {
    /// The subject the request acts for.
    async fn resolve(&self, headers: &HeaderMap) -> Result<Subject, SoulError>;
}

/// Checks a credential somewhere else (the auth role over gRPC). Only a refused
/// credential is `AUTH.UNAUTHENTICATED`; an unreachable checker is an outage.
#[async_trait]
pub trait CredentialCheck: Send + Sync + 'static {
    /// The subject `credential` establishes.
    async fn authenticate(&self, credential: Credential<'_>) -> Result<Subject, SoulError>;
}

/// Where credentials are checked.
enum Checker {
    /// Every credential is refused.
    Nothing,
    /// In this process.
    Local(Arc<Authenticator>),
    /// By the auth role.
    Remote(Arc<dyn CredentialCheck>),
}

/// The standard resolver: API keys and JWTs, plus development headers when enabled.
pub struct MetadataAuth {
    checker: Checker,
    dev_headers: bool,
    /// With `dev_headers`: who a request naming no one is.
    dev_default: Option<Subject>,
}

impl std::fmt::Debug for MetadataAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let checker = match self.checker {
            Checker::Nothing => "nothing",
            Checker::Local(_) => "local",
            Checker::Remote(_) => "remote",
        };
        f.debug_struct("MetadataAuth")
            .field("checker", &checker)
            .field("dev_headers", &self.dev_headers)
            .finish()
    }
}

fn unauthenticated() -> SoulError {
    SoulError::of(ErrorCode::AuthUnauthenticated)
}

impl MetadataAuth {
    /// A resolver checking credentials with `authenticator` (none: every credential
    /// is refused) and, only if `dev_headers`, accepting the development headers.
    pub fn new(authenticator: Option<Arc<Authenticator>>, dev_headers: bool) -> Self {
        Self {
            checker: authenticator.map_or(Checker::Nothing, Checker::Local),
            dev_headers,
            dev_default: None,
        }
    }

    /// A resolver having the auth role check credentials (`Authenticate` over
    /// gRPC, one call per request) and, only if `dev_headers`, accepting the
    /// development headers itself.
    pub fn remote(auth: Arc<dyn CredentialCheck>, dev_headers: bool) -> Self {
        Self {
            checker: Checker::Remote(auth),
            dev_headers,
            dev_default: None,
        }
    }

    /// With the development headers accepted, a request with no credential and
    /// neither header acts as `subject` (`server.dev_identity`), so stock clients
    /// connect without custom headers. Ignored without the development headers.
    pub fn with_dev_default(mut self, subject: Option<Subject>) -> Self {
        self.dev_default = subject.filter(|_| self.dev_headers);
        self
    }

    /// Whether the insecure development headers are accepted.
    pub fn dev_headers(&self) -> bool {
        self.dev_headers
    }

    fn dev_subject(headers: &HeaderMap) -> Result<Subject, SoulError> {
        let get = |name: &http::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
        let (Some(tenant), Some(actor)) = (get(&DEV_TENANT), get(&DEV_ACTOR)) else {
            return Err(unauthenticated());
        };
        let tenant = TenantId::new(tenant).map_err(|e| {
            unauthenticated()
                .with_field("field", DEV_TENANT_HEADER)
                .with_note(e.reason)
        })?;
        let actor = ActorId::new(actor).map_err(|e| {
            unauthenticated()
                .with_field("field", DEV_ACTOR_HEADER)
                .with_note(e.reason)
        })?;
        Ok(Subject::new(tenant, actor))
    }
}

#[async_trait]
impl SubjectResolver for MetadataAuth {
    async fn resolve(&self, headers: &HeaderMap) -> Result<Subject, SoulError> {
        let api_key = headers.get(&API_KEY).and_then(|v| v.to_str().ok());
        // `Authorization: Bearer <jwt>`, or an API key as a bearer token (what
        // OpenAI-style clients send their `api_key` as) or `ApiKey sbk_…`.
        let authorization = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let credential = match api_key {
            Some(k) => Some(Credential::ApiKey(k.trim())),
            None => authorization.and_then(Credential::from_authorization),
        };
        if let Some(credential) = credential {
            return match &self.checker {
                Checker::Nothing => Err(unauthenticated()),
                Checker::Local(authn) => authn.authenticate(credential),
                // Only a refusal is a bad credential; anything else (a reset, a
                // timeout, a wrong endpoint) is the auth role's outage.
                Checker::Remote(auth) => {
                    auth.authenticate(credential)
                        .await
                        .map_err(|e| match e.code() {
                            ErrorCode::AuthUnauthenticated => unauthenticated(),
                            ErrorCode::ProviderUnavailable => e,
                            other => SoulError::new(
                                ErrorCode::ProviderUnavailable,
                                "the auth role could not check the credential",
                            )
                            .with_note(format!(
                                "{}: {}",
                                other.as_str(),
                                e.message()
                            )),
                        })
                }
            };
        }
        if self.dev_headers {
            let named =
                headers.contains_key(DEV_TENANT_HEADER) || headers.contains_key(DEV_ACTOR_HEADER);
            if let (false, Some(default)) = (named, &self.dev_default) {
                return Ok(default.clone());
            }
            return Self::dev_subject(headers);
        }
        Err(unauthenticated())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[tokio::test]
    async fn a_dev_default_identity_stands_for_a_request_naming_no_one() {
        let bob = Subject::new(TenantId::new("acme").unwrap(), ActorId::new("bob").unwrap());
        let auth = MetadataAuth::new(None, true).with_dev_default(Some(bob.clone()));
        assert_eq!(auth.resolve(&HeaderMap::new()).await.unwrap(), bob);
        // Headers still win; half of them is still refused.
        let eve = auth
            .resolve(&headers(&[
                (DEV_TENANT_HEADER, "beta"),
                (DEV_ACTOR_HEADER, "eve"),
            ]))
            .await
            .unwrap();
        assert_eq!(eve.tenant.as_str(), "beta");
        let half = auth.resolve(&headers(&[(DEV_TENANT_HEADER, "beta")])).await;
        assert_eq!(half.unwrap_err().code(), ErrorCode::AuthUnauthenticated);
        // A bad credential is never replaced by the default.
        let bad = auth.resolve(&headers(&[(API_KEY_HEADER, "sbk_x_y")])).await;
        assert_eq!(bad.unwrap_err().code(), ErrorCode::AuthUnauthenticated);
        // Without the development headers there is no default.
        let strict = MetadataAuth::new(None, false).with_dev_default(Some(bob));
        let none = strict.resolve(&HeaderMap::new()).await;
        assert_eq!(none.unwrap_err().code(), ErrorCode::AuthUnauthenticated);
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[tokio::test]
    async fn dev_headers_are_refused_unless_enabled() {
        let h = headers(&[(DEV_TENANT_HEADER, "acme"), (DEV_ACTOR_HEADER, "bob")]);
        let strict = MetadataAuth::new(None, false);
        let err = strict.resolve(&h).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::AuthUnauthenticated);
        let dev = MetadataAuth::new(None, true);
        let s = dev.resolve(&h).await.unwrap();
        assert_eq!(s.tenant.as_str(), "acme");
        assert_eq!(s.actor.as_str(), "bob");
    }

    #[tokio::test]
    async fn missing_or_malformed_dev_headers_are_unauthenticated() {
        let dev = MetadataAuth::new(None, true);
        for h in [
            headers(&[]),
            headers(&[(DEV_TENANT_HEADER, "acme")]),
            headers(&[
                (DEV_TENANT_HEADER, "bad tenant!"),
                (DEV_ACTOR_HEADER, "bob"),
            ]),
        ] {
            assert_eq!(
                dev.resolve(&h).await.unwrap_err().code(),
                ErrorCode::AuthUnauthenticated
            );
        }
    }

    #[tokio::test]
    async fn credentials_without_an_authenticator_are_refused_even_in_dev() {
        let dev = MetadataAuth::new(None, true);
        let h = headers(&[
            (API_KEY_HEADER, "sbk_x_y"),
            (DEV_TENANT_HEADER, "acme"),
            (DEV_ACTOR_HEADER, "bob"),
        ]);
        assert_eq!(
            dev.resolve(&h).await.unwrap_err().code(),
            ErrorCode::AuthUnauthenticated
        );
    }
}
