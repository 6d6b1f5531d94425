//! CPU time end to end: a WASM skill that loops, behind a real `soulbased`, records
//! the CPU it used in its End evidence, and a `quota.budgets[].cpu_ms` budget
//! charged with it refuses the next call `QUOTA.BUDGET_EXCEEDED` — with the sandbox
//! in the tools process, and again with the sandbox role in its own `soulbased`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;

use common::{Server, http};
use serde_json::{Value, json};

/// `acme` has a day's budget of 5 ms of CPU for the burning tool.
const CONFIG: &str = r#"
server:
  dev_insecure: true
policy:
  rules:
    - { effect: allow, tenant: "*", tools: ["*"], actions: [invoke, read_evidence] }
quota:
  budgets:
    - { tenant: acme, tool: skills.burn.burn, window: day, cpu_ms: 5 }
"#;

/// A skills directory with `burn`, the looping fixture module as a WASM skill.
fn prepare(dir: &Path) {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/wasm");
    let skill = dir.join("skills").join("burn");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::copy(fixtures.join("burn.wasm"), skill.join("burn.wasm")).unwrap();
    // The digest `cargo xtask fixtures` recorded (the executor checks the file).
    let sums = std::fs::read_to_string(fixtures.join("SHA256SUMS")).unwrap();
    let sha = sums
        .lines()
        .find_map(|l| l.strip_suffix("  burn.wasm"))
        .unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        format!(
            "---\nname: burn\ndescription: Spins the CPU, then answers.\nversion: 1.0.0\n\
             provider:\n  type: wasm\n  module: burn.wasm\n  sha256: {sha}\n\
             tools:\n  - name: burn\n    description: Spins the CPU.\n    timeout: 20\n\
             \x20   input_schema: {{type: object}}\n\
             \x20   output_schema: {{type: object}}\n---\n# burn\n\nSpins the CPU.\n"
        ),
    )
    .unwrap();
}

async fn invoke(server: &Server, tenant: &str) -> (u16, Value) {
    let (status, body) = http(
        &server.http,
        "POST",
        "/api/tools/skills.burn.burn/invoke",
        &[("x-soulbase-tenant", tenant), ("x-soulbase-actor", "bob")],
        "{}",
    )
    .await;
    (status, serde_json::from_str(&body).unwrap())
}

/// The End record's `usage` of the call `result` answers, read back over HTTP.
async fn end_usage(server: &Server, tenant: &str, result: &Value) -> Value {
    let call_id = result["call_id"].as_str().unwrap();
    let (status, body) = http(
        &server.http,
        "GET",
        &format!("/api/evidence/{call_id}"),
        &[("x-soulbase-tenant", tenant), ("x-soulbase-actor", "bob")],
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let evidence: Value = serde_json::from_str(&body).unwrap();
    let ends: Vec<&Value> = evidence["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["payload"]["event"] == "end")
        .collect();
    assert_eq!(ends.len(), 1, "{evidence}");
    ends[0]["payload"]["usage"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_budget_is_charged_from_end_evidence_and_then_refuses() {
    let server = Server::start_in(CONFIG, prepare);
    scenario(&server).await;
}

/// The same with the sandbox role in its own `soulbased`: the CPU it measured comes
/// back over `soulbase.sandbox.v1` and is charged in the tools process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cpu_measured_by_a_remote_sandbox_role_is_charged_too() {
    let token = [(
        "SB_TEST_INTERNAL_TOKEN",
        "internal-token-for-tests-0123456789",
    )];
    let addr = common::free_addr();
    let tools = Server::start_env(
        &CONFIG.replace(
            "server:\n",
            &format!(
                "server:\n  roles: [tools, auth, qos, evidence]\n  \
                 internal_token_env: SB_TEST_INTERNAL_TOKEN\n  remote:\n    sandbox: http://{addr}\n"
            ),
        ),
        prepare,
        &token,
    );
    // The sandbox process reads the same skills directory.
    let sandbox_config = format!(
        "{}skills:\n  dir: {}\n",
        CONFIG.replace(
            "server:\n",
            "server:\n  roles: [sandbox]\n  internal_token_env: SB_TEST_INTERNAL_TOKEN\n"
        ),
        tools.dir().join("skills").display()
    );
    let _sandbox = Server::start_at(&sandbox_config, &token, &addr);
    scenario(&tools).await;
}

/// One call uses the budget up; the next is refused; another tenant is not limited.
async fn scenario(server: &Server) {
    let (status, first) = invoke(server, "acme").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["status"], "ok", "{first}");
    assert_eq!(first["output"], json!({"burned": true}));
    let usage = end_usage(server, "acme", &first).await;
    let cpu = usage["cpu_ms"].as_u64().unwrap();
    assert!(cpu >= 5, "the End records {usage}");

    // The budget is used up: refused before running, with the stable code.
    let (_, refused) = invoke(server, "acme").await;
    assert_eq!(refused["status"], "denied", "{refused}");
    assert_eq!(refused["error_code"], "QUOTA.BUDGET_EXCEEDED", "{refused}");

    // Another tenant has no such budget.
    let (status, other) = invoke(server, "globex").await;
    assert_eq!((status, &other["status"]), (200, &json!("ok")), "{other}");

    // The metrics count what each tenant was charged, exactly the End's usage:
    // one executed call for acme (the refusal charged nothing), one for globex.
    let (_, metrics) = http(&server.http, "GET", "/metrics", &[], "").await;
    let charged = |tenant: &str, resource: &str| -> u64 {
        let series = format!(
            "soulbase_budget_consumed_total{{tenant=\"{tenant}\",resource=\"{resource}\"}} "
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .unwrap_or_else(|| panic!("no {series} in {metrics}"))
            .parse()
            .unwrap()
    };
    assert_eq!(charged("acme", "calls"), 1);
    assert_eq!(charged("acme", "cpu_ms"), cpu);
    assert_eq!(
        charged("acme", "bytes_in"),
        usage["bytes_in"].as_u64().unwrap()
    );
    assert_eq!(
        charged("acme", "bytes_out"),
        usage["bytes_out"].as_u64().unwrap()
    );
    assert_eq!(charged("globex", "calls"), 1);
}
