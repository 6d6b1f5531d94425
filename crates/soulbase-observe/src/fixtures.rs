//! Sample evidence for tests and benchmarks (feature `fixtures`): a Begin of a
//! call to `demo.echo.say` by `alice` of tenant `acme`, and its End.

use soulbase_types::{ActorId, CallId, Envelope, Origin, TenantId, ToolId};

use crate::{BudgetUsage, EndStatus, EvidenceBegin, EvidenceEnd, EvidenceEvent, EvidenceRecord};

/// The Begin of a new call (a fresh call id and envelope id each time).
#[allow(clippy::expect_used)] // constant, valid ids
pub fn sample_begin() -> EvidenceRecord {
    Envelope::new(
        TenantId::new("acme").expect("a valid tenant id"),
        ActorId::new("alice").expect("a valid actor id"),
        Origin::Llm,
        EvidenceEvent::Begin(EvidenceBegin {
            call_id: CallId::generate(),
            tool_id: ToolId::new("demo.echo.say").expect("a valid tool id"),
            tool_version: "1.0.0".into(),
            manifest_digest: "m".into(),
            profile_hash: "p".into(),
            policy_hash: "pol".into(),
            config_hash: "c".into(),
            args_digest: "sha256:00".into(),
            idempotency_key: None,
            calling_skill: None,
            consent: None,
            conversation: None,
            surface: None,
        }),
    )
}

/// The End (`ok`) of the call `begin` began; a record that is not a Begin gets
/// an End of a call of its own.
pub fn sample_end(begin: &EvidenceRecord) -> EvidenceRecord {
    let call_id = match &begin.payload {
        EvidenceEvent::Begin(b) => b.call_id.clone(),
        _ => CallId::generate(),
    };
    Envelope::new(
        begin.tenant.clone(),
        begin.actor.clone(),
        begin.origin,
        EvidenceEvent::End(EvidenceEnd {
            call_id,
            begin_id: begin.id.clone(),
            status: EndStatus::Ok,
            error_code: None,
            output_digest: Some("sha256:11".into()),
            side_effects: vec![],
            usage: BudgetUsage::default(),
            duration_us: 5,
            client_requests: Vec::new(),
        }),
    )
}
