//! Admission to the instance pool: a slot per running call, a share per tenant.
//!
//! A slot is taken before a call instantiates its module and given back only after
//! the call's store (and with it the instance) has been dropped, so the counts here
//! never fall below what the pooling allocator holds. The engine's pool is sized to
//! the same total, so a call admitted here always finds an instance.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::TenantId;

/// The retry hint of a refusal: slots turn over at least once per deadline, usually
/// far sooner.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// The pool's admission counts.
pub(crate) struct Slots {
    total: u32,
    per_tenant: u32,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    live: u32,
    tenants: HashMap<TenantId, u32>,
}

/// One admitted call's slot; dropping it gives the slot back.
pub(crate) struct Slot {
    slots: Arc<Slots>,
    tenant: TenantId,
}

impl Slots {
    /// A pool of `total` slots of which one tenant may hold `per_tenant` (at least 1).
    pub(crate) fn new(total: u32, per_tenant: u32) -> Self {
        Self {
            total,
            per_tenant: per_tenant.max(1),
            counts: Mutex::new(Counts::default()),
        }
    }

    /// The counts stay consistent under a panic (every update is one statement), so a
    /// poisoned lock is still usable.
    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Calls holding a slot now.
    pub(crate) fn live(&self) -> u32 {
        self.counts().live
    }

    /// Calls of `tenant` holding a slot now.
    pub(crate) fn live_for(&self, tenant: &TenantId) -> u32 {
        self.counts().tenants.get(tenant).copied().unwrap_or(0)
    }

    /// Whether a call of `tenant` would be admitted now (the guard's early answer;
    /// [`Slots::acquire`] decides).
    pub(crate) fn check(&self, tenant: &TenantId) -> Result<(), SoulError> {
        let c = self.counts();
        self.admissible(&c, tenant)
    }

    /// Takes a slot for a call of `tenant`, or refuses: `QUOTA.RATE_LIMITED` when the
    /// tenant holds its share, `PROVIDER.UNAVAILABLE` when the pool is full.
    pub(crate) fn acquire(self: &Arc<Self>, tenant: &TenantId) -> Result<Slot, SoulError> {
        let mut c = self.counts();
        self.admissible(&c, tenant)?;
        c.live += 1;
        *c.tenants.entry(tenant.clone()).or_insert(0) += 1;
        Ok(Slot {
            slots: self.clone(),
            tenant: tenant.clone(),
        })
    }

    fn admissible(&self, c: &Counts, tenant: &TenantId) -> Result<(), SoulError> {
        let held = c.tenants.get(tenant).copied().unwrap_or(0);
        if held >= self.per_tenant {
            return Err(SoulError::of(ErrorCode::QuotaRateLimited)
                .with_note(format!(
                    "tenant {tenant} already runs {held} WASM calls, its share of the \
                     instance pool (WasmOptions::max_instances_per_tenant, config \
                     sandbox.wasm_max_instances_per_tenant = {})",
                    self.per_tenant
                ))
                .with_field("wasm_max_instances_per_tenant", self.per_tenant.to_string())
                .retry_after(RETRY_AFTER));
        }
        if c.live >= self.total {
            return Err(SoulError::of(ErrorCode::ProviderUnavailable)
                .with_note(format!(
                    "all {} WASM instances of the pool (WasmOptions::max_instances) are in use",
                    self.total
                ))
                .retry_after(RETRY_AFTER));
        }
        Ok(())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.slots.counts();
        c.live = c.live.saturating_sub(1);
        if let Some(n) = c.tenants.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.tenants.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn t(name: &str) -> TenantId {
        TenantId::new(name).unwrap()
    }

    #[test]
    fn a_tenant_at_its_share_is_refused_while_others_are_admitted() {
        let slots = Arc::new(Slots::new(4, 2));
        let (a, b) = (t("a"), t("b"));
        let held: Vec<Slot> = (0..2).map(|_| slots.acquire(&b).unwrap()).collect();
        let e = slots.acquire(&b).err().unwrap();
        assert_eq!(e.code(), ErrorCode::QuotaRateLimited);
        assert_eq!(e.field("wasm_max_instances_per_tenant"), Some("2"));
        assert!(e.retry_after_ms().is_some());
        assert_eq!(slots.check(&b).err().unwrap().code(), e.code());
        let a1 = slots.acquire(&a).unwrap();
        assert_eq!((slots.live(), slots.live_for(&b)), (3, 2));
        drop(held);
        assert_eq!((slots.live(), slots.live_for(&b)), (1, 0));
        slots.check(&b).unwrap();
        drop(a1);
        assert_eq!(slots.live(), 0);
    }

    #[test]
    fn a_full_pool_is_unavailable_to_every_tenant() {
        let slots = Arc::new(Slots::new(2, 2));
        let held = slots.acquire(&t("a")).unwrap();
        let _b = slots.acquire(&t("b")).unwrap();
        let e = slots.acquire(&t("c")).err().unwrap();
        assert_eq!(e.code(), ErrorCode::ProviderUnavailable);
        drop(held);
        let _c = slots.acquire(&t("c")).unwrap();
    }
}
