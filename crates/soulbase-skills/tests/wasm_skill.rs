//! The example WASM skill (`skills/text-length`) through the real WASM executor.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::*;
use serde_json::json;
use soulbase_auth::{HmacConsent, StaticPolicy};
use soulbase_observe::MemorySink;
use soulbase_qos::LocalQuota;
use soulbase_sandbox::{DeclaredProfiles, LocalSandbox, ProviderBinding, ProviderKind};
use soulbase_sandbox_wasm::{WasmExecutor, WasmOptions};
use soulbase_skills::{CatalogOptions, SkillCatalog};
use soulbase_tools::Registry;
use soulbase_tools::pipeline::{InvokerBuilder, MemoryIdempotency, ToolCall};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wasm_skill_counts_characters() {
    let registry = Registry::new();
    let (catalog, report) =
        SkillCatalog::open(registry.clone(), CatalogOptions::new(repo_skills())).unwrap();
    assert_eq!(report.errors().count(), 0, "{:?}", report.problems);
    let skill = catalog.current().get("text-length").cloned().unwrap();
    match &skill.tools[0].compiled.manifest.provider {
        ProviderBinding::Wasm { module, sha256 } => {
            assert_eq!(
                module, "text-length/text_length.wat",
                "relative to the skills root"
            );
            assert_eq!(sha256.len(), 64);
        }
        other => panic!("{other:?}"),
    }
    let wasm = WasmExecutor::new(WasmOptions::new(repo_skills())).unwrap();
    let sandbox = LocalSandbox::new(builtins()).with_executor(ProviderKind::Wasm, Arc::new(wasm));
    let invoker = InvokerBuilder::new(
        Arc::new(registry.clone()),
        Arc::new(StaticPolicy::new(&allow_all())),
        Arc::new(LocalQuota::new(&[])),
        Arc::new(HmacConsent::new(
            b"test-key-test-key-test-key-32byt".to_vec(),
        )),
        Arc::new(DeclaredProfiles::new()),
        Arc::new(sandbox),
        Arc::new(MemorySink::new()),
        Arc::new(MemoryIdempotency::new()),
    )
    .build();
    let tool = id("skills.text-length.count");
    for (text, n) in [("héllo", 5), ("", 0), ("a\"b\\c\n", 6), ("日本語 ok", 6)] {
        let r = invoker
            .invoke(ToolCall::new(
                subject(),
                tool.clone(),
                json!({ "text": text }),
            ))
            .await;
        assert!(r.is_ok(), "{text:?}: {r:?}");
        assert_eq!(r.output.unwrap(), json!({ "length": n }), "{text:?}");
    }
}

#[test]
fn a_tampered_module_digest_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("w")).unwrap();
    std::fs::copy(
        repo_skills().join("text-length/text_length.wat"),
        dir.path().join("w/m.wat"),
    )
    .unwrap();
    let bad = "0".repeat(64);
    write(
        dir.path(),
        "w/SKILL.md",
        &format!(
            "---\nname: w\ndescription: x\nprovider: {{type: wasm, module: m.wat, sha256: \"{bad}\"}}\ntools:\n  - name: t\n    description: x\n---\n"
        ),
    );
    // A descriptor may leave the digest out: it is computed from the file.
    write(
        dir.path(),
        "d.yaml",
        "name: d\ndescription: x\nprovider: wasm\nmodule: w/m.wat\n",
    );
    let set = soulbase_skills::check_dir(dir.path()).unwrap();
    let err = set.problems().iter().find(|p| p.is_error()).unwrap();
    assert_eq!(err.field.as_deref(), Some("provider.sha256"), "{err}");
    assert!(set.get("w").is_none());
    assert!(set.get("d").is_some(), "{:?}", set.problems());
    // A module outside the skills root is refused.
    write(
        dir.path(),
        "o.yaml",
        "name: o\ndescription: x\nprovider: wasm\nmodule: ../../etc/passwd\n",
    );
    let set = soulbase_skills::check_dir(dir.path()).unwrap();
    assert!(set.get("o").is_none());
}
