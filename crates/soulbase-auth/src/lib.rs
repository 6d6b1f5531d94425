//! Who may call what: authorization (deny by default) and consent.
//!
//! Two seams the tools pipeline calls during preflight:
//! - [`Authorizer`]: may this subject perform `action` on `soul:tool:{id}`? The
//!   in-process [`StaticPolicy`] evaluates the `policy.rules` of the configuration:
//!   allowed only when an allow rule matches and no deny rule does; hot-swappable.
//! - [`ConsentVerifier`]: does the call carry a valid consent for this subject, tool and
//!   arguments? [`HmacConsent`] issues and verifies HMAC-SHA256 signed tokens.
//!
//! Tenant isolation is structural: a subject is never authorized for a tool owned by
//! another tenant, whatever the policy says.

mod consent;
mod policy;

use async_trait::async_trait;
use soulbase_errors::SoulError;
use soulbase_types::{Subject, TenantId, ToolId};

pub use consent::{ConsentGrant, ConsentRequest, ConsentVerifier, HmacConsent};
pub use policy::StaticPolicy;

/// The action of invoking a tool.
pub const ACTION_INVOKE: &str = "invoke";

/// One authorization question.
#[derive(Debug, Clone, Copy)]
pub struct AuthzRequest<'a> {
    /// Who asks.
    pub subject: &'a Subject,
    /// The tool (resource `soul:tool:{id}`).
    pub tool: &'a ToolId,
    /// The tenant owning the tool, when it is tenant-scoped (`None` for global tools).
    pub tool_tenant: Option<&'a TenantId>,
    /// The action, e.g. [`ACTION_INVOKE`].
    pub action: &'a str,
}

/// A positive decision, with what evidence needs to know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Hash of the policy set that allowed the call.
    pub policy_hash: String,
}

/// Decides whether a subject may act on a tool. Deny is an `Err` with a stable code
/// (`POLICY.DENY_TOOL` or `AUTH.FORBIDDEN`).
#[async_trait]
pub trait Authorizer: Send + Sync + 'static {
    /// Answers one question.
    async fn authorize(&self, req: AuthzRequest<'_>) -> Result<Decision, SoulError>;
}
