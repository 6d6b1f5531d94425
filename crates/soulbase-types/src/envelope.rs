//! The envelope every event and evidence record travels in.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ActorId, EnvelopeId, Origin, TenantId, TraceContext};

/// Milliseconds since the Unix epoch (UTC).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
pub struct UnixMillis(pub i64);

impl UnixMillis {
    /// The current wall-clock time.
    pub fn now() -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        Self(i64::try_from(now).unwrap_or(i64::MAX))
    }
}

/// A payload stamped with who, where from, when and under which trace.
///
/// Registration events, state changes and invocation Begin/End all travel in one,
/// so that a consumer can route, partition and correlate without knowing the payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "{T}Envelope", deny_unknown_fields)]
pub struct Envelope<T> {
    /// Unique, time-ordered id of this envelope (the idempotency key for persistence).
    pub id: EnvelopeId,
    /// The tenant the payload belongs to.
    pub tenant: TenantId,
    /// The actor that caused it.
    pub actor: ActorId,
    /// Where the causing request came from.
    pub origin: Origin,
    /// The caller's trace, when one was propagated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceContext>,
    /// When the envelope was produced.
    pub at: UnixMillis,
    /// The event itself.
    pub payload: T,
}

impl<T> Envelope<T> {
    /// Wraps `payload` with a fresh id and the current time.
    pub fn new(tenant: TenantId, actor: ActorId, origin: Origin, payload: T) -> Self {
        Self {
            id: EnvelopeId::generate(),
            tenant,
            actor,
            origin,
            trace: None,
            at: UnixMillis::now(),
            payload,
        }
    }

    /// Sets the trace context (builder style).
    pub fn with_trace(mut self, trace: Option<TraceContext>) -> Self {
        self.trace = trace;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_serializes_with_payload() {
        let env = Envelope::new(
            TenantId::new("acme").unwrap(),
            ActorId::new("alice").unwrap(),
            Origin::Llm,
            serde_json::json!({"k": 1}),
        );
        let v = serde_json::to_value(&env).unwrap();
        assert_eq!(v["tenant"], "acme");
        assert_eq!(v["origin"], "llm");
        assert_eq!(v["payload"]["k"], 1);
        assert!(v.get("trace").is_none());
        let back: Envelope<serde_json::Value> = serde_json::from_value(v).unwrap();
        assert_eq!(back, env);
    }
}
