//! Registry changes made on someone's behalf — gRPC `ToolRegistry`, the CLI's
//! local mode, a linked application — whichever door they came through.
//!
//! Such a change is **persisted first**, then applied ([`RegistryAdmin`]):
//!
//! 1. it is tried on a fork of the registry (every validation and lifecycle rule
//!    of [`Registry`] runs, nothing is visible yet);
//! 2. the records it changed ([`RecordKey`]: a tool, an override, an
//!    allow-list) go to the [`RegistryLedger`], each with the revision this
//!    process last saw of it. The ledger commits them all or none: if another
//!    replica (or process) changed one of them since, the change is refused with
//!    `REGISTRY.CONFLICT` — optimistic concurrency, never a silent last writer
//!    wins;
//! 3. only then is it applied to the live registry, which publishes its events
//!    (MCP `list_changed`, gRPC watchers).
//!
//! Other replicas apply the committed records with [`RegistryAdmin::apply_stored`]
//! as the shared store announces them (soulbase-store's `RegistryStore::follow`);
//! a record older than the one already applied is ignored, so announcements may
//! repeat or race with a local commit.
//!
//! Every change names who makes it (`by`), and one that committed something is
//! then one [`AuditRecord`] in the admin's [`AuditLog`] ([`RegistryAdmin::with_audit`]):
//! the tenant whose view changed, the tool (or the tenant of an allow-list), and
//! [`state_hash`]es of the record before and after. A refused change, or one that
//! changed nothing, records nothing; records applied from another replica were
//! audited where they were made.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use async_trait::async_trait;
use soulbase_auth::{Action, Authorizer, AuthzRequest};
use soulbase_errors::{ErrorCode, SoulError, SoulResult};
use soulbase_observe::{AuditKind, AuditLog, AuditRecord, state_hash};
use soulbase_types::{Subject, TenantId, ToolId};
use tokio::sync::broadcast::error::TryRecvError;

use super::{
    Record, RecordKey, RecordsReport, Registry, RegistryView, Take, TenantOverride, ToolManifest,
    ToolOwner,
};

/// A change to one record, to be committed only if the record is still at
/// `expected` (`0`: never stored).
#[derive(Debug, Clone, PartialEq)]
pub struct RecordChange {
    /// What the record is about.
    pub key: RecordKey,
    /// The new content; `None` removes it.
    pub record: Option<Record>,
    /// The revision the change was computed from.
    pub expected: u64,
}

/// A record as the ledger holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Committed {
    /// What the record is about.
    pub key: RecordKey,
    /// Its content; `None`: removed.
    pub record: Option<Record>,
    /// Its revision: grows with every commit of this key.
    pub revision: u64,
}

/// Where committed registry records live: a shared database for replicas, or
/// memory for one process.
#[async_trait]
pub trait RegistryLedger: Send + Sync + 'static {
    /// Commits every change, or none: `REGISTRY.CONFLICT` naming the tool when a
    /// record is no longer at its expected revision. Returns the records as
    /// committed.
    async fn commit(&self, changes: &[RecordChange]) -> SoulResult<Vec<Committed>>;

    /// The records under `keys` as committed now (keys never stored are left out).
    async fn fetch(&self, keys: &[RecordKey]) -> SoulResult<Vec<Committed>>;
}

/// A ledger in memory: revisions for one process with nothing to share (tests,
/// an embedding without a database).
#[derive(Debug, Default)]
pub struct MemoryLedger {
    records: Mutex<HashMap<RecordKey, Committed>>,
}

#[async_trait]
impl RegistryLedger for MemoryLedger {
    async fn commit(&self, changes: &[RecordChange]) -> SoulResult<Vec<Committed>> {
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        for c in changes {
            let at = records.get(&c.key).map_or(0, |r| r.revision);
            if at != c.expected {
                return Err(stale(&c.key));
            }
        }
        let mut out = Vec::with_capacity(changes.len());
        for c in changes {
            let committed = Committed {
                key: c.key.clone(),
                record: c.record.clone(),
                revision: c.expected + 1,
            };
            records.insert(c.key.clone(), committed.clone());
            out.push(committed);
        }
        Ok(out)
    }

    async fn fetch(&self, keys: &[RecordKey]) -> SoulResult<Vec<Committed>> {
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(keys
            .iter()
            .filter_map(|k| records.get(k).cloned())
            .collect())
    }
}

/// `REGISTRY.CONFLICT` for a record someone else changed first.
pub fn stale(key: &RecordKey) -> SoulError {
    let (what, id) = match key {
        RecordKey::Tool { id, .. } => (format!("tool {id}"), Some(id)),
        RecordKey::Override { tenant, id } => {
            (format!("the override of {id} for {tenant}"), Some(id))
        }
        RecordKey::AllowList { tenant } => (format!("the allow-list of {tenant}"), None),
    };
    let e = SoulError::new(
        ErrorCode::RegistryConflict,
        format!(
            "{what} was changed by another replica or process meanwhile; read it again and retry"
        ),
    )
    .with_field("reason", "stale_revision");
    match id {
        Some(id) => e.with_field("tool_id", id.as_str()),
        None => e,
    }
}

/// Decides how much of a committed record this process places ([`Take`]): only
/// the state of tools its own sources define (its builtins, its skills
/// directory), everything of the rest.
pub type TakePolicy = Arc<dyn Fn(&RecordKey) -> Take + Send + Sync>;

struct AdminInner {
    registry: Registry,
    ledger: Arc<dyn RegistryLedger>,
    /// The revision of every record applied here (imbl: a change takes a cheap
    /// copy as of its fork).
    seen: Mutex<imbl::HashMap<RecordKey, u64>>,
    /// One local change at a time (a change is fork → commit → apply).
    writes: tokio::sync::Mutex<()>,
    take: Option<TakePolicy>,
    /// Where committed changes are audited (none: not audited).
    audit: OnceLock<Arc<dyn AuditLog>>,
}

/// Makes registry changes on someone's behalf: persisted first, then applied
/// (see the module doc). Cheap to clone.
#[derive(Clone)]
pub struct RegistryAdmin {
    inner: Arc<AdminInner>,
}

impl std::fmt::Debug for RegistryAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAdmin").finish_non_exhaustive()
    }
}

impl RegistryAdmin {
    /// Changes to `registry`, committed to `ledger`.
    pub fn new(registry: Registry, ledger: Arc<dyn RegistryLedger>) -> Self {
        Self::build(registry, ledger, None)
    }

    /// Like [`Self::new`], placing of each committed record what `take` says.
    pub fn with_take_policy(
        registry: Registry,
        ledger: Arc<dyn RegistryLedger>,
        take: TakePolicy,
    ) -> Self {
        Self::build(registry, ledger, Some(take))
    }

    fn build(
        registry: Registry,
        ledger: Arc<dyn RegistryLedger>,
        take: Option<TakePolicy>,
    ) -> Self {
        Self {
            inner: Arc::new(AdminInner {
                registry,
                ledger,
                seen: Mutex::new(imbl::HashMap::new()),
                writes: tokio::sync::Mutex::new(()),
                take,
                audit: OnceLock::new(),
            }),
        }
    }

    /// Audits every change committed through this admin and its clones in `log`
    /// (one [`AuditRecord`] per change, after it took effect). Set once, before
    /// the admin is used: a later log is ignored.
    pub fn with_audit(self, log: Arc<dyn AuditLog>) -> Self {
        if self.inner.audit.set(log).is_err() {
            tracing::warn!("the registry admin already has an audit log; the new one is ignored");
        }
        self
    }

    /// An admin for `registry` with nothing shared ([`MemoryLedger`]).
    pub fn in_memory(registry: Registry) -> Self {
        Self::new(registry, Arc::new(MemoryLedger::default()))
    }

    /// The live registry.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// The revision of `key` applied here (`0`: none).
    pub fn revision(&self, key: &RecordKey) -> u64 {
        self.seen().get(key).copied().unwrap_or(0)
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, imbl::HashMap<RecordKey, u64>> {
        self.inner
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on a fork of the registry, commits the records it changed, then
    /// applies them: `f`'s refusal, or `REGISTRY.CONFLICT` if another replica
    /// changed one of them first (this process then takes the newer records, so
    /// a retry starts from them), or the ledger's error (nothing changed).
    ///
    /// Records no audit: a change made for someone goes through the methods
    /// below, which name who makes it.
    pub async fn change<R>(&self, f: impl FnOnce(&Registry) -> SoulResult<R>) -> SoulResult<R> {
        self.commit(f).await.map(|(out, _)| out)
    }

    /// [`change`](Self::change), returning also the views before and after when
    /// something was committed (`None`: nothing changed).
    async fn commit<R>(
        &self,
        f: impl FnOnce(&Registry) -> SoulResult<R>,
    ) -> SoulResult<(R, Option<(RegistryView, RegistryView)>)> {
        let _one = self.inner.writes.lock().await;
        // The fork and the revisions it starts from, taken together.
        let (fork, seen) = {
            let seen = self.seen();
            (self.inner.registry.fork(), seen.clone())
        };
        let base = fork.view();
        let mut events = fork.subscribe();
        let out = f(&fork)?;
        let keys = touched(&mut events, &base, &fork.view());
        let after = fork.view();
        let mut changed: BTreeSet<RecordKey> = keys
            .into_iter()
            .filter(|key| after.record(key) != base.record(key))
            .collect();
        // A tenant's override is a decision about its global tool: committing
        // the tool's record with it (unchanged, a new revision) makes it conflict
        // with a concurrent change of that tool — an unregister dropping the
        // enabling overrides it knows must not miss one made meanwhile.
        let parents: Vec<RecordKey> = changed
            .iter()
            .filter_map(|k| match k {
                RecordKey::Override { id, .. } => Some(RecordKey::Tool {
                    owner: ToolOwner::Global,
                    id: id.clone(),
                }),
                _ => None,
            })
            .filter(|parent| base.record(parent).is_some())
            .collect();
        changed.extend(parents);
        let changes: Vec<RecordChange> = changed
            .into_iter()
            .map(|key| RecordChange {
                expected: seen.get(&key).copied().unwrap_or(0),
                record: after.record(&key),
                key,
            })
            .collect();
        if changes.is_empty() {
            return Ok((out, None));
        }
        match self.inner.ledger.commit(&changes).await {
            Ok(committed) => {
                self.apply(committed, false);
                Ok((out, Some((base, after))))
            }
            Err(e) if e.code() == ErrorCode::RegistryConflict => {
                let keys: Vec<RecordKey> = changes.into_iter().map(|c| c.key).collect();
                match self.inner.ledger.fetch(&keys).await {
                    Ok(newer) => {
                        self.apply_stored(newer);
                    }
                    Err(f) => {
                        tracing::warn!(error = %f, "could not read the newer registry records")
                    }
                }
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Applies records read from the shared store (at start, or announced by
    /// another replica): each only if newer than what was applied here, as much
    /// of it as the take policy says. A record that cannot be placed keeps its
    /// key at the revision placed before, so a change made here to it is
    /// refused as stale instead of overwriting what this process could not take.
    pub fn apply_stored(&self, committed: Vec<Committed>) -> RecordsReport {
        self.apply(committed, true)
    }

    fn apply(&self, committed: Vec<Committed>, stored: bool) -> RecordsReport {
        let mut seen = self.seen();
        let mut fresh = Vec::with_capacity(committed.len());
        let mut revisions = HashMap::with_capacity(committed.len());
        for c in committed {
            // A change's own records are placed even if the follower read them
            // back first (it may have taken only part of them).
            let newer = |r: u64| {
                if stored {
                    c.revision > r
                } else {
                    c.revision >= r
                }
            };
            if !seen.get(&c.key).is_none_or(|&r| newer(r)) {
                continue;
            }
            let take = self.inner.take.as_ref().map_or(Take::Whole, |t| t(&c.key));
            revisions.insert(c.key.clone(), c.revision);
            fresh.push((c.key, c.record, take));
        }
        // Under the lock, so two appliers cannot place an older record last.
        let report = self.inner.registry.apply_records(fresh);
        for key in &report.placed {
            if let Some(&r) = revisions.get(key) {
                seen.insert(key.clone(), r);
            }
        }
        for (key, e) in &report.failed {
            tracing::warn!(?key, error = %e, "could not apply a committed registry record");
        }
        report
    }

    /// [`commit`](Self::commit)s `f` made by `by`; when it committed something,
    /// appends one audit record of `kind` about the record under `key` (the
    /// tenant whose view changed, the target, hashes before and after). An audit
    /// log that fails then cannot undo the change: the record is logged at ERROR
    /// instead, and the change stands.
    async fn audited(
        &self,
        by: &Subject,
        kind: AuditKind,
        key: RecordKey,
        f: impl FnOnce(&Registry) -> SoulResult<()>,
    ) -> SoulResult<()> {
        let ((), views) = self.commit(f).await?;
        let (Some((base, after)), Some(log)) = (views, self.inner.audit.get()) else {
            return Ok(());
        };
        let before = base.record(&key);
        let now = after.record(&key);
        let (tenant, target) = match &key {
            RecordKey::Tool { owner, id } => (
                owner.tenant_id().cloned().unwrap_or_else(TenantId::global),
                id.to_string(),
            ),
            RecordKey::Override { tenant, id } => (tenant.clone(), id.to_string()),
            RecordKey::AllowList { tenant } => (tenant.clone(), tenant.to_string()),
        };
        let record = AuditRecord::new(tenant, by, kind, target)
            .hashes(record_hash(before.as_ref()), record_hash(now.as_ref()))
            .detail(describe(before.as_ref(), now.as_ref()));
        if let Err(e) = log.append(&record).await {
            tracing::error!(
                error = %e,
                record = ?record,
                "audit record lost: the registry change took effect but could not be audited"
            );
        }
        Ok(())
    }

    /// Registers `manifest` for `owner`, enabled at once if `enable`, on behalf
    /// of `by` (audited as `registry.register`).
    pub async fn register(
        &self,
        by: &Subject,
        owner: &ToolOwner,
        manifest: ToolManifest,
        enable: bool,
    ) -> SoulResult<()> {
        let key = tool_key(owner, &manifest.id);
        self.audited(by, AuditKind::RegistryRegister, key, |r| {
            let id = manifest.id.clone();
            r.register_in(owner, manifest)?;
            if enable {
                r.enable(owner, &id)?;
            }
            Ok(())
        })
        .await
    }

    /// Replaces `owner`'s tool with a new version (see [`Registry::update`]) on
    /// behalf of `by` (audited as `registry.update`).
    pub async fn update(
        &self,
        by: &Subject,
        owner: &ToolOwner,
        manifest: ToolManifest,
    ) -> SoulResult<()> {
        let key = tool_key(owner, &manifest.id);
        self.audited(by, AuditKind::RegistryUpdate, key, |r| {
            r.update(owner, manifest).map(|_| ())
        })
        .await
    }

    /// Applies a state change (see [`StateChange`]) on behalf of `by` (audited
    /// as `registry.state`).
    pub async fn set_state(
        &self,
        by: &Subject,
        owner: &ToolOwner,
        id: &ToolId,
        change: StateChange,
    ) -> SoulResult<()> {
        self.audited(
            by,
            AuditKind::RegistryState,
            tool_key(owner, id),
            |r| match change {
                StateChange::Enable => r.enable(owner, id),
                StateChange::Pause => r.pause(owner, id),
                StateChange::Deprecate => r.deprecate(owner, id),
            },
        )
        .await
    }

    /// Removes `owner`'s tool (see [`Registry::unregister`]) on behalf of `by`
    /// (audited as `registry.unregister`).
    pub async fn unregister(&self, by: &Subject, owner: &ToolOwner, id: &ToolId) -> SoulResult<()> {
        self.audited(
            by,
            AuditKind::RegistryUnregister,
            tool_key(owner, id),
            |r| r.unregister(owner, id),
        )
        .await
    }

    /// See [`Registry::set_tenant_override`]; on behalf of `by` (audited as
    /// `registry.override` in `tenant`).
    pub async fn set_tenant_override(
        &self,
        by: &Subject,
        tenant: &TenantId,
        id: &ToolId,
        value: Option<TenantOverride>,
    ) -> SoulResult<()> {
        let key = RecordKey::Override {
            tenant: tenant.clone(),
            id: id.clone(),
        };
        self.audited(by, AuditKind::RegistryOverride, key, |r| {
            r.set_tenant_override(tenant, id, value)
        })
        .await
    }

    /// See [`Registry::set_allow_list`]; on behalf of `by` (audited as
    /// `registry.allow_list` in `tenant`).
    pub async fn set_allow_list(
        &self,
        by: &Subject,
        tenant: &TenantId,
        allow: Option<BTreeSet<ToolId>>,
    ) -> SoulResult<()> {
        let key = RecordKey::AllowList {
            tenant: tenant.clone(),
        };
        self.audited(by, AuditKind::RegistryAllowList, key, |r| {
            r.set_allow_list(tenant, allow)
        })
        .await
    }
}

fn tool_key(owner: &ToolOwner, id: &ToolId) -> RecordKey {
    RecordKey::Tool {
        owner: owner.clone(),
        id: id.clone(),
    }
}

/// The audit hash of a record (`None`: there is none).
fn record_hash(record: Option<&Record>) -> Option<String> {
    let value = serde_json::to_value(record?).ok()?;
    Some(state_hash(&value))
}

/// A short description of a record's change, for the audit.
fn describe(before: Option<&Record>, after: Option<&Record>) -> String {
    fn tool(t: &super::ExportedTool) -> String {
        format!("version {}, {}", t.manifest.version, t.state.as_str())
    }
    fn allow(tools: &BTreeSet<ToolId>) -> String {
        const SHOWN: usize = 10;
        let names: Vec<&str> = tools.iter().take(SHOWN).map(ToolId::as_str).collect();
        let more = tools.len().saturating_sub(SHOWN);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        format!("allows {} tool(s): {}{more}", tools.len(), names.join(", "))
    }
    fn one(r: &Record) -> String {
        match r {
            Record::Tool(t) => tool(t),
            Record::Override(o) => match o.value {
                TenantOverride::Enabled => "override enabled".to_owned(),
                TenantOverride::Paused => "override paused".to_owned(),
            },
            Record::AllowList { tools, .. } => allow(tools),
        }
    }
    match (before, after) {
        (None, None) => "no change".to_owned(),
        (None, Some(a)) => one(a),
        (Some(b), None) => format!("removed ({})", one(b)),
        (Some(b), Some(a)) => format!("{} → {}", one(b), one(a)),
    }
}

/// The records a fork's events say changed; if the events overflowed, every
/// record either view holds.
fn touched(
    events: &mut tokio::sync::broadcast::Receiver<super::RegistryEvent>,
    base: &RegistryView,
    after: &RegistryView,
) -> BTreeSet<RecordKey> {
    let mut keys = BTreeSet::new();
    loop {
        match events.try_recv() {
            Ok(e) => keys.extend(RecordKey::touched_by(&e)),
            Err(TryRecvError::Lagged(_)) => {
                for view in [base, after] {
                    let export = view.export();
                    keys.extend(export.tools.iter().map(|t| RecordKey::Tool {
                        owner: t.owner.clone(),
                        id: t.manifest.id.clone(),
                    }));
                    keys.extend(export.overrides.iter().map(|o| RecordKey::Override {
                        tenant: o.tenant.clone(),
                        id: o.id.clone(),
                    }));
                    keys.extend(
                        export
                            .allow_lists
                            .iter()
                            .map(|(t, _)| RecordKey::AllowList { tenant: t.clone() }),
                    );
                }
            }
            Err(TryRecvError::Empty | TryRecvError::Closed) => return keys,
        }
    }
}

/// A change of a tool's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateChange {
    /// Enable it (action `enable`).
    Enable,
    /// Pause it (action `disable`).
    Pause,
    /// Mark it deprecated (action `deprecate`).
    Deprecate,
}

impl StateChange {
    /// The action the change is authorized as.
    pub fn action(self) -> Action {
        match self {
            StateChange::Enable => Action::Enable,
            StateChange::Pause => Action::Disable,
            StateChange::Deprecate => Action::Deprecate,
        }
    }
}

/// Whether `subject` may perform `action` on tool `id` of `owner`: the
/// authorizer's decision, its refusal as it gave it.
pub async fn authorize(
    authorizer: &dyn Authorizer,
    subject: &Subject,
    owner: &ToolOwner,
    id: &ToolId,
    action: Action,
) -> Result<(), SoulError> {
    authorizer
        .authorize(AuthzRequest {
            subject,
            tool: id,
            tool_tenant: owner.tenant_id(),
            action,
            tool_scopes: &[],
        })
        .await
        .map(|_| ())
}

/// Applies `change` to tool `id` of `owner` for `subject`, once the authorizer
/// allows the change's action (audited as made by `subject`).
pub async fn change_state(
    authorizer: &dyn Authorizer,
    admin: &RegistryAdmin,
    subject: &Subject,
    owner: &ToolOwner,
    id: &ToolId,
    change: StateChange,
) -> Result<(), SoulError> {
    authorize(authorizer, subject, owner, id, change.action()).await?;
    admin.set_state(subject, owner, id, change).await
}
