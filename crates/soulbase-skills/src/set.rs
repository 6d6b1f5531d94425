//! An immutable, consistent set of loaded skills: what one reload produced.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Serialize;
use soulbase_types::ToolId;

use crate::contracts;
use crate::model::{Date, Skill, SkillTool};
use crate::problem::SkillProblem;

/// What the selection phase shows of a skill: its name and short description.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct SkillSummary {
    /// The skill name.
    pub name: String,
    /// Its short description.
    pub description: String,
}

/// The configuration-dependent checks of [`SkillSet::build`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checks {
    /// The HTTP executor's `${ENV}` allow-list (`sandbox.http_env_allow`): a
    /// header referencing a variable not on it is a warning. `None` skips the
    /// check (a library use without a configuration).
    pub http_env_allow: Option<Vec<String>>,
}

impl Checks {
    /// The checks the configuration asks for: the server's and `soulbase skills
    /// check`'s, from the same configuration.
    pub fn from_config(config: &soulbase_config::Config) -> Self {
        Self {
            http_env_allow: Some(config.sandbox.http_env_allow.clone()),
        }
    }
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
    /// **The validator** every consumer shares: the server's load and reload
    /// ([`crate::SkillCatalog::reload`]) and `soulbase skills check`
    /// ([`crate::check_dir_with`]) both build their set here, so they load the same
    /// skills and report the same problems with the same severities.
    ///
    /// `skills` are the parsed skills in load order (sorted by path), `problems`
    /// the load problems found so far (kept alongside). Then, as of `today`:
    ///
    /// 1. the configuration-dependent checks (`checks`): an `${ENV}` header
    ///    reference not on `sandbox.http_env_allow` is a **warning** — the skill
    ///    loads, every call of it is refused by the HTTP executor
    ///    (`SANDBOX.CAPABILITY_BLOCKED`) until the variable is allowed;
    /// 2. a **name clash** (two files defining one skill, e.g. `zodiac.yaml` beside
    ///    `zodiac/SKILL.md`) is an error on each file, naming both; neither loads
    ///    (the same bytes reached twice, e.g. through a symlink inside the root,
    ///    load once with a warning);
    /// 3. alias imports are resolved and the cross-skill contracts checked; a
    ///    skill with a contract error (an import of an unexported tool, a
    ///    `min_version` its provider does not meet, a cycle, …) is **not loaded**,
    ///    and the check repeats until no loaded skill has an error (a skill
    ///    importing from one refused is refused in turn, saying so).
    ///
    /// A skill in the returned set therefore has no error; warnings never stop
    /// loading.
    pub fn build(
        skills: Vec<Skill>,
        mut problems: Vec<SkillProblem>,
        checks: &Checks,
        disabled: BTreeSet<String>,
        today: Date,
        generation: u64,
    ) -> SkillSet {
        if let Some(allow) = &checks.http_env_allow {
            for s in &skills {
                problems.extend(crate::common::env_not_allowed(s, allow));
            }
        }
        let mut by_name: BTreeMap<String, Vec<Skill>> = BTreeMap::new();
        for s in skills {
            by_name.entry(s.name.clone()).or_default().push(s);
        }
        let mut refused: BTreeSet<String> = BTreeSet::new();
        let mut unique: BTreeMap<String, Skill> = BTreeMap::new();
        for (name, mut defs) in by_name {
            // The same file reached twice (a symlink inside the root) or an
            // identical copy defines one skill: loaded once, from the first path.
            let first_digest = defs.first().map(|s| (s.kind, s.digest.clone()));
            if defs.len() > 1
                && defs
                    .iter()
                    .all(|s| Some((s.kind, s.digest.clone())) == first_digest)
            {
                let files: Vec<String> =
                    defs.iter().map(|s| s.path.display().to_string()).collect();
                let loaded = defs.remove(0);
                problems.push(SkillProblem::warning(
                    &loaded.path,
                    format!(
                        "skill {name} is defined identically by {}; loaded once from {}",
                        files.join(" and "),
                        loaded.path.display()
                    ),
                ));
                unique.insert(name, loaded);
                continue;
            }
            if defs.len() == 1 {
                if let Some(s) = defs.pop() {
                    unique.insert(name, s);
                }
                continue;
            }
            let files: Vec<String> = defs.iter().map(|s| s.path.display().to_string()).collect();
            let msg = format!(
                "skill {name} is defined by both {}; neither is loaded until one is renamed or removed",
                files.join(" and ")
            );
            for s in &defs {
                problems.push(SkillProblem::error(&s.path, msg.clone()).in_field("name"));
            }
            refused.insert(name);
        }
        resolve_alias_imports(&mut unique);
        let mut skills: BTreeMap<String, Arc<Skill>> =
            unique.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
        // Refuse the skills with contract errors until none is left: refusing a
        // provider can fail its importers.
        let contract = loop {
            let found = contracts::check_with_refused(&skills, &refused, today);
            let bad: BTreeSet<String> = skills
                .values()
                .filter(|s| found.iter().any(|p| p.is_error() && p.path == s.path))
                .map(|s| s.name.clone())
                .collect();
            if bad.is_empty() {
                break found;
            }
            let bad_paths: BTreeSet<&std::path::Path> = bad
                .iter()
                .filter_map(|n| skills.get(n))
                .map(|s| s.path.as_path())
                .collect();
            problems.extend(
                found
                    .iter()
                    .filter(|p| bad_paths.contains(p.path.as_path()))
                    .cloned(),
            );
            for n in bad {
                skills.remove(&n);
                refused.insert(n);
            }
        };
        problems.extend(contract);
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
