//! W3C trace context, carried from the caller into spans and evidence.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::IdError;

/// A parsed W3C `traceparent` (version 00) plus the opaque `tracestate`.
///
/// Only a valid context is representable: non-zero trace and span ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceContext {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    flags: u8,
}

fn hex_into(out: &mut [u8], s: &str) -> Option<()> {
    if s.len() != out.len() * 2 {
        return None;
    }
    let bytes = s.as_bytes();
    for (i, o) in out.iter_mut().enumerate() {
        let hi = hex_val(bytes[2 * i])?;
        let lo = hex_val(bytes[2 * i + 1])?;
        *o = (hi << 4) | lo;
    }
    Some(())
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    for b in bytes {
        write!(f, "{b:02x}")?;
    }
    Ok(())
}

impl TraceContext {
    /// Builds a context from raw ids; `None` when either id is all zeros (invalid per W3C).
    pub fn new(trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) -> Option<Self> {
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            flags: u8::from(sampled),
        })
    }

    /// Parses a `traceparent` header: `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`.
    pub fn parse_traceparent(s: &str) -> Result<Self, IdError> {
        let bad = |reason| IdError::new("traceparent", s, reason);
        let parts: Vec<&str> = s.trim().split('-').collect();
        if parts.len() != 4 {
            return Err(bad("must have four '-'-separated fields"));
        }
        if parts[0] != "00" {
            return Err(bad("only version 00 is supported"));
        }
        let mut trace_id = [0u8; 16];
        hex_into(&mut trace_id, parts[1])
            .ok_or_else(|| bad("trace id must be 32 lowercase hex digits"))?;
        let mut span_id = [0u8; 8];
        hex_into(&mut span_id, parts[2])
            .ok_or_else(|| bad("span id must be 16 lowercase hex digits"))?;
        let mut flags = [0u8; 1];
        hex_into(&mut flags, parts[3])
            .ok_or_else(|| bad("flags must be 2 lowercase hex digits"))?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return Err(bad("trace id and span id must not be all zeros"));
        }
        Ok(Self {
            trace_id,
            span_id,
            flags: flags[0],
        })
    }

    /// The 16-byte trace id.
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The 8-byte parent span id.
    pub fn span_id(&self) -> [u8; 8] {
        self.span_id
    }

    /// Whether the caller sampled this trace.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        self.trace_id.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for TraceContext {
    /// Formats as a `traceparent` header value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("00-")?;
        write_hex(f, &self.trace_id)?;
        f.write_str("-")?;
        write_hex(f, &self.span_id)?;
        write!(f, "-{:02x}", self.flags)
    }
}

impl Serialize for TraceContext {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TraceContext {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse_traceparent(&s).map_err(serde::de::Error::custom)
    }
}

/// What [`Serialize`] writes: a `traceparent` header value.
impl schemars::JsonSchema for TraceContext {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "TraceContext".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        crate::ids::id_schema(
            "A W3C `traceparent` (version 00).",
            "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_formats() {
        let t = TraceContext::parse_traceparent(SAMPLE).unwrap();
        assert!(t.sampled());
        assert_eq!(t.to_string(), SAMPLE);
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<TraceContext>(&json).unwrap(), t);
    }

    #[test]
    fn refuses_invalid() {
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert!(TraceContext::parse_traceparent(bad).is_err(), "{bad:?}");
        }
        assert!(TraceContext::new([0; 16], [1; 8], true).is_none());
    }
}
