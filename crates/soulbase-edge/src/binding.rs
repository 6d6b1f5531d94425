//! Which skill a call is made for, and who may say so.
//!
//! A call made "from inside" a skill is checked against that skill's imports
//! (`SKILL.NOT_IMPORTED`), and a skill calling its *own* exported tools is not
//! bound by its own access terms. Claiming to be a skill is therefore a
//! privilege, never taken from a tool call's arguments. A call is bound to a skill
//! by its transport: over stdio by the operator (`soulbased mcp --skill NAME`); over
//! HTTP by the [`SKILL_HEADER`] request header and over gRPC by
//! `InvokeRequest.calling_skill`, honoured only when the authenticated subject
//! holds the scope `skill:<name>` (or [`ALL_SKILLS_SCOPE`]) — or when the server
//! trusts development identities (`server.dev_insecure`), where identity itself is
//! client-claimed. Otherwise the call is refused with `AUTH.FORBIDDEN`.

use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::Subject;

/// The request header binding an HTTP request (an invoke, or an MCP session) to a
/// skill.
pub const SKILL_HEADER: &str = "x-soulbase-skill";

/// [`SKILL_HEADER`] as a parsed name: `HeaderMap::get` with a `&str` parses and
/// checks the name again on every lookup.
pub static SKILL_HEADER_NAME: http::HeaderName = http::HeaderName::from_static(SKILL_HEADER);

/// The scope granting every skill binding.
pub const ALL_SKILLS_SCOPE: &str = "skills:*";

/// A skill binding as the transport received it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Binding {
    /// A model or client acting directly.
    #[default]
    None,
    /// Claimed by the client (a header, a request field): honoured only for a
    /// subject holding the skill's scope (or in development).
    Claimed(String),
    /// Set by the operator who started the transport (stdio `--skill`).
    Operator(String),
}

impl Binding {
    /// A claimed binding from an optional header or field value (empty = none).
    pub fn claimed(name: Option<String>) -> Self {
        match name {
            Some(n) if !n.is_empty() => Binding::Claimed(n),
            _ => Binding::None,
        }
    }
}

/// Whether `name` is a well-formed skill name (what a skill binding may carry).
fn well_formed(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// The skill `binding` makes a call for: `None` without one; an operator's as it
/// is; a claimed one when `subject` holds scope `skill:<name>` or
/// [`ALL_SKILLS_SCOPE`], or when `trust_dev`. A claim that is not a skill name is
/// `SCHEMA.VALIDATION_FAILED` (field `calling_skill`); one the subject may not
/// make is `AUTH.FORBIDDEN`.
pub fn authorize(
    binding: &Binding,
    subject: &Subject,
    trust_dev: bool,
) -> Result<Option<String>, SoulError> {
    let name = match binding {
        Binding::None => return Ok(None),
        Binding::Operator(name) => return Ok(Some(name.clone())),
        Binding::Claimed(name) => name,
    };
    if !well_formed(name) {
        return Err(SoulError::new(
            ErrorCode::SchemaValidationFailed,
            "the calling skill is not a skill name",
        )
        .with_field("field", "calling_skill"));
    }
    let scoped = subject.scopes.contains(ALL_SKILLS_SCOPE)
        || subject.scopes.contains(&format!("skill:{name}"));
    if scoped || trust_dev {
        Ok(Some(name.clone()))
    } else {
        Err(SoulError::new(
            ErrorCode::AuthForbidden,
            format!("acting as skill {name} needs the scope skill:{name}"),
        )
        .with_field("skill", name.clone()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use soulbase_types::{ActorId, TenantId};

    fn subject(scopes: &[&str]) -> Subject {
        let mut s = Subject::new(TenantId::new("t").unwrap(), ActorId::new("a").unwrap());
        s.scopes = scopes.iter().map(|x| (*x).to_owned()).collect();
        s
    }

    #[test]
    fn a_claim_needs_the_skills_scope() {
        let claim = Binding::Claimed("notes".into());
        let err = authorize(&claim, &subject(&[]), false).unwrap_err();
        assert_eq!(err.code(), ErrorCode::AuthForbidden);
        assert_eq!(
            authorize(&claim, &subject(&["skill:notes"]), false).unwrap(),
            Some("notes".into())
        );
        assert_eq!(
            authorize(&claim, &subject(&[ALL_SKILLS_SCOPE]), false).unwrap(),
            Some("notes".into())
        );
        assert_eq!(
            authorize(&claim, &subject(&[]), true).unwrap(),
            Some("notes".into())
        );
        let bad = Binding::Claimed("Not A Name".into());
        let err = authorize(&bad, &subject(&[ALL_SKILLS_SCOPE]), true).unwrap_err();
        assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
        let op = Binding::Operator("notes".into());
        assert_eq!(
            authorize(&op, &subject(&[]), false).unwrap(),
            Some("notes".into())
        );
    }
}
