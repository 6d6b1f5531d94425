//! Soulbase's sandbox vocabulary: what a tool may be granted and how it is run.
//!
//! Side effects happen only through the sandbox (SB-08 invariant 3). Before the
//! sandbox can enforce anything, the rest of the system needs a shared language for
//! it, and that is what this crate provides today:
//!
//! - [`Capability`] — one least-privilege grant a tool declares in its manifest
//!   (`fs` paths and access, `net` hosts, `proc` commands, `tmp` space, `browser`).
//!   A call's effective profile is later computed as Grant ∩ Manifest ∩ PolicyConfig.
//! - [`ProviderBinding`] — how a tool executes: compiled-in `builtin`, an `http`
//!   service, a `wasm` module or a `process`.
//!
//! Both are plain serde data with a syntactic [`Capability::validate`] /
//! [`ProviderBinding::validate`] that report every problem with a relative field
//! path, so a manifest validator can merge them into its own report. The executors
//! and the pre-execution guard will live here too; they are not written yet.
//!
//! This crate does no IO.

mod capability;
mod provider;
mod syntax;

pub use capability::{Capability, CapabilityDomain, FsAccess};
pub use provider::{DEFAULT_HTTP_PATH, MAX_HTTP_TIMEOUT_MS, ProviderBinding, ProviderKind};
pub use syntax::{is_valid_host, is_valid_host_pattern};

/// One syntactic problem found by a `validate()` method: the field path relative to
/// the validated value (e.g. `hosts[0]`, or empty for the value itself) and what is
/// wrong with it.
pub type FieldProblem = (String, String);

mod builtin;
mod exec;
mod profile;

pub use builtin::{BuiltinExecutor, BuiltinHandler, handler_fn};
pub use exec::{ExecOutput, ExecRequest, LocalSandbox, Sandbox, guard_provider, host_matches};
pub use profile::{DeclaredProfiles, Profile, ProfileBuilder};
