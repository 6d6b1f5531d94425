//! The governed invocation pipeline, end to end with the in-process seams.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use soulbase_auth::{
    ConsentGrant, ConsentRequestStatus, ConsentRequests, HmacConsent, MemoryConsentRequests,
    StaticPolicy,
};
use soulbase_config::{PolicyConfig, PolicyEffect, PolicyRule, QuotaLimit};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::{
    Durable, EndStatus, EvidenceEvent, EvidenceRecord, EvidenceSink, MemorySink,
};
use soulbase_qos::LocalQuota;
use soulbase_sandbox::{BuiltinExecutor, DeclaredProfiles, LocalSandbox, handler_fn};
use soulbase_tools::discovery::NameMap;
use soulbase_tools::pipeline::{
    CallStatus, Claim, IdempotencyKey, IdempotencyStore, Invoker, InvokerBuilder,
    MemoryIdempotency, StoredOutcome, ToolCall, ToolCallRouter,
};
use soulbase_tools::registry::ToolOwner;
use soulbase_tools::{Registry, ToolManifest};
use soulbase_types::{ActorId, CallId, Rate, Subject, TenantId, ToolId, UnixMillis};

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

fn manifest(id: &str, extra: Value) -> ToolManifest {
    let mut m = json!({
        "id": id,
        "version": "1.0.0",
        "description": format!("test tool {id}"),
        "input_schema": {
            "type": "object",
            "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
            "required": ["text"]
        },
        "output_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "side_effect": "none"
    });
    if let (Value::Object(base), Value::Object(extra)) = (&mut m, extra) {
        base.extend(extra);
    }
    ToolManifest::from_json_str(&m.to_string()).unwrap()
}

struct Harness {
    invoker: Invoker,
    registry: Registry,
    sink: MemorySink,
    consent: Arc<HmacConsent>,
    requests: Arc<MemoryConsentRequests>,
    executions: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    idempotency: Arc<MemoryIdempotency>,
}

fn acme() -> Subject {
    Subject::new(
        TenantId::new("acme").unwrap(),
        ActorId::new("alice").unwrap(),
    )
}

fn id(s: &str) -> ToolId {
    ToolId::new(s).unwrap()
}

fn harness() -> Harness {
    harness_with(None)
}

/// The harness, its evidence going through `gate` (which keeps it in the same
/// memory sink) when given.
fn harness_with(gate: Option<Arc<GatedSink>>) -> Harness {
    harness_full(gate, |m| m)
}

/// The harness, its idempotency store wrapped by `wrap` (around the memory store
/// the harness keeps).
fn harness_full(
    gate: Option<Arc<GatedSink>>,
    wrap: impl FnOnce(Arc<MemoryIdempotency>) -> Arc<dyn IdempotencyStore>,
) -> Harness {
    let registry = Registry::new();
    let global = ToolOwner::Global;
    let tools = [
        manifest("demo.echo.say", json!({})),
        manifest("demo.calc.add", json!({"idempotency": "keyed"})),
        manifest(
            "demo.danger.delete",
            json!({
                "side_effect": "write",
                "safety_class": "high",
                "consent": {"required": true},
                "capabilities": [{"kind": "fs", "paths": ["/data"], "access": ["write"]}]
            }),
        ),
        manifest("demo.fail.error", json!({})),
        manifest("demo.fail.panic", json!({})),
        manifest("demo.slow.sleep", json!({"limits": {"timeout_ms": 50}})),
        manifest("demo.slow.hold", json!({"limits": {"timeout_ms": 60000}})),
        manifest(
            "demo.hold.keyed",
            json!({"idempotency": "keyed", "limits": {"timeout_ms": 60000}}),
        ),
        manifest(
            "demo.hold.serial",
            json!({"idempotency": "keyed", "concurrency": "serial", "limits": {"timeout_ms": 60000}}),
        ),
        manifest("demo.bad.output", json!({})),
        manifest("demo.quota.tick", json!({})),
        manifest("demo.serial.one", json!({"concurrency": "serial"})),
        manifest("demo.big.output", json!({"limits": {"max_bytes_out": 64}})),
        manifest(
            "demo.secret.get",
            json!({
                "output_schema": {"type": "object"},
                "obligations": [{"kind": "redact", "pointer": "/ssn"}]
            }),
        ),
        manifest("demo.denied.tool", json!({})),
        manifest("demo.state.paused", json!({})),
        manifest("demo.state.deprecated", json!({})),
        manifest("demo.state.registered", json!({})),
        manifest(
            "demo.tmp.scratch",
            json!({"capabilities": [{"kind": "tmp", "max_bytes": 1024}]}),
        ),
        manifest(
            "demo.ask.first",
            json!({"safety_class": "high", "consent": {"required": true}}),
        ),
        manifest(
            "demo.net.fetch",
            json!({
                "side_effect": "network",
                "capabilities": [{"kind": "net", "hosts": ["api.example.com"]}]
            }),
        ),
    ];
    for m in tools {
        let tid = m.id.clone();
        registry.register(m).unwrap();
        if tid.as_str() != "demo.state.registered" {
            registry.enable(&global, &tid).unwrap();
        }
    }
    registry.pause(&global, &id("demo.state.paused")).unwrap();
    registry
        .deprecate(&global, &id("demo.state.deprecated"))
        .unwrap();
    let other = TenantId::new("other").unwrap();
    registry
        .register_for(&other, manifest("other.priv.tool", json!({})))
        .unwrap();
    registry
        .enable(&ToolOwner::tenant(other.clone()), &id("other.priv.tool"))
        .unwrap();

    let executions = Arc::new(AtomicUsize::new(0));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let max_in_flight = Arc::new(AtomicUsize::new(0));
    let builtin = BuiltinExecutor::new();
    builtin.register(
        "demo.echo.say",
        handler_fn(|args| async move { Ok(json!({"text": args["text"]})) }),
    );
    let ex = executions.clone();
    builtin.register(
        "demo.calc.add",
        handler_fn(move |args| {
            let ex = ex.clone();
            async move {
                ex.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                Ok(json!({"text": format!("{}+{}", args["text"].as_str().unwrap_or(""), args["n"])}))
            }
        }),
    );
    let ex = executions.clone();
    builtin.register(
        "demo.danger.delete",
        handler_fn(move |_| {
            let ex = ex.clone();
            async move {
                ex.fetch_add(1, Ordering::SeqCst);
                Ok(json!({"text": "deleted"}))
            }
        }),
    );
    builtin.register(
        "demo.fail.error",
        handler_fn(|_| async {
            Err(SoulError::new(
                ErrorCode::ToolExecutionFailed,
                "disk on fire",
            ))
        }),
    );
    builtin.register(
        "demo.fail.panic",
        handler_fn(|args| async move {
            if args["text"] == "boom" {
                panic!("handler exploded");
            }
            Ok(json!({}))
        }),
    );
    builtin.register(
        "demo.slow.sleep",
        handler_fn(|_| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(json!({}))
        }),
    );
    builtin.register(
        "demo.slow.hold",
        handler_fn(|_| async {
            std::future::pending::<()>().await;
            Ok(json!({}))
        }),
    );
    for held in ["demo.hold.keyed", "demo.hold.serial"] {
        builtin.register(
            held,
            handler_fn(|_| async {
                std::future::pending::<()>().await;
                Ok(json!({}))
            }),
        );
    }
    builtin.register(
        "demo.bad.output",
        handler_fn(|_| async { Ok(json!({"text": 5})) }),
    );
    builtin.register(
        "demo.quota.tick",
        handler_fn(|_| async { Ok(json!({"text": "tick"})) }),
    );
    let (inf, max) = (in_flight.clone(), max_in_flight.clone());
    builtin.register(
        "demo.serial.one",
        handler_fn(move |_| {
            let (inf, max) = (inf.clone(), max.clone());
            async move {
                let now = inf.fetch_add(1, Ordering::SeqCst) + 1;
                max.fetch_max(now, Ordering::SeqCst);
                for _ in 0..20 {
                    tokio::task::yield_now().await;
                }
                inf.fetch_sub(1, Ordering::SeqCst);
                Ok(json!({"text": "done"}))
            }
        }),
    );
    builtin.register(
        "demo.big.output",
        handler_fn(|_| async { Ok(json!({"text": "x".repeat(1000)})) }),
    );
    builtin.register(
        "demo.secret.get",
        handler_fn(|_| async { Ok(json!({"name": "Ann", "ssn": "123-45-6789"})) }),
    );
    for t in [
        "demo.denied.tool",
        "demo.state.paused",
        "demo.state.deprecated",
        "demo.state.registered",
        "demo.net.fetch",
        "demo.tmp.scratch",
        "demo.ask.first",
        "other.priv.tool",
    ] {
        builtin.register(t, handler_fn(|_| async { Ok(json!({})) }));
    }

    let policy = PolicyConfig {
        rules: vec![
            PolicyRule {
                effect: PolicyEffect::Allow,
                tenant: "*".into(),
                actors: vec!["*".into()],
                tools: vec!["*".into()],
                actions: vec!["invoke".into()],
                require_scopes: false,
                obligations: Vec::new(),
            },
            PolicyRule {
                effect: PolicyEffect::Deny,
                tenant: "*".into(),
                actors: vec!["*".into()],
                tools: vec!["demo.denied.tool".into()],
                actions: vec!["invoke".into()],
                require_scopes: false,
                obligations: Vec::new(),
            },
        ],
    };
    let quota = LocalQuota::new(&[QuotaLimit {
        tenant: "*".into(),
        tool: "demo.quota.tick".into(),
        rate: Rate::parse("2/min").unwrap(),
    }]);
    let sink = gate
        .as_ref()
        .map_or_else(MemorySink::new, |g| g.memory.clone());
    let evidence: Arc<dyn EvidenceSink> = match gate {
        Some(g) => g,
        None => Arc::new(sink.clone()),
    };
    let consent = Arc::new(HmacConsent::new(KEY.to_vec()));
    let idempotency = Arc::new(MemoryIdempotency::new());
    let requests = Arc::new(MemoryConsentRequests::default());
    let invoker = InvokerBuilder::new(
        Arc::new(registry.clone()),
        Arc::new(StaticPolicy::new(&policy)),
        Arc::new(quota),
        consent.clone(),
        Arc::new(DeclaredProfiles::new()),
        Arc::new(LocalSandbox::new(builtin)),
        evidence,
        wrap(idempotency.clone()),
    )
    .config_hash("cfg-1")
    .consent_requests(requests.clone())
    .build();
    Harness {
        invoker,
        registry,
        sink,
        consent,
        requests,
        idempotency,
        executions,
        max_in_flight,
    }
}

impl Harness {
    fn call(&self, tool: &str, args: Value) -> ToolCall {
        ToolCall::new(acme(), id(tool), args)
    }

    /// (begins, ends, denials) recorded for a call.
    fn evidence(&self, call_id: &CallId) -> (Vec<EvidenceEvent>, Vec<EvidenceEvent>, usize) {
        let mut begins = Vec::new();
        let mut ends = Vec::new();
        let mut denials = 0;
        for r in self.sink.records() {
            match &r.payload {
                EvidenceEvent::Begin(b) if &b.call_id == call_id => begins.push(r.payload.clone()),
                EvidenceEvent::End(e) if &e.call_id == call_id => ends.push(r.payload.clone()),
                EvidenceEvent::Denied(d) if &d.call_id == call_id => denials += 1,
                _ => {}
            }
        }
        (begins, ends, denials)
    }

    fn end_status(&self, call_id: &CallId) -> EndStatus {
        let (begins, ends, denials) = self.evidence(call_id);
        assert_eq!(
            (begins.len(), ends.len(), denials),
            (1, 1, 0),
            "exactly one Begin and one End"
        );
        match &ends[0] {
            EvidenceEvent::End(e) => e.status,
            _ => unreachable!(),
        }
    }

    fn assert_denied_only(&self, call_id: &CallId) {
        let (begins, ends, denials) = self.evidence(call_id);
        assert_eq!(
            (begins.len(), ends.len(), denials),
            (0, 0, 1),
            "refused calls leave only a denial"
        );
    }
}

#[tokio::test]
async fn ok_call_returns_output_with_begin_and_end() {
    let h = harness();
    let call = h.call("demo.echo.say", json!({"text": "hi"}));
    let cid = call.call_id.clone();
    let r = h.invoker.invoke(call).await;
    assert_eq!(r.status, CallStatus::Ok, "{r:?}");
    assert_eq!(r.output, Some(json!({"text": "hi"})));
    assert_eq!(h.end_status(&cid), EndStatus::Ok);
    let (begins, _, _) = h.evidence(&cid);
    let EvidenceEvent::Begin(b) = &begins[0] else {
        unreachable!()
    };
    assert_eq!(Some(&b.call_id), Some(&cid));
    assert_eq!(b.config_hash, "cfg-1");
    assert!(b.args_digest.starts_with("sha256:"));
    assert!(r.evidence_ref.is_some());
    let raw = serde_json::to_string(&h.sink.records()).unwrap();
    assert!(
        !raw.contains("\"hi\""),
        "evidence never holds raw arguments or outputs"
    );
}

/// Table-driven: every refusal path maps to its stable code, answers `denied`
/// whatever the reason (the tool did not run) and leaves only a denial.
#[tokio::test]
async fn every_refusal_maps_to_its_code_without_begin_or_end() {
    let h = harness();
    let other = Subject::new(
        TenantId::new("acme").unwrap(),
        ActorId::new("alice").unwrap(),
    );
    let cases: Vec<(&str, ToolCall, ErrorCode, CallStatus)> = vec![
        (
            "unknown tool",
            h.call("demo.nope.none", json!({"text": "x"})),
            ErrorCode::ToolNotFound,
            CallStatus::Denied,
        ),
        (
            "another tenant's tool",
            ToolCall::new(other, id("other.priv.tool"), json!({"text": "x"})),
            ErrorCode::ToolNotFound,
            CallStatus::Denied,
        ),
        (
            "paused",
            h.call("demo.state.paused", json!({"text": "x"})),
            ErrorCode::ToolDisabled,
            CallStatus::Denied,
        ),
        (
            "deprecated",
            h.call("demo.state.deprecated", json!({"text": "x"})),
            ErrorCode::ToolDisabled,
            CallStatus::Denied,
        ),
        (
            "never enabled",
            h.call("demo.state.registered", json!({"text": "x"})),
            ErrorCode::ToolDisabled,
            CallStatus::Denied,
        ),
        (
            "bad arguments",
            h.call("demo.echo.say", json!({"text": 7})),
            ErrorCode::SchemaValidationFailed,
            CallStatus::Denied,
        ),
        (
            "policy deny",
            h.call("demo.denied.tool", json!({"text": "x"})),
            ErrorCode::PolicyDenyTool,
            CallStatus::Denied,
        ),
        (
            "missing consent",
            h.call("demo.danger.delete", json!({"text": "x"})),
            ErrorCode::ConsentRequired,
            CallStatus::Denied,
        ),
        (
            "keyed without key",
            h.call("demo.calc.add", json!({"text": "x"})),
            ErrorCode::SchemaValidationFailed,
            CallStatus::Denied,
        ),
    ];
    for (name, call, code, status) in cases {
        let cid = call.call_id.clone();
        let r = h.invoker.invoke(call).await;
        assert_eq!(r.error_code, Some(code), "{name}: {r:?}");
        assert_eq!(r.status, status, "{name}");
        assert!(r.evidence_ref.is_none(), "{name}");
        h.assert_denied_only(&cid);
    }
    assert_eq!(h.executions.load(Ordering::SeqCst), 0, "nothing executed");
}

#[tokio::test]
async fn bad_arguments_name_the_json_pointer() {
    let h = harness();
    let r = h
        .invoker
        .invoke(h.call("demo.echo.say", json!({"text": "x", "n": "seven"})))
        .await;
    let e = r.error.unwrap();
    assert_eq!(e.code, ErrorCode::SchemaValidationFailed);
    assert_eq!(e.fields.get("pointer").map(String::as_str), Some("/n"));
    let r = h
        .invoker
        .invoke(h.call("demo.calc.add", json!({"text": "x"})))
        .await;
    assert_eq!(
        r.error.unwrap().fields.get("field").map(String::as_str),
        Some("idempotency_key")
    );
}

/// `{"text": "x", "d": [[…]]}` nested `levels` deep in all (the object is 1).
fn nested(levels: u32) -> Value {
    let mut inner = json!([]);
    for _ in 2..levels {
        inner = json!([inner]);
    }
    json!({"text": "x", "d": inner})
}

#[tokio::test]
async fn arguments_deeper_than_max_depth_are_refused_before_execution() {
    let h = harness();
    // limits.max_depth defaults to 32.
    let ok = h.invoker.invoke(h.call("demo.echo.say", nested(32))).await;
    assert!(ok.is_ok(), "{ok:?}");
    let r = h.invoker.invoke(h.call("demo.echo.say", nested(33))).await;
    let e = r.error.unwrap();
    assert_eq!(e.code, ErrorCode::SchemaValidationFailed);
    assert_eq!(e.fields.get("field").map(String::as_str), Some("args"));
    assert_eq!(e.fields.get("max_depth").map(String::as_str), Some("32"));
    assert!(
        r.evidence_ref.is_none(),
        "refused before execution: no Begin"
    );
}

#[tokio::test]
async fn malformed_idempotency_keys_are_refused_before_execution() {
    let h = harness();
    // A NUL would be refused by Postgres when the Begin is drained, and a huge key
    // would bloat every record and index carrying it.
    for key in ["k\u{0}1".to_owned(), "k\n1".to_owned(), "k".repeat(256)] {
        let r = h
            .invoker
            .invoke(
                h.call("demo.calc.add", json!({"text": "a", "n": 1}))
                    .with_idempotency_key(key.clone()),
            )
            .await;
        let e = r.error.unwrap();
        assert_eq!(e.code, ErrorCode::SchemaValidationFailed, "{key:?}");
        assert_eq!(
            e.fields.get("field").map(String::as_str),
            Some("idempotency_key")
        );
    }
    assert_eq!(h.executions.load(Ordering::SeqCst), 0);
    let ok = h
        .invoker
        .invoke(
            h.call("demo.calc.add", json!({"text": "a", "n": 1}))
                .with_idempotency_key("k".repeat(255)),
        )
        .await;
    assert!(ok.is_ok(), "{ok:?}");
}

#[tokio::test]
async fn another_tenants_tool_is_invisible_not_forbidden() {
    let h = harness();
    let r = h
        .invoker
        .invoke(h.call("other.priv.tool", json!({"text": "x"})))
        .await;
    assert_eq!(r.error_code, Some(ErrorCode::ToolNotFound));
    let owner = Subject::new(
        TenantId::new("other").unwrap(),
        ActorId::new("bob").unwrap(),
    );
    let r = h
        .invoker
        .invoke(ToolCall::new(
            owner,
            id("other.priv.tool"),
            json!({"text": "x"}),
        ))
        .await;
    assert_eq!(r.status, CallStatus::Ok, "the owner can call it: {r:?}");
}

#[tokio::test]
async fn valid_consent_passes_and_wrong_consent_is_refused() {
    let h = harness();
    let grant = |tool: &str, actor: &str, expires: i64| ConsentGrant {
        id: None,
        issued_at: None,
        tenant: TenantId::new("acme").unwrap(),
        actor: ActorId::new(actor).unwrap(),
        tool: Some(id(tool)),
        scope: None,
        args_digest: None,
        expires_at: UnixMillis(expires),
    };
    let later = UnixMillis::now().0 + 60_000;
    let good = h
        .consent
        .issue(&grant("demo.danger.delete", "alice", later));
    let r = h
        .invoker
        .invoke(
            h.call("demo.danger.delete", json!({"text": "x"}))
                .with_consent(good),
        )
        .await;
    assert_eq!(r.status, CallStatus::Ok, "{r:?}");
    for bad in [
        h.consent.issue(&grant("demo.danger.delete", "alice", 1)),
        h.consent.issue(&grant("demo.echo.say", "alice", later)),
        h.consent
            .issue(&grant("demo.danger.delete", "mallory", later)),
    ] {
        let r = h
            .invoker
            .invoke(
                h.call("demo.danger.delete", json!({"text": "x"}))
                    .with_consent(bad),
            )
            .await;
        assert_eq!(r.error_code, Some(ErrorCode::ConsentRequired));
    }
    assert_eq!(h.executions.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_call_refused_for_consent_opens_one_request_and_a_preflight_none() {
    let h = harness();
    let dry = h.call("demo.danger.delete", json!({"text": "x"}));
    let e = h.invoker.preflight(&dry).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::ConsentRequired);
    assert_eq!(e.field("consent_request"), None, "a dry run opens nothing");
    let request_of = |r: &soulbase_tools::pipeline::CallResult| {
        assert_eq!(r.error_code, Some(ErrorCode::ConsentRequired), "{r:?}");
        r.error.as_ref().unwrap().fields["consent_request"].clone()
    };
    let call = h.call("demo.danger.delete", json!({"text": "x"}));
    let first_call = call.call_id.clone();
    let first = request_of(&h.invoker.invoke(call).await);
    h.assert_denied_only(&first_call);
    let again = request_of(
        &h.invoker
            .invoke(h.call("demo.danger.delete", json!({"text": "x"})))
            .await,
    );
    assert_eq!(again, first, "a retry names the same request");
    let other = request_of(
        &h.invoker
            .invoke(h.call("demo.danger.delete", json!({"text": "y"})))
            .await,
    );
    assert_ne!(other, first);
    let acme = TenantId::new("acme").unwrap();
    let pending = h
        .requests
        .list(
            &acme,
            Some(ConsentRequestStatus::Pending),
            UnixMillis(0),
            10,
        )
        .await
        .unwrap();
    assert_eq!(pending.len(), 2, "{pending:?}");
    let opened = pending.iter().find(|r| r.id == first).unwrap();
    assert_eq!(opened.call_id, first_call);
    assert_eq!(opened.actor.as_str(), "alice");
    assert_eq!(opened.tool, id("demo.danger.delete"));
    assert!(opened.args_digest.starts_with("sha256:"));
    assert_eq!(h.executions.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn quota_exhausted_is_rate_limited_with_a_hint() {
    let h = harness();
    for _ in 0..2 {
        assert!(
            h.invoker
                .invoke(h.call("demo.quota.tick", json!({"text": "x"})))
                .await
                .is_ok()
        );
    }
    let call = h.call("demo.quota.tick", json!({"text": "x"}));
    let cid = call.call_id.clone();
    let r = h.invoker.invoke(call).await;
    assert_eq!(r.error_code, Some(ErrorCode::QuotaRateLimited));
    assert!(r.error.unwrap().retry_after_ms.unwrap() > 0);
    h.assert_denied_only(&cid);
}

#[tokio::test]
async fn handler_error_panic_timeout_and_bad_output_all_get_an_end() {
    let h = harness();
    let cases = [
        (
            "demo.fail.error",
            json!({"text": "x"}),
            ErrorCode::ToolExecutionFailed,
            EndStatus::Error,
        ),
        (
            "demo.fail.panic",
            json!({"text": "boom"}),
            ErrorCode::ToolExecutionFailed,
            EndStatus::Error,
        ),
        (
            "demo.slow.sleep",
            json!({"text": "x"}),
            ErrorCode::ProviderTimeout,
            EndStatus::Timeout,
        ),
        (
            "demo.bad.output",
            json!({"text": "x"}),
            ErrorCode::ToolExecutionFailed,
            EndStatus::Error,
        ),
        (
            "demo.big.output",
            json!({"text": "x"}),
            ErrorCode::ToolExecutionFailed,
            EndStatus::Error,
        ),
    ];
    for (tool, args, code, end) in cases {
        let call = h.call(tool, args);
        let cid = call.call_id.clone();
        let r = h.invoker.invoke(call).await;
        assert_eq!(r.status, CallStatus::Error, "{tool}");
        assert_eq!(r.error_code, Some(code), "{tool}: {r:?}");
        assert!(
            r.output.is_none(),
            "{tool}: raw output never reaches the caller"
        );
        assert!(r.evidence_ref.is_some(), "{tool}");
        assert_eq!(h.end_status(&cid), end, "{tool}");
    }
    let r = h
        .invoker
        .invoke(h.call("demo.bad.output", json!({"text": "x"})))
        .await;
    assert_eq!(
        r.error.unwrap().fields.get("pointer").map(String::as_str),
        Some("/text")
    );
    let r = h
        .invoker
        .invoke(h.call("demo.fail.panic", json!({"text": "boom"})))
        .await;
    assert!(
        !r.error.unwrap().message.contains("exploded"),
        "panic text stays in the audit view"
    );
}

#[tokio::test]
async fn idempotent_replay_conflict_and_concurrent_duplicates() {
    let h = harness();
    let first = h
        .invoker
        .invoke(
            h.call("demo.calc.add", json!({"text": "a", "n": 1}))
                .with_idempotency_key("k1"),
        )
        .await;
    assert!(first.is_ok(), "{first:?}");
    assert!(!first.replayed);
    let again = h
        .invoker
        .invoke(
            h.call("demo.calc.add", json!({"n": 1, "text": "a"}))
                .with_idempotency_key("k1"),
        )
        .await;
    assert!(again.replayed);
    assert_eq!(again.output, first.output);
    assert_eq!(again.evidence_ref, first.evidence_ref);
    assert_eq!(
        again.call_id, first.call_id,
        "a replay is the original call's answer"
    );
    assert_eq!(h.executions.load(Ordering::SeqCst), 1);
    let conflict = h
        .invoker
        .invoke(
            h.call("demo.calc.add", json!({"text": "b", "n": 1}))
                .with_idempotency_key("k1"),
        )
        .await;
    assert_eq!(conflict.error_code, Some(ErrorCode::IdempotencyConflict));

    let runs = (0..50).map(|_| {
        let inv = h.invoker.clone();
        let call = h
            .call("demo.calc.add", json!({"text": "c", "n": 2}))
            .with_idempotency_key("k2");
        tokio::spawn(async move { inv.invoke(call).await })
    });
    let results: Vec<_> = futures_util::future::join_all(runs).await;
    let outputs: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
    assert!(outputs.iter().all(|r| r.is_ok()), "{outputs:?}");
    assert_eq!(outputs.iter().filter(|r| !r.replayed).count(), 1);
    assert_eq!(
        h.executions.load(Ordering::SeqCst),
        2,
        "50 concurrent same-key calls executed once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_tools_run_one_at_a_time() {
    let h = harness();
    let runs = (0..16).map(|_| {
        let inv = h.invoker.clone();
        let call = h.call("demo.serial.one", json!({"text": "x"}));
        tokio::spawn(async move { inv.invoke(call).await })
    });
    for r in futures_util::future::join_all(runs).await {
        assert!(r.unwrap().is_ok());
    }
    assert_eq!(h.max_in_flight.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn obligations_apply_to_the_output() {
    let h = harness();
    let r = h
        .invoker
        .invoke(h.call("demo.secret.get", json!({"text": "x"})))
        .await;
    assert_eq!(r.output, Some(json!({"name": "Ann", "ssn": "[REDACTED]"})));
}

#[tokio::test]
async fn a_cancelled_call_still_gets_its_end() {
    let h = harness();
    let call = h.call("demo.slow.sleep", json!({"text": "x"}));
    let cid = call.call_id.clone();
    let inv = h.invoker.clone();
    let task = tokio::spawn(async move { inv.invoke(call).await });
    // Wait until the call has begun, then cancel it.
    while h.evidence(&cid).0.is_empty() {
        tokio::task::yield_now().await;
    }
    task.abort();
    let _ = task.await;
    while h.evidence(&cid).1.is_empty() {
        tokio::task::yield_now().await;
    }
    assert_eq!(h.end_status(&cid), EndStatus::Cancelled);
}

/// A keyed call whose future is dropped mid-run (its caller went away) stores the
/// cancelled outcome with its End: a retry of the key replays it at once (the call
/// may have taken effect, so it is not run again), instead of waiting on a key no
/// one will complete.
#[tokio::test]
async fn a_cancelled_keyed_call_is_replayed_not_waited_for() {
    let h = harness();
    let call = h
        .call("demo.hold.keyed", json!({"text": "x"}))
        .with_idempotency_key("k-cancel");
    let cid = call.call_id.clone();
    let inv = h.invoker.clone();
    let task = tokio::spawn(async move { inv.invoke(call).await });
    while h.evidence(&cid).0.is_empty() {
        tokio::task::yield_now().await;
    }
    task.abort();
    let _ = task.await;
    while h.evidence(&cid).1.is_empty() {
        tokio::task::yield_now().await;
    }
    assert_eq!(h.end_status(&cid), EndStatus::Cancelled);
    let retry = h
        .call("demo.hold.keyed", json!({"text": "x"}))
        .with_idempotency_key("k-cancel");
    let r = tokio::time::timeout(Duration::from_secs(5), h.invoker.invoke(retry))
        .await
        .expect("the retry waited on a key no one will complete");
    assert!(r.replayed, "{r:?}");
    assert_eq!(r.error_code, Some(ErrorCode::ProviderUnavailable), "{r:?}");
    let err = r.error.unwrap();
    assert_eq!(
        err.fields.get("reason").map(String::as_str),
        Some("cancelled")
    );
    assert_eq!(
        err.fields.get("outcome").map(String::as_str),
        Some("unknown")
    );
}

/// A keyed call dropped before it reached its tool (waiting for a concurrency
/// slot) gives its key up, so a retry need not wait for it; one dropped while its
/// tool ran keeps its key (completed with the cancelled outcome).
#[tokio::test]
async fn a_keyed_call_dropped_before_it_ran_gives_its_key_up() {
    let h = harness();
    let hold = |key: &str| {
        h.call("demo.hold.serial", json!({"text": "x"}))
            .with_idempotency_key(key)
    };
    // The first call takes the tool's one slot and holds it.
    let first = hold("k-first");
    let first_id = first.call_id.clone();
    let inv = h.invoker.clone();
    let running = tokio::spawn(async move { inv.invoke(first).await });
    while h.evidence(&first_id).0.is_empty() {
        tokio::task::yield_now().await;
    }
    // The second waits for the slot (claimed, no Begin), then its caller goes away.
    let inv = h.invoker.clone();
    let waiting = tokio::spawn({
        let call = hold("k-second");
        async move { inv.invoke(call).await }
    });
    while h.idempotency.len() < 2 {
        tokio::task::yield_now().await;
    }
    waiting.abort();
    let _ = waiting.await;
    tokio::time::timeout(Duration::from_secs(5), async {
        while h.idempotency.len() > 1 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the dropped call's key was not given up");
    // The running one, dropped, keeps its key with the cancelled outcome.
    running.abort();
    let _ = running.await;
    let retry = tokio::time::timeout(Duration::from_secs(5), h.invoker.invoke(hold("k-first")))
        .await
        .expect("the retry waited on a key no one will complete");
    assert!(retry.replayed, "{retry:?}");
    assert_eq!(retry.error_code, Some(ErrorCode::ProviderUnavailable));
}

/// An idempotency store whose first `complete` never returns (a database that
/// hangs), announcing that it was entered.
struct StuckComplete {
    inner: Arc<MemoryIdempotency>,
    entered: Arc<tokio::sync::Notify>,
    stuck: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl IdempotencyStore for StuckComplete {
    async fn claim(
        &self,
        key: &IdempotencyKey,
        args_digest: &str,
        wait: Duration,
    ) -> Result<Claim, SoulError> {
        self.inner.claim(key, args_digest, wait).await
    }
    async fn begin(&self, key: &IdempotencyKey, begin: &EvidenceRecord) -> Result<(), SoulError> {
        self.inner.begin(key, begin).await
    }
    async fn complete(
        &self,
        key: &IdempotencyKey,
        outcome: StoredOutcome,
        end: Option<&EvidenceRecord>,
    ) -> Result<(), SoulError> {
        if !self.stuck.swap(true, Ordering::SeqCst) {
            self.entered.notify_one();
            std::future::pending::<()>().await;
        }
        self.inner.complete(key, outcome, end).await
    }
    async fn release(&self, key: &IdempotencyKey) -> Result<(), SoulError> {
        self.inner.release(key).await
    }
}

/// A keyed call dropped while its outcome and End were being stored: the drop
/// stores that same outcome and records that same End — one End, `ok`, and a
/// retry replays the result.
#[tokio::test]
async fn a_keyed_call_dropped_while_storing_its_outcome_keeps_its_own_end() {
    let entered = Arc::new(tokio::sync::Notify::new());
    let h = harness_full(None, |inner| {
        Arc::new(StuckComplete {
            inner,
            entered: entered.clone(),
            stuck: std::sync::atomic::AtomicBool::new(false),
        })
    });
    let call = h
        .call("demo.calc.add", json!({"text": "a", "n": 1}))
        .with_idempotency_key("k-stuck");
    let cid = call.call_id.clone();
    let inv = h.invoker.clone();
    let wait = entered.notified();
    let task = tokio::spawn(async move { inv.invoke(call).await });
    wait.await;
    task.abort();
    let _ = task.await;
    while h.evidence(&cid).1.is_empty() {
        tokio::task::yield_now().await;
    }
    let (begins, ends, _) = h.evidence(&cid);
    assert_eq!((begins.len(), ends.len()), (1, 1), "{ends:?}");
    assert_eq!(h.end_status(&cid), EndStatus::Ok);
    let retry = h
        .call("demo.calc.add", json!({"text": "a", "n": 1}))
        .with_idempotency_key("k-stuck");
    let r = tokio::time::timeout(Duration::from_secs(5), h.invoker.invoke(retry))
        .await
        .expect("the retry waited on a key no one will complete");
    assert!(r.replayed && r.is_ok(), "{r:?}");
    assert_eq!(h.executions.load(Ordering::SeqCst), 1);
}

/// A stopping server abandons its running calls: each stops, answers
/// `PROVIDER.UNAVAILABLE` and records a `cancelled` End with that code before
/// `all_ended` resolves; afterwards a call is refused before its Begin.
#[tokio::test]
async fn abandoned_calls_record_a_cancelled_end_and_new_calls_are_refused() {
    let h = harness();
    let mut tasks = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let call = h.call("demo.slow.hold", json!({"text": "x"}));
        ids.push(call.call_id.clone());
        let inv = h.invoker.clone();
        tasks.push(tokio::spawn(async move { inv.invoke(call).await }));
    }
    while ids.iter().any(|c| h.evidence(c).0.is_empty()) {
        tokio::task::yield_now().await;
    }
    assert_eq!(h.invoker.open_calls(), 3);
    assert_eq!(h.invoker.abandon_running(), 3);
    h.invoker.all_ended().await;
    assert_eq!(h.invoker.open_calls(), 0);
    for cid in &ids {
        assert_eq!(h.end_status(cid), EndStatus::Cancelled);
        let (_, ends, _) = h.evidence(cid);
        match &ends[0] {
            EvidenceEvent::End(e) => assert_eq!(e.error_code, Some(ErrorCode::ProviderUnavailable)),
            _ => unreachable!(),
        }
    }
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, CallStatus::Error, "{r:?}");
        assert_eq!(r.error_code, Some(ErrorCode::ProviderUnavailable), "{r:?}");
        assert!(r.evidence_ref.is_some(), "{r:?}");
    }
    let late = h.call("demo.echo.say", json!({"text": "hi"}));
    let cid = late.call_id.clone();
    let r = h.invoker.invoke(late).await;
    assert_eq!(r.error_code, Some(ErrorCode::ProviderUnavailable), "{r:?}");
    h.assert_denied_only(&cid);
}

#[tokio::test]
async fn preflight_reports_without_consuming_or_recording() {
    let h = harness();
    let report = h
        .invoker
        .preflight(&h.call("demo.quota.tick", json!({"text": "x"})))
        .await
        .unwrap();
    assert_eq!(report.version, "1.0.0");
    assert!(report.profile_hash.starts_with("sha256:"));
    assert_eq!(report.budget.limit.as_deref(), Some("2/min"));
    for _ in 0..3 {
        assert!(
            h.invoker
                .preflight(&h.call("demo.quota.tick", json!({"text": "x"})))
                .await
                .is_ok()
        );
    }
    assert!(h.sink.records().is_empty(), "a dry run records nothing");
    let err = h
        .invoker
        .preflight(&h.call("demo.danger.delete", json!({"text": "x"})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::ConsentRequired);
}

#[tokio::test]
async fn disabling_takes_effect_for_the_next_call() {
    let h = harness();
    assert!(
        h.invoker
            .invoke(h.call("demo.echo.say", json!({"text": "x"})))
            .await
            .is_ok()
    );
    h.registry
        .pause(&ToolOwner::Global, &id("demo.echo.say"))
        .unwrap();
    let r = h
        .invoker
        .invoke(h.call("demo.echo.say", json!({"text": "x"})))
        .await;
    assert_eq!(r.error_code, Some(ErrorCode::ToolDisabled));
}

#[tokio::test]
async fn router_answers_every_tool_call_in_order() {
    let h = harness();
    let names = NameMap::new([id("demo.echo.say"), id("demo.fail.error")].iter());
    let router = ToolCallRouter::new(h.invoker.clone(), names.clone());
    let echo = names.name(&id("demo.echo.say")).unwrap().to_owned();
    let fail = names.name(&id("demo.fail.error")).unwrap().to_owned();
    let calls = vec![
        json!({"id": "call_1", "type": "function", "function": {"name": echo, "arguments": "{\"text\":\"hi\"}"}}),
        json!({"id": "call_2", "type": "function", "function": {"name": fail, "arguments": "{\"text\":\"x\"}"}}),
        json!({"id": "call_3", "type": "function", "function": {"name": echo, "arguments": "{not json"}}),
        json!({"id": "call_4", "type": "function", "function": {"name": "unknown_tool", "arguments": "{}"}}),
        json!({"type": "function"}),
    ];
    let msgs = router.route(&acme(), &calls).await;
    assert_eq!(msgs.len(), 5);
    assert!(msgs.iter().all(|m| m.role == "tool"));
    assert_eq!(msgs[0].tool_call_id, "call_1");
    assert_eq!(
        serde_json::from_str::<Value>(&msgs[0].content).unwrap(),
        json!({"text": "hi"})
    );
    let code = |i: usize| {
        serde_json::from_str::<Value>(&msgs[i].content).unwrap()["error"]["code"].clone()
    };
    assert_eq!(code(1), "TOOL.EXECUTION_FAILED");
    assert_eq!(code(2), "SCHEMA.VALIDATION_FAILED");
    assert_eq!(code(3), "TOOL.NOT_FOUND");
    assert_eq!(code(4), "SCHEMA.VALIDATION_FAILED");
}

#[tokio::test]
async fn strict_router_folds_nulls_for_optional_fields_back_to_absent() {
    let h = harness();
    let names = NameMap::new([id("demo.echo.say")].iter());
    let echo = names.name(&id("demo.echo.say")).unwrap().to_owned();
    // What a model sends under a strict export: optional `n` present as null.
    let calls = vec![json!({"id": "call_1", "type": "function",
        "function": {"name": echo, "arguments": "{\"text\":\"hi\",\"n\":null}"}})];

    let lax = ToolCallRouter::new(h.invoker.clone(), names.clone());
    let msgs = lax.route(&acme(), &calls).await;
    let content: Value = serde_json::from_str(&msgs[0].content).unwrap();
    assert_eq!(content["error"]["code"], "SCHEMA.VALIDATION_FAILED");

    let strict = ToolCallRouter::new(h.invoker.clone(), names).strict(true);
    let msgs = strict.route(&acme(), &calls).await;
    let content: Value = serde_json::from_str(&msgs[0].content).unwrap();
    assert!(content.get("error").is_none(), "{content}");
    assert_eq!(content["text"], "hi");
}

#[tokio::test]
async fn available_specs_leave_out_what_policy_denies() {
    let h = harness();
    let offered: Vec<String> = h
        .invoker
        .available(&acme(), None)
        .await
        .unwrap()
        .iter()
        .map(|s| s.id().to_string())
        .collect();
    let enabled: Vec<String> = h
        .registry
        .available_specs(&acme().tenant)
        .iter()
        .map(|s| s.id().to_string())
        .collect();
    assert!(
        enabled.contains(&"demo.denied.tool".to_owned()),
        "{enabled:?}"
    );
    assert!(
        !offered.contains(&"demo.denied.tool".to_owned()),
        "{offered:?}"
    );
    assert!(offered.contains(&"demo.echo.say".to_owned()));
    assert_eq!(offered.len() + 1, enabled.len());
}

/// A sink where, as in the durable spool, a submitted Begin becomes durable only
/// with a later round: here, once its End is recorded. Told to, it loses submitted
/// Begins, and then refuses their Ends too (the contract of `submit`).
#[derive(Default)]
struct GatedSink {
    memory: MemorySink,
    lose_begins: Arc<std::sync::atomic::AtomicBool>,
    /// Ends are not made durable (a full disk): answered as pending, as the
    /// durable sink does.
    lose_ends: Arc<std::sync::atomic::AtomicBool>,
    submitted: Arc<std::sync::Mutex<Vec<soulbase_types::EnvelopeId>>>,
    ended: Arc<tokio::sync::Notify>,
    /// A submitted Begin is written once its answer is awaited, as the durable
    /// spool asks for a round only then.
    written_when_awaited: Arc<std::sync::atomic::AtomicBool>,
    /// Set: a submitted Begin and its End are answered by the test
    /// ([`ByHand::answer`]), as one round of the durable spool answers them.
    by_hand: std::sync::Mutex<Option<ByHand>>,
    /// Set once a Begin answered by hand has its answer polled.
    begin_polled: Arc<std::sync::atomic::AtomicBool>,
}

/// The answers a [`GatedSink`] answering by hand owes.
#[derive(Default)]
struct ByHand {
    begin: Option<tokio::sync::oneshot::Sender<Result<(), SoulError>>>,
    end: Option<tokio::sync::oneshot::Sender<Result<(), SoulError>>>,
}

impl GatedSink {
    /// Whether an End is waiting for its answer (by hand).
    fn end_waiting(&self) -> bool {
        self.by_hand
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|h| h.end.is_some())
    }

    /// Polls `invoke` with `cx` (and lets the runtime run between polls) until its
    /// End waits for an answer by hand; the call must not answer before.
    async fn poll_until_end_waits<F: Future>(
        &self,
        mut invoke: std::pin::Pin<&mut F>,
        cx: &mut std::task::Context<'_>,
    ) {
        for _ in 0..1000 {
            assert!(
                invoke.as_mut().poll(cx).is_pending(),
                "answered before its evidence"
            );
            if self.end_waiting() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(
            self.end_waiting(),
            "the call ran and its End is being recorded"
        );
    }

    /// Sends the Begin's answer (`begin`) or the End's.
    fn answer(&self, begin: bool) {
        let mut by_hand = self.by_hand.lock().unwrap();
        let owed = by_hand.as_mut().expect("answering by hand");
        let ack = if begin {
            &mut owed.begin
        } else {
            &mut owed.end
        };
        ack.take().expect("an answer owed").send(Ok(())).unwrap();
    }

    /// The receiver of the Begin's (`begin`) or the End's answer, its sender kept
    /// as owed; `None` when the sink answers by itself.
    fn owe(&self, begin: bool) -> Option<tokio::sync::oneshot::Receiver<Result<(), SoulError>>> {
        let mut by_hand = self.by_hand.lock().unwrap();
        let owed = by_hand.as_mut()?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        *(if begin {
            &mut owed.begin
        } else {
            &mut owed.end
        }) = Some(tx);
        Some(rx)
    }
}

fn lost() -> SoulError {
    SoulError::new(ErrorCode::EvidenceUnavailable, "lost")
}

/// Whether `memory` holds the End of `begin`.
fn ended(memory: &MemorySink, begin: &soulbase_types::EnvelopeId) -> bool {
    memory
        .records()
        .iter()
        .any(|r| matches!(&r.payload, EvidenceEvent::End(e) if &e.begin_id == begin))
}

#[async_trait::async_trait]
impl EvidenceSink for GatedSink {
    async fn record(&self, record: EvidenceRecord) -> Result<(), SoulError> {
        if matches!(record.payload, EvidenceEvent::End(_)) && self.lose_ends.load(Ordering::SeqCst)
        {
            return Err(lost().with_field("end", "pending"));
        }
        if let EvidenceEvent::End(e) = &record.payload
            && self.submitted.lock().unwrap().contains(&e.begin_id)
            && self.lose_begins.load(Ordering::SeqCst)
        {
            return Err(lost());
        }
        let answer = match record.payload {
            EvidenceEvent::End(_) => self.owe(false),
            _ => None,
        };
        self.memory.record(record).await?;
        if let Some(answer) = answer {
            answer.await.map_err(|_| lost())??;
        }
        self.ended.notify_waiters();
        Ok(())
    }

    async fn submit(&self, begin: EvidenceRecord) -> Result<Durable, SoulError> {
        let id = begin.id.clone();
        self.submitted.lock().unwrap().push(id.clone());
        if let Some(answer) = self.owe(true) {
            self.memory.record(begin).await?;
            let polled = self.begin_polled.clone();
            return Ok(Box::pin(async move {
                polled.store(true, Ordering::SeqCst);
                answer.await.map_err(|_| lost())?
            }));
        }
        if self.lose_begins.load(Ordering::SeqCst) {
            return Ok(Box::pin(async { Err(lost()) }));
        }
        if self.written_when_awaited.load(Ordering::SeqCst) {
            let memory = self.memory.clone();
            return Ok(Box::pin(async move { memory.record(begin).await }));
        }
        self.memory.record(begin).await?;
        let (memory, notify) = (self.memory.clone(), self.ended.clone());
        Ok(Box::pin(async move {
            loop {
                let next = notify.notified();
                if ended(&memory, &id) {
                    return Ok(());
                }
                next.await;
            }
        }))
    }
}

/// A call that can change nothing (a builtin without side effects or capabilities)
/// runs while its Begin is written: here the Begin is durable only once the End is
/// recorded, so a pipeline waiting for it before running would never finish. A
/// call with side effects has its Begin recorded, durable, before it runs.
#[tokio::test]
async fn a_call_that_changes_nothing_runs_while_its_begin_is_written() {
    let gate = Arc::new(GatedSink::default());
    let h = harness_with(Some(gate.clone()));
    let call = h.call("demo.echo.say", json!({"text": "hi"}));
    let cid = call.call_id.clone();
    let r = tokio::time::timeout(Duration::from_secs(20), h.invoker.invoke(call))
        .await
        .expect("the call ran without waiting for its Begin");
    assert_eq!(r.status, CallStatus::Ok, "{r:?}");
    assert_eq!(h.end_status(&cid), EndStatus::Ok);
    assert_eq!(gate.submitted.lock().unwrap().len(), 1);

    // Side effects, a capability (even without side effects), or a tool that asks
    // for consent: the Begin is recorded, durable, before the call runs.
    for tool in ["demo.net.fetch", "demo.tmp.scratch", "demo.ask.first"] {
        let mut call = h.call(tool, json!({"text": "x"}));
        if tool == "demo.ask.first" {
            call.consent = Some(h.consent.issue(&ConsentGrant {
                id: None,
                issued_at: None,
                tenant: TenantId::new("acme").unwrap(),
                actor: ActorId::new("alice").unwrap(),
                tool: Some(id(tool)),
                scope: None,
                args_digest: None,
                expires_at: UnixMillis(UnixMillis::now().0 + 60_000),
            }));
        }
        let cid = call.call_id.clone();
        let r = h.invoker.invoke(call).await;
        assert_eq!(r.status, CallStatus::Ok, "{tool}: {r:?}");
        assert_eq!(h.end_status(&cid), EndStatus::Ok);
    }
    assert_eq!(
        gate.submitted.lock().unwrap().len(),
        1,
        "only the first was submitted"
    );
}

/// The durable spool answers a submitted Begin in its End's round, just ahead of
/// the End: that round wakes the call once, not once for each answer (on an idle
/// server every wake-up is a thread switch). The Begin's answer, listened to
/// while the tool ran (this one yields 20 times), wakes nobody once the End is
/// being recorded.
#[tokio::test]
async fn a_round_answering_a_begin_and_its_end_wakes_the_call_once() {
    struct Wakes(AtomicUsize);
    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let gate = Arc::new(GatedSink::default());
    *gate.by_hand.lock().unwrap() = Some(ByHand::default());
    let h = harness_with(Some(gate.clone()));
    let call = h.call("demo.serial.one", json!({"text": "hi"}));
    let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
    let waker = std::task::Waker::from(wakes.clone());
    let mut cx = std::task::Context::from_waker(&waker);
    let mut invoke = std::pin::pin!(h.invoker.invoke(call));
    gate.poll_until_end_waits(invoke.as_mut(), &mut cx).await;
    wakes.0.store(0, Ordering::SeqCst);
    gate.answer(true);
    assert_eq!(
        wakes.0.load(Ordering::SeqCst),
        0,
        "the Begin's answer wakes nobody"
    );
    gate.answer(false);
    assert_eq!(
        wakes.0.load(Ordering::SeqCst),
        1,
        "the End's answer wakes the call"
    );
    let std::task::Poll::Ready(r) = invoke.as_mut().poll(&mut cx) else {
        panic!("the call answers once its round has")
    };
    assert_eq!(r.status, CallStatus::Ok, "{r:?}");
}

/// A Begin nobody listened to while its tool ran (the tool finished at its first
/// poll) is not polled before its End is recorded: the End's round answers it,
/// and polling it earlier would only start the durable spool's wait for a round
/// of its own — a timer, whose registration wakes the runtime's timer driver on
/// an idle server (an `eventfd` write and a thread switch a call).
#[tokio::test]
async fn a_begin_not_listened_to_while_its_tool_ran_is_not_polled_before_its_end() {
    let gate = Arc::new(GatedSink::default());
    *gate.by_hand.lock().unwrap() = Some(ByHand::default());
    let h = harness_with(Some(gate.clone()));
    let call = h.call("demo.echo.say", json!({"text": "hi"}));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut invoke = std::pin::pin!(h.invoker.invoke(call));
    gate.poll_until_end_waits(invoke.as_mut(), &mut cx).await;
    assert!(
        !gate.begin_polled.load(Ordering::SeqCst),
        "the Begin's answer is not polled before the End is recorded"
    );
    gate.answer(true);
    gate.answer(false);
    let std::task::Poll::Ready(r) = invoke.as_mut().poll(&mut cx) else {
        panic!("the call answers once its round has")
    };
    assert_eq!(r.status, CallStatus::Ok, "{r:?}");
    assert!(
        gate.begin_polled.load(Ordering::SeqCst),
        "the Begin's answer is awaited once the End is recorded"
    );
}

/// A sink may write a submitted Begin only once its answer is awaited (the
/// durable spool then asks for a round, instead of waking its writer for every
/// Begin): the pipeline awaits it while the call runs, so a call still running
/// has its Begin written.
#[tokio::test]
async fn a_submitted_begin_is_awaited_while_its_call_runs() {
    let gate = Arc::new(GatedSink::default());
    gate.written_when_awaited.store(true, Ordering::SeqCst);
    let h = harness_with(Some(gate.clone()));
    let call = h.call("demo.slow.hold", json!({"text": "x"}));
    let cid = call.call_id.clone();
    let invoker = h.invoker.clone();
    let running = tokio::spawn(async move { invoker.invoke(call).await });
    let begun = tokio::time::timeout(Duration::from_secs(20), async {
        while h.evidence(&cid).0.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(begun.is_ok(), "the Begin is written while the call runs");
    assert!(!running.is_finished(), "the tool still holds");
    assert_eq!(gate.submitted.lock().unwrap().len(), 1, "it was submitted");
    assert_eq!(h.invoker.abandon_running(), 1);
    let r = running.await.unwrap();
    assert_eq!(r.error_code, Some(ErrorCode::ProviderUnavailable), "{r:?}");
    assert_eq!(h.end_status(&cid), EndStatus::Cancelled);
}

/// If the Begin written while such a call ran does not land, the call is refused:
/// its result is withheld, its quota refunded, and no End is stored without a
/// Begin. A keyed tool (one execution per key) is not run before its Begin is
/// durable, so a lost submitted Begin never costs it its promise.
#[tokio::test]
async fn a_call_whose_begin_did_not_land_is_refused_and_its_result_withheld() {
    let gate = Arc::new(GatedSink::default());
    let h = harness_with(Some(gate.clone()));
    gate.lose_begins.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        let call = h.call("demo.quota.tick", json!({"text": "x"}));
        let cid = call.call_id.clone();
        let r = h.invoker.invoke(call).await;
        assert_eq!(r.error_code, Some(ErrorCode::EvidenceUnavailable), "{r:?}");
        assert_eq!(r.output, None, "the result is withheld");
        h.assert_denied_only(&cid);
    }
    let mut keyed = h.call("demo.calc.add", json!({"text": "a", "n": 1}));
    keyed.idempotency_key = Some("k-1".into());
    let cid = keyed.call_id.clone();
    let r = h.invoker.invoke(keyed).await;
    assert_eq!(r.status, CallStatus::Ok, "{r:?}");
    assert_eq!(h.end_status(&cid), EndStatus::Ok);
    assert_eq!(
        gate.submitted.lock().unwrap().len(),
        3,
        "the keyed call was not submitted"
    );

    gate.lose_begins.store(false, Ordering::SeqCst);
    // Two calls a minute: the three refused ones were refunded.
    for _ in 0..2 {
        let r = h
            .invoker
            .invoke(h.call("demo.quota.tick", json!({"text": "x"})))
            .await;
        assert_eq!(r.status, CallStatus::Ok, "{r:?}");
    }
}

/// The answer never runs ahead of the evidence: a call that ran but whose End
/// could not be made durable is answered `error` / `EVIDENCE.UNAVAILABLE`, saying
/// the tool ran (`executed: true`) and its End is pending, with its Begin as the
/// evidence reference and its result withheld — never `ok`.
#[tokio::test]
async fn a_call_whose_end_is_not_durable_is_never_answered_ok() {
    let gate = Arc::new(GatedSink::default());
    let h = harness_with(Some(gate.clone()));
    gate.lose_ends.store(true, Ordering::SeqCst);
    let call = h.call("demo.net.fetch", json!({"text": "x"}));
    let cid = call.call_id.clone();
    let r = h.invoker.invoke(call).await;
    assert_eq!(r.status, CallStatus::Error, "{r:?}");
    assert_eq!(r.error_code, Some(ErrorCode::EvidenceUnavailable), "{r:?}");
    assert_eq!(r.output, None, "the result is withheld");
    let err = r.error().unwrap();
    assert_eq!(err.field("executed"), Some("true"), "{r:?}");
    assert_eq!(err.field("end"), Some("pending"), "{r:?}");
    let (begins, ends, _) = h.evidence(&cid);
    assert_eq!((begins.len(), ends.len()), (1, 0));
    let begin_id = h
        .sink
        .records()
        .into_iter()
        .find(|rec| matches!(&rec.payload, EvidenceEvent::Begin(b) if b.call_id == cid))
        .map(|rec| rec.id);
    assert_eq!(r.evidence_ref, begin_id);

    gate.lose_ends.store(false, Ordering::SeqCst);
    let r = h
        .invoker
        .invoke(h.call("demo.net.fetch", json!({"text": "x"})))
        .await;
    assert_eq!(r.status, CallStatus::Ok, "{r:?}");
}
