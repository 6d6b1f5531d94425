//! What a call carries besides its tool and arguments, as each transport delivers
//! it: HTTP headers and gRPC metadata (both an [`http::HeaderMap`]), gRPC request
//! fields, MCP `params._meta`.

use http::{HeaderMap, HeaderName};
use serde_json::{Map, Value};
use soulbase_errors::{ErrorCode, SoulError};

use crate::binding::{Binding, SKILL_HEADER_NAME};

/// The header / metadata key carrying an idempotency key.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
/// The header / metadata key carrying a consent token.
pub const CONSENT_HEADER: &str = "x-soulbase-consent";
/// The header / metadata key carrying a W3C trace context.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// The header naming the call (its id, e.g. a model's `tool_call.id`).
pub const CALL_ID_HEADER: &str = "x-soulbase-call-id";
/// The MCP `_meta` key carrying an idempotency key on `tools/call`.
pub const META_IDEMPOTENCY_KEY: &str = "soulbase/idempotencyKey";
/// The MCP `_meta` key carrying a consent token on `tools/call`.
pub const META_CONSENT: &str = "soulbase/consent";
/// The MCP `_meta` key naming the call (like the `x-soulbase-call-id` header).
pub const META_CALL_ID: &str = "soulbase/callId";
/// The MCP `_meta` key carrying a W3C trace context (SEP-414).
pub const META_TRACEPARENT: &str = "traceparent";

/// A call's options as received, unparsed: the [`Stack`](crate::Stack) checks
/// them, the same way whichever door they came through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallMeta {
    /// The call id the caller chose, if any.
    pub call_id: Option<String>,
    /// The idempotency key.
    pub idempotency_key: Option<String>,
    /// The consent token.
    pub consent: Option<String>,
    /// The caller's `traceparent`.
    pub traceparent: Option<String>,
    /// The skill the call is made for.
    pub binding: Binding,
    /// The agent-loop conversation making the call (set by the loop, never read
    /// from a request).
    pub conversation: Option<soulbase_observe::ConversationRef>,
    /// Where the tool's progress and log messages go while it runs: set by a
    /// surface that delivers them (MCP), never read from a request.
    pub reporter: soulbase_tools::pipeline::Reporter,
}

// The call options' header names, parsed once (see [`SKILL_HEADER_NAME`]).
static CALL_ID: HeaderName = HeaderName::from_static(CALL_ID_HEADER);
static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static(IDEMPOTENCY_KEY_HEADER);
static CONSENT: HeaderName = HeaderName::from_static(CONSENT_HEADER);
static TRACEPARENT: HeaderName = HeaderName::from_static(TRACEPARENT_HEADER);

/// A header's value as text: UTF-8 as sent (an idempotency key in any script is
/// still that key, never silently dropped), other bytes replaced by U+FFFD.
fn header(headers: &HeaderMap, name: &HeaderName) -> Option<String> {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .filter(|v| !v.is_empty())
}

impl CallMeta {
    /// Reads the call options from HTTP headers or gRPC metadata: `idempotency-key`,
    /// `x-soulbase-consent`, `traceparent`, `x-soulbase-call-id` and the
    /// [`SKILL_HEADER`] claim.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        Self {
            call_id: header(headers, &CALL_ID),
            idempotency_key: header(headers, &IDEMPOTENCY_KEY),
            consent: header(headers, &CONSENT),
            traceparent: header(headers, &TRACEPARENT),
            binding: Binding::claimed(header(headers, &SKILL_HEADER_NAME)),
            conversation: None,
            reporter: soulbase_tools::pipeline::Reporter::none(),
        }
    }

    /// Reads the call options from an MCP request's `_meta`
    /// ([`META_IDEMPOTENCY_KEY`], [`META_CONSENT`], [`META_TRACEPARENT`]); a value
    /// that is not a string is `SCHEMA.VALIDATION_FAILED` naming its key.
    pub fn from_mcp_meta(meta: &Map<String, Value>) -> Result<Self, SoulError> {
        let text = |key: &str| match meta.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(SoulError::new(
                ErrorCode::SchemaValidationFailed,
                format!("_meta.{key} must be a string"),
            )
            .with_field("field", format!("_meta.{key}"))),
        };
        Ok(Self {
            call_id: text(META_CALL_ID)?,
            idempotency_key: text(META_IDEMPOTENCY_KEY)?,
            consent: text(META_CONSENT)?,
            traceparent: text(META_TRACEPARENT)?,
            binding: Binding::None,
            conversation: None,
            reporter: soulbase_tools::pipeline::Reporter::none(),
        })
    }

    /// Each option of `self`, else `fallback`'s (e.g. a gRPC request's fields over
    /// its metadata).
    pub fn or(self, fallback: CallMeta) -> CallMeta {
        CallMeta {
            call_id: self.call_id.or(fallback.call_id),
            idempotency_key: self.idempotency_key.or(fallback.idempotency_key),
            consent: self.consent.or(fallback.consent),
            traceparent: self.traceparent.or(fallback.traceparent),
            binding: match self.binding {
                Binding::None => fallback.binding,
                b => b,
            },
            conversation: self.conversation.or(fallback.conversation),
            reporter: if self.reporter.is_listening() {
                self.reporter
            } else {
                fallback.reporter
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    /// An option header in UTF-8 beyond ASCII is read as sent, not dropped (a
    /// retried idempotency key must still deduplicate).
    #[test]
    fn utf8_option_headers_are_read_as_sent() {
        let mut h = HeaderMap::new();
        h.insert(
            IDEMPOTENCY_KEY_HEADER,
            http::HeaderValue::from_bytes("clé-日本".as_bytes()).unwrap(),
        );
        assert_eq!(
            CallMeta::from_headers(&h).idempotency_key.as_deref(),
            Some("clé-日本")
        );
    }

    #[test]
    fn mcp_meta_values_must_be_strings() {
        let meta = json!({"soulbase/idempotencyKey": "k", "traceparent": "tp"});
        let m = CallMeta::from_mcp_meta(meta.as_object().unwrap()).unwrap();
        assert_eq!(m.idempotency_key.as_deref(), Some("k"));
        assert_eq!(m.traceparent.as_deref(), Some("tp"));
        let bad = json!({"soulbase/consent": 7});
        let err = CallMeta::from_mcp_meta(bad.as_object().unwrap()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
        assert_eq!(err.field("field"), Some("_meta.soulbase/consent"));
    }

    #[test]
    fn request_fields_win_over_metadata() {
        let body = CallMeta {
            consent: Some("body".into()),
            ..CallMeta::default()
        };
        let md = CallMeta {
            consent: Some("md".into()),
            idempotency_key: Some("k".into()),
            binding: Binding::Claimed("s".into()),
            ..CallMeta::default()
        };
        let m = body.or(md);
        assert_eq!(m.consent.as_deref(), Some("body"));
        assert_eq!(m.idempotency_key.as_deref(), Some("k"));
        assert_eq!(m.binding, Binding::Claimed("s".into()));
    }
}
