//! Soulbase's WASM executor: tools as WASI preview 1 command modules on wasmtime.
//!
//! - **Pinned code.** A binding names a module file (relative to
//!   [`WasmOptions::module_root`]) and its SHA-256. The file's digest must match or
//!   the call is refused (`SANDBOX.CAPABILITY_BLOCKED`). Each digest is compiled once
//!   and kept as an `InstancePre`; every call gets a fresh instance from the pooling
//!   allocator, so nothing survives between calls.
//! - **Deadline.** Epoch interruption: a ticker advances the engine's epoch every
//!   [`EPOCH_TICK`]; at each tick a call checks its wall-clock deadline and traps past
//!   it (`PROVIDER.TIMEOUT`).
//! - **Caps.** Linear memory and tables are capped per store (growing past the cap
//!   traps → `TOOL.EXECUTION_FAILED`); stdout is capped at the call's `max_bytes_out`.
//! - **WASI.** JSON arguments on stdin, JSON result on stdout (the ABI is in
//!   `docs/wasm-abi.md`). Only the profile's `fs` grants are preopened, at their
//!   resolved host paths (read-only unless `write` is granted); a `tmp` grant adds a
//!   fresh scratch directory at `/tmp`. No environment variables, no arguments beyond
//!   the program name, no sockets.
//! - **Threads.** Runs happen on tokio's blocking pool, never on async workers.

mod engine;
mod executor;

pub use engine::EPOCH_TICK;
pub use executor::{WasmExecutor, WasmOptions};
