//! The audit of changes on a real `soulbased`: a skill disabled and enabled over
//! HTTP, the configuration changed (by the file watcher and by `POST
//! /api/reload`), the skills directory reloaded and the registry changed over
//! gRPC are each one record — who, what, hashes before and after — read back
//! with `GET /api/audit` and the real `soulbase audit list` (from the server and
//! from the database once it stopped). A tenant sees only its own records; a
//! refused change leaves none.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::process::Command;

use common::{Server, as_dev, cli, cli_bin, code_of, http};
use serde_json::{Value, json};
use soulbase_grpc::proto::{self, OwnerScope};

/// Dev identities. `acme` administers everything and reads its audit; `globex`
/// registers its own tools and reads its audit; `limited` may only invoke; the
/// `global` tenant's `ops` is the operator, who reads every tenant's audit.
/// Skills are not watched: only an explicit reload applies the directory.
const CONFIG: &str = r#"
server:
  dev_insecure: true
skills:
  dir: ./skills
  watch: false
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"], actions: [invoke, preflight, register, update, unregister, enable, disable, deprecate, reload, read_evidence] }
    - { effect: allow, tenant: globex, tools: ["*"], actions: [invoke, register, enable, read_evidence] }
    - { effect: allow, tenant: limited, tools: ["*"] }
    - { effect: allow, tenant: global, tools: ["soulbase.server.audit"], actions: [read_evidence] }
"#;

const ACME: [(&str, &str); 2] = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "bob")];
const GLOBEX: [(&str, &str); 2] = [("x-soulbase-tenant", "globex"), ("x-soulbase-actor", "eve")];
const LIMITED: [(&str, &str); 2] = [
    ("x-soulbase-tenant", "limited"),
    ("x-soulbase-actor", "lou"),
];
const OPS: [(&str, &str); 2] = [("x-soulbase-tenant", "global"), ("x-soulbase-actor", "ops")];

fn note(name: &str, description: &str) -> String {
    format!(
        "name: {name}\ndescription: {description}\nprovider: builtin\nhandler: soulbase.builtin.echo\n\
         risk_level: read\nparameters:\n  type: object\n  properties:\n    text: {{type: string}}\n"
    )
}

fn prepare(dir: &Path) {
    let skills = dir.join("skills");
    std::fs::create_dir_all(&skills).unwrap();
    std::fs::write(skills.join("note.yaml"), note("note", "Echo a note.")).unwrap();
}

async fn json_of(
    server: &Server,
    method: &str,
    path: &str,
    who: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    let (status, text) = http(&server.http, method, path, who, body).await;
    let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {status} {text}"));
    (status, v)
}

/// `GET /api/audit?{query}` as `who`: the records.
async fn audit(server: &Server, who: &[(&str, &str)], query: &str) -> Vec<Value> {
    let (status, v) = json_of(server, "GET", &format!("/api/audit?{query}"), who, "").await;
    assert_eq!(status, 200, "{query}: {v}");
    v["records"].as_array().unwrap().clone()
}

/// Polls the operator's view of `kind` records until `cond` holds, failing after 20 s.
async fn eventually(server: &Server, kind: &str, cond: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let query = format!("kind={kind}");
    let seen = std::sync::Mutex::new(Vec::new());
    common::eventually(&format!("{kind} records"), || async {
        let records = audit(server, &OPS, &query).await;
        let held = cond(&records);
        *seen.lock().unwrap() = records;
        held
    })
    .await;
    seen.into_inner().unwrap()
}

fn manifest(id: &str) -> String {
    json!({
        "id": id, "version": "1.0.0", "description": "a demo tool backed by the echo handler",
        "input_schema": {"type": "object"}, "output_schema": {"type": "object"},
        "side_effect": "none",
        "provider": {"type": "builtin", "handler": "soulbase.builtin.echo"}
    })
    .to_string()
}

async fn register(
    server: &Server,
    tenant: &str,
    actor: &str,
    id: &str,
) -> Result<(), tonic::Status> {
    server
        .registry()
        .await
        .register_tool(as_dev(
            proto::RegisterToolRequest {
                manifest: manifest(id),
                owner: OwnerScope::Tenant as i32,
                enable: true,
            },
            tenant,
            actor,
        ))
        .await
        .map(drop)
}

/// (kind, tenant, actor_tenant/actor, target) of each record.
fn summary(records: &[Value]) -> Vec<(String, String, String, String)> {
    records
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().unwrap().to_owned(),
                r["tenant"].as_str().unwrap().to_owned(),
                format!(
                    "{}/{}",
                    r["actor_tenant"].as_str().unwrap(),
                    r["actor"].as_str().unwrap()
                ),
                r["target"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn is_hash(v: &Value) -> bool {
    v.as_str()
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `soulbase audit list` against the running server's HTTP API as `who`.
fn cli_remote(server: &Server, tenant: &str, actor: &str, extra: &[&str]) -> Value {
    let mut cmd = Command::new(cli_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("SOULBASE_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .current_dir(server.dir())
        .args([
            "audit",
            "list",
            "--server",
            &format!("http://{}", server.http),
        ])
        .args(["--tenant", tenant, "--actor", actor, "--json"])
        .args(extra)
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "soulbase audit list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_is_one_record_and_each_tenant_reads_its_own() {
    let mut server = Server::start_in(CONFIG, prepare);
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;

    // Nothing has changed yet.
    assert!(audit(&server, &OPS, "").await.is_empty());

    // A skill disabled and enabled over HTTP: two records, by acme/bob, global.
    for enabled in [false, true] {
        let (status, v) = json_of(
            &server,
            "PATCH",
            "/api/skills/note",
            &ACME,
            &json!({"enabled": enabled}).to_string(),
        )
        .await;
        assert_eq!(status, 200, "{v}");
    }
    // Enabling an enabled skill changes nothing, and a refused change records nothing.
    let (status, _) = json_of(
        &server,
        "PATCH",
        "/api/skills/note",
        &ACME,
        r#"{"enabled": true}"#,
    )
    .await;
    assert_eq!(status, 200);
    let (status, v) = json_of(
        &server,
        "PATCH",
        "/api/skills/note",
        &LIMITED,
        r#"{"enabled": false}"#,
    )
    .await;
    assert_eq!(status, 403, "{v}");
    let skills = audit(&server, &OPS, "target=note").await;
    assert_eq!(
        summary(&skills),
        vec![
            (
                "skill.enable".into(),
                "global".into(),
                "acme/bob".into(),
                "note".into()
            ),
            (
                "skill.disable".into(),
                "global".into(),
                "acme/bob".into(),
                "note".into()
            ),
        ]
    );
    // The hashes chain: disabled → enabled returns to the first state.
    let (enable, disable) = (&skills[0], &skills[1]);
    assert!(is_hash(&disable["before_hash"]) && is_hash(&disable["after_hash"]));
    assert_eq!(enable["before_hash"], disable["after_hash"]);
    assert_eq!(enable["after_hash"], disable["before_hash"]);
    assert!(enable["at"].as_i64().unwrap() >= started);

    // The registry changed through the admin path (gRPC), by two tenants; a
    // refused registration leaves nothing.
    register(&server, "acme", "bob", "acme.demo.tool")
        .await
        .unwrap();
    register(&server, "globex", "eve", "globex.demo.tool")
        .await
        .unwrap();
    let refused = register(&server, "limited", "lou", "limited.demo.tool")
        .await
        .unwrap_err();
    assert_eq!(code_of(&refused), "POLICY.DENY_TOOL");
    server
        .registry()
        .await
        .set_tool_state(as_dev(
            proto::SetToolStateRequest {
                tool_id: "acme.demo.tool".into(),
                owner: OwnerScope::Tenant as i32,
                change: proto::StateChange::Pause as i32,
            },
            "acme",
            "bob",
        ))
        .await
        .unwrap();

    // A tenant reads its own records only, and may not ask for another's.
    let acme = audit(&server, &ACME, "").await;
    assert_eq!(
        summary(&acme),
        vec![
            (
                "registry.state".into(),
                "acme".into(),
                "acme/bob".into(),
                "acme.demo.tool".into()
            ),
            (
                "registry.register".into(),
                "acme".into(),
                "acme/bob".into(),
                "acme.demo.tool".into()
            ),
        ]
    );
    assert_eq!(acme[1]["before_hash"], Value::Null);
    assert_eq!(acme[0]["before_hash"], acme[1]["after_hash"]);
    assert!(
        acme[0]["detail"]
            .as_str()
            .unwrap()
            .contains("enabled → version 1.0.0, paused"),
        "{acme:?}"
    );
    let globex = audit(&server, &GLOBEX, "").await;
    assert_eq!(
        summary(&globex),
        vec![(
            "registry.register".into(),
            "globex".into(),
            "globex/eve".into(),
            "globex.demo.tool".into()
        )]
    );
    let (status, v) = json_of(&server, "GET", "/api/audit?tenant=globex", &ACME, "").await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (403, &json!("AUTH.FORBIDDEN")),
        "{v}"
    );
    assert_eq!(v["error"]["fields"]["field"], "tenant");
    // Reading needs read_evidence on soulbase.server.audit.
    let (status, v) = json_of(&server, "GET", "/api/audit", &LIMITED, "").await;
    assert_eq!(status, 403, "{v}");
    // Bad query values name their field.
    for (query, field) in [
        ("kind=registry.explode", "kind"),
        ("limit=0", "limit"),
        ("since=yesterday", "since"),
        ("since=9&until=3", "since"),
        ("tenant=a%20b", "tenant"),
        ("color=red", "query"),
    ] {
        let (status, v) = json_of(&server, "GET", &format!("/api/audit?{query}"), &ACME, "").await;
        assert_eq!(status, 400, "{query}: {v}");
        assert_eq!(v["error"]["code"], "SCHEMA.VALIDATION_FAILED", "{query}");
        assert_eq!(v["error"]["fields"]["field"], field, "{query}");
    }
    // The operator sees every tenant's; nothing of the refused changes.
    let all = audit(&server, &OPS, "").await;
    assert_eq!(all.len(), 5, "{all:?}");
    assert!(all.iter().all(|r| r["actor"] != "lou"), "{all:?}");
    assert_eq!(
        summary(&audit(&server, &OPS, "tenant=globex").await),
        summary(&globex)
    );

    // The file watcher applies an edited configuration: one record, the system's,
    // with the configuration hashes and the changed keys.
    let edited = CONFIG.replace(
        "policy:\n",
        "quota:\n  limits:\n    - { tenant: limited, tool: soulbase.builtin.echo, rate: 5/min }\npolicy:\n",
    );
    std::fs::write(server.config_path(), &edited).unwrap();
    let config = eventually(&server, "config.reload", |r| !r.is_empty()).await;
    assert_eq!(
        summary(&config),
        vec![(
            "config.reload".into(),
            "global".into(),
            "global/system".into(),
            server.config_path().display().to_string()
        )]
    );
    assert!(is_hash(&config[0]["before_hash"]) && is_hash(&config[0]["after_hash"]));
    assert_eq!(config[0]["detail"], "changed: quota.limits");

    // An invalid file is rejected by the watcher and by an explicit reload alike:
    // nothing recorded.
    std::fs::write(server.config_path(), "server: {roles: []}\n").unwrap();
    let (status, _) = json_of(&server, "POST", "/api/reload", &ACME, "").await;
    assert_eq!(status, 400);
    assert_eq!(audit(&server, &OPS, "kind=config.reload").await.len(), 1);

    // An explicit reload of a changed file and skills directory: the skills'
    // change is the caller's; the configuration's is one record, the caller's
    // unless the watcher applied it first.
    std::fs::write(server.config_path(), CONFIG).unwrap();
    std::fs::write(
        server.dir().join("skills/extra.yaml"),
        note("extra", "Another note."),
    )
    .unwrap();
    let (status, v) = json_of(&server, "POST", "/api/reload", &ACME, "").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["skills"]["added"], json!(["extra"]));
    let config = eventually(&server, "config.reload", |r| r.len() == 2).await;
    assert_eq!(config[0]["after_hash"], v["hash"], "{config:?} {v}");
    assert_eq!(config[0]["before_hash"], config[1]["after_hash"]);
    assert_eq!(
        config[0]["after_hash"], config[1]["before_hash"],
        "back to the start"
    );
    let by = format!(
        "{}/{}",
        config[0]["actor_tenant"].as_str().unwrap(),
        config[0]["actor"].as_str().unwrap()
    );
    assert!(by == "acme/bob" || by == "global/system", "{by}");
    let reloads = audit(&server, &OPS, "kind=skills.reload").await;
    assert_eq!(summary(&reloads)[0].2, "acme/bob");
    assert_eq!(reloads.len(), 1, "{reloads:?}");
    assert_eq!(reloads[0]["detail"], "added: extra");
    assert!(reloads[0]["target"].as_str().unwrap().ends_with("skills"));

    // The real CLI reads the same records from the server.
    let read = cli_remote(&server, "acme", "bob", &[]);
    assert_eq!(read["records"].as_array().unwrap(), &acme);
    let read = cli_remote(&server, "global", "ops", &["--kind", "skill.disable"]);
    assert_eq!(
        summary(read["records"].as_array().unwrap()),
        summary(&skills[1..])
    );

    // And, the server stopped, from its database: every change persisted.
    server.stop();
    let out = cli(server.dir(), &["audit", "list"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let offline: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(offline["records"].as_array().unwrap(), &acme);
    let mut everything = Command::new(cli_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("SOULBASE_") {
            everything.env_remove(k);
        }
    }
    let out = everything
        .current_dir(server.dir())
        .args(["audit", "list", "--config"])
        .arg(server.config_path())
        .args(["--since", "1h"])
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("AT (UTC)"), "{text}");
    for kind in [
        "skill.disable",
        "registry.register",
        "config.reload",
        "skills.reload",
    ] {
        assert!(text.contains(kind), "{kind}: {text}");
    }
    assert!(text.contains("global/system"), "{text}");
    assert_eq!(text.lines().count(), 1 + 8, "{text}");
}

/// `PUT /api/tools/{id}/state`: a tenant pauses, deprecates and enables its own
/// tool over HTTP (what the console's tool page does); each change is authorized
/// as its action, takes effect on the next call, and is one audit record naming
/// the caller. Another tenant cannot see the tool; a bad body names its field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_changes_its_own_tools_state_over_http_and_each_change_is_audited() {
    let server = Server::start_in(CONFIG, prepare);
    register(&server, "acme", "bob", "acme.demo.tool")
        .await
        .unwrap();
    register(&server, "globex", "eve", "globex.demo.tool")
        .await
        .unwrap();
    let path = "/api/tools/acme.demo.tool/state";
    let invoke = async |who: &[(&str, &str)], id: &str| {
        json_of(
            &server,
            "POST",
            &format!("/api/tools/{id}/invoke"),
            who,
            r#"{"text": "hi"}"#,
        )
        .await
        .1
    };
    assert_eq!(invoke(&ACME, "acme.demo.tool").await["status"], "ok");
    for (change, state) in [
        ("pause", "paused"),
        ("enable", "enabled"),
        ("deprecate", "deprecated"),
    ] {
        let (status, v) = json_of(
            &server,
            "PUT",
            path,
            &ACME,
            &json!({ "change": change }).to_string(),
        )
        .await;
        assert_eq!((status, &v["state"]), (200, &json!(state)), "{change}: {v}");
        assert_eq!(v["id"], "acme.demo.tool");
        assert_eq!(v["owner"], "acme");
        if change == "pause" {
            let refused = invoke(&ACME, "acme.demo.tool").await;
            assert_eq!(refused["error_code"], "TOOL.DISABLED", "{refused}");
        }
    }
    // Deprecation is for good: the registry refuses to enable the tool again.
    let (status, v) = json_of(&server, "PUT", path, &ACME, r#"{"change": "enable"}"#).await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (409, &json!("REGISTRY.CONFLICT")),
        "{v}"
    );
    assert_eq!(v["error"]["fields"]["from"], "deprecated", "{v}");
    let states: Vec<String> = audit(&server, &ACME, "kind=registry.state")
        .await
        .iter()
        .map(|r| {
            assert_eq!(r["actor"], "bob", "{r}");
            assert_eq!(r["target"], "acme.demo.tool", "{r}");
            r["detail"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(states.len(), 3, "{states:?}");
    assert!(
        states[0].ends_with("deprecated"),
        "newest first: {states:?}"
    );
    // Another tenant's tool does not exist for this one; globex may enable its
    // own tool but not deprecate it.
    let (status, v) = json_of(&server, "PUT", path, &GLOBEX, r#"{"change": "enable"}"#).await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (404, &json!("TOOL.NOT_FOUND")),
        "{v}"
    );
    let (status, v) = json_of(
        &server,
        "PUT",
        "/api/tools/globex.demo.tool/state",
        &GLOBEX,
        r#"{"change": "deprecate"}"#,
    )
    .await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (403, &json!("POLICY.DENY_TOOL")),
        "{v}"
    );
    for (body, field) in [
        (r#"{"change": "explode"}"#, "change"),
        (r#"{"state": "paused"}"#, "change"),
    ] {
        let (status, v) = json_of(&server, "PUT", path, &ACME, body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["fields"]["field"], field, "{body}: {v}");
    }
    let (status, v) = json_of(
        &server,
        "PUT",
        "/api/tools/not-a-tool/state",
        &ACME,
        r#"{"change": "pause"}"#,
    )
    .await;
    assert_eq!(
        (status, &v["error"]["fields"]["field"]),
        (400, &json!("id")),
        "{v}"
    );
}
