//! The governed invocation pipeline (R4): the orchestrator and its seams.
//!
//! Order, exactly as R4: resolve → input schema → authorization → provider terms → quota → consent →
//! profile (Grant ∩ Manifest ∩ PolicyConfig) → sandbox guard → **EvidenceBegin** →
//! sandboxed execution → output checks → **EvidenceEnd** → obligations → result.
//! Idempotent replays are answered right after authorization (so only an authorized
//! caller can see a stored result) and before quota (a replay consumes nothing).
//! A call that can change nothing (no side effects, low safety class, no consent,
//! not keyed, builtin or WASM, no capabilities) has its Begin queued rather than
//! durable when it runs; its result waits for Begin and End, and a Begin that does
//! not land refuses the call (see `EvidenceSink::submit`).
//!
//! Every seam is a trait with an in-process implementation in its own crate:
//! [`ToolResolver`] (the registry), `Authorizer` and `ConsentVerifier`
//! (soulbase-auth), `QuotaGate` (soulbase-qos), `ProfileBuilder` and `Sandbox`
//! (soulbase-sandbox), `EvidenceSink` (soulbase-observe) and [`IdempotencyStore`].
//!
//! # Stage spans
//!
//! Each stage a call passes through runs in its own `tracing` span, a child of the
//! span current when [`Invoker::invoke`] is polled (soulbased's `execute_tool {tool}`
//! span). The spans are `DEBUG` level with the target [`STAGE_TARGET`] and static
//! names; disabled, each costs one cached callsite check. In call order:
//!
//! | span                | stage                                                     |
//! |---------------------|-----------------------------------------------------------|
//! | `resolve`           | registry lookup (`TOOL.NOT_FOUND`, `TOOL.DISABLED`)        |
//! | `schema`            | input schema, `max_bytes_in`, required idempotency key    |
//! | `authorize`         | the `Authorizer` (`invoke`; `preflight` too in preflight) |
//! | `terms`             | the provider's terms (`CallTerms`: skills' imports, subscriptions) |
//! | `idempotency`       | claiming the idempotency key (keyed tools only)           |
//! | `quota`             | quota reservation, then the terms' metered gate (a check, in preflight) |
//! | `consent`           | the `ConsentVerifier` (tools requiring consent only)       |
//! | `consent.request`   | opening (or finding) the consent request of a call refused `CONSENT.REQUIRED` |
//! | `profile`           | Grant ∩ Manifest ∩ PolicyConfig                           |
//! | `guard`             | the sandbox's guard                                       |
//! | `concurrency`       | the concurrency slot (tools with a limit only)            |
//! | `evidence.begin`    | recording the Begin (queueing it, for a call that changes nothing) |
//! | `idempotency.begin` | marking the key begun, first thing inside `execute` (keyed only) |
//! | `execute`           | sandboxed execution (timeout, panic)                      |
//! | `output`            | `max_bytes_out` and output schema                         |
//! | `obligations`       | mask / redact / watermark (tools with obligations only)   |
//! | `idempotency.store` | a keyed call's outcome stored with its End (before `evidence.end`) |
//! | `evidence.end`      | recording the End                                         |
//! | `quota.settle`      | settling the reservation with the usage                   |
//! | `idempotency.store` | releasing the key of a keyed call refused                 |
//! | `quota.refund`      | refunding the reservation of a call refused after `quota` |
//! | `evidence.denial`   | recording the denial of a call refused before execution   |
//!
//! The stage that refuses or fails a call carries `error.type` (the stable error
//! code, e.g. `POLICY.DENY_TOOL`) and `otel.status_code = ERROR`. An idempotent replay
//! ends after `idempotency`. [`Invoker::preflight`] runs its checks (`resolve` to
//! `guard`) inside a `preflight` span of the same target.

mod call;
mod concurrency;
mod fault;
mod idempotency;
mod inflight;
mod invoker;
mod obligations;
pub mod router;
mod stage;
mod terms;

pub use call::{CallResult, CallStatus, PreflightReport, ToolCall, is_denial};
pub use fault::{FaultHook, FaultPoint};
pub use idempotency::{
    Claim, IdempotencyKey, IdempotencyStore, MemoryIdempotency, StoredOutcome, interrupted_outcome,
};
pub use invoker::{Invoker, InvokerBuilder, ToolResolver};
pub use obligations::apply_obligations;
pub use router::{ToolCallRouter, ToolMessage};
/// What a running tool reports before it answers (given to the executor with the call).
pub use soulbase_sandbox::{
    ClientRequest, ClientRequestKind, ClientResponse, ClientSink, ElicitationAction, LogLevel,
    Report, ReportSink, Reporter, SamplingMessage, SamplingRole,
};
pub use stage::STAGE_TARGET;
pub use terms::{Admission, CallTerms};
