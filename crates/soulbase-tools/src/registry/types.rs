//! The registry's public vocabulary.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use schemars::JsonSchema;
use semver::Version;
use serde::{Deserialize, Serialize};
use soulbase_errors::SoulError;
use soulbase_sandbox::CapabilityDomain;
use soulbase_types::{TenantId, ToolId};

use crate::discovery::ToolSpec;
use crate::manifest::{CompiledTool, SafetyClass, SideEffect};

/// A tool's lifecycle state (SB-08 §3.3).
///
/// ```text
/// registered ──enable──▶ enabled ◀──enable/pause──▶ paused
///      │                    │                         │
///      └──────deprecate─────┴────────deprecate────────┘──▶ deprecated
/// any state ──unregister──▶ (removed)
/// ```
/// `deprecated` is terminal short of removal: bringing a deprecated tool back
/// means registering a new version under a new id, or unregistering and
/// registering again — deprecation is a promise to callers and is not undone in
/// place. Moving to the state a tool is already in is a no-op, not an error.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ToolState {
    /// Known and validated, not yet callable.
    Registered,
    /// Callable and discoverable.
    Enabled,
    /// Temporarily not callable (a kill switch).
    Paused,
    /// On its way out: not callable, not discoverable.
    Deprecated,
}

impl ToolState {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolState::Registered => "registered",
            ToolState::Enabled => "enabled",
            ToolState::Paused => "paused",
            ToolState::Deprecated => "deprecated",
        }
    }

    /// Whether moving from `self` to `to` is a legal transition (same state excluded).
    pub fn can_transition_to(self, to: ToolState) -> bool {
        use ToolState::*;
        matches!(
            (self, to),
            (Registered, Enabled)
                | (Enabled, Paused)
                | (Paused, Enabled)
                | (Registered | Enabled | Paused, Deprecated)
        )
    }
}

impl fmt::Display for ToolState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who a registered tool belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolOwner {
    /// Visible to every tenant (subject to its allow-list and overrides).
    Global,
    /// Visible only to this tenant; shadows a global tool with the same id.
    Tenant(TenantId),
}

impl ToolOwner {
    /// The owner for `tenant`; the reserved [`TenantId::global`] maps to `Global`.
    pub fn tenant(tenant: TenantId) -> Self {
        if tenant == TenantId::global() {
            ToolOwner::Global
        } else {
            ToolOwner::Tenant(tenant)
        }
    }

    /// The owning tenant, or `None` for global tools.
    pub fn tenant_id(&self) -> Option<&TenantId> {
        match self {
            ToolOwner::Global => None,
            ToolOwner::Tenant(t) => Some(t),
        }
    }
}

/// A tenant's own state for a *global* tool.
///
/// The effective state for the tenant is: the global state if that is `paused` or
/// `deprecated` (a global kill switch always wins); otherwise the override if set
/// (so a tenant can pause a tool just for itself, or opt in to a tool that is only
/// `registered` globally); otherwise the global state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TenantOverride {
    /// Enabled for this tenant.
    Enabled,
    /// Paused for this tenant.
    Paused,
}

/// What an operator's configuration decides about one tenant's view of the
/// global tools (`tenants.<tenant>` in the server configuration): applied on top
/// of what the registry API stored ([`Registry::set_configured`]).
///
/// - `allow`: if set, the only global tools the tenant sees — both this list and
///   a stored allow-list must admit a tool;
/// - `overrides`: per-tool states for the tenant, taking precedence over stored
///   overrides (a paused or deprecated tool stays so, as with any override).
///
/// [`Registry::set_configured`]: super::Registry::set_configured
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct TenantAccess {
    /// If set, the only global tools the tenant sees.
    pub allow: Option<BTreeSet<ToolId>>,
    /// The tenant's states of global tools.
    pub overrides: BTreeMap<ToolId, TenantOverride>,
}

/// The effective state of a global tool in state `global` for a tenant with
/// override `ov` (see [`TenantOverride`]).
pub(crate) fn effective_state(global: ToolState, ov: Option<TenantOverride>) -> ToolState {
    match (global, ov) {
        (ToolState::Paused | ToolState::Deprecated, _) => global,
        (_, Some(TenantOverride::Enabled)) => ToolState::Enabled,
        (_, Some(TenantOverride::Paused)) => ToolState::Paused,
        (g, None) => g,
    }
}

/// Which owners a query covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OwnerFilter {
    /// Only global tools.
    Global,
    /// Only the querying tenant's own tools.
    Tenant,
}

/// A query over the tools a tenant sees. Every set field must match (AND); an
/// empty filter matches everything visible.
///
/// All criteria but `keyword` are answered from inverted indexes (the smallest
/// matching set is walked and checked against the others), so selective queries
/// do not scan the registry. `keyword` is a case-insensitive substring of name,
/// display name or description, checked on the candidates the other criteria
/// leave (a keyword-only query walks every visible tool).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolFilter {
    /// Effective state for the tenant.
    pub state: Option<ToolState>,
    /// Global or tenant-owned tools only.
    pub owner: Option<OwnerFilter>,
    /// The id's first segment.
    pub group: Option<String>,
    /// A tag (case-insensitive).
    pub tag: Option<String>,
    /// The safety class.
    pub safety_class: Option<SafetyClass>,
    /// The side effect.
    pub side_effect: Option<SideEffect>,
    /// Tools declaring a capability in this domain.
    pub capability: Option<CapabilityDomain>,
    /// Case-insensitive substring of name, display name or description.
    pub keyword: Option<String>,
}

impl ToolFilter {
    /// Matches enabled tools only.
    pub fn enabled() -> Self {
        Self {
            state: Some(ToolState::Enabled),
            ..Self::default()
        }
    }
}

/// A tool as one tenant sees it.
#[derive(Debug, Clone)]
pub struct ResolvedTool {
    /// The compiled tool (manifest, validators, digest).
    pub tool: Arc<CompiledTool>,
    /// Its effective state for the tenant.
    pub state: ToolState,
    /// Whether it is global or the tenant's own.
    pub owner: ToolOwner,
}

impl ResolvedTool {
    /// The tool id.
    pub fn id(&self) -> &ToolId {
        &self.tool.manifest.id
    }
}

/// One entry of a tenant's available view (R2 AvailableSpec): a tool that is
/// visible to the tenant (own, or global and allowed) and enabled for it. Runtime
/// policy from configuration (limits, allow-lists in config) is intersected by the
/// invocation pipeline on top of this.
#[derive(Debug, Clone)]
pub struct AvailableSpec {
    /// The compiled tool.
    pub tool: Arc<CompiledTool>,
    /// Whether it is global or the tenant's own.
    pub owner: ToolOwner,
}

impl AvailableSpec {
    /// The tool id.
    pub fn id(&self) -> &ToolId {
        &self.tool.manifest.id
    }

    /// The tool version.
    pub fn version(&self) -> &Version {
        &self.tool.manifest.version
    }

    /// The restricted, model-facing view.
    pub fn spec(&self) -> ToolSpec {
        self.tool.spec()
    }
}

/// A change published by the registry, after the new snapshot is visible.
///
/// `tenant` is `None` for global tools — a global change affects every tenant
/// that sees the tool. A tenant override that changes a global tool's effective
/// state for one tenant is a `StateChanged` with that tenant and the effective
/// states.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RegistryEvent {
    /// A new tool was registered.
    Registered {
        /// The owning tenant, `None` for global.
        tenant: Option<TenantId>,
        /// The tool.
        id: ToolId,
        /// Its version.
        version: Version,
    },
    /// A tool was replaced by a new version (its state is kept).
    Updated {
        /// The owning tenant, `None` for global.
        tenant: Option<TenantId>,
        /// The tool.
        id: ToolId,
        /// The old version.
        from: Version,
        /// The new version.
        to: Version,
    },
    /// A tool's (effective) state changed.
    StateChanged {
        /// The owning (or overriding) tenant, `None` for global.
        tenant: Option<TenantId>,
        /// The tool.
        id: ToolId,
        /// The old state.
        from: ToolState,
        /// The new state.
        to: ToolState,
    },
    /// A tool was removed.
    Unregistered {
        /// The owning tenant, `None` for global.
        tenant: Option<TenantId>,
        /// The tool.
        id: ToolId,
        /// The version that was removed.
        version: Version,
    },
    /// A tenant's override of a global tool was set or cleared.
    OverrideChanged {
        /// The tenant.
        tenant: TenantId,
        /// The global tool.
        id: ToolId,
        /// The new override, `None` when cleared.
        value: Option<TenantOverride>,
    },
    /// A tenant's allow-list of global tools changed.
    AllowListChanged {
        /// The tenant.
        tenant: TenantId,
    },
}

/// How [`Registry::load`](super::Registry::load) treats a manifest whose id is
/// already registered with a different digest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UpgradePolicy {
    /// Apply [`check_upgrade`](crate::manifest::check_upgrade); a violation fails
    /// that manifest and keeps the registered one.
    #[default]
    Enforce,
    /// The later definition wins (with a warning), whatever its version: for
    /// sources without real versions, like hot-reloaded skill descriptors.
    Replace,
}

/// Options for [`Registry::load`](super::Registry::load).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Newly registered tools start `enabled` instead of `registered`.
    pub enable_new: bool,
    /// What to do when a loaded id is already registered.
    pub upgrade: UpgradePolicy,
}

/// One manifest that a load skipped.
#[derive(Debug, Clone)]
pub struct LoadFailure {
    /// Its position in the loaded batch.
    pub index: usize,
    /// Its id, if it parsed that far.
    pub id: Option<ToolId>,
    /// Why (`MANIFEST.INVALID` or `REGISTRY.CONFLICT`).
    pub error: SoulError,
}

/// What a load did. A bad manifest is reported and skipped; the rest apply.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    /// Newly registered ids.
    pub registered: Vec<ToolId>,
    /// Ids replaced by a new definition.
    pub updated: Vec<ToolId>,
    /// Ids whose definition was identical (same digest).
    pub unchanged: Vec<ToolId>,
    /// Ids defined more than once in the batch (the later definition won).
    pub duplicates: Vec<ToolId>,
    /// Manifests that were skipped.
    pub failed: Vec<LoadFailure>,
}
