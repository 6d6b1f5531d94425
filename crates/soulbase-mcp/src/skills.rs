//! Skills over MCP: which tools a session sees, the session's calling skill, and
//! the seed 002 two-phase protocol tools (`list_skills`, `get_skill_info`,
//! `run_skill`).
//!
//! **The calling skill.** A call made "from inside" a skill is checked against
//! that skill's imports (`SKILL.NOT_IMPORTED`), and a skill calling its *own*
//! exported tools is not bound by its own access terms. Claiming to be a skill is
//! therefore a privilege, never taken from a tool call's arguments. A session is
//! bound to a skill by the transport: over stdio by the operator
//! (`soulbased mcp --skill NAME`); over HTTP by the [`SKILL_HEADER`] request
//! header, honoured only when the authenticated subject holds the scope
//! `skill:<name>` (or `skills:*`) — or when the server trusts development
//! identities (`server.dev_insecure`), where identity itself is client-claimed.
//! Otherwise the request is refused with `AUTH.FORBIDDEN`. A session without a
//! binding is a model acting directly: it sees every enabled tool, and the access
//! terms of every skill apply to it.

use std::sync::Arc;

use http::HeaderMap;
use rmcp::model::{Tool, ToolAnnotations};
use serde_json::{Map, Value, json};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_skills::{SkillGateway, SkillSet};
use soulbase_tools::Registry;
use soulbase_tools::registry::AvailableSpec;
use soulbase_types::{Subject, TenantId};

/// The request header binding an HTTP MCP session (or an HTTP invoke) to a skill.
pub const SKILL_HEADER: &str = "x-soulbase-skill";

/// Phase 1 of the skill protocol: name and short description of every skill.
pub const LIST_SKILLS: &str = "list_skills";
/// Phase 2: a skill's full usage document (its SKILL.md, verbatim).
pub const GET_SKILL_INFO: &str = "get_skill_info";
/// Phase 3: run a tool of a skill through the governed pipeline.
pub const RUN_SKILL: &str = "run_skill";

/// The scope granting every skill binding.
pub const ALL_SKILLS_SCOPE: &str = "skills:*";

/// The skill a request is bound to: `None` without [`SKILL_HEADER`]; the named
/// skill when `subject` holds scope `skill:<name>` or [`ALL_SKILLS_SCOPE`], or when
/// `trust_dev` (development identities); `AUTH.FORBIDDEN` otherwise, and
/// `SCHEMA.VALIDATION_FAILED` for a malformed name.
pub fn skill_binding(
    headers: &HeaderMap,
    subject: &Subject,
    trust_dev: bool,
) -> Result<Option<String>, SoulError> {
    let Some(value) = headers.get(SKILL_HEADER) else {
        return Ok(None);
    };
    let name = value
        .to_str()
        .ok()
        .filter(|n| {
            (1..=64).contains(&n.len())
                && n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        })
        .ok_or_else(|| {
            SoulError::new(
                ErrorCode::SchemaValidationFailed,
                "the x-soulbase-skill header is not a skill name",
            )
            .with_field("field", SKILL_HEADER)
        })?;
    authorize_binding(name, subject, trust_dev).map(Some)
}

/// Whether `subject` may act as skill `name` (a claim made by a client, e.g. the
/// gRPC `InvokeRequest.calling_skill`): scope `skill:<name>` or
/// [`ALL_SKILLS_SCOPE`], or `trust_dev`; `AUTH.FORBIDDEN` otherwise.
pub fn authorize_binding(
    name: &str,
    subject: &Subject,
    trust_dev: bool,
) -> Result<String, SoulError> {
    let scoped = subject.scopes.contains(ALL_SKILLS_SCOPE)
        || subject.scopes.contains(&format!("skill:{name}"));
    if scoped || trust_dev {
        Ok(name.to_owned())
    } else {
        Err(SoulError::new(
            ErrorCode::AuthForbidden,
            format!("acting as skill {name} needs the scope skill:{name}"),
        )
        .with_field("skill", name.to_owned()))
    }
}

/// Whether `spec` appears to a session bound to `calling` (or to none): tools
/// outside the `skills.` group always; a skill tool when its skill is loaded and
/// enabled and — for a bound session — it is the session's own skill or an
/// authorized import of it. A `skills.` tool no loaded skill owns never appears.
fn visible(set: &SkillSet, calling: Option<&str>, spec: &AvailableSpec) -> bool {
    match set.owner_of(spec.id()) {
        None => spec.id().group() != "skills",
        Some((owner, tool)) => {
            set.is_enabled(&owner.name)
                && match calling {
                    None => true,
                    Some(me) if me == owner.name => true,
                    Some(me) => set
                        .get(me)
                        .is_some_and(|caller| set.imports(caller, owner, &tool.name)),
                }
        }
    }
}

/// `TOOL.NOT_FOUND` for a skill that is not loaded or is disabled.
fn skill_not_found(name: &str) -> SoulError {
    SoulError::new(ErrorCode::ToolNotFound, format!("skill {name} not found"))
        .with_field("skill", name.to_owned())
}

/// The MCP tools of a session: the tenant's available tools filtered by the skill
/// set (and the binding), plus the protocol tools; `TOOL.NOT_FOUND` when the
/// session is bound to a skill that is not loaded or is disabled.
pub fn session_tools(
    registry: &Registry,
    gateway: &SkillGateway,
    tenant: &TenantId,
    calling: Option<&str>,
) -> Result<Vec<Tool>, SoulError> {
    let set = gateway.catalog().current();
    if let Some(me) = calling
        && (set.get(me).is_none() || !set.is_enabled(me))
    {
        return Err(skill_not_found(me));
    }
    let mut tools: Vec<Tool> = registry
        .available_specs(tenant)
        .iter()
        .filter(|s| visible(&set, calling, s))
        .map(|s| crate::tools::to_mcp_tool(&s.tool))
        .collect();
    tools.extend(protocol_tools());
    Ok(tools)
}

/// Whether a tool id is visible to `tenant` in `registry` (enabled and allowed).
fn skill_visible_to(registry: &Registry, tenant: &TenantId, set: &SkillSet, name: &str) -> bool {
    let Some(skill) = set.get(name).filter(|_| set.is_enabled(name)) else {
        return false;
    };
    if skill.tools.is_empty() {
        return true; // instructions only
    }
    let available = registry.available_specs(tenant);
    skill
        .tools
        .iter()
        .any(|t| available.iter().any(|a| a.id() == t.id()))
}

fn schema(v: Value) -> Arc<Map<String, Value>> {
    Arc::new(v.as_object().cloned().unwrap_or_default())
}

/// The three protocol tools as MCP tools.
pub fn protocol_tools() -> Vec<Tool> {
    let read_only = ToolAnnotations::new()
        .read_only(true)
        .destructive(false)
        .idempotent(true)
        .open_world(false);
    vec![
        Tool::new(
            GET_SKILL_INFO,
            "Phase 2 of the skill protocol: the full instructions (SKILL.md) of one skill. \
             Read them before run_skill.",
            schema(json!({
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string", "description": "The skill name from list_skills"}},
                "additionalProperties": false
            })),
        )
        .with_raw_output_schema(schema(json!({
            "type": "object",
            "required": ["name", "description", "content", "tools"],
            "properties": {
                "name": {"type": "string"},
                "description": {"type": "string"},
                "content": {"type": "string"},
                "body": {"type": ["string", "null"]},
                "tools": {"type": "array", "items": {"type": "string"}},
                "resources": {"type": "array", "items": {"type": "string"}}
            }
        })))
        .with_annotations(read_only.clone()),
        Tool::new(
            LIST_SKILLS,
            "Phase 1 of the skill protocol: the available skills, name and short description.",
            schema(json!({"type": "object", "properties": {}, "additionalProperties": false})),
        )
        .with_raw_output_schema(schema(json!({
            "type": "object",
            "required": ["skills"],
            "properties": {"skills": {"type": "array", "items": {
                "type": "object",
                "required": ["name", "description"],
                "properties": {"name": {"type": "string"}, "description": {"type": "string"}}
            }}}
        })))
        .with_annotations(read_only),
        Tool::new(
            RUN_SKILL,
            "Phase 3 of the skill protocol: run a tool of a skill (its only tool when `tool` \
             is omitted) with `arguments`, through the governed pipeline.",
            schema(json!({
                "type": "object",
                "required": ["skill"],
                "properties": {
                    "skill": {"type": "string"},
                    "tool": {"type": "string"},
                    "arguments": {"type": "object"}
                },
                "additionalProperties": false
            })),
        )
        .with_annotations(
            ToolAnnotations::new()
                .read_only(false)
                .destructive(true)
                .idempotent(false)
                .open_world(true),
        ),
    ]
}

/// `list_skills` for `tenant`: every enabled skill whose tools it can see.
pub fn list_skills(registry: &Registry, gateway: &SkillGateway, tenant: &TenantId) -> Value {
    let set = gateway.catalog().current();
    let skills: Vec<Value> = soulbase_skills::list_skills(&set)
        .iter()
        .filter(|s| skill_visible_to(registry, tenant, &set, &s.name))
        .map(|s| json!({"name": s.name, "description": s.description}))
        .collect();
    json!({ "skills": skills })
}

/// `get_skill_info` for `tenant`: the skill's usage document, `TOOL.NOT_FOUND`
/// when it is not loaded, disabled, or none of its tools is visible to the tenant.
pub fn get_skill_info(
    registry: &Registry,
    gateway: &SkillGateway,
    tenant: &TenantId,
    args: &Map<String, Value>,
) -> Result<(Value, String), SoulError> {
    let name = string_arg(args, "name")?.ok_or_else(|| missing("name"))?;
    let set = gateway.catalog().current();
    if !skill_visible_to(registry, tenant, &set, &name) {
        return Err(skill_not_found(&name));
    }
    let info = soulbase_skills::get_skill_info(&set, &name)?;
    let text = info.content.to_string();
    let value = serde_json::to_value(&info).map_err(SoulError::internal)?;
    Ok((value, text))
}

/// The arguments of `run_skill`: (skill, tool, arguments).
pub fn run_skill_args(
    args: &Map<String, Value>,
) -> Result<(String, Option<String>, Value), SoulError> {
    for k in args.keys() {
        if !matches!(k.as_str(), "skill" | "tool" | "arguments") {
            return Err(SoulError::new(
                ErrorCode::SchemaValidationFailed,
                format!("run_skill has no argument {k}"),
            )
            .with_field("field", k.clone()));
        }
    }
    let skill = string_arg(args, "skill")?.ok_or_else(|| missing("skill"))?;
    let tool = string_arg(args, "tool")?;
    let arguments = match args.get("arguments") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => {
            return Err(SoulError::new(
                ErrorCode::SchemaValidationFailed,
                "run_skill arguments must be an object",
            )
            .with_field("field", "arguments"));
        }
    };
    Ok((skill, tool, arguments))
}

fn string_arg(args: &Map<String, Value>, key: &str) -> Result<Option<String>, SoulError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(_) => Err(SoulError::new(
            ErrorCode::SchemaValidationFailed,
            format!("{key} must be a non-empty string"),
        )
        .with_field("field", key.to_owned())),
    }
}

fn missing(key: &str) -> SoulError {
    SoulError::new(
        ErrorCode::SchemaValidationFailed,
        format!("{key} is required"),
    )
    .with_field("field", key.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use soulbase_types::ActorId;

    fn subject(scopes: &[&str]) -> Subject {
        let mut s = Subject::new(TenantId::new("t").unwrap(), ActorId::new("a").unwrap());
        s.scopes = scopes.iter().map(|s| (*s).to_owned()).collect();
        s
    }

    fn headers(skill: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(SKILL_HEADER, skill.parse().unwrap());
        h
    }

    #[test]
    fn a_skill_binding_needs_its_scope() {
        assert_eq!(
            skill_binding(&HeaderMap::new(), &subject(&[]), false).unwrap(),
            None
        );
        let e = skill_binding(&headers("zodiac"), &subject(&[]), false).unwrap_err();
        assert_eq!(e.code(), ErrorCode::AuthForbidden);
        let e = skill_binding(&headers("zodiac"), &subject(&["skill:other"]), false).unwrap_err();
        assert_eq!(e.code(), ErrorCode::AuthForbidden);
        assert_eq!(
            skill_binding(&headers("zodiac"), &subject(&["skill:zodiac"]), false).unwrap(),
            Some("zodiac".to_owned())
        );
        assert_eq!(
            skill_binding(&headers("zodiac"), &subject(&[ALL_SKILLS_SCOPE]), false).unwrap(),
            Some("zodiac".to_owned())
        );
        assert_eq!(
            skill_binding(&headers("zodiac"), &subject(&[]), true).unwrap(),
            Some("zodiac".to_owned())
        );
        for bad in ["Zodiac", "a b", "", "x/y"] {
            let mut h = HeaderMap::new();
            if let Ok(v) = bad.parse() {
                h.insert(SKILL_HEADER, v);
                let e = skill_binding(&h, &subject(&[ALL_SKILLS_SCOPE]), true).unwrap_err();
                assert_eq!(e.code(), ErrorCode::SchemaValidationFailed, "{bad}");
            }
        }
    }

    #[test]
    fn run_skill_arguments_are_checked() {
        let ok = json!({"skill": "zodiac", "tool": "t", "arguments": {"a": 1}});
        let (s, t, a) = run_skill_args(ok.as_object().unwrap()).unwrap();
        assert_eq!(
            (s.as_str(), t.as_deref(), a),
            ("zodiac", Some("t"), json!({"a": 1}))
        );
        let minimal = json!({"skill": "zodiac"});
        let (_, t, a) = run_skill_args(minimal.as_object().unwrap()).unwrap();
        assert_eq!((t, a), (None, json!({})));
        for bad in [
            json!({}),
            json!({"skill": 3}),
            json!({"skill": ""}),
            json!({"skill": "z", "arguments": [1]}),
            json!({"skill": "z", "calling_skill": "zodiac"}),
        ] {
            let e = run_skill_args(bad.as_object().unwrap()).unwrap_err();
            assert_eq!(e.code(), ErrorCode::SchemaValidationFailed, "{bad}");
        }
    }

    #[test]
    fn protocol_tools_have_object_schemas() {
        let tools = protocol_tools();
        let names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
        assert_eq!(names, [GET_SKILL_INFO, LIST_SKILLS, RUN_SKILL]);
        for t in &tools {
            assert_eq!(t.input_schema.get("type"), Some(&json!("object")));
        }
    }
}
