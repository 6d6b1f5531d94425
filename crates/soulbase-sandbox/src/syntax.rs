//! Small syntactic checks shared by capabilities and provider bindings.

use std::net::{Ipv4Addr, Ipv6Addr};

/// Whether `label` is one DNS label: 1–63 ASCII letters, digits or `-`, not starting
/// or ending with `-`.
fn is_dns_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 63
        && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && !label.starts_with('-')
        && !label.ends_with('-')
}

/// Whether `name` is a DNS host name: dot-separated labels, at most 253 characters,
/// no trailing dot, and not all-numeric in its last label (so `1.2.3` is not mistaken
/// for a name).
fn is_dns_name(name: &str) -> bool {
    if name.is_empty() || name.len() > 253 {
        return false;
    }
    let mut last = "";
    for label in name.split('.') {
        if !is_dns_label(label) {
            return false;
        }
        last = label;
    }
    !last.chars().all(|c| c.is_ascii_digit())
}

/// Whether `host` is a concrete host: a DNS name, an IPv4 literal, or an IPv6 literal
/// (bare or in brackets).
///
/// Used for HTTP provider endpoints, where a wildcard makes no sense.
pub fn is_valid_host(host: &str) -> bool {
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return inner.parse::<Ipv6Addr>().is_ok();
    }
    host.parse::<Ipv4Addr>().is_ok() || host.parse::<Ipv6Addr>().is_ok() || is_dns_name(host)
}

/// Whether `pattern` is a valid host in a `net` capability: a concrete host (see
/// [`is_valid_host`]) or a label wildcard `*.example.com`.
///
/// The wildcard must be the whole first label and be followed by at least two
/// labels, so `*.com` and a bare `*` are refused: a grant that broad defeats the
/// point of a host allow-list.
pub fn is_valid_host_pattern(pattern: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(rest) => rest.contains('.') && is_dns_name(rest),
        None => is_valid_host(pattern),
    }
}

/// Whether a path has a `..` component (in either separator style).
pub(crate) fn has_parent_component(path: &str) -> bool {
    path.split(['/', '\\']).any(|c| c == "..")
}

/// One piece of a header template such as `Bearer ${TOKEN}`: literal text, or a
/// `${NAME}` reference to an environment variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplatePart<'a> {
    /// Text copied as is.
    Text(&'a str),
    /// The name of a referenced variable.
    Var(&'a str),
}

/// Splits a header template into text and `${NAME}` references: the one parser the
/// skills loader (checking references at load) and the HTTP executor (expanding them
/// per call) share. Names are ASCII letters, digits and `_`, not starting with a
/// digit. A reason when the syntax is broken.
pub fn parse_env_template(value: &str) -> Result<Vec<TemplatePart<'_>>, String> {
    let mut parts = Vec::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        if start > 0 {
            parts.push(TemplatePart::Text(&rest[..start]));
        }
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| "has an unterminated `${`".to_owned())?;
        let name = &after[..end];
        if name.is_empty()
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            || name.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(format!(
                "`${{{name}}}` is not a valid environment variable name"
            ));
        }
        parts.push(TemplatePart::Var(name));
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        parts.push(TemplatePart::Text(rest));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        for ok in [
            "example.com",
            "api.example.com",
            "localhost",
            "a-b.c1.io",
            "10.0.0.1",
            "::1",
            "[::1]",
            "2001:db8::1",
        ] {
            assert!(is_valid_host(ok), "{ok}");
        }
        for bad in [
            "",
            "-a.com",
            "a-.com",
            "a..com",
            "a.com.",
            "exa mple.com",
            "1.2.3",
            "999.1.1.1",
            "[1.2.3.4]",
            "*.example.com",
            "http://a.com",
            "a.com:80",
            &"a".repeat(64),
        ] {
            assert!(!is_valid_host(bad), "{bad}");
        }
    }

    #[test]
    fn host_patterns() {
        assert!(is_valid_host_pattern("*.example.com"));
        assert!(is_valid_host_pattern("example.com"));
        assert!(!is_valid_host_pattern("*"));
        assert!(!is_valid_host_pattern("*.com"));
        assert!(!is_valid_host_pattern("a.*.com"));
        assert!(!is_valid_host_pattern("*example.com"));
    }

    #[test]
    fn parent_components() {
        assert!(has_parent_component("../x"));
        assert!(has_parent_component("/a/../b"));
        assert!(has_parent_component("a\\..\\b"));
        assert!(!has_parent_component("/a/..b/c"));
        assert!(!has_parent_component("a/b"));
    }

    #[test]
    fn env_templates_split_into_text_and_references() {
        assert_eq!(
            parse_env_template("Bearer ${TOKEN}-x").unwrap(),
            [
                TemplatePart::Text("Bearer "),
                TemplatePart::Var("TOKEN"),
                TemplatePart::Text("-x")
            ]
        );
        assert_eq!(
            parse_env_template("plain").unwrap(),
            [TemplatePart::Text("plain")]
        );
        assert!(parse_env_template("${A").is_err());
        assert!(parse_env_template("${}").is_err());
        assert!(parse_env_template("${1A}").is_err());
        assert!(parse_env_template("${A-B}").is_err());
    }
}
