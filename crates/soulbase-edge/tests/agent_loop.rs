//! The agent loop over the one stack, linked as a library: a conversation's own
//! evidence comes in order around the calls it makes, and a conversation whose
//! evidence cannot be made durable is not answered.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::{Value, json};
use soulbase_auth::{HmacConsent, StaticPolicy};
use soulbase_config::{PolicyConfig, PolicyEffect, PolicyRule};
use soulbase_edge::{ConversationRequest, ModelUpstream, Stack, Surface};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::{ConversationStep, EvidenceEvent, EvidenceRecord, EvidenceSink, MemorySink};
use soulbase_qos::LocalQuota;
use soulbase_sandbox::{BuiltinExecutor, DeclaredProfiles, LocalSandbox, handler_fn};
use soulbase_tools::pipeline::{InvokerBuilder, MemoryIdempotency};
use soulbase_tools::{Registry, ToolManifest, ToolOwner};
use soulbase_types::{ActorId, Subject, TenantId};

const MANIFEST: &str = r#"
id: demo.echo.say
version: 1.0.0
description: Says the text back.
input_schema: {type: object}
output_schema: {type: object}
side_effect: none
"#;

/// A sink that keeps records in memory and refuses a conversation's End while
/// `refuse_end` is set, as a full disk would.
#[derive(Clone, Default)]
struct Sink {
    kept: MemorySink,
    refuse_end: Arc<Mutex<bool>>,
}

#[async_trait]
impl EvidenceSink for Sink {
    async fn record(&self, record: EvidenceRecord) -> Result<(), SoulError> {
        let is_end = matches!(&record.payload, EvidenceEvent::Conversation(c)
            if matches!(c.step, ConversationStep::End { .. }));
        if is_end && *self.refuse_end.lock().unwrap() {
            return Err(SoulError::new(
                ErrorCode::EvidenceUnavailable,
                "the disk is full",
            ));
        }
        self.kept.record(record).await
    }
}

/// A model asking for the echo once, then answering.
struct Model;

#[async_trait]
impl ModelUpstream for Model {
    async fn complete(&self, request: &Value) -> Result<Value, SoulError> {
        let answered = request["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "tool");
        let message = if answered {
            json!({"role": "assistant", "content": "Done."})
        } else {
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "demo__echo__say", "arguments": "{\"text\": \"hi\"}"}}]})
        };
        Ok(json!({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}))
    }
}

fn stack(sink: &Sink) -> Stack {
    let registry = Registry::new();
    let tool = registry
        .register(ToolManifest::from_yaml_str(MANIFEST).unwrap())
        .unwrap();
    registry
        .enable(&ToolOwner::Global, &tool.manifest.id)
        .unwrap();
    let builtin = BuiltinExecutor::new();
    builtin.register("demo.echo.say", handler_fn(|args| async move { Ok(args) }));
    let policy = PolicyConfig {
        rules: vec![PolicyRule {
            effect: PolicyEffect::Allow,
            tenant: "acme".into(),
            actors: vec!["*".into()],
            tools: vec!["*".into()],
            actions: vec!["invoke".into()],
            require_scopes: false,
            obligations: Vec::new(),
        }],
    };
    let invoker = InvokerBuilder::new(
        Arc::new(registry),
        Arc::new(StaticPolicy::new(&policy)),
        Arc::new(LocalQuota::new(&[])),
        Arc::new(HmacConsent::new(
            b"a consent key of at least 32 bytes!".to_vec(),
        )),
        Arc::new(DeclaredProfiles::new()),
        Arc::new(LocalSandbox::new(builtin)),
        Arc::new(sink.clone()),
        Arc::new(MemoryIdempotency::new()),
    )
    .build();
    Stack::builder(invoker).build()
}

async fn converse(stack: &Stack) -> Result<soulbase_edge::Conversation, SoulError> {
    let subject = Subject::new(
        TenantId::new("acme").unwrap(),
        ActorId::new("alice").unwrap(),
    );
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "Say hi."}]});
    stack
        .run_conversation(
            &Model,
            ConversationRequest {
                surface: Surface::Http,
                subject: &subject,
                binding: &Default::default(),
                body: &body,
                system: None,
                max_iterations: 4,
                max_tool_calls: 4,
                max_tokens: None,
                on_tool_call: None,
                skill_info: None,
            },
        )
        .await
}

/// What each record is: `start`, `turn`, `end`, or a call's `begin`/`end`.
fn shape(records: &[EvidenceRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| match &r.payload {
            EvidenceEvent::Conversation(c) => match c.step {
                ConversationStep::Start { .. } => "start".to_owned(),
                ConversationStep::Turn { iteration, .. } => format!("turn {iteration}"),
                ConversationStep::End { reason, .. } => format!("end {}", reason.as_str()),
            },
            EvidenceEvent::Begin(b) => format!("begin {}", b.tool_id),
            EvidenceEvent::End(_) => "call end".to_owned(),
            EvidenceEvent::Denied(_) => "denied".to_owned(),
        })
        .collect()
}

#[tokio::test]
async fn a_conversations_evidence_comes_in_order_around_its_calls() {
    let sink = Sink::default();
    let done = converse(&stack(&sink)).await.unwrap();
    assert_eq!(done.iterations, 2);
    assert_eq!(
        shape(&sink.kept.records()),
        [
            "start",
            "begin demo.echo.say",
            "call end",
            "turn 1",
            "turn 2",
            "end answered"
        ]
    );
    // Every record of the conversation is under its id.
    let own = sink
        .kept
        .records()
        .into_iter()
        .filter(|r| matches!(r.payload, EvidenceEvent::Conversation(_)))
        .all(|r| r.payload.call_id().as_str() == done.id);
    assert!(own);
}

#[tokio::test]
async fn a_conversation_whose_end_is_not_durable_is_not_answered() {
    let sink = Sink::default();
    *sink.refuse_end.lock().unwrap() = true;
    let err = converse(&stack(&sink)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::EvidenceUnavailable, "{err}");
    // The call it made is evidenced; its end is what is missing.
    assert_eq!(
        shape(&sink.kept.records()),
        [
            "start",
            "begin demo.echo.say",
            "call end",
            "turn 1",
            "turn 2"
        ]
    );
}
