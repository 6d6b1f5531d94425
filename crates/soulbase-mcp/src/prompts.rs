//! Skills as MCP prompts, and completion of the values callers can only guess.
//!
//! Each skill that shows to the caller is a prompt of its name: the usage phase of
//! seed 002 — the full source (`SKILL.md`, verbatim) as the prompt's message, so a
//! model infers arguments from the skill's own examples — with one optional
//! argument, `task`, the user's request, appended as a second message.
//! `completion/complete` offers the caller's skill names for a prompt's name and a
//! skill resource template's `{name}`, and the skill's files for `{path}`.

use rmcp::model::{
    CompletionInfo, GetPromptResult, Prompt, PromptArgument, PromptMessage, Reference, Role,
};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_skills::SkillSet;
use soulbase_tools::registry::AvailableSpec;

use crate::resources::{self, shown};

/// The prompt argument carrying the user's request.
pub const TASK: &str = "task";
/// Most completion values answered.
const MAX_VALUES: usize = 100;

/// `prompts/list`: one prompt per skill that shows, in name order.
pub fn list(set: &SkillSet, available: &[AvailableSpec]) -> Vec<Prompt> {
    shown(set, available)
        .into_iter()
        .map(|s| {
            let mut p = Prompt::new(
                s.name.clone(),
                Some(s.description.clone()),
                Some(vec![
                    PromptArgument::new(TASK)
                        .with_description("What you want done with this skill (optional).")
                        .with_required(false),
                ]),
            );
            p.title = s.title.clone();
            p
        })
        .collect()
}

/// `prompts/get` of skill `name` with `arguments`.
pub fn get(
    set: &SkillSet,
    available: &[AvailableSpec],
    name: &str,
    arguments: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<GetPromptResult, SoulError> {
    let skill = shown(set, available)
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| {
            SoulError::new(ErrorCode::ToolNotFound, "no such prompt").with_field("name", name)
        })?;
    let mut task = None;
    for (k, v) in arguments.into_iter().flatten() {
        match (k.as_str(), v) {
            (TASK, serde_json::Value::String(t)) => task = Some(t.clone()),
            (TASK, _) => {
                return Err(SoulError::new(
                    ErrorCode::SchemaValidationFailed,
                    "the task argument must be a string",
                )
                .with_field("field", TASK));
            }
            _ => {
                return Err(SoulError::new(
                    ErrorCode::SchemaValidationFailed,
                    format!("unknown prompt argument {k:?}: the only one is {TASK:?}"),
                )
                .with_field("field", k.clone()));
            }
        }
    }
    let mut messages = vec![PromptMessage::new_text(
        Role::User,
        skill.content.to_string(),
    )];
    if let Some(t) = task.filter(|t| !t.trim().is_empty()) {
        messages.push(PromptMessage::new_text(Role::User, t));
    }
    Ok(GetPromptResult::new(messages).with_description(skill.description.clone()))
}

/// `completion/complete`: values starting with `value` for argument `argument` of
/// `reference`, given the arguments already resolved (`context`).
pub fn complete(
    set: &SkillSet,
    available: &[AvailableSpec],
    reference: &Reference,
    argument: &str,
    value: &str,
    context: Option<&std::collections::HashMap<String, String>>,
) -> CompletionInfo {
    let names = || shown(set, available).into_iter().map(|s| s.name.clone());
    let values: Vec<String> = match reference {
        Reference::Resource(r) if r.uri.starts_with(resources::SCHEME) => match argument {
            "name" => names().collect(),
            "path" => {
                let skill = context.and_then(|c| c.get("name"));
                shown(set, available)
                    .into_iter()
                    .filter(|s| Some(&s.name) == skill)
                    .flat_map(resources::files)
                    .collect()
            }
            _ => Vec::new(),
        },
        // A prompt's name is completed by clients from prompts/list; its one
        // argument is free text.
        _ => Vec::new(),
    };
    let mut matching: Vec<String> = values
        .into_iter()
        .filter(|v| v.starts_with(value))
        .collect();
    let total = matching.len();
    matching.truncate(MAX_VALUES);
    let has_more = total > matching.len();
    CompletionInfo::with_pagination(matching, Some(total as u32), has_more).unwrap_or_default()
}
