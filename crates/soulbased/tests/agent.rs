//! The governed agent loop (`POST /v1/chat/completions`) against a scripted
//! OpenAI-compatible upstream inside the test (no model can run here): tool calls
//! go through the governed path and their answers — refusals with their stable
//! code included — reach the model's next turn; the iteration bound ends a
//! conversation with its documented answer; an unreachable or slow upstream and a
//! model the tenant may not use are refused with their codes.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{DEV_CONFIG, Server, http, model_turn as turn, scripted_model as upstream};
use serde_json::{Value, json};

const ACME: [(&str, &str); 2] = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "bob")];

fn config(base_url: &str, timeout_ms: u64) -> String {
    format!(
        "{DEV_CONFIG}model:\n  upstream: {{ base_url: \"{base_url}\", timeout_ms: {timeout_ms} }}\n  allow:\n    - {{ tenant: acme, models: [\"gpt-*\"] }}\n"
    )
    // acme may read evidence (conversations included), but not the sleep tool's.
    .replacen(
        "  rules:\n",
        "  rules:\n    - { effect: allow, tenant: acme, tools: [\"*\"], actions: [read_evidence] }\n    \
         - { effect: deny, tenant: acme, tools: [soulbase.builtin.sleep], actions: [read_evidence] }\n",
        1,
    )
}

/// `config` with the skills directory `./skills` (not watched).
fn with_skills(config: &str) -> String {
    config.replacen(
        "server:\n",
        "skills:\n  dir: ./skills\n  watch: false\nserver:\n",
        1,
    )
}

/// A server over `config` with the skills directory holding `greet.yaml`.
fn with_greet_skill(config: &str, greet_yaml: &str) -> Server {
    Server::start_in(&with_skills(config), |dir| {
        std::fs::create_dir_all(dir.join("skills")).unwrap();
        std::fs::write(dir.join("skills/greet.yaml"), greet_yaml).unwrap();
    })
}

/// `GET /api/evidence/{conversation}` as acme: the conversation replayed.
async fn conversation_evidence(server: &Server, conversation: &str) -> Value {
    let (status, text) = http(
        &server.http,
        "GET",
        &format!("/api/evidence/{conversation}"),
        &ACME,
        "",
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert!(
        body["records"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["payload"]["event"] == "conversation"),
        "{body}"
    );
    body["conversation"].clone()
}

fn tool_calls() -> Value {
    turn(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "soulbase__builtin__echo", "arguments": "{\"said\": \"hello\"}"}},
        {"id": "call_2", "type": "function",
         "function": {"name": "soulbase__builtin__sleep", "arguments": "{\"ms\": \"soon\"}"}}
    ]}))
}

async fn chat(server: &Server, body: Value) -> (u16, Value) {
    let (status, text) = http(
        &server.http,
        "POST",
        "/v1/chat/completions",
        &ACME,
        &body.to_string(),
    )
    .await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_runs_the_models_tool_calls_through_the_governed_path() {
    let final_answer = turn(json!({"role": "assistant", "content": "The echo said hello."}));
    // Then tool calls forever (the last response repeats).
    let (base, script) = upstream(vec![tool_calls(), final_answer, tool_calls()]).await;
    let server = Server::start(&config(&base, 10_000));
    let (status, body) = chat(
        &server,
        json!({"model": "gpt-test", "messages": [{"role": "user", "content": "Echo hello."}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "The echo said hello."
    );
    assert_eq!(body["soulbase"]["iterations"], 2);
    assert_eq!(body["soulbase"]["reason"], "answered");
    let made = body["soulbase"]["tool_calls"].as_array().unwrap();
    assert_eq!(made[0]["tool"], "soulbase.builtin.echo");
    assert!(
        made[0]["content"].as_str().unwrap().contains("hello"),
        "{body}"
    );
    assert!(
        made[1]["content"]
            .as_str()
            .unwrap()
            .contains("SCHEMA.VALIDATION_FAILED"),
        "a refused call is answered with its stable code: {body}"
    );

    let seen = script.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    // The first turn: the prompt sections first, the caller's governed tools given.
    let first = &seen[0];
    assert_eq!(first["messages"][0]["role"], "system");
    let system = first["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("## Available Tools") && system.contains("`soulbase__builtin__echo`"),
        "{system}"
    );
    assert!(
        system.contains("Maximum iterations: 8"),
        "the configured default bound: {system}"
    );
    let names: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"soulbase__builtin__echo"), "{names:?}");
    // The second turn sees both answers, in order, after the assistant's turn.
    let messages = seen[1]["messages"].as_array().unwrap();
    let n = messages.len();
    assert_eq!(messages[n - 3]["role"], "assistant");
    assert_eq!(messages[n - 2]["tool_call_id"], "call_1");
    assert_eq!(messages[n - 1]["tool_call_id"], "call_2");
    assert!(
        messages[n - 1]["content"]
            .as_str()
            .unwrap()
            .contains("SCHEMA.VALIDATION_FAILED")
    );

    // The bound: a model that keeps calling tools is stopped, saying so.
    let (status, body) = chat(
        &server,
        json!({"model": "gpt-test", "max_iterations": 1,
               "messages": [{"role": "user", "content": "Echo hello."}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["soulbase"]["reason"], "max_iterations");
    assert_eq!(body["soulbase"]["iterations"], 1);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert!(
        body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .starts_with("Stopped")
    );

    // Refused before any model turn: a model the tenant may not use, a request
    // bringing tools of its own, an iteration bound over the cap.
    for (request, code) in [
        (
            json!({"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}),
            "AUTH.FORBIDDEN",
        ),
        (
            json!({"model": "gpt-test", "tools": [], "messages": [{"role": "user", "content": "hi"}]}),
            "SCHEMA.VALIDATION_FAILED",
        ),
        (
            json!({"model": "gpt-test", "max_iterations": 1000, "messages": [{"role": "user", "content": "hi"}]}),
            "SCHEMA.VALIDATION_FAILED",
        ),
    ] {
        let (_, body) = chat(&server, request).await;
        assert_eq!(body["error"]["code"], code, "{body}");
    }
    assert_eq!(
        script.seen.lock().unwrap().len(),
        3,
        "refusals never reach the model"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_or_slow_upstream_ends_the_conversation_with_its_code() {
    // Nothing listens on a port just released.
    let closed = common::free_addr();
    let server = Server::start(&config(&format!("http://{closed}/v1"), 10_000));
    let (status, body) = chat(
        &server,
        json!({"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (502, Some("PROVIDER.UNAVAILABLE")),
        "{body}"
    );
    // The failed conversation is evidenced, its end naming the code.
    let conversation = body["error"]["fields"]["conversation_id"].as_str().unwrap();
    let c = conversation_evidence(&server, conversation).await;
    assert_eq!(c["end"]["reason"], "upstream_error", "{c}");
    assert_eq!(c["end"]["error_code"], "PROVIDER.UNAVAILABLE", "{c}");
    assert_eq!(c["end"]["iterations"], 0, "{c}");
    assert!(c.get("anomalies").is_none(), "{c}");

    // A listener that accepts and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((sock, _)) = silent.accept().await {
            open.push(sock);
        }
    });
    let server = Server::start(&config(&format!("http://{addr}/v1"), 300));
    let (status, body) = chat(
        &server,
        json!({"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (504, Some("PROVIDER.TIMEOUT")),
        "{body}"
    );
    held.abort();
}

/// The official OpenAI Python client, its `api_key` a Soulbase API key: a plain
/// and a streamed conversation (the chunks parse, the content is the model's
/// final answer after the governed tool call) and a model the tenant may not use
/// (403).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_client_talks_to_the_loop_plain_and_streamed() {
    let final_answer = turn(json!({"role": "assistant", "content": "The echo said hello."}));
    let (base, script) = upstream(vec![
        tool_calls(),
        final_answer.clone(),
        tool_calls(),
        final_answer,
    ])
    .await;
    let subject = soulbase_types::Subject::new(
        soulbase_types::TenantId::new("acme").unwrap(),
        soulbase_types::ActorId::new("py").unwrap(),
    );
    let key = soulbase_auth::generate_api_key("py-agent", &subject);
    let config = format!(
        "{}auth:\n  api_keys:\n    - {{ id: py-agent, sha256: \"{}\", tenant: acme, actor: py }}\n",
        config(&base, 10_000),
        key.config.sha256
    );
    let server = Server::start(&config);
    let url = format!("http://{}/v1", server.http);
    let out = common::run_python("openai_chat.py", &[&url, &key.key]).await;
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen["plain"], "The echo said hello.", "{seen}");
    assert_eq!(seen["plain_summary"]["iterations"], 2, "{seen}");
    assert_eq!(seen["stream"], "The echo said hello.", "{seen}");
    assert_eq!(seen["stream_finish"], "stop");
    assert_eq!(seen["forbidden"], 403);
    assert_eq!(
        script.seen.lock().unwrap().len(),
        4,
        "two turns per conversation"
    );
}

/// Seed 003: a skill disabled between two requests is gone from the second
/// request's tools and prompt sections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_disabled_between_two_requests_is_gone_from_the_second() {
    let final_answer = turn(json!({"role": "assistant", "content": "Done."}));
    let (base, script) = upstream(vec![final_answer]).await;
    let server = with_greet_skill(
        &config(&base, 10_000),
        "name: greet\ndescription: Greets someone by name.\nprovider: builtin\n\
         handler: soulbase.builtin.echo\nparameters:\n  type: object\n",
    );
    let ask = json!({"model": "gpt-test", "messages": [{"role": "user", "content": "Hi."}]});
    let (status, body) = chat(&server, ask.clone()).await;
    assert_eq!(status, 200, "{body}");
    let (status, text) = http(
        &server.http,
        "PATCH",
        "/api/skills/greet",
        &ACME,
        r#"{"enabled": false}"#,
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let (status, body) = chat(&server, ask).await;
    assert_eq!(status, 200, "{body}");

    let seen = script.seen.lock().unwrap().clone();
    let offered = |turn: &Value| -> (Vec<String>, String) {
        let tools = turn["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
            .collect();
        let system = turn["messages"][0]["content"].as_str().unwrap().to_owned();
        (tools, system)
    };
    let (before_tools, before_prompt) = offered(&seen[0]);
    let (after_tools, after_prompt) = offered(&seen[1]);
    assert!(
        before_tools.contains(&"skills__greet__greet".to_owned()),
        "{before_tools:?}"
    );
    assert!(before_prompt.contains("`greet`"), "{before_prompt}");
    assert!(
        !after_tools.iter().any(|t| t.contains("greet")),
        "{after_tools:?}"
    );
    assert!(!after_prompt.contains("greet"), "{after_prompt}");
    assert!(after_tools.contains(&"soulbase__builtin__echo".to_owned()));
}

/// `soulbase chat` against the server: one prompt streamed (each governed tool
/// call shown on stderr as it is answered, the answer on stdout, the loop's
/// summary last); an interactive session (one prompt per stdin line, the
/// conversation so far sent with each); `--json` prints the whole response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soulbase_chat_shows_each_governed_tool_call_and_the_answer() {
    let answer = |text: &str| turn(json!({"role": "assistant", "content": text}));
    let (base, script) = upstream(vec![tool_calls(), answer("Done: echoed.")]).await;
    let server = Server::start(&config(&base, 10_000));
    let url = format!("http://{}", server.http);
    let chat = move |args: Vec<String>, stdin: &'static str| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let mut child = std::process::Command::new(common::cli_bin())
                .args([
                    "chat", "--server", &url, "--tenant", "acme", "--actor", "bob",
                ])
                .args(["--model", "gpt-test"])
                .args(args)
                .env_remove("SOULBASE_SERVER")
                .env_remove("SOULBASE_API_KEY")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            child
                .stdin
                .take()
                .unwrap()
                .write_all(stdin.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            (
                String::from_utf8(out.stdout).unwrap(),
                String::from_utf8(out.stderr).unwrap(),
            )
        })
    };

    let (stdout, stderr) = chat(vec!["Please echo hello.".into()], "").await.unwrap();
    assert_eq!(stdout, "Done: echoed.\n");
    assert!(stderr.contains("tool soulbase.builtin.echo ok"), "{stderr}");
    assert!(
        stderr.contains("tool soulbase.builtin.sleep refused or failed"),
        "{stderr}"
    );
    assert!(stderr.contains("(2 iterations, answered)"), "{stderr}");

    // Interactive: each line a prompt, the conversation so far sent with each.
    let (stdout, _) = chat(Vec::new(), "hi\n\nagain\n").await.unwrap();
    assert_eq!(stdout, "Done: echoed.\nDone: echoed.\n");
    let seen = script.seen.lock().unwrap().clone();
    let last = seen.last().unwrap()["messages"].as_array().unwrap().clone();
    let said: Vec<(&str, &str)> = last
        .iter()
        .filter(|m| m["role"] != "system")
        .map(|m| {
            (
                m["role"].as_str().unwrap(),
                m["content"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        said,
        [
            ("user", "hi"),
            ("assistant", "Done: echoed."),
            ("user", "again")
        ]
    );

    // --json: the whole response, the loop's summary with it.
    let (stdout, _) = chat(vec!["Again.".into(), "--json".into()], "")
        .await
        .unwrap();
    let response: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        response["choices"][0]["message"]["content"],
        "Done: echoed."
    );
    assert_eq!(response["soulbase"]["reason"], "answered", "{response}");
}

/// Seed 002 through the loop: a caller with skills is offered `get_skill_info`;
/// the model reads a skill's SKILL.md (verbatim) before using it, a skill that
/// does not show to the caller is `TOOL.NOT_FOUND`, and the governed calls of
/// the same turn are answered in order around them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_reads_a_skills_instructions_before_using_it() {
    let reads = turn(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_skill_info", "arguments": "{\"name\": \"zodiac\"}"}},
        {"id": "call_2", "type": "function",
         "function": {"name": "soulbase__builtin__echo", "arguments": "{\"n\": 1}"}},
        {"id": "call_3", "type": "function",
         "function": {"name": "get_skill_info", "arguments": "{\"name\": \"nope\"}"}}
    ]}));
    let done = turn(json!({"role": "assistant", "content": "Read it."}));
    let (base, script) = upstream(vec![reads, done]).await;
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/zodiac");
    let server = Server::start_in(&with_skills(&config(&base, 10_000)), |dir| {
        let skill = dir.join("skills/zodiac");
        std::fs::create_dir_all(&skill).unwrap();
        std::fs::copy(repo.join("SKILL.md"), skill.join("SKILL.md")).unwrap();
    });
    let ask = json!({"model": "gpt-test", "messages": [{"role": "user", "content": "Chart?"}]});
    let (status, body) = chat(&server, ask).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "Read it.");

    let seen = script.seen.lock().unwrap().clone();
    let offered: Vec<&str> = seen[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(offered.contains(&"get_skill_info"), "{offered:?}");
    let answers: Vec<&Value> = seen[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    let ids: Vec<&str> = answers
        .iter()
        .map(|m| m["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["call_1", "call_2", "call_3"]);
    let skill_md = std::fs::read_to_string(repo.join("SKILL.md")).unwrap();
    assert_eq!(answers[0]["content"], skill_md.as_str());
    assert!(answers[1]["content"].as_str().unwrap().contains("echo"));
    let refused: Value = serde_json::from_str(answers[2]["content"].as_str().unwrap()).unwrap();
    assert_eq!(refused["error"]["code"], "TOOL.NOT_FOUND", "{refused}");

    // The governed call's Begin names the conversation and the model turn.
    let conversation = body["soulbase"]["conversation_id"].as_str().unwrap();
    assert!(conversation.starts_with("conv_"), "{body}");
    let c = conversation_evidence(&server, conversation).await;
    let calls = &c["turns"][0]["calls"];
    assert!(calls[0].get("replay").is_none(), "answered in place: {c}");
    let call = calls[1]["replay"]["call_id"].as_str().unwrap();
    let path = format!("/api/evidence/{call}");
    let (status, text) = http(&server.http, "GET", &path, &ACME, "").await;
    assert_eq!(status, 200, "{text}");
    let evidence: Value = serde_json::from_str(&text).unwrap();
    let begin = evidence["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["payload"]["event"] == "begin")
        .unwrap_or_else(|| panic!("{evidence}"));
    assert_eq!(
        begin["payload"]["conversation"],
        json!({"id": conversation, "iteration": 1}),
        "{begin}"
    );

    // Without skills (no skills directory), the tool is not offered.
    let (base, script) = upstream(vec![turn(json!({"role": "assistant", "content": "Hi."}))]).await;
    let plain = Server::start(&config(&base, 10_000));
    let ask = json!({"model": "gpt-test", "messages": [{"role": "user", "content": "Hi."}]});
    assert_eq!(chat(&plain, ask).await.0, 200);
    let seen = script.seen.lock().unwrap().clone();
    assert!(!seen[0].to_string().contains("get_skill_info"));
}

/// A conversation's budgets (`model.max_tool_calls`, `model.max_tokens`): calls
/// past the tool-call budget are refused in place with `QUOTA.BUDGET_EXCEEDED`
/// (the model's next turn sees it), and a conversation past its token budget
/// ends with reason `budget`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_keeps_within_its_tool_call_and_token_budgets() {
    let with_usage = |mut t: Value, tokens: u64| {
        t["usage"] = json!({"prompt_tokens": tokens / 2, "completion_tokens": tokens / 2, "total_tokens": tokens});
        t
    };
    let two_calls = turn(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_a", "type": "function",
         "function": {"name": "soulbase__builtin__echo", "arguments": "{\"n\": 1}"}},
        {"id": "call_b", "type": "function",
         "function": {"name": "soulbase__builtin__echo", "arguments": "{\"n\": 2}"}}
    ]}));
    let done = turn(json!({"role": "assistant", "content": "Done."}));
    let (base, script) = upstream(vec![
        with_usage(two_calls.clone(), 60),
        with_usage(done, 60),
    ])
    .await;
    let budgets =
        |extra: &str| config(&base, 10_000).replacen("model:\n", &format!("model:\n{extra}"), 1);
    let server = Server::start(&budgets("  max_tool_calls: 1\n"));
    let ask = json!({"model": "gpt-test", "messages": [{"role": "user", "content": "Twice."}]});
    let (status, body) = chat(&server, ask.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["soulbase"]["reason"], "answered", "{body}");
    let seen = script.seen.lock().unwrap().clone();
    let answers: Vec<Value> = seen[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .cloned()
        .collect();
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert!(answers[0]["content"].as_str().unwrap().contains("\"echo\""));
    let refused: Value = serde_json::from_str(answers[1]["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        refused["error"]["code"], "QUOTA.BUDGET_EXCEEDED",
        "{refused}"
    );

    // 60 tokens a turn against 100: the second turn ends the conversation.
    let (base, _script) = upstream(vec![with_usage(two_calls, 60)]).await;
    let config = config(&base, 10_000).replacen("model:\n", "model:\n  max_tokens: 100\n", 1);
    let server = Server::start(&config);
    let (status, body) = chat(&server, ask).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["soulbase"]["reason"], "budget", "{body}");
    assert_eq!(body["soulbase"]["iterations"], 2, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Stopped: the conversation used its token budget."
    );
    let c = conversation_evidence(
        &server,
        body["soulbase"]["conversation_id"].as_str().unwrap(),
    )
    .await;
    assert_eq!(
        (&c["end"]["reason"], &c["end"]["tokens"]),
        (&json!("budget"), &json!(120))
    );
}

/// Model turns are charged through the quota seam as calls of
/// `soulbase.model.turn`: a tenant's budget on them refuses the turn past it
/// (`QUOTA.BUDGET_EXCEEDED`), the conversation ending with reason `refused`; a
/// budget on every tool (`*`) does not count them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_turns_are_charged_through_the_quota_seam() {
    let (base, script) = upstream(vec![tool_calls()]).await;
    let config = config(&base, 10_000).replacen(
        "quota:\n",
        "quota:\n  budgets:\n    - { tenant: acme, tool: soulbase.model.turn, window: day, calls: 2 }\n    \
         - { tenant: acme, tool: \"*\", window: day, calls: 2 }\n",
        1,
    );
    let server = Server::start(&config);
    let ask = json!({"model": "gpt-test", "messages": [{"role": "user", "content": "Echo."}]});
    let (status, body) = chat(&server, ask).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "QUOTA.BUDGET_EXCEEDED", "{body}");
    assert!(
        body["error"]["fields"]["budget"]
            .as_str()
            .unwrap()
            .contains("soulbase.model.turn"),
        "{body}"
    );
    assert_eq!(
        script.seen.lock().unwrap().len(),
        2,
        "the third turn never left"
    );
    let c = conversation_evidence(
        &server,
        body["error"]["fields"]["conversation_id"].as_str().unwrap(),
    )
    .await;
    assert_eq!(c["end"]["reason"], "refused", "{c}");
    assert_eq!(c["end"]["error_code"], "QUOTA.BUDGET_EXCEEDED", "{c}");
    assert_eq!(c["end"]["iterations"], 2, "{c}");
    // The tools' budget (2 calls on `*`) counted the two echo calls, not the turns.
    let echoes: Vec<&Value> = c["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["calls"][0])
        .collect();
    assert!(
        echoes
            .iter()
            .all(|e| e["replay"]["outcome"]["status"] == "ok"),
        "{c}"
    );
}

/// The loop's own evidence: start, each model turn (response digest, reported
/// tokens, its tool calls with the call ids their evidence is under), end with
/// its reason; `GET /api/evidence/{conversation}` and `soulbase evidence replay`
/// rebuild it in order, every call replayed from its own evidence (a call whose
/// tool's evidence the caller may not read is shown `withheld`; the operator's
/// CLI reads it all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_is_evidenced_and_replays_every_turn_and_call_in_order() {
    let with_usage = |mut t: Value, prompt: u64, completion: u64| {
        t["usage"] = json!({"prompt_tokens": prompt, "completion_tokens": completion,
                            "total_tokens": prompt + completion});
        t
    };
    let final_answer = turn(json!({"role": "assistant", "content": "The echo said hello."}));
    let (base, _script) = upstream(vec![
        with_usage(tool_calls(), 20, 10),
        with_usage(final_answer, 30, 5),
    ])
    .await;
    let server = Server::start(&config(&base, 10_000));
    let (status, body) = chat(
        &server,
        json!({"model": "gpt-test", "messages": [{"role": "user", "content": "Echo hello."}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let id = body["soulbase"]["conversation_id"].as_str().unwrap();
    assert!(id.starts_with("conv_"), "{id}");

    let c = conversation_evidence(&server, id).await;
    assert_eq!(c["conversation_id"], id);
    assert_eq!(c["model"], "gpt-test");
    let turns = c["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "{c}");
    assert_eq!(turns[0]["iteration"], 1);
    assert_eq!(
        turns[0]["tokens"],
        json!({"prompt": 20, "completion": 10, "total": 30})
    );
    let calls = turns[0]["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{c}");
    assert_eq!(
        (calls[0]["id"].as_str(), calls[0]["tool"].as_str()),
        (Some("call_1"), Some("soulbase.builtin.echo"))
    );
    let echo = &calls[0]["replay"];
    assert_eq!(echo["outcome"]["kind"], "executed", "{c}");
    assert_eq!(echo["outcome"]["tool_id"], "soulbase.builtin.echo");
    assert_eq!(echo["outcome"]["status"], "ok");
    assert_ne!(
        echo["call_id"], "call_1",
        "a conversation's calls get call ids of their own"
    );
    // The sleep call was refused in preflight; its evidence is withheld from acme.
    assert_eq!(calls[1]["code"], "SCHEMA.VALIDATION_FAILED");
    assert_eq!(calls[1]["withheld"], true, "{c}");
    assert!(calls[1].get("replay").is_none(), "{c}");
    assert_eq!(turns[1]["iteration"], 2);
    assert!(turns[1].get("calls").is_none(), "{c}");
    assert_eq!(c["end"]["reason"], "answered");
    assert_eq!(
        (
            &c["end"]["iterations"],
            &c["end"]["tool_calls"],
            &c["end"]["tokens"]
        ),
        (&json!(2), &json!(2), &json!(65))
    );
    assert!(c.get("anomalies").is_none(), "{c}");

    // The operator's replay reads the database: the same conversation, the
    // refused call replayed too.
    let out = common::cli(server.dir(), &["evidence", "replay", id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let replayed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(replayed["turns"][0]["calls"][0], calls[0]);
    assert_eq!(
        replayed["turns"][0]["calls"][1]["replay"]["outcome"]["kind"],
        "denied"
    );
    assert_eq!(replayed["end"], c["end"]);
    // As text: every turn and call in order.
    let out = common::cli_text(server.dir(), &["evidence", "replay", id]);
    let text = String::from_utf8_lossy(&out.stdout);
    let order = [
        "started",
        "turn 1",
        "tool call call_1 soulbase.builtin.echo",
        "tool call call_2 soulbase.builtin.sleep SCHEMA.VALIDATION_FAILED",
        "turn 2",
        "answered after 2 turn(s), 2 tool call(s), 65 token(s)",
    ];
    let at: Vec<usize> = order
        .iter()
        .map(|s| {
            text.find(s)
                .unwrap_or_else(|| panic!("{s:?} missing from:\n{text}"))
        })
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "out of order:\n{text}");
}

/// A model that fills an optional argument with `null` — as OpenAI strict mode
/// makes it, optional ⇒ nullable — has the null taken back against the tool's
/// own schema before the call is checked: the call runs, the model's next turn
/// sees its answer, and the conversation answers after two iterations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_mode_null_is_restored_before_the_call_is_checked() {
    let greets = turn(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "skills__greet__greet",
         "arguments": "{\"name\": \"Ada\", \"loud\": null}"}}
    ]}));
    let final_answer = turn(json!({"role": "assistant", "content": "Greeted Ada."}));
    let (base, script) = upstream(vec![greets, final_answer]).await;
    let server = with_greet_skill(
        &config(&base, 10_000),
        "name: greet\ndescription: Greets someone by name.\nprovider: builtin\n\
         handler: soulbase.builtin.echo\nparameters:\n  type: object\n  \
         properties:\n    name: {type: string}\n    loud: {type: boolean}\n  \
         required: [name]\n  additionalProperties: false\n",
    );
    let ask = json!({"model": "gpt-test", "messages": [{"role": "user", "content": "Greet Ada."}]});
    let (status, body) = chat(&server, ask).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["soulbase"]["iterations"], 2, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "Greeted Ada.");
    let seen = script.seen.lock().unwrap().clone();
    let answer = seen[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .cloned()
        .unwrap();
    let content: Value = serde_json::from_str(answer["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        content["echo"],
        json!({"name": "Ada"}),
        "the null is gone, the call ran: {content}"
    );
}

/// A tool answering content blocks (`output_content`; here the conformance
/// pack's image tool) reaches the model described — media type and size —
/// not as base64 it cannot see but would pay for; the evidence and other
/// surfaces are unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_blocks_reach_the_model_described_not_as_base64() {
    let shows = turn(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {
         "name": "soulbase__conformance__image_content", "arguments": "{}"}}
    ]}));
    let final_answer = turn(json!({"role": "assistant", "content": "A red pixel."}));
    let (base, script) = upstream(vec![shows, final_answer]).await;
    let config =
        config(&base, 10_000).replacen("server:\n", "server:\n  mcp_conformance_tools: true\n", 1);
    let server = Server::start(&config);
    let ask = json!({"model": "gpt-test", "messages": [{"role": "user", "content": "Show me."}]});
    let (status, body) = chat(&server, ask).await;
    assert_eq!(status, 200, "{body}");
    let seen = script.seen.lock().unwrap().clone();
    let answer = seen[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .cloned()
        .unwrap();
    let content: Value = serde_json::from_str(answer["content"].as_str().unwrap()).unwrap();
    let image = content["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "image")
        .cloned()
        .unwrap_or_else(|| panic!("{content}"));
    let data = image["data"].as_str().unwrap();
    assert!(
        data.starts_with("[image/png, ") && data.ends_with(" bytes, not shown to the model]"),
        "{data}"
    );
    assert!(
        !answer["content"]
            .as_str()
            .unwrap()
            .contains(soulbase_app::conformance::PNG),
        "no base64 reaches the model"
    );
}
