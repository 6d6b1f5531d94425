//! Builtin tools every server carries (global, enabled; calls still need policy):
//!
//! - `soulbase.builtin.echo` — returns `{"echo": <arguments>}`;
//! - `soulbase.builtin.sleep` — waits `ms` milliseconds (≤ 30 000), returns
//!   `{"slept_ms": ms}`; for probing timeouts and shutdown;
//! - `soulbase.builtin.counter` — idempotent by key; returns the number of times it
//!   actually executed, so an idempotent replay is observable.
//!
//! Two test hooks for crash drills, off unless their environment variable is set
//! (a warning is printed when one is):
//!
//! - [`LEDGER_ENV`] (`SOULBASED_TEST_LEDGER=<file>`) adds `soulbase.test.ledger`,
//!   idempotent by key, which appends its argument `id` and a newline to that file
//!   (one `write`, `O_APPEND`): executions are counted across processes;
//! - [`FAULT_ENV`] (`SOULBASED_FAULT_POINT=<point>`, a
//!   [`FaultPoint`] name: `claimed`, `begun`, `running`, `executed`, `completed`,
//!   `ended`) makes the process kill itself (`SIGKILL`) when a keyed call reaches
//!   that point.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use soulbase_errors::SoulError;
use soulbase_sandbox::{BuiltinExecutor, handler_fn};
use soulbase_tools::pipeline::{FaultHook, FaultPoint};
use soulbase_tools::{Registry, ToolManifest, ToolOwner};

/// The environment variable naming the test ledger file (crash drills only).
pub const LEDGER_ENV: &str = "SOULBASED_TEST_LEDGER";
/// The environment variable naming the [`FaultPoint`] at which the process kills
/// itself (crash drills only).
pub const FAULT_ENV: &str = "SOULBASED_FAULT_POINT";

/// The test ledger tool's manifest.
fn ledger_manifest() -> Value {
    json!({
        "id": "soulbase.test.ledger",
        "version": "1.0.0",
        "display_name": "Test ledger",
        "description": "Appends its id to the test ledger file; idempotent by key (crash drills only).",
        "tags": ["builtin", "diagnostic"],
        "input_schema": {
            "type": "object",
            "properties": {"id": {"type": "string", "maxLength": 200}},
            "required": ["id"],
            "additionalProperties": false
        },
        "output_schema": {"type": "object", "properties": {"recorded": {"type": "string"}}, "required": ["recorded"]},
        "side_effect": "none",
        "idempotency": "keyed"
    })
}

/// The fault hook [`FAULT_ENV`] asks for: `SIGKILL` to this process at that point.
/// `None` when unset; an unknown point name is a warning and no hook.
pub fn fault_hook_from_env() -> Option<FaultHook> {
    let name = std::env::var(FAULT_ENV).ok()?;
    let Some(point) = FaultPoint::from_name(&name) else {
        eprintln!("soulbased: warning: {FAULT_ENV}={name} names no fault point; ignored");
        return None;
    };
    eprintln!("soulbased: warning: test hook {FAULT_ENV}={name}: the process kills itself there");
    Some(Arc::new(move |at| {
        if at == point {
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::KILL,
            );
            // Not reached; should the signal fail, stop all the same.
            std::process::abort();
        }
    }))
}

/// The builtin tools' manifests.
pub fn manifests() -> Vec<Value> {
    vec![
        json!({
            "id": "soulbase.builtin.echo",
            "version": "1.0.0",
            "display_name": "Echo",
            "description": "Returns its arguments unchanged under `echo`.",
            "tags": ["builtin", "diagnostic"],
            "input_schema": {"type": "object"},
            "output_schema": {"type": "object", "properties": {"echo": {"type": "object"}}, "required": ["echo"]},
            "side_effect": "none"
        }),
        json!({
            "id": "soulbase.builtin.sleep",
            "version": "1.0.0",
            "display_name": "Sleep",
            "description": "Waits the given number of milliseconds, then returns.",
            "tags": ["builtin", "diagnostic"],
            "input_schema": {
                "type": "object",
                "properties": {"ms": {"type": "integer", "minimum": 0, "maximum": 30000}},
                "required": ["ms"],
                "additionalProperties": false
            },
            "output_schema": {"type": "object", "properties": {"slept_ms": {"type": "integer"}}, "required": ["slept_ms"]},
            "side_effect": "none",
            "limits": {"timeout_ms": 31000}
        }),
        json!({
            "id": "soulbase.builtin.counter",
            "version": "1.0.0",
            "display_name": "Counter",
            "description": "Counts its executions; idempotent by key, so a retried key is not counted again.",
            "tags": ["builtin", "diagnostic"],
            "input_schema": {"type": "object"},
            "output_schema": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]},
            "side_effect": "none",
            "idempotency": "keyed"
        }),
    ]
}

fn sleep_ms(args: &Value) -> Result<u64, SoulError> {
    // The input schema already bounds `ms`; this only guards a direct handler call.
    args.get("ms")
        .and_then(Value::as_u64)
        .filter(|ms| *ms <= 30_000)
        .ok_or_else(|| {
            SoulError::new(
                soulbase_errors::ErrorCode::SchemaValidationFailed,
                "ms must be an integer in 0..=30000",
            )
            .with_field("field", "ms")
        })
}

/// Registers the builtin handlers on `executor`.
pub fn register_handlers(executor: &BuiltinExecutor) {
    executor.register(
        "soulbase.builtin.echo",
        handler_fn(|args| async move { Ok(json!({ "echo": args })) }),
    );
    executor.register(
        "soulbase.builtin.sleep",
        handler_fn(|args| async move {
            let ms = sleep_ms(&args)?;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(json!({ "slept_ms": ms }))
        }),
    );
    if let Ok(path) = std::env::var(LEDGER_ENV) {
        eprintln!(
            "soulbased: warning: test hook {LEDGER_ENV}: soulbase.test.ledger appends to {path}"
        );
        executor.register(
            "soulbase.test.ledger",
            handler_fn(move |args| {
                let path = path.clone();
                async move {
                    let id = args.get("id").and_then(Value::as_str).unwrap_or_default();
                    let line = format!("{id}\n");
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)
                        .and_then(|mut f| f.write_all(line.as_bytes()))
                        .map_err(|e| {
                            SoulError::new(
                                soulbase_errors::ErrorCode::ToolExecutionFailed,
                                "the test ledger could not be written",
                            )
                            .with_note(e.to_string())
                        })?;
                    Ok(json!({ "recorded": id }))
                }
            }),
        );
    }
    let count = Arc::new(AtomicU64::new(0));
    executor.register(
        "soulbase.builtin.counter",
        handler_fn(move |_| {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            async move { Ok(json!({ "count": n })) }
        }),
    );
}

/// Registers and enables the builtin tools as global tools.
pub fn register_tools(registry: &Registry) -> Result<(), SoulError> {
    let mut all = manifests();
    if std::env::var_os(LEDGER_ENV).is_some() {
        all.push(ledger_manifest());
    }
    for m in all {
        let manifest = ToolManifest::from_json_str(&m.to_string()).map_err(SoulError::from)?;
        let id = manifest.id.clone();
        registry.register(manifest)?;
        registry.enable(&ToolOwner::Global, &id)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn builtin_manifests_register_and_enable() {
        let registry = Registry::new();
        register_tools(&registry).unwrap();
        let tenant = soulbase_types::TenantId::new("acme").unwrap();
        assert_eq!(registry.list_enabled(&tenant).len(), 3);
    }

    #[test]
    fn sleep_refuses_out_of_range() {
        assert!(sleep_ms(&json!({"ms": 5})).is_ok());
        assert_eq!(
            sleep_ms(&json!({"ms": 40_000})).unwrap_err().field("field"),
            Some("ms")
        );
        assert!(sleep_ms(&json!({})).is_err());
    }
}
