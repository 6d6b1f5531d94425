//! Shared test harness: a temp skills directory, a registry, a catalog, and an
//! invoker with permissive policy over builtin handlers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use soulbase_auth::{HmacConsent, StaticPolicy};
use soulbase_config::{PolicyConfig, PolicyEffect, PolicyRule};
use soulbase_observe::MemorySink;
use soulbase_qos::LocalQuota;
use soulbase_sandbox::{BuiltinExecutor, DeclaredProfiles, LocalSandbox, handler_fn};
use soulbase_skills::{CatalogOptions, ReloadReport, SkillCatalog};
use soulbase_tools::Registry;
use soulbase_tools::pipeline::{Invoker, InvokerBuilder, MemoryIdempotency};
use soulbase_types::{ActorId, Subject, TenantId, ToolId};

/// The repository's example skills directory.
pub fn repo_skills() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills")
}

pub fn tenant() -> TenantId {
    TenantId::new("acme").unwrap()
}

pub fn subject() -> Subject {
    Subject::new(tenant(), ActorId::new("alice").unwrap())
}

pub fn id(s: &str) -> ToolId {
    ToolId::new(s).unwrap()
}

/// Writes `text` to `dir/rel`, creating folders.
pub fn write(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(p, text).unwrap();
}

/// A builtin descriptor with the given name and description.
pub fn descriptor(name: &str, description: &str) -> String {
    format!(
        "name: {name}\ndescription: {description}\nprovider: builtin\nhandler: echo\nparameters:\n  type: object\n  properties:\n    text: {{type: string}}\n"
    )
}

/// Polls `cond` until it holds or `within` passes; returns whether it held.
pub fn wait_until(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Async variant of [`wait_until`].
pub async fn wait_until_async(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub fn allow_all() -> PolicyConfig {
    PolicyConfig {
        rules: vec![PolicyRule {
            effect: PolicyEffect::Allow,
            tenant: "*".into(),
            actors: vec!["*".into()],
            tools: vec!["*".into()],
            actions: vec!["invoke".into()],
        }],
    }
}

/// A builtin executor with `echo` (returns its arguments) and the example handlers.
pub fn builtins() -> BuiltinExecutor {
    let b = BuiltinExecutor::new();
    b.register("echo", handler_fn(|args| async move { Ok(args) }));
    soulbase_skills::examples::register(&b);
    b
}

pub struct Env {
    pub registry: Registry,
    pub catalog: SkillCatalog,
    pub report: ReloadReport,
    pub invoker: Invoker,
    pub sink: MemorySink,
}

/// A catalog over `dir` (confined to it) with an invoker over `builtins()`.
pub fn env(dir: &Path) -> Env {
    let registry = Registry::new();
    let (catalog, report) = SkillCatalog::open(registry.clone(), CatalogOptions::new(dir)).unwrap();
    let sink = MemorySink::new();
    let invoker = InvokerBuilder::new(
        Arc::new(registry.clone()),
        Arc::new(StaticPolicy::new(&allow_all())),
        Arc::new(LocalQuota::new(&[])),
        Arc::new(HmacConsent::new(
            b"test-key-test-key-test-key-32byt".to_vec(),
        )),
        Arc::new(DeclaredProfiles::new()),
        Arc::new(LocalSandbox::new(builtins())),
        Arc::new(sink.clone()),
        Arc::new(MemoryIdempotency::new()),
    )
    .build();
    Env {
        registry,
        catalog,
        report,
        invoker,
        sink,
    }
}
