//! The terms a tool's provider sets on its callers, beyond policy, and the guard
//! that gives a quota reservation back unless the call consumed it.

use std::sync::Arc;

use soulbase_errors::SoulError;
use soulbase_observe::BudgetUsage;
use soulbase_qos::{QuotaGate, Reservation};
use soulbase_types::ToolId;
use tracing::Instrument;

use super::stage::stage_span;
use super::{CallResult, ToolCall};

/// What [`CallTerms::admit`] settled for one call.
#[derive(Clone, Default)]
pub struct Admission {
    /// A gate metering the call on the provider's terms (a skill's per-tool rate
    /// limit): reserved at the `quota` stage after the tool's own quota, with the
    /// same request, and given back like it when the call does not run.
    pub metered: Option<Arc<dyn QuotaGate>>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("metered", &self.metered.is_some())
            .finish()
    }
}

/// A provider's terms (the skills' imports, subscriptions and per-tool rate
/// limits; `soulbase-skills` implements them). The pipeline consults them at fixed
/// places, so their refusals get `Denied` evidence, refunds, spans, metrics and
/// preflight like every other check:
///
/// - stage `terms`, right after `authorize`: [`admit`](Self::admit);
/// - stage `quota`: the [`Admission::metered`] gate, after the tool's quota;
/// - listings: [`visible`](Self::visible);
/// - the end of every call made for a skill (`calling_skill` set), however it
///   ended: [`finished`](Self::finished).
///
/// `ToolCall::calling_skill` is trusted here: the surface that built the call set
/// it from the caller's authorized binding, never from what a client claimed.
pub trait CallTerms: Send + Sync + 'static {
    /// Whether `call` may be made on its provider's terms. A refusal carries its
    /// stable code (`TOOL.NOT_FOUND`, `TOOL.DISABLED`, `SKILL.NOT_IMPORTED`,
    /// `SUBSCRIPTION.REQUIRED`).
    fn admit(&self, call: &ToolCall) -> Result<Admission, SoulError>;

    /// Whether `tool` appears in the listings of a caller acting as
    /// `calling_skill` (`None`: a model or client acting directly).
    fn visible(&self, tool: &ToolId, calling_skill: Option<&str>) -> bool;

    /// How a call made for a skill ended (any status, refusals at any stage
    /// included): a call across skills is audited.
    fn finished(&self, call: &ToolCall, result: &CallResult);

    /// Whether the caller binding itself is valid: `calling_skill` is loaded and
    /// enabled. `TOOL.NOT_FOUND` otherwise (listings of a session bound to a skill
    /// that is gone).
    fn check_binding(&self, calling_skill: &str) -> Result<(), SoulError>;
}

/// A quota reservation that is given back when dropped, unless the call ran (then
/// it is spent) or it was settled or refunded explicitly.
pub(crate) struct QuotaHold {
    gate: Arc<dyn QuotaGate>,
    reservation: Option<Reservation>,
}

impl QuotaHold {
    pub(crate) fn new(gate: Arc<dyn QuotaGate>, reservation: Reservation) -> Self {
        Self {
            gate,
            reservation: Some(reservation),
        }
    }

    /// The call ran: whatever happens next, the reservation is not given back.
    pub(crate) fn spent(&mut self) -> Option<(Arc<dyn QuotaGate>, Reservation)> {
        self.reservation.take().map(|r| (self.gate.clone(), r))
    }

    /// Gives the reservation back now (a call refused after `quota`).
    pub(crate) async fn refund(mut self) {
        if let Some(r) = self.reservation.take() {
            let refund = self.gate.refund(r);
            if let Err(e) = refund.instrument(stage_span!("quota.refund")).await {
                tracing::warn!(error = ?e, "quota refund failed");
            }
        }
    }
}

impl Drop for QuotaHold {
    fn drop(&mut self) {
        let Some(r) = self.reservation.take() else {
            return;
        };
        // The call's future was dropped before it ran: nothing was consumed.
        let gate = self.gate.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = gate.refund(r).await {
                    tracing::warn!(error = ?e, "could not refund the quota of a dropped call");
                }
            });
        }
    }
}

/// What a call that ran reserved: the tool's quota and the terms' metered gate.
pub(crate) type Spent = [Option<(Arc<dyn QuotaGate>, Reservation)>; 2];

/// Settles what a call that ran consumed.
pub(crate) async fn settle(spent: Spent, usage: BudgetUsage) {
    for (gate, r) in spent.into_iter().flatten() {
        let settle = gate.settle(r, usage);
        if let Err(e) = settle.instrument(stage_span!("quota.settle")).await {
            tracing::warn!(error = ?e, "quota settle failed");
        }
    }
}

/// Gives back what a call that ran but counts as refused consumed.
pub(crate) async fn refund(spent: Spent) {
    for (gate, r) in spent.into_iter().flatten() {
        let refund = gate.refund(r);
        if let Err(e) = refund.instrument(stage_span!("quota.refund")).await {
            tracing::warn!(error = ?e, "quota refund failed");
        }
    }
}
