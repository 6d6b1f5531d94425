//! Which limits and budgets apply to a call, compiled once from configuration.
//!
//! Both backends use the same plan, so a limit means the same thing on one replica
//! and on many. Counter keys are derived from the rule's *definition* (not its
//! position), so replicas agree on them and a reload keeps the state of rules that did
//! not change.

use soulbase_config::{QuotaBudget, QuotaConfig, QuotaLimit};
use soulbase_types::{Rate, ToolPattern};

use crate::QuotaRequest;

struct RateRule {
    tenant: Option<String>,
    tool: ToolPattern,
    rate: Rate,
    tag: String,
}

struct BudgetRule {
    tenant: Option<String>,
    tool: ToolPattern,
    actor: Option<String>,
    per_actor: bool,
    window_ms: u64,
    amounts: Amounts,
    tag: String,
}

/// Amounts of a budget; `None` means not limited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amounts {
    /// Calls.
    pub calls: Option<u64>,
    /// Argument bytes.
    pub bytes_in: Option<u64>,
    /// Output bytes.
    pub bytes_out: Option<u64>,
    /// CPU milliseconds.
    pub cpu_ms: Option<u64>,
}

/// A rate limit charged by one call: a GCRA bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateCharge {
    /// The bucket's key (without any backend prefix).
    pub key: String,
    /// The rate.
    pub rate: Rate,
}

/// A budget charged by one call: a fixed-window counter set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetCharge {
    /// The counters' key (without any backend prefix).
    pub key: String,
    /// Window length in milliseconds.
    pub window_ms: u64,
    /// The limits.
    pub limits: Amounts,
    /// A readable name for snapshots and errors, e.g. `calls 100/day`.
    pub label: String,
}

/// A plan kept current with a configuration handle: each decision compares the
/// handle's snapshot hash with the one the plan was built from and recompiles when a
/// new snapshot was published (new requests see new limits at once; counters of
/// unchanged rules keep their state).
pub struct FollowedPlan {
    loaded: arc_swap::ArcSwap<(String, QuotaPlan)>,
    handle: Option<soulbase_config::ConfigHandle>,
}

impl FollowedPlan {
    /// A fixed plan.
    pub fn fixed(plan: QuotaPlan) -> Self {
        Self {
            loaded: arc_swap::ArcSwap::from_pointee((String::new(), plan)),
            handle: None,
        }
    }

    /// A plan following `handle`'s `quota` section.
    pub fn follow(handle: soulbase_config::ConfigHandle) -> Self {
        let snap = handle.current();
        let plan = QuotaPlan::from_config(&snap.config().quota);
        Self {
            loaded: arc_swap::ArcSwap::from_pointee((snap.hash().to_owned(), plan)),
            handle: Some(handle),
        }
    }

    /// The plan in force (recompiled first if the followed configuration changed).
    pub fn current(&self) -> std::sync::Arc<(String, QuotaPlan)> {
        let loaded = self.loaded.load_full();
        if let Some(handle) = &self.handle {
            let snap = handle.current();
            if snap.hash() != loaded.0 {
                let next = std::sync::Arc::new((
                    snap.hash().to_owned(),
                    QuotaPlan::from_config(&snap.config().quota),
                ));
                self.loaded.store(next.clone());
                return next;
            }
        }
        loaded
    }

    /// Replaces the plan (for a backend that follows no handle).
    pub fn replace(&self, plan: QuotaPlan) {
        let hash = self.loaded.load().0.clone();
        self.loaded.store(std::sync::Arc::new((hash, plan)));
    }

    /// Replaces the rate limits, keeping the budgets (for a backend that follows no
    /// handle: a followed one recompiles from its handle at the next reload).
    pub fn replace_limits(&self, limits: &[soulbase_config::QuotaLimit]) {
        let next = self.current().1.with_limits(limits);
        self.replace(next);
    }
}

/// The compiled `quota` section: rate limits and budgets with their tool patterns.
pub struct QuotaPlan {
    rates: Vec<RateRule>,
    budgets: Vec<BudgetRule>,
    budget_defs: Vec<QuotaBudget>,
}

fn pattern(p: &str) -> ToolPattern {
    // Configuration validation already refused malformed patterns; a pattern that still
    // fails to parse matches nothing rather than everything.
    ToolPattern::parse(p).unwrap_or_else(|_| ToolPattern::Exact(String::new()))
}

/// Whether a limit on `pattern` charges `tool`: `*` means every tool, which
/// agent-loop model turns ([`MODEL_TURN`](crate::MODEL_TURN)) are not — only a
/// pattern naming them (`soulbase.model.turn`, `soulbase.model.*`,
/// `soulbase.*`) limits them.
fn charges(pattern: &ToolPattern, tool: &soulbase_types::ToolId) -> bool {
    pattern.matches(tool)
        && !(matches!(pattern, ToolPattern::Any) && tool.as_str() == crate::MODEL_TURN)
}

fn opt_star(s: &str) -> Option<String> {
    (s != "*").then(|| s.to_owned())
}

impl QuotaPlan {
    /// Compiles rate limits and budgets.
    pub fn new(limits: &[QuotaLimit], budgets: &[QuotaBudget]) -> Self {
        Self {
            rates: limits
                .iter()
                .map(|l| RateRule {
                    tenant: opt_star(&l.tenant),
                    tool: pattern(&l.tool),
                    rate: l.rate,
                    tag: format!("{}|{}|{}", l.tenant, l.tool, l.rate),
                })
                .collect(),
            budgets: budgets
                .iter()
                .map(|b| BudgetRule {
                    tenant: opt_star(&b.tenant),
                    tool: pattern(&b.tool),
                    actor: opt_star(&b.actor),
                    per_actor: b.per_actor,
                    window_ms: b.window.millis(),
                    amounts: Amounts {
                        calls: b.calls,
                        bytes_in: b.bytes_in,
                        bytes_out: b.bytes_out,
                        cpu_ms: b.cpu_ms,
                    },
                    tag: format!(
                        "{}|{}|{}|{}|{}|{:?}|{:?}|{:?}|{:?}",
                        b.tenant,
                        b.tool,
                        b.actor,
                        b.per_actor,
                        b.window.millis(),
                        b.calls,
                        b.bytes_in,
                        b.bytes_out,
                        b.cpu_ms
                    ),
                })
                .collect(),
            budget_defs: budgets.to_vec(),
        }
    }

    /// The same budgets with new rate `limits`.
    pub fn with_limits(&self, limits: &[QuotaLimit]) -> Self {
        Self::new(limits, &self.budget_defs)
    }

    /// Compiles the configuration's `quota` section.
    pub fn from_config(config: &QuotaConfig) -> Self {
        Self::new(&config.limits, &config.budgets)
    }

    /// Whether nothing is limited.
    pub fn is_empty(&self) -> bool {
        self.rates.is_empty() && self.budgets.is_empty()
    }

    /// The rate limits a call is charged to (deduplicated).
    pub fn rates_for(&self, req: &QuotaRequest<'_>) -> Vec<RateCharge> {
        let mut out: Vec<RateCharge> = Vec::new();
        for r in &self.rates {
            if r.tenant.as_deref().is_none_or(|t| t == req.tenant.as_str())
                && charges(&r.tool, req.tool)
            {
                let key = format!("rate:{}:{}", r.tag, req.tenant);
                if !out.iter().any(|c| c.key == key) {
                    out.push(RateCharge { key, rate: r.rate });
                }
            }
        }
        out
    }

    /// The rate of the limit that owns bucket `key` (as produced by [`Self::rates_for`]),
    /// or `None` when no current limit owns it (it was replaced by a reload).
    pub fn rate_of_key(&self, key: &str) -> Option<soulbase_types::Rate> {
        let rest = key.strip_prefix("rate:")?;
        self.rates
            .iter()
            .find(|r| {
                rest.strip_prefix(r.tag.as_str())
                    .is_some_and(|t| t.starts_with(':'))
            })
            .map(|r| r.rate)
    }

    /// The budgets a call is charged to (deduplicated).
    pub fn budgets_for(&self, req: &QuotaRequest<'_>) -> Vec<BudgetCharge> {
        let mut out: Vec<BudgetCharge> = Vec::new();
        for b in &self.budgets {
            if b.tenant.as_deref().is_none_or(|t| t == req.tenant.as_str())
                && b.actor.as_deref().is_none_or(|a| a == req.actor.as_str())
                && charges(&b.tool, req.tool)
            {
                let key = if b.per_actor {
                    format!("budget:{}:{}:{}", b.tag, req.tenant, req.actor)
                } else {
                    format!("budget:{}:{}", b.tag, req.tenant)
                };
                if !out.iter().any(|c| c.key == key) {
                    out.push(BudgetCharge {
                        key,
                        window_ms: b.window_ms,
                        limits: b.amounts,
                        label: label_of(b),
                    });
                }
            }
        }
        out
    }
}

fn label_of(b: &BudgetRule) -> String {
    let mut parts = Vec::new();
    for (name, v) in [
        ("calls", b.amounts.calls),
        ("bytes_in", b.amounts.bytes_in),
        ("bytes_out", b.amounts.bytes_out),
        ("cpu_ms", b.amounts.cpu_ms),
    ] {
        if let Some(v) = v {
            parts.push(format!("{name} {v}"));
        }
    }
    format!("{} per {} ms on {}", parts.join(", "), b.window_ms, b.tool)
}
