//! Builtin tools: Rust handlers compiled into the host, for trusted low-latency work.
//!
//! They still pass the pipeline's profile and guard: a builtin handler declares its
//! capabilities in its manifest like any other tool.

use foldhash::HashMap;
use std::future::Future;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use serde_json::Value;
use soulbase_errors::{ErrorCode, SoulError};

use crate::cpu::{Metered, PollClock, cpu_ms};
use crate::exec::{ExecOutput, ExecRequest};
use crate::report::Reporter;

/// A builtin tool's code.
#[async_trait]
pub trait BuiltinHandler: Send + Sync + 'static {
    /// Runs the tool on validated arguments.
    async fn call(&self, args: Value) -> Result<ExecOutput, SoulError>;

    /// Runs the tool on validated arguments, with the call's [`Reporter`] for
    /// progress and log messages while it runs. The default ignores the reporter
    /// and calls [`BuiltinHandler::call`]; a handler that reports overrides it.
    async fn call_reporting(
        &self,
        args: Value,
        reporter: Reporter,
    ) -> Result<ExecOutput, SoulError> {
        let _ = reporter;
        self.call(args).await
    }
}

struct FnHandler<F>(F);

#[async_trait]
impl<F, Fut> BuiltinHandler for FnHandler<F>
where
    F: Fn(Value) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, SoulError>> + Send + 'static,
{
    async fn call(&self, args: Value) -> Result<ExecOutput, SoulError> {
        (self.0)(args).await.map(ExecOutput::value)
    }
}

/// Wraps an async closure `args -> Result<output, SoulError>` as a handler.
pub fn handler_fn<F, Fut>(f: F) -> Arc<dyn BuiltinHandler>
where
    F: Fn(Value) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, SoulError>> + Send + 'static,
{
    Arc::new(FnHandler(f))
}

/// No handler called `name` is registered.
fn missing(name: &str) -> SoulError {
    SoulError::of(ErrorCode::ProviderUnavailable)
        .with_note(format!("no builtin handler named {name}"))
}

/// The handlers compiled into this process, by name (by default the tool id).
#[derive(Default)]
pub struct BuiltinExecutor {
    handlers: RwLock<HashMap<String, Registered>>,
}

/// A registered handler and how its polls are timed.
#[derive(Clone)]
struct Registered {
    code: Arc<dyn BuiltinHandler>,
    clock: Arc<PollClock>,
}

impl BuiltinExecutor {
    /// No handlers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) the handler called `name`.
    pub fn register(&self, name: impl Into<String>, handler: Arc<dyn BuiltinHandler>) {
        if let Ok(mut h) = self.handlers.write() {
            let clock = Arc::new(PollClock::new());
            h.insert(
                name.into(),
                Registered {
                    code: handler,
                    clock,
                },
            );
        }
    }

    /// The handler `req` names (by default its tool id).
    fn name<'r>(req: &'r ExecRequest<'_>) -> &'r str {
        req.provider
            .builtin_handler(req.tool.as_str())
            .unwrap_or(req.tool.as_str())
    }

    fn handler(&self, req: &ExecRequest<'_>) -> Result<Registered, SoulError> {
        let name = Self::name(req);
        self.handlers
            .read()
            .ok()
            .and_then(|h| h.get(name).cloned())
            .ok_or_else(|| missing(name))
    }

    /// Refuses a call whose handler is not registered.
    pub fn guard(&self, req: &ExecRequest<'_>) -> Result<(), SoulError> {
        let name = Self::name(req);
        let known = self.handlers.read().is_ok_and(|h| h.contains_key(name));
        if known { Ok(()) } else { Err(missing(name)) }
    }

    /// Runs the call's handler. Its output's `cpu_ms` is the time the handler's
    /// polls took ([`Metered`]: their CPU time, on the wall clock while a call's
    /// polls stay under 1 ms, where it cannot change the charge), unless the
    /// handler set one itself: work a handler hands to other threads or processes
    /// is not counted.
    pub async fn execute(&self, req: ExecRequest<'_>) -> Result<ExecOutput, SoulError> {
        let handler = self.handler(&req)?;
        let run = handler.code.call_reporting(req.args, req.reporter);
        let (out, used) = Metered::new(run, &handler.clock).await;
        out.map(|mut out| {
            out.cpu_ms = out.cpu_ms.or(Some(cpu_ms(used)));
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;
    use soulbase_types::{CallId, TenantId, ToolId};

    use super::*;
    use crate::cpu::ThreadCpu;
    use crate::{Profile, ProviderBinding};

    async fn run(exec: &BuiltinExecutor, tool: &str) -> ExecOutput {
        let (call_id, tenant, tool) = (
            CallId::generate(),
            TenantId::new("t1").unwrap(),
            ToolId::new(tool).unwrap(),
        );
        let provider = ProviderBinding::Builtin { handler: None };
        let profile = Profile::new(vec![]);
        let req = ExecRequest {
            call_id: &call_id,
            tenant: &tenant,
            tool: &tool,
            provider: &provider,
            args: json!({}),
            profile: &profile,
            timeout: Duration::from_secs(5),
            max_bytes_out: None,
            max_memory_bytes: None,
            max_processes: None,
            max_files: None,
            reporter: Reporter::none(),
        };
        exec.execute(req).await.unwrap()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn handlers_report_the_cpu_their_polls_used() {
        let exec = BuiltinExecutor::new();
        exec.register(
            "demo.cpu.burn",
            handler_fn(|_| async {
                let clock = ThreadCpu::start();
                let mut x = 0u64;
                while clock.used() < Duration::from_millis(20) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
                Ok(json!({}))
            }),
        );
        assert!(run(&exec, "demo.cpu.burn").await.cpu_ms.unwrap() >= 20);
        // A handler that measured its own CPU keeps its figure.
        struct Own;
        #[async_trait]
        impl BuiltinHandler for Own {
            async fn call(&self, _: Value) -> Result<ExecOutput, SoulError> {
                Ok(ExecOutput {
                    cpu_ms: Some(1234),
                    ..ExecOutput::value(json!({}))
                })
            }
        }
        exec.register("demo.cpu.own", Arc::new(Own));
        assert_eq!(run(&exec, "demo.cpu.own").await.cpu_ms, Some(1234));
    }
}
