//! Quotas and rate limits (R8).
//!
//! [`QuotaGate`] is the seam the tools pipeline calls: `check` in a dry-run preflight,
//! `reserve` before execution, `settle` with the actual usage after it, `refund` when
//! the call is refused after reserving but before executing. The budget snapshot it
//! returns is part of the preflight result.
//!
//! [`LocalQuota`] is the in-process backend: GCRA per (limit, tenant), limits from the
//! configuration's `quota.limits`, swappable at runtime. A shared backend for several
//! replicas implements the same trait over Redis.

mod local;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use soulbase_errors::SoulError;
use soulbase_observe::BudgetUsage;
use soulbase_types::{ActorId, TenantId, ToolId};

pub use local::LocalQuota;

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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetSnapshot {
    /// The limit, e.g. `100/min`; `None` when no limit applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// Calls still allowed right now under that limit (after this one, when reserved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
}

/// A reservation taken before execution; settle or refund it exactly once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// Backend-specific handle.
    pub id: u64,
    /// The keys charged (backend-specific), so refund can undo exactly them.
    pub keys: Vec<String>,
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
    /// Records actual usage after execution.
    async fn settle(&self, reservation: Reservation, usage: BudgetUsage) -> Result<(), SoulError>;
    /// Gives back a reservation whose call never executed.
    async fn refund(&self, reservation: Reservation) -> Result<(), SoulError>;
}
