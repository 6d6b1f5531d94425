//! Obligations: what must be done to a call's output before anyone sees it —
//! mask, redact, watermark — addressed by JSON pointer. Declared by a tool's
//! manifest and by the policy that allowed the call (static rules'
//! `obligations`, Cedar `@obligations` annotations); the pipeline applies them
//! all, before the output is digested into the End evidence.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What an obligation does to the value at its pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ObligationKind {
    /// Replace the value's characters with a mask (keeps the shape).
    Mask,
    /// Remove the value (or replace it with `value`).
    Redact,
    /// Add a watermark (`value` is its text) to a string or an object; any other
    /// value cannot carry one (the obligation fails).
    Watermark,
}

/// What happens when an obligation cannot be applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ObligationFailure {
    /// The output is withheld: the call is refused `POLICY.DENY_TOOL` (field
    /// `obligation`), the End records it. The default.
    #[default]
    Refuse,
    /// The values the obligation reached are withheld (`null`), the rest is
    /// answered, and the result carries a warning.
    Degrade,
}

impl ObligationFailure {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// One obligation on a call's output.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Obligation {
    /// What to do.
    pub kind: ObligationKind,
    /// A JSON pointer into the output (`""` is the whole output). A segment `*`
    /// stands for every element of an array or every member of an object.
    pub pointer: String,
    /// Kind-specific argument: the mask character (its first; default `*`), the
    /// redaction replacement (default `[REDACTED]`), the watermark text (default
    /// `[soulbase]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Whether the pointer must reach a value: an output without one fails the
    /// obligation (an optional field may otherwise be absent).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
    /// What a failure does: `refuse` (default) or `degrade`.
    #[serde(default, skip_serializing_if = "ObligationFailure::is_default")]
    pub on_failure: ObligationFailure,
}

impl Obligation {
    /// Why `pointer` is malformed, if it is: a JSON pointer is empty or
    /// `/`-separated segments with only `~0` / `~1` escapes.
    pub fn pointer_problem(&self) -> Option<&'static str> {
        let p = &self.pointer;
        if p.is_empty() {
            return None;
        }
        if !p.starts_with('/') {
            return Some("must be a JSON pointer: empty or starting with `/`");
        }
        let mut chars = p.chars();
        while let Some(c) = chars.next() {
            if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
                return Some("has a `~` not followed by 0 or 1");
            }
        }
        None
    }
}
