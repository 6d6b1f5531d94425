//! Every manifest field acts (issue 32): one row per field — the field set, and
//! its effect observed through the governed pipeline (a call refused or limited,
//! a value in evidence or at the sandbox seam, an export or a listing changed),
//! or the field refused at load. A field the manifest gains without a row fails
//! [`every_manifest_field_has_a_row`].
//!
//! The sandbox here records what each call asks of it (the limits and the profile
//! the executors enforce: their own tests show the enforcement — e.g.
//! `soulbase-sandbox-process`'s `max_files_caps_open_files_and_what_is_left_in_scratch`).
//! Effects that live above this layer name the test that observes them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use soulbase_auth::{ConsentGrant, HmacConsent, StaticPolicy};
use soulbase_config::{PolicyConfig, PolicyEffect, PolicyRule};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::{EvidenceEvent, MemorySink};
use soulbase_qos::LocalQuota;
use soulbase_sandbox::{
    Capability, DeclaredProfiles, ExecOutput, ExecRequest, ProviderBinding, Sandbox,
};
use soulbase_tools::manifest::ManifestError;
use soulbase_tools::pipeline::{
    CallResult, CallStatus, Invoker, InvokerBuilder, MemoryIdempotency, ToolCall,
};
use soulbase_tools::registry::{ToolFilter, ToolOwner};
use soulbase_tools::{Registry, ToolManifest};
use soulbase_types::{ActorId, Subject, TenantId, ToolId, UnixMillis};

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

/// What the last execution asked of the sandbox.
#[derive(Debug, Clone, Default)]
struct Seen {
    timeout: Duration,
    max_bytes_out: Option<u64>,
    max_memory_bytes: Option<u64>,
    max_processes: Option<u32>,
    max_files: Option<u32>,
    capabilities: Vec<Capability>,
    provider: Option<ProviderBinding>,
}

/// A sandbox that answers `{"out": args}` (for `{"emit": v}`, `v`; for
/// `{"repeat": n}`, `{"text": "yyy…"}` of `n` characters), holding
/// each call for a few polls and recording what it was asked.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Seen>,
    running: AtomicUsize,
    most: AtomicUsize,
}

#[async_trait]
impl Sandbox for Recorder {
    fn guard(&self, _req: &ExecRequest<'_>) -> Result<(), SoulError> {
        Ok(())
    }

    async fn execute(&self, req: ExecRequest<'_>) -> Result<ExecOutput, SoulError> {
        *self.seen.lock().unwrap() = Seen {
            timeout: req.timeout,
            max_bytes_out: req.max_bytes_out,
            max_memory_bytes: req.max_memory_bytes,
            max_processes: req.max_processes,
            max_files: req.max_files,
            capabilities: req.profile.capabilities().to_vec(),
            provider: Some(req.provider.clone()),
        };
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        self.running.fetch_sub(1, Ordering::SeqCst);
        let output = if let Some(v) = req.args.get("emit") {
            v.clone()
        } else if let Some(n) = req.args.get("repeat").and_then(Value::as_u64) {
            json!({ "text": "y".repeat(usize::try_from(n).unwrap_or(0)) })
        } else {
            json!({ "out": req.args })
        };
        Ok(ExecOutput::value(output))
    }
}

struct Harness {
    invoker: Invoker,
    registry: Registry,
    sandbox: Arc<Recorder>,
    sink: MemorySink,
    consent: Arc<HmacConsent>,
}

fn acme() -> Subject {
    Subject::new(
        TenantId::new("acme").unwrap(),
        ActorId::new("alice").unwrap(),
    )
}

fn harness() -> Harness {
    let registry = Registry::new();
    let sandbox = Arc::new(Recorder::default());
    let sink = MemorySink::new();
    let consent = Arc::new(HmacConsent::new(KEY.to_vec()));
    let allow = |tools: &str, require_scopes: bool| PolicyRule {
        effect: PolicyEffect::Allow,
        tenant: "*".into(),
        actors: vec!["*".into()],
        tools: vec![tools.into()],
        actions: vec!["invoke".into()],
        require_scopes,
        obligations: Vec::new(),
    };
    let policy = PolicyConfig {
        rules: vec![allow("f.*", false), allow("scoped.*", true)],
    };
    let invoker = InvokerBuilder::new(
        Arc::new(registry.clone()),
        Arc::new(StaticPolicy::new(&policy)),
        Arc::new(LocalQuota::new(&[])),
        consent.clone(),
        Arc::new(DeclaredProfiles::new()),
        sandbox.clone(),
        Arc::new(sink.clone()),
        Arc::new(MemoryIdempotency::new()),
    )
    .build();
    Harness {
        invoker,
        registry,
        sandbox,
        sink,
        consent,
    }
}

/// A manifest `id` with `edit` applied to a plain one (object in, `{"out": …}`
/// out, builtin provider).
fn manifest_json(id: &str, edit: &Value) -> Value {
    let mut m = json!({
        "id": id,
        "version": "1.0.0",
        "description": format!("tool {id}"),
        "input_schema": {"type": "object"},
        "output_schema": {"type": "object"},
        "side_effect": "none"
    });
    if let (Value::Object(base), Value::Object(edit)) = (&mut m, edit) {
        for (k, v) in edit {
            base.insert(k.clone(), v.clone());
        }
    }
    m
}

/// The manifest as read and validated (every problem of `compile`).
fn load(id: &str, edit: &Value) -> Result<ToolManifest, ManifestError> {
    let m = ToolManifest::from_json_str(&manifest_json(id, edit).to_string())?;
    soulbase_tools::compile(m.clone())?;
    Ok(m)
}

impl Harness {
    /// Registers and enables `id` with `edit`.
    fn tool(&self, id: &str, edit: Value) {
        let m = load(id, &edit).unwrap_or_else(|e| panic!("{id}: {e:?}"));
        self.registry.register(m).unwrap();
        self.registry
            .enable(&ToolOwner::Global, &ToolId::new(id).unwrap())
            .unwrap();
    }

    async fn call(&self, id: &str, args: Value) -> CallResult {
        self.run(ToolCall::new(acme(), ToolId::new(id).unwrap(), args))
            .await
    }

    async fn run(&self, call: ToolCall) -> CallResult {
        self.invoker.invoke(call).await
    }

    fn seen(&self) -> Seen {
        self.sandbox.seen.lock().unwrap().clone()
    }

    /// The Begin of `result`'s call.
    fn begin(&self, result: &CallResult) -> soulbase_observe::EvidenceBegin {
        self.sink
            .records()
            .into_iter()
            .find_map(|r| match r.payload {
                EvidenceEvent::Begin(b) if b.call_id == result.call_id => Some(b),
                _ => None,
            })
            .expect("a Begin")
    }

    fn token(&self, tool: &str, issued: Option<i64>, scope: Option<&str>) -> String {
        let now = UnixMillis::now().0;
        self.consent.issue(&ConsentGrant {
            id: None,
            issued_at: issued.map(UnixMillis),
            tenant: TenantId::new("acme").unwrap(),
            actor: ActorId::new("alice").unwrap(),
            tool: scope.is_none().then(|| ToolId::new(tool).unwrap()),
            scope: scope.map(str::to_owned),
            args_digest: None,
            expires_at: UnixMillis(now + 3_600_000),
        })
    }
}

fn code(r: &CallResult) -> Option<ErrorCode> {
    r.error_code
}

fn refused_at_load(id: &str, edit: Value, field: &str) {
    let err = load(id, &edit).expect_err(field);
    assert!(
        err.problems.iter().any(|p| p.path.starts_with(field)),
        "{field}: {err:?}"
    );
}

/// The rows: field → what shows it acts.
const ROWS: &[&str] = &[
    "id",
    "name",
    "version",
    "display_name",
    "description",
    "tags",
    "input_schema",
    "output_schema",
    "scopes",
    "capabilities",
    "side_effect",
    "safety_class",
    "consent.required",
    "consent.ttl_ms",
    "consent.scope",
    "limits.timeout_ms",
    "limits.max_bytes_in",
    "limits.max_bytes_out",
    "limits.max_files",
    "limits.max_depth",
    "limits.max_concurrency",
    "limits.max_memory_bytes",
    "limits.max_processes",
    "concurrency",
    "idempotency",
    "provider_compat",
    "deprecations",
    "provider",
    "obligations",
    "mcp_name",
    "output_content",
];

/// Every field a manifest can hold, from a manifest that sets them all.
#[test]
fn every_manifest_field_has_a_row() {
    let full = load(
        "f.all.fields",
        &json!({
            "display_name": "All",
            "tags": ["t"],
            "scopes": [{"resource": "r", "action": "a"}],
            "capabilities": [{"kind": "tmp", "max_bytes": 1}],
            "safety_class": "medium",
            "consent": {"required": true, "ttl_ms": 1, "scope": "s"},
            "concurrency": "serial",
            "idempotency": "keyed",
            "provider_compat": {"openai": "*"},
            "deprecations": [{"since": "1.0.0", "message": "m"}],
            "obligations": [{"kind": "mask", "pointer": ""}],
            "mcp_name": "all_fields",
            "output_content": true
        }),
    )
    .unwrap();
    let v = serde_json::to_value(&full).unwrap();
    let mut fields = BTreeSet::new();
    for (k, inner) in v.as_object().unwrap() {
        match (k.as_str(), inner) {
            ("limits" | "consent", Value::Object(sub)) => {
                fields.extend(sub.keys().map(|s| format!("{k}.{s}")));
            }
            _ => {
                fields.insert(k.clone());
            }
        }
    }
    let rows: BTreeSet<String> = ROWS.iter().map(|r| (*r).to_owned()).collect();
    assert_eq!(
        fields, rows,
        "a manifest field without a row, or a row without a field"
    );
}

#[tokio::test]
async fn each_field_acts() {
    let h = harness();

    // id: the tool is called by it; any other id is not found.
    h.tool("f.id.tool", json!({}));
    assert_eq!(h.call("f.id.tool", json!({})).await.status, CallStatus::Ok);
    assert_eq!(
        code(&h.call("f.id.other", json!({})).await),
        Some(ErrorCode::ToolNotFound)
    );

    // name: must be the id's last segment.
    refused_at_load("f.name.tool", json!({"name": "other"}), "name");

    // version: recorded in the Begin.
    h.tool("f.version.tool", json!({"version": "2.3.4"}));
    let r = h.call("f.version.tool", json!({})).await;
    assert_eq!(h.begin(&r).tool_version, "2.3.4");

    // display_name: refused when blank (lists and MCP `title` show it: the
    // gRPC and MCP tests).
    refused_at_load(
        "f.display.tool",
        json!({"display_name": " "}),
        "display_name",
    );

    // description: what a model is told (the export's spec); refused when blank.
    h.tool(
        "f.description.tool",
        json!({"description": "Adds two numbers."}),
    );
    let spec = h
        .registry
        .available_specs(&TenantId::new("acme").unwrap())
        .into_iter()
        .find(|a| a.id().as_str() == "f.description.tool")
        .unwrap()
        .spec();
    assert_eq!(spec.description, "Adds two numbers.");
    refused_at_load(
        "f.description.bad",
        json!({"description": ""}),
        "description",
    );

    // tags: discovery filters by them.
    h.tool("f.tags.tool", json!({"tags": ["billing"]}));
    let tagged = h.registry.list(
        &TenantId::new("acme").unwrap(),
        &ToolFilter {
            tag: Some("billing".into()),
            ..Default::default()
        },
    );
    assert_eq!(tagged.len(), 1);

    // input_schema: arguments that do not fit are refused before execution.
    h.tool(
        "f.input.tool",
        json!({"input_schema": {"type": "object", "required": ["x"]}}),
    );
    assert_eq!(
        code(&h.call("f.input.tool", json!({})).await),
        Some(ErrorCode::SchemaValidationFailed)
    );

    // output_schema: an output that does not fit fails the call.
    h.tool(
        "f.output.tool",
        json!({"output_schema": {"type": "object", "required": ["y"]}}),
    );
    assert_eq!(
        code(&h.call("f.output.tool", json!({})).await),
        Some(ErrorCode::ToolExecutionFailed)
    );

    // scopes: given to the authorizer; a `require_scopes` rule wants them held.
    h.tool(
        "scoped.s.tool",
        json!({"scopes": [{"resource": "ledger", "action": "read"}]}),
    );
    assert_eq!(
        code(&h.call("scoped.s.tool", json!({})).await),
        Some(ErrorCode::PolicyDenyTool)
    );
    let holder = ToolCall::new(
        acme().with_scope("ledger#read"),
        ToolId::new("scoped.s.tool").unwrap(),
        json!({}),
    );
    assert_eq!(h.run(holder).await.status, CallStatus::Ok);

    // capabilities: the profile the sandbox enforces.
    let tmp = json!([{"kind": "tmp", "max_bytes": 4096}]);
    h.tool("f.caps.tool", json!({"capabilities": tmp}));
    h.call("f.caps.tool", json!({})).await;
    assert_eq!(
        serde_json::to_value(h.seen().capabilities).unwrap(),
        json!([{"kind": "tmp", "max_bytes": 4096}])
    );

    // side_effect: must be covered by the capabilities; write needs consent.
    refused_at_load(
        "f.side.tool",
        json!({"side_effect": "network"}),
        "capabilities",
    );
    let write = json!({
        "side_effect": "write",
        "capabilities": [{"kind": "fs", "paths": ["/data"], "access": ["write"]}]
    });
    refused_at_load("f.write.tool", write, "consent");
    // safety_class: high needs consent.
    refused_at_load("f.safety.tool", json!({"safety_class": "high"}), "consent");

    // consent.required: no token, no call.
    h.tool("f.consent.tool", json!({"consent": {"required": true}}));
    assert_eq!(
        code(&h.call("f.consent.tool", json!({})).await),
        Some(ErrorCode::ConsentRequired)
    );
    let with = |tool: &str, token: String| {
        ToolCall::new(acme(), ToolId::new(tool).unwrap(), json!({})).with_consent(token)
    };
    let token = h.token("f.consent.tool", None, None);
    assert_eq!(
        h.run(with("f.consent.tool", token)).await.status,
        CallStatus::Ok
    );

    // consent.ttl_ms: a consent older than it is refused, whatever its expiry.
    h.tool(
        "f.ttl.tool",
        json!({"consent": {"required": true, "ttl_ms": 60000}}),
    );
    let now = UnixMillis::now().0;
    let old = h.token("f.ttl.tool", Some(now - 120_000), None);
    assert_eq!(
        code(&h.run(with("f.ttl.tool", old)).await),
        Some(ErrorCode::ConsentRequired)
    );
    let fresh = h.token("f.ttl.tool", Some(now), None);
    assert_eq!(
        h.run(with("f.ttl.tool", fresh)).await.status,
        CallStatus::Ok
    );

    // consent.scope: a consent for the scope covers the tool; another does not.
    h.tool(
        "f.scope.tool",
        json!({"consent": {"required": true, "scope": "payroll"}}),
    );
    let other = h.token("f.scope.tool", None, Some("hr"));
    assert_eq!(
        code(&h.run(with("f.scope.tool", other)).await),
        Some(ErrorCode::ConsentRequired)
    );
    let payroll = h.token("f.scope.tool", None, Some("payroll"));
    assert_eq!(
        h.run(with("f.scope.tool", payroll)).await.status,
        CallStatus::Ok
    );

    // limits: each reaches the sandbox or refuses the call.
    h.tool(
        "f.limits.tool",
        json!({"limits": {
            "timeout_ms": 1234, "max_bytes_out": 100, "max_files": 7,
            "max_memory_bytes": 33554432, "max_processes": 3,
            "max_bytes_in": 64, "max_depth": 3
        }}),
    );
    assert_eq!(
        h.call("f.limits.tool", json!({})).await.status,
        CallStatus::Ok
    );
    let seen = h.seen();
    assert_eq!(seen.timeout, Duration::from_millis(1234));
    assert_eq!(seen.max_bytes_out, Some(100));
    assert_eq!(seen.max_files, Some(7));
    assert_eq!(seen.max_memory_bytes, Some(33_554_432));
    assert_eq!(seen.max_processes, Some(3));
    let big = json!({"pad": "x".repeat(100)});
    assert_eq!(
        code(&h.call("f.limits.tool", big).await),
        Some(ErrorCode::SchemaValidationFailed),
        "max_bytes_in"
    );
    let deep = json!({"a": {"b": {"c": {"d": 1}}}});
    assert_eq!(
        code(&h.call("f.limits.tool", deep).await),
        Some(ErrorCode::SchemaValidationFailed),
        "max_depth"
    );
    let loud = json!({"repeat": 200});
    assert_eq!(
        code(&h.call("f.limits.tool", loud).await),
        Some(ErrorCode::ToolExecutionFailed),
        "max_bytes_out"
    );

    // limits.max_concurrency and concurrency: how many run at once.
    for (id, edit, most) in [
        (
            "f.parallel.two",
            json!({"limits": {"max_concurrency": 2}}),
            2,
        ),
        ("f.serial.one", json!({"concurrency": "serial"}), 1),
    ] {
        h.tool(id, edit);
        h.sandbox.most.store(0, Ordering::SeqCst);
        let calls = (0..6).map(|_| h.call(id, json!({})));
        let results = futures_util::future::join_all(calls).await;
        assert!(results.iter().all(|r| r.status == CallStatus::Ok), "{id}");
        assert_eq!(h.sandbox.most.load(Ordering::SeqCst), most, "{id}");
    }

    // idempotency: keyed tools need a key, and a repeated key is answered again.
    h.tool("f.keyed.tool", json!({"idempotency": "keyed"}));
    assert_eq!(
        code(&h.call("f.keyed.tool", json!({})).await),
        Some(ErrorCode::SchemaValidationFailed)
    );
    let keyed = || {
        ToolCall::new(acme(), ToolId::new("f.keyed.tool").unwrap(), json!({}))
            .with_idempotency_key("k-1")
    };
    assert!(!h.run(keyed()).await.replayed);
    assert!(h.run(keyed()).await.replayed);

    // provider_compat: refused unless it names a known provider (exports filter
    // by it: soulbased's `provider_compat_decides_which_exports_offer_a_tool`).
    refused_at_load(
        "f.compat.tool",
        json!({"provider_compat": {"gemini": "*"}}),
        "provider_compat.gemini",
    );

    // deprecations: every successful call carries the note.
    h.tool(
        "f.deprecated.tool",
        json!({"deprecations": [{"since": "2026-01-01", "message": "use f.new.tool."}]}),
    );
    let r = h.call("f.deprecated.tool", json!({})).await;
    assert!(
        r.warnings.iter().any(|w| w.contains("use f.new.tool.")),
        "{r:?}"
    );

    // provider: the binding the sandbox runs.
    h.tool(
        "f.provider.tool",
        json!({"provider": {"type": "builtin", "handler": "some.handler.name"}}),
    );
    h.call("f.provider.tool", json!({})).await;
    assert_eq!(
        serde_json::to_value(h.seen().provider.unwrap()).unwrap(),
        json!({"type": "builtin", "handler": "some.handler.name"})
    );

    // obligations: the output as answered.
    h.tool(
        "f.obligations.tool",
        json!({"obligations": [{"kind": "redact", "pointer": "/out/ssn"}]}),
    );
    let r = h.call("f.obligations.tool", json!({"ssn": "123"})).await;
    assert_eq!(r.output, Some(json!({"out": {"ssn": "[REDACTED]"}})));
    // mcp_name: the plain name MCP calls the tool by (the registry resolves it in
    // the tenant's view; soulbased's `mcp_content.rs` lists and calls it); a
    // second tool taking it in the same view is refused; a dotted or reserved
    // name is refused at load.
    h.tool("f.mcpname.tool", json!({"mcp_name": "plain_name"}));
    assert_eq!(
        h.registry
            .mcp_tool(&acme().tenant, "plain_name")
            .map(|id| id.to_string()),
        Some("f.mcpname.tool".to_owned())
    );
    let taken = load("f.mcpname.other", &json!({"mcp_name": "plain_name"})).unwrap();
    let err = h.registry.register(taken.clone()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::RegistryConflict);
    assert_eq!(err.field("holder"), Some("f.mcpname.tool"));
    let err = h.registry.register_for(&acme().tenant, taken).unwrap_err();
    assert_eq!(err.code(), ErrorCode::RegistryConflict);
    refused_at_load("f.mcpname.dot", json!({"mcp_name": "a.b.c"}), "mcp_name");
    refused_at_load(
        "f.mcpname.res",
        json!({"mcp_name": "run_skill"}),
        "mcp_name",
    );

    // output_content: the output's `content` blocks are checked (a malformed one
    // fails the call), the rest against the output schema; the output is answered
    // as is, and its End holds only its digest and size.
    h.tool(
        "f.content.tool",
        json!({"output_content": true,
               "output_schema": {"type": "object", "properties": {"n": {"type": "integer"}},
                                 "additionalProperties": false}}),
    );
    let image = json!({"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"});
    let out = json!({"content": [image], "n": 1});
    let r = h.call("f.content.tool", json!({"emit": out})).await;
    assert_eq!(r.status, CallStatus::Ok, "{r:?}");
    assert_eq!(r.output, Some(out));
    let end = h
        .sink
        .records()
        .into_iter()
        .find_map(|rec| match rec.payload {
            EvidenceEvent::End(e) if e.call_id == r.call_id => Some(e),
            _ => None,
        })
        .unwrap();
    assert!(end.output_digest.is_some());
    assert!(end.usage.bytes_out > 0);
    let recorded = serde_json::to_string(&h.sink.records()).unwrap();
    assert!(
        !recorded.contains("iVBORw0KGgo="),
        "raw content in evidence"
    );
    let bad =
        json!({"content": [{"type": "image", "data": "not base64!", "mimeType": "image/png"}]});
    let r = h.call("f.content.tool", json!({"emit": bad})).await;
    assert_eq!(code(&r), Some(ErrorCode::ToolExecutionFailed));
    assert_eq!(
        r.error
            .as_ref()
            .and_then(|e| e.fields.get("pointer"))
            .map(String::as_str),
        Some("/content/0")
    );
    let r = h
        .call(
            "f.content.tool",
            json!({"emit": {"content": [], "extra": 1}}),
        )
        .await;
    assert_eq!(code(&r), Some(ErrorCode::ToolExecutionFailed));
    refused_at_load(
        "f.content.claims",
        json!({"output_content": true,
               "output_schema": {"type": "object", "properties": {"content": {}}}}),
        "output_schema.properties.content",
    );
    refused_at_load(
        "f.content.array",
        json!({"output_content": true, "output_schema": {"type": "array"}}),
        "output_schema",
    );
}
