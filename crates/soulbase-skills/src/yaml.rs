//! YAML parsing with locations (serde-saphyr: pure Rust, panic-free, duplicate keys
//! refused), and locating a field's line in a source text.

use serde::de::DeserializeOwned;

/// A parse failure: the 1-based line (already shifted by the caller's offset) and
/// the parser's message without its source snippet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlError {
    /// The line, when the parser knows it.
    pub line: Option<u64>,
    /// What the parser said.
    pub message: String,
}

/// Parses `text` as `T`. `line_offset` is added to reported lines (the number of
/// lines before `text` in its file, e.g. 1 for SKILL.md front matter).
///
/// Parsing runs under tight budgets ([`options`]) sized for skill files (at most
/// 1 MiB), so alias bombs and deeply nested documents fail fast. Messages never
/// quote scalar values from the file ([`redact_values`]): a header value may
/// hold a secret.
pub fn parse<T: DeserializeOwned>(text: &str, line_offset: u64) -> Result<T, YamlError> {
    serde_saphyr::from_str_with_options::<T>(text, options()).map_err(|e| {
        let line = e.location().map(|l| l.line() + line_offset);
        let full = e.without_snippet().to_string();
        let first = full.lines().next().unwrap_or_default();
        // The first line reads "error: line L column C: what"; keep the "what".
        let message = first
            .trim_start_matches("error: ")
            .split_once(": ")
            .filter(|(head, _)| head.starts_with("line "))
            .map(|(_, rest)| rest.to_owned())
            .unwrap_or_else(|| first.trim_start_matches("error: ").to_owned());
        YamlError {
            line,
            message: redact_values(&message),
        }
    })
}

/// The parser options for skill files: budgets far below serde-saphyr's
/// defaults (which are sized for large configuration files).
pub fn options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_reader_input_bytes = Some(4 << 20);
    budget.max_events = 200_000;
    budget.max_aliases = 1_000;
    budget.max_anchors = 1_000;
    budget.max_recorded_anchor_events = 20_000;
    budget.max_recorded_anchor_bytes = 1 << 20;
    budget.max_documents = 1;
    budget.max_nodes = 100_000;
    budget.max_total_scalar_bytes = 4 << 20;
    let mut opts = serde_saphyr::Options::default();
    opts.budget = Some(budget);
    opts.alias_limits.max_total_replayed_events = 20_000;
    opts.alias_limits.max_replay_stack_depth = 16;
    opts.alias_limits.max_alias_expansions_per_anchor = 1_000;
    opts
}

/// Replaces the values a parser message quotes from the document — `"…"`
/// strings and the `` `…` `` after `integer`, `floating point`, `character`,
/// `unknown variant` and the like — with `…`, keeping key names (`unknown field
/// `x``, `missing field `x``), the parser's own words, and what follows
/// `, expected ` (a description of the type).
pub fn redact_values(message: &str) -> String {
    // What follows ", expected " describes the type, not the document.
    if let Some(i) = message.find(", expected ") {
        let (head, tail) = message.split_at(i);
        return format!("{}{tail}", redact_values(head));
    }
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = rest.find(['"', '`', '\'']) {
        let (head, tail) = rest.split_at(i);
        out.push_str(head);
        let q = tail.chars().next().unwrap_or('"');
        let body = &tail[q.len_utf8()..];
        let Some(end) = body.find(q) else {
            // Unbalanced: drop what follows, it may be a value.
            out.push(q);
            out.push('…');
            return out;
        };
        let keep = q == '`'
            && ["field ", "fields ", "key "]
                .iter()
                .any(|w| out.trim_end_matches(' ').ends_with(w.trim_end()));
        out.push(q);
        if keep {
            out.push_str(&body[..end]);
        } else {
            out.push('…');
        }
        out.push(q);
        rest = &body[end + q.len_utf8()..];
    }
    out.push_str(rest);
    out
}

/// The 1-based line where the top-level key `key:` appears in `text`, if it does.
pub fn key_line(text: &str, key: &str) -> Option<u64> {
    text.lines().enumerate().find_map(|(i, l)| {
        l.strip_prefix(key)
            .filter(|rest| rest.trim_start().starts_with(':'))
            .map(|_| i as u64 + 1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_redacted_keys_kept() {
        assert_eq!(
            redact_values("invalid type: string \"sk-secret\", expected u64"),
            "invalid type: string \"…\", expected u64"
        );
        assert_eq!(
            redact_values("invalid value: integer `123456`, expected a boolean"),
            "invalid value: integer `…`, expected a boolean"
        );
        assert_eq!(
            redact_values("unknown field `hedaers`, expected one of `a`, `b`"),
            "unknown field `hedaers`, expected one of `a`, `b`"
        );
        assert_eq!(
            redact_values("missing field `sha256`"),
            "missing field `sha256`"
        );
        assert_eq!(redact_values("bad 'tok"), "bad '…");
        assert_eq!(
            redact_values("unknown variant `s3cr3t`, expected `read` or `write`"),
            "unknown variant `…`, expected `read` or `write`"
        );
    }
}
