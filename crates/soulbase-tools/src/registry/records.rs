//! The registry's state as keyed records — one per tool, per tenant override and
//! per tenant allow-list — so that a shared store can version each one and
//! replicas can exchange changes record by record (see [`super::admin`]).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use soulbase_types::{TenantId, ToolId};
use tokio::sync::broadcast;

use soulbase_errors::{ErrorCode, SoulError, SoulResult};

use super::export::{ExportedOverride, ExportedTool, place_override, put_changed, put_new, remove};
use super::snapshot::Snapshot;
use super::{EVENT_CAPACITY, Inner, Registry, RegistryEvent, RegistryView, ToolOwner};
use crate::manifest::{CompiledTool, compile};

/// What one record is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RecordKey {
    /// A tool of an owner.
    Tool {
        /// The owner.
        owner: ToolOwner,
        /// The tool.
        id: ToolId,
    },
    /// A tenant's override of a global tool's state.
    Override {
        /// The tenant.
        tenant: TenantId,
        /// The global tool.
        id: ToolId,
    },
    /// A tenant's allow-list of global tools.
    AllowList {
        /// The tenant.
        tenant: TenantId,
    },
}

/// The content of a record; a key without a record means "none" (a tool
/// unregistered, an override cleared, no allow-list).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// A tool: manifest, own state, digest.
    Tool(Box<ExportedTool>),
    /// An override.
    Override(ExportedOverride),
    /// An allow-list.
    AllowList {
        /// The tenant.
        tenant: TenantId,
        /// The global tools it sees.
        tools: BTreeSet<ToolId>,
    },
}

impl Record {
    /// The key this record is stored under.
    pub fn key(&self) -> RecordKey {
        match self {
            Record::Tool(t) => RecordKey::Tool {
                owner: t.owner.clone(),
                id: t.manifest.id.clone(),
            },
            Record::Override(o) => RecordKey::Override {
                tenant: o.tenant.clone(),
                id: o.id.clone(),
            },
            Record::AllowList { tenant, .. } => RecordKey::AllowList {
                tenant: tenant.clone(),
            },
        }
    }
}

impl RecordKey {
    /// The records a published event may have changed.
    pub(crate) fn touched_by(event: &RegistryEvent) -> Vec<RecordKey> {
        let tool = |tenant: &Option<TenantId>, id: &ToolId| RecordKey::Tool {
            owner: tenant.clone().map_or(ToolOwner::Global, ToolOwner::Tenant),
            id: id.clone(),
        };
        match event {
            RegistryEvent::Registered { tenant, id, .. }
            | RegistryEvent::Updated { tenant, id, .. }
            | RegistryEvent::Unregistered { tenant, id, .. } => vec![tool(tenant, id)],
            // A tenant's effective state of a global tool also changes through an
            // override, which has its own event.
            RegistryEvent::StateChanged { tenant, id, .. } => vec![tool(tenant, id)],
            RegistryEvent::OverrideChanged { tenant, id, .. } => vec![RecordKey::Override {
                tenant: tenant.clone(),
                id: id.clone(),
            }],
            RegistryEvent::AllowListChanged { tenant } => vec![RecordKey::AllowList {
                tenant: tenant.clone(),
            }],
        }
    }
}

impl RegistryView {
    /// The record under `key` in this snapshot (`None`: there is none).
    pub fn record(&self, key: &RecordKey) -> Option<Record> {
        match key {
            RecordKey::Tool { owner, id } => {
                let e = self.snap.table(owner.tenant_id())?.get(id)?;
                Some(Record::Tool(Box::new(ExportedTool {
                    owner: owner.clone(),
                    manifest: (*e.tool.manifest).clone(),
                    state: e.state,
                    digest: e.tool.digest.clone(),
                })))
            }
            RecordKey::Override { tenant, id } => {
                let value = *self.snap.tenants.get(tenant)?.overrides.get(id)?;
                Some(Record::Override(ExportedOverride {
                    tenant: tenant.clone(),
                    id: id.clone(),
                    value,
                }))
            }
            RecordKey::AllowList { tenant } => {
                let allow = self.snap.tenants.get(tenant)?.allow.as_ref()?;
                Some(Record::AllowList {
                    tenant: tenant.clone(),
                    tools: allow.iter().cloned().collect(),
                })
            }
        }
    }
}

impl Registry {
    /// A separate registry starting from this one's current state (structural
    /// sharing: no copy), with its own writer and events. Changes to either are
    /// not seen by the other: a scratch copy to try a change on.
    pub(crate) fn fork(&self) -> Registry {
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        Registry {
            inner: Arc::new(Inner {
                current: ArcSwap::new(self.inner.current.load_full()),
                writer: Mutex::new(()),
                events,
            }),
        }
    }

    /// Places committed records — each as its committer decided it, in **one**
    /// write — and says which were placed. These are the result of changes that
    /// passed every lifecycle and upgrade rule where they were made, so they are
    /// placed as they are (a tool replaced by its stored manifest and put in its
    /// stored state directly), never judged again against this process's
    /// possibly older picture. `None` removes what the key names. [`Take`] says
    /// how much of each record to take. A record that cannot be placed (a
    /// manifest this build cannot compile) is reported and left out.
    pub fn apply_records(&self, records: Vec<(RecordKey, Option<Record>, Take)>) -> RecordsReport {
        // Compile, outside the writer lock, the tools taken whole that the
        // registry lacks or holds in another version.
        let view = self.view();
        let mut report = RecordsReport::default();
        let mut ready = Vec::with_capacity(records.len());
        for (key, record, take) in records {
            let compiled = match (&record, take) {
                (Some(Record::Tool(t)), Take::Whole) => {
                    let held = view
                        .snap
                        .table(t.owner.tenant_id())
                        .and_then(|table| table.get(&t.manifest.id))
                        .is_some_and(|e| e.tool.digest == t.digest);
                    if held {
                        None
                    } else {
                        match compile(t.manifest.clone()) {
                            Ok(c) => Some(Arc::new(c)),
                            Err(e) => {
                                report.failed.push((key, e.into()));
                                continue;
                            }
                        }
                    }
                }
                _ => None,
            };
            ready.push((key, record, take, compiled));
        }
        drop(view);
        let applied = self.write(|snap, events| {
            let mut done = RecordsReport::default();
            for (key, record, take, compiled) in ready {
                match place_record(snap, events, &key, record, take, compiled) {
                    Ok(true) => done.placed.push(key),
                    Ok(false) => {}
                    Err(e) => done.failed.push((key, e)),
                }
            }
            Ok(done)
        });
        // The closure never fails.
        if let Ok(done) = applied {
            report.placed = done.placed;
            report.failed.extend(done.failed);
        }
        report
    }
}

/// How much of a committed record a process takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// All of it.
    Whole,
    /// Only a tool's state, if this process holds the tool: for tools whose
    /// manifests come from this process's own sources (its binary's builtins, its
    /// skills directory), which also decide whether they exist.
    StateOnly,
}

/// What [`Registry::apply_records`] placed and what it could not. A state-only
/// record of a tool this process does not hold is in neither list.
#[derive(Debug, Default)]
pub struct RecordsReport {
    /// The keys placed (or found as their records say).
    pub placed: Vec<RecordKey>,
    /// The keys left out, each with why.
    pub failed: Vec<(RecordKey, SoulError)>,
}

/// Places one committed record (see [`Registry::apply_records`]): `false` for a
/// state-only record of a tool this process does not hold (not placed, yet
/// nothing wrong: it may load later).
fn place_record(
    snap: &mut Snapshot,
    events: &mut Vec<RegistryEvent>,
    key: &RecordKey,
    record: Option<Record>,
    take: Take,
    compiled: Option<Arc<CompiledTool>>,
) -> SoulResult<bool> {
    match (record, take) {
        // A tool this process's own sources define: they decide whether it
        // exists, the store only its state.
        (None, Take::StateOnly) => Ok(true),
        (Some(Record::Tool(t)), Take::StateOnly) => {
            let tenant = t.owner.tenant_id();
            let Some(prev) = snap
                .table(tenant)
                .and_then(|x| x.get(&t.manifest.id))
                .cloned()
            else {
                return Ok(false);
            };
            put_changed(snap, events, tenant, &prev, None, t.state);
            Ok(true)
        }
        (None, Take::Whole) => {
            remove(snap, events, key);
            Ok(true)
        }
        (Some(Record::Tool(t)), Take::Whole) => {
            let tenant = t.owner.tenant_id();
            let prev = snap
                .table(tenant)
                .and_then(|x| x.get(&t.manifest.id))
                .cloned();
            let tool = match (&prev, compiled) {
                (_, Some(c)) => c,
                (Some(p), None) if p.tool.digest == t.digest => p.tool.clone(),
                // Changed or removed since the view the compile judged on.
                _ => compile(t.manifest.clone()).map(Arc::new)?,
            };
            match prev {
                None => put_new(snap, events, tenant, tool, t.state),
                Some(prev) => put_changed(snap, events, tenant, &prev, Some(tool), t.state),
            }
            Ok(true)
        }
        (Some(Record::Override(o)), _) => place_override(snap, events, &o).map(|()| true),
        (Some(Record::AllowList { tenant, tools }), _) => {
            if tenant == TenantId::global() {
                return Err(SoulError::new(
                    ErrorCode::RegistryConflict,
                    "the global tenant has no allow-list",
                ));
            }
            let data = snap.tenant_mut(&tenant);
            let new = Some(
                tools
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
            Ok(true)
        }
    }
}
