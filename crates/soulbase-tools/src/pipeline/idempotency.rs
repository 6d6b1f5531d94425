//! Idempotency: a keyed tool executes once per (tenant, tool, key).
//!
//! The first caller with a key becomes the owner and executes; concurrent callers with
//! the same key and arguments wait for the owner's result and share it; later callers
//! get the stored result. The same key with different arguments is
//! `IDEMPOTENCY.CONFLICT`. An owner refused before execution releases the key, so the
//! next caller may try again.
//!
//! # Across a crash
//!
//! The owner marks the key **begun** ([`IdempotencyStore::begin`]) once its Begin is
//! durable and before the tool runs, and stores its outcome **together with its End**
//! ([`IdempotencyStore::complete`]: the SQL store writes both in one transaction) before
//! it records the End in its evidence sink. So a retry after the owner died finds
//! one of three things: the key done (the stored result is replayed, whatever
//! became of the owner's spool); the key claimed but never begun (nothing ran: once
//! the owner's lease lapses the retry takes the key over and runs the call once); or
//! the key begun but not done (the tool may have run, so it is never run again:
//! once the lease lapses the key is settled with [`interrupted_outcome`], the
//! outcome the owner's spool recovery records as an `aborted` End, and that is
//! replayed). A live owner keeps renewing its lease (backends shared by replicas run
//! a heartbeat), so only a dead or cut-off owner's key lapses.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::EvidenceRecord;
use soulbase_types::{CallId, EnvelopeId, TenantId, ToolId};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::CallResult;

/// The scope of an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey {
    /// The tenant.
    pub tenant: TenantId,
    /// The tool.
    pub tool: ToolId,
    /// The caller's key.
    pub key: String,
}

/// A stored result and the arguments it answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredOutcome {
    /// Digest of the arguments of the call that produced it.
    pub args_digest: String,
    /// The result returned to that call.
    pub result: CallResult,
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// You own the key: `begin` it, execute, then `complete` (or `release` if you
    /// never executed).
    Owner,
    /// A call with this key already completed: return its result.
    Completed(Box<StoredOutcome>),
}

/// The outcome a key whose owner stopped after its Begin (the tool may have run) is
/// settled with: status `error`, `PROVIDER.UNAVAILABLE` with fields `reason:
/// interrupted` and `outcome: unknown`, the owner's call id and Begin as its evidence
/// reference. It answers every retry of the key; the call is never run again under
/// it (use a new key once the effect has been checked).
pub fn interrupted_outcome(
    args_digest: &str,
    call_id: CallId,
    begin_id: Option<EnvelopeId>,
) -> StoredOutcome {
    let err = SoulError::new(
        ErrorCode::ProviderUnavailable,
        "the server running this call stopped before it finished; it may have taken effect and is not run again under this key",
    )
    .with_field("reason", "interrupted")
    .with_field("outcome", "unknown");
    StoredOutcome {
        args_digest: args_digest.to_owned(),
        result: CallResult::failed(call_id, &err, begin_id),
    }
}

/// Where idempotency records live. Backends shared by several replicas (Postgres)
/// make the claim atomic with a unique (tenant, tool, key) constraint.
#[async_trait]
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Claims `key` for a call with `args_digest`, waiting up to `wait` for an in-flight
    /// owner to finish. Different arguments → `IDEMPOTENCY.CONFLICT`.
    async fn claim(
        &self,
        key: &IdempotencyKey,
        args_digest: &str,
        wait: Duration,
    ) -> Result<Claim, SoulError>;
    /// Marks an owned key begun: the call's Begin (`begin`) is durable in the
    /// evidence sink and the tool is about to run. From then on the key is never
    /// handed to another caller to execute; an owner that dies leaves it to be
    /// settled with [`interrupted_outcome`]. A backend that can stores the Begin with
    /// the mark (the sink's copy has the same envelope id). `Err`
    /// (`IDEMPOTENCY.CONFLICT`) when the key is no longer this owner's (its lease
    /// lapsed and another caller took it over): the call must not run. The default
    /// (one process, no crash story) accepts.
    async fn begin(&self, _key: &IdempotencyKey, _begin: &EvidenceRecord) -> Result<(), SoulError> {
        Ok(())
    }
    /// Stores the owner's outcome and wakes waiters. `end` is the call's End, which
    /// the caller records in its evidence sink right after: a backend that can
    /// stores it in the same durable step as the outcome (so a crash between the
    /// two leaves neither a stored outcome without its End nor an End without it);
    /// the sink's copy has the same envelope id and is skipped by the store.
    async fn complete(
        &self,
        key: &IdempotencyKey,
        outcome: StoredOutcome,
        end: Option<&EvidenceRecord>,
    ) -> Result<(), SoulError>;
    /// Gives the key up without an outcome (the owner never executed). A key
    /// marked begun, completed, or no longer this owner's is left as it is.
    async fn release(&self, key: &IdempotencyKey) -> Result<(), SoulError>;
}

enum Entry {
    InFlight {
        digest: String,
        done: Arc<Notify>,
        /// Marked begun: the tool may run, so the key is never released.
        begun: bool,
    },
    Done {
        outcome: Box<StoredOutcome>,
        at: Instant,
    },
}

/// How long a completed record answers retries by default: a day, as common HTTP
/// APIs keep `Idempotency-Key`s.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// Completed records are swept for expiry once per this many completions.
const SWEEP_EVERY: u64 = 1024;

/// Idempotency records in memory (one process). A completed record answers retries
/// for its retention period and is then forgotten, so memory stays bounded by the
/// keys of one period.
pub struct MemoryIdempotency {
    entries: Mutex<Entries>,
    retention: Duration,
}

#[derive(Default)]
struct Entries {
    map: HashMap<IdempotencyKey, Entry>,
    completions: u64,
}

impl Default for MemoryIdempotency {
    fn default() -> Self {
        Self::with_retention(DEFAULT_RETENTION)
    }
}

impl MemoryIdempotency {
    /// An empty store keeping completed records for [`DEFAULT_RETENTION`].
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store keeping completed records for `retention`.
    pub fn with_retention(retention: Duration) -> Self {
        Self {
            entries: Mutex::new(Entries::default()),
            retention,
        }
    }

    fn expired(&self, at: Instant, now: Instant) -> bool {
        now.saturating_duration_since(at) >= self.retention
    }

    /// How many keys the store holds (in flight or completed, expired or not).
    pub fn len(&self) -> usize {
        self.entries.lock().map(|e| e.map.len()).unwrap_or(0)
    }

    /// Whether the store holds no keys.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn conflict() -> SoulError {
    SoulError::new(
        ErrorCode::IdempotencyConflict,
        "this idempotency key was used with different arguments",
    )
    .with_field("field", "idempotency_key")
}

fn poisoned() -> SoulError {
    SoulError::of(ErrorCode::UnknownInternal).with_note("idempotency store poisoned")
}

#[async_trait]
impl IdempotencyStore for MemoryIdempotency {
    async fn claim(
        &self,
        key: &IdempotencyKey,
        args_digest: &str,
        wait: Duration,
    ) -> Result<Claim, SoulError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = {
                let mut entries = self.entries.lock().map_err(|_| poisoned())?;
                let now = Instant::now();
                let entries = &mut entries.map;
                if let Some(Entry::Done { at, .. }) = entries.get(key)
                    && self.expired(*at, now)
                {
                    entries.remove(key);
                }
                match entries.get(key) {
                    None => {
                        entries.insert(
                            key.clone(),
                            Entry::InFlight {
                                digest: args_digest.to_owned(),
                                done: Arc::new(Notify::new()),
                                begun: false,
                            },
                        );
                        return Ok(Claim::Owner);
                    }
                    Some(Entry::Done { outcome, .. }) if outcome.args_digest == args_digest => {
                        return Ok(Claim::Completed(outcome.clone()));
                    }
                    Some(Entry::InFlight { digest, done, .. }) if digest == args_digest => {
                        done.clone()
                    }
                    Some(_) => return Err(conflict()),
                }
            };
            // Register before the lock is gone would be ideal; Notify::notified() only
            // catches notify_waiters() after creation, so create it and re-check.
            let wait_for = notified.notified();
            tokio::pin!(wait_for);
            wait_for.as_mut().enable();
            let still_in_flight = {
                let entries = self.entries.lock().map_err(|_| poisoned())?;
                matches!(entries.map.get(key), Some(Entry::InFlight { done, .. }) if Arc::ptr_eq(done, &notified))
            };
            if still_in_flight && tokio::time::timeout_at(deadline, wait_for).await.is_err() {
                return Err(SoulError::new(
                    ErrorCode::IdempotencyConflict,
                    "a call with this idempotency key is still in progress",
                )
                .with_field("field", "idempotency_key")
                .retry_after(Duration::from_millis(500)));
            }
        }
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        outcome: StoredOutcome,
        _end: Option<&EvidenceRecord>,
    ) -> Result<(), SoulError> {
        let mut entries = self.entries.lock().map_err(|_| poisoned())?;
        let now = Instant::now();
        entries.completions += 1;
        if entries.completions.is_multiple_of(SWEEP_EVERY) {
            entries
                .map
                .retain(|_, e| !matches!(e, Entry::Done { at, .. } if self.expired(*at, now)));
        }
        if let Some(Entry::InFlight { done, .. }) = entries.map.insert(
            key.clone(),
            Entry::Done {
                outcome: Box::new(outcome),
                at: now,
            },
        ) {
            done.notify_waiters();
        }
        Ok(())
    }

    async fn begin(&self, key: &IdempotencyKey, _begin: &EvidenceRecord) -> Result<(), SoulError> {
        let mut entries = self.entries.lock().map_err(|_| poisoned())?;
        if let Some(Entry::InFlight { begun, .. }) = entries.map.get_mut(key) {
            *begun = true;
        }
        Ok(())
    }

    async fn release(&self, key: &IdempotencyKey) -> Result<(), SoulError> {
        let mut entries = self.entries.lock().map_err(|_| poisoned())?;
        let entries = &mut entries.map;
        if let Some(Entry::InFlight { begun: false, .. }) = entries.get(key)
            && let Some(Entry::InFlight { done, .. }) = entries.remove(key)
        {
            done.notify_waiters();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use soulbase_types::CallId;

    use super::*;

    fn key(k: &str) -> IdempotencyKey {
        IdempotencyKey {
            tenant: TenantId::new("acme").unwrap(),
            tool: ToolId::new("demo.calc.add").unwrap(),
            key: k.to_owned(),
        }
    }

    fn outcome(digest: &str) -> StoredOutcome {
        StoredOutcome {
            args_digest: digest.to_owned(),
            result: CallResult::ok(CallId::generate(), serde_json::json!({"n": 1}), None),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn completed_records_answer_retries_until_their_retention_ends() {
        let store = MemoryIdempotency::with_retention(Duration::from_secs(60));
        let wait = Duration::from_secs(1);
        assert_eq!(
            store.claim(&key("k"), "d1", wait).await.unwrap(),
            Claim::Owner
        );
        store
            .complete(&key("k"), outcome("d1"), None)
            .await
            .unwrap();

        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(matches!(
            store.claim(&key("k"), "d1", wait).await.unwrap(),
            Claim::Completed(_)
        ));
        let err = store.claim(&key("k"), "d2", wait).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::IdempotencyConflict);

        tokio::time::advance(Duration::from_secs(1)).await;
        // Expired: the key is free again, even for other arguments.
        assert_eq!(
            store.claim(&key("k"), "d2", wait).await.unwrap(),
            Claim::Owner
        );
    }

    #[tokio::test(start_paused = true)]
    async fn expired_records_are_swept_as_new_ones_complete() {
        let store = MemoryIdempotency::with_retention(Duration::from_secs(1));
        let wait = Duration::from_secs(1);
        for i in 0..SWEEP_EVERY - 1 {
            let k = key(&format!("old{i}"));
            store.claim(&k, "d", wait).await.unwrap();
            store.complete(&k, outcome("d"), None).await.unwrap();
        }
        assert_eq!(store.len(), (SWEEP_EVERY - 1) as usize);
        tokio::time::advance(Duration::from_secs(2)).await;
        store.claim(&key("new"), "d", wait).await.unwrap();
        store
            .complete(&key("new"), outcome("d"), None)
            .await
            .unwrap();
        assert_eq!(store.len(), 1, "only the fresh record is left");
    }
}
