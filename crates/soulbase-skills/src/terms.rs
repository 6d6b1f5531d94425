//! The skills' terms, held by the governed pipeline ([`CallTerms`]).
//!
//! [`SkillTerms`] is the seam the [`Invoker`](soulbase_tools::pipeline::Invoker)
//! consults for every call, so a skill's terms get `Denied` evidence, quota
//! refunds, spans, metrics and preflight like every other check. The **calling
//! skill** is `ToolCall::calling_skill`: the skill on whose behalf the call is made,
//! set by the surface from the caller's authorized binding (a scope
//! `skill:<name>`, or an operator's stdio binding), never from what a client
//! claimed.
//!
//! For a tool in the `skills.` group, its provider is resolved in the current
//! [`SkillSet`] (no provider → `TOOL.NOT_FOUND`: a skill tool is never treated as a
//! core tool; a disabled provider → `TOOL.DISABLED`). Then, at stage `terms`:
//!
//! 1. **import** — when a calling skill is given and is not the provider, the
//!    caller must hold an *authorized* import of the tool (declared, exported, and
//!    passing the contract checks: compatible `min_version`, no cycle), else
//!    `SKILL.NOT_IMPORTED`;
//! 2. **subscription** — on *every* call of an exported tool not made by the
//!    provider itself, whoever makes it: when the provider's
//!    `access.requires_subscription` is set and the tool is not in `free_tools`,
//!    the caller's (tenant, actor) must hold a subscription ([`SubscriptionStore`]),
//!    else `SUBSCRIPTION.REQUIRED` with fields `skill_id` and
//!    `action = show_subscribe_card`;
//!
//! and at stage `quota`, after the tool's own quota:
//!
//! 3. **rate limit** — likewise on every such call, the provider's per-tool
//!    `access.rate_limit`, enforced by a QoS [`QuotaGate`] (per tenant), else
//!    `QUOTA.RATE_LIMITED` with a retry hint.
//!
//! Every cross-skill call (a calling skill other than the provider) — allowed or
//! refused — yields a [`CrossSkillRecord`]. Listings show a skill tool only when
//! its skill is loaded and enabled and, for a caller bound to a skill, it is that
//! skill's own tool or an authorized import ([`CallTerms::visible`]).

use std::sync::{Arc, Mutex, PoisonError};

use soulbase_config::QuotaLimit;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_qos::{LocalQuota, QuotaGate};
use soulbase_tools::pipeline::{Admission, CallResult, CallStatus, CallTerms, ToolCall};
use soulbase_types::{ToolId, UnixMillis};

use crate::access::{CrossSkillAudit, CrossSkillRecord, SubscriptionStore, TracingAudit};
use crate::catalog::SkillCatalog;
use crate::model::SKILL_GROUP;
use crate::set::SkillSet;

/// The action hint carried by `SUBSCRIPTION.REQUIRED` (seed 000 §5.2).
pub const SUBSCRIBE_ACTION: &str = "show_subscribe_card";

/// Called with the skills' per-tool rate limits whenever they change.
pub type RateLimitSync = Arc<dyn Fn(&[QuotaLimit]) + Send + Sync>;

/// The skills' rate limits last pushed to the gate, and the skill-set
/// generation they came from.
#[derive(Default)]
struct Rates {
    /// `None` until the first rated call: the gate has not been configured yet.
    generation: Option<u64>,
    limits: Vec<QuotaLimit>,
}

impl Rates {
    /// The limits to push to the gate for a skill set of `generation`, or `None`
    /// when the gate already has them. Only a newer set moves them: a call that
    /// still holds the set a reload replaced must not push its old limits back
    /// over the new ones. `limits` is only computed for a newer set.
    fn advance(
        &mut self,
        generation: u64,
        limits: impl FnOnce() -> Vec<QuotaLimit>,
    ) -> Option<&[QuotaLimit]> {
        if self.generation.is_some_and(|seen| generation <= seen) {
            return None;
        }
        let first = self.generation.is_none();
        self.generation = Some(generation);
        let limits = limits();
        if !first && limits == self.limits {
            return None;
        }
        self.limits = limits;
        Some(&self.limits)
    }
}

/// The skills' terms over a [`SkillCatalog`]: give it to the invoker
/// (`InvokerBuilder::terms`).
pub struct SkillTerms {
    catalog: SkillCatalog,
    subscriptions: Arc<dyn SubscriptionStore>,
    audit: Arc<dyn CrossSkillAudit>,
    quota: Arc<dyn QuotaGate>,
    sync_rates: Option<RateLimitSync>,
    rates: Mutex<Rates>,
}

impl std::fmt::Debug for SkillTerms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SkillTerms")
            .field("catalog", &self.catalog)
            .finish_non_exhaustive()
    }
}

impl SkillTerms {
    /// Terms with no subscriptions, `tracing` audit, and an in-process
    /// [`LocalQuota`] kept in step with the skills' rate limits.
    pub fn new(catalog: SkillCatalog) -> Self {
        let local = Arc::new(LocalQuota::new(&[]));
        let sync = local.clone();
        Self {
            catalog,
            subscriptions: Arc::new(crate::access::StaticSubscriptions::new()),
            audit: Arc::new(TracingAudit),
            quota: local,
            sync_rates: Some(Arc::new(move |limits: &[QuotaLimit]| sync.update(limits))),
            rates: Mutex::default(),
        }
    }

    /// Enforces the per-tool rate limits through `gate` (e.g. a shared Redis
    /// backend). `sync`, when given, is called with the skills' limits
    /// ([`rate_limits`]) whenever they change, to configure the gate; without it
    /// the gate must already be configured with them.
    pub fn with_quota(mut self, gate: Arc<dyn QuotaGate>, sync: Option<RateLimitSync>) -> Self {
        self.quota = gate;
        self.sync_rates = sync;
        self.rates = Mutex::default();
        self
    }

    /// Uses `store` for subscription checks.
    pub fn with_subscriptions(mut self, store: Arc<dyn SubscriptionStore>) -> Self {
        self.subscriptions = store;
        self
    }

    /// Sends cross-skill audit records to `audit`.
    pub fn with_audit(mut self, audit: Arc<dyn CrossSkillAudit>) -> Self {
        self.audit = audit;
        self
    }

    /// The catalog.
    pub fn catalog(&self) -> &SkillCatalog {
        &self.catalog
    }

    /// The tool `run_skill` (the two-phase protocol's third step) runs: tool
    /// `tool` of `skill`, or its only tool when `tool` is `None`. `TOOL.NOT_FOUND`
    /// when the skill is not loaded or disabled, or the tool is ambiguous or
    /// unknown. The call itself then goes through the pipeline like any other.
    pub fn run_target(&self, skill: &str, tool: Option<&str>) -> Result<ToolId, SoulError> {
        resolve_run(&self.catalog.current(), skill, tool)
    }

    /// Pushes the per-tool limits to the gate when a newer skill set changed
    /// them. The lock is held across `sync`, so pushes happen in generation order.
    fn refresh_rates(&self, set: &SkillSet) {
        let mut rates = self.rates.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(limits) = rates.advance(set.generation(), || rate_limits(set))
            && let Some(sync) = &self.sync_rates
        {
            sync(limits);
        }
    }

    /// The audit record of a cross-skill call, `None` for any other.
    fn record(call: &ToolCall, provider: &str) -> Option<CrossSkillRecord> {
        let caller = call.calling_skill.as_deref()?;
        (caller != provider).then(|| CrossSkillRecord {
            call_id: call.call_id.clone(),
            tenant: call.subject.tenant.clone(),
            actor: call.subject.actor.clone(),
            caller: caller.to_owned(),
            provider: provider.to_owned(),
            tool: call.tool.clone(),
            status: CallStatus::Denied,
            error_code: None,
            evidence_ref: None,
            at: UnixMillis::now(),
        })
    }
}

impl CallTerms for SkillTerms {
    fn admit(&self, call: &ToolCall) -> Result<Admission, SoulError> {
        if call.tool.group() != SKILL_GROUP {
            return Ok(Admission::default()); // a core tool
        }
        let set = self.catalog.current();
        let Some((provider, tool)) = set.owner_of(&call.tool) else {
            // A skill tool whose skill is not in the current set is never a core
            // tool (fail closed, e.g. while a reload removes it).
            return Err(SoulError::new(
                ErrorCode::ToolNotFound,
                format!("tool {} not found", call.tool),
            )
            .with_field("tool", call.tool.as_str().to_owned()));
        };
        if !set.is_enabled(&provider.name) {
            // A disabled skill's tools are refused whatever the registry says.
            return Err(SoulError::new(
                ErrorCode::ToolDisabled,
                format!("skill {} is disabled", provider.name),
            )
            .with_field("skill", provider.name.clone()));
        }
        let calling = call.calling_skill.as_deref();
        if calling == Some(provider.name.as_str()) {
            return Ok(Admission::default()); // the provider's own tool
        }
        if let Some(caller_name) = calling {
            let imported = set
                .get(caller_name)
                .filter(|_| set.is_enabled(caller_name))
                .is_some_and(|caller| set.imports(caller, provider, &tool.name));
            if !imported {
                let err = SoulError::new(
                    ErrorCode::SkillNotImported,
                    format!(
                        "skill {caller_name} does not import {} from {}",
                        tool.name, provider.name
                    ),
                )
                .with_field("calling_skill", caller_name.to_owned())
                .with_field("skill_id", provider.name.clone())
                .with_field("tool", tool.name.clone());
                return Err(err);
            }
        }
        // The provider's access terms bind every caller but the provider itself.
        if tool.exported
            && provider.needs_subscription(&tool.name)
            && !self.subscriptions.is_subscribed(
                &call.subject.tenant,
                &call.subject.actor,
                &provider.name,
            )
        {
            let err = SoulError::new(
                ErrorCode::SubscriptionRequired,
                format!(
                    "{} of skill {} requires a subscription",
                    tool.name, provider.name
                ),
            )
            .with_field("skill_id", provider.name.clone())
            .with_field("action", SUBSCRIBE_ACTION);
            return Err(err);
        }
        let metered = if tool.exported && provider.rate_limit(&tool.name).is_some() {
            self.refresh_rates(&set);
            Some(self.quota.clone())
        } else {
            None
        };
        Ok(Admission { metered })
    }

    fn visible(&self, tool: &ToolId, calling_skill: Option<&str>) -> bool {
        let set = self.catalog.current();
        match set.owner_of(tool) {
            None => tool.group() != SKILL_GROUP,
            Some((owner, t)) => {
                set.is_enabled(&owner.name)
                    && match calling_skill {
                        None => true,
                        Some(me) if me == owner.name => true,
                        Some(me) => set
                            .get(me)
                            .filter(|_| set.is_enabled(me))
                            .is_some_and(|caller| set.imports(caller, owner, &t.name)),
                    }
            }
        }
    }

    fn finished(&self, call: &ToolCall, result: &CallResult) {
        let set = self.catalog.current();
        let Some((provider, _)) = set.owner_of(&call.tool) else {
            return;
        };
        if let Some(mut record) = Self::record(call, &provider.name) {
            record.status = result.status;
            record.error_code = result.error_code;
            record.evidence_ref = result.evidence_ref.clone();
            self.audit.record(record);
        }
    }

    fn check_binding(&self, calling_skill: &str) -> Result<(), SoulError> {
        let set = self.catalog.current();
        if set.get(calling_skill).is_some() && set.is_enabled(calling_skill) {
            Ok(())
        } else {
            Err(SoulError::new(
                ErrorCode::ToolNotFound,
                format!("skill {calling_skill} not found"),
            )
            .with_field("skill", calling_skill.to_owned()))
        }
    }
}

/// The per-tool rate limits the skills of `set` declare, as QoS limits (any
/// tenant, tool `skills.<skill>.<tool>`): what a shared [`QuotaGate`] given to
/// [`SkillTerms::with_quota`] must enforce.
pub fn rate_limits(set: &SkillSet) -> Vec<QuotaLimit> {
    let mut limits = Vec::new();
    for s in set.skills() {
        for (tool, rate) in &s.exports.access.rate_limit {
            if let (Some(rate), Some(id)) = (rate, crate::model::Skill::tool_id(&s.name, tool)) {
                limits.push(QuotaLimit {
                    tenant: "*".into(),
                    tool: id.as_str().to_owned(),
                    rate: *rate,
                });
            }
        }
    }
    limits
}

fn resolve_run(set: &SkillSet, skill: &str, tool: Option<&str>) -> Result<ToolId, SoulError> {
    let not_found = |why: String| {
        SoulError::new(ErrorCode::ToolNotFound, why).with_field("skill", skill.to_owned())
    };
    let s = set
        .get(skill)
        .filter(|_| set.is_enabled(skill))
        .ok_or_else(|| not_found(format!("skill {skill} not found")))?;
    let t = match tool {
        Some(name) => s
            .tool(name)
            .ok_or_else(|| not_found(format!("skill {skill} has no tool {name}")))?,
        None => match s.tools.as_slice() {
            [only] => only,
            [] => return Err(not_found(format!("skill {skill} has no tools to run"))),
            _ => {
                return Err(not_found(format!(
                    "skill {skill} has several tools; name one of: {}",
                    s.tools
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        },
    };
    Ok(t.id().clone())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use soulbase_types::Rate;

    use super::*;

    fn limit(count: u64) -> Vec<QuotaLimit> {
        vec![QuotaLimit {
            tenant: "*".into(),
            tool: "skills.p.t".into(),
            rate: Rate::new(count, Duration::from_secs(60)).unwrap(),
        }]
    }

    #[test]
    fn the_first_set_configures_the_gate_even_without_limits() {
        let mut rates = Rates::default();
        assert_eq!(rates.advance(1, Vec::new), Some(&[][..]));
        assert_eq!(rates.advance(1, Vec::new), None);
    }

    #[test]
    fn a_newer_set_pushes_only_changed_limits() {
        let mut rates = Rates::default();
        assert_eq!(rates.advance(1, || limit(3)), Some(&limit(3)[..]));
        assert_eq!(rates.advance(2, || limit(3)), None, "same limits");
        assert_eq!(rates.advance(3, || limit(5)), Some(&limit(5)[..]));
    }

    #[test]
    fn a_set_a_reload_replaced_cannot_push_its_limits_back() {
        let mut rates = Rates::default();
        assert!(rates.advance(1, || limit(3)).is_some());
        assert_eq!(rates.advance(2, || limit(5)), Some(&limit(5)[..]));
        // A call still holding generation 1 comes late.
        assert_eq!(
            rates.advance(1, || panic!("an older set's limits are not computed")),
            None
        );
        assert_eq!(rates.limits, limit(5));
        assert_eq!(rates.advance(2, || limit(5)), None);
    }
}
