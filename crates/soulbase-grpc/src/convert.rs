//! Conversions between `soulbase.tools.v1` messages and the core types.
//!
//! Every parse of client input names the offending field in a
//! `SCHEMA.VALIDATION_FAILED` error (`field`).

use serde::de::DeserializeOwned;
use serde_json::Value;
use soulbase_edge::{Binding, CallMeta, CallRequest, Surface};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_sandbox::CapabilityDomain;
use soulbase_tools::manifest::Idempotency;
use soulbase_tools::pipeline::PreflightReport;
use soulbase_tools::{
    RegistryEvent, ResolvedTool, ToolFilter, ToolManifest, ToolOwner, ToolState,
    registry::OwnerFilter,
};
use soulbase_types::{Origin, Subject, TenantId, ToolId};

use crate::proto;

/// `SCHEMA.VALIDATION_FAILED` naming `field`.
pub fn invalid(field: &str, message: impl Into<String>) -> SoulError {
    SoulError::new(ErrorCode::SchemaValidationFailed, message.into()).with_field("field", field)
}

/// Parses a tool id from `field`.
pub fn tool_id(field: &str, s: &str) -> Result<ToolId, SoulError> {
    ToolId::new(s).map_err(|e| invalid(field, format!("{field} is not a tool id: {}", e.reason)))
}

/// Parses a lowercase enum name (as the manifest spells it) from `field`.
pub fn enum_name<T: DeserializeOwned>(field: &str, s: &str) -> Result<T, SoulError> {
    serde_json::from_value(Value::String(s.to_owned()))
        .map_err(|_| invalid(field, format!("{field} has an unknown value {s:?}")))
}

/// The wire state.
pub fn state_to_proto(s: ToolState) -> proto::ToolState {
    match s {
        ToolState::Registered => proto::ToolState::Registered,
        ToolState::Enabled => proto::ToolState::Enabled,
        ToolState::Paused => proto::ToolState::Paused,
        ToolState::Deprecated => proto::ToolState::Deprecated,
    }
}

/// The core state; `None` for unspecified.
pub fn state_from_proto(s: proto::ToolState) -> Option<ToolState> {
    match s {
        proto::ToolState::Unspecified => None,
        proto::ToolState::Registered => Some(ToolState::Registered),
        proto::ToolState::Enabled => Some(ToolState::Enabled),
        proto::ToolState::Paused => Some(ToolState::Paused),
        proto::ToolState::Deprecated => Some(ToolState::Deprecated),
    }
}

fn json_text(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// A resolved tool as the wire `Tool` (the manifest only when asked for).
pub fn tool_to_proto(t: &ResolvedTool, include_manifest: bool) -> proto::Tool {
    let m = &t.tool.manifest;
    let (owner, owner_tenant) = match &t.owner {
        ToolOwner::Global => (proto::OwnerScope::Global, String::new()),
        ToolOwner::Tenant(tenant) => (proto::OwnerScope::Tenant, tenant.to_string()),
    };
    proto::Tool {
        id: m.id.to_string(),
        version: m.version.to_string(),
        state: state_to_proto(t.state) as i32,
        owner: owner as i32,
        owner_tenant,
        display_name: m.title().to_owned(),
        description: m.description.clone(),
        tags: m.tags.clone(),
        safety_class: m.safety_class.as_str().to_owned(),
        side_effect: m.side_effect.as_str().to_owned(),
        input_schema_json: json_text(&m.input_schema),
        output_schema_json: json_text(&m.output_schema),
        digest: t.tool.digest.clone(),
        manifest_json: if include_manifest {
            serde_json::to_string(m.as_ref()).unwrap_or_default()
        } else {
            String::new()
        },
        consent_required: m.consent_required(),
        idempotency: match m.idempotency {
            Idempotency::Keyed => "keyed".to_owned(),
            Idempotency::None => "none".to_owned(),
        },
    }
}

/// Parses a manifest given as JSON (starting with `{`) or YAML text.
pub fn manifest(field: &str, text: &str) -> Result<ToolManifest, SoulError> {
    if text.trim().is_empty() {
        return Err(invalid(field, format!("{field} is empty")));
    }
    let parsed = if text.trim_start().starts_with('{') {
        ToolManifest::from_json_str(text)
    } else {
        ToolManifest::from_yaml_str(text)
    };
    parsed.map_err(SoulError::from)
}

/// The owner a write addresses: the caller's tenant unless `GLOBAL` is asked for.
pub fn write_owner(scope: proto::OwnerScope, subject: &Subject) -> ToolOwner {
    match scope {
        proto::OwnerScope::Global => ToolOwner::Global,
        proto::OwnerScope::Unspecified | proto::OwnerScope::Tenant => {
            ToolOwner::tenant(subject.tenant.clone())
        }
    }
}

/// The registry filter for a list request.
pub fn filter(req: &proto::ListToolsRequest) -> Result<ToolFilter, SoulError> {
    let opt = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    let state = proto::ToolState::try_from(req.state)
        .map_err(|_| invalid("state", "state has an unknown value"))?;
    let owner = match proto::OwnerScope::try_from(req.owner)
        .map_err(|_| invalid("owner", "owner has an unknown value"))?
    {
        proto::OwnerScope::Unspecified => None,
        proto::OwnerScope::Tenant => Some(OwnerFilter::Tenant),
        proto::OwnerScope::Global => Some(OwnerFilter::Global),
    };
    Ok(ToolFilter {
        state: state_from_proto(state),
        owner,
        group: opt(&req.group),
        tag: opt(&req.tag),
        safety_class: match req.safety_class.as_str() {
            "" => None,
            s => Some(enum_name("safety_class", s)?),
        },
        side_effect: match req.side_effect.as_str() {
            "" => None,
            s => Some(enum_name("side_effect", s)?),
        },
        capability: match req.capability.as_str() {
            "" => None,
            s => Some(enum_name::<CapabilityDomain>("capability", s)?),
        },
        keyword: opt(&req.keyword),
    })
}

/// Whether `event` concerns a tool `tenant` can see (global tools or its own).
pub fn event_visible_to(event: &RegistryEvent, tenant: &TenantId) -> bool {
    let owner = match event {
        RegistryEvent::Registered { tenant, .. }
        | RegistryEvent::Updated { tenant, .. }
        | RegistryEvent::StateChanged { tenant, .. }
        | RegistryEvent::Unregistered { tenant, .. } => tenant.as_ref(),
        RegistryEvent::OverrideChanged { tenant, .. }
        | RegistryEvent::AllowListChanged { tenant } => Some(tenant),
    };
    owner.is_none_or(|t| t == tenant)
}

/// A registry event on the wire.
pub fn event_to_proto(event: &RegistryEvent, snapshot_version: u64) -> proto::RegistryEvent {
    use proto::RegistryEventKind as K;
    let mut out = proto::RegistryEvent {
        snapshot_version,
        ..Default::default()
    };
    let t = |t: &Option<TenantId>| t.as_ref().map(ToString::to_string).unwrap_or_default();
    match event {
        RegistryEvent::Registered {
            tenant,
            id,
            version,
        } => {
            out.kind = K::Registered as i32;
            out.tenant = t(tenant);
            out.tool_id = id.to_string();
            out.to_version = version.to_string();
        }
        RegistryEvent::Updated {
            tenant,
            id,
            from,
            to,
        } => {
            out.kind = K::Updated as i32;
            out.tenant = t(tenant);
            out.tool_id = id.to_string();
            out.from_version = from.to_string();
            out.to_version = to.to_string();
        }
        RegistryEvent::StateChanged {
            tenant,
            id,
            from,
            to,
        } => {
            out.kind = K::StateChanged as i32;
            out.tenant = t(tenant);
            out.tool_id = id.to_string();
            out.from_state = state_to_proto(*from) as i32;
            out.to_state = state_to_proto(*to) as i32;
        }
        RegistryEvent::Unregistered {
            tenant,
            id,
            version,
        } => {
            out.kind = K::Unregistered as i32;
            out.tenant = t(tenant);
            out.tool_id = id.to_string();
            out.to_version = version.to_string();
        }
        RegistryEvent::OverrideChanged { tenant, id, .. } => {
            out.kind = K::OverrideChanged as i32;
            out.tenant = tenant.to_string();
            out.tool_id = id.to_string();
        }
        RegistryEvent::AllowListChanged { tenant } => {
            out.kind = K::AllowListChanged as i32;
            out.tenant = tenant.to_string();
        }
    }
    out
}

/// Parses JSON arguments (`field`); empty text means `{}`.
pub fn arguments(field: &str, text: &str) -> Result<Value, SoulError> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_str(text)
        .map_err(|e| invalid(field, format!("{field} is not valid JSON: {e}")))
}

/// The [`CallRequest`] of an invoke or preflight request by `subject`: the
/// request's fields, each falling back to the metadata's (`meta`). Only the
/// arguments' JSON and the origin are checked here; the [`Stack`](soulbase_edge::Stack)
/// checks the rest, as for every surface.
pub fn call_request(
    subject: Subject,
    req: &proto::InvokeRequest,
    meta: CallMeta,
) -> Result<CallRequest, SoulError> {
    let args = arguments("arguments_json", &req.arguments_json)?;
    let origin = match proto::Origin::try_from(req.origin)
        .map_err(|_| invalid("origin", "origin has an unknown value"))?
    {
        proto::Origin::Unspecified | proto::Origin::Api => Origin::Api,
        proto::Origin::Llm => Origin::Llm,
        proto::Origin::System => Origin::System,
    };
    let opt = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    let fields = CallMeta {
        call_id: opt(&req.call_id),
        idempotency_key: opt(&req.idempotency_key),
        consent: opt(&req.consent_token),
        traceparent: opt(&req.traceparent),
        binding: Binding::claimed(opt(&req.calling_skill)),
        conversation: None,
        reporter: soulbase_tools::pipeline::Reporter::none(),
    };
    Ok(CallRequest {
        surface: Surface::Grpc,
        subject,
        tool: req.tool_id.clone(),
        args,
        origin,
        meta: fields.or(meta),
    })
}

/// A preflight report on the wire.
pub fn preflight_to_proto(r: &PreflightReport) -> proto::PreflightResponse {
    proto::PreflightResponse {
        tool_id: r.tool.to_string(),
        version: r.version.clone(),
        profile_hash: r.profile_hash.clone(),
        policy_hash: r.policy_hash.clone(),
        budget_json: serde_json::to_string(&r.budget).unwrap_or_default(),
        consent_required: r.consent_required,
        obligations_json: serde_json::to_string(&r.obligations).unwrap_or_default(),
    }
}

/// A preflight report from the wire (a malformed peer answer is `UNKNOWN.INTERNAL`).
pub fn preflight_from_proto(r: proto::PreflightResponse) -> Result<PreflightReport, SoulError> {
    let bad = |what: &str| {
        SoulError::of(ErrorCode::UnknownInternal).with_note(format!(
            "the server's preflight answer has a malformed {what}"
        ))
    };
    Ok(PreflightReport {
        tool: ToolId::new(r.tool_id).map_err(|_| bad("tool_id"))?,
        version: r.version,
        profile_hash: r.profile_hash,
        policy_hash: r.policy_hash,
        budget: if r.budget_json.is_empty() {
            Default::default()
        } else {
            serde_json::from_str(&r.budget_json).map_err(|_| bad("budget_json"))?
        },
        consent_required: r.consent_required,
        obligations: if r.obligations_json.is_empty() {
            Vec::new()
        } else {
            serde_json::from_str(&r.obligations_json).map_err(|_| bad("obligations_json"))?
        },
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use soulbase_types::ActorId;

    fn subject() -> Subject {
        Subject::new(TenantId::new("acme").unwrap(), ActorId::new("bob").unwrap())
    }

    #[test]
    fn call_takes_body_first_then_metadata() {
        let req = proto::InvokeRequest {
            tool_id: "demo.echo.say".into(),
            arguments_json: r#"{"n": 1, "f": 1.5}"#.into(),
            idempotency_key: String::new(),
            consent_token: "body-token".into(),
            ..Default::default()
        };
        let meta = CallMeta {
            idempotency_key: Some("k1".into()),
            consent: Some("meta-token".into()),
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
            ..CallMeta::default()
        };
        let call = call_request(subject(), &req, meta).unwrap();
        assert_eq!(call.meta.idempotency_key.as_deref(), Some("k1"));
        assert_eq!(call.meta.consent.as_deref(), Some("body-token"));
        assert!(call.meta.traceparent.is_some());
        // Integers stay integers, floats stay floats.
        assert!(call.args["n"].is_u64());
        assert!(call.args["f"].is_f64());
    }

    #[test]
    fn bad_input_names_the_field() {
        for (req, field) in [
            (
                proto::InvokeRequest {
                    tool_id: "demo.echo.say".into(),
                    arguments_json: "{not json".into(),
                    ..Default::default()
                },
                "arguments_json",
            ),
            (
                proto::InvokeRequest {
                    tool_id: "demo.echo.say".into(),
                    origin: 99,
                    ..Default::default()
                },
                "origin",
            ),
        ] {
            let err = call_request(subject(), &req, CallMeta::default()).unwrap_err();
            assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
            assert_eq!(err.field("field"), Some(field), "{err:?}");
        }
    }

    #[test]
    fn list_filter_rejects_unknown_enum_names() {
        let req = proto::ListToolsRequest {
            safety_class: "extreme".into(),
            ..Default::default()
        };
        let err = filter(&req).unwrap_err();
        assert_eq!(err.field("field"), Some("safety_class"));
        let ok = filter(&proto::ListToolsRequest {
            side_effect: "read".into(),
            capability: "net".into(),
            state: proto::ToolState::Enabled as i32,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(ok.state, Some(ToolState::Enabled));
        assert_eq!(ok.capability, Some(CapabilityDomain::Net));
    }

    #[test]
    fn events_are_scoped_to_the_tenant() {
        let acme = TenantId::new("acme").unwrap();
        let other = TenantId::new("other").unwrap();
        let id = ToolId::new("demo.echo.say").unwrap();
        let global = RegistryEvent::Registered {
            tenant: None,
            id: id.clone(),
            version: "1.0.0".parse().unwrap(),
        };
        let own = RegistryEvent::Registered {
            tenant: Some(acme.clone()),
            id,
            version: "1.0.0".parse().unwrap(),
        };
        assert!(event_visible_to(&global, &acme));
        assert!(event_visible_to(&own, &acme));
        assert!(!event_visible_to(&own, &other));
        let wire = event_to_proto(&own, 7);
        assert_eq!(wire.kind, proto::RegistryEventKind::Registered as i32);
        assert_eq!(wire.tenant, "acme");
        assert_eq!(wire.snapshot_version, 7);
    }
}
