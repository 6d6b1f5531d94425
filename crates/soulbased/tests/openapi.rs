//! The OpenAPI contract of the HTTP API, `docs/openapi.json` (generated from the
//! code by `soulbased::openapi`, whose unit tests hold the committed file to it):
//! it describes exactly the router's routes (`http_api::ROUTES`), the server
//! serves it at `/api/openapi.json`, and a real `soulbased` fuzzed against it by
//! schemathesis (a standard tool, not ours; from the venv `.ci/python-tools`
//! installs, `SOULBASE_PYTHON_TOOLS`) keeps it: no 5xx, only documented statuses,
//! content types and response bodies.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use common::{Server, http, python};
use serde_json::Value;
use soulbased::http_api::ROUTES;

/// Dev identity headers on; `acme` may do everything, reading evidence too, but
/// invoke the builtin sleep (fuzzed arguments could make it wait 30 s).
const CONFIG: &str = r#"
server:
  dev_insecure: true
skills:
  dir: ./skills
  watch: false
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"], actions: [invoke, preflight, register, update, unregister, enable, disable, deprecate, reload, read_evidence] }
    - { effect: deny, tenant: acme, tools: ["soulbase.builtin.sleep"], actions: [invoke] }
"#;

const ACME: [(&str, &str); 2] = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "dev")];

/// The methods a path item may hold (OpenAPI 3.1), as HTTP spells them.
const METHODS: [&str; 8] = [
    "GET", "PUT", "POST", "DELETE", "OPTIONS", "HEAD", "PATCH", "TRACE",
];

/// `skills/` with a descriptor skill binding the builtin echo and a package of
/// instructions only, so the skill routes have something to show.
fn prepare(dir: &Path) {
    let skills = dir.join("skills");
    std::fs::create_dir_all(skills.join("guide")).unwrap();
    std::fs::write(
        skills.join("greet.yaml"),
        "name: greet\ndescription: Greets someone by name.\nprovider: builtin\n\
         handler: soulbase.builtin.echo\nparameters:\n  type: object\n  properties:\n    \
         name: {type: string}\n",
    )
    .unwrap();
    std::fs::write(
        skills.join("guide").join("SKILL.md"),
        "---\nname: guide\ndescription: How to greet people well.\n---\n# Guide\n\nGreet by name.\n",
    )
    .unwrap();
}

fn document_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
}

fn document() -> Value {
    serde_json::from_str(&std::fs::read_to_string(document_path()).unwrap()).unwrap()
}

/// Every (METHOD, path) the document describes.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in METHODS {
            if item.get(method.to_lowercase()).is_some() {
                ops.insert((method.to_owned(), path.clone()));
            }
        }
    }
    ops
}

#[test]
fn the_document_describes_exactly_the_routes_and_codes() {
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    let routes: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|r| (r.method.as_str().to_owned(), r.path.to_owned()))
        .collect();
    assert_eq!(operations(&doc), routes);
    // The stable codes, all of them, in table order.
    let codes: Vec<&str> = soulbase_errors::CODES.iter().map(|c| c.id).collect();
    let documented: Vec<&str> = doc["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(documented, codes);
    // Every status a stable code is answered with is documented somewhere.
    let text = doc.to_string();
    for spec in soulbase_errors::CODES {
        assert!(
            text.contains(&format!("\"{}\":", spec.http_status)),
            "{} answers {}, which no operation documents",
            spec.id,
            spec.http_status
        );
    }
}

/// `path` with each `{param}` replaced by `value`.
fn concrete(path: &str, value: &str) -> String {
    path.split('/')
        .map(|s| if s.starts_with('{') { value } else { s })
        .collect::<Vec<_>>()
        .join("/")
}

async fn json(server: &Server, method: &str, path: &str, body: &str) -> (u16, Value) {
    let (status, text) = http(&server.http, method, path, &ACME, body).await;
    let v = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{method} {path}: {status} is not JSON ({e}): {text}"));
    (status, v)
}

/// Runs schemathesis (`st run`) on `location` against `server` with the dev identity
/// and `args`; its output.
async fn schemathesis(server: &Server, location: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(python());
    cmd.args(["-m", "schemathesis.cli", "run", location])
        .args(["--url", &format!("http://{}", server.http)])
        .args([
            "-H",
            "x-soulbase-tenant: acme",
            "-H",
            "x-soulbase-actor: dev",
        ])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,\
             response_schema_conformance",
        ])
        .args(["--generation-with-security-parameters", "false"])
        .args(["--generation-database", "none", "--no-color"])
        .args(args)
        .current_dir(server.dir())
        .env("NO_PROXY", "*");
    for k in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
    ] {
        cmd.env_remove(k);
    }
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_server_keeps_the_contract() {
    let doc = document();
    let server = Server::start_in(CONFIG, prepare);

    // The document is served as committed, to anyone.
    let (status, served) = http(&server.http, "GET", "/api/openapi.json", &[], "").await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&served).unwrap(), doc);

    // Each documented path answers exactly its documented methods: the others
    // are 405, and none is the unknown-route 404.
    let ops = operations(&doc);
    let paths: BTreeSet<&String> = ops.iter().map(|(_, p)| p).collect();
    for path in paths {
        let at = concrete(path, "x");
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
            let (status, text) = http(&server.http, method, &at, &ACME, "{}").await;
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            let field = &v["error"]["fields"]["field"];
            if ops.contains(&(method.to_owned(), path.clone())) {
                assert!(
                    !(status == 405 || status == 404 && field == "path"),
                    "{method} {path} is documented but not served: {status} {v}"
                );
            } else {
                assert_eq!(
                    (status, field.as_str()),
                    (405, Some("method")),
                    "{method} {path}: {v}"
                );
            }
        }
    }

    // A path parameter that is not UTF-8 names nothing, and is answered like any
    // other unknown or malformed one, in JSON (schemathesis only sends UTF-8).
    let (status, v) = json(&server, "POST", "/api/tools/%FF/invoke", "{}").await;
    assert_eq!((status, &v["status"]), (404, &Value::from("denied")), "{v}");
    assert_eq!(v["error_code"], "TOOL.NOT_FOUND");
    assert_eq!(v["error"]["fields"]["tool_id"], "\u{FFFD}", "{v}");
    let (status, v) = json(&server, "POST", "/api/tools/a%FFb/preflight", "{}").await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (404, &Value::from("TOOL.NOT_FOUND")),
        "{v}"
    );
    for (method, path, body) in [
        ("GET", "/api/skills/%FF", ""),
        ("PATCH", "/api/skills/%FF", r#"{"enabled":true}"#),
    ] {
        let (status, v) = json(&server, method, path, body).await;
        assert_eq!(
            (status, &v["error"]["code"]),
            (404, &Value::from("TOOL.NOT_FOUND")),
            "{v}"
        );
    }
    let (status, v) = json(&server, "GET", "/api/evidence/%C3%28", "").await;
    assert_eq!(
        (status, &v["error"]["fields"]["field"]),
        (400, &Value::from("call_id")),
        "{v}"
    );

    // The fuzz: every operation of the committed file (which the server serves,
    // as checked above), in every phase, bounded, with a fixed seed so a verdict
    // is reproducible.
    let started = Instant::now();
    let out = schemathesis(
        &server,
        document_path().to_str().unwrap(),
        &[
            "--phases",
            "examples,coverage,fuzzing,stateful",
            "--max-examples",
            "50",
            "--seed",
            "1",
            "--request-timeout",
            "10",
        ],
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "schemathesis found a breach of the contract:\n{report}"
    );
    let n = ROUTES.len();
    assert!(
        stdout.contains(&format!("Tested: {n}")),
        "not every operation was tested:\n{report}"
    );
    eprintln!("schemathesis took {:?}", started.elapsed());

    // And the run fails when the server breaks the contract: here, a document
    // promising what `/healthz` never answers.
    let mut broken = doc.clone();
    broken["components"]["schemas"]["Status"]["required"] = serde_json::json!(["status", "uptime"]);
    let file = server.dir().join("broken-openapi.json");
    std::fs::write(&file, broken.to_string()).unwrap();
    let out = schemathesis(
        &server,
        file.to_str().unwrap(),
        &[
            "--include-path",
            "/healthz",
            "--phases",
            "examples,fuzzing",
            "--max-examples",
            "1",
        ],
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "a breach went unnoticed:\n{stdout}");
    assert!(stdout.contains("Response violates schema"), "{stdout}");
}
