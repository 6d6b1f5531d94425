//! An immutable, consistent set of loaded skills: what one reload produced.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::Serialize;
use soulbase_types::ToolId;

use crate::contracts;
use crate::model::{Date, Skill, SkillTool};
use crate::problem::SkillProblem;

/// What the selection phase shows of a skill: its name and short description.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkillSummary {
    /// The skill name.
    pub name: String,
    /// Its short description.
    pub description: String,
}

/// A consistent snapshot of the skills directory. Readers hold an `Arc` to one and
/// never see a half-applied reload.
#[derive(Debug, Default)]
pub struct SkillSet {
    skills: BTreeMap<String, Arc<Skill>>,
    tools: HashMap<ToolId, (Arc<Skill>, usize)>,
    disabled: BTreeSet<String>,
    enabled_summaries: Arc<[SkillSummary]>,
    problems: Vec<SkillProblem>,
    /// (caller, provider) imports that fail the contract checks (version, cycle).
    blocked: Arc<BTreeSet<(String, String)>>,
    generation: u64,
}

impl SkillSet {
    /// Builds a set from skills in load order (sorted by path): on a name clash the
    /// later one wins and a warning names both files. Alias imports are resolved,
    /// then the contracts are checked as of `today`. `problems` are the load
    /// problems, kept alongside the contract ones.
    pub fn build(
        skills: Vec<Skill>,
        mut problems: Vec<SkillProblem>,
        disabled: BTreeSet<String>,
        today: Date,
        generation: u64,
    ) -> SkillSet {
        let mut by_name: BTreeMap<String, Skill> = BTreeMap::new();
        for s in skills {
            if let Some(earlier) = by_name.get(&s.name) {
                let msg = format!(
                    "skill {} is defined by both {} and {}; the later one ({}) wins",
                    s.name,
                    earlier.path.display(),
                    s.path.display(),
                    s.path.display()
                );
                tracing::warn!("{msg}");
                problems.push(SkillProblem::warning(&s.path, msg));
            }
            by_name.insert(s.name.clone(), s);
        }
        resolve_alias_imports(&mut by_name);
        let skills: BTreeMap<String, Arc<Skill>> =
            by_name.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
        problems.extend(contracts::check(&skills, today));
        let blocked = Arc::new(contracts::blocked_imports(&skills));
        Self::assemble(skills, disabled, problems, blocked, generation)
    }

    fn assemble(
        skills: BTreeMap<String, Arc<Skill>>,
        disabled: BTreeSet<String>,
        problems: Vec<SkillProblem>,
        blocked: Arc<BTreeSet<(String, String)>>,
        generation: u64,
    ) -> SkillSet {
        let mut tools = HashMap::new();
        for s in skills.values() {
            for (i, t) in s.tools.iter().enumerate() {
                tools.insert(t.id().clone(), (s.clone(), i));
            }
        }
        let enabled_summaries: Arc<[SkillSummary]> = skills
            .values()
            .filter(|s| !disabled.contains(&s.name))
            .map(|s| SkillSummary {
                name: s.name.clone(),
                description: s.description.clone(),
            })
            .collect();
        SkillSet {
            skills,
            tools,
            disabled,
            enabled_summaries,
            problems,
            blocked,
            generation,
        }
    }

    /// The same skills with a different set of disabled skills.
    pub fn with_disabled(&self, disabled: BTreeSet<String>, generation: u64) -> SkillSet {
        Self::assemble(
            self.skills.clone(),
            disabled,
            self.problems.clone(),
            self.blocked.clone(),
            generation,
        )
    }

    /// The skill called `name` (enabled or not).
    pub fn get(&self, name: &str) -> Option<&Arc<Skill>> {
        self.skills.get(name)
    }

    /// Every skill, by name (enabled or not).
    pub fn skills(&self) -> impl Iterator<Item = &Arc<Skill>> {
        self.skills.values()
    }

    /// How many skills are loaded.
    pub fn len(&self) -> usize {
        self.skills.len()
    }

    /// Whether no skill is loaded.
    pub fn is_empty(&self) -> bool {
        self.skills.is_empty()
    }

    /// Whether `name` is loaded and enabled.
    pub fn is_enabled(&self, name: &str) -> bool {
        self.skills.contains_key(name) && !self.disabled.contains(name)
    }

    /// The disabled skill names.
    pub fn disabled(&self) -> &BTreeSet<String> {
        &self.disabled
    }

    /// The selection-phase list: name and short description of every enabled
    /// skill, by name. Precomputed: listing is a reference-count increment.
    pub fn list_enabled(&self) -> Arc<[SkillSummary]> {
        self.enabled_summaries.clone()
    }

    /// The skill providing tool `id`, and the tool.
    pub fn owner_of(&self, id: &ToolId) -> Option<(&Arc<Skill>, &SkillTool)> {
        self.tools
            .get(id)
            .and_then(|(s, i)| s.tools.get(*i).map(|t| (s, t)))
    }

    /// Every tool id provided by a skill of this set.
    pub fn tool_ids(&self) -> impl Iterator<Item = &ToolId> {
        self.tools.keys()
    }

    /// Load and contract problems (errors and warnings).
    pub fn problems(&self) -> &[SkillProblem] {
        &self.problems
    }

    /// Whether any problem is an error.
    pub fn has_errors(&self) -> bool {
        self.problems.iter().any(SkillProblem::is_error)
    }

    /// The reload generation that produced this set (0 = never loaded).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether `caller` may call `tool` of `provider` across skills: it imports
    /// the tool from its provider, the provider exports it, and the import passes
    /// the contract checks (compatible `min_version`, not part of a cycle).
    pub fn imports(&self, caller: &Skill, provider: &Skill, tool: &str) -> bool {
        !self
            .blocked
            .contains(&(caller.name.clone(), provider.name.clone()))
            && provider.exports.tools.iter().any(|t| t == tool)
            && caller
                .imports
                .iter()
                .any(|imp| imp.from == provider.name && imp.tools.iter().any(|t| t == tool))
    }
}

/// `external_tools` entries without a provider name: the unique exporter of the
/// tool becomes the provider; none or several leave it unresolved (reported).
fn resolve_alias_imports(skills: &mut BTreeMap<String, Skill>) {
    let mut exporters: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in skills.values() {
        for t in &s.exports.tools {
            exporters.entry(t.clone()).or_default().push(s.name.clone());
        }
    }
    for s in skills.values_mut() {
        let mut resolved = Vec::new();
        for imp in s
            .imports
            .iter_mut()
            .filter(|i| i.via_alias && i.from.is_empty())
        {
            let mut unresolved = Vec::new();
            for t in imp.tools.drain(..) {
                match exporters.get(&t).map(Vec::as_slice) {
                    Some([only]) => resolved.push((only.clone(), t)),
                    _ => unresolved.push(t),
                }
            }
            imp.tools = unresolved;
        }
        s.imports
            .retain(|i| !(i.via_alias && i.from.is_empty() && i.tools.is_empty()));
        for (from, tool) in resolved {
            match s.imports.iter_mut().find(|i| i.via_alias && i.from == from) {
                Some(i) => i.tools.push(tool),
                None => s.imports.push(crate::model::Import {
                    from,
                    tools: vec![tool],
                    min_version: None,
                    via_alias: true,
                }),
            }
        }
    }
}
