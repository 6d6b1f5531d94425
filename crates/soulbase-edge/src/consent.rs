//! The consent desk every surface issues and revokes consent through: HTTP
//! (`POST /api/consent`), gRPC (`Consent.Issue`), the CLI through either, and MCP
//! elicitation. It turns a request as a client sends it ([`ConsentAsk`]: ids as
//! strings, arguments as JSON) into one for [`ConsentService`], after finding the
//! tool as the approver's tenant sees it (its owner for the policy question, its
//! manifest's `consent.ttl_ms` for the lifetime).

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;
use soulbase_auth::{Authorizer, ConsentService, IssueConsent, IssuedConsent};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::{canonical_json, digest_bytes};
use soulbase_tools::Registry;
use soulbase_types::{ActorId, Subject, TenantId, ToolId, UnixMillis};

use crate::CallObserver;

/// A request for consent, as clients send it.
#[derive(Debug, Clone, Default)]
pub struct ConsentAsk {
    /// The tool consented to (`group.pkg.name`).
    pub tool: String,
    /// The actor allowed to make the call; the approver when `None`.
    pub actor: Option<String>,
    /// When given, the consent covers only calls with exactly these arguments.
    pub args: Option<Value>,
    /// The lifetime asked for, in milliseconds; the server's default when `None`.
    pub ttl_ms: Option<u64>,
}

/// Issues and revokes consent for callers of any surface (see the module docs).
#[derive(Clone)]
pub struct ConsentDesk {
    registry: Registry,
    service: Arc<ConsentService>,
    authorizer: Arc<dyn Authorizer>,
    observer: Arc<dyn CallObserver>,
}

impl std::fmt::Debug for ConsentDesk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsentDesk").finish_non_exhaustive()
    }
}

fn invalid(field: &str, message: String) -> SoulError {
    SoulError::new(ErrorCode::SchemaValidationFailed, message).with_field("field", field)
}

impl ConsentDesk {
    /// A desk over the registry, the consent service and the authorizer; each
    /// token issued is counted by `observer`.
    pub fn new(
        registry: Registry,
        service: Arc<ConsentService>,
        authorizer: Arc<dyn Authorizer>,
        observer: Arc<dyn CallObserver>,
    ) -> Self {
        Self {
            registry,
            service,
            authorizer,
            observer,
        }
    }

    /// Issues a token for `approver`'s tenant (see [`ConsentService::issue`]).
    /// A tool the approver's tenant cannot see is `TOOL.NOT_FOUND`.
    pub async fn issue(
        &self,
        approver: &Subject,
        ask: ConsentAsk,
    ) -> Result<IssuedConsent, SoulError> {
        let tool = ToolId::new(ask.tool.as_str())
            .map_err(|e| invalid("tool", format!("not a tool id: {}", e.reason)))?;
        let actor = ask
            .actor
            .filter(|a| !a.is_empty())
            .map(|a| {
                ActorId::new(a.as_str())
                    .map_err(|e| invalid("actor", format!("not an actor id: {}", e.reason)))
            })
            .transpose()?;
        let args_digest = match ask.args {
            None => None,
            Some(v @ Value::Object(_)) => Some(digest_bytes(&canonical_json(&v))),
            Some(_) => {
                return Err(invalid(
                    "args",
                    "the arguments must be a JSON object".into(),
                ));
            }
        };
        let found = self.registry.get(&approver.tenant, &tool)?;
        let issued = self
            .service
            .issue(
                self.authorizer.as_ref(),
                approver,
                IssueConsent {
                    tool,
                    tool_tenant: found.owner.tenant_id().cloned(),
                    tool_ttl_ms: found.tool.manifest.consent.ttl_ms,
                    actor,
                    args_digest,
                    ttl_ms: ask.ttl_ms,
                },
                UnixMillis::now(),
            )
            .await?;
        self.observer.consent_issued();
        Ok(issued)
    }

    /// Revokes token `id` (see [`ConsentService::revoke`]).
    pub async fn revoke(&self, approver: &Subject, id: &str) -> Result<(), SoulError> {
        self.service
            .revoke(self.authorizer.as_ref(), approver, id, UnixMillis::now())
            .await
    }
}

/// The answer to an issue, as HTTP (`201` of `POST /api/consent`) and the CLI's
/// `--json` print it: the token and what it grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[schemars(rename = "IssuedConsent", deny_unknown_fields)]
pub struct IssuedView {
    /// The token to send as the `x-soulbase-consent` header.
    pub token: String,
    /// The token id, for revocation (`null` only for tokens minted before ids
    /// existed).
    pub id: Option<String>,
    /// The tool consented to (`null` for a grant by scope).
    pub tool: Option<ToolId>,
    /// The consenting tenant.
    pub tenant: TenantId,
    /// The actor allowed to make the call.
    pub actor: ActorId,
    /// The digest of the arguments it is bound to, if any.
    pub args_digest: Option<String>,
    /// When it was issued (Unix milliseconds).
    pub issued_at: Option<UnixMillis>,
    /// When it expires (Unix milliseconds).
    pub expires_at: UnixMillis,
}

impl From<&IssuedConsent> for IssuedView {
    fn from(issued: &IssuedConsent) -> Self {
        let g = &issued.grant;
        IssuedView {
            token: issued.token.clone(),
            id: g.id.clone(),
            tool: g.tool.clone(),
            tenant: g.tenant.clone(),
            actor: g.actor.clone(),
            args_digest: g.args_digest.clone(),
            issued_at: g.issued_at,
            expires_at: g.expires_at,
        }
    }
}

/// The JSON answer of an issue ([`IssuedView`]).
pub fn issued_json(issued: &IssuedConsent) -> Value {
    serde_json::to_value(IssuedView::from(issued)).unwrap_or(Value::Null)
}
