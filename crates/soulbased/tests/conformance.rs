//! One governed call behind every door: each refusal that can happen before
//! execution gives the same stable code on HTTP, gRPC, MCP over streamable HTTP,
//! MCP over stdio, the CLI's local mode and a split-roles deployment, leaves
//! exactly one `Denied` evidence record and no Begin/End, and preflight agrees
//! with invoke; every list a caller sees is its governed list.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;

use common::{Server, cli, http};
use http::{HeaderName, HeaderValue};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, RequestMetaObject};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use soulbase_auth::{IssuedApiKey, generate_api_key};
use soulbase_grpc::proto;
use soulbase_types::{ActorId, Subject, TenantId};

/// Who makes a call: `bob` holds no scopes, `eve` may act as skill `zodiac`.
#[derive(Clone, Copy, PartialEq)]
enum Who {
    Bob,
    Eve,
}

/// One refusal: the call and the stable code every door must answer.
struct Row {
    name: &'static str,
    who: Who,
    tool: &'static str,
    args: Value,
    traceparent: Option<&'static str>,
    skill: Option<&'static str>,
    code: &'static str,
}

fn rows() -> Vec<Row> {
    let row = |name, tool, args, code| Row {
        name,
        who: Who::Bob,
        tool,
        args,
        traceparent: None,
        skill: None,
        code,
    };
    vec![
        row(
            "malformed tool id",
            "Not A Tool!",
            json!({}),
            "TOOL.NOT_FOUND",
        ),
        row(
            "unknown tool",
            "acme.nope.tool",
            json!({}),
            "TOOL.NOT_FOUND",
        ),
        row(
            "policy denies the tool",
            "soulbase.builtin.sleep",
            json!({"ms": 1}),
            "POLICY.DENY_TOOL",
        ),
        row(
            "arguments against the schema",
            "skills.note.note",
            json!({"text": 5}),
            "SCHEMA.VALIDATION_FAILED",
        ),
        row(
            "keyed tool without a key",
            "soulbase.builtin.counter",
            json!({}),
            "SCHEMA.VALIDATION_FAILED",
        ),
        Row {
            traceparent: Some("garbage"),
            ..row(
                "malformed traceparent",
                "soulbase.builtin.echo",
                json!({}),
                "SCHEMA.VALIDATION_FAILED",
            )
        },
        row(
            "subscription required",
            "skills.zodiac.calculate_zodiac",
            json!({"birth_date": "1990-07-04"}),
            "SUBSCRIPTION.REQUIRED",
        ),
        row(
            "disabled skill",
            "skills.off.off",
            json!({"text": "x"}),
            "TOOL.DISABLED",
        ),
        Row {
            who: Who::Eve,
            skill: Some("zodiac"),
            ..row(
                "skill does not import the tool",
                "skills.jungastro.interpret_chart",
                json!({"sun_sign": "leo", "moon_sign": "leo", "rising_sign": "leo"}),
                "SKILL.NOT_IMPORTED",
            )
        },
        Row {
            skill: Some("zodiac"),
            ..row(
                "skill binding without its scope",
                "skills.zodiac.get_chart_snapshot",
                json!({}),
                "AUTH.FORBIDDEN",
            )
        },
    ]
}

struct Keys {
    bob: IssuedApiKey,
    eve: IssuedApiKey,
}

impl Keys {
    fn new() -> Self {
        let acme = |actor: &str| {
            Subject::new(TenantId::new("acme").unwrap(), ActorId::new(actor).unwrap())
        };
        Keys {
            bob: generate_api_key("kbob", &acme("bob")),
            eve: generate_api_key("keve", &acme("eve")),
        }
    }

    fn of(&self, who: Who) -> &str {
        match who {
            Who::Bob => &self.bob.key,
            Who::Eve => &self.eve.key,
        }
    }
}

fn config(keys: &Keys) -> String {
    format!(
        r#"
auth:
  api_keys:
    - {{ id: kbob, sha256: "{}", tenant: acme, actor: bob }}
    - {{ id: keve, sha256: "{}", tenant: acme, actor: eve, scopes: ["skill:zodiac"] }}
skills:
  dir: ./skills
  watch: false
policy:
  rules:
    - {{ effect: allow, tenant: acme, tools: ["*"], actions: [invoke, read_evidence, enable, disable] }}
    - {{ effect: deny, tenant: acme, tools: ["soulbase.builtin.sleep"], actions: [invoke] }}
"#,
        keys.bob.config.sha256, keys.eve.config.sha256
    )
}

fn note(name: &str) -> String {
    format!(
        "name: {name}\ndescription: Echo a note.\nprovider: builtin\nhandler: soulbase.builtin.echo\n\
         risk_level: read\nparameters:\n  type: object\n  properties:\n    text: {{type: string}}\n"
    )
}

/// `skills/` with the repository's zodiac + jungastro pair and two builtin notes.
fn prepare(dir: &Path) {
    let skills = dir.join("skills");
    for s in ["zodiac", "jungastro"] {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../skills/{s}/SKILL.md"));
        std::fs::create_dir_all(skills.join(s)).unwrap();
        std::fs::copy(repo, skills.join(s).join("SKILL.md")).unwrap();
    }
    std::fs::write(skills.join("note.yaml"), note("note")).unwrap();
    std::fs::write(skills.join("off.yaml"), note("off")).unwrap();
}

/// What a door answered: the stable code and the call id, when it names one.
#[derive(Debug)]
struct Answer {
    code: String,
    call_id: Option<String>,
}

async fn over_http(server: &Server, keys: &Keys, row: &Row, what: &str) -> (u16, Value) {
    let mut headers = vec![("x-api-key", keys.of(row.who))];
    if let Some(tp) = row.traceparent {
        headers.push(("traceparent", tp));
    }
    if let Some(s) = row.skill {
        headers.push(("x-soulbase-skill", s));
    }
    let path = format!("/api/tools/{}/{what}", row.tool.replace(' ', "%20"));
    let (status, text) = http(&server.http, "POST", &path, &headers, &row.args.to_string()).await;
    (status, serde_json::from_str(&text).unwrap())
}

fn grpc_request(keys: &Keys, row: &Row) -> tonic::Request<proto::InvokeRequest> {
    let mut r = tonic::Request::new(proto::InvokeRequest {
        tool_id: row.tool.into(),
        arguments_json: row.args.to_string(),
        traceparent: row.traceparent.unwrap_or_default().into(),
        calling_skill: row.skill.unwrap_or_default().into(),
        ..Default::default()
    });
    r.metadata_mut()
        .insert("x-api-key", keys.of(row.who).parse().unwrap());
    r
}

fn grpc_answer(status: &tonic::Status) -> Answer {
    Answer {
        code: common::code_of(status),
        call_id: status
            .metadata()
            .get("x-soulbase-call-id")
            .map(|v| v.to_str().unwrap().to_owned()),
    }
}

fn mcp_request(row: &Row) -> CallToolRequestParams {
    let mut params =
        CallToolRequestParams::new(row.tool).with_arguments(row.args.as_object().cloned().unwrap());
    if let Some(tp) = row.traceparent {
        let mut meta = RequestMetaObject::new();
        meta.0.0.insert("traceparent".into(), json!(tp));
        params.meta = Some(meta);
    }
    params
}

fn mcp_answer(result: &rmcp::model::CallToolResult) -> Answer {
    assert_eq!(result.is_error, Some(true), "{result:?}");
    let body = result.structured_content.clone().unwrap();
    Answer {
        code: body["code"].as_str().unwrap().to_owned(),
        call_id: body["correlation_id"].as_str().map(str::to_owned),
    }
}

async fn mcp_http_client(
    server: &Server,
    keys: &Keys,
    row: &Row,
) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    let mut headers = HashMap::new();
    headers.insert(
        HeaderName::from_static("x-api-key"),
        HeaderValue::from_str(keys.of(row.who)).unwrap(),
    );
    if let Some(s) = row.skill {
        headers.insert(
            HeaderName::from_static("x-soulbase-skill"),
            HeaderValue::from_str(s).unwrap(),
        );
    }
    let config =
        StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", server.http))
            .custom_headers(headers);
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .unwrap()
}

/// `soulbased mcp` over stdio in `dir` for acme/`actor`, bound to `skill` by the
/// operator.
async fn mcp_stdio_client(
    dir: &Path,
    actor: &str,
    skill: Option<&str>,
) -> (
    rmcp::service::RunningService<rmcp::RoleClient, ()>,
    tokio::process::Child,
) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_soulbased"));
    for (k, _) in std::env::vars() {
        if k.starts_with("SOULBASE_") {
            cmd.env_remove(k);
        }
    }
    cmd.current_dir(dir)
        .arg("--config")
        .arg(dir.join("config.yaml"))
        .args(["mcp", "--tenant", "acme", "--actor", actor]);
    if let Some(s) = skill {
        cmd.args(["--skill", s]);
    }
    let mut child = cmd
        .env("RUST_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    (().serve((stdout, stdin)).await.unwrap(), child)
}

/// The kinds of the evidence records of `call_id` (read from the database, the
/// server stopped).
fn evidence_kinds(dir: &Path, call_id: &str) -> Vec<String> {
    common::evidence_lines(dir, call_id)
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["payload"]["event"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_door_refuses_alike_and_evidences_once() {
    let keys = Keys::new();
    let mut server = Server::start_in(&config(&keys), prepare);
    let (status, v) = json_answer(
        http(
            &server.http,
            "PATCH",
            "/api/skills/off",
            &[("x-api-key", keys.bob.key.as_str())],
            r#"{"enabled": false}"#,
        )
        .await,
    );
    assert_eq!(status, 200, "{v}");

    // (row, door, answer)
    let mut answers: Vec<(&'static str, &'static str, Answer)> = Vec::new();
    let mut invoker = server.invoker().await;
    for row in &rows() {
        let (status, v) = over_http(&server, &keys, row, "invoke").await;
        assert_ne!(status, 200, "{}: {v}", row.name);
        assert_eq!(v["status"], "denied", "{}: {v}", row.name);
        assert!(v.get("evidence_ref").is_none(), "{}: {v}", row.name);
        answers.push((
            row.name,
            "http",
            Answer {
                code: v["error_code"].as_str().unwrap().to_owned(),
                call_id: v["call_id"].as_str().map(str::to_owned),
            },
        ));
        let (_, v) = over_http(&server, &keys, row, "preflight").await;
        answers.push((
            row.name,
            "http preflight",
            Answer {
                code: v["error"]["code"].as_str().unwrap().to_owned(),
                call_id: None,
            },
        ));
        let status = invoker.invoke(grpc_request(&keys, row)).await.unwrap_err();
        answers.push((row.name, "grpc", grpc_answer(&status)));
        let status = invoker
            .preflight(grpc_request(&keys, row))
            .await
            .unwrap_err();
        answers.push((
            row.name,
            "grpc preflight",
            Answer {
                call_id: None,
                ..grpc_answer(&status)
            },
        ));
        let client = mcp_http_client(&server, &keys, row).await;
        let result = client.call_tool(mcp_request(row)).await.unwrap();
        answers.push((row.name, "mcp http", mcp_answer(&result)));
        client.cancel().await.unwrap();
    }

    // gRPC through grpcio, a standard client: every refusal decoded by
    // grpcio-status as a google.rpc.Status whose ErrorInfo.reason is the code;
    // the services listed through grpcio-reflection (v1alpha).
    for ((name, door), a) in grpcio_answers(&server, &keys) {
        answers.push((name, door, a));
    }

    // The doors that open the server's own data: stdio and the CLI's local mode.
    server.stop();
    let dir = server.dir().to_path_buf();
    for row in &rows() {
        // A skill disabled through the API is disabled in that server process only
        // (the catalog does not persist it), so a new process serves it enabled.
        if row.name == "disabled skill" {
            continue;
        }
        // An operator's stdio binding is trusted: the scope row is an HTTP/gRPC claim.
        if row.code != "AUTH.FORBIDDEN" {
            let actor = if row.who == Who::Eve { "eve" } else { "bob" };
            let (client, mut child) = mcp_stdio_client(&dir, actor, row.skill).await;
            let result = client.call_tool(mcp_request(row)).await.unwrap();
            answers.push((row.name, "mcp stdio", mcp_answer(&result)));
            client.cancel().await.unwrap();
            assert!(child.wait().await.unwrap().success());
        }
        // The CLI acts for bob with no skill and sends no trace context; a tool id
        // it cannot parse is its own usage error (exit 2) before any call.
        if row.who == Who::Bob
            && row.skill.is_none()
            && row.traceparent.is_none()
            && row.name != "malformed tool id"
        {
            let args = row.args.to_string();
            let out = cli(&dir, &["invoke", row.tool, "--args", &args]);
            assert_eq!(out.status.code(), Some(1), "{}", row.name);
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            answers.push((
                row.name,
                "cli",
                Answer {
                    code: v["error_code"].as_str().unwrap().to_owned(),
                    call_id: v["call_id"].as_str().map(str::to_owned),
                },
            ));
            let out = cli(&dir, &["preflight", row.tool, "--args", &args]);
            assert_eq!(out.status.code(), Some(1), "{}", row.name);
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            answers.push((
                row.name,
                "cli preflight",
                Answer {
                    code: stderr.split(':').next().unwrap().trim().to_owned(),
                    call_id: None,
                },
            ));
        }
    }

    // One code per refusal, whatever the door (preflight included).
    for row in &rows() {
        for (_, door, a) in answers.iter().filter(|(n, _, _)| *n == row.name) {
            assert_eq!(a.code, row.code, "{} over {door}", row.name);
        }
    }
    // Exactly one Denied record per call, no Begin or End.
    let mut checked = 0;
    for (name, door, a) in answers.iter().filter(|(_, d, _)| !d.ends_with("preflight")) {
        let id = a
            .call_id
            .as_deref()
            .unwrap_or_else(|| panic!("{name} over {door} names no call"));
        assert_eq!(
            evidence_kinds(&dir, id),
            ["denied"],
            "{name} over {door} ({id})"
        );
        checked += 1;
    }
    assert!(checked >= rows().len() * 4, "{checked}");
}

/// Every row over gRPC (invoke and preflight) from grpcio: ((row, door), answer).
fn grpcio_answers(server: &Server, keys: &Keys) -> Vec<((&'static str, &'static str), Answer)> {
    use prost::Message;
    let rows = rows();
    let mut cases = Vec::new();
    for row in &rows {
        let request = grpc_request(keys, row);
        let metadata: Vec<[String; 2]> = request
            .metadata()
            .iter()
            .filter_map(|kv| match kv {
                tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                    Some([k.to_string(), v.to_str().unwrap().to_owned()])
                }
                tonic::metadata::KeyAndValueRef::Binary(..) => None,
            })
            .collect();
        let bytes = request.into_inner().encode_to_vec();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        for method in ["Invoke", "Preflight"] {
            cases.push(json!({
                "name": row.name,
                "method": format!("/soulbase.tools.v1.ToolInvoker/{method}"),
                "request": hex,
                "metadata": metadata,
            }));
        }
    }
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/grpcio_refusals.py"
    );
    let mut child = std::process::Command::new(common::python())
        .arg(script)
        .arg(&server.grpc)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(Value::from(cases).to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "grpcio_refusals.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let services: Vec<&str> = v["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    for s in [
        "soulbase.tools.v1.ToolInvoker",
        "soulbase.tools.v1.ToolRegistry",
        "grpc.health.v1.Health",
    ] {
        assert!(
            services.contains(&s),
            "{s} not listed by reflection: {services:?}"
        );
    }
    let answers = v["answers"].as_array().unwrap();
    assert_eq!(answers.len(), rows.len() * 2);
    answers
        .iter()
        .zip(
            rows.iter()
                .flat_map(|r| [(r, "grpcio"), (r, "grpcio preflight")]),
        )
        .map(|(a, (row, door))| {
            assert_eq!(a["name"], row.name);
            assert_eq!(a["domain"], "soulbase.dev", "{}: {a}", row.name);
            assert!(a["status_code"].as_i64().unwrap() > 0, "{}: {a}", row.name);
            let call_id = (door == "grpcio").then(|| a["call_id"].as_str().unwrap().to_owned());
            (
                (row.name, door),
                Answer {
                    code: a["reason"].as_str().unwrap_or_default().to_owned(),
                    call_id,
                },
            )
        })
        .collect()
}

fn json_answer((status, text): (u16, String)) -> (u16, Value) {
    (status, serde_json::from_str(&text).unwrap())
}

/// Policy allows 3 of the tools: every list shows exactly those 3.
const THREE: &str = r#"
server:
  dev_insecure: true
skills:
  dir: ./skills
  watch: false
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["soulbase.builtin.echo", "soulbase.builtin.counter", "skills.note.note"], actions: [invoke] }
"#;

fn prepare_notes(dir: &Path) {
    let skills = dir.join("skills");
    std::fs::create_dir_all(&skills).unwrap();
    std::fs::write(skills.join("note.yaml"), note("note")).unwrap();
    std::fs::write(skills.join("other.yaml"), note("other")).unwrap();
}

const ALLOWED: [&str; 3] = [
    "skills.note.note",
    "soulbase.builtin.counter",
    "soulbase.builtin.echo",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_list_is_the_callers_governed_list() {
    let mut server = Server::start_in(THREE, prepare_notes);
    let acme = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "bob")];
    // HTTP.
    let (status, v) = json_answer(http(&server.http, "GET", "/api/tools", &acme, "").await);
    assert_eq!(status, 200, "{v}");
    let ids: Vec<&str> = v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ALLOWED);
    // The skills list shows only the skill whose tool the caller may call.
    let (_, v) = json_answer(http(&server.http, "GET", "/api/skills", &acme, "").await);
    let names: Vec<&str> = v["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["note"]);
    // The operator's view needs the administration action.
    let (_, v) = json_answer(http(&server.http, "GET", "/api/tools?state=paused", &acme, "").await);
    assert_eq!(v["tools"], json!([]), "{v}");
    // gRPC.
    let mut registry = server.registry().await;
    let listed = registry
        .list_tools(common::as_dev(
            proto::ListToolsRequest::default(),
            "acme",
            "bob",
        ))
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<String> = listed.tools.iter().map(|t| t.id.clone()).collect();
    assert_eq!(ids, ALLOWED);
    // GetTool is governed like the list: a tool the caller may not list is not there.
    let get = |id: &str| proto::GetToolRequest {
        tool_id: id.into(),
        include_manifest: false,
    };
    let st = registry
        .get_tool(common::as_dev(get("soulbase.builtin.sleep"), "acme", "bob"))
        .await
        .unwrap_err();
    assert_eq!(common::code_of(&st), "TOOL.NOT_FOUND");
    registry
        .get_tool(common::as_dev(get("soulbase.builtin.echo"), "acme", "bob"))
        .await
        .unwrap();
    // MCP over streamable HTTP: the model is offered exactly these.
    let mut headers = HashMap::new();
    headers.insert(
        HeaderName::from_static("x-soulbase-tenant"),
        HeaderValue::from_static("acme"),
    );
    headers.insert(
        HeaderName::from_static("x-soulbase-actor"),
        HeaderValue::from_static("bob"),
    );
    let config =
        StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", server.http))
            .custom_headers(headers);
    let client = ().serve(StreamableHttpClientTransport::from_config(config)).await.unwrap();
    let mut names: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .filter(|n| n.contains('.'))
        .collect();
    names.sort();
    assert_eq!(names, ALLOWED);
    client.cancel().await.unwrap();
    // MCP over stdio and the CLI, on the same configuration.
    server.stop();
    let dir = server.dir().to_path_buf();
    let (client, mut child) = mcp_stdio_client(&dir, "bob", None).await;
    let mut names: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .filter(|n| n.contains('.'))
        .collect();
    names.sort();
    assert_eq!(names, ALLOWED);
    client.cancel().await.unwrap();
    assert!(child.wait().await.unwrap().success());
    let out = cli(&dir, &["tools", "list"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<&str> = v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ALLOWED);
}

/// Cedar decides `preflight` and `list` as actions of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cedar_forbids_on_preflight_and_list_take_effect() {
    let config = r#"
server:
  dev_insecure: true
auth:
  cedar:
    policies: |
      permit(principal in Soul::Tenant::"acme", action, resource);
      forbid(principal, action == Soul::Action::"preflight", resource == Soul::Tool::"soulbase.builtin.echo");
      forbid(principal, action == Soul::Action::"list", resource == Soul::Tool::"soulbase.builtin.sleep");
"#;
    let server = Server::start(config);
    let acme = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "bob")];
    let (status, v) = json_answer(
        http(
            &server.http,
            "POST",
            "/api/tools/soulbase.builtin.echo/preflight",
            &acme,
            "{}",
        )
        .await,
    );
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["code"], "POLICY.DENY_TOOL");
    let (status, v) = json_answer(
        http(
            &server.http,
            "POST",
            "/api/tools/soulbase.builtin.echo/invoke",
            &acme,
            "{}",
        )
        .await,
    );
    assert_eq!(status, 200, "invoke is still allowed: {v}");
    let (_, v) = json_answer(http(&server.http, "GET", "/api/tools", &acme, "").await);
    let ids: Vec<&str> = v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"soulbase.builtin.echo"), "{ids:?}");
    assert!(!ids.contains(&"soulbase.builtin.sleep"), "{ids:?}");
}

/// Unknown routes and wrong methods answer in the JSON error envelope; an
/// unknown evidence id has its own not-found code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_and_evidence_reads_answer_in_the_envelope() {
    let server = Server::start(common::DEV_CONFIG);
    let acme = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "bob")];
    let (status, v) = json_answer(http(&server.http, "GET", "/api/nothing", &acme, "").await);
    assert_eq!(status, 404);
    assert_eq!(v["error"]["fields"]["field"], "path", "{v}");
    let (status, v) = json_answer(http(&server.http, "DELETE", "/api/tools", &acme, "").await);
    assert_eq!(status, 405);
    assert_eq!(v["error"]["fields"]["field"], "method", "{v}");
    let (status, v) = json_answer(
        http(
            &server.http,
            "GET",
            "/api/evidence/call_0123456789abcdef0123456789abcdef",
            &acme,
            "",
        )
        .await,
    );
    assert_eq!(status, 404);
    assert_eq!(v["error"]["code"], "EVIDENCE.NOT_FOUND", "{v}");
}

/// rmcp's client passes an idempotency key in `_meta`: the keyed tool runs once
/// across retries of that key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_tool_over_mcp_runs_once_per_meta_key() {
    let server = Server::start(common::DEV_CONFIG);
    let mut headers = HashMap::new();
    headers.insert(
        HeaderName::from_static("x-soulbase-tenant"),
        HeaderValue::from_static("acme"),
    );
    headers.insert(
        HeaderName::from_static("x-soulbase-actor"),
        HeaderValue::from_static("bob"),
    );
    let config =
        StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", server.http))
            .custom_headers(headers);
    let client = ().serve(StreamableHttpClientTransport::from_config(config)).await.unwrap();
    let keyed = |key: &str| {
        let mut meta = RequestMetaObject::new();
        meta.0
            .0
            .insert("soulbase/idempotencyKey".into(), json!(key));
        let mut p = CallToolRequestParams::new("soulbase.builtin.counter")
            .with_arguments(serde_json::Map::new());
        p.meta = Some(meta);
        p
    };
    let mut counts = Vec::new();
    for key in ["rmcp-1", "rmcp-1", "rmcp-1", "rmcp-2"] {
        let r = client.call_tool(keyed(key)).await.unwrap();
        assert_ne!(r.is_error, Some(true), "{r:?}");
        counts.push(r.structured_content.unwrap()["count"].as_u64().unwrap());
    }
    assert_eq!(counts[0], counts[1]);
    assert_eq!(counts[0], counts[2]);
    assert_eq!(counts[3], counts[0] + 1);
    client.cancel().await.unwrap();
}

const TOKEN_ENV: &str = "SB_TEST_INTERNAL_TOKEN";
const TOKEN: &str = "internal-token-for-tests-0123456789";

/// `config` served as `roles` only, behind the internal token.
fn serving(config: &str, roles: &str) -> String {
    format!("server:\n  roles: [{roles}]\n  internal_token_env: {TOKEN_ENV}\n{config}")
}

/// The event kinds the evidence role stores for `call_id` of `acme`, once the
/// tools process's spool has drained them there (bounded wait).
async fn stored_kinds(evidence: &Server, call_id: &str) -> Vec<String> {
    use soulbase_observe::EvidenceStore;
    let remote = soulbase_grpc::RemoteEvidence::new(evidence.channel().await, Some(TOKEN.into()));
    let tenant = TenantId::new("acme").unwrap();
    let id = soulbase_types::CallId::new(call_id).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let records = remote.call(Some(&tenant), &id).await.unwrap().records;
        if !records.is_empty() || std::time::Instant::now() >= deadline {
            return records
                .iter()
                .map(|r| {
                    serde_json::to_value(r).unwrap()["payload"]["event"]
                        .as_str()
                        .unwrap()
                        .to_owned()
                })
                .collect();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The same refusals through a split deployment: a tools process whose auth and
/// quota, sandbox and evidence each run in a process of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_split_deployment_refuses_alike_and_evidences_once() {
    let keys = Keys::new();
    let token = [(TOKEN_ENV, TOKEN)];
    let policy = Server::start_env(&serving(&config(&keys), "auth, qos"), |_| {}, &token);
    let sandbox = Server::start_env(&serving("", "sandbox"), |_| {}, &token);
    let evidence = Server::start_env(&serving("", "evidence"), |_| {}, &token);
    let tools_config = format!(
        "server:\n  roles: [tools]\n  internal_token_env: {TOKEN_ENV}\n  remote:\n    auth: http://{}\n    qos: http://{}\n    sandbox: http://{}\n    evidence: http://{}\nskills:\n  dir: ./skills\n  watch: false\n",
        policy.grpc, policy.grpc, sandbox.grpc, evidence.grpc
    );
    let tools = Server::start_env(&tools_config, prepare, &token);
    let (status, v) = json_answer(
        http(
            &tools.http,
            "PATCH",
            "/api/skills/off",
            &[("x-api-key", keys.bob.key.as_str())],
            r#"{"enabled": false}"#,
        )
        .await,
    );
    assert_eq!(status, 200, "{v}");
    let mut invoker = tools.invoker().await;
    let mut ids = Vec::new();
    for row in &rows() {
        let (_, v) = over_http(&tools, &keys, row, "invoke").await;
        assert_eq!(v["error_code"], row.code, "{} over http: {v}", row.name);
        ids.push((row.name, "http", v["call_id"].as_str().unwrap().to_owned()));
        let (_, v) = over_http(&tools, &keys, row, "preflight").await;
        assert_eq!(
            v["error"]["code"], row.code,
            "{} http preflight: {v}",
            row.name
        );
        let a = grpc_answer(&invoker.invoke(grpc_request(&keys, row)).await.unwrap_err());
        assert_eq!(a.code, row.code, "{} over grpc", row.name);
        ids.push((row.name, "grpc", a.call_id.unwrap()));
        let a = grpc_answer(
            &invoker
                .preflight(grpc_request(&keys, row))
                .await
                .unwrap_err(),
        );
        assert_eq!(a.code, row.code, "{} grpc preflight", row.name);
        let client = mcp_http_client(&tools, &keys, row).await;
        let a = mcp_answer(&client.call_tool(mcp_request(row)).await.unwrap());
        client.cancel().await.unwrap();
        assert_eq!(a.code, row.code, "{} over mcp", row.name);
        ids.push((row.name, "mcp", a.call_id.unwrap()));
    }
    for (name, door, id) in &ids {
        assert_eq!(
            stored_kinds(&evidence, id).await,
            ["denied"],
            "{name} over {door} ({id})"
        );
    }
}
