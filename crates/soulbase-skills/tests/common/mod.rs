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
use soulbase_skills::{CatalogOptions, ReloadReport, SkillCatalog, SkillTerms};
use soulbase_tools::Registry;
use soulbase_tools::pipeline::{CallResult, Invoker, InvokerBuilder, MemoryIdempotency, ToolCall};
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
            require_scopes: false,
            obligations: Vec::new(),
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
    /// The skills' terms the invoker holds every call to.
    pub terms: Arc<SkillTerms>,
}

/// A catalog over `dir` (confined to it) with an invoker over `builtins()`
/// holding calls to the skills' default terms.
pub fn env(dir: &Path) -> Env {
    env_with(dir, |t| t)
}

/// [`env`] with the skills' terms shaped by `terms` (subscriptions, audit, quota).
pub fn env_with(dir: &Path, terms: impl FnOnce(SkillTerms) -> SkillTerms) -> Env {
    let registry = Registry::new();
    let (catalog, report) = SkillCatalog::open(registry.clone(), CatalogOptions::new(dir)).unwrap();
    let sink = MemorySink::new();
    let terms = Arc::new(terms(SkillTerms::new(catalog.clone())));
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
    .terms(terms.clone())
    .build();
    Env {
        registry,
        catalog,
        report,
        invoker,
        sink,
        terms,
    }
}

/// Calls through the invoker as a surface would: the calling skill (what the
/// surface established from the caller's binding) set on the call, and
/// `run_skill` resolved by the terms.
pub struct Calls {
    pub invoker: Invoker,
    pub terms: Arc<SkillTerms>,
}

impl Calls {
    pub fn of(e: &Env) -> Self {
        Self {
            invoker: e.invoker.clone(),
            terms: e.terms.clone(),
        }
    }

    /// `call` made on behalf of `calling` (`None`: a model or client directly).
    pub async fn invoke(&self, calling: Option<&str>, mut call: ToolCall) -> CallResult {
        call.calling_skill = calling.map(str::to_owned);
        self.invoker.invoke(call).await
    }

    /// The protocol's `run_skill`: tool `tool` of `skill` (its only tool when
    /// `None`), refused with its code when the skill or tool is not there.
    pub async fn run_skill(
        &self,
        subject: Subject,
        calling: Option<&str>,
        skill: &str,
        tool: Option<&str>,
        args: serde_json::Value,
    ) -> CallResult {
        match self.terms.run_target(skill, tool) {
            Ok(id) => self.invoke(calling, ToolCall::new(subject, id, args)).await,
            Err(e) => CallResult::refused(soulbase_types::CallId::generate(), &e),
        }
    }
}
