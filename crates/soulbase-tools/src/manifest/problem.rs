//! Manifest problems and their conversion to a `MANIFEST.INVALID` error.

use std::fmt;

use serde::{Deserialize, Serialize};
use soulbase_errors::{ErrorCode, SoulError};

/// One thing wrong with a manifest: where (`capabilities[1].hosts[0]`,
/// `input_schema#/properties/city`, or empty for the document) and what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// The field path.
    pub path: String,
    /// What is wrong, safe to show to the manifest's author.
    pub message: String,
}

impl Problem {
    /// A problem at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in a manifest (never just the first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestError {
    /// The problems, in field order.
    pub problems: Vec<Problem>,
}

impl ManifestError {
    pub(crate) fn single(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            problems: vec![Problem::new(path, message)],
        }
    }
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the tool manifest is invalid")?;
        for (i, p) in self.problems.iter().enumerate() {
            f.write_str(if i == 0 { ": " } else { "; " })?;
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ManifestError {}

impl From<ManifestError> for SoulError {
    /// `MANIFEST.INVALID`; the message lists the problems and the field `problems`
    /// holds them as a JSON array of `{path, message}`.
    fn from(e: ManifestError) -> Self {
        problems_error(ErrorCode::ManifestInvalid, e.to_string(), &e.problems)
    }
}

/// An error with `code`, `message` and the problems as a JSON field.
pub(crate) fn problems_error(code: ErrorCode, message: String, problems: &[Problem]) -> SoulError {
    let json = serde_json::to_string(problems).unwrap_or_default();
    SoulError::new(code, message).with_field("problems", json)
}
