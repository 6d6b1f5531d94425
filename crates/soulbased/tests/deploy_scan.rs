//! Every overlay rendered (`common::k8s`, the kustomize features the repository
//! uses) and checked by the tools a platform team runs: each object validated
//! against the Kubernetes schemas (`kubernetes-validate --strict`, for the
//! Kubernetes version below) and the whole overlay scanned by `checkov`, which
//! may fail only the checks `docs/deploy.md` lists with a reason.
//!
//! The tools are Python packages; `.ci/run` installs the pinned versions
//! (`.ci/python-tools`) and exports `SOULBASE_PYTHON_TOOLS`, the directory holding
//! them. Without them this test fails and says how to get them: it never skips.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use common::k8s;
use serde_json::Value;

/// The Kubernetes version the manifests are validated against.
const KUBERNETES_VERSION: &str = "1.33.0";

/// Every overlay under `deploy/k8s/overlays`.
fn overlays() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(k8s::deploy_dir().join("k8s/overlays"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 3, "{names:?}");
    names
}

/// The path of `tool`: in `SOULBASE_PYTHON_TOOLS` when set, else on `PATH`.
fn tool(name: &str) -> PathBuf {
    let dirs: Vec<PathBuf> = match std::env::var_os("SOULBASE_PYTHON_TOOLS") {
        Some(d) => vec![PathBuf::from(d)],
        None => std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).collect(),
    };
    dirs.iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} is not installed (looked in {dirs:?}). Run `.ci/python-tools` (it \
                 installs the pinned kubernetes-validate and checkov into a venv and prints \
                 the directory) and set SOULBASE_PYTHON_TOOLS to it, or run the suite \
                 through `.ci/run`, which does both"
            )
        })
}

/// Writes overlay `name`'s rendered objects, one file each; returns the directory.
fn render_to_dir(name: &str) -> (tempfile::TempDir, Vec<(String, Value)>) {
    // Not a hidden directory (tempfile's default `.tmp…`): checkov skips those.
    let dir = tempfile::Builder::new()
        .prefix(&format!("soulbase-{name}-"))
        .tempdir()
        .unwrap();
    let docs = k8s::render(&k8s::deploy_dir().join("k8s/overlays").join(name));
    let mut out = Vec::new();
    for (i, (_, d)) in docs.iter().enumerate() {
        let id = format!(
            "{i:02}-{}-{}",
            d["kind"].as_str().unwrap().to_lowercase(),
            d["metadata"]["name"].as_str().unwrap()
        );
        // JSON is YAML: both tools read it as a manifest.
        std::fs::write(dir.path().join(format!("{id}.yaml")), d.to_string()).unwrap();
        out.push((id, d.clone()));
    }
    (dir, out)
}

#[test]
fn every_overlay_is_valid_against_the_kubernetes_schemas() {
    let validate = tool("kubernetes-validate");
    for name in overlays() {
        let (dir, docs) = render_to_dir(&name);
        let files: Vec<PathBuf> = docs
            .iter()
            .map(|(id, _)| dir.path().join(format!("{id}.yaml")))
            .collect();
        let out = Command::new(&validate)
            .args(["--strict", "-k", KUBERNETES_VERSION])
            .args(&files)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{name}: kubernetes-validate:\n{text}");
        let passed = text.lines().filter(|l| l.starts_with("INFO")).count();
        assert_eq!(
            passed,
            files.len(),
            "{name}: every object validated:\n{text}"
        );
    }
}

/// The checkov failures `docs/deploy.md` accepts: rows `| CKV_… | overlays | reason |`
/// of its "Static scan" table; `*` is every overlay.
fn accepted_failures() -> BTreeMap<String, BTreeSet<String>> {
    let doc = std::fs::read_to_string(k8s::repo_dir().join("docs/deploy.md")).unwrap();
    let mut out = BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 5 || !cells[1].trim_matches('`').starts_with("CKV") {
            continue;
        }
        assert!(
            !cells[3].is_empty(),
            "docs/deploy.md: {} has no reason",
            cells[1]
        );
        let overlays = cells[2]
            .split(',')
            .map(|o| o.trim().trim_matches('`').to_owned())
            .collect();
        out.insert(cells[1].trim_matches('`').to_owned(), overlays);
    }
    out
}

#[test]
fn checkov_passes_every_overlay_but_the_documented_exceptions() {
    let checkov = tool("checkov");
    let accepted = accepted_failures();
    let mut used = BTreeSet::new();
    for name in overlays() {
        let (dir, docs) = render_to_dir(&name);
        let out = Command::new(&checkov)
            .args([
                "--framework",
                "kubernetes",
                "--output",
                "json",
                "--quiet",
                "--compact",
            ])
            .args(["--skip-download", "-d"])
            .arg(dir.path())
            .env("BC_SKIP_MAPPING", "TRUE")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!(
                "{name}: checkov printed no JSON report ({e}):\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        // One framework: one report (a list would hold one per framework).
        let report = match report {
            Value::Array(mut all) if all.len() == 1 => all.remove(0),
            r => r,
        };
        let summary = &report["summary"];
        let count = |k: &str| summary[k].as_u64().unwrap_or(0) as usize;
        assert!(
            count("passed") > 50
                && count("resource_count") >= docs.len()
                && count("parsing_errors") == 0,
            "{name}: checkov did not scan every object: {summary}\n{stdout}"
        );
        let mut unexpected = Vec::new();
        for f in report["results"]["failed_checks"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let id = f["check_id"].as_str().unwrap().to_owned();
            let ok = accepted
                .get(&id)
                .is_some_and(|o| o.contains("*") || o.contains(&name));
            if ok {
                used.insert(id);
            } else {
                unexpected.push(format!("{id} {} ({})", f["check_name"], f["resource"]));
            }
        }
        assert!(
            unexpected.is_empty(),
            "{name}: checkov failures not listed in docs/deploy.md:\n{}",
            unexpected.join("\n")
        );
    }
    let stale: Vec<&String> = accepted.keys().filter(|k| !used.contains(*k)).collect();
    assert!(
        stale.is_empty(),
        "docs/deploy.md lists checks that no longer fail: {stale:?}"
    );
}
