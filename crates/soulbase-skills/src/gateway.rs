//! Runtime enforcement of cross-skill contracts, wrapped around the invoker.
//!
//! [`SkillGateway::invoke`] runs before the [`Invoker`] pipeline. It takes the
//! **calling skill as a separate, explicit argument**: the skill on whose behalf
//! the call is made, established by the caller of the gateway from its *own*
//! server-side context (the skill session it is running). It must never be taken
//! from what a client sent; whatever `ToolCall::calling_skill` holds is
//! overwritten with the argument, so evidence records the trusted value.
//!
//! For a tool in the `skills.` group, the gateway resolves its provider in the
//! current [`SkillSet`] (no provider → `TOOL.NOT_FOUND`: a skill tool is never
//! treated as a core tool; a disabled provider → `TOOL.DISABLED`). Then:
//!
//! 1. **import** — when a calling skill is given and is not the provider, the
//!    caller must hold an *authorized* import of the tool (declared, exported, and
//!    passing the contract checks: compatible `min_version`, no cycle), else
//!    `SKILL.NOT_IMPORTED`;
//! 2. **subscription** — on *every* call of an exported tool not made by the
//!    provider itself (a calling skill equal to the provider), whoever makes it
//!    (another skill, or a model or API client with no calling skill): when the
//!    provider's `access.requires_subscription` is set and the tool is not in
//!    `free_tools`, the caller's (tenant, actor) must hold a subscription
//!    ([`SubscriptionStore`]), else `SUBSCRIPTION.REQUIRED` with fields
//!    `skill_id` and `action = show_subscribe_card`;
//! 3. **rate limit** — likewise on every such call, the provider's per-tool
//!    `access.rate_limit`, enforced by a QoS [`QuotaGate`] (per tenant), else
//!    `QUOTA.RATE_LIMITED` with a retry hint.
//!
//! Then the invoker runs the governed pipeline as usual (its Begin records the
//! calling skill). Every cross-skill call (a calling skill other than the
//! provider) — allowed or refused — yields a [`CrossSkillRecord`]; any refusal
//! here also writes a `Denied` evidence event. Calls to core tools and a skill's
//! calls to its own tools pass straight to the invoker.

use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use soulbase_config::QuotaLimit;
use soulbase_errors::{ErrorCode, PublicError, SoulError};
use soulbase_observe::{Denial, EvidenceEvent, EvidenceSink};
use soulbase_qos::{LocalQuota, QuotaGate, QuotaRequest};
use soulbase_tools::pipeline::{CallResult, CallStatus, Invoker, ToolCall};
use soulbase_types::{CallId, Envelope, Subject, ToolId, UnixMillis};

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

/// Cross-skill enforcement plus the two-phase `run_skill`, over an [`Invoker`].
pub struct SkillGateway {
    catalog: SkillCatalog,
    invoker: Invoker,
    subscriptions: Arc<dyn SubscriptionStore>,
    audit: Arc<dyn CrossSkillAudit>,
    evidence: Option<Arc<dyn EvidenceSink>>,
    quota: Arc<dyn QuotaGate>,
    sync_rates: Option<RateLimitSync>,
    rates: Mutex<Rates>,
}

impl SkillGateway {
    /// A gateway with no subscriptions, `tracing` audit, no denial evidence, and
    /// an in-process [`LocalQuota`] kept in step with the skills' rate limits.
    pub fn new(catalog: SkillCatalog, invoker: Invoker) -> Self {
        let local = Arc::new(LocalQuota::new(&[]));
        let sync = local.clone();
        Self {
            catalog,
            invoker,
            subscriptions: Arc::new(crate::access::StaticSubscriptions::new()),
            audit: Arc::new(TracingAudit),
            evidence: None,
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

    /// Writes a `Denied` evidence event to `sink` for calls refused here (use the
    /// invoker's sink).
    pub fn with_evidence(mut self, sink: Arc<dyn EvidenceSink>) -> Self {
        self.evidence = Some(sink);
        self
    }

    /// The catalog.
    pub fn catalog(&self) -> &SkillCatalog {
        &self.catalog
    }

    /// The invoker.
    pub fn invoker(&self) -> &Invoker {
        &self.invoker
    }

    /// Runs `call` with the checks described in the module docs.
    ///
    /// `calling_skill` is the skill on whose behalf the call is made, or `None`
    /// for a model or client acting directly. Callers of the gateway **must** set
    /// it from their own server-side context (the skill session they run), never
    /// from client input; `call.calling_skill` is ignored and overwritten.
    pub async fn invoke(&self, calling_skill: Option<&str>, mut call: ToolCall) -> CallResult {
        call.calling_skill = calling_skill.map(str::to_owned);
        if call.tool.group() != SKILL_GROUP {
            return self.invoker.invoke(call).await; // a core tool
        }
        let set = self.catalog.current();
        let Some((provider, tool)) = set.owner_of(&call.tool) else {
            // A skill tool whose skill is not in the current set is never a core
            // tool (fail closed, e.g. while a reload removes it).
            let err = SoulError::new(
                ErrorCode::ToolNotFound,
                format!("tool {} not found", call.tool),
            )
            .with_field("tool", call.tool.as_str().to_owned());
            return denied(&call.call_id, &err);
        };
        if !set.is_enabled(&provider.name) {
            // A disabled skill's tools are refused whatever the registry says.
            let err = SoulError::new(
                ErrorCode::ToolDisabled,
                format!("skill {} is disabled", provider.name),
            )
            .with_field("skill", provider.name.clone());
            return denied(&call.call_id, &err);
        }
        let provider = provider.clone();
        let tool_name = tool.name.clone();
        let exported = tool.exported;
        let own = calling_skill == Some(provider.name.as_str());
        if own {
            return self.invoker.invoke(call).await; // the provider's own tool
        }
        let mut record = calling_skill.map(|caller| CrossSkillRecord {
            call_id: call.call_id.clone(),
            tenant: call.subject.tenant.clone(),
            actor: call.subject.actor.clone(),
            caller: caller.to_owned(),
            provider: provider.name.clone(),
            tool: call.tool.clone(),
            status: CallStatus::Denied,
            error_code: None,
            evidence_ref: None,
            at: UnixMillis::now(),
        });

        if let Some(caller_name) = calling_skill {
            let imported = set
                .get(caller_name)
                .filter(|_| set.is_enabled(caller_name))
                .is_some_and(|caller| set.imports(caller, &provider, &tool_name));
            if !imported {
                let err = SoulError::new(
                    ErrorCode::SkillNotImported,
                    format!(
                        "skill {caller_name} does not import {tool_name} from {}",
                        provider.name
                    ),
                )
                .with_field("calling_skill", caller_name.to_owned())
                .with_field("skill_id", provider.name.clone())
                .with_field("tool", tool_name);
                return self.refuse(&call, err, record).await;
            }
        }
        // The provider's access terms bind every caller but the provider itself.
        if exported
            && provider.needs_subscription(&tool_name)
            && !self.subscriptions.is_subscribed(
                &call.subject.tenant,
                &call.subject.actor,
                &provider.name,
            )
        {
            let err = SoulError::new(
                ErrorCode::SubscriptionRequired,
                format!(
                    "{tool_name} of skill {} requires a subscription",
                    provider.name
                ),
            )
            .with_field("skill_id", provider.name.clone())
            .with_field("action", SUBSCRIBE_ACTION);
            return self.refuse(&call, err, record).await;
        }
        let reservation = if exported && provider.rate_limit(&tool_name).is_some() {
            self.refresh_rates(&set);
            match self
                .quota
                .reserve(QuotaRequest {
                    tenant: &call.subject.tenant,
                    actor: &call.subject.actor,
                    tool: &call.tool,
                })
                .await
            {
                Ok(r) => Some(r),
                Err(err) => return self.refuse(&call, err, record).await,
            }
        } else {
            None
        };

        let result = self.invoker.invoke(call).await;
        if let Some(r) = reservation {
            // A call the pipeline refused did not run: give the slot back.
            let _ = if result.status == CallStatus::Denied && result.evidence_ref.is_none() {
                self.quota.refund(r).await
            } else {
                self.quota.settle(r, Default::default()).await
            };
        }
        if let Some(mut record) = record.take() {
            record.status = result.status;
            record.error_code = result.error_code;
            record.evidence_ref = result.evidence_ref.clone();
            self.audit.record(record);
        }
        result
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

    async fn refuse(
        &self,
        call: &ToolCall,
        err: SoulError,
        record: Option<CrossSkillRecord>,
    ) -> CallResult {
        if let Some(sink) = &self.evidence {
            let env = Envelope::new(
                call.subject.tenant.clone(),
                call.subject.actor.clone(),
                call.origin,
                EvidenceEvent::Denied(Denial {
                    call_id: call.call_id.clone(),
                    tool: call.tool.as_str().to_owned(),
                    code: err.code(),
                }),
            )
            .with_trace(call.trace);
            if let Err(e) = sink.record(env).await {
                tracing::warn!(error = %e, "cannot record a cross-skill denial");
            }
        }
        if let Some(mut record) = record {
            record.error_code = Some(err.code());
            self.audit.record(record);
        }
        denied(&call.call_id, &err)
    }

    /// `run_skill` (the two-phase protocol's third step): runs tool `tool` of
    /// `skill` (or its only tool when `tool` is `None`) for `subject`, through the
    /// same checks as [`invoke`](Self::invoke). `calling_skill` is the skill the
    /// model is working in (from the server's session context), or `None` for the
    /// model acting directly: a calling skill may only run its own tools and its
    /// authorized imports; anyone but the provider is bound by its access terms.
    /// Refused with `TOOL.NOT_FOUND` when the skill is not loaded or disabled, or
    /// the tool is ambiguous or unknown.
    pub async fn run_skill(
        &self,
        subject: Subject,
        calling_skill: Option<&str>,
        skill: &str,
        tool: Option<&str>,
        args: Value,
    ) -> CallResult {
        let set = self.catalog.current();
        match resolve_run(&set, skill, tool) {
            Ok(id) => {
                self.invoke(calling_skill, ToolCall::new(subject, id, args))
                    .await
            }
            Err(err) => denied(&CallId::generate(), &err),
        }
    }
}

/// The per-tool rate limits the skills of `set` declare, as QoS limits (any
/// tenant, tool `skills.<skill>.<tool>`): what a shared [`QuotaGate`] given to
/// [`SkillGateway::with_quota`] must enforce.
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

/// A refused call's result: `denied` whatever the reason, like every call
/// refused before execution (no evidence reference: nothing executed).
fn denied(call_id: &CallId, err: &SoulError) -> CallResult {
    let public = err.public();
    CallResult {
        call_id: call_id.clone(),
        status: CallStatus::Denied,
        error_code: Some(err.code()),
        error: Some(PublicError {
            correlation_id: public
                .correlation_id
                .clone()
                .or_else(|| Some(call_id.to_string())),
            ..public
        }),
        output: None,
        evidence_ref: None,
        replayed: false,
    }
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
