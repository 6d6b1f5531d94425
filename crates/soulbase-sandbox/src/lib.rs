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
//! path, so a manifest validator can merge them into its own report.
//! - [`Profile`] — what one call may do: the true intersection Grant ∩ Manifest ∩
//!   PolicyConfig ([`intersect`], [`IntersectingProfiles`]), hashed for evidence.
//! - The guard — [`Profile::check`] on every planned [`Operation`] (paths compared by
//!   components after symlinks are resolved, hosts by labels), [`guard_provider`] for
//!   what a provider binding implies; refusals are `SANDBOX.CAPABILITY_BLOCKED`.
//! - [`Sandbox`] and [`LocalSandbox`], which dispatches by provider kind to the
//!   [`BuiltinExecutor`] and to [`Executor`]s plugged in from the edge crates
//!   (`soulbase-sandbox-http`, `soulbase-sandbox-wasm`, `soulbase-sandbox-process`).
//! - [`Scratch`] — the per-call temp directory of a `tmp` grant.
//! - [`cpu`] — the thread CPU clock the in-process executors measure a call's
//!   `cpu_ms` with (builtins: [`cpu::Metered`] around the handler, on the wall
//!   clock until a call of the handler reaches 1 ms, then on the thread CPU clock
//!   for its next [`cpu::CPU_CLOCK_CALLS`] calls).
//! - [`Reporter`] — what a running tool tells its caller before it answers
//!   (progress, log messages), delivered by surfaces that can ([`report`]).
//!
//! The crate does no network IO and knows no wire format. Its only file-system IO is
//! resolving paths for checks ([`resolve`], [`Profile::fs_grants`]) and creating and
//! removing scratch directories ([`Scratch`]).

mod capability;
mod provider;
mod syntax;

pub use capability::{Capability, CapabilityDomain, ClientRequestKind, FsAccess};
pub use provider::{DEFAULT_HTTP_PATH, MAX_HTTP_TIMEOUT_MS, ProviderBinding, ProviderKind};
pub use syntax::{TemplatePart, is_valid_host, is_valid_host_pattern, parse_env_template};

/// One syntactic problem found by a `validate()` method: the field path relative to
/// the validated value (e.g. `hosts[0]`, or empty for the value itself) and what is
/// wrong with it.
pub type FieldProblem = (String, String);

mod builtin;
pub mod cpu;
mod exec;
mod guard;
mod intersect;
mod path;
mod profile;
pub mod report;
mod scratch;

pub use builtin::{BuiltinExecutor, BuiltinHandler, handler_fn};
pub use exec::{
    ExecOutput, ExecRequest, Executor, LocalSandbox, Sandbox, endpoint_parts, guard_provider,
    host_matches,
};
pub use guard::{FsGrant, Operation};
pub use intersect::{intersect, intersect_one};
pub use path::{normalize, path_covers, resolve};
pub use profile::{
    DeclaredProfiles, IntersectingProfiles, Profile, ProfileBuilder, parse_capabilities,
};
pub use report::{
    ClientRequest, ClientRequests, ClientResponse, ClientSink, ElicitationAction, LogLevel,
    MAX_CLIENT_REQUESTS, Report, ReportSink, Reporter, SamplingMessage, SamplingRole,
    govern_client_requests,
};
pub use scratch::Scratch;
