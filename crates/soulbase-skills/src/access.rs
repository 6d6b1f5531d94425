//! Seams the runtime checks consult: who is subscribed to which skill, and where
//! cross-skill calls are audited.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use serde::Serialize;
use soulbase_config::{ConfigHandle, SkillSubscription};
use soulbase_errors::ErrorCode;
use soulbase_tools::pipeline::CallStatus;
use soulbase_types::{ActorId, CallId, EnvelopeId, TenantId, ToolId, UnixMillis};

/// Whether a caller holds a subscription to a skill (seed 000 `access`).
pub trait SubscriptionStore: Send + Sync + 'static {
    /// Whether `actor` of `tenant` is subscribed to `skill`.
    fn is_subscribed(&self, tenant: &TenantId, actor: &ActorId, skill: &str) -> bool;
}

/// Subscriptions held in memory: from `skills.subscriptions` in the configuration
/// (following its reloads when built with [`follow`](Self::follow)), or granted at
/// runtime.
#[derive(Default)]
pub struct StaticSubscriptions {
    /// (tenant, actor or `*`, skill).
    entries: RwLock<BTreeSet<(String, String, String)>>,
    /// The followed configuration, and the hash of the snapshot read.
    handle: Option<(ConfigHandle, RwLock<String>)>,
}

impl std::fmt::Debug for StaticSubscriptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticSubscriptions")
            .field("entries", &self.entries)
            .finish_non_exhaustive()
    }
}

impl StaticSubscriptions {
    /// No subscriptions.
    pub fn new() -> Self {
        Self::default()
    }

    /// The configured subscriptions.
    pub fn from_config(subs: &[SkillSubscription]) -> Self {
        let s = Self::new();
        s.replace(subs);
        s
    }

    /// The subscriptions of `handle`'s current snapshot, replaced when a new one is
    /// accepted (checked on each question). Runtime grants last until then.
    pub fn follow(handle: ConfigHandle) -> Self {
        let snap = handle.current();
        let s = Self::from_config(&snap.config().skills.subscriptions);
        Self {
            handle: Some((handle, RwLock::new(snap.hash().to_owned()))),
            ..s
        }
    }

    /// Re-reads the followed configuration if it changed.
    fn refresh(&self) {
        let Some((handle, seen)) = &self.handle else {
            return;
        };
        let snap = handle.current();
        if *seen.read().unwrap_or_else(PoisonError::into_inner) == snap.hash() {
            return;
        }
        let mut seen = seen.write().unwrap_or_else(PoisonError::into_inner);
        if *seen != snap.hash() {
            self.replace(&snap.config().skills.subscriptions);
            *seen = snap.hash().to_owned();
        }
    }

    /// Replaces every subscription (config hot reload).
    pub fn replace(&self, subs: &[SkillSubscription]) {
        let next = subs
            .iter()
            .map(|s| (s.tenant.clone(), s.actor.clone(), s.skill.clone()))
            .collect();
        *self.entries.write().unwrap_or_else(PoisonError::into_inner) = next;
    }

    /// Subscribes `actor` (or `*`) of `tenant` to `skill`.
    pub fn grant(&self, tenant: &str, actor: &str, skill: &str) {
        self.entries
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((tenant.to_owned(), actor.to_owned(), skill.to_owned()));
    }

    /// Removes a subscription granted with the same arguments.
    pub fn revoke(&self, tenant: &str, actor: &str, skill: &str) {
        self.entries
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(tenant.to_owned(), actor.to_owned(), skill.to_owned()));
    }
}

impl SubscriptionStore for StaticSubscriptions {
    fn is_subscribed(&self, tenant: &TenantId, actor: &ActorId, skill: &str) -> bool {
        self.refresh();
        let e = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        let t = tenant.as_str().to_owned();
        e.contains(&(t.clone(), actor.as_str().to_owned(), skill.to_owned()))
            || e.contains(&(t, "*".to_owned(), skill.to_owned()))
    }
}

/// One cross-skill call, allowed or refused (R11/R13 audit).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CrossSkillRecord {
    /// The call.
    pub call_id: CallId,
    /// The caller's tenant.
    pub tenant: TenantId,
    /// The caller's actor.
    pub actor: ActorId,
    /// The calling skill.
    pub caller: String,
    /// The skill providing the tool.
    pub provider: String,
    /// The tool.
    pub tool: ToolId,
    /// How it ended.
    pub status: CallStatus,
    /// The error code, when not ok.
    pub error_code: Option<ErrorCode>,
    /// The call's evidence (its Begin), when it reached execution.
    pub evidence_ref: Option<EnvelopeId>,
    /// When it was decided.
    pub at: UnixMillis,
}

/// Where cross-skill audit records go.
pub trait CrossSkillAudit: Send + Sync + 'static {
    /// Records one cross-skill call.
    fn record(&self, record: CrossSkillRecord);
}

/// Logs each record through `tracing` (target `soulbase::audit`).
#[derive(Debug, Default, Clone, Copy)]
pub struct TracingAudit;

impl CrossSkillAudit for TracingAudit {
    fn record(&self, r: CrossSkillRecord) {
        tracing::info!(
            target: "soulbase::audit",
            call_id = %r.call_id,
            tenant = %r.tenant.as_str(),
            caller = %r.caller,
            provider = %r.provider,
            tool = %r.tool,
            status = ?r.status,
            error_code = ?r.error_code.map(|c| c.as_str()),
            "cross-skill call"
        );
    }
}

/// Keeps every record in memory (tests, linking without storage).
#[derive(Debug, Default, Clone)]
pub struct MemoryAudit {
    records: Arc<Mutex<Vec<CrossSkillRecord>>>,
}

impl MemoryAudit {
    /// An empty audit log.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the records so far.
    pub fn records(&self) -> Vec<CrossSkillRecord> {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl CrossSkillAudit for MemoryAudit {
    fn record(&self, record: CrossSkillRecord) {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(record);
    }
}
