//! `provider_compat`: which model providers, and which of their models, a tool may
//! be exported to.
//!
//! A manifest's `provider_compat` maps a provider this product exports to
//! ([`PROVIDERS`]: `openai`, `anthropic`) to the models the tool works with: a
//! comma-separated list of model-name patterns, where `*` matches any run of
//! characters (`gpt-4o*, o3*`), or `none` to never offer the tool to that
//! provider. A provider with no entry is unconstrained, and so is a tool without
//! `provider_compat`.
//!
//! An export for a provider leaves out the tools whose entry does not admit the
//! model asked for; when no model is named, only `none` leaves a tool out (the
//! caller did not say which model it will use). Names compare case-insensitively.

use std::collections::BTreeMap;

/// The providers `provider_compat` may name: the export targets.
pub const PROVIDERS: [&str; 2] = ["openai", "anthropic"];

/// Why a `provider_compat` entry is refused at load, if it is.
pub fn problem(provider: &str, requirement: &str) -> Option<String> {
    if !PROVIDERS.contains(&provider) {
        return Some(format!(
            "unknown provider {provider:?}: provider_compat names {}",
            PROVIDERS.join(" or ")
        ));
    }
    let patterns = patterns(requirement);
    if patterns.is_empty() {
        return Some("expected model patterns (e.g. \"gpt-4o*, o3*\") or \"none\"".into());
    }
    if let Some(bad) = patterns.iter().find(|p| {
        !p.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._:/*-@".contains(c))
    }) {
        return Some(format!(
            "model pattern {bad:?} may hold only letters, digits, . _ : / - @ and *"
        ));
    }
    if patterns.len() > 1 && patterns.iter().any(|p| p.eq_ignore_ascii_case("none")) {
        return Some("\"none\" stands alone".into());
    }
    None
}

fn patterns(requirement: &str) -> Vec<&str> {
    requirement
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

/// Whether a tool with `compat` may be exported to `provider` for `model` (see
/// the module doc).
pub fn admits(compat: &BTreeMap<String, String>, provider: &str, model: Option<&str>) -> bool {
    let Some(requirement) = compat.get(provider) else {
        return true;
    };
    let patterns = patterns(requirement);
    if patterns.iter().any(|p| p.eq_ignore_ascii_case("none")) {
        return false;
    }
    match model {
        None => true,
        Some(model) => {
            let model = model.to_ascii_lowercase();
            patterns
                .iter()
                .any(|p| glob(&p.to_ascii_lowercase(), &model))
        }
    }
}

/// `*`-only glob matching (no other metacharacters), iterative with one
/// backtrack point: linear in practice, never exponential.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compat(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn patterns_admit_models_and_none_excludes_the_provider() {
        let c = compat(&[("openai", "gpt-4o*, o3"), ("anthropic", "none")]);
        assert!(admits(&c, "openai", Some("gpt-4o-mini")));
        assert!(admits(&c, "openai", Some("GPT-4o")));
        assert!(admits(&c, "openai", Some("o3")));
        assert!(!admits(&c, "openai", Some("o3-mini")));
        assert!(!admits(&c, "openai", Some("gpt-3.5-turbo")));
        assert!(admits(&c, "openai", None), "no model named: not excluded");
        assert!(!admits(&c, "anthropic", None));
        assert!(!admits(&c, "anthropic", Some("claude-sonnet-4")));
        assert!(admits(&BTreeMap::new(), "anthropic", Some("x")));
        let only_openai = compat(&[("openai", "*")]);
        assert!(admits(&only_openai, "anthropic", Some("claude")));
    }

    #[test]
    fn glob_matches_stars_anywhere() {
        assert!(glob("*", ""));
        assert!(glob("a*c", "abbbc"));
        assert!(glob("*-mini", "gpt-4o-mini"));
        assert!(!glob("a*c", "abcd"));
        assert!(glob("a**", "a"));
        assert!(!glob("abc", "ab"));
    }

    #[test]
    fn unknown_providers_and_bad_patterns_are_refused() {
        assert!(problem("openai", "gpt-4o*").is_none());
        assert!(problem("anthropic", "none").is_none());
        assert!(
            problem("mistral", "*")
                .unwrap()
                .contains("unknown provider")
        );
        assert!(problem("openai", " , ").is_some());
        assert!(problem("openai", ">=2024-08").is_some());
        assert!(problem("openai", "none, gpt-4o").is_some());
    }
}
