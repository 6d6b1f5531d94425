//! Quotas and rate limits (R8).
//!
//! [`QuotaGate`] is the seam the tools pipeline calls: `check` in a dry-run preflight,
//! `reserve` before execution, `settle` with the actual usage after it, `refund` when
//! the call is refused after reserving but before executing. The budget snapshot it
//! returns is part of the preflight result.
//!
//! Two kinds of limit, compiled once into a [`QuotaPlan`]:
//! - **rate limits** (`quota.limits`, written `N/sec|min|hour|day`): GCRA buckets per
//!   (limit, tenant), refusals `QUOTA.RATE_LIMITED`;
//! - **budgets** (`quota.budgets`): calls, bytes in/out and CPU ms per fixed window,
//!   per tenant or per actor, refusals `QUOTA.BUDGET_EXCEEDED`. Bytes and CPU are only
//!   known after execution: `settle` adds them, and a budget already used up refuses
//!   the next call.
//!
//! The agent loop's model turns are charged through the same seam, as calls of
//! [`MODEL_TURN`].
//!
//! [`LocalQuota`] is the in-process backend (one replica); `soulbase-qos-redis` is the
//! shared one (several replicas, atomic Lua scripts). Both charge a call to every
//! applicable limit or to none, and every refusal carries a retry-after hint.

mod local;
mod plan;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use soulbase_errors::SoulError;
use soulbase_observe::BudgetUsage;
use soulbase_types::{ActorId, TenantId, ToolId};

pub use local::LocalQuota;
pub use plan::{Amounts, BudgetCharge, FollowedPlan, QuotaPlan, RateCharge};

/// What the agent loop's model turns are charged as: each turn a conversation
/// sends upstream is one call of this id, limited by the rate limits and budgets
/// that name it (`soulbase.model.turn`, `soulbase.model.*`; not `*`, which means
/// every tool), its bytes in and out the request and the response.
pub const MODEL_TURN: &str = "soulbase.model.turn";

/// Whose budget a call draws on.
#[derive(Debug, Clone, Copy)]
pub struct QuotaRequest<'a> {
    /// The tenant.
    pub tenant: &'a TenantId,
    /// The actor.
    pub actor: &'a ActorId,
    /// The tool.
    pub tool: &'a ToolId,
}

/// The tightest limit that applies to a call, as seen at decision time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct BudgetSnapshot {
    /// The limit, e.g. `100/min`; `None` when no limit applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// Calls still allowed right now under that limit (after this one, when reserved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
    /// What is left of each applicable budget in its current window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<BudgetRemaining>,
}

/// What is left of one budget in its current window (`None`: that amount is not limited).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct BudgetRemaining {
    /// The budget, e.g. `calls 100 per 86400000 ms on fs.*`.
    pub budget: String,
    /// Calls left (after this one, when reserved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<u64>,
    /// Argument bytes left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_in: Option<u64>,
    /// Output bytes left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_out: Option<u64>,
    /// CPU milliseconds left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    /// Milliseconds until the window resets.
    pub resets_in_ms: u64,
}

/// One budget counter a reservation charged, in the window it was charged in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetKey {
    /// The counter's key (backend-specific).
    pub key: String,
    /// The window index (`unix_ms / window_ms`) the call was counted in.
    pub window: u64,
}

/// A reservation taken before execution; settle or refund it exactly once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// Backend-specific handle.
    pub id: u64,
    /// The rate-limit keys charged (backend-specific), so refund can undo exactly them.
    pub keys: Vec<String>,
    /// The budget counters charged, so settle and refund touch exactly them.
    pub budgets: Vec<BudgetKey>,
    /// The budget after reserving.
    pub snapshot: BudgetSnapshot,
}

/// Decides whether a call fits its budgets. Refusals are `QUOTA.RATE_LIMITED` or
/// `QUOTA.BUDGET_EXCEEDED` with a retry-after hint.
#[async_trait]
pub trait QuotaGate: Send + Sync + 'static {
    /// Whether a call would be allowed now, without consuming anything (dry run).
    async fn check(&self, req: QuotaRequest<'_>) -> Result<BudgetSnapshot, SoulError>;
    /// Consumes one call's worth of every applicable limit, atomically.
    async fn reserve(&self, req: QuotaRequest<'_>) -> Result<Reservation, SoulError>;
    /// Records actual usage (bytes, CPU) after execution against the reserved budgets.
    async fn settle(&self, reservation: Reservation, usage: BudgetUsage) -> Result<(), SoulError>;
    /// Gives back a reservation whose call never executed.
    async fn refund(&self, reservation: Reservation) -> Result<(), SoulError>;
}
