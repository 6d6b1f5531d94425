//! The closed set of actions every authorization decision is about.

use std::fmt;
use std::str::FromStr;

/// What a subject asks to do to a tool (resource `soul:tool:{id}`). The set is
/// closed: every decision the product makes is one of these, and the Cedar
/// [`SCHEMA`](crate::SCHEMA) declares exactly them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// Run the tool.
    Invoke,
    /// Ask whether a call would pass, without running it.
    Preflight,
    /// See the tool in a listing (or an export to a model).
    List,
    /// Read the evidence of a call of the tool (on resource
    /// [`Action::AUDIT_RESOURCE`]: read the audit of changes).
    ReadEvidence,
    /// Register the tool.
    Register,
    /// Replace the tool's manifest.
    Update,
    /// Remove the tool.
    Unregister,
    /// Enable the tool (for a skill: enable it, on each of its tools).
    Enable,
    /// Disable the tool (for a skill: disable it, on each of its tools).
    Disable,
    /// Mark the tool deprecated.
    Deprecate,
    /// Re-read the configuration and the skills directory (resource
    /// [`Action::RELOAD_RESOURCE`]).
    Reload,
    /// Consent to calls of the tool on someone's behalf: issue a consent token
    /// (and, on resource `soulbase.server.consent`, revoke one).
    ConsentIssue,
}

impl Action {
    /// Every action, in schema order.
    pub const ALL: [Action; 12] = [
        Action::Invoke,
        Action::Preflight,
        Action::List,
        Action::ReadEvidence,
        Action::Register,
        Action::Update,
        Action::Unregister,
        Action::Enable,
        Action::Disable,
        Action::Deprecate,
        Action::Reload,
        Action::ConsentIssue,
    ];

    /// The resource a [`Action::Reload`] is asked about: the server's
    /// configuration, named like a tool so one policy language covers it.
    pub const RELOAD_RESOURCE: &'static str = "soulbase.server.config";

    /// The resource reading the audit of changes (registry, skills,
    /// configuration) is asked about, with [`Action::ReadEvidence`].
    pub const AUDIT_RESOURCE: &'static str = "soulbase.server.audit";

    /// The resource reading the spool's quarantine (records the database
    /// refused for good) is asked about, with [`Action::ReadEvidence`]; offering
    /// those records to the database again (`POST /api/quarantine/retry`), with
    /// [`Action::Update`].
    pub const QUARANTINE_RESOURCE: &'static str = "soulbase.server.quarantine";

    /// The resource reading another tenant's evidence (the operator's evidence
    /// explorer: `tenant=` on the evidence routes) is asked about, with
    /// [`Action::ReadEvidence`]; only callers of the `global` tenant may ask.
    pub const EVIDENCE_RESOURCE: &'static str = "soulbase.server.evidence";

    /// The resource a preflight on someone else's behalf (the policy
    /// simulator's "may actor A of tenant T call this?") is asked about, with
    /// [`Action::Preflight`].
    pub const SIMULATOR_RESOURCE: &'static str = "soulbase.server.simulator";

    /// The resource reading an agent-loop conversation's own evidence is asked
    /// about, with [`Action::ReadEvidence`] (each call it made is still asked
    /// about on its own tool).
    pub const CONVERSATION_RESOURCE: &'static str = "soulbase.server.conversations";

    /// The action's name in policies (`policy.rules[].actions`, Cedar
    /// `Soul::Action::"…"`) and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Invoke => "invoke",
            Action::Preflight => "preflight",
            Action::List => "list",
            Action::ReadEvidence => "read_evidence",
            Action::Register => "register",
            Action::Update => "update",
            Action::Unregister => "unregister",
            Action::Enable => "enable",
            Action::Disable => "disable",
            Action::Deprecate => "deprecate",
            Action::Reload => "reload",
            Action::ConsentIssue => "consent_issue",
        }
    }

    /// Whether a static rule granting `invoke` grants this action too: seeing a
    /// tool one may call and asking whether a call would pass. (Deny rules match
    /// only the actions they name; Cedar policies name every action they permit.)
    pub fn implied_by_invoke(self) -> bool {
        matches!(self, Action::Preflight | Action::List)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An action name no [`Action`] has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownAction(pub String);

impl fmt::Display for UnknownAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown action {:?}", self.0)
    }
}

impl std::error::Error for UnknownAction {}

impl FromStr for Action {
    type Err = UnknownAction;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Action::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| UnknownAction(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_validates_exactly_these_names() {
        let names: Vec<&str> = Action::ALL.iter().map(|a| a.as_str()).collect();
        assert_eq!(names, soulbase_config::POLICY_ACTIONS);
    }

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for a in Action::ALL {
            assert_eq!(a.as_str().parse::<Action>(), Ok(a));
        }
        assert!("explode".parse::<Action>().is_err());
    }
}
