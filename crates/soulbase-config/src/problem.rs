//! Configuration errors that name the field and where its value came from.

use std::fmt;

use soulbase_errors::{ErrorCode, SoulError};

/// One problem: which field, from which layer, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// Dotted field path, e.g. `skills.poll_interval_ms`; empty for the whole document.
    pub path: String,
    /// The layer the offending value came from, e.g. `config.yaml` or `environment SKILLS_DIR`.
    pub source: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.source, self.message)
        } else {
            write!(f, "{} (from {}): {}", self.path, self.source, self.message)
        }
    }
}

/// Every problem found while loading a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The problems, in field order. Never empty.
    pub problems: Vec<ConfigProblem>,
}

impl ConfigError {
    pub(crate) fn one(
        path: impl Into<String>,
        source: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            problems: vec![ConfigProblem {
                path: path.into(),
                source: source.into(),
                message: message.into(),
            }],
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid configuration:")?;
        for p in &self.problems {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

impl From<ConfigError> for SoulError {
    fn from(err: ConfigError) -> Self {
        let paths: Vec<&str> = err.problems.iter().map(|p| p.path.as_str()).collect();
        SoulError::of(ErrorCode::ConfigInvalid)
            .with_field("paths", paths.join(","))
            .with_source(err)
    }
}
