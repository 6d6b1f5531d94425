//! Skills over MCP: the seed 002 two-phase protocol tools (`list_skills`,
//! `get_skill_info`, `run_skill`), served over the caller's governed tool list.
//!
//! Which skill a session acts for (its binding: the operator's `--skill` over
//! stdio, the [`SKILL_HEADER`](soulbase_edge::SKILL_HEADER) claim over HTTP) is
//! decided by the one stack ([`soulbase_edge::binding`]); a session bound to a
//! skill lists that skill's tool set (core ∪ own ∪ authorized imports), a session
//! without one lists every enabled tool its caller may invoke. A skill shows in
//! `list_skills` and `get_skill_info` only when at least one of its tools is in the
//! caller's list (or it has no tools: instructions only).

use std::sync::Arc;

use rmcp::model::{Tool, ToolAnnotations};
use serde_json::{Map, Value, json};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_skills::SkillSet;
use soulbase_tools::registry::AvailableSpec;

/// Phase 1 of the skill protocol: name and short description of every skill.
pub const LIST_SKILLS: &str = "list_skills";
/// Phase 2: a skill's full usage document (its SKILL.md, verbatim).
pub const GET_SKILL_INFO: &str = "get_skill_info";
/// Phase 3: run a tool of a skill through the governed pipeline.
pub const RUN_SKILL: &str = "run_skill";

/// `TOOL.NOT_FOUND` for a skill that is not loaded, is disabled, or shows
/// nothing to the caller.
fn skill_not_found(name: &str) -> SoulError {
    SoulError::new(ErrorCode::ToolNotFound, format!("skill {name} not found"))
        .with_field("skill", name.to_owned())
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

/// `list_skills` for a caller whose governed list is `available`: every enabled
/// skill that shows to it.
pub fn list_skills(set: &SkillSet, available: &[AvailableSpec]) -> Value {
    let skills: Vec<Value> = soulbase_skills::list_skills(set)
        .iter()
        .filter(|s| soulbase_skills::skill_shows(set, available, &s.name))
        .map(|s| json!({"name": s.name, "description": s.description}))
        .collect();
    json!({ "skills": skills })
}

/// `get_skill_info` for a caller whose governed list is `available`: the skill's
/// usage document, `TOOL.NOT_FOUND` when it does not show to the caller.
pub fn get_skill_info(
    set: &SkillSet,
    available: &[AvailableSpec],
    args: &Map<String, Value>,
) -> Result<(Value, String), SoulError> {
    let name = string_arg(args, "name")?.ok_or_else(|| missing("name"))?;
    if !soulbase_skills::skill_shows(set, available, &name) {
        return Err(skill_not_found(&name));
    }
    let info = soulbase_skills::get_skill_info(set, &name)?;
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
