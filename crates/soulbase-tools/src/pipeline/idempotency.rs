//! Idempotency: a keyed tool executes once per (tenant, tool, key).
//!
//! The first caller with a key becomes the owner and executes; concurrent callers with
//! the same key and arguments wait for the owner's result and share it; later callers
//! get the stored result. The same key with different arguments is
//! `IDEMPOTENCY.CONFLICT`. An owner refused before execution releases the key, so the
//! next caller may try again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{TenantId, ToolId};
use tokio::sync::Notify;

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
    /// You own the key: execute, then `complete` (or `release` if you never executed).
    Owner,
    /// A call with this key already completed: return its result.
    Completed(Box<StoredOutcome>),
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
    /// Stores the owner's outcome and wakes waiters.
    async fn complete(&self, key: &IdempotencyKey, outcome: StoredOutcome)
    -> Result<(), SoulError>;
    /// Gives the key up without an outcome (the owner never executed).
    async fn release(&self, key: &IdempotencyKey) -> Result<(), SoulError>;
}

enum Entry {
    InFlight { digest: String, done: Arc<Notify> },
    Done(StoredOutcome),
}

/// Idempotency records in memory (one process). Records live as long as the store.
#[derive(Default)]
pub struct MemoryIdempotency {
    entries: Mutex<HashMap<IdempotencyKey, Entry>>,
}

impl MemoryIdempotency {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
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
                match entries.get(key) {
                    None => {
                        entries.insert(
                            key.clone(),
                            Entry::InFlight {
                                digest: args_digest.to_owned(),
                                done: Arc::new(Notify::new()),
                            },
                        );
                        return Ok(Claim::Owner);
                    }
                    Some(Entry::Done(outcome)) if outcome.args_digest == args_digest => {
                        return Ok(Claim::Completed(Box::new(outcome.clone())));
                    }
                    Some(Entry::InFlight { digest, done }) if digest == args_digest => done.clone(),
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
                matches!(entries.get(key), Some(Entry::InFlight { done, .. }) if Arc::ptr_eq(done, &notified))
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
    ) -> Result<(), SoulError> {
        let mut entries = self.entries.lock().map_err(|_| poisoned())?;
        if let Some(Entry::InFlight { done, .. }) =
            entries.insert(key.clone(), Entry::Done(outcome))
        {
            done.notify_waiters();
        }
        Ok(())
    }

    async fn release(&self, key: &IdempotencyKey) -> Result<(), SoulError> {
        let mut entries = self.entries.lock().map_err(|_| poisoned())?;
        if let Some(Entry::InFlight { .. }) = entries.get(key)
            && let Some(Entry::InFlight { done, .. }) = entries.remove(key)
        {
            done.notify_waiters();
        }
        Ok(())
    }
}
