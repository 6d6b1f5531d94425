//! The error type and its two views.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{ErrorCode, RetryClass};

/// An error with a stable code, a safe public message and a private cause chain.
///
/// `Display` prints only `CODE: safe message`, so logging or returning it by accident
/// leaks nothing. Use [`SoulError::public`] for what callers see and
/// [`SoulError::audit`] for logs and evidence.
#[derive(Clone)]
pub struct SoulError {
    // Boxed so `Result<T, SoulError>` stays one pointer wide on the happy path.
    inner: Box<Repr>,
}

#[derive(Clone)]
struct Repr {
    code: ErrorCode,
    message: Cow<'static, str>,
    fields: BTreeMap<String, String>,
    retry_after_ms: Option<u64>,
    correlation_id: Option<String>,
    notes: Vec<String>,
    source: Option<Arc<dyn StdError + Send + Sync + 'static>>,
}

/// What a caller may see: code, safe message, public fields, retry hint, correlation id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct PublicError {
    /// The stable code, e.g. `TOOL.NOT_FOUND`.
    pub code: ErrorCode,
    /// A message safe to show to any caller.
    pub message: String,
    /// Structured, safe details (e.g. `pointer` for schema errors, `field` for missing input).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fields: BTreeMap<String, String>,
    /// Whether retrying can succeed, and how.
    pub retry: RetryClass,
    /// When to retry, for rate limits and budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Ties this answer to logs and evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
}

/// What operators and auditors see: the public view plus the whole cause chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditError {
    /// The public view, as the caller saw it.
    #[serde(flatten)]
    pub public: PublicError,
    /// Internal notes and the `source()` chain, outermost first.
    pub causes: Vec<String>,
}

impl SoulError {
    /// An error with `code` and a safe public `message`.
    ///
    /// The message must be safe for any caller: no secrets, paths or internal names.
    pub fn new(code: ErrorCode, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            inner: Box::new(Repr {
                code,
                message: message.into(),
                fields: BTreeMap::new(),
                retry_after_ms: None,
                correlation_id: None,
                notes: Vec::new(),
                source: None,
            }),
        }
    }

    /// An error with `code` and its default safe message.
    pub fn of(code: ErrorCode) -> Self {
        Self::new(code, code.spec().default_message)
    }

    /// Adds a public, structured detail (e.g. `pointer` → `/city`).
    pub fn with_field(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.inner.fields.insert(key.into(), value.into());
        self
    }

    /// Attaches the underlying error; it appears only in the audit view.
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.inner.source = Some(Arc::new(source));
        self
    }

    /// Adds an internal note for the audit view (never shown to callers).
    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.inner.notes.push(note.into());
        self
    }

    /// Sets the retry-after hint.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.inner.retry_after_ms = Some(u64::try_from(after.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Sets the correlation id (usually the call id or trace id).
    pub fn with_correlation_id(mut self, id: impl Into<String>) -> Self {
        self.inner.correlation_id = Some(id.into());
        self
    }

    /// A `UNKNOWN.INTERNAL` error wrapping `source`. Use only for what is truly unclassified.
    pub fn internal(source: impl StdError + Send + Sync + 'static) -> Self {
        Self::of(ErrorCode::UnknownInternal).with_source(source)
    }

    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        self.inner.code
    }

    /// The safe public message.
    pub fn message(&self) -> &str {
        &self.inner.message
    }

    /// A public field, if set.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.inner.fields.get(key).map(String::as_str)
    }

    /// The retry-after hint in milliseconds, if any.
    pub fn retry_after_ms(&self) -> Option<u64> {
        self.inner.retry_after_ms
    }

    /// The correlation id, if any.
    pub fn correlation_id(&self) -> Option<&str> {
        self.inner.correlation_id.as_deref()
    }

    /// The view a caller may see.
    pub fn public(&self) -> PublicError {
        PublicError {
            code: self.inner.code,
            message: self.inner.message.to_string(),
            fields: self.inner.fields.clone(),
            retry: self.inner.code.retry(),
            retry_after_ms: self.inner.retry_after_ms,
            correlation_id: self.inner.correlation_id.clone(),
        }
    }

    /// The view for logs and evidence, with the cause chain.
    pub fn audit(&self) -> AuditError {
        let mut causes = self.inner.notes.clone();
        let mut next: Option<&(dyn StdError + 'static)> =
            self.inner.source.as_deref().map(|e| e as _);
        while let Some(err) = next {
            causes.push(err.to_string());
            next = err.source();
        }
        AuditError {
            public: self.public(),
            causes,
        }
    }

    /// Rebuilds an error from a public view received from a remote peer.
    pub fn from_public(p: PublicError) -> Self {
        Self {
            inner: Box::new(Repr {
                code: p.code,
                message: p.message.into(),
                fields: p.fields,
                retry_after_ms: p.retry_after_ms,
                correlation_id: p.correlation_id,
                notes: Vec::new(),
                source: None,
            }),
        }
    }
}

impl fmt::Display for SoulError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.inner.code, self.inner.message)
    }
}

impl fmt::Debug for SoulError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Debug is for developers and logs: show the audit view.
        let audit = self.audit();
        f.debug_struct("SoulError")
            .field("code", &self.inner.code)
            .field("message", &self.inner.message)
            .field("fields", &self.inner.fields)
            .field("causes", &audit.causes)
            .finish()
    }
}

impl StdError for SoulError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner.source.as_deref().map(|e| e as _)
    }
}

impl From<ErrorCode> for SoulError {
    fn from(code: ErrorCode) -> Self {
        Self::of(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CODES;

    #[derive(Debug)]
    struct Inner;
    impl fmt::Display for Inner {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("password=hunter2 at /etc/secret")
        }
    }
    impl StdError for Inner {}

    #[derive(Debug)]
    struct Outer(Inner);
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("driver failed")
        }
    }
    impl StdError for Outer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn public_view_never_contains_the_cause_chain() {
        for spec in CODES {
            let err = SoulError::of(spec.code)
                .with_source(Outer(Inner))
                .with_note("internal note: shard 7");
            let public = serde_json::to_string(&err.public()).unwrap();
            assert!(!public.contains("hunter2"), "{public}");
            assert!(!public.contains("driver failed"), "{public}");
            assert!(!public.contains("shard 7"), "{public}");
            assert!(!err.to_string().contains("hunter2"));
            assert!(public.contains(spec.id));
        }
    }

    #[test]
    fn audit_view_has_the_whole_chain_in_order() {
        let err = SoulError::of(ErrorCode::ProviderUnavailable)
            .with_note("endpoint search")
            .with_source(Outer(Inner));
        let audit = err.audit();
        assert_eq!(
            audit.causes,
            vec![
                "endpoint search".to_owned(),
                "driver failed".to_owned(),
                "password=hunter2 at /etc/secret".to_owned()
            ]
        );
        assert_eq!(audit.public.code, ErrorCode::ProviderUnavailable);
    }

    #[test]
    fn public_view_carries_retry_and_correlation() {
        let err = SoulError::of(ErrorCode::QuotaRateLimited)
            .retry_after(Duration::from_millis(1500))
            .with_correlation_id("call_1")
            .with_field("limit", "50/min");
        let p = err.public();
        assert_eq!(p.retry, RetryClass::AfterDelay);
        assert_eq!(p.retry_after_ms, Some(1500));
        assert_eq!(p.correlation_id.as_deref(), Some("call_1"));
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["code"], "QUOTA.RATE_LIMITED");
        assert_eq!(json["fields"]["limit"], "50/min");
        let back = SoulError::from_public(serde_json::from_value(json).unwrap());
        assert_eq!(back.public(), p);
    }
}
