//! Replay of an agent-loop conversation: its start, each model turn with the
//! calls it made (each replayed from its own evidence), and its end, rebuilt
//! from the records — flagging what does not add up (a missing start or end, a
//! turn out of order, a call named by a turn with no evidence or naming another
//! conversation).

use std::collections::{BTreeMap, BTreeSet};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{ActorId, CallId, TenantId, UnixMillis};

use crate::{
    CallEvidence, ConversationEnd, ConversationEvent, ConversationStep, EvidenceEvent, Replay,
    TokenUsage, replay,
};

/// What the evidence of one conversation proves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ConversationReplay {
    /// The conversation.
    pub conversation_id: CallId,
    /// The tenant.
    pub tenant: TenantId,
    /// The actor.
    pub actor: ActorId,
    /// The upstream model asked (`None`: no start recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// When it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<UnixMillis>,
    /// Its model turns, in order.
    pub turns: Vec<TurnReplay>,
    /// How it ended (`None`: no end recorded yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<EndReplay>,
    /// Inconsistencies found (empty for a well-formed conversation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anomalies: Vec<String>,
}

/// One model turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct TurnReplay {
    /// The turn (1-based).
    pub iteration: u32,
    /// When it was recorded.
    pub at: UnixMillis,
    /// Digest of the model's response.
    pub response_digest: String,
    /// Token usage, when the upstream reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenUsage>,
    /// The tool calls the model asked for, in its order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<CallReplay>,
}

/// One tool call of a turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct CallReplay {
    /// The model's id for it.
    pub id: String,
    /// The tool as named.
    pub tool: String,
    /// The stable code when it was refused or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
    /// The call, replayed from its own evidence (`None`: answered in place,
    /// withheld, or its evidence is missing — an anomaly then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<Replay>,
    /// The call's evidence exists but the reader may not read it (a policy
    /// refusing `read_evidence` on its tool).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub withheld: bool,
}

/// How a conversation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct EndReplay {
    /// Why.
    pub reason: ConversationEnd,
    /// When.
    pub at: UnixMillis,
    /// Model turns made.
    pub iterations: u32,
    /// Tool calls the model asked for.
    pub tool_calls: u32,
    /// Tokens reported, summed.
    pub tokens: u64,
    /// The stable code, for `upstream_error` and `refused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<ErrorCode>,
}

/// Whether `evidence` is a conversation's own (its records are conversation steps).
pub fn is_conversation(evidence: &CallEvidence) -> bool {
    evidence
        .records
        .iter()
        .any(|r| matches!(r.payload, EvidenceEvent::Conversation(_)))
}

fn steps(evidence: &CallEvidence) -> impl Iterator<Item = (UnixMillis, &ConversationEvent)> {
    evidence.records.iter().filter_map(|r| match &r.payload {
        EvidenceEvent::Conversation(c) => Some((r.at, c.as_ref())),
        _ => None,
    })
}

/// The call ids a conversation's turns name, in order: what to read to replay it.
pub fn conversation_calls(evidence: &CallEvidence) -> Vec<CallId> {
    steps(evidence)
        .flat_map(|(_, c)| match &c.step {
            ConversationStep::Turn { tool_calls, .. } => tool_calls.as_slice(),
            _ => &[],
        })
        .filter_map(|t| t.call_id.clone())
        .collect()
}

/// Rebuilds a conversation from its own records and its calls' evidence
/// (`calls`, by call id; see [`conversation_calls`]), less the calls whose
/// evidence the reader may not read (`withheld`: shown as such, not replayed).
/// No records at all is `SCHEMA.VALIDATION_FAILED` on `call_id`, as for
/// [`replay`].
pub fn replay_conversation(
    evidence: &CallEvidence,
    calls: &BTreeMap<CallId, CallEvidence>,
    withheld: &BTreeSet<CallId>,
) -> Result<ConversationReplay, SoulError> {
    let Some(first) = evidence.records.first() else {
        return Err(SoulError::new(
            ErrorCode::SchemaValidationFailed,
            "no evidence is recorded for this conversation",
        )
        .with_field("field", "call_id"));
    };
    let conversation_id = first.payload.call_id().clone();
    let mut anomalies = Vec::new();
    let (mut model, mut started_at, mut end) = (None, None, None);
    let mut turns: Vec<TurnReplay> = Vec::new();
    for (at, event) in steps(evidence) {
        match &event.step {
            ConversationStep::Start { model: m, .. } => {
                if model.is_some() {
                    anomalies.push("more than one start recorded".into());
                }
                model = Some(m.clone());
                started_at = Some(at);
            }
            ConversationStep::Turn {
                iteration,
                response_digest,
                tokens,
                tool_calls,
            } => {
                let expected = u32::try_from(turns.len() + 1).unwrap_or(u32::MAX);
                if *iteration != expected {
                    anomalies.push(format!(
                        "turn {iteration} recorded where turn {expected} was expected"
                    ));
                }
                let calls = tool_calls
                    .iter()
                    .map(|t| {
                        let hidden = t.call_id.as_ref().is_some_and(|id| withheld.contains(id));
                        let replayed = t.call_id.as_ref().filter(|_| !hidden).and_then(|id| {
                            let found = calls.get(id).filter(|e| !e.is_empty());
                            if found.is_none() {
                                anomalies.push(format!("turn {iteration} names call {id}, which has no evidence"));
                            }
                            found
                        });
                        let replayed = replayed.and_then(|e| match replay(e) {
                            Ok(r) => Some(r),
                            Err(e) => {
                                anomalies.push(format!("call of turn {iteration}: {e}"));
                                None
                            }
                        });
                        if let Some(id) = t.call_id.as_ref().filter(|_| !hidden)
                            && let Some(e) = calls.get(id)
                            && let Some(b) = e.begins().next()
                            && let EvidenceEvent::Begin(b) = &b.payload
                            && b.conversation.as_ref().is_none_or(|c| {
                                c.id != conversation_id.as_str() || c.iteration != *iteration
                            })
                        {
                            anomalies.push(format!(
                                "call {id} of turn {iteration} does not name this conversation's turn in its Begin"
                            ));
                        }
                        CallReplay {
                            id: t.id.clone(),
                            tool: t.tool.clone(),
                            code: t.code,
                            replay: replayed,
                            withheld: hidden,
                        }
                    })
                    .collect();
                turns.push(TurnReplay {
                    iteration: *iteration,
                    at,
                    response_digest: response_digest.clone(),
                    tokens: *tokens,
                    calls,
                });
            }
            ConversationStep::End {
                reason,
                iterations,
                tool_calls,
                tokens,
                error_code,
            } => {
                if end.is_some() {
                    anomalies.push("more than one end recorded".into());
                }
                end = Some(EndReplay {
                    reason: *reason,
                    at,
                    iterations: *iterations,
                    tool_calls: *tool_calls,
                    tokens: *tokens,
                    error_code: *error_code,
                });
            }
        }
    }
    if evidence
        .records
        .iter()
        .any(|r| !matches!(r.payload, EvidenceEvent::Conversation(_)))
    {
        anomalies.push("call records are stored under the conversation's id".into());
    }
    if model.is_none() {
        anomalies.push("no start recorded".into());
    }
    match &end {
        None => anomalies.push("no end recorded (the conversation may still be running)".into()),
        Some(e) if e.iterations as usize != turns.len() => anomalies.push(format!(
            "the end counts {} turns but {} are recorded",
            e.iterations,
            turns.len()
        )),
        Some(_) => {}
    }
    Ok(ConversationReplay {
        conversation_id,
        tenant: first.tenant.clone(),
        actor: first.actor.clone(),
        model,
        started_at,
        turns,
        end,
        anomalies,
    })
}
