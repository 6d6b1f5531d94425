//! The registry's state as keyed records — one per tool, per tenant override and
//! per tenant allow-list — so that a shared store can version each one and
//! replicas can exchange changes record by record (see [`super::admin`]).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use soulbase_types::{TenantId, ToolId};
use tokio::sync::broadcast;

use super::export::{ExportedOverride, ExportedTool, RestoreReport};
use super::{EVENT_CAPACITY, Inner, Registry, RegistryEvent, RegistryView, ToolOwner};

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

    /// Sets each key to its record — `None` removes what is there — in **one**
    /// write, as [`Registry::restore`] places records (lifecycle and upgrade rules
    /// included). A removal of something absent is a no-op. What cannot be applied
    /// is reported; the rest applies.
    pub fn apply_records(&self, records: Vec<(RecordKey, Option<Record>)>) -> RestoreReport {
        let mut present = super::RegistryExport::default();
        let mut removed = Vec::new();
        for (key, record) in records {
            match record {
                Some(Record::Tool(t)) => present.tools.push(*t),
                Some(Record::Override(o)) => present.overrides.push(o),
                Some(Record::AllowList { tenant, tools }) => {
                    present.allow_lists.push((tenant, tools))
                }
                None => removed.push(key),
            }
        }
        self.restore_and_remove(present, removed)
    }
}
