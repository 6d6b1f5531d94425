//! Soulbase's shared vocabulary.
//!
//! Every crate above this one speaks in these types, so they are the place where
//! "is this a valid tenant / tool id / call id?" is decided once. Each identifier is
//! a newtype whose constructor validates its input: once you hold a [`ToolId`] it is
//! well formed, and nothing downstream re-checks it.
//!
//! This crate does no IO and knows no wire format beyond serde.

mod envelope;
mod fast_id;
mod ids;
mod obligation;
mod origin;
mod rate;
mod subject;
mod surface;
mod tool_id;
mod tool_pattern;
mod trace;

pub use envelope::{Envelope, UnixMillis};
pub use ids::{ActorId, CallId, EnvelopeId, IdError, TenantId};
pub use obligation::{Obligation, ObligationFailure, ObligationKind};
pub use origin::Origin;
pub use rate::Rate;
pub use subject::Subject;
pub use surface::Surface;
pub use tool_id::{TOOL_URN_PREFIX, ToolId};
pub use tool_pattern::ToolPattern;
pub use trace::TraceContext;
