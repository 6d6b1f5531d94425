//! `soulbase chat`: a conversation through the server's governed agent loop
//! (`POST /v1/chat/completions` of its HTTP API): the model gets the caller's
//! governed tools and prompt sections, its tool calls run through the governed
//! path, and each is shown as it is answered.
//!
//! With a prompt, one exchange; without, an interactive session reading one
//! prompt per line from stdin (the conversation so far sent with each). The
//! answer goes to stdout, the tool calls and the loop's summary (iterations, why
//! it ended) to stderr. `--json` prints each whole response instead (not
//! streamed).

use std::io::BufRead;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::{Value, json};

use crate::http;
use crate::options::{Common, OutputArgs};
use crate::target::{self, Failure, Global};

/// Arguments of `soulbase chat`.
#[derive(Debug, Args)]
pub struct ChatArgs {
    /// The prompt; without one, prompts are read from stdin, one per line.
    prompt: Option<String>,
    /// The server's HTTP URL (its --http-addr, e.g. http://127.0.0.1:8080).
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// API key sent as x-api-key (default: $SOULBASE_API_KEY).
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// JWT sent as `authorization: Bearer …` (default: $SOULBASE_TOKEN).
    #[arg(long, value_name = "JWT")]
    token: Option<String>,
    /// On a development server: the tenant sent as x-soulbase-tenant.
    #[arg(long)]
    tenant: Option<String>,
    /// On a development server: the actor sent as x-soulbase-actor.
    #[arg(long)]
    actor: Option<String>,
    /// The model (one the tenant may use: `model.allow`).
    #[arg(long)]
    model: String,
    /// Model turns at most for each prompt (default: the server's
    /// `model.max_iterations`).
    #[arg(long)]
    max_iterations: Option<u32>,
    /// A system message put before the conversation.
    #[arg(long)]
    system: Option<String>,
    /// `--json`: each response whole, not streamed.
    #[command(flatten)]
    output: OutputArgs,
}

/// Runs `soulbase chat`; `common` are the options given before the subcommand.
pub fn run(common: Common, args: ChatArgs) -> ExitCode {
    let global = Global {
        server: args.server.clone().or(common.server),
        api_key: args.api_key.clone().or(common.api_key),
        token: args.token.clone().or(common.token),
        tenant: args.tenant.clone().or(common.tenant),
        actor: args.actor.clone().or(common.actor),
        config: None,
        skills_dir: None,
        json: args.output.json || common.json,
    };
    let done = target::runtime().and_then(|rt| rt.block_on(session(&global, &args)));
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => f.report(),
    }
}

async fn session(global: &Global, args: &ChatArgs) -> Result<(), Failure> {
    let Some(url) = global.server.clone() else {
        return Err(Failure::Usage(
            "soulbase chat needs --server URL: the server's HTTP address".into(),
        ));
    };
    let mut messages: Vec<Value> = Vec::new();
    if let Some(system) = &args.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    if let Some(prompt) = &args.prompt {
        messages.push(json!({"role": "user", "content": prompt}));
        exchange(global, args, &url, &messages).await?;
        return Ok(());
    }
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.map_err(|e| Failure::Failed(format!("UNKNOWN.INTERNAL: stdin: {e}")))?;
        let prompt = line.trim();
        if prompt.is_empty() {
            continue;
        }
        messages.push(json!({"role": "user", "content": prompt}));
        let answer = exchange(global, args, &url, &messages).await?;
        messages.push(json!({"role": "assistant", "content": answer}));
    }
    Ok(())
}

/// One request through the loop; the assistant's answer.
async fn exchange(
    global: &Global,
    args: &ChatArgs,
    url: &str,
    messages: &[Value],
) -> Result<String, Failure> {
    let mut body = json!({"model": args.model, "messages": messages, "stream": !global.json});
    if let Some(n) = args.max_iterations {
        body["max_iterations"] = json!(n);
    }
    // A conversation may take many model turns: the server bounds it.
    let client = http::client(Duration::from_secs(600))?;
    let request = http::authed(
        client
            .post(http::endpoint(url, "/v1/chat/completions")?)
            .header("content-type", "application/json")
            .body(body.to_string()),
        global,
    )?;
    if global.json {
        let response = http::json_answer(request, url).await?;
        println!(
            "{}",
            serde_json::to_string_pretty(&response).unwrap_or_default()
        );
        return Ok(answer_of(&response).to_owned());
    }
    streamed(request, url).await
}

fn answer_of(response: &Value) -> &str {
    response
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Reads the server-sent events of a streamed conversation: each `: tool …`
/// comment is a tool call answered (shown on stderr), `data:` chunks carry the
/// answer (printed as it comes) and, last, the loop's summary.
async fn streamed(request: reqwest::RequestBuilder, url: &str) -> Result<String, Failure> {
    use std::io::Write;
    let mut response = request
        .send()
        .await
        .map_err(|e| Failure::Failed(format!("PROVIDER.UNAVAILABLE: cannot reach {url}: {e}")))?;
    if !response.status().is_success() {
        let status = response.status();
        let bytes = response.bytes().await.unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes)
            .map_err(|_| Failure::Failed(format!("UNKNOWN.INTERNAL: {url} answered {status}")))?;
        return Err(http::refusal(&body));
    }
    let mut pending = String::new();
    let mut answer = String::new();
    let mut stdout = std::io::stdout();
    loop {
        let chunk = response.chunk().await.map_err(|e| {
            Failure::Failed(format!(
                "PROVIDER.UNAVAILABLE: {url} stopped answering: {e}"
            ))
        })?;
        let Some(chunk) = chunk else { break };
        pending.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            for line in event.lines() {
                if let Some(note) = line.strip_prefix(": tool ") {
                    eprintln!("  tool {note}");
                } else if let Some(data) = line.strip_prefix("data: ") {
                    if data == "[DONE]" {
                        continue;
                    }
                    let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
                    if v.get("error").is_some() {
                        return Err(http::refusal(&v));
                    }
                    if let Some(text) = v
                        .pointer("/choices/0/delta/content")
                        .and_then(Value::as_str)
                    {
                        answer.push_str(text);
                        print!("{text}");
                        let _ = stdout.flush();
                    }
                    if let Some(summary) = v.get("soulbase").filter(|s| !s.is_null()) {
                        eprintln!(
                            "  ({} iterations, {})",
                            summary["iterations"],
                            summary["reason"].as_str().unwrap_or("answered")
                        );
                    }
                }
            }
        }
    }
    println!();
    Ok(answer)
}
