//! The in-process backend: GCRA rate limits and fixed-window budgets for one replica.
//!
//! A rate `N/period` allows a burst of N and then one call every `period / N`. Each
//! bucket is one "theoretical arrival time" (TAT); a call fits when advancing it by one
//! interval keeps it within one period of now. Budgets count calls, bytes and CPU per
//! window aligned to the Unix epoch (a `day` window resets at 00:00 UTC). Everything
//! applying to a call is checked and charged under one lock, so a call is charged to
//! all limits or to none.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use soulbase_config::{QuotaBudget, QuotaConfig, QuotaLimit};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::BudgetUsage;

use crate::plan::{Amounts, BudgetCharge, FollowedPlan, QuotaPlan, RateCharge};
use crate::{BudgetKey, BudgetRemaining, BudgetSnapshot, QuotaGate, QuotaRequest, Reservation};

#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    window: u64,
    ends_ms: u64,
    calls: u64,
    bytes_in: u64,
    bytes_out: u64,
    cpu_ms: u64,
}

#[derive(Default)]
struct State {
    /// Theoretical arrival time per rate bucket, as nanoseconds since `epoch`.
    tats: HashMap<String, u64>,
    /// Budget counters per key.
    budgets: HashMap<String, Counters>,
    /// Map size after the last pruning; pruning runs when the maps double.
    pruned_at: usize,
}

/// In-process quotas for one replica.
pub struct LocalQuota {
    plan: FollowedPlan,
    state: Mutex<State>,
    epoch: Instant,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The refusal for an exhausted rate limit, with the wait until one call fits.
pub(crate) fn rate_limited(rate: &soulbase_types::Rate, wait: Duration) -> SoulError {
    SoulError::of(ErrorCode::QuotaRateLimited)
        .with_field("limit", rate.to_string())
        .retry_after(wait.max(Duration::from_millis(1)))
}

/// The refusal for a used-up budget, with the wait until its window resets.
pub(crate) fn budget_exceeded(label: &str, wait: Duration) -> SoulError {
    SoulError::of(ErrorCode::QuotaBudgetExceeded)
        .with_field("budget", label.to_owned())
        .retry_after(wait.max(Duration::from_millis(1)))
}

fn left(limit: Option<u64>, used: u64) -> Option<u64> {
    limit.map(|l| l.saturating_sub(used))
}

/// Whether a budget with `used` counters admits one more call.
fn budget_fits(limits: &Amounts, used: &Counters) -> bool {
    limits.calls.is_none_or(|l| used.calls < l)
        && limits.bytes_in.is_none_or(|l| used.bytes_in < l)
        && limits.bytes_out.is_none_or(|l| used.bytes_out < l)
        && limits.cpu_ms.is_none_or(|l| used.cpu_ms < l)
}

impl LocalQuota {
    /// Quotas enforcing the rate `limits` (the configuration's `quota.limits`).
    pub fn new(limits: &[QuotaLimit]) -> Self {
        Self::with_plan(QuotaPlan::new(limits, &[]))
    }

    /// Quotas enforcing the whole `quota` section (rate limits and budgets).
    pub fn from_config(config: &QuotaConfig) -> Self {
        Self::with_plan(QuotaPlan::from_config(config))
    }

    /// Quotas enforcing rate `limits` and `budgets`.
    pub fn with_budgets(limits: &[QuotaLimit], budgets: &[QuotaBudget]) -> Self {
        Self::with_plan(QuotaPlan::new(limits, budgets))
    }

    /// Quotas following `handle`'s `quota` section: a reload applies to the next call.
    pub fn follow(handle: soulbase_config::ConfigHandle) -> Self {
        Self {
            plan: FollowedPlan::follow(handle),
            state: Mutex::new(State::default()),
            epoch: Instant::now(),
        }
    }

    fn with_plan(plan: QuotaPlan) -> Self {
        Self {
            plan: FollowedPlan::fixed(plan),
            state: Mutex::new(State::default()),
            epoch: Instant::now(),
        }
    }

    /// Replaces the rate limits (hot reload), keeping the budgets.
    ///
    /// Counters are keyed by a rule's definition, so rules that did not change keep
    /// their state; changed or removed rules start afresh.
    pub fn update(&self, limits: &[QuotaLimit]) {
        self.plan.replace_limits(limits);
    }

    /// Replaces rate limits and budgets from a new `quota` section (hot reload).
    pub fn update_config(&self, config: &QuotaConfig) {
        self.plan.replace(QuotaPlan::from_config(config));
    }

    fn now(&self) -> u64 {
        nanos(self.epoch.elapsed())
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>, SoulError> {
        self.state
            .lock()
            .map_err(|_| SoulError::of(ErrorCode::UnknownInternal).with_note("quota lock poisoned"))
    }

    /// Checks (and with `charge`, consumes) every applicable limit under one lock.
    fn decide(&self, req: &QuotaRequest<'_>, charge: bool) -> Result<Reservation, SoulError> {
        let loaded = self.plan.current();
        let plan = &loaded.1;
        if plan.is_empty() {
            return Ok(empty_reservation());
        }
        let rates = plan.rates_for(req);
        let budgets = plan.budgets_for(req);
        if rates.is_empty() && budgets.is_empty() {
            return Ok(empty_reservation());
        }
        let now = self.now();
        let now_ms = unix_ms();
        let mut state = self.lock()?;
        let mut snapshot = BudgetSnapshot::default();
        let mut next = Vec::with_capacity(rates.len());
        for RateCharge { key, rate } in &rates {
            let interval = nanos(rate.interval());
            let period = nanos(rate.period());
            let tat = state.tats.get(key).copied().unwrap_or(now).max(now);
            let new_tat = tat.saturating_add(interval);
            if new_tat - now > period {
                return Err(rate_limited(
                    rate,
                    Duration::from_nanos(new_tat - now - period),
                ));
            }
            let remaining = (period - (new_tat - now)) / interval.max(1);
            if snapshot.remaining.is_none_or(|r| remaining < r) {
                snapshot.limit = Some(rate.to_string());
                snapshot.remaining = Some(remaining);
            }
            next.push(new_tat);
        }
        let mut counted = Vec::with_capacity(budgets.len());
        for BudgetCharge {
            key,
            window_ms,
            limits,
            label,
        } in &budgets
        {
            let window = now_ms / window_ms;
            let resets_in = (window + 1) * window_ms - now_ms;
            let used = state
                .budgets
                .get(key)
                .copied()
                .filter(|c| c.window == window)
                .unwrap_or(Counters {
                    window,
                    ends_ms: now_ms + resets_in,
                    ..Counters::default()
                });
            if !budget_fits(limits, &used) {
                return Err(budget_exceeded(label, Duration::from_millis(resets_in)));
            }
            snapshot.budgets.push(BudgetRemaining {
                budget: label.clone(),
                calls: left(limits.calls, used.calls + 1),
                bytes_in: left(limits.bytes_in, used.bytes_in),
                bytes_out: left(limits.bytes_out, used.bytes_out),
                cpu_ms: left(limits.cpu_ms, used.cpu_ms),
                resets_in_ms: resets_in,
            });
            counted.push(Counters {
                calls: used.calls + 1,
                ..used
            });
        }
        if charge {
            for (r, tat) in rates.iter().zip(next) {
                state.tats.insert(r.key.clone(), tat);
            }
            for (b, c) in budgets.iter().zip(&counted) {
                state.budgets.insert(b.key.clone(), *c);
            }
            prune(&mut state, now, now_ms);
        }
        Ok(Reservation {
            id: 0,
            keys: rates.into_iter().map(|r| r.key).collect(),
            budgets: budgets
                .iter()
                .zip(&counted)
                .map(|(b, c)| BudgetKey {
                    key: b.key.clone(),
                    window: c.window,
                })
                .collect(),
            snapshot,
        })
    }
}

fn empty_reservation() -> Reservation {
    Reservation {
        id: 0,
        keys: Vec::new(),
        budgets: Vec::new(),
        snapshot: BudgetSnapshot::default(),
    }
}

/// Drops buckets that no longer hold anything (a TAT in the past equals a fresh bucket;
/// a budget of a past window is reset on next use), when the maps have doubled.
fn prune(state: &mut State, now: u64, now_ms: u64) {
    let size = state.tats.len() + state.budgets.len();
    if size < 1024 || size < state.pruned_at.saturating_mul(2) {
        return;
    }
    state.tats.retain(|_, tat| *tat > now);
    state.budgets.retain(|_, c| c.ends_ms > now_ms);
    state.pruned_at = state.tats.len() + state.budgets.len();
}

#[async_trait]
impl QuotaGate for LocalQuota {
    async fn check(&self, req: QuotaRequest<'_>) -> Result<BudgetSnapshot, SoulError> {
        self.decide(&req, false).map(|r| r.snapshot)
    }

    async fn reserve(&self, req: QuotaRequest<'_>) -> Result<Reservation, SoulError> {
        self.decide(&req, true)
    }

    async fn settle(&self, reservation: Reservation, usage: BudgetUsage) -> Result<(), SoulError> {
        // Calls were charged at reservation; bytes and CPU are known only now.
        if reservation.budgets.is_empty() {
            return Ok(());
        }
        let mut state = self.lock()?;
        for b in &reservation.budgets {
            if let Some(c) = state.budgets.get_mut(&b.key)
                && c.window == b.window
            {
                c.bytes_in = c.bytes_in.saturating_add(usage.bytes_in);
                c.bytes_out = c.bytes_out.saturating_add(usage.bytes_out);
                c.cpu_ms = c.cpu_ms.saturating_add(usage.cpu_ms);
            }
        }
        Ok(())
    }

    async fn refund(&self, reservation: Reservation) -> Result<(), SoulError> {
        if reservation.keys.is_empty() && reservation.budgets.is_empty() {
            return Ok(());
        }
        let loaded = self.plan.current();
        let plan = &loaded.1;
        let now = self.now();
        let mut state = self.lock()?;
        for key in &reservation.keys {
            let Some(rate) = plan.rate_of_key(key) else {
                // The limit was replaced since: its bucket is no longer consulted.
                continue;
            };
            if let Some(tat) = state.tats.get_mut(key) {
                *tat = tat.saturating_sub(nanos(rate.interval())).max(now);
            }
        }
        for b in &reservation.budgets {
            if let Some(c) = state.budgets.get_mut(&b.key)
                && c.window == b.window
            {
                c.calls = c.calls.saturating_sub(1);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use soulbase_types::{ActorId, Rate, TenantId, ToolId};

    use soulbase_config::QuotaBudget;

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

    fn budget(tool: &str, actor: &str, per_actor: bool) -> QuotaBudget {
        QuotaBudget {
            tenant: "*".into(),
            tool: tool.into(),
            actor: actor.into(),
            per_actor,
            window: soulbase_config::BudgetWindow::Day,
            calls: None,
            bytes_in: None,
            bytes_out: None,
            cpu_ms: None,
        }
    }

    async fn reserve_as(
        q: &LocalQuota,
        tenant: &str,
        actor: &str,
        tool: &str,
    ) -> Result<Reservation, SoulError> {
        let tenant = TenantId::new(tenant).unwrap();
        let actor = ActorId::new(actor).unwrap();
        let tool = ToolId::new(tool).unwrap();
        q.reserve(QuotaRequest {
            tenant: &tenant,
            actor: &actor,
            tool: &tool,
        })
        .await
    }

    #[tokio::test]
    async fn a_calls_budget_refuses_with_budget_exceeded_until_the_window_resets() {
        let q = LocalQuota::with_budgets(
            &[],
            &[QuotaBudget {
                calls: Some(2),
                ..budget("*", "*", false)
            }],
        );
        let r = reserve_as(&q, "t", "a", "a.b.c").await.unwrap();
        assert_eq!(r.snapshot.budgets.len(), 1);
        assert_eq!(r.snapshot.budgets[0].calls, Some(1));
        reserve_as(&q, "t", "b", "a.b.c").await.unwrap();
        let err = reserve_as(&q, "t", "a", "a.b.c").await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::QuotaBudgetExceeded);
        let after = err.retry_after_ms().unwrap();
        assert!(after > 0 && after <= 86_400_000, "{after}");
        assert!(err.field("budget").unwrap().contains("calls 2"));
        assert!(
            reserve_as(&q, "u", "a", "a.b.c").await.is_ok(),
            "per tenant"
        );
    }

    #[tokio::test]
    async fn model_turns_are_limited_only_by_limits_that_name_them() {
        let q = LocalQuota::with_budgets(
            &[],
            &[
                QuotaBudget {
                    calls: Some(1),
                    ..budget("*", "*", false)
                },
                QuotaBudget {
                    calls: Some(2),
                    ..budget("soulbase.model.*", "*", false)
                },
            ],
        );
        // `*` is every tool, not model turns: two turns fit the turns' budget
        // and leave the tools' one untouched.
        for _ in 0..2 {
            reserve_as(&q, "t", "a", crate::MODEL_TURN).await.unwrap();
        }
        let err = reserve_as(&q, "t", "a", crate::MODEL_TURN)
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::QuotaBudgetExceeded);
        assert!(err.field("budget").unwrap().contains("soulbase.model.*"));
        reserve_as(&q, "t", "a", "a.b.c").await.unwrap();
    }

    #[tokio::test]
    async fn bytes_and_cpu_are_settled_after_execution() {
        let q = LocalQuota::with_budgets(
            &[],
            &[QuotaBudget {
                bytes_out: Some(100),
                cpu_ms: Some(1_000),
                ..budget("*", "*", false)
            }],
        );
        let r = reserve_as(&q, "t", "a", "a.b.c").await.unwrap();
        q.settle(
            r,
            BudgetUsage {
                calls: 1,
                bytes_in: 10,
                bytes_out: 60,
                cpu_ms: 5,
            },
        )
        .await
        .unwrap();
        let r = reserve_as(&q, "t", "a", "a.b.c").await.unwrap();
        assert_eq!(r.snapshot.budgets[0].bytes_out, Some(40));
        assert_eq!(r.snapshot.budgets[0].cpu_ms, Some(995));
        q.settle(
            r,
            BudgetUsage {
                calls: 1,
                bytes_in: 0,
                bytes_out: 50,
                cpu_ms: 0,
            },
        )
        .await
        .unwrap();
        let err = reserve_as(&q, "t", "a", "a.b.c").await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::QuotaBudgetExceeded);
    }

    #[tokio::test]
    async fn per_actor_budgets_count_each_actor_and_actor_filters_apply() {
        let q = LocalQuota::with_budgets(
            &[],
            &[
                QuotaBudget {
                    calls: Some(1),
                    ..budget("fs.*", "*", true)
                },
                QuotaBudget {
                    calls: Some(1),
                    ..budget("*", "robot", false)
                },
            ],
        );
        assert!(reserve_as(&q, "t", "alice", "fs.files.read").await.is_ok());
        assert!(reserve_as(&q, "t", "bob", "fs.files.read").await.is_ok());
        assert!(reserve_as(&q, "t", "alice", "fs.files.read").await.is_err());
        assert!(
            reserve_as(&q, "t", "alice", "net.http.get").await.is_ok(),
            "tool filter"
        );
        assert!(reserve_as(&q, "t", "robot", "net.http.get").await.is_ok());
        assert!(
            reserve_as(&q, "t", "robot", "net.http.get").await.is_err(),
            "actor filter"
        );
    }

    #[tokio::test]
    async fn refund_gives_back_the_budget_call_and_check_consumes_nothing() {
        let q = LocalQuota::with_budgets(
            &[limit("*", "*", "10/min")],
            &[QuotaBudget {
                calls: Some(1),
                ..budget("*", "*", false)
            }],
        );
        let tenant = TenantId::new("t").unwrap();
        let actor = ActorId::new("a").unwrap();
        let tool = ToolId::new("a.b.c").unwrap();
        let req = QuotaRequest {
            tenant: &tenant,
            actor: &actor,
            tool: &tool,
        };
        for _ in 0..3 {
            assert!(q.check(req).await.is_ok());
        }
        let r = q.reserve(req).await.unwrap();
        assert_eq!(r.keys.len(), 1);
        assert_eq!(r.budgets.len(), 1);
        assert_eq!(
            q.check(req).await.unwrap_err().code(),
            ErrorCode::QuotaBudgetExceeded
        );
        q.refund(r).await.unwrap();
        assert!(q.reserve(req).await.is_ok());
    }

    #[tokio::test]
    async fn a_reload_keeps_the_state_of_unchanged_limits() {
        let q = LocalQuota::new(&[limit("*", "*", "1/min")]);
        assert!(reserve(&q, "t", "a.b.c").await.is_ok());
        q.update(&[limit("*", "*", "1/min"), limit("*", "x.*", "5/min")]);
        assert!(
            reserve(&q, "t", "a.b.c").await.is_err(),
            "same limit, same bucket"
        );
        q.update(&[limit("*", "*", "2/min")]);
        assert!(
            reserve(&q, "t", "a.b.c").await.is_ok(),
            "changed limit starts afresh"
        );
    }

    #[tokio::test]
    async fn follows_the_configuration_handle() {
        use soulbase_config::{Config, ConfigHandle, ConfigSnapshot};
        let snapshot = |rate: &str| {
            let mut c = Config::default();
            c.quota.limits = vec![limit("*", "*", rate)];
            ConfigSnapshot::new(c, vec![])
        };
        let handle = ConfigHandle::new(snapshot("1/min"));
        let q = LocalQuota::follow(handle.clone());
        assert!(reserve(&q, "t", "a.b.c").await.is_ok());
        assert!(reserve(&q, "t", "a.b.c").await.is_err());
        handle.publish(snapshot("3/min"));
        assert!(reserve(&q, "t", "a.b.c").await.is_ok(), "new limit at once");
    }
}
