//! Runtime cross-skill enforcement (seed 000 §5.2 and §9) by the skills' terms
//! inside the governed pipeline: imports, subscriptions, per-tool rate limits,
//! audit, and `run_skill`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::*;
use serde_json::json;
use soulbase_observe::EvidenceEvent;
use soulbase_skills::{MemoryAudit, StaticSubscriptions};
use soulbase_tools::pipeline::{CallResult, CallStatus, ToolCall};

struct G {
    e: Env,
    gateway: Calls,
    subs: Arc<StaticSubscriptions>,
    audit: MemoryAudit,
}

fn gateway() -> G {
    let subs = Arc::new(StaticSubscriptions::new());
    let audit = MemoryAudit::new();
    let e = env_with(&repo_skills(), |t| {
        t.with_subscriptions(subs.clone())
            .with_audit(Arc::new(audit.clone()))
    });
    let gateway = Calls::of(&e);
    G {
        e,
        gateway,
        subs,
        audit,
    }
}

fn call_from(skill: &str, tool: &str, args: serde_json::Value) -> ToolCall {
    let mut c = ToolCall::new(subject(), id(tool), args);
    c.calling_skill = Some(skill.to_owned());
    c
}

/// Invokes `c` as its calling skill (the server-side context in these tests).
async fn inv(gw: &Calls, c: ToolCall) -> CallResult {
    let caller = c.calling_skill.clone();
    gw.invoke(caller.as_deref(), c).await
}

fn chart_args() -> serde_json::Value {
    json!({"birth_date": "1990-07-04", "birth_time": "06:30", "birth_place": "Beijing"})
}

#[tokio::test]
async fn jungastro_needs_a_zodiac_subscription_for_calculate_zodiac() {
    let g = gateway();
    let r = inv(
        &g.gateway,
        call_from("jungastro", "skills.zodiac.calculate_zodiac", chart_args()),
    )
    .await;
    assert_eq!(r.status, CallStatus::Denied);
    assert_eq!(
        r.error_code.map(|c| c.as_str()),
        Some("SUBSCRIPTION.REQUIRED")
    );
    let err = r.error.clone().unwrap();
    assert_eq!(
        err.fields.get("skill_id").map(String::as_str),
        Some("zodiac")
    );
    assert_eq!(
        err.fields.get("action").map(String::as_str),
        Some("show_subscribe_card")
    );
    assert!(r.evidence_ref.is_none(), "refused before execution");

    g.subs.grant("acme", "*", "zodiac");
    let r = inv(
        &g.gateway,
        call_from("jungastro", "skills.zodiac.calculate_zodiac", chart_args()),
    )
    .await;
    assert!(r.is_ok(), "{r:?}");
    let out = r.output.unwrap();
    assert_eq!(out["sun_sign"], "cancer");
    // The consumer then interprets the chart with its own tool.
    let r = inv(&g.gateway, call_from("jungastro", "skills.jungastro.interpret_chart", json!({
            "sun_sign": out["sun_sign"], "moon_sign": out["moon_sign"], "rising_sign": out["rising_sign"],
        })))
        .await;
    assert!(r.is_ok(), "{r:?}");
    assert!(
        r.output.unwrap()["ego"]
            .as_str()
            .unwrap()
            .contains("cancer")
    );
}

#[tokio::test]
async fn free_tools_need_no_subscription() {
    let g = gateway();
    let r = inv(
        &g.gateway,
        call_from("jungastro", "skills.zodiac.get_chart_snapshot", json!({})),
    )
    .await;
    assert!(r.is_ok(), "{r:?}");
}

#[tokio::test]
async fn calling_a_tool_that_was_not_imported_is_refused() {
    let g = gateway();
    g.subs.grant("acme", "*", "jungastro");
    // zodiac imports nothing from jungastro.
    let r = inv(
        &g.gateway,
        call_from(
            "zodiac",
            "skills.jungastro.interpret_chart",
            json!({
                "sun_sign": "leo", "moon_sign": "leo", "rising_sign": "leo"
            }),
        ),
    )
    .await;
    assert_eq!(r.error_code.map(|c| c.as_str()), Some("SKILL.NOT_IMPORTED"));
    assert_eq!(r.status, CallStatus::Denied);
    // An unknown calling skill imports nothing either.
    let r = inv(
        &g.gateway,
        call_from("ghost", "skills.zodiac.get_chart_snapshot", json!({})),
    )
    .await;
    assert_eq!(r.error_code.map(|c| c.as_str()), Some("SKILL.NOT_IMPORTED"));
    // A disabled caller cannot call across skills.
    g.e.catalog.set_enabled("jungastro", false).unwrap();
    let r = inv(
        &g.gateway,
        call_from("jungastro", "skills.zodiac.get_chart_snapshot", json!({})),
    )
    .await;
    assert_eq!(r.error_code.map(|c| c.as_str()), Some("SKILL.NOT_IMPORTED"));
}

#[tokio::test]
async fn every_cross_skill_call_is_audited_and_evidenced() {
    let g = gateway();
    let denied = inv(
        &g.gateway,
        call_from("jungastro", "skills.zodiac.calculate_zodiac", chart_args()),
    )
    .await;
    let ok = inv(
        &g.gateway,
        call_from("jungastro", "skills.zodiac.get_chart_snapshot", json!({})),
    )
    .await;
    let not_imported = inv(
        &g.gateway,
        call_from("zodiac", "skills.jungastro.interpret_chart", json!({})),
    )
    .await;
    // Own tools and calls without a calling skill are not cross-skill calls.
    inv(
        &g.gateway,
        call_from("zodiac", "skills.zodiac.get_chart_snapshot", json!({})),
    )
    .await;
    g.gateway
        .invoke(
            None,
            ToolCall::new(subject(), id("skills.zodiac.get_chart_snapshot"), json!({})),
        )
        .await;

    let records = g.audit.records();
    assert_eq!(records.len(), 3, "{records:?}");
    assert_eq!(records[0].call_id, denied.call_id);
    assert_eq!(
        records[0].error_code.map(|c| c.as_str()),
        Some("SUBSCRIPTION.REQUIRED")
    );
    assert_eq!(records[1].call_id, ok.call_id);
    assert_eq!(records[1].status, CallStatus::Ok);
    assert_eq!(
        (records[1].caller.as_str(), records[1].provider.as_str()),
        ("jungastro", "zodiac")
    );
    assert_eq!(records[1].evidence_ref, ok.evidence_ref);
    assert_eq!(records[2].call_id, not_imported.call_id);

    // Evidence: the executed one has a Begin naming the calling skill, the refused
    // ones have a Denied record.
    let ev = g.e.sink.records();
    let begin = ev
        .iter()
        .find_map(|r| match &r.payload {
            EvidenceEvent::Begin(b) if b.call_id == ok.call_id => Some(b.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(begin.calling_skill.as_deref(), Some("jungastro"));
    for c in [&denied.call_id, &not_imported.call_id] {
        assert!(
            ev.iter()
                .any(|r| matches!(&r.payload, EvidenceEvent::Denied(d) if &d.call_id == c))
        );
    }
}

#[tokio::test]
async fn per_tool_rate_limits_apply_to_cross_skill_calls() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "p/SKILL.md",
        "---\nname: p\ndescription: provider\nprovider: {type: builtin, handler: echo}\nexports:\n  api_version: \"1.0\"\n  tools:\n    - name: t\n      description: x\n      input_schema: {type: object}\n      output_schema: {type: object}\n  access:\n    rate_limit:\n      t: 2/min\n---\n",
    );
    write(
        dir.path(),
        "c/SKILL.md",
        "---\nname: c\ndescription: consumer\nimports:\n  - from: p\n    tools: [t]\n---\n",
    );
    let audit = MemoryAudit::new();
    let e = env_with(dir.path(), |t| t.with_audit(Arc::new(audit.clone())));
    let gw = Calls::of(&e);
    for _ in 0..2 {
        let r = inv(&gw, call_from("c", "skills.p.t", json!({}))).await;
        assert!(r.is_ok(), "{r:?}");
    }
    let r = inv(&gw, call_from("c", "skills.p.t", json!({}))).await;
    assert_eq!(r.error_code.map(|c| c.as_str()), Some("QUOTA.RATE_LIMITED"));
    assert!(r.error.unwrap().retry_after_ms.is_some());
    assert_eq!(audit.records().len(), 3);
}

#[tokio::test]
async fn run_skill_runs_a_skills_tool() {
    let g = gateway();
    // The model acting directly is bound by zodiac's access terms too.
    let r = g
        .gateway
        .run_skill(
            subject(),
            None,
            "zodiac",
            Some("calculate_zodiac"),
            chart_args(),
        )
        .await;
    assert_eq!(
        r.error_code.map(|c| c.as_str()),
        Some("SUBSCRIPTION.REQUIRED"),
        "{r:?}"
    );
    g.subs.grant("acme", "*", "zodiac");
    let r = g
        .gateway
        .run_skill(
            subject(),
            None,
            "zodiac",
            Some("calculate_zodiac"),
            chart_args(),
        )
        .await;
    assert!(r.is_ok(), "{r:?}");
    // Several tools and none named: refused with the choices.
    let r = g
        .gateway
        .run_skill(subject(), None, "zodiac", None, json!({}))
        .await;
    assert_eq!(r.error_code.map(|c| c.as_str()), Some("TOOL.NOT_FOUND"));
    assert!(r.error.unwrap().message.contains("calculate_zodiac"));
    // A single-tool skill runs without naming it.
    let r = g
        .gateway
        .run_skill(
            subject(),
            None,
            "jungastro",
            None,
            json!({"sun_sign": "leo", "moon_sign": "leo", "rising_sign": "leo"}),
        )
        .await;
    assert!(r.is_ok(), "{r:?}");
    let r = g
        .gateway
        .run_skill(subject(), None, "ghost", None, json!({}))
        .await;
    assert_eq!(r.error_code.map(|c| c.as_str()), Some("TOOL.NOT_FOUND"));
}

#[tokio::test]
async fn run_skill_inside_a_skill_runs_only_its_own_tools_and_imports() {
    let g = gateway();
    // Working in zodiac, the model cannot run jungastro's tool: not imported.
    let r = g
        .gateway
        .run_skill(
            subject(),
            Some("zodiac"),
            "jungastro",
            None,
            json!({"sun_sign": "leo", "moon_sign": "leo", "rising_sign": "leo"}),
        )
        .await;
    assert_eq!(r.error_code.map(|c| c.as_str()), Some("SKILL.NOT_IMPORTED"));
    // Working in jungastro, calculate_zodiac is imported but needs a subscription.
    let r = g
        .gateway
        .run_skill(
            subject(),
            Some("jungastro"),
            "zodiac",
            Some("calculate_zodiac"),
            chart_args(),
        )
        .await;
    assert_eq!(
        r.error_code.map(|c| c.as_str()),
        Some("SUBSCRIPTION.REQUIRED")
    );
    // The provider itself runs its own tool without a subscription.
    let r = g
        .gateway
        .run_skill(
            subject(),
            Some("zodiac"),
            "zodiac",
            Some("calculate_zodiac"),
            chart_args(),
        )
        .await;
    assert!(r.is_ok(), "{r:?}");
}

#[tokio::test]
async fn a_direct_call_without_a_subscription_is_refused() {
    let g = gateway();
    let r = g
        .gateway
        .invoke(
            None,
            ToolCall::new(
                subject(),
                id("skills.zodiac.calculate_zodiac"),
                chart_args(),
            ),
        )
        .await;
    assert_eq!(r.status, CallStatus::Denied);
    assert_eq!(
        r.error_code.map(|c| c.as_str()),
        Some("SUBSCRIPTION.REQUIRED")
    );
    assert!(r.evidence_ref.is_none(), "refused before execution");
    // Refused here: a Denied evidence event.
    assert!(
        g.e.sink
            .records()
            .iter()
            .any(|rec| matches!(&rec.payload, EvidenceEvent::Denied(d) if d.call_id == r.call_id))
    );
    // Free tools stay free for direct calls.
    let r = g
        .gateway
        .invoke(
            None,
            ToolCall::new(subject(), id("skills.zodiac.get_chart_snapshot"), json!({})),
        )
        .await;
    assert!(r.is_ok(), "{r:?}");
}

#[tokio::test]
async fn the_calling_skill_is_checked_and_audited_as_set() {
    let g = gateway();
    // A call made for jungastro (the binding its surface established): its
    // imports hold, the provider's terms bind it, and the audit names it.
    let c = ToolCall::new(
        subject(),
        id("skills.zodiac.calculate_zodiac"),
        chart_args(),
    );
    let r = g.gateway.invoke(Some("jungastro"), c).await;
    assert_eq!(
        r.error_code.map(|c| c.as_str()),
        Some("SUBSCRIPTION.REQUIRED")
    );
    let rec = g.audit.records();
    assert_eq!(rec.last().map(|r| r.caller.as_str()), Some("jungastro"));
    // The same refusal in preflight: the terms are one of its checks.
    let mut c = ToolCall::new(
        subject(),
        id("skills.zodiac.calculate_zodiac"),
        chart_args(),
    );
    c.calling_skill = Some("jungastro".into());
    let err = g.e.invoker.preflight(&c).await.unwrap_err();
    assert_eq!(err.code().as_str(), "SUBSCRIPTION.REQUIRED");
}

#[tokio::test]
async fn a_skill_tool_without_an_owner_is_not_found() {
    let g = gateway();
    let r = g
        .gateway
        .invoke(
            None,
            ToolCall::new(subject(), id("skills.ghost.anything"), json!({})),
        )
        .await;
    assert_eq!(r.error_code.map(|c| c.as_str()), Some("TOOL.NOT_FOUND"));
}

#[tokio::test]
async fn subscriptions_come_from_config() {
    let subs = StaticSubscriptions::from_config(&[soulbase_config::SkillSubscription {
        tenant: "acme".into(),
        actor: "alice".into(),
        skill: "zodiac".into(),
    }]);
    use soulbase_skills::SubscriptionStore;
    let alice = subject();
    assert!(subs.is_subscribed(&alice.tenant, &alice.actor, "zodiac"));
    let bob = soulbase_types::ActorId::new("bob").unwrap();
    assert!(!subs.is_subscribed(&alice.tenant, &bob, "zodiac"));
    let cfg: soulbase_config::SkillsConfig =
        serde_saphyr::from_str("subscriptions:\n  - {tenant: acme, skill: zodiac}\n").unwrap();
    subs.replace(&cfg.subscriptions);
    assert!(
        subs.is_subscribed(&alice.tenant, &bob, "zodiac"),
        "actor defaults to *"
    );
}

#[tokio::test]
async fn the_chart_snapshot_does_not_leak_across_tenants() {
    let g = gateway();
    g.subs.grant("acme", "*", "zodiac");
    let r = inv(
        &g.gateway,
        call_from("jungastro", "skills.zodiac.calculate_zodiac", chart_args()),
    )
    .await;
    assert!(r.is_ok(), "{r:?}");
    // Another tenant asks for a snapshot without birth data: nothing of acme's.
    let other = soulbase_types::Subject::new(
        soulbase_types::TenantId::new("globex").unwrap(),
        soulbase_types::ActorId::new("bob").unwrap(),
    );
    let mut c = ToolCall::new(other, id("skills.zodiac.get_chart_snapshot"), json!({}));
    c.calling_skill = Some("jungastro".into());
    let r = inv(&g.gateway, c).await;
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(
        r.output.unwrap(),
        json!({}),
        "no state carried between callers"
    );
    // The snapshot comes from the arguments alone.
    let r = inv(
        &g.gateway,
        call_from(
            "jungastro",
            "skills.zodiac.get_chart_snapshot",
            json!({"birth_date": "1990-07-04"}),
        ),
    )
    .await;
    assert_eq!(r.output.unwrap()["sun_sign"], "cancer");
}

/// A quota gate that counts reservations, over a `LocalQuota`.
struct CountingGate {
    inner: Arc<soulbase_qos::LocalQuota>,
    reserves: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl soulbase_qos::QuotaGate for CountingGate {
    async fn check(
        &self,
        req: soulbase_qos::QuotaRequest<'_>,
    ) -> Result<soulbase_qos::BudgetSnapshot, soulbase_errors::SoulError> {
        self.inner.check(req).await
    }
    async fn reserve(
        &self,
        req: soulbase_qos::QuotaRequest<'_>,
    ) -> Result<soulbase_qos::Reservation, soulbase_errors::SoulError> {
        self.reserves
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.reserve(req).await
    }
    async fn settle(
        &self,
        r: soulbase_qos::Reservation,
        usage: soulbase_observe::BudgetUsage,
    ) -> Result<(), soulbase_errors::SoulError> {
        self.inner.settle(r, usage).await
    }
    async fn refund(&self, r: soulbase_qos::Reservation) -> Result<(), soulbase_errors::SoulError> {
        self.inner.refund(r).await
    }
}

#[tokio::test]
async fn rate_limits_go_through_the_given_quota_gate() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "p/SKILL.md",
        "---\nname: p\ndescription: provider\nprovider: {type: builtin, handler: echo}\nexports:\n  api_version: \"1.0\"\n  tools:\n    - name: t\n      description: x\n      input_schema: {type: object}\n      output_schema: {type: object}\n  access:\n    rate_limit:\n      t: 2/min\n---\n",
    );
    let local = Arc::new(soulbase_qos::LocalQuota::new(&[]));
    let gate = Arc::new(CountingGate {
        inner: local.clone(),
        reserves: Default::default(),
    });
    let synced = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sync: soulbase_skills::terms::RateLimitSync = {
        let synced = synced.clone();
        Arc::new(move |limits: &[soulbase_config::QuotaLimit]| {
            local.update(limits);
            *synced.lock().unwrap() = limits.to_vec();
        })
    };
    let e = env_with(dir.path(), |t| t.with_quota(gate.clone(), Some(sync)));
    let gw = Calls::of(&e);
    // Direct calls (no calling skill) are rate limited too.
    for _ in 0..2 {
        let r = gw
            .invoke(None, ToolCall::new(subject(), id("skills.p.t"), json!({})))
            .await;
        assert!(r.is_ok(), "{r:?}");
    }
    let r = gw
        .invoke(None, ToolCall::new(subject(), id("skills.p.t"), json!({})))
        .await;
    assert_eq!(r.error_code.map(|c| c.as_str()), Some("QUOTA.RATE_LIMITED"));
    assert_eq!(gate.reserves.load(std::sync::atomic::Ordering::SeqCst), 3);
    let limits = synced.lock().unwrap().clone();
    assert_eq!(limits.len(), 1);
    assert_eq!(limits[0].tool, "skills.p.t");
    assert_eq!(soulbase_skills::rate_limits(&e.catalog.current()), limits);
}

#[tokio::test]
async fn a_disabled_skills_tools_are_refused_by_its_terms() {
    let g = gateway();
    g.e.catalog.set_enabled("zodiac", false).unwrap();
    let r = g
        .gateway
        .invoke(
            Some("zodiac"),
            ToolCall::new(subject(), id("skills.zodiac.get_chart_snapshot"), json!({})),
        )
        .await;
    assert_eq!(r.error_code.map(|c| c.as_str()), Some("TOOL.DISABLED"));
}
