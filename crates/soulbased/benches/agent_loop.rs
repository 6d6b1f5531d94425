//! The agent loop's own cost per iteration, the model excluded
//! (`cargo xtask bench -p soulbased --bench agent_loop`).
//!
//! `soulbased`'s assembly (the default configuration: sync evidence in the spool
//! draining into SQLite, in a temporary data directory) runs conversations of
//! ten model turns through `Stack::run_conversation` against an in-process model
//! that answers at once: nine turns each asking for one governed call of the
//! builtin echo, then a final answer. One sample is the time between two model
//! turns — the loop's whole work for an iteration: reading the turn, the
//! governed call (with its Begin and End), the turn's evidence, the next
//! request. The floor in the same run is the governed echo call alone
//! (`Stack::invoke`), so the loop's own share is the difference.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use soulbase_config::ConfigLoader;
use soulbase_edge::{CallRequest, ConversationRequest, ModelUpstream, Surface};
use soulbase_errors::SoulError;
use soulbase_types::{ActorId, Subject, TenantId};
use soulbased::app::App;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns per conversation.
const TURNS: usize = 10;
/// Conversations measured (after a warm-up).
const CONVERSATIONS: usize = 300;

/// A model that answers at once: a call of the echo until its last turn, and
/// notes when each turn was asked for.
#[derive(Default)]
struct InstantModel {
    asked: Mutex<Vec<Instant>>,
}

#[async_trait]
impl ModelUpstream for InstantModel {
    async fn complete(&self, _request: &Value) -> Result<Value, SoulError> {
        let mut asked = self.asked.lock().unwrap();
        asked.push(Instant::now());
        let message = if asked.len().is_multiple_of(TURNS) {
            json!({"role": "assistant", "content": "Done."})
        } else {
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("call_{}", asked.len()), "type": "function",
                 "function": {"name": "soulbase__builtin__echo", "arguments": "{\"n\": 1}"}}]})
        };
        Ok(
            json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "bench",
                  "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}),
        )
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let data = tempfile::tempdir().unwrap();
        let loader = ConfigLoader::new()
            .with_flag("data_dir", data.path().to_str().unwrap())
            .with_flag("server.dev_insecure", "true")
            .with_flag(
                "policy.rules",
                r#"[{"effect":"allow","tenant":"acme","tools":["*"]}]"#,
            );
        let (app, _flush) = App::build(loader, Default::default()).await.unwrap();
        let subject = Subject::new(
            TenantId::new("acme").unwrap(),
            ActorId::new("bench").unwrap(),
        );
        let body = json!({"model": "bench", "messages": [{"role": "user", "content": "Echo."}]});

        // The floor: the governed echo call alone.
        let call = || {
            CallRequest::new(
                Surface::Http,
                subject.clone(),
                "soulbase.builtin.echo",
                json!({"n": 1}),
            )
        };
        for _ in 0..300 {
            assert!(app.stack.invoke(call()).await.is_ok());
        }
        let mut floor = Vec::with_capacity(3000);
        for _ in 0..3000 {
            let t = Instant::now();
            assert!(app.stack.invoke(call()).await.is_ok());
            floor.push(t.elapsed());
        }
        let floor = soulbase_testkit::report("governed echo call (floor)", floor);

        let model = InstantModel::default();
        let binding = Default::default();
        let run = || async {
            let done = app
                .stack
                .run_conversation(
                    &model,
                    ConversationRequest {
                        surface: Surface::Http,
                        subject: &subject,
                        binding: &binding,
                        body: &body,
                        system: None,
                        max_iterations: TURNS as u32,
                        max_tool_calls: TURNS as u32,
                        max_tokens: None,
                        on_tool_call: None,
                        skill_info: None,
                    },
                )
                .await
                .unwrap();
            assert_eq!(done.iterations as usize, TURNS);
            assert_eq!(done.reason.as_str(), "answered");
        };
        for _ in 0..30 {
            run().await;
        }
        model.asked.lock().unwrap().clear();
        let started = Instant::now();
        for _ in 0..CONVERSATIONS {
            run().await;
        }
        let elapsed = started.elapsed();
        let asked = model.asked.lock().unwrap().clone();
        assert_eq!(asked.len(), CONVERSATIONS * TURNS);
        // Between the turns of one conversation (not across two).
        let iterations: Vec<Duration> = asked
            .chunks(TURNS)
            .flat_map(|turns| turns.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>())
            .collect();
        let loop_ = soulbase_testkit::report("agent loop, one iteration", iterations);
        println!(
            "agent loop: {CONVERSATIONS} conversations of {TURNS} turns in {elapsed:.2?}; \
             the loop's own share per iteration: p50 {:.2?} ({:.2}x the governed call)",
            loop_.p50.saturating_sub(floor.p50),
            loop_.p50.as_secs_f64() / floor.p50.as_secs_f64()
        );
    });
}
