//! Tool-id patterns as written in policy rules and quota limits: `*`, `group.*`,
//! `group.pkg.*` or an exact `group.pkg.name`. One matcher serves authorization and
//! quotas so both read a pattern the same way.

use std::fmt;

use crate::{IdError, ToolId};

/// A compiled tool pattern. Prefixes match whole segments: `fs.files.*` matches
/// `fs.files.read` but never `fs.filesx.read`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ToolPattern {
    /// `*`: every tool.
    Any,
    /// `group.*` or `group.pkg.*`, stored with its trailing dot (`group.`).
    Prefix(String),
    /// One exact tool id.
    Exact(String),
}

fn check_segment(p: &str, seg: &str) -> Result<(), IdError> {
    let ok = !seg.is_empty()
        && seg.len() <= 64
        && seg
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(IdError::new(
            "tool pattern",
            p,
            "use *, group.*, group.pkg.* or group.pkg.name (lowercase letters, digits, _ and -)",
        ))
    }
}

impl ToolPattern {
    /// Parses and validates a pattern.
    pub fn parse(p: &str) -> Result<Self, IdError> {
        if p == "*" {
            return Ok(ToolPattern::Any);
        }
        if let Some(body) = p.strip_suffix(".*") {
            let segments: Vec<&str> = body.split('.').collect();
            if segments.len() > 2 {
                return Err(IdError::new(
                    "tool pattern",
                    p,
                    "a prefix pattern has at most two segments before .*",
                ));
            }
            for s in segments {
                check_segment(p, s)?;
            }
            return Ok(ToolPattern::Prefix(format!("{body}.")));
        }
        ToolId::new(p)
            .map(|id| ToolPattern::Exact(id.as_str().to_owned()))
            .map_err(|_| {
                IdError::new(
                    "tool pattern",
                    p,
                    "use *, group.*, group.pkg.* or group.pkg.name",
                )
            })
    }

    /// Whether `tool` is covered by this pattern.
    pub fn matches(&self, tool: &ToolId) -> bool {
        self.matches_str(tool.as_str())
    }

    /// Whether the tool id `tool` (assumed well formed) is covered by this pattern.
    pub fn matches_str(&self, tool: &str) -> bool {
        match self {
            ToolPattern::Any => true,
            ToolPattern::Prefix(p) => tool.starts_with(p.as_str()),
            ToolPattern::Exact(e) => tool == e,
        }
    }
}

impl fmt::Display for ToolPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolPattern::Any => f.write_str("*"),
            ToolPattern::Prefix(p) => write!(f, "{p}*"),
            ToolPattern::Exact(e) => f.write_str(e),
        }
    }
}

impl std::str::FromStr for ToolPattern {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ToolId {
        ToolId::new(s).unwrap()
    }

    #[test]
    fn matches_any_prefix_by_segment_and_exact() {
        let any = ToolPattern::parse("*").unwrap();
        let group = ToolPattern::parse("fs.*").unwrap();
        let pkg = ToolPattern::parse("fs.files.*").unwrap();
        let exact = ToolPattern::parse("fs.files.read").unwrap();
        assert!(any.matches(&id("a.b.c")));
        assert!(group.matches(&id("fs.files.read")));
        assert!(!group.matches(&id("fsx.files.read")));
        assert!(pkg.matches(&id("fs.files.read")));
        assert!(!pkg.matches(&id("fs.filesx.read")), "prefix is per segment");
        assert!(exact.matches(&id("fs.files.read")));
        assert!(!exact.matches(&id("fs.files.write")));
        assert_eq!(pkg.to_string(), "fs.files.*");
    }

    #[test]
    fn refuses_malformed_patterns() {
        for bad in [
            "", "fs", "fs.files", "FS.*", "a.b.c.*", ".*", "fs.*x", "fs..*", "a.b.c.d",
        ] {
            assert!(ToolPattern::parse(bad).is_err(), "{bad:?}");
        }
    }
}
