//! Model-facing views (R3, seeds 000 §5.3, 002, 003): a skill's tool set, the
//! two-phase protocol's selection and usage documents, and system-prompt sections.
//! Every view reads one [`SkillSet`] and one registry view, so it is consistent,
//! and leaves out disabled skills and tools that are not enabled.

use std::path::PathBuf;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Serialize;
use soulbase_errors::{ErrorCode, SoulError, SoulResult};
use soulbase_tools::registry::AvailableSpec;
use soulbase_tools::{RegistryView, ToolSpec};
use soulbase_types::TenantId;

use crate::model::{SKILL_GROUP, Skill, SkillKind};
use crate::set::{SkillSet, SkillSummary};

/// Whether skill `name` shows to a caller whose governed tool list is `available`:
/// loaded and enabled, and either instructions only or with at least one of its
/// tools in that list. What `list_skills` / `get_skill_info` (MCP) and
/// `GET /api/skills` (HTTP) show.
pub fn skill_shows(set: &SkillSet, available: &[AvailableSpec], name: &str) -> bool {
    let Some(skill) = set.get(name).filter(|_| set.is_enabled(name)) else {
        return false;
    };
    skill.tools.is_empty()
        || skill
            .tools
            .iter()
            .any(|t| available.iter().any(|a| a.id() == t.id()))
}

/// Phase 1 (selection): name + short description of every enabled skill.
pub fn list_skills(set: &SkillSet) -> Arc<[SkillSummary]> {
    set.list_enabled()
}

/// Phase 2 (usage): everything about one skill, with its SKILL.md verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct SkillInfo {
    /// The skill name.
    pub name: String,
    /// Its short description.
    pub description: String,
    /// The usage document: for a package, its SKILL.md byte for byte (seed 002);
    /// for a YAML descriptor, a Markdown document built from its name,
    /// description and parameters — never the raw YAML, whose endpoint and
    /// header templates are deployment details, not instructions for a model.
    pub content: Arc<str>,
    /// The Markdown body after the front matter (packages).
    pub body: Option<Arc<str>>,
    /// The names of its tools.
    pub tools: Vec<String>,
    /// Its `scripts/` and `references/` files, relative to its folder.
    pub resources: Vec<PathBuf>,
}

fn skill_not_found(name: &str) -> SoulError {
    SoulError::new(ErrorCode::ToolNotFound, format!("skill {name} not found"))
        .with_field("skill", name)
}

/// Phase 2 (usage): the full document of an enabled skill; `TOOL.NOT_FOUND` when
/// it is not loaded or disabled.
pub fn get_skill_info(set: &SkillSet, name: &str) -> SoulResult<SkillInfo> {
    let s = set
        .get(name)
        .filter(|_| set.is_enabled(name))
        .ok_or_else(|| skill_not_found(name))?;
    let content = match s.kind {
        SkillKind::Package => s.content.clone(),
        SkillKind::Descriptor => Arc::from(usage_document(s)),
    };
    Ok(SkillInfo {
        name: s.name.clone(),
        description: s.description.clone(),
        content,
        body: s.body.clone(),
        tools: s.tools.iter().map(|t| t.name.clone()).collect(),
        resources: s.resources.clone(),
    })
}

/// The usage document of a descriptor skill: name, description, and each tool's
/// parameters (its input JSON Schema). Nothing of the provider binding.
fn usage_document(s: &Skill) -> String {
    let mut out = format!("# {}\n\n{}\n", s.name, s.description.trim());
    for t in &s.tools {
        let m = &t.compiled.manifest;
        out.push_str(&format!(
            "\n## Tool `{}`\n\n{}\n\n### Parameters\n\n```json\n{}\n```\n",
            t.name,
            m.description.trim(),
            serde_json::to_string_pretty(&m.input_schema).unwrap_or_default()
        ));
    }
    out
}

/// The tools a model working inside `skill` may see, for `tenant`: core tools
/// (enabled tools outside the `skills.` group) ∪ the skill's own enabled tools ∪ the tools
/// it imports that their (enabled) provider exports. Nothing else appears.
/// `TOOL.NOT_FOUND` when the skill is not loaded or disabled.
pub fn tools_for_skill(
    set: &SkillSet,
    registry: &RegistryView,
    tenant: &TenantId,
    skill: &str,
) -> SoulResult<Vec<ToolSpec>> {
    let me = set
        .get(skill)
        .filter(|_| set.is_enabled(skill))
        .ok_or_else(|| skill_not_found(skill))?;
    Ok(registry
        .list_enabled(tenant)
        .into_iter()
        .filter(|r| match set.owner_of(r.id()) {
            // A `skills.` tool without an owner in this set (e.g. mid-reload) is
            // never a core tool.
            None => r.id().group() != SKILL_GROUP,
            Some((owner, _)) if owner.name == me.name => true,
            Some((owner, tool)) => {
                set.is_enabled(&owner.name) && set.imports(me, owner, &tool.name)
            }
        })
        .map(|r| r.tool.spec())
        .collect())
}

/// Every enabled tool of `tenant` whose skill (if any) is enabled: the tool list a
/// model outside any skill sees.
pub fn enabled_tools(set: &SkillSet, registry: &RegistryView, tenant: &TenantId) -> Vec<ToolSpec> {
    registry
        .list_enabled(tenant)
        .into_iter()
        .filter(|r| match set.owner_of(r.id()) {
            None => r.id().group() != SKILL_GROUP,
            Some((s, _)) => set.is_enabled(&s.name),
        })
        .map(|r| r.tool.spec())
        .collect()
}

/// The system-prompt sections (seed 003): `## Available Tools` listing `tools`,
/// `## Skills (Available)` listing the enabled skills and, given a bound on the
/// tool-calling loop, `## Tool Calling Guidelines` stating it. A section with
/// nothing to list is left out; nothing at all gives an empty string.
pub fn system_prompt_sections(
    tools: &[ToolSpec],
    skills: &[SkillSummary],
    max_iterations: Option<u32>,
) -> String {
    let mut out = String::new();
    if !tools.is_empty() {
        out.push_str("## Available Tools\n\nYou have access to the following tools:\n\n");
        for t in tools {
            out.push_str(&format!(
                "- `{}`: {}\n",
                soulbase_tools::NameMap::provider_name(&t.name),
                one_line(&t.description)
            ));
        }
    }
    if !skills.is_empty() {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(
            "## Skills (Available)\n\nYou have access to the following specialized skills:\n\n",
        );
        for s in skills {
            out.push_str(&format!("- `{}`: {}\n", s.name, one_line(&s.description)));
        }
        out.push_str(
            "\nThese skills provide additional capabilities. Use them when relevant to the task: \
             call `get_skill_info` with a skill's name to read its full instructions before \
             `run_skill`.\n",
        );
    }
    if let Some(n) = max_iterations
        && !tools.is_empty()
    {
        out.push_str(&format!(
            "\n## Tool Calling Guidelines\n\n\
             1. Choose the right tool for the task; call only the tools listed above.\n\
             2. Provide accurate parameters, as each tool's schema describes them.\n\
             3. Maximum iterations: {n}. Each round of tool calls counts as one; answer \
             with what you have before the limit.\n"
        ));
    }
    out
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
