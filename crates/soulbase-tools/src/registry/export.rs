//! Export and restore: the registry's whole state as plain data, so a store can
//! persist it and a restart can rebuild it (manifests, states, owners, tenant
//! overrides, allow-lists).

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use soulbase_errors::{ErrorCode, SoulError, SoulResult};
use soulbase_types::{TenantId, ToolId};

use super::records::RecordKey;
use super::snapshot::{Criteria, Entry, Snapshot};
use super::types::effective_state;
use super::{Registry, RegistryEvent, RegistryView, TenantOverride, ToolOwner, ToolState};
use crate::manifest::problem::problems_error;
use crate::manifest::{CompiledTool, ToolManifest, check_upgrade, compile};

/// One registered tool: who owns it, its manifest and its own state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportedTool {
    /// The owner (global or a tenant).
    pub owner: ToolOwner,
    /// The manifest as registered.
    pub manifest: ToolManifest,
    /// Its own state (before tenant overrides).
    pub state: ToolState,
    /// The compiled manifest's digest (for change detection).
    pub digest: String,
}

/// A tenant's override of a global tool's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportedOverride {
    /// The tenant.
    pub tenant: TenantId,
    /// The global tool.
    pub id: ToolId,
    /// The override.
    pub value: TenantOverride,
}

/// The registry's whole state at one instant, in a stable order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RegistryExport {
    /// Every tool of every owner, ordered by (owner, id).
    pub tools: Vec<ExportedTool>,
    /// Every tenant override, ordered by (tenant, id).
    pub overrides: Vec<ExportedOverride>,
    /// Every tenant allow-list, ordered by tenant.
    pub allow_lists: Vec<(TenantId, BTreeSet<ToolId>)>,
}

/// What [`Registry::restore`] could not apply (the rest was applied).
#[derive(Debug, Default)]
pub struct RestoreReport {
    /// Tools restored.
    pub restored: usize,
    /// Each failure with what it concerned.
    pub failed: Vec<(String, SoulError)>,
}

impl RegistryView {
    /// The registry's whole state in this snapshot.
    pub fn export(&self) -> RegistryExport {
        let all = Criteria::default();
        let mut out = RegistryExport::default();
        let mut push = |owner: ToolOwner, table: &super::snapshot::Table| {
            for e in table.scan(&all, None) {
                out.tools.push(ExportedTool {
                    owner: owner.clone(),
                    manifest: (*e.tool.manifest).clone(),
                    state: e.state,
                    digest: e.tool.digest.clone(),
                });
            }
        };
        push(ToolOwner::Global, &self.snap.global);
        for (tenant, data) in &self.snap.tenants {
            push(ToolOwner::Tenant(tenant.clone()), &data.table);
        }
        let mut overrides = Vec::new();
        let mut allow_lists = Vec::new();
        for (tenant, data) in &self.snap.tenants {
            for (id, value) in &data.overrides {
                overrides.push(ExportedOverride {
                    tenant: tenant.clone(),
                    id: id.clone(),
                    value: *value,
                });
            }
            if let Some(allow) = &data.allow {
                allow_lists.push((tenant.clone(), allow.iter().cloned().collect()));
            }
        }
        out.tools.sort_by(|a, b| {
            (&a.owner, a.manifest.id.as_str()).cmp(&(&b.owner, b.manifest.id.as_str()))
        });
        overrides.sort_by(|a, b| (&a.tenant, &a.id).cmp(&(&b.tenant, &b.id)));
        allow_lists.sort_by(|a, b| a.0.cmp(&b.0));
        out.overrides = overrides;
        out.allow_lists = allow_lists;
        out
    }
}

impl Registry {
    /// The registry's whole state now. See [`RegistryView::export`].
    pub fn export(&self) -> RegistryExport {
        self.view().export()
    }

    /// Applies an export to this registry in **one** write: readers see the state
    /// before or the whole restored state, never a tool on its way to its state
    /// (a tool exported `paused` is never published `enabled` on the way there).
    ///
    /// - Each tool is placed for its owner directly in its exported state. A tool
    ///   already registered with the same digest keeps its compiled form; with
    ///   another digest it is replaced, subject to the upgrade rules like
    ///   [`Registry::update`]. An existing tool moves to the exported state only if
    ///   the lifecycle allows it from its current state, in any number of legal
    ///   steps (`registered → paused` does; `enabled → registered` and leaving
    ///   `deprecated` do not): otherwise the tool is left as it is and reported
    ///   (`REGISTRY.CONFLICT` naming `from` and `to`).
    /// - Overrides and allow-lists are set as exported, including overrides of
    ///   global tools that are unregistered, shadowed by the tenant's own tool or
    ///   outside its allow-list: the registry keeps those as the tenant's policy
    ///   about the id, so an export carries them and a restore must too.
    ///
    /// Only tools absent or changed are compiled (before the writer lock is taken);
    /// each lookup is one index probe, so restoring n tools is O(n log n). A part
    /// that fails is reported and skipped; the rest applies.
    pub fn restore(&self, export: RegistryExport) -> RestoreReport {
        let mut report = RestoreReport::default();
        // Compile, outside the writer lock, the tools the registry lacks or holds
        // in another version (judged on the current view; re-checked under the lock).
        let view = self.view();
        let mut pending = Vec::with_capacity(export.tools.len());
        for t in export.tools {
            let id = t.manifest.id.clone();
            let what = format!("tool {id} ({:?})", t.owner);
            let held = view
                .snap
                .table(t.owner.tenant_id())
                .and_then(|table| table.get(&id))
                .is_some_and(|e| e.tool.digest == t.digest);
            let compiled = if held {
                None
            } else {
                match compile(t.manifest) {
                    Ok(c) => Some(Arc::new(c)),
                    Err(e) => {
                        report.failed.push((what, e.into()));
                        continue;
                    }
                }
            };
            pending.push(Pending {
                owner: t.owner,
                id,
                state: t.state,
                digest: t.digest,
                compiled,
                what,
            });
        }
        drop(view);
        let applied = self.write(|snap, events| {
            let mut done = RestoreReport::default();
            for p in pending {
                match place(snap, events, p.owner.tenant_id(), &p) {
                    Ok(()) => done.restored += 1,
                    Err(e) => done.failed.push((p.what, e)),
                }
            }
            for o in export.overrides {
                let what = format!("override of {} for {}", o.id, o.tenant);
                match place_override(snap, events, &o) {
                    Ok(()) => {}
                    Err(e) => done.failed.push((what, e)),
                }
            }
            for (tenant, allow) in export.allow_lists {
                if tenant == TenantId::global() {
                    done.failed.push((
                        format!("allow-list of {tenant}"),
                        SoulError::new(
                            ErrorCode::RegistryConflict,
                            "the global tenant has no allow-list",
                        ),
                    ));
                    continue;
                }
                let data = snap.tenant_mut(&tenant);
                let new = Some(
                    allow
                        .into_iter()
                        .collect::<super::snapshot::HashSet<ToolId>>(),
                );
                if data.allow != new {
                    data.allow = new;
                    events.push(RegistryEvent::AllowListChanged {
                        tenant: tenant.clone(),
                    });
                }
                snap.prune_tenant(&tenant);
            }
            Ok(done)
        });
        // The closure never fails.
        if let Ok(done) = applied {
            report.restored += done.restored;
            report.failed.extend(done.failed);
        }
        report
    }
}

/// One exported tool, ready to be placed under the writer lock.
struct Pending {
    owner: ToolOwner,
    id: ToolId,
    state: ToolState,
    digest: String,
    /// `None`: the registry held this digest when the restore began.
    compiled: Option<Arc<CompiledTool>>,
    what: String,
}

/// Whether the lifecycle reaches `to` from `from` in legal steps (`from == to`
/// included): nothing returns to `registered`, nothing leaves `deprecated`.
fn reachable(from: ToolState, to: ToolState) -> bool {
    from == to
        || from.can_transition_to(to)
        || (from == ToolState::Registered && to == ToolState::Paused)
}

/// Puts one tool in `tenant`'s table (`None`: global) in its exported state.
fn place(
    snap: &mut Snapshot,
    events: &mut Vec<RegistryEvent>,
    tenant: Option<&TenantId>,
    p: &Pending,
) -> SoulResult<()> {
    let id = &p.id;
    if let Some(tool) = &p.compiled {
        super::check_mcp_name(snap, tenant, tool)?;
    }
    let prev = snap.table(tenant).and_then(|t| t.get(id)).cloned();
    let Some(prev) = prev else {
        let Some(tool) = p.compiled.clone() else {
            return Err(super::conflict(
                format!("tool {id} was removed while the registry was being restored"),
                id,
            ));
        };
        put_new(snap, events, tenant, tool, p.state);
        return Ok(());
    };
    if !reachable(prev.state, p.state) {
        return Err(super::illegal(id, prev.state, p.state));
    }
    let mut tool = None;
    if prev.tool.digest != p.digest {
        let new = match &p.compiled {
            Some(c) if c.digest == prev.tool.digest => None,
            Some(c) => Some(c.clone()),
            None => {
                return Err(super::conflict(
                    format!("tool {id} was changed while the registry was being restored"),
                    id,
                ));
            }
        };
        if let Some(new) = new {
            let problems = check_upgrade(&prev.tool.manifest, &new.manifest);
            if !problems.is_empty() {
                let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
                return Err(problems_error(
                    ErrorCode::RegistryConflict,
                    format!("tool {id} cannot be updated: {}", list.join("; ")),
                    &problems,
                )
                .with_field("tool_id", id.as_str()));
            }
            tool = Some(new);
        }
    }
    put_changed(snap, events, tenant, &prev, tool, p.state);
    Ok(())
}

/// Adds a tool `tenant` (`None`: global) did not have, directly in `state`, with
/// the events a reader expects (`Registered`, then `StateChanged` unless it stays
/// `registered`).
pub(super) fn put_new(
    snap: &mut Snapshot,
    events: &mut Vec<RegistryEvent>,
    tenant: Option<&TenantId>,
    tool: Arc<CompiledTool>,
    state: ToolState,
) {
    let id = tool.manifest.id.clone();
    events.push(RegistryEvent::Registered {
        tenant: tenant.cloned(),
        id: id.clone(),
        version: tool.manifest.version.clone(),
    });
    if state != ToolState::Registered {
        events.push(RegistryEvent::StateChanged {
            tenant: tenant.cloned(),
            id: id.clone(),
            from: ToolState::Registered,
            to: state,
        });
    }
    snap.table_mut(tenant)
        .put(Entry::new(Arc::new(id), tool, state));
}

/// Replaces `prev`'s compiled tool with `tool` (if given and different) and
/// moves it to `state`, with an `Updated` and a `StateChanged` event for what
/// changed; leaves the table alone when nothing did.
pub(super) fn put_changed(
    snap: &mut Snapshot,
    events: &mut Vec<RegistryEvent>,
    tenant: Option<&TenantId>,
    prev: &Arc<Entry>,
    tool: Option<Arc<CompiledTool>>,
    state: ToolState,
) {
    let id = &prev.tool.manifest.id;
    let mut entry = (**prev).clone();
    if let Some(tool) = tool.filter(|t| t.digest != prev.tool.digest) {
        events.push(RegistryEvent::Updated {
            tenant: tenant.cloned(),
            id: id.clone(),
            from: prev.tool.manifest.version.clone(),
            to: tool.manifest.version.clone(),
        });
        entry = entry.with_tool(tool);
    }
    if prev.state != state {
        events.push(RegistryEvent::StateChanged {
            tenant: tenant.cloned(),
            id: id.clone(),
            from: prev.state,
            to: state,
        });
        entry = entry.with_state(state);
    }
    if !Arc::ptr_eq(&entry.tool, &prev.tool) || entry.state != prev.state {
        snap.table_mut(tenant).put(entry);
    }
}

/// Removes what `key` names, if it is there, with the events a reader expects.
pub(super) fn remove(snap: &mut Snapshot, events: &mut Vec<RegistryEvent>, key: &RecordKey) {
    match key {
        RecordKey::Tool { owner, id } => {
            let tenant = owner.tenant_id();
            if snap.table(tenant).is_some_and(|t| t.contains(id))
                && let Some(old) = snap.table_mut(tenant).remove(id)
            {
                events.push(RegistryEvent::Unregistered {
                    tenant: tenant.cloned(),
                    id: id.clone(),
                    version: old.tool.manifest.version.clone(),
                });
            }
            if let Some(t) = tenant {
                snap.prune_tenant(t);
            }
        }
        RecordKey::Override { tenant, id } => {
            let global = snap.global.get(id).map(|e| e.state);
            let Some(data) = snap.tenants.get_mut(tenant) else {
                return;
            };
            let Some(old) = data.overrides.remove(id) else {
                return;
            };
            events.push(RegistryEvent::OverrideChanged {
                tenant: tenant.clone(),
                id: id.clone(),
                value: None,
            });
            let visible = data.allows(id) && !data.table.contains(id);
            if let Some(g) = global
                && visible
            {
                let (before, after) = (effective_state(g, Some(old)), effective_state(g, None));
                if before != after {
                    events.push(RegistryEvent::StateChanged {
                        tenant: Some(tenant.clone()),
                        id: id.clone(),
                        from: before,
                        to: after,
                    });
                }
            }
            snap.prune_tenant(tenant);
        }
        RecordKey::AllowList { tenant } => {
            let Some(data) = snap.tenants.get_mut(tenant) else {
                return;
            };
            if data.allow.take().is_some() {
                events.push(RegistryEvent::AllowListChanged {
                    tenant: tenant.clone(),
                });
            }
            snap.prune_tenant(tenant);
        }
    }
}

/// Sets one exported override as it was, whether or not the tenant can see the
/// global tool now (see [`Registry::restore`]).
pub(super) fn place_override(
    snap: &mut Snapshot,
    events: &mut Vec<RegistryEvent>,
    o: &ExportedOverride,
) -> SoulResult<()> {
    if o.tenant == TenantId::global() {
        return Err(super::conflict(
            "the global tenant has no overrides; change the tool's own state".into(),
            &o.id,
        ));
    }
    let global = snap.global.get(&o.id).map(|e| e.state);
    let data = snap.tenant_mut(&o.tenant);
    let old = data.overrides.insert(o.id.clone(), o.value);
    if old != Some(o.value) {
        events.push(RegistryEvent::OverrideChanged {
            tenant: o.tenant.clone(),
            id: o.id.clone(),
            value: Some(o.value),
        });
        // The tenant's effective state of a global tool it can see changed.
        let visible = data.allows(&o.id) && !data.table.contains(&o.id);
        if let Some(g) = global
            && visible
        {
            let (before, after) = (effective_state(g, old), effective_state(g, Some(o.value)));
            if before != after {
                events.push(RegistryEvent::StateChanged {
                    tenant: Some(o.tenant.clone()),
                    id: o.id.clone(),
                    from: before,
                    to: after,
                });
            }
        }
    }
    Ok(())
}
