//! A tenant's view of the global tools, changed through the registry API on
//! the tenant's own behalf — one code path for HTTP (`/api/access`), gRPC
//! (`ToolRegistry.SetAllowList` / `SetTenantOverride`) and the CLI
//! (`soulbase access`).
//!
//! A caller changes only its own tenant's view, under policy:
//!
//! - its allow-list: action `update` on resource [`ACCESS_RESOURCE`];
//! - its state of a global tool: `enable` to enable it, `disable` to pause it,
//!   both to clear the override (clearing may do either).
//!
//! What the operator's configuration decides (`tenants[]`,
//! [`Registry::set_configured`](super::Registry::set_configured)) applies on top
//! and is shown beside the stored view, never changed here. Changes are
//! persisted through the [`RegistryAdmin`] (replicas follow) and seen by the next
//! call; calls already resolved finish on the view they started with.

use std::collections::{BTreeMap, BTreeSet};

use schemars::JsonSchema;
use serde::Serialize;
use soulbase_auth::{Action, Authorizer};
use soulbase_errors::{SoulError, SoulResult};
use soulbase_types::{Subject, TenantId, ToolId};

use super::admin::{RegistryAdmin, authorize};
use super::{RegistryView, TenantAccess, TenantOverride, ToolOwner};

/// The resource a change of a tenant's allow-list is authorized on (action
/// `update`), named like a tool so one policy language covers it.
pub const ACCESS_RESOURCE: &str = "soulbase.server.access";

/// A tenant's view rules as the registry API shows them.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct AccessView {
    /// The tenant.
    pub tenant: TenantId,
    /// The stored allow-list (`None`: every global tool).
    pub allow: Option<Vec<ToolId>>,
    /// The stored states of global tools for the tenant.
    pub overrides: BTreeMap<ToolId, TenantOverride>,
    /// What the configuration decides on top (`tenants[]`), if anything.
    pub configured: Option<TenantAccess>,
}

/// `tenant`'s view rules in `view`.
pub fn access_of(view: &RegistryView, tenant: &TenantId) -> AccessView {
    AccessView {
        tenant: tenant.clone(),
        allow: view.allow_list(tenant),
        overrides: view.stored_overrides(tenant),
        configured: view.configured(tenant).cloned(),
    }
}

fn resource() -> SoulResult<ToolId> {
    ToolId::new(ACCESS_RESOURCE).map_err(SoulError::internal)
}

/// Replaces `subject`'s tenant's stored allow-list (`None`: every global tool),
/// once the authorizer allows `update` on [`ACCESS_RESOURCE`]; the view after.
pub async fn set_allow_list(
    authorizer: &dyn Authorizer,
    admin: &RegistryAdmin,
    subject: &Subject,
    allow: Option<BTreeSet<ToolId>>,
) -> SoulResult<AccessView> {
    let tenant = &subject.tenant;
    authorize(
        authorizer,
        subject,
        &ToolOwner::Global,
        &resource()?,
        Action::Update,
    )
    .await?;
    admin.set_allow_list(subject, tenant, allow).await?;
    Ok(access_of(&admin.registry().view(), tenant))
}

/// Sets (or with `None` clears) `subject`'s tenant's state of global tool `id`,
/// once the authorizer allows the actions it needs (module doc); the view after.
/// A tool the tenant cannot see is `TOOL.NOT_FOUND`.
pub async fn set_override(
    authorizer: &dyn Authorizer,
    admin: &RegistryAdmin,
    subject: &Subject,
    id: &ToolId,
    value: Option<TenantOverride>,
) -> SoulResult<AccessView> {
    let tenant = &subject.tenant;
    let actions: &[Action] = match value {
        Some(TenantOverride::Enabled) => &[Action::Enable],
        Some(TenantOverride::Paused) => &[Action::Disable],
        None => &[Action::Enable, Action::Disable],
    };
    for action in actions {
        authorize(authorizer, subject, &ToolOwner::Global, id, *action).await?;
    }
    admin
        .set_tenant_override(subject, tenant, id, value)
        .await?;
    Ok(access_of(&admin.registry().view(), tenant))
}
