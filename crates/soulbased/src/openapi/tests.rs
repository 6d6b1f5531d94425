#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use serde::Serialize;
use serde_json::{Value, json};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::{
    BudgetUsage, CallEvidence, ClientRequestKind, ClientRequestRecord, ConsentUsed,
    ConversationEnd, ConversationEvent, ConversationRef, ConversationStep, Denial, EndStatus,
    EvidenceBegin, EvidenceEnd, EvidenceEvent, EvidenceRecord, SideEffectRecord, TokenUsage,
    TurnCall,
};
use soulbase_tools::pipeline::{CallResult, CallStatus, PreflightReport};
use soulbase_types::{
    ActorId, CallId, Envelope, Obligation, ObligationKind, Origin, TenantId, ToolId, TraceContext,
};

use super::*;
use crate::bodies::{
    CallEvidenceBody, ConversationEvidenceBody, ConversationSummary, ErrorBody, EvidenceBody,
    ToolCallMade,
};

/// The committed document, relative to this crate.
const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");

/// Set, [`the_committed_document_is_generated`] writes the document instead of
/// comparing it (`cargo xtask codegen`).
const BLESS: &str = "SOULBASE_BLESS";

fn doc() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(document)
}

/// `docs/openapi.json` is what the code generates (`cargo xtask codegen`
/// rewrites it with `SOULBASE_BLESS=1`; `cargo xtask codegen --check` runs
/// this test as it is).
#[test]
fn the_committed_document_is_generated() {
    let fresh = render(doc());
    if std::env::var_os(BLESS).is_some() {
        std::fs::write(COMMITTED, &fresh).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(COMMITTED).unwrap_or_default();
    if committed != fresh {
        let line = committed
            .lines()
            .zip(fresh.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(fresh.lines().count()));
        panic!(
            "docs/openapi.json is stale (it first differs at line {}: {:?}); run `cargo xtask codegen` and commit it",
            line + 1,
            fresh.lines().nth(line).unwrap_or_default(),
        );
    }
}

#[test]
fn every_route_has_one_operation() {
    let mut spec = Spec::new();
    let mut ids = BTreeSet::new();
    for route in ROUTES {
        let op = operations::operation(route, &mut spec)
            .unwrap_or_else(|| panic!("{} {} is not described", route.method, route.path))
            .into_json();
        let id = op["operationId"].as_str().unwrap().to_owned();
        assert!(ids.insert(id.clone()), "operationId {id} twice");
        let described = &doc()["paths"][route.path][route.method.as_str().to_lowercase()];
        assert_eq!(described["operationId"], id.as_str());
        // Every path parameter is declared, and no other.
        let declared: BTreeSet<String> = described["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .map(resolve)
            .filter(|p| p["in"] == "path")
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect();
        let in_path: BTreeSet<String> = route
            .path
            .split('/')
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
            .map(str::to_owned)
            .collect();
        assert_eq!(declared, in_path, "{} {}", route.method, route.path);
    }
}

/// What `value` refers to in the document (itself when it is no reference).
fn resolve(value: &Value) -> &Value {
    match value.get("$ref").and_then(Value::as_str) {
        Some(r) => doc()
            .pointer(r.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("{r} names nothing")),
        None => value,
    }
}

#[test]
fn every_reference_names_a_component() {
    fn walk(v: &Value, refs: &mut BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    refs.insert(r.clone());
                }
                m.values().for_each(|v| walk(v, refs));
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, refs)),
            _ => {}
        }
    }
    let mut refs = BTreeSet::new();
    walk(doc(), &mut refs);
    for r in &refs {
        assert!(
            doc().pointer(r.trim_start_matches('#')).is_some(),
            "{r} names nothing"
        );
    }
    // And every component is used.
    for kind in ["schemas", "parameters", "responses"] {
        for name in doc()["components"][kind].as_object().unwrap().keys() {
            assert!(
                refs.contains(&format!("#/components/{kind}/{name}")),
                "component {kind}/{name} is never used"
            );
        }
    }
}

#[test]
fn every_component_schema_is_a_json_schema_named_after_its_type() {
    for (name, schema) in doc()["components"]["schemas"].as_object().unwrap() {
        assert!(
            !name.ends_with(|c: char| c.is_ascii_digit()),
            "{name}: two types share a schema name; rename one (`#[schemars(rename)]`)"
        );
        assert!(
            !name.ends_with("Input"),
            "{name}: read and written differently"
        );
        jsonschema::meta::validate(schema).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// Every failure answers the one error envelope, but an invoke's (a
/// `CallResult`) and a readiness probe's (`Status`).
#[test]
fn every_failure_is_the_error_envelope() {
    let error = json!({"$ref": "#/components/schemas/Error"});
    for (path, item) in doc()["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for (status, response) in op["responses"].as_object().unwrap() {
                if status.starts_with('2') || (path == "/readyz" && status == "503") {
                    continue;
                }
                let schema = &resolve(response)["content"]["application/json"]["schema"];
                let call_result = json!({"$ref": "#/components/schemas/CallResult"});
                let ok = *schema == error
                    || path == "/api/tools/{id}/invoke"
                        && (*schema == call_result
                            || schema["anyOf"]
                                .as_array()
                                .is_some_and(|a| a.contains(&error)));
                assert!(ok, "{method} {path} {status}: {schema}");
            }
        }
    }
    // Each shared response names the codes answered with its status.
    for spec in soulbase_errors::CODES {
        let described = doc()["components"]["responses"]
            .as_object()
            .unwrap()
            .values()
            .any(|r| {
                r["description"]
                    .as_str()
                    .is_some_and(|d| d.contains(&format!("`{}`", spec.id)))
            });
        assert!(described, "{} is named by no error response", spec.id);
    }
}

#[test]
fn rustdoc_links_read_as_code() {
    assert_eq!(unlink("see [`a`](b::c) and [`d`]."), "see `a` and `d`.");
    assert_eq!(unlink("x\n\n[`d`]: super::d"), "x");
    assert_eq!(unlink("[`open"), "[`open");
}

/// Whether `value` (serialized) is an instance of component `name`.
fn check<T: Serialize>(name: &str, value: &T) {
    let instance = serde_json::to_value(value).unwrap();
    let schema = json!({
        "$ref": format!("#/components/schemas/{name}"),
        "components": doc()["components"],
    });
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&instance)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{name}: {errors:?}\n{instance:#}");
}

/// And that it is not: the schema is strict about what it leaves out.
fn check_not(name: &str, instance: Value) {
    let schema = json!({
        "$ref": format!("#/components/schemas/{name}"),
        "components": doc()["components"],
    });
    let validator = jsonschema::validator_for(&schema).unwrap();
    assert!(!validator.is_valid(&instance), "{name} admits {instance}");
}

fn tool() -> ToolId {
    ToolId::new("demo.echo.say").unwrap()
}

#[test]
fn errors_and_call_results_match_their_schemas() {
    let e = SoulError::new(ErrorCode::QuotaRateLimited, "slow down")
        .with_field("field", "body")
        .retry_after(std::time::Duration::from_millis(250));
    check("Error", &ErrorBody { error: e.public() });
    check(
        "Error",
        &ErrorBody {
            error: SoulError::of(ErrorCode::ToolNotFound).public(),
        },
    );
    check_not(
        "Error",
        json!({"error": {"code": "NOPE", "message": "", "retry": "never"}}),
    );
    check_not(
        "Error",
        json!({"error": {"code": "TOOL.NOT_FOUND", "message": "", "retry": "never", "retry_after_ms": null}}),
    );

    let call = CallId::new("call_1").unwrap();
    let refused = CallResult::refused(call.clone(), &e);
    assert_eq!(refused.status, CallStatus::Denied);
    check("CallResult", &refused);
    let mut full = refused.clone();
    full.status = CallStatus::Error;
    full.output = Some(json!({"x": 1}));
    full.evidence_ref = Some(soulbase_types::EnvelopeId::generate());
    full.replayed = true;
    full.warnings = vec!["Deprecated since 2.0: use x.".into()];
    check("CallResult", &full);
    // Every status serde writes is one the schema names.
    for status in [CallStatus::Ok, CallStatus::Denied, CallStatus::Error] {
        let mut r = refused.clone();
        r.status = status;
        check("CallResult", &r);
    }
    check_not(
        "CallResult",
        json!({"call_id": "c", "status": "ok", "replayed": false, "x": 1}),
    );

    let report = PreflightReport {
        tool: tool(),
        version: "1.0.0".into(),
        profile_hash: "p".into(),
        policy_hash: "q".into(),
        budget: soulbase_qos::BudgetSnapshot {
            limit: Some("100/min".into()),
            remaining: Some(99),
            budgets: vec![soulbase_qos::BudgetRemaining {
                budget: "calls 10 per 60000 ms on *".into(),
                calls: Some(9),
                bytes_in: Some(1),
                bytes_out: Some(2),
                cpu_ms: Some(3),
                resets_in_ms: 1000,
            }],
        },
        consent_required: true,
        obligations: vec![Obligation {
            kind: ObligationKind::Mask,
            pointer: "/x".into(),
            value: Some("*".into()),
            required: true,
            on_failure: soulbase_types::ObligationFailure::Degrade,
        }],
    };
    check("PreflightReport", &report);
    check(
        "PreflightReport",
        &PreflightReport {
            budget: soulbase_qos::BudgetSnapshot::default(),
            obligations: Vec::new(),
            ..report
        },
    );
}

#[test]
fn tool_call_answers_match_their_schemas() {
    use soulbase_tools::pipeline::router::{anthropic_answer, openai_answer};
    let content = json!({"error": {"code": "TOOL.NOT_FOUND"}});
    check(
        "ToolMessages",
        &json!({"messages": [openai_answer("call_1", &content)]}),
    );
    check(
        "ToolResults",
        &json!({"content": [anthropic_answer("toolu_1", &content, true)]}),
    );
    check(
        "ConversationSummary",
        &ConversationSummary {
            conversation_id: "conv_1".into(),
            iterations: 2,
            tool_calls: vec![ToolCallMade {
                tool: "soulbase_builtin_echo".into(),
                content: "{}".into(),
            }],
            reason: ConversationEnd::Budget,
        },
    );
}

fn envelope(payload: EvidenceEvent) -> EvidenceRecord {
    Envelope::new(
        TenantId::new("acme").unwrap(),
        ActorId::new("alice@example.com").unwrap(),
        Origin::Llm,
        payload,
    )
}

/// A call's Begin and End, every optional member set.
fn executed(call: &CallId, conversation: &str) -> Vec<EvidenceRecord> {
    let mut begin = envelope(EvidenceEvent::Begin(EvidenceBegin {
        call_id: call.clone(),
        tool_id: tool(),
        tool_version: "1.0.0".into(),
        manifest_digest: "m".into(),
        profile_hash: "p".into(),
        policy_hash: "q".into(),
        config_hash: "c".into(),
        args_digest: "sha256:00".into(),
        idempotency_key: Some("k".into()),
        calling_skill: Some("greet".into()),
        consent: Some(ConsentUsed {
            token_id: Some("t1".into()),
            token_digest: "d".into(),
            issued_at: Some(1),
            expires_at: 2,
            args_bound: true,
        }),
        conversation: Some(Box::new(ConversationRef {
            id: conversation.into(),
            iteration: 1,
        })),
        surface: Some(soulbase_types::Surface::Mcp),
    }));
    begin.trace =
        TraceContext::parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .ok();
    let end = envelope(EvidenceEvent::End(EvidenceEnd {
        call_id: call.clone(),
        begin_id: begin.id.clone(),
        status: EndStatus::Error,
        error_code: Some(ErrorCode::ToolExecutionFailed),
        output_digest: Some("sha256:11".into()),
        side_effects: vec![SideEffectRecord {
            kind: "fs.write".into(),
            target: "/tmp/x".into(),
        }],
        usage: BudgetUsage {
            calls: 1,
            bytes_in: 2,
            bytes_out: 3,
            cpu_ms: 4,
        },
        duration_us: 5,
        client_requests: vec![ClientRequestRecord {
            kind: ClientRequestKind::Sampling,
            request_digest: "r".into(),
            outcome: "answered".into(),
            response_digest: Some("s".into()),
            response_bytes: 6,
            model: Some("m".into()),
            error_code: None,
        }],
    }));
    vec![begin, end]
}

#[test]
fn evidence_matches_its_schema() {
    let call = CallId::new("call_1").unwrap();
    let evidence = CallEvidence {
        records: executed(&call, "conv_1"),
    };
    for record in &evidence.records {
        check("EvidenceRecord", record);
    }
    let replay = soulbase_observe::replay(&evidence).unwrap();
    check("Replay", &replay);
    check(
        "Evidence",
        &EvidenceBody::Call(CallEvidenceBody {
            call_id: call.clone(),
            records: evidence.records.clone(),
            replay,
        }),
    );

    let refused = CallId::new("call_2").unwrap();
    let denial = CallEvidence {
        records: vec![envelope(EvidenceEvent::Denied(Denial {
            call_id: refused.clone(),
            tool: "no such tool".into(),
            code: ErrorCode::ToolNotFound,
        }))],
    };
    check("Replay", &soulbase_observe::replay(&denial).unwrap());

    let conv = CallId::new("conv_1").unwrap();
    let step = |step| {
        envelope(EvidenceEvent::Conversation(Box::new(ConversationEvent {
            conversation_id: conv.clone(),
            step,
        })))
    };
    let records = vec![
        step(ConversationStep::Start {
            model: "gpt".into(),
            messages: 1,
            messages_digest: "d".into(),
            max_iterations: 3,
            tools_offered: 2,
        }),
        step(ConversationStep::Turn {
            iteration: 1,
            response_digest: "r".into(),
            tokens: Some(TokenUsage {
                prompt: 1,
                completion: 2,
                total: 3,
            }),
            tool_calls: vec![
                TurnCall {
                    id: "call_1".into(),
                    tool: tool().to_string(),
                    call_id: Some(call.clone()),
                    code: Some(ErrorCode::ToolExecutionFailed),
                },
                TurnCall {
                    id: "call_2".into(),
                    tool: "demo.echo.hidden".into(),
                    call_id: Some(refused.clone()),
                    code: None,
                },
            ],
        }),
        step(ConversationStep::End {
            reason: ConversationEnd::UpstreamError,
            iterations: 1,
            tool_calls: 2,
            tokens: 3,
            error_code: Some(ErrorCode::ProviderUnavailable),
        }),
    ];
    for record in &records {
        check("EvidenceRecord", record);
    }
    let conversation = CallEvidence { records };
    let calls = BTreeMap::from([(call.clone(), evidence)]);
    let withheld = BTreeSet::from([refused]);
    let replayed = soulbase_observe::replay_conversation(&conversation, &calls, &withheld).unwrap();
    check("ConversationReplay", &replayed);
    check(
        "Evidence",
        &EvidenceBody::Conversation(ConversationEvidenceBody {
            call_id: conv,
            records: conversation.records.clone(),
            conversation: replayed,
        }),
    );
    check_not(
        "EvidenceRecord",
        json!({"id": "e", "tenant": "t", "actor": "a", "origin": "llm", "at": 1, "payload": {"event": "denied", "call_id": "c", "tool": "x", "code": "TOOL.NOT_FOUND", "extra": 1}}),
    );
}
