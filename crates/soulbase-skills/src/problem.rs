//! Problems found in skill files: where (file, line, field) and why.

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

/// How serious a finding is. The severity of every finding is fixed where it is
/// found and nothing downgrades or upgrades it afterwards: the server and
/// `soulbase skills check` share it (`SkillSet::build`). The table:
///
/// | finding | severity |
/// |---|---|
/// | unreadable, not UTF-8, bad YAML/front matter, unknown descriptor field, invalid value, schema, binding (WASM module or process command outside the root, absolute command, digest mismatch) | error |
/// | a name clash between two files (descriptor beside package) | error, on both files |
/// | contract: unknown provider, import of an unexported tool, `min_version` not met, cycle, bad deprecation window, `free_tools`/`rate_limit` naming a tool not exported | error |
/// | importing from a skill refused for an error | error |
/// | unknown `SKILL.md` front-matter field, deprecated `external_tools`, exports without `api_version`, import of a deprecated tool, shared exported name, replacement not exported | warning |
/// | `${ENV}` header reference unset, or not on `sandbox.http_env_allow` (every such call is refused by the HTTP executor) | warning |
/// | a bad file whose previous version stays in force (reload only) | warning |
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth fixing; the skill still loads and `skills check` still passes.
    Warning,
    /// The file is refused (its skill is not loaded); `skills check` fails.
    Error,
}

/// One finding about a skill file or a cross-skill contract.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkillProblem {
    /// Error or warning.
    pub severity: Severity,
    /// The file concerned (as found under the skills root).
    pub path: PathBuf,
    /// The 1-based line in that file, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    /// The dotted field path, when the finding is about one field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What is wrong, in words.
    pub reason: String,
}

impl SkillProblem {
    /// An error about `path`.
    pub fn error(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            path: path.into(),
            line: None,
            field: None,
            reason: reason.into(),
        }
    }

    /// A warning about `path`.
    pub fn warning(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::error(path, reason)
        }
    }

    /// Sets the line.
    pub fn at_line(mut self, line: Option<u64>) -> Self {
        self.line = line;
        self
    }

    /// Sets the field path.
    pub fn in_field(mut self, field: impl Into<String>) -> Self {
        let f = field.into();
        self.field = (!f.is_empty()).then_some(f);
        self
    }

    /// Whether this is an error.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for SkillProblem {
    /// `error: skills/a.yaml:3: parameters: reason`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Warning => "warning",
            Severity::Error => "error",
        };
        write!(f, "{sev}: {}", self.path.display())?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": {field}")?;
        }
        write!(f, ": {}", self.reason)
    }
}
