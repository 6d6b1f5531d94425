//! The immutable registry snapshot and its indexes.
//!
//! Everything is a persistent (structurally shared) `imbl` collection: cloning a
//! snapshot is a handful of reference-count increments, and a write copies only
//! the O(log n) nodes on the paths it touches — never the 10,000 entries.
//!
//! Layout of one owner's [`Table`]:
//! - `by_id`: a hash trie `id → Arc<Entry>` — the `get` path is one hash and a
//!   few pointer hops, with no string comparisons down a tree;
//! - every entry also gets a numeric *slot* (assigned once per owner, kept across
//!   updates), and `by_slot` maps it back to the entry;
//! - the inverted indexes are ordered sets of slots. Slots are plain integers, so
//!   copying an index node on write is a `memcpy` with no reference counting and
//!   comparisons are integer compares. Low-cardinality keys (state, safety class,
//!   side effect, capability domain) are fixed arrays of sets; group and tag sets
//!   live in hash tries keyed by `Arc<str>`;
//! - a query walks its smallest matching set, checks the remaining criteria on
//!   each entry (O(1) per criterion), and the caller sorts the (small) result by
//!   id, so output order is deterministic.
//!
//! Measured on the 2-core dev machine with 10,000 tools (release build, means):
//! registering a compiled tool ≈ 10 µs (schema compilation, done before the
//! writer lock, adds ≈ 45 µs for a small manifest), a state change ≈ 5 µs,
//! `get` ≈ 0.3 µs, listing the 100 enabled tools ≈ 8 µs. A keyword-only query
//! scans every visible tool (≈ 0.7 ms for 10,000).

use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use imbl::shared_ptr::DefaultSharedPtr;
use imbl::{GenericHashMap, GenericHashSet, OrdMap, OrdSet};
use soulbase_sandbox::CapabilityDomain;
use soulbase_types::{TenantId, ToolId};

use super::types::{TenantAccess, TenantOverride, ToolState};
use crate::manifest::{CompiledTool, SafetyClass, SideEffect};

/// A tool id, shared by the entry and the id map.
pub(crate) type Key = Arc<ToolId>;
/// A table-local number for an entry.
type Slot = u64;
type SlotSet = OrdSet<Slot>;

/// Slots are distinct sequential integers: use them as their own hash (the hash
/// trie takes its branching bits from the low end, which sequential numbers fill
/// evenly).
#[derive(Default)]
struct SlotHasher(u64);

impl Hasher for SlotHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type SlotMap = GenericHashMap<Slot, Arc<Entry>, BuildHasherDefault<SlotHasher>, DefaultSharedPtr>;

/// The snapshot's persistent maps, hashed with foldhash rather than imbl's
/// default SipHash: a governed call looks a dozen ids up in them, and their keys
/// (tool and tenant ids, group and tag names) come from operators' manifests and
/// configuration, not from callers' requests.
pub(crate) type HashMap<K, V> = GenericHashMap<K, V, foldhash::fast::RandomState, DefaultSharedPtr>;
/// A set hashed as [`HashMap`].
pub(crate) type HashSet<T> = GenericHashSet<T, foldhash::fast::RandomState, DefaultSharedPtr>;

/// One registered tool in one owner's table.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub key: Key,
    slot: Slot,
    pub tool: Arc<CompiledTool>,
    pub state: ToolState,
}

impl Entry {
    /// A new entry; its slot is assigned by [`Table::put`].
    pub fn new(key: Key, tool: Arc<CompiledTool>, state: ToolState) -> Self {
        Self {
            key,
            slot: 0,
            tool,
            state,
        }
    }

    /// The same tool in another state.
    pub fn with_state(&self, state: ToolState) -> Self {
        Self {
            state,
            ..self.clone()
        }
    }

    /// Another compiled tool under the same id and slot, same state.
    pub fn with_tool(&self, tool: Arc<CompiledTool>) -> Self {
        Self {
            tool,
            ..self.clone()
        }
    }
}

/// The static (state-independent) query criteria, normalized once per query.
#[derive(Debug, Default)]
pub(crate) struct Criteria {
    pub group: Option<String>,
    pub tag: Option<String>,
    pub safety: Option<SafetyClass>,
    pub side_effect: Option<SideEffect>,
    pub capability: Option<CapabilityDomain>,
    pub keyword: Option<String>,
}

impl Criteria {
    /// Whether `tool` meets every static criterion.
    pub fn matches(&self, tool: &CompiledTool) -> bool {
        let m = &tool.manifest;
        self.group.as_deref().is_none_or(|g| m.id.group() == g)
            && self.safety.is_none_or(|s| m.safety_class == s)
            && self.side_effect.is_none_or(|s| m.side_effect == s)
            && self
                .capability
                .is_none_or(|c| tool.terms.capabilities.contains(&c))
            && self
                .tag
                .as_deref()
                .is_none_or(|t| tool.terms.tags.iter().any(|x| &**x == t))
            && self
                .keyword
                .as_deref()
                .is_none_or(|k| tool.haystack.contains(k))
    }
}

/// The tools of one owner (global, or one tenant) with their indexes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Table {
    by_id: HashMap<Key, Arc<Entry>>,
    by_slot: SlotMap,
    next_slot: Slot,
    by_state: [SlotSet; 4],
    by_safety: [SlotSet; 3],
    by_side_effect: [SlotSet; 7],
    by_capability: [SlotSet; CapabilityDomain::ALL.len()],
    by_group: HashMap<Arc<str>, SlotSet>,
    by_tag: HashMap<Arc<str>, SlotSet>,
    /// Tools by their manifest's `mcp_name`.
    by_mcp_name: HashMap<Arc<str>, Key>,
}

impl Table {
    pub fn get(&self, id: &ToolId) -> Option<&Arc<Entry>> {
        self.by_id.get(id)
    }

    pub fn contains(&self, id: &ToolId) -> bool {
        self.by_id.contains_key(id)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// The tool whose manifest's `mcp_name` is `name`.
    pub fn by_mcp_name(&self, name: &str) -> Option<&Key> {
        self.by_mcp_name.get(name)
    }

    /// Inserts or replaces the entry for `entry.key`, keeping every index in
    /// step. A replacement keeps its slot; a state change of the same compiled
    /// tool touches only the state sets.
    pub fn put(&mut self, mut entry: Entry) {
        match self.by_id.get(&*entry.key).cloned() {
            Some(old) => {
                entry.slot = old.slot;
                if Arc::ptr_eq(&old.tool, &entry.tool) {
                    if old.state != entry.state {
                        self.by_state[old.state as usize].remove(&old.slot);
                        self.by_state[entry.state as usize].insert(entry.slot);
                    }
                } else {
                    self.unindex(&old);
                    self.index(&entry);
                }
            }
            None => {
                entry.slot = self.next_slot;
                self.next_slot += 1;
                self.index(&entry);
            }
        }
        let entry = Arc::new(entry);
        self.by_slot.insert(entry.slot, entry.clone());
        self.by_id.insert(entry.key.clone(), entry);
    }

    pub fn remove(&mut self, id: &ToolId) -> Option<Arc<Entry>> {
        let old = self.by_id.remove(id)?;
        self.by_slot.remove(&old.slot);
        self.unindex(&old);
        Some(old)
    }

    fn index(&mut self, e: &Entry) {
        let (m, terms, slot) = (&e.tool.manifest, &e.tool.terms, e.slot);
        self.by_state[e.state as usize].insert(slot);
        self.by_safety[m.safety_class as usize].insert(slot);
        self.by_side_effect[m.side_effect as usize].insert(slot);
        for c in &terms.capabilities {
            self.by_capability[*c as usize].insert(slot);
        }
        self.by_group
            .entry(terms.group.clone())
            .or_default()
            .insert(slot);
        for t in terms.tags.iter() {
            self.by_tag.entry(t.clone()).or_default().insert(slot);
        }
        if let Some(name) = &m.mcp_name {
            self.by_mcp_name
                .insert(Arc::from(name.as_str()), e.key.clone());
        }
    }

    fn unindex(&mut self, e: &Entry) {
        let (m, terms, slot) = (&e.tool.manifest, &e.tool.terms, &e.slot);
        self.by_state[e.state as usize].remove(slot);
        self.by_safety[m.safety_class as usize].remove(slot);
        self.by_side_effect[m.side_effect as usize].remove(slot);
        for c in &terms.capabilities {
            self.by_capability[*c as usize].remove(slot);
        }
        remove_from(&mut self.by_group, &terms.group, slot);
        for t in terms.tags.iter() {
            remove_from(&mut self.by_tag, t, slot);
        }
        if let Some(name) = &m.mcp_name
            && self.by_mcp_name.get(name.as_str()) == Some(&e.key)
        {
            self.by_mcp_name.remove(name.as_str());
        }
    }

    /// Entries meeting `c` (and in `state`, if given), in no particular order.
    ///
    /// Walks the smallest index set that applies and checks the rest on each
    /// entry; with no indexed criterion, walks every entry.
    pub fn scan(&self, c: &Criteria, state: Option<ToolState>) -> Vec<&Arc<Entry>> {
        let empty = SlotSet::new();
        let mut sets: Vec<&SlotSet> = Vec::new();
        if let Some(s) = state {
            sets.push(&self.by_state[s as usize]);
        }
        if let Some(g) = &c.group {
            sets.push(self.by_group.get(g.as_str()).unwrap_or(&empty));
        }
        if let Some(t) = &c.tag {
            sets.push(self.by_tag.get(t.as_str()).unwrap_or(&empty));
        }
        if let Some(s) = c.safety {
            sets.push(&self.by_safety[s as usize]);
        }
        if let Some(s) = c.side_effect {
            sets.push(&self.by_side_effect[s as usize]);
        }
        if let Some(d) = c.capability {
            sets.push(&self.by_capability[d as usize]);
        }
        let keep = |e: &&Arc<Entry>| state.is_none_or(|s| e.state == s) && c.matches(&e.tool);
        match sets.into_iter().min_by_key(|s| s.len()) {
            Some(driver) => driver
                .iter()
                .filter_map(|slot| self.by_slot.get(slot))
                .filter(keep)
                .collect(),
            None => self.by_id.values().filter(keep).collect(),
        }
    }
}

fn remove_from(map: &mut HashMap<Arc<str>, SlotSet>, term: &Arc<str>, slot: &Slot) {
    let now_empty = match map.get_mut(&**term) {
        Some(set) => {
            set.remove(slot);
            set.is_empty()
        }
        None => false,
    };
    if now_empty {
        map.remove(&**term);
    }
}

/// One tenant's own tools and its policy over global tools.
#[derive(Debug, Clone, Default)]
pub(crate) struct TenantData {
    pub table: Table,
    /// Per-tenant state overrides of global tools. Kept when the global tool is
    /// unregistered: they are the tenant's policy about that id.
    pub overrides: OrdMap<ToolId, TenantOverride>,
    /// If set, the only global tools the tenant sees.
    pub allow: Option<HashSet<ToolId>>,
}

impl TenantData {
    pub fn allows(&self, id: &ToolId) -> bool {
        self.allow.as_ref().is_none_or(|a| a.contains(id))
    }

    pub fn is_empty(&self) -> bool {
        self.table.len() == 0 && self.overrides.is_empty() && self.allow.is_none()
    }
}

/// One tenant's view rules: what the registry stores for it and what the
/// configuration decides ([`TenantAccess`]), combined.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules<'a> {
    pub stored: Option<&'a TenantData>,
    pub configured: Option<&'a TenantAccess>,
}

impl Rules<'_> {
    /// Whether every allow-list admits global tool `id`.
    pub fn allows(&self, id: &ToolId) -> bool {
        self.stored.is_none_or(|d| d.allows(id))
            && self
                .configured
                .is_none_or(|c| c.allow.as_ref().is_none_or(|a| a.contains(id)))
    }

    /// Whether the tenant's own tool `id` hides the global one.
    pub fn shadows(&self, id: &ToolId) -> bool {
        self.stored.is_some_and(|d| d.table.contains(id))
    }

    /// The tenant's override of global tool `id`: the configured one first.
    pub fn override_of(&self, id: &ToolId) -> Option<TenantOverride> {
        self.configured
            .and_then(|c| c.overrides.get(id).copied())
            .or_else(|| self.stored.and_then(|d| d.overrides.get(id).copied()))
    }

    /// Every id with an override, configured or stored (may repeat).
    pub fn overridden(&self) -> impl Iterator<Item = &ToolId> {
        let configured = self.configured.into_iter().flat_map(|c| c.overrides.keys());
        let stored = self.stored.into_iter().flat_map(|d| d.overrides.keys());
        configured.chain(stored)
    }
}

/// Everything the registry knows at one instant. Never mutated once published.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    pub version: u64,
    pub global: Table,
    pub tenants: HashMap<TenantId, TenantData>,
    /// What the configuration decides per tenant, on top of `tenants`.
    pub configured: Arc<std::collections::HashMap<TenantId, TenantAccess>>,
}

impl Snapshot {
    /// `tenant`'s view rules.
    pub fn rules(&self, tenant: &TenantId) -> Rules<'_> {
        Rules {
            stored: self.tenants.get(tenant),
            configured: self.configured.get(tenant),
        }
    }

    /// The table of `tenant` (`None` = global), if it exists.
    pub fn table(&self, tenant: Option<&TenantId>) -> Option<&Table> {
        match tenant {
            None => Some(&self.global),
            Some(t) => self.tenants.get(t).map(|d| &d.table),
        }
    }

    /// The mutable table of `tenant` (`None` = global), created if needed.
    pub fn table_mut(&mut self, tenant: Option<&TenantId>) -> &mut Table {
        match tenant {
            None => &mut self.global,
            Some(t) => &mut self.tenant_mut(t).table,
        }
    }

    /// The mutable data of tenant `t`, created if needed.
    pub fn tenant_mut(&mut self, t: &TenantId) -> &mut TenantData {
        self.tenants.entry(t.clone()).or_default()
    }

    /// The tool other than `id` that holds `name` as its `mcp_name` in a view a
    /// tool of `tenant` (`None`: global, so every tenant's view) is part of.
    pub fn mcp_name_holder(
        &self,
        tenant: Option<&TenantId>,
        name: &str,
        id: &ToolId,
    ) -> Option<Key> {
        let other = |t: &Table| t.by_mcp_name(name).filter(|k| ***k != *id).cloned();
        match tenant {
            Some(t) => self
                .tenants
                .get(t)
                .and_then(|d| other(&d.table))
                .or_else(|| other(&self.global)),
            None => {
                other(&self.global).or_else(|| self.tenants.values().find_map(|d| other(&d.table)))
            }
        }
    }

    /// Drops tenant data that holds nothing any more.
    pub fn prune_tenant(&mut self, t: &TenantId) {
        if self.tenants.get(t).is_some_and(TenantData::is_empty) {
            self.tenants.remove(t);
        }
    }
}
