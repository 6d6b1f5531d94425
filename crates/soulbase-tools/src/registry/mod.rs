//! The multi-tenant tool registry (R2).
//!
//! - **Lifecycle**: `registered → enabled ⇄ paused`, any of those `→ deprecated`,
//!   any state → removed (see [`ToolState`]). Illegal moves are
//!   `REGISTRY.CONFLICT` naming `from` and `to`.
//! - **Tenancy**: global tools are seen by every tenant; a tenant's own tools
//!   ([`Registry::register_for`]) are seen only by it and shadow a global tool with
//!   the same id. A tenant can override a global tool's state for itself
//!   ([`Registry::set_tenant_override`]) and restrict which global tools it sees
//!   ([`Registry::set_allow_list`]). A tool a tenant cannot see is
//!   `TOOL.NOT_FOUND` — never "forbidden", which would confirm it exists.
//! - **Queries**: [`ToolFilter`] over inverted indexes; results in id order.
//! - **Concurrency**: readers load an immutable snapshot from an [`ArcSwap`] and
//!   never block; writers are serialized by a mutex, build the next snapshot by
//!   structural sharing (persistent `imbl` maps, `Arc` entries: a write copies
//!   O(log n) tree nodes, not the registry), publish it atomically, then emit
//!   [`RegistryEvent`]s. A reader holding a [`RegistryView`] keeps a consistent
//!   picture for as long as it likes.
//!
//! Schemas are compiled by [`compile`] *before* the writer lock is
//! taken, so slow manifests never hold up other writers.

pub mod access;
pub mod admin;
mod export;
mod records;
mod snapshot;
mod types;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use soulbase_errors::{ErrorCode, SoulError, SoulResult};
use soulbase_types::{TenantId, ToolId};
use tokio::sync::broadcast;

pub use self::export::{ExportedOverride, ExportedTool, RegistryExport, RestoreReport};
pub use self::records::{Record, RecordKey, RecordsReport, Take};
use self::snapshot::{Criteria, Entry, Snapshot};
use self::types::effective_state;
pub use self::types::{
    AvailableSpec, LoadFailure, LoadOptions, LoadReport, OwnerFilter, RegistryEvent, ResolvedTool,
    TenantAccess, TenantOverride, ToolFilter, ToolOwner, ToolState, UpgradePolicy,
};
use crate::manifest::problem::problems_error;
use crate::manifest::{CompiledTool, ToolManifest, check_upgrade, compile};

/// How many events a slow subscriber may fall behind before it sees `Lagged`.
const EVENT_CAPACITY: usize = 1024;

struct Inner {
    current: ArcSwap<Snapshot>,
    writer: Mutex<()>,
    events: broadcast::Sender<RegistryEvent>,
}

/// The tool registry. Cheap to clone: clones share the same registry.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let snap = self.inner.current.load();
        f.debug_struct("Registry")
            .field("version", &snap.version)
            .field("global_tools", &snap.global.len())
            .field("tenants", &snap.tenants.len())
            .finish()
    }
}

fn not_found(id: &ToolId) -> SoulError {
    SoulError::new(ErrorCode::ToolNotFound, format!("tool {id} not found"))
        .with_field("tool_id", id.as_str())
}

fn conflict(message: String, id: &ToolId) -> SoulError {
    SoulError::new(ErrorCode::RegistryConflict, message).with_field("tool_id", id.as_str())
}

/// `REGISTRY.CONFLICT` when `tool`'s `mcp_name` is held by another tool in a
/// view it would join.
fn check_mcp_name(
    snap: &Snapshot,
    tenant: Option<&TenantId>,
    tool: &CompiledTool,
) -> SoulResult<()> {
    let Some(name) = &tool.manifest.mcp_name else {
        return Ok(());
    };
    match snap.mcp_name_holder(tenant, name, &tool.manifest.id) {
        None => Ok(()),
        Some(holder) => Err(conflict(
            format!(
                "tool {} cannot take the MCP name {name:?}: tool {holder} holds it",
                tool.manifest.id
            ),
            &tool.manifest.id,
        )
        .with_field("mcp_name", name.clone())
        .with_field("holder", holder.as_str())),
    }
}

fn illegal(id: &ToolId, from: ToolState, to: ToolState) -> SoulError {
    conflict(format!("tool {id} cannot move from {from} to {to}"), id)
        .with_field("from", from.as_str())
        .with_field("to", to.as_str())
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        Self {
            inner: Arc::new(Inner {
                current: ArcSwap::from_pointee(Snapshot::default()),
                writer: Mutex::new(()),
                events,
            }),
        }
    }

    /// A consistent, immutable view of the registry as of now (lock-free).
    pub fn view(&self) -> RegistryView {
        RegistryView {
            snap: self.inner.current.load_full(),
        }
    }

    /// The snapshot counter: increases by one with every published change.
    pub fn snapshot_version(&self) -> u64 {
        self.inner.current.load().version
    }

    /// Subscribes to every change published from now on, for every tenant: for
    /// operators and persistence. Anything facing a tenant uses [`Self::subscribe_for`].
    pub fn subscribe(&self) -> broadcast::Receiver<RegistryEvent> {
        self.inner.events.subscribe()
    }

    /// Subscribes to the changes `tenant` may see: its own tools, its overrides and
    /// allow-list, and global tools it can see (its allow-list admits them and no tool
    /// of its own shadows them). Another tenant's events never pass. Feeds MCP
    /// `list_changed` and gRPC watchers.
    pub fn subscribe_for(&self, tenant: &TenantId) -> TenantEvents {
        TenantEvents {
            rx: self.subscribe(),
            registry: self.clone(),
            tenant: tenant.clone(),
        }
    }

    /// Runs one serialized write: `f` edits a copy of the current snapshot and lists
    /// events; if it succeeds and changed anything, the copy is published, then the
    /// events are sent (under the lock, so subscribers see them in commit order).
    fn write<R>(
        &self,
        f: impl FnOnce(&mut Snapshot, &mut Vec<RegistryEvent>) -> SoulResult<R>,
    ) -> SoulResult<R> {
        // A panic in another writer leaves no half-published state (it never
        // reached `store`), so a poisoned lock is safe to reuse.
        let _guard = self
            .inner
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let current = self.inner.current.load_full();
        let mut next = Snapshot::clone(&current);
        let mut events = Vec::new();
        let result = f(&mut next, &mut events)?;
        if !events.is_empty() {
            next.version = current.version + 1;
            self.inner.current.store(Arc::new(next));
            for e in events {
                // No subscribers is fine.
                let _ = self.inner.events.send(e);
            }
        }
        Ok(result)
    }

    /// Validates, compiles and registers a new global tool (state `registered`).
    ///
    /// `MANIFEST.INVALID` listing every problem; `REGISTRY.CONFLICT` if the id is
    /// already registered globally (use [`Registry::update`] for a new version).
    pub fn register(&self, manifest: ToolManifest) -> SoulResult<Arc<CompiledTool>> {
        self.register_in(&ToolOwner::Global, manifest)
    }

    /// Registers a tool owned by `tenant`: only that tenant sees it, and it shadows
    /// a global tool with the same id for that tenant.
    pub fn register_for(
        &self,
        tenant: &TenantId,
        manifest: ToolManifest,
    ) -> SoulResult<Arc<CompiledTool>> {
        self.register_in(&ToolOwner::tenant(tenant.clone()), manifest)
    }

    /// Registers a tool for `owner`.
    pub fn register_in(
        &self,
        owner: &ToolOwner,
        manifest: ToolManifest,
    ) -> SoulResult<Arc<CompiledTool>> {
        let compiled = Arc::new(compile(manifest)?);
        self.register_compiled(owner, compiled.clone())?;
        Ok(compiled)
    }

    /// Registers an already compiled tool for `owner` (state `registered`).
    pub fn register_compiled(&self, owner: &ToolOwner, tool: Arc<CompiledTool>) -> SoulResult<()> {
        let tenant = owner.tenant_id();
        self.write(|snap, events| {
            let id = tool.manifest.id.clone();
            if snap.table(tenant).is_some_and(|t| t.contains(&id)) {
                return Err(conflict(
                    format!("tool {id} is already registered; use update for a new version"),
                    &id,
                ));
            }
            check_mcp_name(snap, tenant, &tool)?;
            events.push(RegistryEvent::Registered {
                tenant: tenant.cloned(),
                id: id.clone(),
                version: tool.manifest.version.clone(),
            });
            snap.table_mut(tenant)
                .put(Entry::new(Arc::new(id), tool, ToolState::Registered));
            Ok(())
        })
    }

    /// Replaces a registered tool with a new version, keeping its state.
    ///
    /// The new manifest is validated like a registration, then
    /// [`check_upgrade`] runs against the registered version: a violation is
    /// `REGISTRY.CONFLICT` with field `problems`. `TOOL.NOT_FOUND` if `owner` has
    /// no such tool.
    pub fn update(
        &self,
        owner: &ToolOwner,
        manifest: ToolManifest,
    ) -> SoulResult<Arc<CompiledTool>> {
        let compiled = Arc::new(compile(manifest)?);
        let tenant = owner.tenant_id();
        let tool = compiled.clone();
        self.write(|snap, events| {
            let id = tool.manifest.id.clone();
            let Some(prev) = snap.table(tenant).and_then(|t| t.get(&id)).cloned() else {
                return Err(not_found(&id));
            };
            check_mcp_name(snap, tenant, &tool)?;
            let problems = check_upgrade(&prev.tool.manifest, &tool.manifest);
            if !problems.is_empty() {
                let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
                return Err(problems_error(
                    ErrorCode::RegistryConflict,
                    format!("tool {id} cannot be updated: {}", list.join("; ")),
                    &problems,
                )
                .with_field("tool_id", id.as_str()));
            }
            events.push(RegistryEvent::Updated {
                tenant: tenant.cloned(),
                id,
                from: prev.tool.manifest.version.clone(),
                to: tool.manifest.version.clone(),
            });
            snap.table_mut(tenant).put(prev.with_tool(tool));
            Ok(())
        })?;
        Ok(compiled)
    }

    /// Loads a batch of manifests for `owner` in one snapshot, e.g. from a skills
    /// directory.
    ///
    /// A manifest that fails validation (or, with [`UpgradePolicy::Enforce`], the
    /// upgrade rules) is reported in [`LoadReport::failed`] and skipped; the rest
    /// apply. An id defined more than once in the batch: the later definition
    /// wins and a warning is logged. An id already registered with the same
    /// digest is left alone; with a different digest it is replaced (state kept).
    pub fn load(
        &self,
        owner: &ToolOwner,
        manifests: Vec<ToolManifest>,
        options: LoadOptions,
    ) -> LoadReport {
        let mut failed = Vec::new();
        let mut batch = Vec::with_capacity(manifests.len());
        for (index, m) in manifests.into_iter().enumerate() {
            let id = m.id.clone();
            match compile(m) {
                Ok(c) => batch.push((index, Arc::new(c), options.enable_new)),
                Err(e) => failed.push(LoadFailure {
                    index,
                    id: Some(id),
                    error: e.into(),
                }),
            }
        }
        let mut report = self.apply_batch(owner, batch, Vec::new(), options.upgrade);
        report.failed.extend(failed);
        report.failed.sort_by_key(|f| f.index);
        report
    }

    /// Like [`Registry::load`] for already compiled tools, and also removes the
    /// tools `remove` of `owner`, all in one published snapshot: a reader sees the
    /// whole batch or none of it (a skills directory reload). Each tool carries
    /// whether it starts `enabled` when it is new (`false`: `registered`); existing
    /// tools keep their state. Ids in `remove` that `owner` does not have are
    /// ignored; an id both loaded and removed is loaded. Failure indexes refer to
    /// positions in `tools`.
    pub fn load_compiled(
        &self,
        owner: &ToolOwner,
        tools: Vec<(Arc<CompiledTool>, bool)>,
        remove: Vec<ToolId>,
        upgrade: UpgradePolicy,
    ) -> LoadReport {
        let batch = tools
            .into_iter()
            .enumerate()
            .map(|(i, (t, e))| (i, t, e))
            .collect();
        self.apply_batch(owner, batch, remove, upgrade)
    }

    fn apply_batch(
        &self,
        owner: &ToolOwner,
        batch: Vec<(usize, Arc<CompiledTool>, bool)>,
        remove: Vec<ToolId>,
        upgrade: UpgradePolicy,
    ) -> LoadReport {
        let mut report = LoadReport::default();
        let mut latest: BTreeMap<ToolId, (usize, Arc<CompiledTool>, bool)> = BTreeMap::new();
        for (index, tool, enable_new) in batch {
            let id = tool.manifest.id.clone();
            if let Some((earlier, _, _)) = latest.insert(id.clone(), (index, tool, enable_new)) {
                tracing::warn!(
                    tool_id = %id,
                    earlier,
                    later = index,
                    "tool defined more than once in one load; the later definition wins"
                );
                report.duplicates.push(id);
            }
        }
        let mut ordered: Vec<(usize, Arc<CompiledTool>, bool)> = latest.into_values().collect();
        ordered.sort_by_key(|(i, _, _)| *i);
        let loaded: BTreeSet<ToolId> = ordered
            .iter()
            .map(|(_, t, _)| t.manifest.id.clone())
            .collect();

        let tenant = owner.tenant_id();
        let applied = self.write(|snap, events| {
            let mut done = LoadReport::default();
            for id in remove.iter().filter(|id| !loaded.contains(*id)) {
                if let Some(old) = snap.table_mut(tenant).remove(id) {
                    events.push(RegistryEvent::Unregistered {
                        tenant: tenant.cloned(),
                        id: id.clone(),
                        version: old.tool.manifest.version.clone(),
                    });
                    if tenant.is_none() {
                        Self::drop_enabling_overrides(snap, id, events);
                    }
                }
            }
            for (index, tool, enable_new) in ordered {
                let id = tool.manifest.id.clone();
                let prev = snap.table(tenant).and_then(|t| t.get(&id)).cloned();
                if let Err(error) = check_mcp_name(snap, tenant, &tool) {
                    done.failed.push(LoadFailure {
                        index,
                        id: Some(id.clone()),
                        error,
                    });
                    continue;
                }
                match prev {
                    Some(prev) if prev.tool.digest == tool.digest => done.unchanged.push(id),
                    Some(prev) => {
                        if upgrade == UpgradePolicy::Enforce {
                            let problems = check_upgrade(&prev.tool.manifest, &tool.manifest);
                            if !problems.is_empty() {
                                let list: Vec<String> =
                                    problems.iter().map(ToString::to_string).collect();
                                done.failed.push(LoadFailure {
                                    index,
                                    id: Some(id.clone()),
                                    error: problems_error(
                                        ErrorCode::RegistryConflict,
                                        format!("tool {id} cannot be updated: {}", list.join("; ")),
                                        &problems,
                                    )
                                    .with_field("tool_id", id.as_str()),
                                });
                                continue;
                            }
                        } else {
                            tracing::warn!(
                                tool_id = %id,
                                from = %prev.tool.manifest.version,
                                to = %tool.manifest.version,
                                "tool redefined; the later definition wins"
                            );
                        }
                        events.push(RegistryEvent::Updated {
                            tenant: tenant.cloned(),
                            id: id.clone(),
                            from: prev.tool.manifest.version.clone(),
                            to: tool.manifest.version.clone(),
                        });
                        snap.table_mut(tenant).put(prev.with_tool(tool));
                        done.updated.push(id);
                    }
                    None => {
                        let state = if enable_new {
                            ToolState::Enabled
                        } else {
                            ToolState::Registered
                        };
                        events.push(RegistryEvent::Registered {
                            tenant: tenant.cloned(),
                            id: id.clone(),
                            version: tool.manifest.version.clone(),
                        });
                        if enable_new {
                            events.push(RegistryEvent::StateChanged {
                                tenant: tenant.cloned(),
                                id: id.clone(),
                                from: ToolState::Registered,
                                to: ToolState::Enabled,
                            });
                        }
                        snap.table_mut(tenant)
                            .put(Entry::new(Arc::new(id.clone()), tool, state));
                        done.registered.push(id);
                    }
                }
            }
            if let Some(t) = tenant {
                snap.prune_tenant(t);
            }
            Ok(done)
        });
        // The closure never fails.
        if let Ok(done) = applied {
            report.registered = done.registered;
            report.updated = done.updated;
            report.unchanged = done.unchanged;
            report.failed.extend(done.failed);
            report.failed.sort_by_key(|f| f.index);
        }
        report
    }

    /// Removes a tool of `owner`. `TOOL.NOT_FOUND` if there is none.
    ///
    /// A tenant's overrides and allow-list entries for the id are kept: they are
    /// the tenant's policy about that id and apply again if it is re-registered.
    pub fn unregister(&self, owner: &ToolOwner, id: &ToolId) -> SoulResult<()> {
        let tenant = owner.tenant_id();
        self.write(|snap, events| {
            if !snap.table(tenant).is_some_and(|t| t.contains(id)) {
                return Err(not_found(id));
            }
            if let Some(old) = snap.table_mut(tenant).remove(id) {
                events.push(RegistryEvent::Unregistered {
                    tenant: tenant.cloned(),
                    id: id.clone(),
                    version: old.tool.manifest.version.clone(),
                });
            }
            match tenant {
                Some(t) => snap.prune_tenant(t),
                None => Self::drop_enabling_overrides(snap, id, events),
            }
            Ok(())
        })
    }

    /// A tenant's `Enabled` override was a decision about the tool that was just
    /// unregistered; a different tool registered later under the same id must not
    /// inherit it and go live unreviewed. `Paused` overrides only restrict, so they
    /// stay as the tenant's policy about the id.
    fn drop_enabling_overrides(snap: &mut Snapshot, id: &ToolId, events: &mut Vec<RegistryEvent>) {
        let mut emptied = Vec::new();
        for (tenant, data) in snap.tenants.iter_mut() {
            if data.overrides.get(id) == Some(&TenantOverride::Enabled) {
                data.overrides.remove(id);
                events.push(RegistryEvent::OverrideChanged {
                    tenant: tenant.clone(),
                    id: id.clone(),
                    value: None,
                });
                emptied.push(tenant.clone());
            }
        }
        for t in &emptied {
            snap.prune_tenant(t);
        }
    }

    fn transition(&self, owner: &ToolOwner, id: &ToolId, to: ToolState) -> SoulResult<()> {
        let tenant = owner.tenant_id();
        self.write(|snap, events| {
            let Some(entry) = snap.table(tenant).and_then(|t| t.get(id)).cloned() else {
                return Err(not_found(id));
            };
            let from = entry.state;
            if from == to {
                return Ok(());
            }
            if !from.can_transition_to(to) {
                return Err(illegal(id, from, to));
            }
            events.push(RegistryEvent::StateChanged {
                tenant: tenant.cloned(),
                id: id.clone(),
                from,
                to,
            });
            snap.table_mut(tenant).put(entry.with_state(to));
            Ok(())
        })
    }

    /// `registered|paused → enabled`. `REGISTRY.CONFLICT` from `deprecated`.
    pub fn enable(&self, owner: &ToolOwner, id: &ToolId) -> SoulResult<()> {
        self.transition(owner, id, ToolState::Enabled)
    }

    /// `enabled → paused`. `REGISTRY.CONFLICT` from `registered` or `deprecated`.
    pub fn pause(&self, owner: &ToolOwner, id: &ToolId) -> SoulResult<()> {
        self.transition(owner, id, ToolState::Paused)
    }

    /// Alias of [`Registry::pause`].
    pub fn disable(&self, owner: &ToolOwner, id: &ToolId) -> SoulResult<()> {
        self.pause(owner, id)
    }

    /// `registered|enabled|paused → deprecated` (one way).
    pub fn deprecate(&self, owner: &ToolOwner, id: &ToolId) -> SoulResult<()> {
        self.transition(owner, id, ToolState::Deprecated)
    }

    /// Sets (or with `None` clears) `tenant`'s override of a *global* tool's state.
    ///
    /// `TOOL.NOT_FOUND` if there is no such global tool, or the tenant cannot see
    /// it (its allow-list excludes it, or its own tool shadows it);
    /// `REGISTRY.CONFLICT` for the reserved global tenant. Emits
    /// `OverrideChanged` when the override changed, and `StateChanged` for the
    /// tenant if its effective state changed.
    pub fn set_tenant_override(
        &self,
        tenant: &TenantId,
        id: &ToolId,
        ov: Option<TenantOverride>,
    ) -> SoulResult<()> {
        if *tenant == TenantId::global() {
            return Err(conflict(
                "the global tenant has no overrides; change the tool's own state".into(),
                id,
            ));
        }
        self.write(|snap, events| {
            let Some(global) = snap.global.get(id).cloned() else {
                return Err(not_found(id));
            };
            if let Some(d) = snap.tenants.get(tenant)
                && (!d.allows(id) || d.table.contains(id))
            {
                return Err(not_found(id));
            }
            let data = snap.tenant_mut(tenant);
            let before = effective_state(global.state, data.overrides.get(id).copied());
            let changed = match ov {
                Some(o) => data.overrides.insert(id.clone(), o) != Some(o),
                None => data.overrides.remove(id).is_some(),
            };
            let after = effective_state(global.state, ov);
            if changed {
                events.push(RegistryEvent::OverrideChanged {
                    tenant: tenant.clone(),
                    id: id.clone(),
                    value: ov,
                });
            }
            if before != after {
                events.push(RegistryEvent::StateChanged {
                    tenant: Some(tenant.clone()),
                    id: id.clone(),
                    from: before,
                    to: after,
                });
            }
            snap.prune_tenant(tenant);
            Ok(())
        })
    }

    /// Replaces what the configuration decides about tenants' views (the
    /// `tenants` section, read again on every reload): each tenant's
    /// [`TenantAccess`] applies on top of what the registry stores for it, from
    /// the next snapshot on; calls already resolved keep their tool. Emits
    /// `AllowListChanged` for every tenant whose configured access changed, so
    /// its subscribers re-list. Nothing is persisted: every replica reads the
    /// same configuration.
    pub fn set_configured(&self, configured: HashMap<TenantId, TenantAccess>) {
        let result = self.write(|snap, events| {
            let old = &snap.configured;
            let mut changed: BTreeSet<&TenantId> = BTreeSet::new();
            for (tenant, access) in &configured {
                if old.get(tenant) != Some(access) {
                    changed.insert(tenant);
                }
            }
            changed.extend(old.keys().filter(|t| !configured.contains_key(*t)));
            events.extend(
                changed
                    .into_iter()
                    .map(|t| RegistryEvent::AllowListChanged { tenant: t.clone() }),
            );
            if !events.is_empty() {
                snap.configured = Arc::new(configured.clone());
            }
            Ok(())
        });
        // The closure never fails.
        debug_assert!(result.is_ok());
    }

    /// Restricts the global tools `tenant` sees to `allow` (`None`: all of them).
    /// The tenant's own tools are not affected.
    pub fn set_allow_list(
        &self,
        tenant: &TenantId,
        allow: Option<BTreeSet<ToolId>>,
    ) -> SoulResult<()> {
        if *tenant == TenantId::global() {
            return Err(SoulError::new(
                ErrorCode::RegistryConflict,
                "the global tenant has no allow-list",
            ));
        }
        self.write(|snap, events| {
            let data = snap.tenant_mut(tenant);
            let new = allow.map(|a| a.into_iter().collect::<self::snapshot::HashSet<ToolId>>());
            if data.allow != new {
                data.allow = new;
                events.push(RegistryEvent::AllowListChanged {
                    tenant: tenant.clone(),
                });
            }
            snap.prune_tenant(tenant);
            Ok(())
        })
    }

    /// See [`RegistryView::get`].
    pub fn get(&self, tenant: &TenantId, id: &ToolId) -> SoulResult<ResolvedTool> {
        self.view().get(tenant, id)
    }

    /// See [`RegistryView::mcp_tool`].
    pub fn mcp_tool(&self, tenant: &TenantId, name: &str) -> Option<ToolId> {
        self.view().mcp_tool(tenant, name)
    }

    /// See [`RegistryView::resolve`].
    pub fn resolve(&self, tenant: &TenantId, id: &ToolId) -> SoulResult<ResolvedTool> {
        self.view().resolve(tenant, id)
    }

    /// See [`RegistryView::list`].
    pub fn list(&self, tenant: &TenantId, filter: &ToolFilter) -> Vec<ResolvedTool> {
        self.view().list(tenant, filter)
    }

    /// See [`RegistryView::list_enabled`].
    pub fn list_enabled(&self, tenant: &TenantId) -> Vec<ResolvedTool> {
        self.view().list_enabled(tenant)
    }

    /// See [`RegistryView::list_owned`].
    pub fn list_owned(&self, owner: &ToolOwner, filter: &ToolFilter) -> Vec<ResolvedTool> {
        self.view().list_owned(owner, filter)
    }

    /// See [`RegistryView::available_specs`].
    pub fn available_specs(&self, tenant: &TenantId) -> Vec<AvailableSpec> {
        self.view().available_specs(tenant)
    }
}

/// A tenant's filtered view of the registry's change events; see
/// [`Registry::subscribe_for`].
pub struct TenantEvents {
    rx: broadcast::Receiver<RegistryEvent>,
    registry: Registry,
    tenant: TenantId,
}

impl TenantEvents {
    /// The next event this tenant may see. `Lagged(n)` when the subscriber fell more
    /// than the channel's capacity behind (re-list to resync); `Closed` when the
    /// registry is gone.
    pub async fn recv(&mut self) -> Result<RegistryEvent, broadcast::error::RecvError> {
        loop {
            let event = self.rx.recv().await?;
            if self.visible(&event) {
                return Ok(event);
            }
        }
    }

    /// The tenant these events are for.
    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }

    /// Judged against the registry as it is when the event is received: a global
    /// tool's visibility that changed in between may add or drop one notification,
    /// but a tenant-scoped event reaches its own tenant only.
    fn visible(&self, event: &RegistryEvent) -> bool {
        match event {
            RegistryEvent::Registered { tenant, id, .. }
            | RegistryEvent::Updated { tenant, id, .. }
            | RegistryEvent::StateChanged { tenant, id, .. }
            | RegistryEvent::Unregistered { tenant, id, .. } => match tenant {
                Some(t) => *t == self.tenant,
                None => self.registry.view().global_visible_to(&self.tenant, id),
            },
            RegistryEvent::OverrideChanged { tenant, .. }
            | RegistryEvent::AllowListChanged { tenant } => *tenant == self.tenant,
        }
    }
}

/// An immutable snapshot of the registry: every read answers from the same instant.
#[derive(Clone)]
pub struct RegistryView {
    snap: Arc<Snapshot>,
}

impl std::fmt::Debug for RegistryView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryView")
            .field("version", &self.snap.version)
            .finish_non_exhaustive()
    }
}

impl RegistryView {
    /// Whether global tool `id` (present or not) is one `tenant` could see: its
    /// allow-list admits it and no tool of its own shadows it.
    pub fn global_visible_to(&self, tenant: &TenantId, id: &ToolId) -> bool {
        let rules = self.snap.rules(tenant);
        rules.allows(id) && !rules.shadows(id)
    }

    /// The snapshot counter of this view.
    pub fn version(&self) -> u64 {
        self.snap.version
    }

    /// The id of the tool `tenant` would call by the plain MCP name `name` (its
    /// manifest's `mcp_name`): its own tool's, else a global one's. `None` when no
    /// tool in the tenant's tables holds it; whether the tenant may see or call
    /// that tool is the pipeline's question, asked of the id.
    pub fn mcp_tool(&self, tenant: &TenantId, name: &str) -> Option<ToolId> {
        self.snap
            .tenants
            .get(tenant)
            .and_then(|d| d.table.by_mcp_name(name))
            .or_else(|| self.snap.global.by_mcp_name(name))
            .map(|k| ToolId::clone(k))
    }

    /// The tool `id` as `tenant` sees it, in whatever state.
    ///
    /// The tenant's own tool wins; otherwise the global one, if its allow-list
    /// lets it through, with the effective state. Anything else is
    /// `TOOL.NOT_FOUND` — including other tenants' tools.
    pub fn get(&self, tenant: &TenantId, id: &ToolId) -> SoulResult<ResolvedTool> {
        let rules = self.snap.rules(tenant);
        if let Some(e) = rules.stored.and_then(|d| d.table.get(id)) {
            return Ok(ResolvedTool {
                tool: e.tool.clone(),
                state: e.state,
                owner: ToolOwner::Tenant(tenant.clone()),
            });
        }
        let Some(e) = self.snap.global.get(id) else {
            return Err(not_found(id));
        };
        if !rules.allows(id) {
            return Err(not_found(id));
        }
        let state = effective_state(e.state, rules.override_of(id));
        Ok(ResolvedTool {
            tool: e.tool.clone(),
            state,
            owner: ToolOwner::Global,
        })
    }

    /// Like [`RegistryView::get`], but the tool must be enabled for `tenant`:
    /// `TOOL.DISABLED` (with field `state`) if it is visible but registered,
    /// paused or deprecated.
    pub fn resolve(&self, tenant: &TenantId, id: &ToolId) -> SoulResult<ResolvedTool> {
        let r = self.get(tenant, id)?;
        if r.state != ToolState::Enabled {
            return Err(SoulError::new(
                ErrorCode::ToolDisabled,
                format!("tool {id} is {}", r.state),
            )
            .with_field("tool_id", id.as_str())
            .with_field("state", r.state.as_str()));
        }
        Ok(r)
    }

    /// Tools visible to `tenant` that match `filter`, in id order.
    pub fn list(&self, tenant: &TenantId, filter: &ToolFilter) -> Vec<ResolvedTool> {
        let c = criteria(filter);
        let rules = self.snap.rules(tenant);
        // (entry, effective state, owned by the tenant)
        let mut found: Vec<(&Arc<Entry>, ToolState, bool)> = Vec::new();

        // The tenant's own tools: their state is their own.
        if filter.owner != Some(OwnerFilter::Global)
            && let Some(d) = rules.stored
        {
            found.extend(
                d.table
                    .scan(&c, filter.state)
                    .into_iter()
                    .map(|e| (e, e.state, true)),
            );
        }

        // Global tools: minus shadowed, minus not allowed, with effective state.
        if filter.owner != Some(OwnerFilter::Tenant) {
            let global = &self.snap.global;
            let admit = |e: &Arc<Entry>| -> Option<(ToolState, bool)> {
                if !rules.allows(&e.key) || rules.shadows(&e.key) {
                    return None;
                }
                let state = effective_state(e.state, rules.override_of(&e.key));
                filter
                    .state
                    .is_none_or(|s| s == state)
                    .then_some((state, false))
            };
            let overridden: BTreeSet<&ToolId> = rules.overridden().collect();
            match (filter.state, !overridden.is_empty()) {
                (Some(s), true) => {
                    // Overrides move tools in and out of `s`: walk the global set
                    // for `s` minus overridden ids, then the (few) overridden ids.
                    for e in global.scan(&c, Some(s)) {
                        if !overridden.contains(&*e.key)
                            && let Some((st, own)) = admit(e)
                        {
                            found.push((e, st, own));
                        }
                    }
                    for &id in &overridden {
                        if let Some(e) = global.get(id)
                            && c.matches(&e.tool)
                            && let Some((st, own)) = admit(e)
                        {
                            found.push((e, st, own));
                        }
                    }
                }
                (state, _) => {
                    for e in global.scan(&c, state) {
                        if let Some((st, own)) = admit(e) {
                            found.push((e, st, own));
                        }
                    }
                }
            }
        }
        found.sort_unstable_by(|a, b| a.0.key.as_str().cmp(b.0.key.as_str()));
        found
            .into_iter()
            .map(|(e, state, own)| ResolvedTool {
                tool: e.tool.clone(),
                state,
                owner: if own {
                    ToolOwner::Tenant(tenant.clone())
                } else {
                    ToolOwner::Global
                },
            })
            .collect()
    }

    /// Tools enabled for `tenant`, in id order.
    pub fn list_enabled(&self, tenant: &TenantId) -> Vec<ResolvedTool> {
        self.list(tenant, &ToolFilter::enabled())
    }

    /// The tools `owner` registered, with their own state (no overrides, no
    /// allow-list): an operator's view of one scope. `filter.owner` is ignored.
    pub fn list_owned(&self, owner: &ToolOwner, filter: &ToolFilter) -> Vec<ResolvedTool> {
        let Some(table) = self.snap.table(owner.tenant_id()) else {
            return Vec::new();
        };
        let mut found = table.scan(&criteria(filter), filter.state);
        found.sort_unstable_by(|a, b| a.key.as_str().cmp(b.key.as_str()));
        found
            .into_iter()
            .map(|e| ResolvedTool {
                tool: e.tool.clone(),
                state: e.state,
                owner: owner.clone(),
            })
            .collect()
    }

    /// The tenant's AvailableSpec view: every tool visible to it and enabled for
    /// it, in id order. Disabled tools vanish from it with the snapshot that
    /// disables them.
    pub fn available_specs(&self, tenant: &TenantId) -> Vec<AvailableSpec> {
        self.list_enabled(tenant)
            .into_iter()
            .map(|r| AvailableSpec {
                tool: r.tool,
                owner: r.owner,
            })
            .collect()
    }

    /// What the configuration decides about `tenant`'s view, if anything
    /// ([`Registry::set_configured`]).
    pub fn configured(&self, tenant: &TenantId) -> Option<&TenantAccess> {
        self.snap.configured.get(tenant)
    }

    /// Every stored override of `tenant`, by tool id.
    pub fn stored_overrides(&self, tenant: &TenantId) -> BTreeMap<ToolId, TenantOverride> {
        self.snap
            .tenants
            .get(tenant)
            .map_or_else(BTreeMap::new, |d| {
                d.overrides.iter().map(|(k, v)| (k.clone(), *v)).collect()
            })
    }

    /// `tenant`'s stored override for global tool `id`, if any (a configured one
    /// takes precedence: [`RegistryView::configured`]).
    pub fn tenant_override(&self, tenant: &TenantId, id: &ToolId) -> Option<TenantOverride> {
        self.snap.tenants.get(tenant)?.overrides.get(id).copied()
    }

    /// `tenant`'s stored allow-list of global tools, if it has one (in id order;
    /// a configured one applies too: [`RegistryView::configured`]).
    pub fn allow_list(&self, tenant: &TenantId) -> Option<Vec<ToolId>> {
        let allow = self.snap.tenants.get(tenant)?.allow.as_ref()?;
        let mut ids: Vec<ToolId> = allow.iter().cloned().collect();
        ids.sort();
        Some(ids)
    }
}

/// The static criteria of a filter, normalized (group, tag and keyword lower-cased:
/// tool ids are lower case, tags and keywords match case-insensitively).
fn criteria(filter: &ToolFilter) -> Criteria {
    Criteria {
        group: filter.group.as_ref().map(|g| g.to_lowercase()),
        tag: filter.tag.as_ref().map(|t| t.to_lowercase()),
        safety: filter.safety_class,
        side_effect: filter.side_effect,
        capability: filter.capability,
        keyword: filter.keyword.as_ref().map(|k| k.to_lowercase()),
    }
}
