//! The governed invocation pipeline (R4): the orchestrator and its seams.
//!
//! Order, exactly as R4: resolve → input schema → authorization → quota → consent →
//! profile (Grant ∩ Manifest ∩ PolicyConfig) → sandbox guard → **EvidenceBegin** →
//! sandboxed execution → output checks → **EvidenceEnd** → obligations → result.
//! Idempotent replays are answered right after authorization (so only an authorized
//! caller can see a stored result) and before quota (a replay consumes nothing).
//!
//! Every seam is a trait with an in-process implementation in its own crate:
//! [`ToolResolver`] (the registry), `Authorizer` and `ConsentVerifier`
//! (soulbase-auth), `QuotaGate` (soulbase-qos), `ProfileBuilder` and `Sandbox`
//! (soulbase-sandbox), `EvidenceSink` (soulbase-observe) and [`IdempotencyStore`].

mod call;
mod concurrency;
mod idempotency;
mod invoker;
mod obligations;
mod router;

pub use call::{CallResult, CallStatus, PreflightReport, ToolCall};
pub use idempotency::{Claim, IdempotencyKey, IdempotencyStore, MemoryIdempotency, StoredOutcome};
pub use invoker::{Invoker, InvokerBuilder, ToolResolver};
pub use obligations::apply_obligations;
pub use router::{ToolCallRouter, ToolMessage};
