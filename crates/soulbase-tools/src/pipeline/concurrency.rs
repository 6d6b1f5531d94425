//! `concurrency: serial` and `limits.max_concurrency`, per (tenant, tool).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{TenantId, ToolId};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Semaphores keyed by (tenant, tool, permits).
#[derive(Default)]
pub(crate) struct ConcurrencyLimiter {
    slots: Mutex<HashMap<(TenantId, ToolId, u32), Arc<Semaphore>>>,
}

impl ConcurrencyLimiter {
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
        let sem = {
            let mut slots = self.slots.lock().map_err(|_| {
                SoulError::of(ErrorCode::UnknownInternal).with_note("limiter poisoned")
            })?;
            slots
                .entry((tenant.clone(), tool.clone(), permits))
                .or_insert_with(|| Arc::new(Semaphore::new(permits.max(1) as usize)))
                .clone()
        };
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
