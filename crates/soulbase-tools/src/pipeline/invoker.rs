//! The orchestrator.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use futures_util::FutureExt;
use serde_json::Value;
use soulbase_auth::{
    Action, Authorizer, AuthzRequest, CONSENT_REQUEST_TTL_MS, ConsentGrant, ConsentRequest,
    ConsentRequests, ConsentVerifier, MAX_PENDING_PER_ACTOR, NewConsentRequest,
};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::{
    BudgetUsage, ConsentUsed, ConversationEvent, Denial, Durable, EndStatus, EvidenceBegin,
    EvidenceEnd, EvidenceEvent, EvidenceRecord, EvidenceSink, canonical_json, digest_bytes,
};
use soulbase_qos::{QuotaGate, QuotaRequest, Reservation};
use soulbase_sandbox::{ExecOutput, ExecRequest, Profile, ProfileBuilder, ProviderKind, Sandbox};
use soulbase_types::{
    ActorId, CallId, Envelope, EnvelopeId, Origin, Subject, TenantId, ToolId, TraceContext,
    UnixMillis,
};
use tracing::Instrument;

use super::concurrency::ConcurrencyLimiter;
use super::fault::{FaultHook, FaultPoint};
use super::idempotency::{Claim, IdempotencyKey, IdempotencyStore, StoredOutcome};
use super::inflight::{InFlight, OpenCall};
use super::obligations::apply_obligations;
use super::stage::{self, stage_span};
use super::terms::{self as quota_terms, Admission, CallTerms, QuotaHold};
use super::{CallResult, PreflightReport, ToolCall};
use crate::manifest::{
    CompiledTool, Concurrency, Idempotency, Obligation, SafetyClass, SideEffect, ToolManifest,
};
use crate::registry::{AvailableSpec, Registry, ResolvedTool, ToolFilter, ToolOwner, ToolState};

/// Finds the enabled tool a tenant may see: `TOOL.NOT_FOUND` when invisible,
/// `TOOL.DISABLED` when visible but not enabled. The registry implements it.
pub trait ToolResolver: Send + Sync + 'static {
    /// Resolves `id` for `tenant`.
    fn resolve(&self, tenant: &TenantId, id: &ToolId) -> Result<ResolvedTool, SoulError>;
    /// The enabled tools `tenant` sees (before authorization).
    fn available_specs(&self, tenant: &TenantId) -> Vec<AvailableSpec>;
    /// The tools `tenant` sees that match `filter` (before authorization).
    fn list(&self, tenant: &TenantId, filter: &ToolFilter) -> Vec<ResolvedTool>;
}

impl ToolResolver for Registry {
    fn resolve(&self, tenant: &TenantId, id: &ToolId) -> Result<ResolvedTool, SoulError> {
        Registry::resolve(self, tenant, id)
    }

    fn available_specs(&self, tenant: &TenantId) -> Vec<AvailableSpec> {
        Registry::available_specs(self, tenant)
    }

    fn list(&self, tenant: &TenantId, filter: &ToolFilter) -> Vec<ResolvedTool> {
        Registry::list(self, tenant, filter)
    }
}

struct Seams {
    tools: Arc<dyn ToolResolver>,
    authorizer: Arc<dyn Authorizer>,
    quota: Arc<dyn QuotaGate>,
    consent: Arc<dyn ConsentVerifier>,
    profiles: Arc<dyn ProfileBuilder>,
    sandbox: Arc<dyn Sandbox>,
    evidence: Arc<dyn EvidenceSink>,
    idempotency: Arc<dyn IdempotencyStore>,
    terms: Option<Arc<dyn CallTerms>>,
    /// Where a call refused for want of consent leaves its request, when kept.
    consent_requests: Option<Arc<dyn ConsentRequests>>,
    config_hash: ArcSwap<String>,
    /// When set, the configuration whose current hash every Begin records.
    config: Option<soulbase_config::ConfigHandle>,
    limiter: ConcurrencyLimiter,
    inflight: InFlight,
    fault: Option<FaultHook>,
}

/// Runs tool calls through the governed path. Cheap to clone; share one per process.
#[derive(Clone)]
pub struct Invoker {
    seams: Arc<Seams>,
}

/// Assembles an [`Invoker`] from its seams.
pub struct InvokerBuilder {
    seams: Seams,
}

impl InvokerBuilder {
    /// Every seam is required; there are no permissive defaults.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        tools: Arc<dyn ToolResolver>,
        authorizer: Arc<dyn Authorizer>,
        quota: Arc<dyn QuotaGate>,
        consent: Arc<dyn ConsentVerifier>,
        profiles: Arc<dyn ProfileBuilder>,
        sandbox: Arc<dyn Sandbox>,
        evidence: Arc<dyn EvidenceSink>,
        idempotency: Arc<dyn IdempotencyStore>,
    ) -> Self {
        Self {
            seams: Seams {
                tools,
                authorizer,
                quota,
                consent,
                profiles,
                sandbox,
                evidence,
                idempotency,
                terms: None,
                consent_requests: None,
                config_hash: ArcSwap::from_pointee(String::new()),
                config: None,
                limiter: ConcurrencyLimiter::default(),
                inflight: InFlight::default(),
                fault: None,
            },
        }
    }

    /// Keeps a consent request in `requests` for every call refused
    /// `CONSENT.REQUIRED` (not for a preflight): one pending request per
    /// tenant, actor, tool and arguments digest, named in the refusal as
    /// `fields.consent_request` for the caller to follow.
    pub fn consent_requests(mut self, requests: Arc<dyn ConsentRequests>) -> Self {
        self.seams.consent_requests = Some(requests);
        self
    }

    /// The hash of the configuration in force, recorded in every Begin.
    pub fn config_hash(self, hash: impl Into<String>) -> Self {
        self.seams.config_hash.store(Arc::new(hash.into()));
        self
    }

    /// Records in every Begin the hash of `handle`'s current snapshot, following
    /// its reloads.
    pub fn follow_config(mut self, handle: soulbase_config::ConfigHandle) -> Self {
        self.seams.config = Some(handle);
        self
    }

    /// The provider terms (the skills' imports, subscriptions and rate limits)
    /// every call is held to, at stage `terms` and `quota` (see [`CallTerms`]).
    pub fn terms(mut self, terms: Arc<dyn CallTerms>) -> Self {
        self.seams.terms = Some(terms);
        self
    }

    /// A hook called at every [`FaultPoint`] of a keyed call (crash drills only).
    pub fn fault_hook(mut self, hook: FaultHook) -> Self {
        self.seams.fault = Some(hook);
        self
    }

    /// Builds the invoker.
    pub fn build(self) -> Invoker {
        Invoker {
            seams: Arc::new(self.seams),
        }
    }
}

/// What preflight established, carried into execution.
struct Cleared {
    resolved: ResolvedTool,
    bytes_in: u64,
    args_digest: String,
    policy_hash: String,
    admission: Admission,
    /// The manifest's obligations, then the policy decision's.
    obligations: Vec<Obligation>,
}

/// A keyed call's key, arguments digest and Begin, carried to its End.
struct Keyed<'a> {
    key: &'a IdempotencyKey,
    args_digest: &'a str,
    /// The call's Begin, once written (the key is marked begun with it).
    begin: Option<EvidenceRecord>,
}

/// Who a call's evidence belongs to: copied into every envelope the call produces.
#[derive(Clone)]
struct Header {
    tenant: TenantId,
    actor: ActorId,
    origin: Origin,
    trace: Option<TraceContext>,
}

/// Makes sure a call that began gets an End even if its future is dropped. Holds
/// the call's [`OpenCall`] until that End is recorded. A keyed call's key is
/// completed with the cancelled outcome and that End (so a retry replays it at
/// once rather than waiting for the key to lapse). Once a keyed call's own End is
/// made ([`ending`](Self::ending)), a drop stores its outcome with that End and
/// records it instead, so the call never gets two Ends.
struct EndGuard {
    sink: Arc<dyn EvidenceSink>,
    header: Option<(Header, CallId, EnvelopeId, Instant, OpenCall)>,
    keyed: Option<(Arc<dyn IdempotencyStore>, IdempotencyKey, String)>,
    ending: Option<(EvidenceRecord, StoredOutcome)>,
}

impl EndGuard {
    fn disarm(&mut self) {
        self.header = None;
    }

    /// The call's End is someone else's to record now ([`complete_later`]): the
    /// guard does nothing on drop, and gives up the call's place among the open
    /// calls for the new owner to hold until that End is recorded.
    fn hand_over(&mut self) -> Option<OpenCall> {
        self.ending = None;
        self.keyed = None;
        self.header.take().map(|(_, _, _, _, open)| open)
    }

    /// A keyed call's End and outcome are made: a drop from now on stores and
    /// records them.
    fn ending(&mut self, end: &EvidenceRecord, outcome: &StoredOutcome) {
        self.ending = Some((end.clone(), outcome.clone()));
    }

    /// The key is not this call's any more: a drop records `end` only.
    fn ending_unkeyed(&mut self, end: &EvidenceRecord) {
        self.keyed = None;
        if let Some((e, _)) = &mut self.ending {
            *e = end.clone();
        }
    }
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        let Some((header, call_id, begin_id, started, open)) = self.header.take() else {
            return;
        };
        if let Some((end, outcome)) = self.ending.take() {
            let (sink, keyed) = (self.sink.clone(), self.keyed.take());
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    // Stored already unless the drop cut the store off (then the
                    // key is still this call's); a stored one refuses it again.
                    if let Some((store, key, _)) = keyed
                        && let Err(e) = store.complete(&key, outcome, Some(&end)).await
                    {
                        tracing::debug!(error = ?e, "the outcome of a dropped keyed call was stored already");
                    }
                    if let Err(e) = sink.record(end).await {
                        tracing::error!(error = ?e, "could not record the End of a dropped call");
                    }
                    drop(open);
                });
            }
            return;
        }
        let end = EvidenceEnd {
            call_id: call_id.clone(),
            begin_id: begin_id.clone(),
            status: EndStatus::Cancelled,
            error_code: None,
            output_digest: None,
            side_effects: Vec::new(),
            usage: BudgetUsage {
                calls: 1,
                ..BudgetUsage::default()
            },
            duration_us: micros(started.elapsed()),
            client_requests: Vec::new(),
        };
        let record = stamp(&header, EvidenceEvent::End(end));
        let sink = self.sink.clone();
        let keyed = self.keyed.take().map(|(store, key, args_digest)| {
            let err = SoulError::new(
                ErrorCode::ProviderUnavailable,
                "the call was cancelled before it finished; it may have taken effect and is not run again under this key",
            )
            .with_field("reason", "cancelled")
            .with_field("outcome", "unknown");
            let result = CallResult::failed(call_id.clone(), &err, Some(begin_id.clone()));
            (store, key, StoredOutcome { args_digest, result })
        });
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if let Some((store, key, outcome)) = keyed
                        && let Err(e) = store.complete(&key, outcome, Some(&record)).await
                    {
                        tracing::error!(error = ?e, "could not store the outcome of a cancelled keyed call");
                    }
                    if let Err(e) = sink.record(record).await {
                        tracing::error!(error = ?e, "could not record the End of a cancelled call");
                    }
                    drop(open);
                });
            }
            Err(_) => tracing::error!(
                "a call was cancelled outside a runtime; its End could not be recorded"
            ),
        }
    }
}

/// The longest pause between two tries of [`complete_later`].
const COMPLETE_LATER_MAX: Duration = Duration::from_millis(250);

/// Stores a keyed call's outcome with its End once the store is reachable again,
/// then records the End: retried (backing off to [`COMPLETE_LATER_MAX`]) for as
/// long as the store is unreachable. If another caller settled the key meanwhile
/// (its owner looked dead: `IDEMPOTENCY.CONFLICT`), that settlement closed the
/// Begin `aborted`, and this End is recorded `aborted` too — the store keeps one
/// End per call — so the evidence agrees with what the key answers. Holds the
/// call's place among the open calls (`open`) until the End is recorded.
async fn complete_later(
    store: Arc<dyn IdempotencyStore>,
    sink: Arc<dyn EvidenceSink>,
    key: IdempotencyKey,
    outcome: StoredOutcome,
    mut end: EvidenceRecord,
    open: Option<OpenCall>,
) {
    let mut pause = Duration::from_millis(25);
    loop {
        match store.complete(&key, outcome.clone(), Some(&end)).await {
            Ok(()) => break,
            Err(e) if e.code() == ErrorCode::IdempotencyConflict => {
                tracing::warn!(tool = %key.tool, "a pending keyed call's key was settled by another caller; its End is recorded aborted");
                if let EvidenceEvent::End(e) = &mut end.payload {
                    e.status = EndStatus::Aborted;
                    e.error_code = None;
                    e.output_digest = None;
                }
                break;
            }
            Err(e) => {
                tracing::debug!(error = ?e, "a pending keyed call's outcome cannot be stored yet; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(COMPLETE_LATER_MAX);
            }
        }
    }
    if let Err(e) = sink.record(end).await {
        tracing::error!(error = ?e, "could not record the End of a keyed call completed late");
    }
    drop(open);
}

/// Gives a claimed key up if the call's future is dropped before the call is
/// through the pipeline (its caller went away while it waited, e.g. for a
/// concurrency slot). A key already marked begun or completed is left as it is by
/// the store, so this is harmless once the call reached its tool (whose [`EndGuard`]
/// then stores the cancelled outcome).
struct ClaimGuard {
    store: Arc<dyn IdempotencyStore>,
    key: Option<IdempotencyKey>,
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else {
            return;
        };
        let store = self.store.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = store.release(&key).await {
                    tracing::warn!(error = ?e, "could not release the key of a dropped call");
                }
            });
        }
    }
}

/// The error of a call refused because the process is abandoning its calls.
/// Whether `v` nests arrays and objects deeper than `max` levels (the top-level
/// object is level 1), without recursion: an attacker's deep document cannot
/// overflow the stack here.
fn exceeds_depth(v: &Value, max: u32) -> bool {
    let mut stack = vec![(v, 1u32)];
    while let Some((v, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Object(m) => Box::new(m.values()),
            Value::Array(a) => Box::new(a.iter()),
            _ => continue,
        };
        if depth > max {
            return true;
        }
        stack.extend(children.map(|c| (c, depth + 1)));
    }
    false
}

/// What Begin records of the consent a call ran under: only for a tool that
/// requires consent, whose token the consent stage has just verified.
fn consent_used(call: &ToolCall, manifest: &ToolManifest) -> Option<ConsentUsed> {
    if !manifest.consent.required {
        return None;
    }
    let token = call.consent.as_deref()?;
    let grant = ConsentGrant::unverified(token)?;
    Some(ConsentUsed {
        token_id: grant.id,
        token_digest: digest_bytes(token.as_bytes()),
        issued_at: grant.issued_at.map(|t| t.0),
        expires_at: grant.expires_at.0,
        args_bound: grant.args_digest.is_some(),
    })
}

fn shutting_down() -> SoulError {
    SoulError::new(
        ErrorCode::ProviderUnavailable,
        "the server is shutting down; the call was not executed",
    )
    .with_field("reason", "shutdown")
}

/// The error of a call cut off by [`Invoker::abandon_running`]: its End is
/// `cancelled` with this code.
fn cut_off() -> SoulError {
    SoulError::new(
        ErrorCode::ProviderUnavailable,
        "the server shut down before the call finished; it was cancelled",
    )
    .with_field("reason", "shutdown")
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A new envelope with `header`'s tenant, actor, origin and trace.
fn stamp<T>(header: &Header, payload: T) -> Envelope<T> {
    Envelope {
        id: EnvelopeId::generate(),
        tenant: header.tenant.clone(),
        actor: header.actor.clone(),
        origin: header.origin,
        trace: header.trace,
        at: UnixMillis::now(),
        payload,
    }
}

impl Invoker {
    /// The tool `id` as `tenant` sees it (`TOOL.NOT_FOUND` when invisible,
    /// `TOOL.DISABLED` when not enabled): what a call would run.
    pub fn resolve(&self, tenant: &TenantId, id: &ToolId) -> Result<ResolvedTool, SoulError> {
        self.seams.tools.resolve(tenant, id)
    }

    /// The AvailableSpec view (R2, SB-08 §3.3) for `subject` acting as
    /// `calling_skill` (`None`: a model or client acting directly): what it may be
    /// offered, in id order — [`list`](Self::list) of the enabled tools.
    pub async fn available(
        &self,
        subject: &Subject,
        calling_skill: Option<&str>,
    ) -> Result<Vec<AvailableSpec>, SoulError> {
        let tools = self
            .list(subject, calling_skill, &ToolFilter::default())
            .await?;
        Ok(tools
            .into_iter()
            .map(|r| AvailableSpec {
                tool: r.tool,
                owner: r.owner,
            })
            .collect())
    }

    /// The governed listing every surface serves, in id order.
    ///
    /// - Without a state in `filter`, or with `enabled`: the tools `subject`'s
    ///   tenant sees enabled (manifest ∩ tenant config) that match `filter`, that
    ///   the provider's terms show to a caller acting as `calling_skill`, and that
    ///   policy lets `subject` both `list` and `invoke`.
    /// - With another state (`registered`, `paused`, `deprecated`): the operator's
    ///   view of those tools — each one `subject` may `list` and administer
    ///   (`enable`).
    ///
    /// A tool the authorizer refuses (or cannot decide) is left out. A binding to a
    /// skill that is not loaded or is disabled is `TOOL.NOT_FOUND`.
    pub async fn list(
        &self,
        subject: &Subject,
        calling_skill: Option<&str>,
        filter: &ToolFilter,
    ) -> Result<Vec<ResolvedTool>, SoulError> {
        let s = &self.seams;
        if let (Some(terms), Some(skill)) = (&s.terms, calling_skill) {
            terms.check_binding(skill)?;
        }
        let operator = filter.state.is_some_and(|st| st != ToolState::Enabled);
        let filter = ToolFilter {
            state: Some(filter.state.unwrap_or(ToolState::Enabled)),
            ..filter.clone()
        };
        let needed = if operator {
            Action::Enable
        } else {
            Action::Invoke
        };
        let mut out = Vec::new();
        for tool in s.tools.list(&subject.tenant, &filter) {
            if !operator
                && let Some(terms) = &s.terms
                && !terms.visible(tool.id(), calling_skill)
            {
                continue;
            }
            let allowed = s
                .authorizer
                .authorize_all(
                    AuthzRequest {
                        subject,
                        tool: tool.id(),
                        tool_tenant: tool.owner.tenant_id(),
                        action: needed,
                        tool_scopes: &tool.tool.scope_names,
                    },
                    &[Action::List, needed],
                )
                .await
                .is_ok();
            if allowed {
                out.push(tool);
            }
        }
        out.sort_by(|a, b| a.id().as_str().cmp(b.id().as_str()));
        Ok(out)
    }

    /// Whether policy lets `subject` perform `action` on tool `id` of `owner`.
    pub async fn permits(
        &self,
        subject: &Subject,
        id: &ToolId,
        owner: &ToolOwner,
        action: Action,
    ) -> bool {
        self.seams
            .authorizer
            .authorize(AuthzRequest {
                subject,
                tool: id,
                tool_tenant: owner.tenant_id(),
                action,
                tool_scopes: &[],
            })
            .await
            .is_ok()
    }

    /// Answers a call refused before it reached the pipeline (a malformed tool
    /// id, a skill binding the caller may not claim, a malformed trace context):
    /// records its denial like the pipeline's own refusals and returns the
    /// `denied` result. `tool` is the id as the caller gave it.
    pub async fn refuse(
        &self,
        subject: &Subject,
        origin: Origin,
        call_id: &CallId,
        tool: &str,
        err: SoulError,
    ) -> CallResult {
        let header = Header {
            tenant: subject.tenant.clone(),
            actor: subject.actor.clone(),
            origin,
            trace: None,
        };
        self.record_denial(&header, call_id, tool, &err).await;
        CallResult::failed(call_id.clone(), &err, None)
    }

    /// Records a step of an agent-loop conversation made by `subject`: the
    /// loop's own evidence, beside the calls it made. With `wait`, durable when
    /// this returns `Ok` (as durable as the sink makes any record); without, only
    /// accepted — the sink writes records in order, so it is durable once any
    /// later record waited for is (the conversation's End, a call's Begin).
    pub async fn record_conversation(
        &self,
        subject: &Subject,
        event: ConversationEvent,
        wait: bool,
    ) -> Result<(), SoulError> {
        let header = Header {
            tenant: subject.tenant.clone(),
            actor: subject.actor.clone(),
            origin: Origin::Llm,
            trace: None,
        };
        let record = stamp(&header, EvidenceEvent::Conversation(Box::new(event)));
        let evidence = &self.seams.evidence;
        let span = stage_span!("evidence.conversation");
        if wait {
            evidence.record(record).instrument(span).await
        } else {
            evidence.submit(record).instrument(span).await.map(drop)
        }
    }

    /// Reserves one agent-loop model turn for `subject` through the quota seam
    /// (a call of [`soulbase_qos::MODEL_TURN`]): `QUOTA.RATE_LIMITED` or
    /// `QUOTA.BUDGET_EXCEEDED` when a limit naming model turns is used up.
    pub async fn reserve_model_turn(&self, subject: &Subject) -> Result<Reservation, SoulError> {
        let tool = ToolId::new(soulbase_qos::MODEL_TURN).map_err(SoulError::internal)?;
        self.seams
            .quota
            .reserve(QuotaRequest {
                tenant: &subject.tenant,
                actor: &subject.actor,
                tool: &tool,
            })
            .instrument(stage_span!("quota"))
            .await
    }

    /// Settles a model turn reserved with
    /// [`reserve_model_turn`](Self::reserve_model_turn): `usage` is charged (its
    /// bytes in and out); a turn that never reached the model is refunded
    /// (`None`). A backend failure here is logged: the turn happened either way.
    pub async fn settle_model_turn(&self, reservation: Reservation, usage: Option<BudgetUsage>) {
        let done = match usage {
            Some(usage) => self.seams.quota.settle(reservation, usage).await,
            None => self.seams.quota.refund(reservation).await,
        };
        if let Err(e) = done {
            tracing::warn!(error = ?e, "could not settle a model turn's quota");
        }
    }

    /// Cuts off every call still running (a server whose shutdown grace expired):
    /// each stops executing and records a `cancelled` End (error code
    /// `PROVIDER.UNAVAILABLE`, its answer to the caller), and from now on no call
    /// writes a Begin (they are refused). Returns how many calls had a Begin without
    /// an End at that moment. Await [`all_ended`](Self::all_ended) for their Ends.
    pub fn abandon_running(&self) -> usize {
        self.seams.inflight.abandon()
    }

    /// How many calls have a Begin without their End recorded.
    pub fn open_calls(&self) -> usize {
        self.seams.inflight.count()
    }

    /// Resolves when every call that wrote a Begin has its End recorded (in the
    /// evidence sink: durable in the spool, not necessarily in the store yet).
    pub async fn all_ended(&self) {
        self.seams.inflight.closed().await;
    }

    /// Replaces the recorded configuration hash (after a config reload).
    pub fn set_config_hash(&self, hash: impl Into<String>) {
        self.seams.config_hash.store(Arc::new(hash.into()));
    }

    /// Calls the fault hook, if any, at `point` of a keyed call.
    fn fault(&self, point: FaultPoint) {
        if let Some(hook) = &self.seams.fault {
            hook(point);
        }
    }

    fn header(call: &ToolCall) -> Header {
        Header {
            tenant: call.subject.tenant.clone(),
            actor: call.subject.actor.clone(),
            origin: call.origin,
            trace: call.trace,
        }
    }

    /// Resolve, input schema, authorization, the provider's terms: the checks
    /// every path shares. A preflight must be allowed to `preflight` as well as
    /// to `invoke`.
    async fn clear(&self, call: &ToolCall, preflight: bool) -> Result<Cleared, SoulError> {
        let s = &self.seams;
        let resolved = stage::sync(stage_span!("resolve"), || {
            s.tools.resolve(&call.subject.tenant, &call.tool)
        })?;
        let args_bytes = stage::sync(stage_span!("schema"), || {
            Self::check_input(call, &resolved.tool)
        })?;
        let req = AuthzRequest {
            subject: &call.subject,
            tool: &call.tool,
            tool_tenant: match &resolved.owner {
                ToolOwner::Tenant(t) => Some(t),
                ToolOwner::Global => None,
            },
            action: Action::Invoke,
            tool_scopes: &resolved.tool.scope_names,
        };
        let authorize = async {
            if preflight {
                s.authorizer
                    .authorize_all(req, &[Action::Preflight, Action::Invoke])
                    .await
            } else {
                s.authorizer.authorize(req).await
            }
        };
        let decision = stage::run(stage_span!("authorize"), authorize).await?;
        let admission = match &s.terms {
            Some(terms) => stage::sync(stage_span!("terms"), || terms.admit(call))?,
            None => Admission::default(),
        };
        let args_digest = digest_bytes(&args_bytes);
        let mut obligations = resolved.tool.manifest.obligations.clone();
        for ob in decision.obligations {
            if !obligations.contains(&ob) {
                obligations.push(ob);
            }
        }
        Ok(Cleared {
            resolved,
            bytes_in: args_bytes.len() as u64,
            args_digest,
            policy_hash: decision.policy_hash,
            admission,
            obligations,
        })
    }

    /// The input schema and size, and the idempotency key a keyed tool requires;
    /// returns the arguments' canonical JSON (so that the digest used for
    /// idempotency and replay ignores key order).
    fn check_input(call: &ToolCall, tool: &CompiledTool) -> Result<Vec<u8>, SoulError> {
        let manifest = &tool.manifest;
        tool.validate_input(&call.args)?;
        let args_bytes = canonical_json(&call.args);
        if args_bytes.len() as u64 > manifest.limits.max_bytes_in {
            return Err(SoulError::new(
                ErrorCode::SchemaValidationFailed,
                "the arguments exceed max_bytes_in",
            )
            .with_field("field", "args")
            .with_field("max_bytes_in", manifest.limits.max_bytes_in.to_string()));
        }
        if exceeds_depth(&call.args, manifest.limits.max_depth) {
            return Err(SoulError::new(
                ErrorCode::SchemaValidationFailed,
                "the arguments are nested deeper than max_depth",
            )
            .with_field("field", "args")
            .with_field("max_depth", manifest.limits.max_depth.to_string()));
        }
        if let Some(key) = &call.idempotency_key {
            check_idempotency_key(key)?;
        }
        if manifest.idempotency == Idempotency::Keyed
            && call.idempotency_key.as_deref().is_none_or(str::is_empty)
        {
            return Err(SoulError::new(
                ErrorCode::SchemaValidationFailed,
                "this tool is idempotent by key: the call must carry an idempotency_key",
            )
            .with_field("field", "idempotency_key"));
        }
        Ok(args_bytes)
    }

    /// The consent stage. A call (not a preflight: `open_request`) refused
    /// `CONSENT.REQUIRED` leaves a consent request, named in the refusal's
    /// `fields.consent_request` (see [`InvokerBuilder::consent_requests`]).
    async fn check_consent(
        &self,
        call: &ToolCall,
        cleared: &Cleared,
        open_request: bool,
    ) -> Result<(), SoulError> {
        let manifest = &cleared.resolved.tool.manifest;
        if !manifest.consent.required {
            return Ok(());
        }
        let now = UnixMillis::now();
        let verify = self.seams.consent.verify(ConsentRequest {
            subject: &call.subject,
            tool: &call.tool,
            scope: manifest.consent.scope.as_deref(),
            args_digest: &cleared.args_digest,
            token: call.consent.as_deref(),
            now,
            max_age_ms: manifest.consent.ttl_ms,
        });
        let refused = match stage::run(stage_span!("consent"), verify).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let requests = match &self.seams.consent_requests {
            Some(r) if open_request && refused.code() == ErrorCode::ConsentRequired => r,
            _ => return Err(refused),
        };
        let new = NewConsentRequest {
            tenant: call.subject.tenant.clone(),
            actor: call.subject.actor.clone(),
            tool: call.tool.clone(),
            args_digest: cleared.args_digest.clone(),
            call_id: call.call_id.clone(),
            at: now,
        };
        let fresh_since = UnixMillis(now.0.saturating_sub(CONSENT_REQUEST_TTL_MS));
        let open = requests.open(&new, fresh_since, MAX_PENDING_PER_ACTOR);
        // The refusal stands whatever becomes of the request.
        match open.instrument(stage_span!("consent.request")).await {
            Ok(Some(request)) => Err(refused.with_field("consent_request", request.id)),
            Ok(None) => Err(refused),
            Err(e) => {
                tracing::warn!(error = ?e, call_id = %call.call_id, "could not open a consent request");
                Err(refused)
            }
        }
    }

    fn exec_request<'a>(
        call: &'a ToolCall,
        tool: &'a CompiledTool,
        profile: &'a Profile,
        args: Value,
    ) -> ExecRequest<'a> {
        ExecRequest {
            call_id: &call.call_id,
            tenant: &call.subject.tenant,
            tool: &call.tool,
            provider: &tool.manifest.provider,
            args,
            profile,
            timeout: Duration::from_millis(tool.manifest.limits.timeout_ms),
            max_bytes_out: Some(tool.manifest.limits.max_bytes_out),
            max_memory_bytes: Some(tool.manifest.limits.max_memory_bytes),
            max_processes: Some(tool.manifest.limits.max_processes),
            max_files: Some(tool.manifest.limits.max_files),
            reporter: call.reporter.clone(),
        }
    }

    fn quota_request(call: &ToolCall) -> QuotaRequest<'_> {
        QuotaRequest {
            tenant: &call.subject.tenant,
            actor: &call.subject.actor,
            tool: &call.tool,
        }
    }

    /// The call's profile (Grant ∩ Manifest ∩ PolicyConfig), checked by the sandbox's
    /// guard against what the tool plans to do.
    fn guarded_profile(
        &self,
        call: &ToolCall,
        tool: &CompiledTool,
    ) -> Result<Arc<Profile>, SoulError> {
        let s = &self.seams;
        let profile = stage::sync(stage_span!("profile"), || {
            s.profiles.build(
                &call.subject.tenant,
                &tool.digest,
                &tool.manifest.capabilities,
            )
        })?;
        stage::sync(stage_span!("guard"), || {
            s.sandbox
                .guard(&Self::exec_request(call, tool, &profile, Value::Null))
        })?;
        Ok(profile)
    }

    /// A dry run: every preflight check, nothing consumed, nothing executed or recorded.
    /// Traced as a `preflight` span (target [`STAGE_TARGET`](super::STAGE_TARGET))
    /// with the stage spans of the checks as its children.
    pub async fn preflight(&self, call: &ToolCall) -> Result<PreflightReport, SoulError> {
        let span = tracing::debug_span!(target: super::STAGE_TARGET, "preflight");
        self.preflight_stages(call).instrument(span).await
    }

    async fn preflight_stages(&self, call: &ToolCall) -> Result<PreflightReport, SoulError> {
        let s = &self.seams;
        let cleared = self.clear(call, true).await?;
        let tool = &cleared.resolved.tool;
        let check = async {
            let budget = s.quota.check(Self::quota_request(call)).await?;
            if let Some(gate) = &cleared.admission.metered {
                gate.check(Self::quota_request(call)).await?;
            }
            Ok::<_, SoulError>(budget)
        };
        let budget = stage::run(stage_span!("quota"), check).await?;
        self.check_consent(call, &cleared, false).await?;
        let profile = self.guarded_profile(call, tool)?;
        Ok(PreflightReport {
            tool: call.tool.clone(),
            version: tool.manifest.version.to_string(),
            profile_hash: profile.hash().to_owned(),
            policy_hash: cleared.policy_hash,
            budget,
            consent_required: tool.manifest.consent.required,
            obligations: cleared.obligations.clone(),
        })
    }

    /// Runs one call through the whole pipeline. Never panics; every failure is a
    /// result with a stable code.
    pub async fn invoke(&self, mut call: ToolCall) -> CallResult {
        let mut result = self.govern(&mut call).await;
        if result.is_ok()
            && let Ok(resolved) = self.seams.tools.resolve(&call.subject.tenant, &call.tool)
        {
            // The deprecation notes, then what the call's obligations said.
            let notes = resolved.tool.manifest.deprecations.iter().map(|d| d.note());
            result.warnings.splice(0..0, notes);
        }
        if call.calling_skill.is_some()
            && let Some(terms) = &self.seams.terms
        {
            terms.finished(&call, &result);
        }
        result
    }

    /// [`invoke`](Self::invoke) but for telling the terms how it ended.
    async fn govern(&self, call: &mut ToolCall) -> CallResult {
        let header = Self::header(call);
        let cleared = match self.clear(call, false).await {
            Ok(c) => c,
            Err(e) => return self.denied(&header, call, e).await,
        };
        // Validated, measured and digested: from here on only the executor needs them.
        let args = std::mem::take(&mut call.args);
        let call = &*call;
        let key = match (
            &cleared.resolved.tool.manifest.idempotency,
            &call.idempotency_key,
        ) {
            (Idempotency::Keyed, Some(k)) => Some(IdempotencyKey {
                tenant: call.subject.tenant.clone(),
                tool: call.tool.clone(),
                key: k.clone(),
            }),
            _ => None,
        };
        let mut claim_guard = ClaimGuard {
            store: self.seams.idempotency.clone(),
            key: None,
        };
        if let Some(key) = &key {
            let wait = Duration::from_millis(
                cleared
                    .resolved
                    .tool
                    .manifest
                    .limits
                    .timeout_ms
                    .saturating_add(1_000),
            );
            let claim = self
                .seams
                .idempotency
                .claim(key, &cleared.args_digest, wait);
            match stage::run(stage_span!("idempotency"), claim).await {
                Ok(Claim::Owner) => {
                    claim_guard.key = Some(key.clone());
                    self.fault(FaultPoint::Claimed);
                }
                // A replay is the original call's answer: its call id and its
                // evidence, whatever id the retry carried (so the evidence read
                // back by that id is the call that ran).
                Ok(Claim::Completed(stored)) => {
                    return CallResult {
                        replayed: true,
                        ..stored.result
                    };
                }
                Err(e) => return self.denied(&header, call, e).await,
            }
        }
        let args_digest = cleared.args_digest.clone();
        let keyed = key.as_ref().map(|key| Keyed {
            key,
            args_digest: &args_digest,
            begin: None,
        });
        let result = self
            .execute_cleared(&header, call, cleared, args, keyed)
            .await;
        claim_guard.key = None;
        // An executed keyed call stored its outcome with its End; one refused
        // (before execution) gives the key up: nothing happened, it may be used again.
        if let (Some(key), Err(_)) = (&key, &result) {
            let release = self.seams.idempotency.release(key);
            if let Err(e) = release.instrument(stage_span!("idempotency.store")).await {
                tracing::error!(error = ?e, call_id = %call.call_id, "idempotency store failed");
            }
        }
        match result {
            Ok(r) => r,
            Err(e) => self.denied(&header, call, e).await,
        }
    }

    /// Quota → consent → profile → guard → Begin → execute → End.
    /// `Err` means refused: before execution, or after a run that changed nothing
    /// whose Begin did not land (see [`changes_nothing`]); no evidence besides a
    /// denial either way.
    async fn execute_cleared(
        &self,
        header: &Header,
        call: &ToolCall,
        cleared: Cleared,
        args: Value,
        keyed: Option<Keyed<'_>>,
    ) -> Result<CallResult, SoulError> {
        let s = &self.seams;
        let tool = cleared.resolved.tool.clone();
        let manifest = &tool.manifest;
        // The tool's quota, then what the provider's terms meter; each given back
        // if the call does not run (a hold refunds on drop unless spent).
        let reserve = async {
            let tool_hold = QuotaHold::new(
                s.quota.clone(),
                s.quota.reserve(Self::quota_request(call)).await?,
            );
            let terms_hold = match &cleared.admission.metered {
                Some(gate) => Some(QuotaHold::new(
                    gate.clone(),
                    gate.reserve(Self::quota_request(call)).await?,
                )),
                None => None,
            };
            Ok::<_, SoulError>((tool_hold, terms_hold))
        };
        let (tool_hold, terms_hold) = stage::run(stage_span!("quota"), reserve).await?;
        let before_exec = async {
            self.check_consent(call, &cleared, true).await?;
            let profile = self.guarded_profile(call, &tool)?;
            let permits = match manifest.concurrency {
                Concurrency::Serial => 1,
                Concurrency::Parallel => manifest.limits.max_concurrency,
            };
            let permit = if permits > 0 {
                let wait = Duration::from_millis(manifest.limits.timeout_ms);
                let acquire = s
                    .limiter
                    .acquire(&call.subject.tenant, &call.tool, permits, wait);
                Some(stage::run(stage_span!("concurrency"), acquire).await?)
            } else {
                None
            };
            let begin = stamp(
                header,
                EvidenceEvent::Begin(EvidenceBegin {
                    call_id: call.call_id.clone(),
                    tool_id: call.tool.clone(),
                    tool_version: tool.version_text().to_owned(),
                    manifest_digest: tool.digest.clone(),
                    profile_hash: profile.hash().to_owned(),
                    policy_hash: cleared.policy_hash.clone(),
                    config_hash: match &s.config {
                        Some(handle) => handle.current().hash().to_owned(),
                        None => s.config_hash.load().as_ref().clone(),
                    },
                    args_digest: cleared.args_digest.clone(),
                    idempotency_key: call.idempotency_key.clone(),
                    calling_skill: call.calling_skill.clone(),
                    consent: consent_used(call, manifest),
                    conversation: call.conversation.clone().map(Box::new),
                    surface: call.surface,
                }),
            );
            let begin_id = begin.id.clone();
            let keyed_begin = keyed.is_some().then(|| begin.clone());
            // Counted from here until its End is recorded; refused once the process
            // abandons its calls.
            let open = s.inflight.open().ok_or_else(shutting_down)?;
            let not_recorded = |e: SoulError| {
                SoulError::new(
                    ErrorCode::EvidenceUnavailable,
                    "evidence cannot be recorded; the call was not executed",
                )
                .with_note(e.audit().causes.join("; "))
            };
            // A call that can change nothing runs while its Begin is written; its
            // result waits for both (see `changes_nothing`).
            let begin_durable = if changes_nothing(&tool, &profile) {
                let submit = async { s.evidence.submit(begin).await.map_err(not_recorded) };
                Some(stage::run(stage_span!("evidence.begin"), submit).await?)
            } else {
                let record = async { s.evidence.record(begin).await.map_err(not_recorded) };
                stage::run(stage_span!("evidence.begin"), record).await?;
                None
            };
            Ok::<_, SoulError>((profile, permit, begin_id, begin_durable, open, keyed_begin))
        };
        let (profile, permit, begin_id, begin_durable, open, keyed_begin) = match before_exec.await
        {
            Ok(v) => v,
            Err(e) => {
                tool_hold.refund().await;
                if let Some(h) = terms_hold {
                    h.refund().await;
                }
                return Err(e);
            }
        };
        // The call runs from here: what it reserved is spent.
        let mut tool_hold = tool_hold;
        let spent = [tool_hold.spent(), terms_hold.and_then(|mut h| h.spent())];
        let keyed = keyed.map(|k| Keyed {
            begin: keyed_begin,
            ..k
        });
        if keyed.is_some() {
            self.fault(FaultPoint::Begun);
        }
        self.run_and_end(
            header,
            call,
            &tool,
            &profile,
            args,
            &cleared,
            (begin_id, begin_durable, open),
            spent,
            permit,
            keyed,
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_and_end(
        &self,
        header: &Header,
        call: &ToolCall,
        tool: &CompiledTool,
        profile: &Profile,
        args: Value,
        cleared: &Cleared,
        (begin_id, begin_durable, open): (EnvelopeId, Option<Durable>, OpenCall),
        spent: quota_terms::Spent,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
        keyed: Option<Keyed<'_>>,
    ) -> Result<CallResult, SoulError> {
        let s = &self.seams;
        let manifest = &tool.manifest;
        let started = Instant::now();
        let mut guard = EndGuard {
            sink: s.evidence.clone(),
            header: Some((
                header.clone(),
                call.call_id.clone(),
                begin_id.clone(),
                started,
                open,
            )),
            keyed: keyed.as_ref().map(|k| {
                (
                    s.idempotency.clone(),
                    k.key.clone(),
                    k.args_digest.to_owned(),
                )
            }),
            ending: None,
        };
        let timeout = Duration::from_millis(manifest.limits.timeout_ms);
        let mut req = Self::exec_request(call, tool, profile, args);
        // What the tool asks its caller's client passes the profile and is
        // recorded for the End.
        let (reporter, client_requests) =
            soulbase_sandbox::govern_client_requests(&req.reporter, profile);
        req.reporter = reporter;
        let execute = async {
            // A keyed call's key is marked begun first: never run if it is no
            // longer this call's, never handed to another caller once it may run.
            if let Some(Keyed {
                key,
                begin: Some(begin),
                ..
            }) = &keyed
            {
                let mark = s.idempotency.begin(key, begin);
                mark.instrument(stage_span!("idempotency.begin")).await?;
                self.fault(FaultPoint::Running);
            }
            let run = AssertUnwindSafe(s.sandbox.execute(req)).catch_unwind();
            match tokio::time::timeout(timeout, run).await {
                Err(_) => Err(SoulError::new(
                    ErrorCode::ProviderTimeout,
                    "the tool did not finish within its timeout",
                )
                .with_field("timeout_ms", manifest.limits.timeout_ms.to_string())),
                Ok(Err(panic)) => {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    Err(
                        SoulError::new(ErrorCode::ToolExecutionFailed, "the tool failed")
                            .with_note(format!("handler panicked: {what}")),
                    )
                }
                Ok(Ok(r)) => r,
            }
        };
        // Abandoned by a stopping server: the run is dropped and the End says
        // `cancelled`. A submitted Begin's answer is awaited while the tool runs
        // (a sink may write the Begin only once its answer has waited a while, see
        // `EvidenceSink::submit`) and kept for after the End.
        let mut abandoned = false;
        let mut begin_durable = begin_durable;
        let mut begin_landed: Option<Result<(), SoulError>> = None;
        // Whether the Begin's answer was listened to while the tool ran: not for a
        // tool that finished at its first poll.
        let mut begin_heard = false;
        let outcome: Result<ExecOutput, SoulError> = {
            let run = stage::run(stage_span!("execute"), execute);
            let stopping = s.inflight.abandoned();
            tokio::pin!(run, stopping);
            std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = run.as_mut().poll(cx) {
                    return Poll::Ready(r);
                }
                if stopping.as_mut().poll(cx).is_ready() {
                    abandoned = true;
                    return Poll::Ready(Err(cut_off()));
                }
                if let Some(durable) = begin_durable.as_mut() {
                    begin_heard = true;
                    if let Poll::Ready(landed) = durable.as_mut().poll(cx) {
                        begin_landed = Some(landed);
                        begin_durable = None;
                    }
                }
                Poll::Pending
            })
            .await
        };
        drop(permit);
        if keyed.is_some() {
            self.fault(FaultPoint::Executed);
        }
        let duration_us = micros(started.elapsed());

        // Output checks belong to the outcome the End records. The obligations
        // (the manifest's and the policy's) apply before the digest: the End
        // records the output as answered, never a digest of what was withheld.
        let obligations = &cleared.obligations;
        let checked = outcome.and_then(|mut out| {
            let checked = stage::sync(stage_span!("output"), || {
                let bytes = canonical_json(&out.output);
                if bytes.len() as u64 > manifest.limits.max_bytes_out {
                    return Err(SoulError::new(
                        ErrorCode::ToolExecutionFailed,
                        "the tool's output exceeds max_bytes_out",
                    )
                    .with_field("max_bytes_out", manifest.limits.max_bytes_out.to_string()));
                }
                tool.validate_output(&out.output)?;
                Ok(bytes)
            })?;
            let (bytes, warnings) = if obligations.is_empty() {
                (checked, Vec::new())
            } else {
                let warnings = stage::sync(stage_span!("obligations"), || {
                    apply_obligations(&mut out.output, obligations)
                })?;
                (canonical_json(&out.output), warnings)
            };
            Ok((out, digest_bytes(&bytes), bytes.len() as u64, warnings))
        });
        let (status, code) = match &checked {
            Err(e) if abandoned => (EndStatus::Cancelled, Some(e.code())),
            Ok(_) => (EndStatus::Ok, None),
            Err(e) if e.code() == ErrorCode::ProviderTimeout => {
                (EndStatus::Timeout, Some(e.code()))
            }
            Err(e) => (EndStatus::Error, Some(e.code())),
        };
        let usage = BudgetUsage {
            calls: 1,
            bytes_in: cleared.bytes_in,
            bytes_out: checked.as_ref().map(|c| c.2).unwrap_or(0),
            // What the executor measured (`ExecOutput::cpu_ms`; `docs/sandbox.md`,
            // "CPU time"), settled into `cpu_ms` budgets below. A failed call has
            // no output and so charges no CPU.
            cpu_ms: checked.as_ref().ok().and_then(|c| c.0.cpu_ms).unwrap_or(0),
        };
        let end = EvidenceEnd {
            call_id: call.call_id.clone(),
            begin_id: begin_id.clone(),
            status,
            error_code: code,
            output_digest: checked.as_ref().ok().map(|c| c.1.clone()),
            side_effects: checked
                .as_ref()
                .map(|c| c.0.side_effects.clone())
                .unwrap_or_default(),
            usage,
            duration_us,
            client_requests: client_requests
                .as_ref()
                .map(soulbase_sandbox::ClientRequests::take)
                .unwrap_or_default(),
        };
        let mut end = stamp(header, EvidenceEvent::End(end));
        // The result, before the End is recorded: a keyed call stores it with its
        // End in one step (the idempotency store), then records the End.
        let mut result = match checked {
            Ok((out, _, _, warnings)) => CallResult {
                warnings,
                ..CallResult::ok(call.call_id.clone(), out.output, Some(begin_id))
            },
            Err(e) => {
                tracing::info!(call_id = %call.call_id, code = %e.code(), audit = ?e.audit().causes, "call failed");
                CallResult::failed(call.call_id.clone(), &e, Some(begin_id))
            }
        };
        if let Some(k) = &keyed {
            let outcome = StoredOutcome {
                args_digest: k.args_digest.to_owned(),
                result: result.clone(),
            };
            guard.ending(&end, &outcome);
            let complete = s.idempotency.complete(k.key, outcome, Some(&end));
            match complete.instrument(stage_span!("idempotency.store")).await {
                Ok(()) => {}
                // The key lapsed while the call ran (its lease could not be renewed,
                // e.g. through a database outage) and another caller settled it as
                // interrupted: this call answers and records what the key says, so
                // neither its caller nor its evidence contradicts the key's retries.
                Err(e) if e.code() == ErrorCode::IdempotencyConflict => {
                    tracing::warn!(call_id = %call.call_id, "a keyed call's key was settled by another caller while it ran; answering the stored outcome");
                    let stored = s.idempotency.claim(k.key, k.args_digest, Duration::ZERO);
                    if let Ok(Claim::Completed(stored)) = stored.await {
                        result = CallResult {
                            call_id: call.call_id.clone(),
                            replayed: true,
                            ..stored.result
                        };
                    }
                    if let EvidenceEvent::End(e) = &mut end.payload {
                        e.status = EndStatus::Aborted;
                        e.error_code = None;
                        e.output_digest = None;
                    }
                    guard.ending_unkeyed(&end);
                }
                // The store is unreachable (a database outage) after its own
                // retries. The key's completion is where this call's End is
                // committed (with its outcome), so neither is settled yet: the End
                // goes to a completer that retries until the store is back, and the
                // caller learns the tool ran and its End is pending — never `ok`
                // for an outcome a retry of the key might contradict.
                Err(e) if e.code() == ErrorCode::EvidenceUnavailable => {
                    tracing::error!(error = ?e, call_id = %call.call_id, "a keyed call's outcome cannot be stored yet; its End is pending");
                    let open = guard.hand_over();
                    let outcome = StoredOutcome {
                        args_digest: k.args_digest.to_owned(),
                        result: result.clone(),
                    };
                    tokio::spawn(complete_later(
                        s.idempotency.clone(),
                        s.evidence.clone(),
                        k.key.clone(),
                        outcome,
                        end,
                        open,
                    ));
                    quota_terms::settle(spent, usage).await;
                    let err = SoulError::new(
                        ErrorCode::EvidenceUnavailable,
                        "the tool ran, but its outcome could not be stored yet; retry with the same idempotency key for it",
                    )
                    .with_field("executed", "true")
                    .with_field("end", "pending")
                    .with_note(e.audit().causes.join("; "));
                    return Ok(CallResult {
                        usage: Some(usage),
                        ..CallResult::failed(call.call_id.clone(), &err, result.evidence_ref)
                    });
                }
                Err(e) => {
                    tracing::error!(error = ?e, call_id = %call.call_id, "idempotency store failed");
                }
            }
            self.fault(FaultPoint::Completed);
        }
        // A submitted Begin is answered in its End's round at the latest, just
        // before the End: its answer stops waking this call (it was listened to
        // while the tool ran), so the round that answers both wakes the call once,
        // not twice — on an idle server each wake-up is a thread switch. Not for a
        // Begin nobody listened to (the tool finished at its first poll): polling
        // it here would only start its wait for a round of its own (a timer, whose
        // registration wakes the runtime's timer driver on an idle server), when
        // the End's round is about to answer it.
        if begin_heard && let Some(durable) = begin_durable.as_mut() {
            let mut unheard = std::task::Context::from_waker(std::task::Waker::noop());
            if let Poll::Ready(landed) = durable.as_mut().poll(&mut unheard) {
                begin_landed = Some(landed);
                begin_durable = None;
            }
        }
        let recorded = s
            .evidence
            .record(end)
            .instrument(stage_span!("evidence.end"))
            .await;
        guard.disarm();
        if keyed.is_some() {
            self.fault(FaultPoint::Ended);
        }
        // A Begin written while the call ran that did not land: the call changed
        // nothing and its evidence is not there, so it counts as refused (its End
        // was refused with it) and its result is withheld. (No span of its own: the
        // Begin is written before the End, so this answer is in by now.)
        let begin_landed = match (begin_landed, begin_durable) {
            (Some(landed), _) => Some(landed),
            (None, Some(durable)) => Some(durable.await),
            (None, None) => None,
        };
        if let Some(Err(e)) = begin_landed {
            quota_terms::refund(spent).await;
            return Err(SoulError::new(
                ErrorCode::EvidenceUnavailable,
                "evidence cannot be recorded; the call's result is withheld",
            )
            .with_note(e.audit().causes.join("; ")));
        }
        quota_terms::settle(spent, usage).await;
        // The tool ran but its End is not durable (a full disk): the answer never
        // runs ahead of the evidence. The caller learns that the tool ran and its
        // End is pending (the durable sink keeps it and writes it once there is
        // room), never `ok`; the result is withheld.
        if let Err(e) = recorded {
            tracing::error!(error = ?e, call_id = %call.call_id, "the End of a call that ran is not durable; its result is withheld");
            let end = e.field("end").unwrap_or("not_recorded").to_owned();
            let err = SoulError::new(
                ErrorCode::EvidenceUnavailable,
                "the tool ran, but its evidence could not be made durable yet; its result is withheld",
            )
            .with_field("executed", "true")
            .with_field("end", end)
            .with_note(e.audit().causes.join("; "));
            return Ok(CallResult {
                usage: Some(usage),
                ..CallResult::failed(call.call_id.clone(), &err, result.evidence_ref)
            });
        }
        // A result answered again from the key's store charged nothing here.
        if !result.replayed {
            result.usage = Some(usage);
        }
        Ok(result)
    }

    /// A call refused before execution: a denial event, no Begin/End.
    async fn denied(&self, header: &Header, call: &ToolCall, err: SoulError) -> CallResult {
        self.record_denial(header, &call.call_id, call.tool.as_str(), &err)
            .await;
        CallResult::failed(call.call_id.clone(), &err, None)
    }

    /// Records the denial of call `call_id` of `tool` (as the caller named it).
    async fn record_denial(&self, header: &Header, call_id: &CallId, tool: &str, err: &SoulError) {
        let denial = stamp(
            header,
            EvidenceEvent::Denied(Denial {
                call_id: call_id.clone(),
                tool: tool.to_owned(),
                code: err.code(),
            }),
        );
        let record = self.seams.evidence.record(denial);
        if let Err(e) = record.instrument(stage_span!("evidence.denial")).await {
            tracing::warn!(error = ?e, "could not record a denial");
        }
    }
}

/// Whether a call can change nothing outside the process: a tool declared without
/// side effects, of the low safety class, needing no consent and not keyed (a keyed
/// tool is promised one execution per key, which a withheld result would break),
/// run in the host (builtin) or in the WASM sandbox, with no capability granted.
/// Such a call runs while its Begin is being written instead of after, so the
/// Begin's fsync overlaps the run (and a fast tool's End usually joins the Begin's
/// round: one fsync to wait for in `sync` mode, not two); its result still returns
/// only once Begin and End are durable, and if the Begin does not land, the result
/// is withheld and the call is refused. A crash in between leaves at most a Begin,
/// closed as aborted on recovery, of a call that changed nothing and returned
/// nothing. Every other call's Begin is durable before it runs.
fn changes_nothing(tool: &CompiledTool, profile: &Profile) -> bool {
    let m = &tool.manifest;
    m.side_effect == SideEffect::None
        && m.safety_class == SafetyClass::Low
        && !m.consent.required
        && m.idempotency != Idempotency::Keyed
        && matches!(
            m.provider.kind(),
            ProviderKind::Builtin | ProviderKind::Wasm
        )
        && profile.capabilities().is_empty()
}

/// Longest idempotency key accepted, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

/// An idempotency key is recorded in evidence and stored as a database key: it must
/// be at most [`MAX_IDEMPOTENCY_KEY_BYTES`] of printable text (no control
/// characters — a NUL would be refused by Postgres and wedge the evidence drain).
fn check_idempotency_key(key: &str) -> Result<(), SoulError> {
    let bad = |message: &'static str| {
        Err(SoulError::new(ErrorCode::SchemaValidationFailed, message)
            .with_field("field", "idempotency_key"))
    };
    if key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
        return bad("the idempotency_key is longer than 255 bytes");
    }
    if key.chars().any(char::is_control) {
        return bad("the idempotency_key contains control characters");
    }
    Ok(())
}
