//! Soulbase's WASM executor: tools as WASI preview 1 command modules on wasmtime.
//!
//! - **Pinned code.** A binding names a module file (relative to
//!   [`WasmOptions::module_root`]) and its SHA-256. The file's digest must match or
//!   the call is refused (`SANDBOX.CAPABILITY_BLOCKED`). Each digest is compiled once
//!   and kept as an `InstancePre`; every call gets a fresh instance from the pooling
//!   allocator, so nothing survives between calls.
//! - **Deadline.** Epoch interruption: a ticker advances the engine's epoch every
//!   [`EPOCH_TICK`] while a call is running (idle, it sleeps until one starts); at
//!   each tick a call checks its wall-clock deadline and traps past
//!   it (`PROVIDER.TIMEOUT`). A module waiting in a host call (`poll_oneoff`, a read)
//!   never reaches a tick, so WASI's host functions are async and the whole call is
//!   one future, dropped at the deadline with its store and instance: a call's pool
//!   slot is back within one deadline of being taken, whatever the module does.
//! - **Slots.** [`WasmOptions::max_instances`] calls at once (the pool), of which one
//!   tenant may hold [`WasmOptions::max_instances_per_tenant`] (its share; config
//!   `sandbox.wasm_max_instances_per_tenant`). Over its share a tenant is refused
//!   with `QUOTA.RATE_LIMITED`, a full pool with `PROVIDER.UNAVAILABLE` — at the guard
//!   and again when `execute` takes the slot. [`WasmExecutor::live_instances`] counts
//!   the slots held.
//! - **Caps.** Linear memory and tables are capped per store (growing past the cap
//!   traps → `TOOL.EXECUTION_FAILED`); stdout is capped at the call's `max_bytes_out`.
//! - **WASI.** JSON arguments on stdin, JSON result on stdout (the ABI is in
//!   `docs/wasm-abi.md`). Only the profile's `fs` grants are preopened, at their
//!   resolved host paths (read-only unless `write` is granted); a `tmp` grant adds a
//!   fresh scratch directory at `/tmp`. No environment variables, no arguments beyond
//!   the program name, no sockets.
//! - **Threads.** Runs happen on tokio's blocking pool, never on async workers: each
//!   run's future is driven by its blocking thread (`Handle::block_on`), whose timers
//!   come from the caller's runtime (which must have time enabled).
//! - **CPU time.** A successful call's `cpu_ms` is that thread's CPU time over the
//!   run (`CLOCK_THREAD_CPUTIME_ID`: instantiation, the module's code, WASI calls
//!   served inline; not file IO handed to the blocking pool), rounded up to whole
//!   milliseconds.

mod engine;
mod executor;
mod slots;

pub use engine::EPOCH_TICK;
pub use executor::{WasmExecutor, WasmOptions};
