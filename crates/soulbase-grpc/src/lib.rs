//! Soulbase's gRPC edge (`soulbase.tools.v1`).
//!
//! - [`RegistryService`] serves `ToolRegistry` (register, update, state changes,
//!   get, list with filters, and a server-streaming watch of registry events) over a
//!   [`soulbase_tools::Registry`]; writes are authorized by the
//!   [`soulbase_auth::Authorizer`] with the registry actions (`register`, `update`,
//!   `unregister`, `enable`, `disable`, `deprecate`).
//! - [`InvokerService`] serves `ToolInvoker` (preflight, invoke) through the one
//!   [`soulbase_edge::Stack`]: the whole governed pipeline runs in-process;
//!   `ListTools` is the caller's governed list from the same stack; failures are gRPC statuses carrying `soulbase.errors.v1.ErrorDetail`
//!   (R5) plus trailers naming the call, its outcome and its evidence.
//! - [`ConsentGrpcService`] serves `soulbase.auth.v1.Consent` (issue, revoke)
//!   through the one `soulbase_edge::ConsentDesk`, for callers authenticated like
//!   `ToolInvoker`'s.
//! - [`RemoteInvoker`] is the client: the same `invoke` / `preflight` signatures as
//!   the in-process invoker, so a Rust service can swap one for the other.
//! - Subjects come from metadata through `soulbase_edge::SubjectResolver`;
//!   [`RemoteAuth`] is its credential check when the auth role runs elsewhere.
//! - [`roles`] serves the `auth` and `qos` roles (`soulbase.auth.v1`,
//!   `soulbase.qos.v1`) over their in-process seams, with the clients
//!   [`RemoteAuth`] (an `Authorizer`, a `ConsentVerifier` and the credential check) and
//!   [`RemoteQuotaGate`] (a `QuotaGate`) for a `tools` role running elsewhere, and
//!   `role_channel`, the connection every role client uses (a connect timeout and
//!   HTTP/2 pings, so a role gone silent fails requests instead of holding them).
//! - [`sandbox_role`] serves the `sandbox` role (`soulbase.sandbox.v1`):
//!   [`SandboxRoleService`] guards and runs planned calls on an in-process
//!   [`soulbase_sandbox::Sandbox`], narrowing each profile by its own ceiling;
//!   [`RemoteSandbox`] is the client `Sandbox` (provider guard locally, execution
//!   remotely under a deadline).
//! - [`evidence_role`] serves the `evidence` role (`soulbase.evidence.v1`):
//!   [`EvidenceRoleService`] appends, reads, lists and replays evidence over a
//!   [`soulbase_observe::EvidenceStore`]; [`RemoteEvidence`] is the client
//!   `EvidenceStore` and `EvidenceSink`, plus [`RemoteEvidence::replay`].
//!
//! Conversions between the wire messages and the core types are in [`convert`].

mod client;
mod consent;
pub mod convert;
pub mod evidence_role;
mod invoker;
mod registry;
pub mod roles;
pub mod sandbox_role;

pub use client::{Credentials, RemoteInvoker};
pub use consent::ConsentGrpcService;
pub use evidence_role::{EvidenceRoleService, RemoteEvidence};
pub use invoker::{InvokerService, result_status};
pub use registry::RegistryService;
pub use roles::{
    AuthRoleService, QosRoleService, RemoteAuth, RemoteQuotaGate, evidence_proto, sandbox_proto,
};
pub use sandbox_role::{RemoteSandbox, SandboxRoleService};
/// The pipeline's denial classification (re-exported for clients and metrics).
pub use soulbase_tools::pipeline::is_denial;

/// The generated `soulbase.tools.v1` messages, clients and servers.
pub use soulbase_proto::tools::v1 as proto;

/// Trailer naming the call (failed invocations).
pub const TRAILER_CALL_ID: &str = "x-soulbase-call-id";
/// Trailer with `denied` or `error` (failed invocations).
pub const TRAILER_OUTCOME: &str = "x-soulbase-outcome";
/// Trailer with the Begin envelope id when execution began (failed invocations).
pub const TRAILER_EVIDENCE_REF: &str = "x-soulbase-evidence-ref";
/// Trailer `true` when a stored failure was replayed for a repeated idempotency key.
pub const TRAILER_REPLAYED: &str = "x-soulbase-replayed";
