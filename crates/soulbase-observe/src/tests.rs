//! Tests of the store semantics (via [`MemoryStore`]) and of replay.

use soulbase_errors::ErrorCode;
use soulbase_types::{ActorId, CallId, Envelope, EnvelopeId, Origin, TenantId, ToolId, UnixMillis};

use crate::*;

fn tenant(s: &str) -> TenantId {
    TenantId::new(s).unwrap()
}

fn begin(t: &str, tool: &str, at: i64) -> EvidenceRecord {
    let mut r = Envelope::new(
        tenant(t),
        ActorId::new("alice").unwrap(),
        Origin::Llm,
        EvidenceEvent::Begin(EvidenceBegin {
            call_id: CallId::generate(),
            tool_id: ToolId::new(tool).unwrap(),
            tool_version: "1.2.3".into(),
            manifest_digest: "m".into(),
            profile_hash: "p".into(),
            policy_hash: "pol".into(),
            config_hash: "c".into(),
            args_digest: "sha256:aa".into(),
            idempotency_key: Some("k1".into()),
            calling_skill: None,
            consent: None,
            conversation: None,
            surface: None,
        }),
    );
    r.at = UnixMillis(at);
    r
}

fn end_of(b: &EvidenceRecord, status: EndStatus) -> EvidenceRecord {
    let EvidenceEvent::Begin(x) = &b.payload else {
        panic!("not a begin")
    };
    let mut r = Envelope::new(
        b.tenant.clone(),
        b.actor.clone(),
        b.origin,
        EvidenceEvent::End(EvidenceEnd {
            call_id: x.call_id.clone(),
            begin_id: b.id.clone(),
            status,
            error_code: (status != EndStatus::Ok).then_some(ErrorCode::ToolExecutionFailed),
            output_digest: Some("sha256:bb".into()),
            side_effects: vec![SideEffectRecord {
                kind: "fs.write".into(),
                target: "/tmp/x".into(),
            }],
            usage: BudgetUsage {
                calls: 1,
                bytes_in: 3,
                bytes_out: 4,
                cpu_ms: 0,
            },
            duration_us: 42,
            client_requests: Vec::new(),
        }),
    );
    r.at = UnixMillis(b.at.0 + 1);
    r
}

fn call_of(r: &EvidenceRecord) -> CallId {
    r.payload.call_id().clone()
}

#[tokio::test]
async fn writes_are_idempotent_by_envelope_id() {
    let store = MemoryStore::new();
    let b = begin("acme", "a.b.c", 1_000);
    let e = end_of(&b, EndStatus::Ok);
    store.write_batch(&[b.clone(), e.clone()]).await.unwrap();
    store.write_batch(&[b.clone(), e.clone()]).await.unwrap();
    assert_eq!(store.len(), 2);
    let ev = store.call(None, &call_of(&b)).await.unwrap();
    assert_eq!(ev.records, vec![b.clone(), e]);
    // Another tenant sees nothing of it.
    assert!(
        store
            .call(Some(&tenant("other")), &call_of(&b))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_call_reads_begin_before_end_within_one_millisecond() {
    let store = MemoryStore::new();
    let mut b = begin("acme", "demo.a.x", 1_000);
    b.id = EnvelopeId::new("ffffffff-ffff-7fff-bfff-ffffffffffff").unwrap();
    let mut e = end_of(&b, EndStatus::Ok);
    e.at = b.at;
    e.id = EnvelopeId::new("00000000-0000-7000-8000-000000000000").unwrap();
    store.write_batch(&[e.clone(), b.clone()]).await.unwrap();
    let ev = store.call(None, &call_of(&b)).await.unwrap();
    assert_eq!(ev.records, vec![b, e]);
}

#[tokio::test]
async fn listing_filters_and_paginates_newest_first() {
    let store = MemoryStore::new();
    let mut all = Vec::new();
    for i in 0..25 {
        let tool = if i % 2 == 0 { "a.b.even" } else { "a.b.odd" };
        let b = begin("acme", tool, 1_000 + i);
        let status = if i % 5 == 0 {
            EndStatus::Error
        } else {
            EndStatus::Ok
        };
        all.push(b.clone());
        store
            .write_batch(&[b.clone(), end_of(&b, status)])
            .await
            .unwrap();
    }
    store
        .write_batch(&[begin("other", "a.b.even", 1_005)])
        .await
        .unwrap();

    let mut q = EvidenceQuery::tenant(tenant("acme"), 10);
    let mut seen = Vec::new();
    loop {
        let page = store.list(&q).await.unwrap();
        seen.extend(page.calls.iter().map(|c| c.began_at.0));
        match page.next {
            Some(next) => q.after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, (1_000..1_025).rev().collect::<Vec<_>>());

    let mut q = EvidenceQuery::tenant(tenant("acme"), 100);
    q.tool = Some(ToolId::new("a.b.even").unwrap());
    q.status = Some(EndStatus::Error);
    q.from = Some(UnixMillis(1_001));
    q.to = Some(UnixMillis(1_020));
    let page = store.list(&q).await.unwrap();
    let got: Vec<i64> = page.calls.iter().map(|c| c.began_at.0).collect();
    assert_eq!(got, vec![1_010]);
    assert_eq!(page.calls[0].status, Some(EndStatus::Error));
    assert_eq!(
        page.calls[0].error_code,
        Some(ErrorCode::ToolExecutionFailed)
    );
    assert!(page.next.is_none());
}

#[tokio::test]
async fn bad_queries_name_the_field() {
    let store = MemoryStore::new();
    let q = EvidenceQuery::tenant(tenant("acme"), 0);
    let err = store.list(&q).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
    assert_eq!(err.field("field"), Some("limit"));
    let mut q = EvidenceQuery::tenant(tenant("acme"), 5);
    q.from = Some(UnixMillis(10));
    q.to = Some(UnixMillis(5));
    assert_eq!(
        store.list(&q).await.unwrap_err().field("field"),
        Some("from")
    );
    assert_eq!(
        PageCursor::parse("nope").unwrap_err().field("field"),
        Some("after")
    );
    let c = PageCursor {
        at: UnixMillis(7),
        id: EnvelopeId::generate(),
    };
    assert_eq!(PageCursor::parse(&c.to_string()).unwrap(), c);
}

#[tokio::test]
async fn purge_drops_old_records_only() {
    let store = MemoryStore::new();
    let old = begin("acme", "a.b.c", 100);
    let new = begin("acme", "a.b.c", 10_000);
    store
        .write_batch(&[old.clone(), end_of(&old, EndStatus::Ok), new.clone()])
        .await
        .unwrap();
    assert_eq!(store.purge_before(UnixMillis(5_000)).await.unwrap(), 2);
    assert!(store.call(None, &call_of(&old)).await.unwrap().is_empty());
    assert_eq!(
        store
            .call(None, &call_of(&new))
            .await
            .unwrap()
            .records
            .len(),
        1
    );
}

#[test]
fn replay_rebuilds_an_executed_call() {
    let b = begin("acme", "a.b.c", 1_000);
    let e = end_of(&b, EndStatus::Ok);
    let r = replay(&CallEvidence {
        records: vec![b.clone(), e],
    })
    .unwrap();
    assert!(r.anomalies.is_empty(), "{:?}", r.anomalies);
    assert_eq!(r.tenant, tenant("acme"));
    let ReplayOutcome::Executed(x) = r.outcome else {
        panic!("not executed")
    };
    assert_eq!(x.begin_id, b.id);
    assert_eq!(x.tool_version, "1.2.3");
    assert_eq!(x.args_digest, "sha256:aa");
    assert_eq!(x.status, Some(EndStatus::Ok));
    assert_eq!(x.output_digest.as_deref(), Some("sha256:bb"));
    assert_eq!(x.side_effects.len(), 1);
    assert_eq!(x.usage.bytes_out, 4);
}

#[test]
fn replay_flags_inconsistent_evidence() {
    let b = begin("acme", "a.b.c", 1_000);
    let r = replay(&CallEvidence {
        records: vec![b.clone()],
    })
    .unwrap();
    assert_eq!(r.anomalies.len(), 1);
    let other = begin("acme", "a.b.c", 1_000);
    let mut wrong = end_of(&other, EndStatus::Ok);
    if let EvidenceEvent::End(e) = &mut wrong.payload {
        e.call_id = call_of(&b);
    }
    let r = replay(&CallEvidence {
        records: vec![b.clone(), wrong.clone(), end_of(&b, EndStatus::Ok)],
    })
    .unwrap();
    assert!(r.anomalies.iter().any(|a| a.contains("2 End records")));
    assert!(r.anomalies.iter().any(|a| a.contains("closes Begin")));
    let err = replay(&CallEvidence::default()).unwrap_err();
    assert_eq!(err.field("field"), Some("call_id"));
    let err = replay(&CallEvidence {
        records: vec![end_of(&b, EndStatus::Ok)],
    })
    .unwrap_err();
    assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
}

#[test]
fn replay_of_a_denial() {
    let d = Envelope::new(
        tenant("acme"),
        ActorId::new("bob").unwrap(),
        Origin::Api,
        EvidenceEvent::Denied(Denial {
            call_id: CallId::generate(),
            tool: "a.b.c".into(),
            code: ErrorCode::PolicyDenyTool,
        }),
    );
    let r = replay(&CallEvidence { records: vec![d] }).unwrap();
    assert!(matches!(
        r.outcome,
        ReplayOutcome::Denied {
            code: ErrorCode::PolicyDenyTool,
            ..
        }
    ));
}

fn step(conversation: &CallId, at: i64, step: ConversationStep) -> EvidenceRecord {
    let mut r = Envelope::new(
        tenant("acme"),
        ActorId::new("alice").unwrap(),
        Origin::Llm,
        EvidenceEvent::Conversation(Box::new(ConversationEvent {
            conversation_id: conversation.clone(),
            step,
        })),
    );
    r.at = UnixMillis(at);
    r
}

/// A begin made by turn `iteration` of `conversation`.
fn begin_in(conversation: &CallId, iteration: u32, at: i64) -> EvidenceRecord {
    let mut b = begin("acme", "a.b.c", at);
    if let EvidenceEvent::Begin(x) = &mut b.payload {
        x.conversation = Some(Box::new(ConversationRef {
            id: conversation.as_str().to_owned(),
            iteration,
        }));
    }
    b
}

fn turn(iteration: u32, calls: Vec<TurnCall>) -> ConversationStep {
    ConversationStep::Turn {
        iteration,
        response_digest: format!("sha256:{iteration}"),
        tokens: Some(TokenUsage {
            prompt: 3,
            completion: 2,
            total: 5,
        }),
        tool_calls: calls,
    }
}

fn start() -> ConversationStep {
    ConversationStep::Start {
        model: "gpt-test".into(),
        messages: 1,
        messages_digest: "sha256:m".into(),
        max_iterations: 8,
        tools_offered: 2,
    }
}

fn end(iterations: u32) -> ConversationStep {
    ConversationStep::End {
        reason: ConversationEnd::Answered,
        iterations,
        tool_calls: 1,
        tokens: 10,
        error_code: None,
    }
}

#[test]
fn a_conversation_replays_its_turns_and_their_calls_in_order() {
    let conv = CallId::new("conv_1").unwrap();
    let b = begin_in(&conv, 1, 1_001);
    let e = end_of(&b, EndStatus::Ok);
    let call_id = b.payload.call_id().clone();
    let called = TurnCall {
        id: "call_1".into(),
        tool: "a.b.c".into(),
        call_id: Some(call_id.clone()),
        code: None,
    };
    let own = CallEvidence {
        records: vec![
            step(&conv, 1_000, start()),
            step(&conv, 1_002, turn(1, vec![called.clone()])),
            step(&conv, 1_003, turn(2, vec![])),
            step(&conv, 1_004, end(2)),
        ],
    };
    assert!(is_conversation(&own));
    assert_eq!(conversation_calls(&own), vec![call_id.clone()]);
    let calls = [(
        call_id.clone(),
        CallEvidence {
            records: vec![b, e],
        },
    )]
    .into_iter()
    .collect();
    let r = replay_conversation(&own, &calls, &Default::default()).unwrap();
    assert_eq!(r.model.as_deref(), Some("gpt-test"));
    assert_eq!(r.turns.len(), 2);
    let call = &r.turns[0].calls[0];
    assert_eq!(call.replay.as_ref().unwrap().call_id, call_id);
    assert_eq!(r.end.as_ref().unwrap().reason, ConversationEnd::Answered);
    assert!(r.anomalies.is_empty(), "{:?}", r.anomalies);

    // Withheld: shown as such, no anomaly.
    let hidden = [call_id.clone()].into_iter().collect();
    let r = replay_conversation(&own, &Default::default(), &hidden).unwrap();
    assert!(r.turns[0].calls[0].withheld && r.turns[0].calls[0].replay.is_none());
    assert!(r.anomalies.is_empty(), "{:?}", r.anomalies);

    // What does not add up is flagged: a call with no evidence, a call whose
    // Begin names another turn, a turn out of order, no end.
    let r = replay_conversation(&own, &Default::default(), &Default::default()).unwrap();
    assert!(
        r.anomalies.iter().any(|a| a.contains("has no evidence")),
        "{:?}",
        r.anomalies
    );
    let elsewhere = begin_in(&conv, 1, 1_001);
    let mut moved = called;
    moved.call_id = Some(elsewhere.payload.call_id().clone());
    let broken = CallEvidence {
        records: vec![
            step(&conv, 1_000, start()),
            step(&conv, 1_002, turn(2, vec![moved.clone()])),
        ],
    };
    let calls = [(
        moved.call_id.clone().unwrap(),
        CallEvidence {
            records: vec![elsewhere.clone(), end_of(&elsewhere, EndStatus::Ok)],
        },
    )]
    .into_iter()
    .collect();
    let r = replay_conversation(&broken, &calls, &Default::default()).unwrap();
    for expected in [
        "does not name this conversation's turn",
        "turn 2 recorded where turn 1",
        "no end recorded",
    ] {
        assert!(
            r.anomalies.iter().any(|a| a.contains(expected)),
            "{expected}: {:?}",
            r.anomalies
        );
    }
    assert!(
        replay_conversation(
            &CallEvidence { records: vec![] },
            &calls,
            &Default::default()
        )
        .is_err()
    );
}

#[test]
fn conversation_records_round_trip_and_index_under_their_id() {
    let conv = CallId::new("conv_2").unwrap();
    let r = step(&conv, 5, turn(1, vec![]));
    let text = serde_json::to_string(&r).unwrap();
    assert!(
        text.contains(r#""event":"conversation""#) && text.contains(r#""step":"turn""#),
        "{text}"
    );
    let enc = EncodedRecord::encode(&r).unwrap();
    let head = enc.head().unwrap();
    assert_eq!(
        (head.kind, head.call_id.as_ref(), head.tool_id),
        ("conversation", "conv_2", None)
    );
    assert_eq!(enc.decode().unwrap(), r);
}

#[test]
fn an_end_status_is_named_as_serde_names_it() {
    for status in EndStatus::ALL {
        let json = serde_json::to_string(&status).unwrap();
        assert_eq!(json, format!("\"{}\"", status.as_str()));
        assert_eq!(EndStatus::from_name(status.as_str()), Some(status));
    }
    assert_eq!(EndStatus::from_name("fine"), None);
}
