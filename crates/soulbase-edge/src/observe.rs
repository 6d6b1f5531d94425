//! The hook every serving surface calls after a call, for metrics.

use std::time::Duration;

use soulbase_qos::BudgetSnapshot;
use soulbase_tools::pipeline::CallResult;
pub use soulbase_types::Surface;
use soulbase_types::{TenantId, ToolId};

/// Told about every finished call and preflight. Must be cheap and never block.
pub trait CallObserver: Send + Sync + 'static {
    /// A call entered the pipeline (paired with exactly one `call_finished`).
    fn call_started(&self, surface: Surface) {
        let _ = surface;
    }

    /// A call finished (any status) after `elapsed`.
    fn call_finished(
        &self,
        surface: Surface,
        tool: &ToolId,
        result: &CallResult,
        elapsed: Duration,
    );

    /// A preflight passed and saw this budget.
    fn budget_seen(&self, tenant: &TenantId, tool: &ToolId, budget: &BudgetSnapshot) {
        let _ = (tenant, tool, budget);
    }

    /// A request or preflight was refused (a call refused before the pipeline,
    /// e.g. unauthenticated or malformed; a preflight or listing refused).
    fn refused(&self, surface: Surface, code: soulbase_errors::ErrorCode) {
        let _ = (surface, code);
    }

    /// A consent token was issued (through [`ConsentDesk`](crate::ConsentDesk)).
    fn consent_issued(&self) {}

    /// A finished call of `tenant` was charged `usage` (what its budgets were
    /// settled with; [`CallResult::usage`]).
    fn usage_charged(&self, tenant: &TenantId, usage: &soulbase_observe::BudgetUsage) {
        let _ = (tenant, usage);
    }
}

/// Observes nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopObserver;

impl CallObserver for NoopObserver {
    fn call_finished(&self, _: Surface, _: &ToolId, _: &CallResult, _: Duration) {}
}
