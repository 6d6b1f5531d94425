//! Replay: a call's key behaviour and result summary, rebuilt from its evidence (R11).
//!
//! Replay never re-executes a tool; it reconstructs what the evidence proves — which
//! exact tool version ran under which profile, policy and configuration, on which
//! arguments (by digest), and how it ended — and flags anything inconsistent (a
//! missing or duplicated half, an End that closes another Begin).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{ActorId, CallId, EnvelopeId, Origin, TenantId, ToolId, UnixMillis};

use crate::{BudgetUsage, CallEvidence, EndStatus, EvidenceEvent, SideEffectRecord};

/// What the evidence of one call proves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Replay {
    /// The call.
    pub call_id: CallId,
    /// The tenant.
    pub tenant: TenantId,
    /// The actor.
    pub actor: ActorId,
    /// Where it came from.
    pub origin: Origin,
    /// What happened.
    pub outcome: ReplayOutcome,
    /// Inconsistencies found in the evidence (empty for a well-formed call).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anomalies: Vec<String>,
}

/// How a call went, as far as its evidence shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[schemars(deny_unknown_fields)]
pub enum ReplayOutcome {
    /// Refused before execution.
    Denied {
        /// The tool as requested.
        tool: String,
        /// Why.
        code: ErrorCode,
        /// When.
        at: UnixMillis,
    },
    /// Reached execution.
    Executed(Box<Execution>),
}

/// A call that reached execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Execution {
    /// The Begin envelope (the call's evidence reference).
    pub begin_id: EnvelopeId,
    /// The tool.
    pub tool_id: ToolId,
    /// The exact version executed.
    pub tool_version: String,
    /// Digest of the manifest in force.
    pub manifest_digest: String,
    /// Hash of the capability profile it ran under.
    pub profile_hash: String,
    /// Hash of the policy that allowed it.
    pub policy_hash: String,
    /// Hash of the configuration in force.
    pub config_hash: String,
    /// Digest of its arguments.
    pub args_digest: String,
    /// Its idempotency key, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The calling skill, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calling_skill: Option<String>,
    /// When it began.
    pub began_at: UnixMillis,
    /// When it ended (`None`: no End recorded yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<UnixMillis>,
    /// How it ended (`None`: no End recorded yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<EndStatus>,
    /// The error code, when it did not end ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<ErrorCode>,
    /// Digest of its output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_digest: Option<String>,
    /// Side effects the executor reported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub side_effects: Vec<SideEffectRecord>,
    /// What it consumed.
    pub usage: BudgetUsage,
    /// Execution time in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_us: Option<u64>,
}

/// Rebuilds a call from its records. `TOOL.NOT_FOUND`-style absence is reported as
/// `SCHEMA.VALIDATION_FAILED` on field `call_id` when there is no evidence at all.
pub fn replay(evidence: &CallEvidence) -> Result<Replay, SoulError> {
    let Some(first) = evidence.records.first() else {
        return Err(SoulError::new(
            ErrorCode::SchemaValidationFailed,
            "no evidence is recorded for this call",
        )
        .with_field("field", "call_id"));
    };
    let mut anomalies = Vec::new();
    let begins: Vec<_> = evidence.begins().collect();
    let ends: Vec<_> = evidence.ends().collect();
    let denial = evidence.denials().next();
    if begins.len() > 1 {
        anomalies.push(format!("{} Begin records (expected one)", begins.len()));
    }
    if ends.len() > 1 {
        anomalies.push(format!("{} End records (expected one)", ends.len()));
    }
    let call_id = first.payload.call_id().clone();
    let outcome = match (begins.first(), denial) {
        (Some(begin), denial) => {
            if denial.is_some() {
                anomalies.push("both a Denial and a Begin are recorded".into());
            }
            let EvidenceEvent::Begin(b) = &begin.payload else {
                return Err(SoulError::internal(std::fmt::Error));
            };
            let end = ends.first().and_then(|r| match &r.payload {
                EvidenceEvent::End(e) => Some((r.at, e)),
                _ => None,
            });
            match end {
                None => anomalies.push("no End recorded (the call may still be running)".into()),
                Some((_, e)) if e.begin_id != begin.id => anomalies.push(format!(
                    "the End closes Begin {} but the Begin is {}",
                    e.begin_id, begin.id
                )),
                Some(_) => {}
            }
            ReplayOutcome::Executed(Box::new(Execution {
                begin_id: begin.id.clone(),
                tool_id: b.tool_id.clone(),
                tool_version: b.tool_version.clone(),
                manifest_digest: b.manifest_digest.clone(),
                profile_hash: b.profile_hash.clone(),
                policy_hash: b.policy_hash.clone(),
                config_hash: b.config_hash.clone(),
                args_digest: b.args_digest.clone(),
                idempotency_key: b.idempotency_key.clone(),
                calling_skill: b.calling_skill.clone(),
                began_at: begin.at,
                ended_at: end.map(|(at, _)| at),
                status: end.map(|(_, e)| e.status),
                error_code: end.and_then(|(_, e)| e.error_code),
                output_digest: end.and_then(|(_, e)| e.output_digest.clone()),
                side_effects: end.map(|(_, e)| e.side_effects.clone()).unwrap_or_default(),
                usage: end.map(|(_, e)| e.usage).unwrap_or_default(),
                duration_us: end.map(|(_, e)| e.duration_us),
            }))
        }
        (None, Some(d)) => {
            let EvidenceEvent::Denied(x) = &d.payload else {
                return Err(SoulError::internal(std::fmt::Error));
            };
            if !ends.is_empty() {
                anomalies.push("an End without a Begin is recorded".into());
            }
            ReplayOutcome::Denied {
                tool: x.tool.clone(),
                code: x.code,
                at: d.at,
            }
        }
        (None, None) => {
            return Err(SoulError::new(
                ErrorCode::SchemaValidationFailed,
                "only an End is recorded for this call; its Begin is missing",
            )
            .with_field("field", "call_id"));
        }
    };
    Ok(Replay {
        call_id,
        tenant: first.tenant.clone(),
        actor: first.actor.clone(),
        origin: first.origin,
        outcome,
        anomalies,
    })
}
