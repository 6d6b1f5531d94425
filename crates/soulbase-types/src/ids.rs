//! Validated string identifiers: tenants, actors, calls and envelopes.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Why a string was refused as an identifier.
///
/// `kind` names the identifier ("tenant", "tool id", …) so that the caller can
/// turn it into an error naming the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {value:?}: {reason}")]
pub struct IdError {
    /// Which kind of identifier was being parsed.
    pub kind: &'static str,
    /// The refused value, truncated to 80 characters.
    pub value: String,
    /// What rule it broke.
    pub reason: &'static str,
}

impl IdError {
    pub(crate) fn new(kind: &'static str, value: &str, reason: &'static str) -> Self {
        let value = value.chars().take(80).collect();
        Self {
            kind,
            value,
            reason,
        }
    }
}

/// Checks the common shape of a "token" identifier: 1..=max characters,
/// ASCII alphanumerics plus the given punctuation, starting with an alphanumeric.
fn check_token(kind: &'static str, s: &str, max: usize, punct: &[char]) -> Result<(), IdError> {
    if s.is_empty() {
        return Err(IdError::new(kind, s, "must not be empty"));
    }
    if s.len() > max {
        return Err(IdError::new(kind, s, "is too long"));
    }
    if !s.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(IdError::new(kind, s, "must start with a letter or digit"));
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || punct.contains(&c))
    {
        return Err(IdError::new(
            kind,
            s,
            "contains a character that is not allowed",
        ));
    }
    Ok(())
}

/// The JSON Schema of an identifier: a string matching `pattern` (which says
/// what its constructor accepts), described by `description`.
pub(crate) fn id_schema(description: &str, pattern: &str) -> schemars::Schema {
    schemars::json_schema!({
        "description": description,
        "type": "string",
        "pattern": pattern,
    })
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $pattern:literal, $check:expr) => {
        $(#[$doc])*
        ///
        /// Shared and immutable: cloning is a reference-count increment, never a copy.
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
        #[serde(try_from = "String")]
        pub struct $name(Arc<str>);

        /// As its string, written from the shared one (no copy, as
        /// `into = "String"` would make for every record serialized).
        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl $name {
            /// Validates `s` and wraps it.
            pub fn new(s: impl Into<String>) -> Result<Self, IdError> {
                let s = s.into();
                let check: fn(&str) -> Result<(), IdError> = $check;
                check(&s)?;
                Ok(Self(Arc::from(s)))
            }

            /// The identifier as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0.as_ref().to_owned()
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        /// A string its constructor accepts.
        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                id_schema(concat!("A ", $kind, "."), $pattern)
            }
        }
    };
}

string_id!(
    /// A tenant: the unit of isolation for tools, budgets, paths and evidence.
    ///
    /// 1–64 ASCII characters: letters, digits, `_`, `-`, `.`; starts with a letter or digit.
    TenantId,
    "tenant",
    r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
    |s| check_token("tenant", s, 64, &['_', '-', '.'])
);

string_id!(
    /// Who acts within a tenant: a user, a service account or an agent.
    ///
    /// 1–256 characters: letters, digits and `_ - . @ : /`; starts with a letter or digit.
    ActorId,
    "actor",
    r"^[A-Za-z0-9][A-Za-z0-9_.@:/-]{0,255}$",
    |s| check_token("actor", s, 256, &['_', '-', '.', '@', ':', '/'])
);

string_id!(
    /// The id of one tool call, as proposed by a model (`call_abc123`) or minted here.
    ///
    /// 1–128 characters: letters, digits and `_ - . :`; starts with a letter or digit.
    CallId,
    "call id",
    r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$",
    |s| check_token("call id", s, 128, &['_', '-', '.', ':'])
);

string_id!(
    /// The id of one envelope (an event or evidence record); unique, time-ordered when minted here.
    EnvelopeId,
    "envelope id",
    r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$",
    |s| check_token("envelope id", s, 128, &['_', '-', '.', ':'])
);

impl TenantId {
    /// The tenant that owns global (not tenant-scoped) resources.
    pub fn global() -> Self {
        Self(Arc::from("global"))
    }
}

impl ActorId {
    /// The actor of changes no person asked for: a file watcher applying an
    /// edited configuration or skills directory, a signal (`system`).
    pub fn system() -> Self {
        Self(Arc::from("system"))
    }
}

impl CallId {
    /// Mints a fresh, time-ordered call id (`call_<uuidv7>`).
    pub fn generate() -> Self {
        let mut buf = [0u8; 5 + uuid::fmt::Simple::LENGTH];
        buf[..5].copy_from_slice(b"call_");
        let hex = crate::fast_id::uuid_v7().simple();
        let tail = hex.encode_lower(&mut buf[5..]).len();
        Self(Arc::from(ascii(&buf[..5 + tail])))
    }
}

impl EnvelopeId {
    /// Mints a fresh, time-ordered envelope id (a UUIDv7 in hyphenated form).
    pub fn generate() -> Self {
        let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
        Self(Arc::from(
            &*crate::fast_id::uuid_v7()
                .hyphenated()
                .encode_lower(&mut buf),
        ))
    }
}

/// The text of bytes this module wrote itself (ASCII only).
fn ascii(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_rules() {
        assert!(TenantId::new("acme").is_ok());
        assert!(TenantId::new("acme-prod.eu_1").is_ok());
        assert_eq!(TenantId::new("").unwrap_err().reason, "must not be empty");
        assert!(TenantId::new("-acme").is_err());
        assert!(TenantId::new("ac me").is_err());
        assert!(TenantId::new("a/b").is_err());
        assert!(TenantId::new("x".repeat(65)).is_err());
        assert!(TenantId::new("x".repeat(64)).is_ok());
    }

    #[test]
    fn actor_allows_emails_and_paths() {
        assert!(ActorId::new("alice@example.com").is_ok());
        assert!(ActorId::new("svc:billing/worker-1").is_ok());
        assert!(ActorId::new("bob\n").is_err());
        assert_eq!(ActorId::new("system").unwrap(), ActorId::system());
        assert_eq!(TenantId::new("global").unwrap(), TenantId::global());
    }

    #[test]
    fn generated_ids_are_valid_and_distinct() {
        let a = CallId::generate();
        let b = CallId::generate();
        assert_ne!(a, b);
        assert!(CallId::new(a.as_str()).is_ok());
        let e = EnvelopeId::generate();
        assert!(EnvelopeId::new(e.as_str()).is_ok());
    }

    #[test]
    fn serde_validates() {
        let ok: TenantId = serde_json::from_str("\"acme\"").unwrap();
        assert_eq!(ok.as_str(), "acme");
        let err = serde_json::from_str::<TenantId>("\"bad tenant\"").unwrap_err();
        assert!(err.to_string().contains("invalid tenant"));
        // Written as the plain string it was read from.
        assert_eq!(serde_json::to_string(&ok).unwrap(), "\"acme\"");
        let tool: crate::ToolId = serde_json::from_str("\"a.b.c\"").unwrap();
        assert_eq!(serde_json::to_string(&tool).unwrap(), "\"a.b.c\"");
    }

    #[test]
    fn error_value_is_truncated() {
        let err = TenantId::new("é".repeat(500)).unwrap_err();
        assert_eq!(err.value.chars().count(), 80);
    }
}
