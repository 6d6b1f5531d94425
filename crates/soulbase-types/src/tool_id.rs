//! Tool identifiers: `<group>.<pkg>.<name>`, exposed as the resource URN `soul:tool:<id>`.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::IdError;

/// The prefix of a tool's resource URN, as used in authorization.
pub const TOOL_URN_PREFIX: &str = "soul:tool:";

const KIND: &str = "tool id";

/// A tool's identity: exactly three dot-separated segments `<group>.<pkg>.<name>`.
///
/// Each segment is 1–64 characters of lowercase ASCII letters, digits, `_` and `-`,
/// starting with a letter or digit. The whole id is at most 194 characters.
/// Shared and immutable: cloning is a reference-count increment.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct ToolId {
    full: Arc<str>,
    /// Byte offsets of the two dots.
    dots: (usize, usize),
}

fn check_segment(full: &str, seg: &str) -> Result<(), IdError> {
    if seg.is_empty() {
        return Err(IdError::new(
            KIND,
            full,
            "has an empty segment (expected <group>.<pkg>.<name>)",
        ));
    }
    if seg.len() > 64 {
        return Err(IdError::new(
            KIND,
            full,
            "has a segment longer than 64 characters",
        ));
    }
    if !seg.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit()) {
        return Err(IdError::new(
            KIND,
            full,
            "has a segment that does not start with a lowercase letter or digit",
        ));
    }
    if !seg
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
    {
        return Err(IdError::new(
            KIND,
            full,
            "may contain only lowercase letters, digits, '_' and '-' in each segment",
        ));
    }
    Ok(())
}

impl ToolId {
    /// Parses and validates `<group>.<pkg>.<name>`.
    pub fn new(s: impl Into<String>) -> Result<Self, IdError> {
        let full = s.into();
        let parts: Vec<&str> = full.split('.').collect();
        if parts.len() != 3 {
            return Err(IdError::new(
                KIND,
                &full,
                "must have exactly three segments <group>.<pkg>.<name>",
            ));
        }
        for seg in &parts {
            check_segment(&full, seg)?;
        }
        let first = parts[0].len();
        let second = first + 1 + parts[1].len();
        Ok(Self {
            full: Arc::from(full),
            dots: (first, second),
        })
    }

    /// Builds an id from its three segments.
    pub fn from_parts(group: &str, pkg: &str, name: &str) -> Result<Self, IdError> {
        Self::new(format!("{group}.{pkg}.{name}"))
    }

    /// Parses a resource URN `soul:tool:<id>`.
    pub fn from_urn(urn: &str) -> Result<Self, IdError> {
        match urn.strip_prefix(TOOL_URN_PREFIX) {
            Some(id) => Self::new(id),
            None => Err(IdError::new(KIND, urn, "is not a soul:tool: URN")),
        }
    }

    /// The id as `<group>.<pkg>.<name>`.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The first segment.
    pub fn group(&self) -> &str {
        &self.full[..self.dots.0]
    }

    /// The second segment.
    pub fn pkg(&self) -> &str {
        &self.full[self.dots.0 + 1..self.dots.1]
    }

    /// The last segment: the tool's short name.
    pub fn name(&self) -> &str {
        &self.full[self.dots.1 + 1..]
    }

    /// The resource URN `soul:tool:<id>` used in authorization.
    pub fn urn(&self) -> String {
        format!("{TOOL_URN_PREFIX}{}", self.full)
    }
}

impl fmt::Display for ToolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl TryFrom<String> for ToolId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        Self::new(s)
    }
}

impl std::str::FromStr for ToolId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        Self::new(s)
    }
}

/// A string [`ToolId::new`] accepts: `<group>.<pkg>.<name>`.
impl schemars::JsonSchema for ToolId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ToolId".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        crate::ids::id_schema(
            "A tool id, `<group>.<pkg>.<name>` (e.g. `soulbase.builtin.echo`).",
            r"^[a-z0-9][a-z0-9_-]{0,63}\.[a-z0-9][a-z0-9_-]{0,63}\.[a-z0-9][a-z0-9_-]{0,63}$",
        )
    }
}

/// As its string, written from the shared one (no copy).
impl Serialize for ToolId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.full)
    }
}

impl From<ToolId> for String {
    fn from(id: ToolId) -> String {
        id.full.as_ref().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_segments() {
        let id = ToolId::new("fs.files.read_file").unwrap();
        assert_eq!(id.group(), "fs");
        assert_eq!(id.pkg(), "files");
        assert_eq!(id.name(), "read_file");
        assert_eq!(id.urn(), "soul:tool:fs.files.read_file");
        assert_eq!(ToolId::from_urn(&id.urn()).unwrap(), id);
    }

    #[test]
    fn refuses_malformed() {
        for bad in [
            "", "a.b", "a.b.c.d", "a..c", "A.b.c", "a.b.c d", "a.b.-c", "a.b.c/", ".a.b",
        ] {
            assert!(ToolId::new(bad).is_err(), "{bad:?} should be refused");
        }
        assert!(ToolId::new(format!("a.b.{}", "x".repeat(65))).is_err());
        assert!(ToolId::from_urn("soul:fs:a.b.c").is_err());
    }

    #[test]
    fn serde_round_trip() {
        let id: ToolId = serde_json::from_str("\"g.p.n-1\"").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"g.p.n-1\"");
        assert!(serde_json::from_str::<ToolId>("\"g.p\"").is_err());
    }
}
