//! Shared quotas over Redis: the [`QuotaGate`] seam for several replicas.
//!
//! [`RedisQuota`] enforces the same [`QuotaPlan`] as the in-process `LocalQuota`
//! (GCRA rate limits and fixed-window budgets), but keeps the counters in Redis and
//! decides with Lua scripts: one `EVALSHA` round trip per decision, atomic on the
//! server, with the server's clock — so replicas sharing one Redis share each limit
//! exactly. Keys are namespaced by a configurable prefix.
//!
//! When Redis cannot be reached (or does not answer within the operation timeout) the
//! configured [`FailMode`] decides: `closed` (the default) refuses the call with
//! `QUOTA.UNAVAILABLE` (not `QUOTA.RATE_LIMITED`: no limit was hit) and a retry
//! hint; `open` lets it through and logs a warning.
//! After two such failures in a row, Redis is held to be down for the retry hint
//! (at least the timeout): decisions meanwhile go to the fail mode at once rather
//! than each waiting out the timeout, and after it one decision tries Redis again,
//! reconnecting; once Redis answers, all do. Settles and refunds are skipped
//! meanwhile, as failed ones are (usage uncounted, a refunded slot still taken).
//! Backends made with [`RedisQuota::sharing`] share one connection and that state.
//!
//! The limits either follow the configuration ([`RedisQuota::follow`]) or belong to
//! the caller ([`RedisQuota::new`], then [`RedisQuota::update`]): `soulbased` uses
//! the latter, under a prefix of its own, for the skills' per-tool rate limits.

mod link;
mod scripts;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::{Script, Value};
use soulbase_config::{FailMode, QuotaConfig, QuotaLimit};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::BudgetUsage;
use soulbase_qos::{
    BudgetKey, BudgetRemaining, BudgetSnapshot, FollowedPlan, QuotaGate, QuotaPlan, QuotaRequest,
    Reservation,
};

use crate::link::Link;

/// Connection and behaviour settings of a [`RedisQuota`].
#[derive(Debug, Clone)]
pub struct RedisQuotaOptions {
    /// `redis://` or `rediss://` URL.
    pub url: String,
    /// Prefix of every key, e.g. `soulbase:quota:`.
    pub prefix: String,
    /// What to do when Redis is unreachable.
    pub fail_mode: FailMode,
    /// Longest wait for one decision (connecting included) before Redis counts as down.
    pub op_timeout: Duration,
    /// Retry hint given with fail-closed refusals, and how long Redis is held to
    /// be down (decisions go to the fail mode without trying it) after failures
    /// in a row; never less than `op_timeout`, so one try runs at a time.
    pub retry_hint: Duration,
}

impl RedisQuotaOptions {
    /// Defaults for `url`: prefix `soulbase:quota:`, fail closed, 500 ms timeout, 1 s hint.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            prefix: "soulbase:quota:".to_owned(),
            fail_mode: FailMode::Closed,
            op_timeout: Duration::from_millis(500),
            retry_hint: Duration::from_secs(1),
        }
    }

    /// The defaults with the `quota` section's `redis_url` (required) and
    /// `on_backend_failure`.
    pub fn from_config(config: &QuotaConfig) -> Result<Self, SoulError> {
        let url = config.redis_url.clone().ok_or_else(|| {
            SoulError::new(
                ErrorCode::ConfigInvalid,
                "quota.redis_url is required with quota.backend redis",
            )
            .with_field("field", "quota.redis_url")
        })?;
        let mut options = Self::new(url);
        options.fail_mode = config.on_backend_failure;
        Ok(options)
    }
}

/// Quotas shared by every replica using the same Redis and prefix.
pub struct RedisQuota {
    link: Arc<Link>,
    plan: FollowedPlan,
    options: RedisQuotaOptions,
    decide: Script,
    refund: Script,
    settle: Script,
}

fn unavailable(e: impl std::fmt::Display) -> SoulError {
    SoulError::of(ErrorCode::UnknownInternal).with_note(format!("redis: {e}"))
}

fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

fn opt_left(v: i64) -> Option<u64> {
    u64::try_from(v).ok()
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX).max(1)
}

fn limit_arg(v: Option<u64>) -> i64 {
    v.map_or(-1, |x| i64::try_from(x).unwrap_or(i64::MAX))
}

enum Outcome {
    Decided(Reservation),
    Refused(SoulError),
}

impl RedisQuota {
    /// A backend enforcing `plan` on the Redis at `options.url`. Does not connect yet:
    /// the first decision does, so a replica starts even while Redis is down.
    pub fn new(options: RedisQuotaOptions, plan: QuotaPlan) -> Result<Self, SoulError> {
        Self::with_followed(options, FollowedPlan::fixed(plan))
    }

    /// A backend whose limits follow `handle`'s `quota` section (a reload applies to
    /// the next decision); connection settings come from `options`.
    pub fn follow(
        options: RedisQuotaOptions,
        handle: soulbase_config::ConfigHandle,
    ) -> Result<Self, SoulError> {
        Self::with_followed(options, FollowedPlan::follow(handle))
    }

    fn with_followed(options: RedisQuotaOptions, plan: FollowedPlan) -> Result<Self, SoulError> {
        let invalid = |e: redis::RedisError| {
            SoulError::new(
                ErrorCode::ConfigInvalid,
                "quota.redis_url is not a valid Redis URL",
            )
            .with_field("field", "quota.redis_url")
            .with_note(e.to_string())
        };
        let info = redis::IntoConnectionInfo::into_connection_info(options.url.as_str())
            .map_err(invalid)?;
        // The redis crate leaves Nagle on (`TcpSettings::default()`); with it a
        // command written while an earlier one is unacknowledged waits for the
        // server's delayed ACK (~40 ms).
        let tcp = info.tcp_settings().clone().set_nodelay(true);
        let client = redis::Client::open(info.set_tcp_settings(tcp)).map_err(invalid)?;
        Ok(Self::on_link(Arc::new(Link::new(client)), options, plan))
    }

    fn on_link(link: Arc<Link>, options: RedisQuotaOptions, plan: FollowedPlan) -> Self {
        Self {
            link,
            plan,
            options,
            decide: Script::new(scripts::DECIDE),
            refund: Script::new(scripts::REFUND),
            settle: Script::new(scripts::SETTLE),
        }
    }

    /// A backend enforcing `plan` under the key prefix `prefix` on this one's
    /// connection, with its fail mode and timeouts (then limits are set with
    /// [`update`](Self::update)). The two share what is known of Redis's health:
    /// once one finds Redis down, the other does not wait for it either, so a call
    /// that passes both (a skill's limit, then the tool quotas) waits out the
    /// timeout at most once.
    pub fn sharing(&self, prefix: impl Into<String>, plan: QuotaPlan) -> Self {
        let options = RedisQuotaOptions {
            prefix: prefix.into(),
            ..self.options.clone()
        };
        Self::on_link(self.link.clone(), options, FollowedPlan::fixed(plan))
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.options.prefix
    }

    /// A backend from the configuration's `quota` section (`redis_url`,
    /// `on_backend_failure`, limits and budgets).
    pub fn from_config(config: &QuotaConfig) -> Result<Self, SoulError> {
        Self::new(
            RedisQuotaOptions::from_config(config)?,
            QuotaPlan::from_config(config),
        )
    }

    /// Replaces the rate limits, keeping the budgets, of a backend built with
    /// [`new`](Self::new): how a caller that owns a set of limits (the skills
    /// gateway, for its per-tool limits) keeps it in step with them. Counters are
    /// keyed by a rule's definition, so unchanged rules keep their state on every
    /// replica.
    pub fn update(&self, limits: &[QuotaLimit]) {
        self.plan.replace_limits(limits);
    }

    /// Replaces limits and budgets (hot reload). Counters are keyed by a rule's
    /// definition, so unchanged rules keep their state on every replica.
    pub fn update_config(&self, config: &QuotaConfig) {
        self.plan.replace(QuotaPlan::from_config(config));
    }

    fn key(&self, k: &str) -> String {
        format!("{}{k}", self.options.prefix)
    }

    /// Runs `script` with `keys`/`args` within the operation timeout, unless Redis
    /// is held to be down (see [`link`]).
    async fn run(
        &self,
        script: &Script,
        keys: &[String],
        args: &[i64],
        mode: Option<&str>,
    ) -> Result<Value, SoulError> {
        let hold_off = self.options.retry_hint.max(self.options.op_timeout);
        self.link.admit(hold_off)?;
        // `Err((error, down))`: `down` when Redis could not be reached at all.
        let work = async {
            let mut conn = self
                .link
                .connection(self.options.op_timeout)
                .await
                .map_err(|e| (e, true))?;
            let mut inv = script.prepare_invoke();
            for k in keys {
                inv.key(k);
            }
            if let Some(m) = mode {
                inv.arg(m);
            }
            for a in args {
                inv.arg(*a);
            }
            inv.invoke_async::<Value>(&mut conn).await.map_err(|e| {
                let down = e.is_connection_dropped()
                    || e.is_io_error()
                    || e.is_connection_refusal()
                    || e.is_timeout();
                (unavailable(e), down)
            })
        };
        let outcome = match tokio::time::timeout(self.options.op_timeout, work).await {
            Ok(r) => r,
            Err(_) => Err((unavailable("operation timed out"), true)),
        };
        match outcome {
            Ok(v) => {
                self.link.answered();
                Ok(v)
            }
            Err((e, true)) => {
                self.link.failed(hold_off);
                Err(e)
            }
            Err((e, false)) => {
                // Redis answered, with an error: it is up.
                self.link.answered();
                Err(e)
            }
        }
    }

    /// What a backend fault becomes under the configured fail mode. The retry
    /// hint is the fault's own when it has one (the time a hold-off has left),
    /// else the configured one.
    fn on_fault(&self, fault: SoulError, what: &str) -> Outcome {
        let retry = fault
            .retry_after_ms()
            .map_or(self.options.retry_hint, Duration::from_millis);
        match self.options.fail_mode {
            FailMode::Closed => Outcome::Refused(
                SoulError::new(
                    ErrorCode::QuotaUnavailable,
                    "the quota backend is unavailable; retry later",
                )
                .with_field("backend", "redis")
                .retry_after(retry)
                .with_note(format!("{what}: {}", fault.audit().causes.join("; "))),
            ),
            FailMode::Open => {
                tracing::warn!(
                    operation = what,
                    "quota backend unavailable; allowing the call (fail-open)"
                );
                Outcome::Decided(Reservation {
                    id: 0,
                    keys: Vec::new(),
                    budgets: Vec::new(),
                    snapshot: BudgetSnapshot::default(),
                })
            }
        }
    }

    async fn decide(&self, req: &QuotaRequest<'_>, reserve: bool) -> Outcome {
        let loaded = self.plan.current();
        let plan = &loaded.1;
        let rates = plan.rates_for(req);
        let budgets = plan.budgets_for(req);
        if rates.is_empty() && budgets.is_empty() {
            return Outcome::Decided(Reservation {
                id: 0,
                keys: Vec::new(),
                budgets: Vec::new(),
                snapshot: BudgetSnapshot::default(),
            });
        }
        let mut keys = Vec::with_capacity(rates.len() + budgets.len());
        let mut args = Vec::with_capacity(1 + 2 * rates.len() + 5 * budgets.len());
        args.push(i64::try_from(rates.len()).unwrap_or(i64::MAX));
        for r in &rates {
            keys.push(self.key(&r.key));
            args.push(micros(r.rate.interval()));
            args.push(micros(r.rate.period()));
        }
        for b in &budgets {
            keys.push(self.key(&b.key));
            args.push(i64::try_from(b.window_ms).unwrap_or(i64::MAX));
            args.push(limit_arg(b.limits.calls));
            args.push(limit_arg(b.limits.bytes_in));
            args.push(limit_arg(b.limits.bytes_out));
            args.push(limit_arg(b.limits.cpu_ms));
        }
        let mode = if reserve { "reserve" } else { "check" };
        let reply = match self.run(&self.decide, &keys, &args, Some(mode)).await {
            Ok(v) => v,
            Err(e) => return self.on_fault(e, mode),
        };
        let Value::Array(items) = reply else {
            return self.on_fault(unavailable("unexpected script reply"), mode);
        };
        let nums: Vec<i64> = items.iter().filter_map(as_i64).collect();
        if nums.len() != items.len() || nums.len() < 3 {
            return self.on_fault(unavailable("unexpected script reply"), mode);
        }
        let index = usize::try_from(nums[1]).unwrap_or(0);
        let wait = Duration::from_micros(u64::try_from(nums[2]).unwrap_or(0))
            .max(Duration::from_millis(1));
        match nums[0] {
            0 => {
                let Some(r) = rates.get(index.wrapping_sub(1)) else {
                    return self.on_fault(unavailable("bad rate index"), mode);
                };
                return Outcome::Refused(
                    SoulError::of(ErrorCode::QuotaRateLimited)
                        .with_field("limit", r.rate.to_string())
                        .retry_after(wait),
                );
            }
            2 => {
                let Some(b) = budgets.get(index.wrapping_sub(1)) else {
                    return self.on_fault(unavailable("bad budget index"), mode);
                };
                return Outcome::Refused(
                    SoulError::of(ErrorCode::QuotaBudgetExceeded)
                        .with_field("budget", b.label.clone())
                        .retry_after(wait),
                );
            }
            _ => {}
        }
        let mut snapshot = BudgetSnapshot::default();
        if let Some(r) = rates.get(index.wrapping_sub(1)) {
            snapshot.limit = Some(r.rate.to_string());
            snapshot.remaining = u64::try_from(nums[2]).ok();
        }
        let mut charged = Vec::with_capacity(budgets.len());
        for (b, chunk) in budgets.iter().zip(nums[3..].chunks(6)) {
            let [window, calls, bin, bout, cpu, resets] = chunk else {
                return self.on_fault(unavailable("short script reply"), mode);
            };
            snapshot.budgets.push(BudgetRemaining {
                budget: b.label.clone(),
                calls: opt_left(*calls),
                bytes_in: opt_left(*bin),
                bytes_out: opt_left(*bout),
                cpu_ms: opt_left(*cpu),
                resets_in_ms: u64::try_from(*resets).unwrap_or(0),
            });
            charged.push(BudgetKey {
                key: self.key(&b.key),
                window: u64::try_from(*window).unwrap_or(0),
            });
        }
        Outcome::Decided(Reservation {
            id: 0,
            keys: keys[..rates.len()].to_vec(),
            budgets: charged,
            snapshot,
        })
    }
}

#[async_trait]
impl QuotaGate for RedisQuota {
    async fn check(&self, req: QuotaRequest<'_>) -> Result<BudgetSnapshot, SoulError> {
        match self.decide(&req, false).await {
            Outcome::Decided(r) => Ok(r.snapshot),
            Outcome::Refused(e) => Err(e),
        }
    }

    async fn reserve(&self, req: QuotaRequest<'_>) -> Result<Reservation, SoulError> {
        match self.decide(&req, true).await {
            Outcome::Decided(r) => Ok(r),
            Outcome::Refused(e) => Err(e),
        }
    }

    async fn settle(&self, reservation: Reservation, usage: BudgetUsage) -> Result<(), SoulError> {
        if reservation.budgets.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = reservation.budgets.iter().map(|b| b.key.clone()).collect();
        let mut args = vec![
            i64::try_from(usage.bytes_in).unwrap_or(i64::MAX),
            i64::try_from(usage.bytes_out).unwrap_or(i64::MAX),
            i64::try_from(usage.cpu_ms).unwrap_or(i64::MAX),
        ];
        args.extend(
            reservation
                .budgets
                .iter()
                .map(|b| i64::try_from(b.window).unwrap_or(i64::MAX)),
        );
        self.run(&self.settle, &keys, &args, None).await.map(|_| ())
    }

    async fn refund(&self, reservation: Reservation) -> Result<(), SoulError> {
        if reservation.keys.is_empty() && reservation.budgets.is_empty() {
            return Ok(());
        }
        let loaded = self.plan.current();
        let plan = &loaded.1;
        let mut keys = Vec::new();
        let mut args = Vec::new();
        let mut intervals = Vec::new();
        for k in &reservation.keys {
            let Some(rate) = k
                .strip_prefix(self.options.prefix.as_str())
                .and_then(|bare| plan.rate_of_key(bare))
            else {
                continue;
            };
            keys.push(k.clone());
            intervals.push(micros(rate.interval()));
        }
        args.push(i64::try_from(keys.len()).unwrap_or(i64::MAX));
        args.extend(intervals);
        for b in &reservation.budgets {
            keys.push(b.key.clone());
            args.push(i64::try_from(b.window).unwrap_or(i64::MAX));
        }
        self.run(&self.refund, &keys, &args, None).await.map(|_| ())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Connections to Redis are opened with `TCP_NODELAY` (the redis crate's
    /// default leaves Nagle on), whatever the URL says.
    #[test]
    fn connections_to_redis_set_tcp_nodelay() {
        for url in ["redis://127.0.0.1:6379", "redis://:pw@localhost:1/3"] {
            let q = RedisQuota::new(RedisQuotaOptions::new(url), QuotaPlan::new(&[], &[])).unwrap();
            let info = q.link.client().get_connection_info();
            assert!(info.tcp_settings().nodelay(), "{url}");
        }
    }
}
