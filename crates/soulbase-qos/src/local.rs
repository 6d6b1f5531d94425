//! The in-process backend: GCRA (generic cell rate algorithm) per (limit, tenant).
//!
//! A limit `N/period` allows a burst of N and then one call every `period / N`. Each
//! bucket is one "theoretical arrival time"; a call fits when advancing it by one
//! interval keeps it within one period of now. All limits applying to a call are
//! checked and charged under one lock, so a call is charged to all or none.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use soulbase_config::QuotaLimit;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::BudgetUsage;
use soulbase_types::{Rate, ToolId};

use crate::{BudgetSnapshot, QuotaGate, QuotaRequest, Reservation};

struct Limit {
    tenant: Option<String>,
    tool: ToolMatch,
    rate: Rate,
}

enum ToolMatch {
    Any,
    Prefix(String),
    Exact(String),
}

impl ToolMatch {
    fn matches(&self, tool: &ToolId) -> bool {
        match self {
            ToolMatch::Any => true,
            ToolMatch::Prefix(p) => tool.as_str().starts_with(p.as_str()),
            ToolMatch::Exact(e) => tool.as_str() == e,
        }
    }
}

struct Limits {
    generation: u64,
    list: Vec<Limit>,
}

/// In-process quotas for one replica.
pub struct LocalQuota {
    limits: ArcSwap<Limits>,
    /// Theoretical arrival time per bucket key, as nanoseconds since `epoch`.
    buckets: Mutex<HashMap<String, u64>>,
    epoch: Instant,
}

fn compile(generation: u64, limits: &[QuotaLimit]) -> Limits {
    Limits {
        generation,
        list: limits
            .iter()
            .map(|l| Limit {
                tenant: (l.tenant != "*").then(|| l.tenant.clone()),
                tool: if l.tool == "*" {
                    ToolMatch::Any
                } else if let Some(p) = l.tool.strip_suffix('*') {
                    ToolMatch::Prefix(p.to_owned())
                } else {
                    ToolMatch::Exact(l.tool.clone())
                },
                rate: l.rate,
            })
            .collect(),
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

struct Applicable {
    key: String,
    interval: u64,
    period: u64,
    rate: Rate,
}

impl LocalQuota {
    /// Quotas enforcing `limits` (the configuration's `quota.limits`).
    pub fn new(limits: &[QuotaLimit]) -> Self {
        Self {
            limits: ArcSwap::from_pointee(compile(0, limits)),
            buckets: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
        }
    }

    /// Replaces the limits (hot reload). Buckets of the old limits are dropped.
    pub fn update(&self, limits: &[QuotaLimit]) {
        let generation = self.limits.load().generation + 1;
        self.limits.store(Arc::new(compile(generation, limits)));
        if let Ok(mut b) = self.buckets.lock() {
            b.clear();
        }
    }

    fn applicable(&self, req: &QuotaRequest<'_>) -> Vec<Applicable> {
        let limits = self.limits.load();
        limits
            .list
            .iter()
            .enumerate()
            .filter(|(_, l)| {
                l.tenant.as_deref().is_none_or(|t| t == req.tenant.as_str())
                    && l.tool.matches(req.tool)
            })
            .map(|(i, l)| Applicable {
                key: format!("{}:{i}:{}", limits.generation, req.tenant),
                interval: nanos(l.rate.interval()),
                period: nanos(l.rate.period()),
                rate: l.rate,
            })
            .collect()
    }

    fn now(&self) -> u64 {
        nanos(self.epoch.elapsed())
    }

    /// Checks (and with `charge`, consumes) every applicable limit under one lock.
    fn decide(
        &self,
        req: &QuotaRequest<'_>,
        charge: bool,
    ) -> Result<(Vec<String>, BudgetSnapshot), SoulError> {
        let applicable = self.applicable(req);
        if applicable.is_empty() {
            return Ok((Vec::new(), BudgetSnapshot::default()));
        }
        let now = self.now();
        let mut buckets = self.buckets.lock().map_err(|_| {
            SoulError::of(ErrorCode::UnknownInternal).with_note("quota lock poisoned")
        })?;
        let mut snapshot = BudgetSnapshot::default();
        let mut next = Vec::with_capacity(applicable.len());
        for a in &applicable {
            let tat = buckets.get(&a.key).copied().unwrap_or(now).max(now);
            let new_tat = tat.saturating_add(a.interval);
            if new_tat - now > a.period {
                let wait = Duration::from_nanos(new_tat - now - a.period);
                return Err(SoulError::of(ErrorCode::QuotaRateLimited)
                    .with_field("limit", a.rate.to_string())
                    .retry_after(wait.max(Duration::from_millis(1))));
            }
            let remaining = (a.period - (new_tat - now)) / a.interval.max(1);
            if snapshot.remaining.is_none_or(|r| remaining < r) {
                snapshot = BudgetSnapshot {
                    limit: Some(a.rate.to_string()),
                    remaining: Some(remaining),
                };
            }
            next.push(new_tat);
        }
        if charge {
            for (a, tat) in applicable.iter().zip(next) {
                buckets.insert(a.key.clone(), tat);
            }
        }
        Ok((applicable.into_iter().map(|a| a.key).collect(), snapshot))
    }
}

#[async_trait]
impl QuotaGate for LocalQuota {
    async fn check(&self, req: QuotaRequest<'_>) -> Result<BudgetSnapshot, SoulError> {
        self.decide(&req, false).map(|(_, s)| s)
    }

    async fn reserve(&self, req: QuotaRequest<'_>) -> Result<Reservation, SoulError> {
        let (keys, snapshot) = self.decide(&req, true)?;
        Ok(Reservation {
            id: 0,
            keys,
            snapshot,
        })
    }

    async fn settle(
        &self,
        _reservation: Reservation,
        _usage: BudgetUsage,
    ) -> Result<(), SoulError> {
        // Rate limits count calls, which were charged at reservation.
        Ok(())
    }

    async fn refund(&self, reservation: Reservation) -> Result<(), SoulError> {
        let limits = self.limits.load();
        let now = self.now();
        let mut buckets = self.buckets.lock().map_err(|_| {
            SoulError::of(ErrorCode::UnknownInternal).with_note("quota lock poisoned")
        })?;
        for key in &reservation.keys {
            // key = "<generation>:<index>:<tenant>"; skip keys of replaced limits.
            let mut parts = key.splitn(3, ':');
            let generation = parts.next().and_then(|g| g.parse::<u64>().ok());
            let index = parts.next().and_then(|i| i.parse::<usize>().ok());
            let (Some(generation), Some(index)) = (generation, index) else {
                continue;
            };
            if generation != limits.generation {
                continue;
            }
            let Some(limit) = limits.list.get(index) else {
                continue;
            };
            if let Some(tat) = buckets.get_mut(key) {
                *tat = tat.saturating_sub(nanos(limit.rate.interval())).max(now);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use soulbase_types::{ActorId, TenantId};

    use super::*;

    fn limit(tenant: &str, tool: &str, rate: &str) -> QuotaLimit {
        QuotaLimit {
            tenant: tenant.into(),
            tool: tool.into(),
            rate: Rate::parse(rate).unwrap(),
        }
    }

    async fn reserve(q: &LocalQuota, tenant: &str, tool: &str) -> Result<Reservation, SoulError> {
        let tenant = TenantId::new(tenant).unwrap();
        let actor = ActorId::new("a").unwrap();
        let tool = ToolId::new(tool).unwrap();
        q.reserve(QuotaRequest {
            tenant: &tenant,
            actor: &actor,
            tool: &tool,
        })
        .await
    }

    #[tokio::test]
    async fn allows_the_burst_then_refuses_with_a_hint() {
        let q = LocalQuota::new(&[limit("*", "*", "3/min")]);
        for expected_remaining in [2, 1, 0] {
            let r = reserve(&q, "t", "a.b.c").await.unwrap();
            assert_eq!(r.snapshot.remaining, Some(expected_remaining));
            assert_eq!(r.snapshot.limit.as_deref(), Some("3/min"));
        }
        let err = reserve(&q, "t", "a.b.c").await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::QuotaRateLimited);
        let after = err.retry_after_ms().unwrap();
        assert!(after > 0 && after <= 20_000, "{after}");
    }

    #[tokio::test]
    async fn tenants_have_separate_buckets() {
        let q = LocalQuota::new(&[limit("*", "*", "1/min")]);
        assert!(reserve(&q, "t1", "a.b.c").await.is_ok());
        assert!(reserve(&q, "t2", "a.b.c").await.is_ok());
        assert!(reserve(&q, "t1", "a.b.c").await.is_err());
    }

    #[tokio::test]
    async fn limits_apply_by_tool_pattern_and_tenant() {
        let q = LocalQuota::new(&[limit("acme", "fs.*", "1/min")]);
        assert!(reserve(&q, "acme", "fs.files.read").await.is_ok());
        assert!(
            reserve(&q, "acme", "fs.files.write").await.is_err(),
            "shared across fs.*"
        );
        assert!(
            reserve(&q, "acme", "net.http.get").await.is_ok(),
            "not covered"
        );
        assert!(
            reserve(&q, "other", "fs.files.read").await.is_ok(),
            "other tenant not covered"
        );
    }

    #[tokio::test]
    async fn refund_gives_the_call_back_and_check_consumes_nothing() {
        let q = LocalQuota::new(&[limit("*", "*", "1/min")]);
        let tenant = TenantId::new("t").unwrap();
        let actor = ActorId::new("a").unwrap();
        let tool = ToolId::new("a.b.c").unwrap();
        let req = QuotaRequest {
            tenant: &tenant,
            actor: &actor,
            tool: &tool,
        };
        assert_eq!(q.check(req).await.unwrap().remaining, Some(0));
        let r = q.reserve(req).await.unwrap();
        assert!(q.check(req).await.is_err());
        q.refund(r).await.unwrap();
        assert!(q.reserve(req).await.is_ok());
    }

    #[tokio::test]
    async fn a_call_is_charged_to_all_limits_or_none() {
        let q = LocalQuota::new(&[limit("*", "*", "5/min"), limit("*", "a.b.c", "1/min")]);
        assert!(reserve(&q, "t", "a.b.c").await.is_ok());
        assert!(reserve(&q, "t", "a.b.c").await.is_err());
        // The refused call must not have consumed the wider limit: 4 more fit.
        for _ in 0..4 {
            assert!(reserve(&q, "t", "x.y.z").await.is_ok());
        }
        assert!(reserve(&q, "t", "x.y.z").await.is_err());
    }

    #[tokio::test]
    async fn no_limits_means_no_snapshot() {
        let q = LocalQuota::new(&[]);
        let r = reserve(&q, "t", "a.b.c").await.unwrap();
        assert_eq!(r.snapshot, BudgetSnapshot::default());
        q.update(&[limit("*", "*", "1/min")]);
        assert!(reserve(&q, "t", "a.b.c").await.is_ok());
        assert!(reserve(&q, "t", "a.b.c").await.is_err());
    }
}
