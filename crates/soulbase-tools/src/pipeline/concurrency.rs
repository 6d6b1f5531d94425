//! `concurrency: serial` and `limits.max_concurrency`, per (tenant, tool).

use foldhash::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{TenantId, ToolId};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The slots of one (tenant, tool): how many there are, and the semaphore holding them.
type Slots = (u32, Arc<Semaphore>);

/// Semaphores per tenant and tool. Calls only read the map once a (tenant, tool) has
/// been seen, so concurrent calls never wait on each other here; a changed permit
/// count (the manifest was updated) replaces the semaphore.
#[derive(Default)]
pub(crate) struct ConcurrencyLimiter {
    slots: RwLock<HashMap<TenantId, HashMap<ToolId, Slots>>>,
}

fn poisoned<T>(_: T) -> SoulError {
    SoulError::of(ErrorCode::UnknownInternal).with_note("concurrency limiter poisoned")
}

impl ConcurrencyLimiter {
    /// The semaphore of (tenant, tool) with `permits` slots.
    fn semaphore(
        &self,
        tenant: &TenantId,
        tool: &ToolId,
        permits: u32,
    ) -> Result<Arc<Semaphore>, SoulError> {
        {
            let slots = self.slots.read().map_err(poisoned)?;
            if let Some((n, sem)) = slots.get(tenant).and_then(|t| t.get(tool))
                && *n == permits
            {
                return Ok(sem.clone());
            }
        }
        let mut slots = self.slots.write().map_err(poisoned)?;
        let entry = slots
            .entry(tenant.clone())
            .or_default()
            .entry(tool.clone())
            .or_insert_with(|| (permits, Arc::new(Semaphore::new(permits.max(1) as usize))));
        if entry.0 != permits {
            *entry = (permits, Arc::new(Semaphore::new(permits.max(1) as usize)));
        }
        Ok(entry.1.clone())
    }

    /// Waits (at most `wait`) for one of `permits` slots of (tenant, tool).
    ///
    /// Waiting past `wait` means the call never starts: `QUOTA.RATE_LIMITED` with a
    /// retry hint, and no evidence (it never reached execution).
    pub(crate) async fn acquire(
        &self,
        tenant: &TenantId,
        tool: &ToolId,
        permits: u32,
        wait: Duration,
    ) -> Result<OwnedSemaphorePermit, SoulError> {
        let sem = self.semaphore(tenant, tool, permits)?;
        if let Ok(p) = sem.clone().try_acquire_owned() {
            return Ok(p);
        }
        match tokio::time::timeout(wait, sem.acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            _ => Err(SoulError::new(
                ErrorCode::QuotaRateLimited,
                "the tool is at its concurrency limit",
            )
            .with_field("max_concurrency", permits.to_string())
            .retry_after(Duration::from_millis(100))),
        }
    }
}
