//! Cross-skill contracts (R13, seed 000 §5.1), checked statically at start-up, on
//! every reload and by `soulbase skills check`:
//!
//! - the provider of every import exists;
//! - imports ⊆ exports (a tool the provider has but does not export is named so);
//! - the provider's `exports.api_version` has the import's `min_version` major and
//!   is ≥ it ([`version_compatible`]);
//! - no import cycles (each reported as a real closed import path, `a → b → a`);
//!   a skill failing any of these checks is not loaded ([`crate::SkillSet::build`]);
//! - every exported tool has input and output schemas (enforced when parsing);
//! - every deprecation states `since`, its window (`since` → `removal_date`) is at
//!   least [`MIN_DEPRECATION_DAYS`] days, and a
//!   deprecated tool is not removed before its removal date;
//! - tool names are unique within a skill (when parsing) and, as they are
//!   namespaced `skills.<skill>.<tool>`, across skills; the same exported short
//!   name in two skills is a warning;
//! - `free_tools` and `rate_limit` name exported tools.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::model::{ApiVersion, Date, Skill};
use crate::problem::SkillProblem;

/// The shortest allowed deprecation window (seed 000 §3.2).
pub const MIN_DEPRECATION_DAYS: i64 = 30;

/// Whether a provider exporting `api_version` satisfies an import's
/// `min_version`: the same major version (a new major is a breaking change,
/// seed 000) and at least the minor asked for.
pub fn version_compatible(min: ApiVersion, api_version: ApiVersion) -> bool {
    api_version.major == min.major && api_version >= min
}

/// The (caller, provider) imports that fail the contract checks and therefore
/// authorize nothing at runtime: a `min_version` the provider does not satisfy
/// (or a provider with no `api_version`), and imports between skills of one
/// import cycle.
pub fn blocked_imports(skills: &BTreeMap<String, Arc<Skill>>) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for s in skills.values() {
        for imp in &s.imports {
            let Some(p) = skills.get(&imp.from) else {
                continue;
            };
            if let Some(min) = imp.min_version
                && !p
                    .exports
                    .api_version
                    .is_some_and(|v| version_compatible(min, v))
            {
                out.insert((s.name.clone(), p.name.clone()));
            }
        }
    }
    for members in cyclic_groups(skills) {
        for m in &members {
            if let Some(s) = skills.get(m) {
                for imp in &s.imports {
                    if members.contains(&imp.from) {
                        out.insert((m.clone(), imp.from.clone()));
                    }
                }
            }
        }
    }
    out
}

/// Checks the contracts between `skills` (by name) as of `today`.
pub fn check(skills: &BTreeMap<String, Arc<Skill>>, today: Date) -> Vec<SkillProblem> {
    check_with_refused(skills, &BTreeSet::new(), today)
}

/// [`check`], where `refused` names skills whose files exist but were refused
/// (an import from one says so rather than "does not exist").
pub fn check_with_refused(
    skills: &BTreeMap<String, Arc<Skill>>,
    refused: &BTreeSet<String>,
    today: Date,
) -> Vec<SkillProblem> {
    let mut out = Vec::new();
    for s in skills.values() {
        check_imports(s, skills, refused, today, &mut out);
        check_exports(s, today, &mut out);
    }
    check_shared_names(skills, &mut out);
    for cycle in cycles(skills) {
        let first = &cycle[0];
        let path = skills
            .get(first)
            .map(|s| s.path.clone())
            .unwrap_or_default();
        let mut chain = cycle.clone();
        chain.push(first.clone());
        out.push(
            SkillProblem::error(path, format!("import cycle: {}", chain.join(" → ")))
                .in_field("imports"),
        );
    }
    out
}

fn check_imports(
    s: &Skill,
    skills: &BTreeMap<String, Arc<Skill>>,
    refused: &BTreeSet<String>,
    today: Date,
    out: &mut Vec<SkillProblem>,
) {
    for (i, imp) in s.imports.iter().enumerate() {
        let field = if imp.via_alias {
            "external_tools".to_owned()
        } else {
            format!("imports[{i}]")
        };
        if imp.from.is_empty() {
            // An unresolved `external_tools` entry: no single exporter was found.
            out.push(
                SkillProblem::error(
                    &s.path,
                    format!(
                        "no single skill exports {}; name it as <skill>.<tool>",
                        imp.tools.join(", ")
                    ),
                )
                .in_field(field),
            );
            continue;
        }
        let Some(p) = skills.get(&imp.from) else {
            let why = if refused.contains(&imp.from) {
                format!(
                    "imports from skill {}, which is not loaded (its file has errors)",
                    imp.from
                )
            } else {
                format!("imports from skill {}, which does not exist", imp.from)
            };
            out.push(SkillProblem::error(&s.path, why).in_field(format!("{field}.from")));
            continue;
        };
        for t in &imp.tools {
            if !p.exports.tools.contains(t) {
                let why = if p.tool(t).is_some() {
                    format!(
                        "imports {t} from {}, which has it but does not export it",
                        p.name
                    )
                } else {
                    format!("imports {t} from {}, which does not export it", p.name)
                };
                out.push(SkillProblem::error(&s.path, why).in_field(format!("{field}.tools")));
            } else if let Some(d) = p.exports.deprecated.iter().find(|d| &d.tool == t) {
                let when = if today >= d.removal_date {
                    "was due for removal on"
                } else {
                    "will be removed on"
                };
                let instead = d
                    .replacement
                    .as_deref()
                    .map(|r| format!("; use {r} instead"))
                    .unwrap_or_default();
                out.push(
                    SkillProblem::warning(
                        &s.path,
                        format!(
                            "imports {t} from {}, which is deprecated and {when} {}{instead}",
                            p.name, d.removal_date
                        ),
                    )
                    .in_field(format!("{field}.tools")),
                );
            }
        }
        if let Some(min) = imp.min_version {
            match p.exports.api_version {
                Some(v) if version_compatible(min, v) => {}
                Some(v) => out.push(
                    SkillProblem::error(
                        &s.path,
                        format!(
                            "requires {} api_version ≥ {min}, but it exports {v} (the major version must be {})",
                            p.name, min.major
                        ),
                    )
                    .in_field(format!("{field}.min_version")),
                ),
                None => out.push(
                    SkillProblem::error(
                        &s.path,
                        format!("requires {} api_version ≥ {min}, but it declares no exports.api_version", p.name),
                    )
                    .in_field(format!("{field}.min_version")),
                ),
            }
        }
    }
}

fn check_exports(s: &Skill, today: Date, out: &mut Vec<SkillProblem>) {
    if !s.exports.tools.is_empty() && s.exports.api_version.is_none() {
        out.push(
            SkillProblem::warning(
                &s.path,
                "exports tools without an api_version; importers cannot pin a min_version",
            )
            .in_field("exports.api_version"),
        );
    }
    for t in &s.exports.access.free_tools {
        if !s.exports.tools.contains(t) {
            out.push(
                SkillProblem::error(&s.path, format!("names {t}, which is not exported"))
                    .in_field("exports.access.free_tools"),
            );
        }
    }
    for (t, _) in &s.exports.access.rate_limit {
        if !s.exports.tools.contains(t) {
            out.push(
                SkillProblem::error(&s.path, format!("names {t}, which is not exported"))
                    .in_field(format!("exports.access.rate_limit.{t}")),
            );
        }
    }
    for (i, d) in s.exports.deprecated.iter().enumerate() {
        let field = format!("exports.deprecated[{i}]");
        match d.since {
            Some(since) => {
                let window = since.days_until(d.removal_date);
                if window < MIN_DEPRECATION_DAYS {
                    out.push(
                        SkillProblem::error(
                            &s.path,
                            format!(
                                "{} is deprecated on {since} for removal on {}: {window} days, less than the {MIN_DEPRECATION_DAYS}-day window",
                                d.tool, d.removal_date
                            ),
                        )
                        .in_field(format!("{field}.removal_date")),
                    );
                }
            }
            None => {
                // Without `since` the window could only be measured from today,
                // and a valid file would start failing as time passes.
                out.push(
                    SkillProblem::error(
                        &s.path,
                        format!(
                            "deprecation of {} needs `since` (YYYY-MM-DD), at least {MIN_DEPRECATION_DAYS} days before its removal date {}",
                            d.tool, d.removal_date
                        ),
                    )
                    .in_field(format!("{field}.since")),
                );
            }
        }
        if !s.exports.tools.contains(&d.tool) && today < d.removal_date {
            out.push(
                SkillProblem::error(
                    &s.path,
                    format!(
                        "{} was removed before its announced removal date {}",
                        d.tool, d.removal_date
                    ),
                )
                .in_field(format!("{field}.tool")),
            );
        }
        if let Some(r) = &d.replacement
            && !s.exports.tools.contains(r)
        {
            out.push(
                SkillProblem::warning(&s.path, format!("replacement {r} is not exported"))
                    .in_field(format!("{field}.replacement")),
            );
        }
    }
}

fn check_shared_names(skills: &BTreeMap<String, Arc<Skill>>, out: &mut Vec<SkillProblem>) {
    let mut by_name: BTreeMap<&str, Vec<&Skill>> = BTreeMap::new();
    for s in skills.values() {
        for t in &s.exports.tools {
            by_name.entry(t.as_str()).or_default().push(s);
        }
    }
    for (name, owners) in by_name {
        if owners.len() > 1 {
            let list: Vec<String> = owners
                .iter()
                .map(|s| format!("skills.{}.{name}", s.name))
                .collect();
            for s in owners {
                out.push(
                    SkillProblem::warning(
                        &s.path,
                        format!("exported tool name {name} is also exported elsewhere; namespaced as {}", list.join(", ")),
                    )
                    .in_field("exports.tools"),
                );
            }
        }
    }
}

/// The import graph: skill names (sorted) and, per skill, the indices of the
/// existing skills it imports from.
fn graph(skills: &BTreeMap<String, Arc<Skill>>) -> (Vec<&String>, Vec<Vec<usize>>) {
    let names: Vec<&String> = skills.keys().collect();
    let index: BTreeMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let edges: Vec<Vec<usize>> = names
        .iter()
        .map(|n| {
            let mut e: BTreeSet<usize> = BTreeSet::new();
            if let Some(s) = skills.get(*n) {
                for imp in &s.imports {
                    if let Some(&j) = index.get(imp.from.as_str()) {
                        e.insert(j);
                    }
                }
            }
            e.into_iter().collect()
        })
        .collect();
    (names, edges)
}

/// The cyclic strongly connected components (more than one skill, or a skill
/// importing itself), as sets of node indices.
fn cyclic_components(edges: &[Vec<usize>]) -> Vec<BTreeSet<usize>> {
    let mut t = Tarjan {
        edges,
        index: vec![None; edges.len()],
        low: vec![0; edges.len()],
        on_stack: vec![false; edges.len()],
        stack: Vec::new(),
        next: 0,
        sccs: Vec::new(),
    };
    for v in 0..edges.len() {
        if t.index[v].is_none() {
            t.visit(v);
        }
    }
    t.sccs
        .into_iter()
        .filter(|scc| scc.len() > 1 || edges[scc[0]].contains(&scc[0]))
        .map(|scc| scc.into_iter().collect())
        .collect()
}

/// The skills of each import cycle (each strongly connected component with more
/// than one skill, or a skill importing itself), by name.
pub fn cyclic_groups(skills: &BTreeMap<String, Arc<Skill>>) -> Vec<BTreeSet<String>> {
    let (names, edges) = graph(skills);
    cyclic_components(&edges)
        .into_iter()
        .map(|c| c.into_iter().map(|i| names[i].clone()).collect())
        .collect()
}

/// The import cycles: for each cyclic component, a shortest closed import path
/// from its least name back to it (`[a, b]` means `a → b → a`; every step is a
/// real import).
pub fn cycles(skills: &BTreeMap<String, Arc<Skill>>) -> Vec<Vec<String>> {
    let (names, edges) = graph(skills);
    let mut out = Vec::new();
    for members in cyclic_components(&edges) {
        let Some(&start) = members.iter().next() else {
            continue;
        };
        // Breadth-first from `start` inside the component until a node that
        // imports `start` is reached; its parent chain is the cycle.
        let mut parent: BTreeMap<usize, usize> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut seen = BTreeSet::from([start]);
        let mut last = None;
        while let Some(v) = queue.pop_front() {
            if edges[v].contains(&start) {
                last = Some(v);
                break;
            }
            for &w in &edges[v] {
                if members.contains(&w) && seen.insert(w) {
                    parent.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
        let Some(mut v) = last else {
            continue; // unreachable for a strongly connected component
        };
        let mut path = vec![v];
        while let Some(&p) = parent.get(&v) {
            path.push(p);
            v = p;
        }
        path.reverse();
        out.push(path.into_iter().map(|i| names[i].clone()).collect());
    }
    out.sort();
    out
}

struct Tarjan<'a> {
    edges: &'a [Vec<usize>],
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    next: usize,
    sccs: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    // Recursion depth is bounded by the number of skills in one import chain.
    fn visit(&mut self, v: usize) {
        self.index[v] = Some(self.next);
        self.low[v] = self.next;
        self.next += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for &w in &self.edges[v] {
            match self.index[w] {
                None => {
                    self.visit(w);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on_stack[w] = false;
                scc.push(w);
                if w == v {
                    break;
                }
            }
            self.sccs.push(scc);
        }
    }
}
