//! Builtin tools: Rust handlers compiled into the host, for trusted low-latency work.
//!
//! They still pass the pipeline's profile and guard: a builtin handler declares its
//! capabilities in its manifest like any other tool.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use serde_json::Value;
use soulbase_errors::{ErrorCode, SoulError};

use crate::exec::{ExecOutput, ExecRequest};

/// A builtin tool's code.
#[async_trait]
pub trait BuiltinHandler: Send + Sync + 'static {
    /// Runs the tool on validated arguments.
    async fn call(&self, args: Value) -> Result<ExecOutput, SoulError>;
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

/// The handlers compiled into this process, by name (by default the tool id).
#[derive(Default)]
pub struct BuiltinExecutor {
    handlers: RwLock<HashMap<String, Arc<dyn BuiltinHandler>>>,
}

impl BuiltinExecutor {
    /// No handlers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) the handler called `name`.
    pub fn register(&self, name: impl Into<String>, handler: Arc<dyn BuiltinHandler>) {
        if let Ok(mut h) = self.handlers.write() {
            h.insert(name.into(), handler);
        }
    }

    fn handler(&self, req: &ExecRequest<'_>) -> Result<Arc<dyn BuiltinHandler>, SoulError> {
        let name = req
            .provider
            .builtin_handler(req.tool.as_str())
            .unwrap_or(req.tool.as_str());
        self.handlers
            .read()
            .ok()
            .and_then(|h| h.get(name).cloned())
            .ok_or_else(|| {
                SoulError::of(ErrorCode::ProviderUnavailable)
                    .with_note(format!("no builtin handler named {name}"))
            })
    }

    /// Refuses a call whose handler is not registered.
    pub fn guard(&self, req: &ExecRequest<'_>) -> Result<(), SoulError> {
        self.handler(req).map(|_| ())
    }

    /// Runs the call's handler.
    pub async fn execute(&self, req: ExecRequest<'_>) -> Result<ExecOutput, SoulError> {
        let handler = self.handler(&req)?;
        handler.call(req.args).await
    }
}
