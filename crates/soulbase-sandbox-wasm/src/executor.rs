//! The executor: load and pin modules, instantiate per call, run under limits.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::Value;
use sha2::{Digest, Sha256};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_sandbox::cpu::{ThreadCpu, cpu_ms};
use soulbase_sandbox::{ExecOutput, ExecRequest, Executor, ProviderBinding, Scratch, path_covers};
use soulbase_types::TenantId;
use wasmtime::{
    InstancePre, Linker, Module, Store, StoreLimits, StoreLimitsBuilder, Trap, UpdateDeadline,
};
use wasmtime_wasi::p1::{self, WasiP1Ctx};
use wasmtime_wasi::p2::pipe::{MemoryInputPipe, MemoryOutputPipe};
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

use crate::engine::{Ticking, Ticks};
use crate::slots::{Slot, Slots};

/// How the WASM executor runs modules.
#[derive(Debug, Clone)]
pub struct WasmOptions {
    /// Where binding `module` paths are resolved; a module outside it is refused.
    pub module_root: PathBuf,
    /// Linear memory cap per call, in bytes.
    pub max_memory_bytes: usize,
    /// Table elements cap per call.
    pub max_table_elements: usize,
    /// Instances alive at once (the pool's size); a call beyond it is refused with
    /// `PROVIDER.UNAVAILABLE`.
    pub max_instances: u32,
    /// Instances one tenant may have alive at once (its share of the pool, at least
    /// 1); a call beyond it is refused with `QUOTA.RATE_LIMITED`. At or above
    /// `max_instances` only the pool's own limit applies.
    pub max_instances_per_tenant: u32,
    /// The stdout cap when the call has no `max_bytes_out`.
    pub max_output_bytes: usize,
    /// Where per-call scratch directories are created.
    pub scratch_parent: PathBuf,
}

impl WasmOptions {
    /// Options from the `sandbox` config section: modules under
    /// `sandbox.wasm_module_root` (else `skills_dir`), its memory cap, per-tenant
    /// instance share (`sandbox.wasm_max_instances_per_tenant`) and scratch dir.
    pub fn from_config(
        config: &soulbase_config::SandboxConfig,
        skills_dir: &std::path::Path,
    ) -> Self {
        let mut o = Self::new(
            config
                .wasm_module_root
                .clone()
                .unwrap_or_else(|| skills_dir.to_path_buf()),
        );
        o.max_memory_bytes = usize::try_from(config.wasm_max_memory_bytes).unwrap_or(usize::MAX);
        o.max_instances_per_tenant = config.wasm_max_instances_per_tenant;
        if let Some(dir) = &config.scratch_dir {
            o.scratch_parent = dir.clone();
        }
        o
    }

    /// Defaults with modules under `module_root`: 64 MiB memory, 10 000 table
    /// elements, 64 concurrent instances of which one tenant may hold 32, 4 MiB
    /// output, scratch in the system temp dir.
    pub fn new(module_root: impl Into<PathBuf>) -> Self {
        Self {
            module_root: module_root.into(),
            max_memory_bytes: 64 << 20,
            max_table_elements: 10_000,
            max_instances: 64,
            max_instances_per_tenant: 32,
            max_output_bytes: 4 << 20,
            scratch_parent: std::env::temp_dir(),
        }
    }
}

struct State {
    wasi: WasiP1Ctx,
    limits: StoreLimits,
}

/// The WASM executor; plug it into `LocalSandbox` for `ProviderKind::Wasm`.
/// Cheap to clone (shared engine and module cache).
#[derive(Clone)]
pub struct WasmExecutor {
    inner: Arc<Inner>,
}

struct Inner {
    options: WasmOptions,
    root: PathBuf,
    engine: Arc<Ticking>,
    linker: Linker<State>,
    modules: RwLock<HashMap<String, Arc<InstancePre<State>>>>,
    slots: Arc<Slots>,
}

fn unavailable(note: String) -> SoulError {
    SoulError::of(ErrorCode::ProviderUnavailable).with_note(note)
}

fn blocked(note: String) -> SoulError {
    SoulError::of(ErrorCode::SandboxCapabilityBlocked).with_note(note)
}

fn failed(note: String) -> SoulError {
    SoulError::of(ErrorCode::ToolExecutionFailed).with_note(note)
}

impl WasmExecutor {
    /// Starts the engine (and its epoch ticker). Fails with `PROVIDER.UNAVAILABLE`
    /// when the module root does not exist or the engine cannot start.
    pub fn new(options: WasmOptions) -> Result<Self, SoulError> {
        let root = options.module_root.canonicalize().map_err(|e| {
            unavailable(format!(
                "module root {}: {e}",
                options.module_root.display()
            ))
        })?;
        let engine = Arc::new(Ticking::new(
            options.max_memory_bytes,
            options.max_instances,
        )?);
        let mut linker: Linker<State> = Linker::new(&engine.engine);
        // Async host functions: a call waiting in the host (`poll_oneoff`, file IO) is
        // a pending future that is dropped at the deadline, instance and all.
        p1::add_to_linker_async(&mut linker, |s: &mut State| &mut s.wasi)
            .map_err(|e| unavailable(format!("cannot link WASI: {e}")))?;
        let slots = Arc::new(Slots::new(
            options.max_instances,
            options.max_instances_per_tenant,
        ));
        Ok(Self {
            inner: Arc::new(Inner {
                options,
                root,
                engine,
                linker,
                modules: RwLock::new(HashMap::new()),
                slots,
            }),
        })
    }

    /// Calls holding an instance slot now, across tenants. A slot is taken when a call
    /// is admitted and given back once its instance has been dropped: when the module
    /// finished, or at the call's deadline at the latest, even if the module was
    /// blocked in a host call then.
    pub fn live_instances(&self) -> u32 {
        self.inner.slots.live()
    }

    /// Calls of `tenant` holding an instance slot now (see
    /// [`WasmExecutor::live_instances`]); at most
    /// [`WasmOptions::max_instances_per_tenant`].
    pub fn live_instances_of(&self, tenant: &TenantId) -> u32 {
        self.inner.slots.live_for(tenant)
    }

    /// Loads, verifies and compiles a module ahead of its first call (once per
    /// digest). Blocking: call it at startup or from a blocking thread.
    pub fn load(&self, module: &str, sha256: &str) -> Result<(), SoulError> {
        self.inner.instance_pre(module, sha256).map(|_| ())
    }
}

impl Inner {
    /// The module file for a binding, inside the module root.
    fn module_path(&self, module: &str) -> Result<PathBuf, SoulError> {
        let joined = self.root.join(module);
        let path = joined
            .canonicalize()
            .map_err(|e| unavailable(format!("module {module}: {e}")))?;
        if !path_covers(&self.root, &path) {
            return Err(blocked(format!(
                "module {module} lies outside the module root"
            )));
        }
        Ok(path)
    }

    /// Reads a module and checks it against the pinned digest.
    fn read_verified(&self, module: &str, sha256: &str) -> Result<Vec<u8>, SoulError> {
        let path = self.module_path(module)?;
        let bytes =
            std::fs::read(&path).map_err(|e| unavailable(format!("module {module}: {e}")))?;
        let actual = hex::encode(Sha256::digest(&bytes));
        if !actual.eq_ignore_ascii_case(sha256) {
            return Err(blocked(format!(
                "module {module} has sha256 {actual}, the manifest pins {sha256}"
            )));
        }
        Ok(bytes)
    }

    fn cached(&self, sha256: &str) -> Option<Arc<InstancePre<State>>> {
        self.modules
            .read()
            .ok()
            .and_then(|m| m.get(&sha256.to_ascii_lowercase()).cloned())
    }

    fn instance_pre(
        &self,
        module: &str,
        sha256: &str,
    ) -> Result<Arc<InstancePre<State>>, SoulError> {
        if let Some(pre) = self.cached(sha256) {
            return Ok(pre);
        }
        let bytes = self.read_verified(module, sha256)?;
        let actual = sha256.to_ascii_lowercase();
        let compiled = Module::new(&self.engine.engine, &bytes)
            .map_err(|e| failed(format!("module {module} does not compile: {e}")))?;
        let pre = self.linker.instantiate_pre(&compiled).map_err(|e| {
            failed(format!(
                "module {module} cannot link (WASI preview 1 only): {e}"
            ))
        })?;
        let pre = Arc::new(pre);
        if let Ok(mut m) = self.modules.write() {
            m.insert(actual, pre.clone());
        }
        Ok(pre)
    }
}

/// Everything one run needs, owned, so it can move to a blocking thread.
struct Run {
    /// Keeps the epoch ticking while this run is in progress, even if the
    /// executor itself is dropped meanwhile (else the deadline could never fire).
    _ticks: Ticks,
    pre: Arc<InstancePre<State>>,
    stdin: Vec<u8>,
    preopens: Vec<(PathBuf, bool)>,
    scratch: Option<Scratch>,
    timeout: Duration,
    deadline: Instant,
    max_output: usize,
    max_memory: usize,
    max_tables: usize,
}

fn timed_out(timeout: Duration) -> SoulError {
    SoulError::of(ErrorCode::ProviderTimeout).with_note(format!(
        "the module ran past its {} ms deadline",
        timeout.as_millis()
    ))
}

/// Runs one call on the current (blocking) thread and returns at its deadline at the
/// latest. Wasm code is stopped there by the epoch interrupt; a module waiting in a
/// host call is a pending future, which is dropped with its store and instance. The
/// slot is given back only after that drop.
///
/// The whole run is driven by this thread (`block_on`), so its CPU clock measures
/// the call: instantiation, the module's code and the WASI calls served inline
/// (`cpu_ms`); file IO WASI hands to the blocking pool is not counted.
fn run_bounded(
    handle: &tokio::runtime::Handle,
    r: Run,
    slot: Slot,
) -> Result<ExecOutput, SoulError> {
    let (deadline, timeout) = (r.deadline, r.timeout);
    let clock = ThreadCpu::start();
    let outcome = handle.block_on(async move {
        tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), run(r))
            .await
            .unwrap_or_else(|_| Err(timed_out(timeout)))
    });
    let used = clock.used();
    drop(slot);
    outcome.map(|mut out| {
        out.cpu_ms = Some(cpu_ms(used));
        out
    })
}

async fn run(r: Run) -> Result<ExecOutput, SoulError> {
    let stdout = MemoryOutputPipe::new(r.max_output);
    let stderr = MemoryOutputPipe::new(4096);
    let mut wasi = WasiCtxBuilder::new();
    wasi.stdin(MemoryInputPipe::new(r.stdin))
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .args(&["tool"])
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    for (path, write) in &r.preopens {
        let perms = if *write {
            FsPerms::ReadWrite
        } else {
            FsPerms::ReadOnly
        };
        wasi.preopened_dir(path, path.to_string_lossy(), perms)
            .map_err(|e| unavailable(format!("cannot preopen {}: {e}", path.display())))?;
    }
    if let Some(s) = &r.scratch {
        wasi.preopened_dir(s.path(), "/tmp", FsPerms::ReadWrite)
            .map_err(|e| unavailable(format!("cannot preopen the scratch dir: {e}")))?;
    }
    let limits = StoreLimitsBuilder::new()
        .memory_size(r.max_memory)
        .table_elements(r.max_tables)
        .instances(1)
        .trap_on_grow_failure(true)
        .build();
    let mut store = Store::new(
        r.pre.module().engine(),
        State {
            wasi: wasi.build_p1(),
            limits,
        },
    );
    store.limiter(|s| &mut s.limits);
    // The ticker only wakes the store up; the deadline itself is wall-clock time, so a
    // ticker delayed by a busy machine never stretches it.
    let deadline = r.deadline;
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        if Instant::now() >= deadline {
            Ok(UpdateDeadline::Interrupt)
        } else {
            Ok(UpdateDeadline::Continue(1))
        }
    });

    let instance = r
        .pre
        .instantiate_async(&mut store)
        .await
        .map_err(|e| unavailable(format!("cannot instantiate the module: {e}")))?;
    let start = instance
        .get_typed_func::<(), ()>(&mut store, "_start")
        .map_err(|e| failed(format!("the module has no WASI `_start`: {e}")))?;
    let outcome = start.call_async(&mut store, ()).await;
    let stderr_text = || {
        let b = stderr.contents();
        String::from_utf8_lossy(&b[..b.len().min(512)]).into_owned()
    };
    if let Err(e) = outcome {
        match e.downcast_ref::<I32Exit>() {
            Some(I32Exit(0)) => {}
            Some(I32Exit(code)) => {
                return Err(failed(format!(
                    "the module exited with status {code}: {}",
                    stderr_text()
                ))
                .with_field("exit_code", code.to_string()));
            }
            None => {
                if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
                    return Err(timed_out(r.timeout));
                }
                return Err(failed(format!("the module trapped: {e:#}")));
            }
        }
    }
    if let Some(s) = &r.scratch {
        s.check()?;
    }
    let out = stdout.contents();
    if out.len() >= r.max_output {
        return Err(failed(format!(
            "the module's output reached the {} byte cap",
            r.max_output
        )));
    }
    let output: Value = serde_json::from_slice(&out)
        .map_err(|e| failed(format!("the module's stdout is not JSON: {e}")))?;
    Ok(ExecOutput::value(output))
}

#[async_trait]
impl Executor for WasmExecutor {
    fn guard(&self, req: &ExecRequest<'_>) -> Result<(), SoulError> {
        let ProviderBinding::Wasm { module, sha256 } = req.provider else {
            return Err(unavailable(
                "the wasm executor only runs wasm bindings".into(),
            ));
        };
        // A tenant at its share (or a full pool) is refused before the call is
        // evidenced as started; `execute` takes the slot and decides.
        self.inner.slots.check(req.tenant)?;
        if self.inner.cached(sha256).is_some() {
            return Ok(());
        }
        // First use of this digest: refuse a missing or altered module before the call
        // is evidenced as started (compiling waits for `execute`, off the async workers).
        self.inner.read_verified(module, sha256).map(|_| ())
    }

    async fn execute(&self, req: ExecRequest<'_>) -> Result<ExecOutput, SoulError> {
        let ProviderBinding::Wasm { module, sha256 } = req.provider else {
            return Err(unavailable(
                "the wasm executor only runs wasm bindings".into(),
            ));
        };
        let pre = match self.inner.cached(sha256) {
            Some(pre) => pre,
            None => {
                // First use of this digest: read and compile off the async workers.
                let (module, sha) = (module.clone(), sha256.clone());
                let inner = self.inner.clone();
                tokio::task::spawn_blocking(move || inner.instance_pre(&module, &sha))
                    .await
                    .map_err(SoulError::internal)??
            }
        };
        // The slot before anything is built for the run; the deadline counts from here,
        // so the slot is back within one deadline whatever the module does.
        let slot = self.inner.slots.acquire(req.tenant)?;
        let deadline = Instant::now() + req.timeout;
        let handle = tokio::runtime::Handle::try_current().map_err(SoulError::internal)?;
        let preopens = req
            .profile
            .fs_grants(None)
            .into_iter()
            .filter(|g| g.read || g.list || g.write)
            .map(|g| (g.path, g.write))
            .collect();
        let scratch = match req.profile.tmp_bytes() {
            Some(max) => Some(
                Scratch::create(&self.inner.options.scratch_parent, max)?
                    .limit_files(req.max_files),
            ),
            None => None,
        };
        let cap = req
            .max_bytes_out
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
            .unwrap_or(self.inner.options.max_output_bytes)
            .saturating_add(1);
        let job = Run {
            _ticks: self.inner.engine.hold(),
            pre,
            stdin: serde_json::to_vec(&req.args).map_err(SoulError::internal)?,
            preopens,
            scratch,
            timeout: req.timeout,
            deadline,
            max_output: cap,
            max_memory: self.inner.options.max_memory_bytes,
            max_tables: self.inner.options.max_table_elements,
        };
        tokio::task::spawn_blocking(move || run_bounded(&handle, job, slot))
            .await
            .map_err(SoulError::internal)?
    }
}
