//! The authenticated caller.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::{ActorId, TenantId};

/// Who is calling, once authenticated: a tenant, an actor in it, and what they hold.
///
/// Roles and scopes are inputs to authorization; they grant nothing by themselves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subject {
    /// The tenant the caller belongs to. Every decision is scoped to it.
    pub tenant: TenantId,
    /// The actor within the tenant.
    pub actor: ActorId,
    /// Roles held (e.g. `admin`, `agent`).
    #[serde(default)]
    pub roles: BTreeSet<String>,
    /// OAuth-style scopes held (e.g. `tools:invoke`).
    #[serde(default)]
    pub scopes: BTreeSet<String>,
}

impl Subject {
    /// A subject with no roles and no scopes.
    pub fn new(tenant: TenantId, actor: ActorId) -> Self {
        Self {
            tenant,
            actor,
            roles: BTreeSet::new(),
            scopes: BTreeSet::new(),
        }
    }

    /// Adds a role (builder style).
    pub fn with_role(mut self, role: impl Into<String>) -> Self {
        self.roles.insert(role.into());
        self
    }

    /// Adds a scope (builder style).
    pub fn with_scope(mut self, scope: impl Into<String>) -> Self {
        self.scopes.insert(scope.into());
        self
    }

    /// Whether the subject holds `role`.
    pub fn has_role(&self, role: &str) -> bool {
        self.roles.contains(role)
    }
}
