#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `soulbase evidence show|list|replay` against a real SQLite evidence database.

use std::process::Command;

use soulbase_observe::{
    BudgetUsage, EndStatus, EvidenceBegin, EvidenceEnd, EvidenceEvent, EvidenceStore,
};
use soulbase_store::{Db, SqlEvidenceStore};
use soulbase_types::{ActorId, CallId, Envelope, Origin, TenantId, ToolId};

fn soulbase(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_soulbase"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn show_list_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("e.db").display());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut calls = Vec::new();
    rt.block_on(async {
        let store = SqlEvidenceStore::new(Db::connect(&url, true).await.unwrap());
        let mut records = Vec::new();
        for i in 0..3 {
            let call_id = CallId::generate();
            let begin = Envelope::new(
                TenantId::new("acme").unwrap(),
                ActorId::new("alice").unwrap(),
                Origin::Llm,
                EvidenceEvent::Begin(EvidenceBegin {
                    call_id: call_id.clone(),
                    tool_id: ToolId::new("demo.echo.say").unwrap(),
                    tool_version: "1.0.0".into(),
                    manifest_digest: "m".into(),
                    profile_hash: "p".into(),
                    policy_hash: "pol".into(),
                    config_hash: "c".into(),
                    args_digest: "sha256:args".into(),
                    idempotency_key: None,
                    calling_skill: None,
                    consent: None,
                    conversation: None,
                    surface: None,
                }),
            );
            let end = Envelope::new(
                begin.tenant.clone(),
                begin.actor.clone(),
                begin.origin,
                EvidenceEvent::End(EvidenceEnd {
                    call_id: call_id.clone(),
                    begin_id: begin.id.clone(),
                    status: if i == 0 {
                        EndStatus::Error
                    } else {
                        EndStatus::Ok
                    },
                    error_code: None,
                    output_digest: Some("sha256:out".into()),
                    side_effects: vec![],
                    usage: BudgetUsage::default(),
                    duration_us: 7,
                    client_requests: Vec::new(),
                }),
            );
            records.push(begin);
            if i != 2 {
                records.push(end);
            }
            calls.push(call_id);
        }
        store.write_batch(&records).await.unwrap();
    });

    let (code, out, err) = soulbase(&[
        "evidence",
        "--database-url",
        &url,
        "show",
        calls[0].as_str(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("\"event\": \"begin\"") && out.contains("\"event\": \"end\""),
        "{out}"
    );

    let (code, out, _) = soulbase(&[
        "evidence",
        "--database-url",
        &url,
        "list",
        "--tenant",
        "acme",
        "--limit",
        "2",
    ]);
    assert_eq!(code, 0);
    assert_eq!(
        out.lines().filter(|l| l.contains("demo.echo.say")).count(),
        2
    );
    let cursor = out
        .lines()
        .find_map(|l| l.strip_prefix("next page: --after "))
        .unwrap()
        .to_owned();
    let (code, out, _) = soulbase(&[
        "evidence",
        "--database-url",
        &url,
        "list",
        "--tenant",
        "acme",
        "--limit",
        "2",
        "--after",
        &cursor,
    ]);
    assert_eq!(code, 0);
    assert_eq!(
        out.lines().filter(|l| l.contains("demo.echo.say")).count(),
        1
    );
    let (_, out, _) = soulbase(&[
        "evidence",
        "--database-url",
        &url,
        "--format",
        "json",
        "list",
        "--tenant",
        "acme",
        "--status",
        "error",
    ]);
    let page: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(page["calls"].as_array().unwrap().len(), 1);

    let (code, out, _) = soulbase(&[
        "evidence",
        "--database-url",
        &url,
        "replay",
        calls[1].as_str(),
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("demo.echo.say@1.0.0") && out.contains("sha256:args"),
        "{out}"
    );
    // A call without an End replays with an anomaly: exit 1.
    let (code, out, _) = soulbase(&[
        "evidence",
        "--database-url",
        &url,
        "replay",
        calls[2].as_str(),
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("anomaly"));
    // Unknown call, bad cursor: errors, exit 2.
    let (code, _, err) = soulbase(&["evidence", "--database-url", &url, "show", "call_nope"]);
    assert_eq!(code, 2);
    assert!(err.contains("no evidence"));
    let (code, _, err) = soulbase(&[
        "evidence",
        "--database-url",
        &url,
        "list",
        "--tenant",
        "acme",
        "--after",
        "garbage",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("--after"));
}

#[test]
fn quarantine_list_and_retry() {
    use soulbase_observe::fixtures::sample_begin;

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("e.db").display());
    let spool = dir.path().join("spool");
    std::fs::create_dir(&spool).unwrap();
    let spool_arg = spool.to_str().unwrap();
    // As the drainer writes it: a refused record, then a frame that was not one.
    let kept = sample_begin();
    let call = match &kept.payload {
        EvidenceEvent::Begin(b) => b.call_id.to_string(),
        _ => unreachable!(),
    };
    let lines = [
        serde_json::json!({"refused": "value too long", "record": kept}),
        serde_json::json!({"refused": "not an evidence record", "record": "garbage"}),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let file = spool.join("quarantine.jsonl");
    std::fs::write(&file, &text).unwrap();

    let (code, out, err) = soulbase(&["evidence", "quarantine", "list", "--spool", spool_arg]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("LINE  KIND"), "{out}");
    assert!(out.contains("acme"), "{out}");
    assert!(
        out.contains(&kept.id.to_string()) && out.contains("value too long"),
        "{out}"
    );
    assert!(out.contains("unreadable: not an evidence record"), "{out}");

    // While a server holds the spool, retry refuses and changes nothing.
    let lock = std::fs::File::create(spool.join("LOCK")).unwrap();
    lock.try_lock().unwrap();
    let retry = [
        "evidence",
        "--database-url",
        &url,
        "quarantine",
        "retry",
        "--spool",
        spool_arg,
    ];
    // The database must exist first (the server migrates it).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async { Db::connect(&url, true).await.unwrap().close().await });
    let (code, _, err) = soulbase(&retry);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("in use"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    drop(lock);

    // The record goes to the database; the unreadable line stays: exit 1.
    let (code, out, err) = soulbase(&retry);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("the database took 1 record(s)"), "{out}");
    assert!(out.contains("line 2: unreadable"), "{out}");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        format!("{}\n", lines[1])
    );
    let (code, out, err) = soulbase(&["evidence", "--database-url", &url, "show", &call]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&kept.id.to_string()), "{out}");

    let (code, out, _) = soulbase(&[
        "evidence",
        "--json",
        "quarantine",
        "list",
        "--spool",
        spool_arg,
    ]);
    assert_eq!(code, 0);
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{out}");
    assert_eq!(listed[0]["line"], 1);
    assert_eq!(listed[0]["id"], serde_json::Value::Null);

    // Nothing retry can offer leaves the file alone; a missing spool is named.
    let (code, _, _) = soulbase(&retry);
    assert_eq!(code, 1);
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        format!("{}\n", lines[1])
    );
    let missing = dir.path().join("nope");
    let (code, _, err) = soulbase(&[
        "evidence",
        "quarantine",
        "list",
        "--spool",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no spool directory") && err.contains("nope"),
        "{err}"
    );
}

#[test]
fn text_shows_utc_rfc3339_and_json_keeps_milliseconds() {
    const AT: i64 = 1_790_000_000_123;
    const SHOWN: &str = "2026-09-21T14:13:20.123Z";
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("e.db").display());
    let call_id = CallId::generate();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = SqlEvidenceStore::new(Db::connect(&url, true).await.unwrap());
        let mut begin = Envelope::new(
            TenantId::new("acme").unwrap(),
            ActorId::new("alice").unwrap(),
            Origin::Llm,
            EvidenceEvent::Begin(EvidenceBegin {
                call_id: call_id.clone(),
                tool_id: ToolId::new("demo.echo.say").unwrap(),
                tool_version: "1.0.0".into(),
                manifest_digest: "m".into(),
                profile_hash: "p".into(),
                policy_hash: "pol".into(),
                config_hash: "c".into(),
                args_digest: "sha256:args".into(),
                idempotency_key: None,
                calling_skill: None,
                consent: None,
                conversation: None,
                surface: None,
            }),
        );
        begin.at = soulbase_types::UnixMillis(AT);
        let mut end = Envelope::new(
            begin.tenant.clone(),
            begin.actor.clone(),
            begin.origin,
            EvidenceEvent::End(EvidenceEnd {
                call_id: call_id.clone(),
                begin_id: begin.id.clone(),
                status: EndStatus::Ok,
                error_code: None,
                output_digest: Some("sha256:out".into()),
                side_effects: vec![],
                usage: BudgetUsage::default(),
                duration_us: 7,
                client_requests: Vec::new(),
            }),
        );
        end.at = soulbase_types::UnixMillis(AT + 1_000);
        store.write_batch(&[begin, end]).await.unwrap();
    });
    let evidence = |args: &[&str]| {
        let all: Vec<&str> = ["evidence", "--database-url", url.as_str()]
            .iter()
            .chain(args)
            .copied()
            .collect();
        let (code, out, err) = soulbase(&all);
        assert_eq!(code, 0, "{args:?}: {err}");
        out
    };
    let raw = AT.to_string();

    let list = evidence(&["list", "--tenant", "acme"]);
    assert!(list.starts_with("BEGAN (UTC)"), "{list}");
    assert!(list.contains(SHOWN) && !list.contains(&raw), "{list}");
    let show = evidence(&["show", call_id.as_str()]);
    assert!(show.contains(&format!("\"at\": \"{SHOWN}\"")), "{show}");
    assert!(
        show.contains("2026-09-21T14:13:21.123Z") && !show.contains(&raw),
        "{show}"
    );
    let replay = evidence(&["replay", call_id.as_str()]);
    assert!(
        replay.contains(&format!("began     {SHOWN}"))
            && replay.contains("ended     2026-09-21T14:13:21.123Z"),
        "{replay}"
    );
    assert!(!replay.contains(&raw), "{replay}");

    let page: serde_json::Value =
        serde_json::from_str(&evidence(&["list", "--tenant", "acme", "--json"])).unwrap();
    assert_eq!(page["calls"][0]["began_at"], AT);
    let first: serde_json::Value = serde_json::from_str(
        evidence(&["show", call_id.as_str(), "--format", "json"])
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first["at"], AT);
    let replayed: serde_json::Value =
        serde_json::from_str(&evidence(&["--json", "replay", call_id.as_str()])).unwrap();
    assert_eq!(replayed["outcome"]["began_at"], AT, "{replayed:#}");
}

#[test]
fn retry_takes_no_tenant_and_refuses_one_given_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().to_str().unwrap();
    let (code, _, err) = soulbase(&[
        "--tenant",
        "acme",
        "evidence",
        "quarantine",
        "retry",
        "--spool",
        spool,
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--tenant"), "{err}");
    let (code, _, err) = soulbase(&[
        "evidence",
        "quarantine",
        "retry",
        "--spool",
        spool,
        "--tenant",
        "acme",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--tenant"), "{err}");
    // A query takes it, before the subcommand too.
    let (code, out, err) = soulbase(&[
        "--tenant",
        "acme",
        "evidence",
        "quarantine",
        "list",
        "--spool",
        spool,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("no quarantined records"), "{out}");
}
