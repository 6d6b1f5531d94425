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
