//! The live skills catalog: loads the directory into the registry, reloads it, and
//! publishes consistent [`SkillSet`] snapshots.
//!
//! A reload reads every skill file (reusing the previous parse when the bytes are
//! unchanged), keeps a previously good skill when its file turns bad, drops skills
//! whose files are gone, checks the contracts, then applies every tool change to
//! the registry in **one** registry snapshot ([`Registry::load_compiled`]) and
//! publishes the new set. Readers (discovery, invocation) therefore see the old
//! skill set or the new one, never a mix. Reloads are serialized.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use serde::Serialize;
use soulbase_errors::{ErrorCode, SoulError, SoulResult};
use soulbase_tools::registry::UpgradePolicy;
use soulbase_tools::{Registry, ToolOwner, ToolState};
use soulbase_types::ToolId;

use crate::confine::Confinement;
use crate::load::{discover, parse_candidate, read_candidate};
use crate::model::{Date, Skill};
use crate::problem::SkillProblem;
use crate::set::{Checks, SkillSet};

/// How a catalog finds and registers its skills.
#[derive(Debug, Clone)]
pub struct CatalogOptions {
    /// The skills directory; every skill file must resolve inside it.
    pub root: PathBuf,
    /// Who owns the registered tools (global by default).
    pub owner: ToolOwner,
    /// Whether new skill tools start enabled (default) or merely registered.
    pub enable_new: bool,
    /// The configuration-dependent checks of the one validator
    /// ([`SkillSet::build`]); none by default.
    pub checks: Checks,
}

impl CatalogOptions {
    /// Skills from `root`, confined to it, registered globally and enabled.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            owner: ToolOwner::Global,
            enable_new: true,
            checks: Checks::default(),
        }
    }

    /// Everything the configuration says about loading skills: `skills.dir` and
    /// the checks that depend on other sections (`sandbox.http_env_allow`). The
    /// server and `soulbase skills check` both start here, so they validate alike.
    pub fn for_config(config: &soulbase_config::Config) -> Self {
        Self {
            checks: Checks::from_config(config),
            ..Self::from_config(&config.skills)
        }
    }

    /// From the configuration's `skills` section: its `dir` (wherever it is; the
    /// working directory plays no part), registered globally and enabled.
    pub fn from_config(config: &soulbase_config::SkillsConfig) -> Self {
        Self::new(&config.dir)
    }

    /// Checks `${ENV}` header references against the HTTP executor's allow-list
    /// (`sandbox.http_env_allow`) at load: one not on it is a warning.
    pub fn http_env_allow(mut self, allow: Vec<String>) -> Self {
        self.checks.http_env_allow = Some(allow);
        self
    }
}

/// What one reload did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReloadReport {
    /// The generation of the set it published.
    pub generation: u64,
    /// Skills that appeared.
    pub added: Vec<String>,
    /// Skills whose definition changed.
    pub updated: Vec<String>,
    /// Skills that disappeared.
    pub removed: Vec<String>,
    /// Files that turned bad while an earlier good version stays in force.
    pub kept_previous: Vec<PathBuf>,
    /// Every load and contract problem of the new set.
    pub problems: Vec<SkillProblem>,
}

impl ReloadReport {
    /// Whether anything changed.
    pub fn changed(&self) -> bool {
        !(self.added.is_empty() && self.updated.is_empty() && self.removed.is_empty())
    }

    /// The errors only.
    pub fn errors(&self) -> impl Iterator<Item = &SkillProblem> {
        self.problems.iter().filter(|p| p.is_error())
    }
}

#[derive(Default)]
struct FileState {
    digest: String,
    /// Problems of the last parse of these bytes.
    problems: Vec<SkillProblem>,
    /// The last good parse of this file (possibly of older bytes).
    good: Option<Skill>,
}

#[derive(Default)]
struct ReloadState {
    files: BTreeMap<PathBuf, FileState>,
    generation: u64,
}

struct Inner {
    options: CatalogOptions,
    registry: Registry,
    current: ArcSwap<SkillSet>,
    state: Mutex<ReloadState>,
    disabled: Mutex<BTreeSet<String>>,
    /// Counts finished reloads (changed or not): a file beside the skills (a
    /// package's `references/`) may have changed without changing the set.
    reloads: tokio::sync::watch::Sender<u64>,
}

/// The live catalog. Cheap to clone; clones share it.
#[derive(Clone)]
pub struct SkillCatalog {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SkillCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SkillCatalog")
            .field("root", &self.inner.options.root)
            .field("skills", &self.inner.current.load().len())
            .finish()
    }
}

impl SkillCatalog {
    /// Opens the catalog and loads everything once. Fails only when the directory
    /// itself is unusable (missing, not a directory); bad files
    /// are reported in the returned report and skipped.
    pub fn open(registry: Registry, options: CatalogOptions) -> SoulResult<(Self, ReloadReport)> {
        Confinement::new(&options.root).map_err(|why| {
            SoulError::new(ErrorCode::ConfigInvalid, why)
                .with_field("path", options.root.display().to_string())
        })?;
        let catalog = Self {
            inner: Arc::new(Inner {
                options,
                registry,
                current: ArcSwap::from_pointee(SkillSet::default()),
                state: Mutex::new(ReloadState::default()),
                disabled: Mutex::new(BTreeSet::new()),
                reloads: tokio::sync::watch::Sender::new(0),
            }),
        };
        let report = catalog.reload();
        Ok((catalog, report))
    }

    /// The registry the catalog registers into.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// The skills directory.
    pub fn root(&self) -> &Path {
        &self.inner.options.root
    }

    /// The current skill set (lock-free).
    pub fn current(&self) -> Arc<SkillSet> {
        self.inner.current.load_full()
    }

    /// A receiver marked changed after every reload, whether or not the set
    /// changed (each file event, poll, SIGHUP or explicit reload): what followers
    /// of the files' contents (MCP resource subscriptions) re-check on.
    pub fn reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.reloads.subscribe()
    }

    /// Re-reads the directory and applies the differences. Never fails: problems
    /// (including an unusable directory, which keeps the current set) are in the
    /// report.
    pub fn reload(&self) -> ReloadReport {
        let report = self.reload_locked();
        self.inner.reloads.send_modify(|n| *n += 1);
        report
    }

    fn reload_locked(&self) -> ReloadReport {
        let mut state = self
            .inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let opts = &self.inner.options;
        let mut report = ReloadReport::default();
        let confine = match Confinement::new(&opts.root) {
            Ok(c) => c,
            Err(why) => {
                tracing::error!(dir = %opts.root.display(), "skills directory unusable: {why}; keeping the loaded skills");
                report.generation = state.generation;
                report.problems.push(SkillProblem::error(&opts.root, why));
                return report;
            }
        };
        let candidates = match discover(confine.given_root()) {
            Ok(c) => c,
            Err(p) => {
                report.generation = state.generation;
                report.problems.push(p);
                return report;
            }
        };

        let mut problems = Vec::new();
        let mut skills = Vec::new();
        let mut seen = HashSet::new();
        for c in &candidates {
            seen.insert(c.path.clone());
            let entry = state.files.entry(c.path.clone()).or_default();
            match read_candidate(c, &confine) {
                Ok(bytes) => {
                    // The key covers the file and the files it references (WASM
                    // modules: size and modification time), so editing a module
                    // re-parses the skill and refreshes its digest.
                    let digest = cache_key(&bytes, entry.good.as_ref(), &confine);
                    if digest != entry.digest {
                        let parsed = parse_candidate(c, &bytes, &confine);
                        entry.problems = parsed.problems;
                        if let Some(s) = parsed.skill {
                            entry.good = Some(s);
                        } else if entry.good.is_some() {
                            report.kept_previous.push(c.path.clone());
                        }
                        // Keyed by what this parse references.
                        entry.digest = cache_key(&bytes, entry.good.as_ref(), &confine);
                    } else if entry.problems.iter().any(SkillProblem::is_error)
                        && entry.good.is_some()
                    {
                        report.kept_previous.push(c.path.clone());
                    }
                }
                Err(p) => {
                    entry.digest.clear();
                    entry.problems = vec![p];
                    if entry.good.is_some() {
                        report.kept_previous.push(c.path.clone());
                    }
                }
            }
            problems.extend(entry.problems.iter().cloned());
            if let Some(good) = &entry.good {
                skills.push(good.clone());
            }
        }
        for p in &report.kept_previous {
            let msg = "is invalid; the previously loaded version stays in force until it is fixed";
            tracing::warn!(file = %p.display(), "{msg}");
            problems.push(SkillProblem::warning(p, msg));
        }
        state.files.retain(|p, _| seen.contains(p));

        let disabled = self
            .inner
            .disabled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let generation = state.generation + 1;
        let next = SkillSet::build(
            skills,
            problems,
            &opts.checks,
            disabled,
            Date::today(),
            generation,
        );
        // Each refused file, with why (path, line, field, reason).
        for p in next.problems().iter().filter(|p| p.is_error()) {
            tracing::warn!("{p}");
        }
        let prev = self.current();

        // Skill-level diff for the report.
        for s in next.skills() {
            match prev.get(&s.name) {
                None => report.added.push(s.name.clone()),
                Some(old)
                    if old.digest != s.digest
                        || old.path != s.path
                        || old
                            .tools
                            .iter()
                            .map(|t| &t.compiled.manifest.provider)
                            .ne(s.tools.iter().map(|t| &t.compiled.manifest.provider)) =>
                {
                    report.updated.push(s.name.clone())
                }
                Some(_) => {}
            }
        }
        for s in prev.skills() {
            if next.get(&s.name).is_none() {
                report.removed.push(s.name.clone());
            }
        }

        // Tool-level changes, applied to the registry in one snapshot.
        let new_ids: HashSet<&ToolId> = next.tool_ids().collect();
        let mut removals: Vec<ToolId> = prev
            .tool_ids()
            .filter(|id| !new_ids.contains(id))
            .cloned()
            .collect();
        if prev.generation() == 0 {
            // First load (open): `skills.*` tools of this owner that no file on
            // disk provides (e.g. restored from a persisted registry) go.
            let filter = soulbase_tools::ToolFilter {
                group: Some(crate::model::SKILL_GROUP.to_owned()),
                ..Default::default()
            };
            for r in self.inner.registry.view().list_owned(&opts.owner, &filter) {
                if r.id().group() == crate::model::SKILL_GROUP
                    && !new_ids.contains(r.id())
                    && !removals.contains(r.id())
                {
                    removals.push(r.id().clone());
                }
            }
        }
        let tools: Vec<_> = next
            .skills()
            .flat_map(|s| {
                let enable = opts.enable_new && next.is_enabled(&s.name);
                s.tools.iter().map(move |t| (t.compiled.clone(), enable))
            })
            .collect();
        let applied =
            self.inner
                .registry
                .load_compiled(&opts.owner, tools, removals, UpgradePolicy::Replace);
        for f in applied.failed {
            report.problems.push(SkillProblem::error(
                &opts.root,
                format!("the registry refused {:?}: {}", f.id, f.error),
            ));
        }
        // Order: the registry snapshot first, then the set. In between, a tool
        // the new registry has but the old set does not own is a `skills.` tool
        // without an owner, which every view hides and the gateway refuses
        // (`TOOL.NOT_FOUND`); a tool the old set owns but the registry dropped is
        // refused by the invoker. Neither direction fails open.
        state.generation = generation;
        report.generation = generation;
        report.problems.extend(next.problems().iter().cloned());
        self.inner.current.store(Arc::new(next));
        if report.changed() {
            tracing::info!(
                added = ?report.added,
                updated = ?report.updated,
                removed = ?report.removed,
                generation,
                "skills reloaded"
            );
        }
        report
    }

    /// [`reload`](Self::reload) on Tokio's blocking pool: for async callers (an
    /// HTTP handler, a signal task), so file IO and the wait for a concurrent
    /// reload never stall an async worker.
    pub async fn reload_async(&self) -> SoulResult<ReloadReport> {
        let c = self.clone();
        tokio::task::spawn_blocking(move || c.reload())
            .await
            .map_err(SoulError::internal)
    }

    /// [`set_enabled`](Self::set_enabled) on Tokio's blocking pool: it waits for
    /// any reload in progress, which must not stall an async worker. Use this from
    /// async code (e.g. `PATCH /api/skills/{name}`).
    pub async fn set_enabled_async(&self, name: &str, enabled: bool) -> SoulResult<()> {
        let (c, name) = (self.clone(), name.to_owned());
        tokio::task::spawn_blocking(move || c.set_enabled(&name, enabled))
            .await
            .map_err(SoulError::internal)?
    }

    /// Enables or disables a skill (seed 003 `PATCH /api/skills/{name}`): its tools
    /// are enabled or paused in the registry and it leaves (or rejoins) every view
    /// from the next request on. The choice survives reloads. `TOOL.NOT_FOUND` if
    /// no such skill is loaded.
    ///
    /// Synchronous: it waits for a reload in progress (reloads read the whole
    /// directory). From async code call [`set_enabled_async`](Self::set_enabled_async)
    /// (or wrap this in `tokio::task::spawn_blocking`).
    pub fn set_enabled(&self, name: &str, enabled: bool) -> SoulResult<()> {
        // Serialize with reloads so the published set and registry states agree.
        let mut state = self
            .inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let current = self.current();
        let Some(skill) = current.get(name).cloned() else {
            return Err(SoulError::new(
                ErrorCode::ToolNotFound,
                format!("skill {name} is not loaded"),
            )
            .with_field("skill", name));
        };
        let disabled = {
            let mut d = self
                .inner
                .disabled
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if enabled {
                d.remove(name);
            } else {
                d.insert(name.to_owned());
            }
            d.clone()
        };
        let owner = &self.inner.options.owner;
        let view = self.inner.registry.view();
        for t in &skill.tools {
            let st = view
                .list_owned(owner, &Default::default())
                .into_iter()
                .find(|r| r.id() == t.id())
                .map(|r| r.state);
            let res = match (enabled, st) {
                (true, Some(ToolState::Registered | ToolState::Paused)) => {
                    self.inner.registry.enable(owner, t.id())
                }
                (false, Some(ToolState::Enabled)) => self.inner.registry.pause(owner, t.id()),
                _ => Ok(()),
            };
            res?;
        }
        state.generation += 1;
        let next = current.with_disabled(disabled, state.generation);
        self.inner.current.store(Arc::new(next));
        Ok(())
    }
}

/// The reload cache key of a skill file: its bytes plus the size and
/// modification time of every WASM module its last good parse references.
fn cache_key(bytes: &[u8], good: Option<&Skill>, confine: &Confinement) -> String {
    let mut key = bytes.to_vec();
    if let Some(s) = good {
        for t in &s.tools {
            if let soulbase_sandbox::ProviderBinding::Wasm { module, .. } =
                &t.compiled.manifest.provider
            {
                key.extend_from_slice(b"\0module\0");
                key.extend_from_slice(module.as_bytes());
                match std::fs::symlink_metadata(confine.root().join(module)) {
                    Ok(m) => {
                        let mtime = m
                            .modified()
                            .ok()
                            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                            .map_or(0, |d| d.as_nanos());
                        key.extend_from_slice(&m.len().to_le_bytes());
                        key.extend_from_slice(&mtime.to_le_bytes());
                    }
                    Err(_) => key.extend_from_slice(b"missing"),
                }
            }
        }
    }
    crate::common::sha256_hex(&key)
}

/// Loads `root` without a registry and without configuration-dependent checks:
/// the skill set with every load and contract problem. `Err` when the directory
/// itself is unusable.
pub fn check_dir(root: &Path) -> Result<SkillSet, SkillProblem> {
    check_dir_at(root, Date::today())
}

/// [`check_dir`] as of a given date (for deprecation windows).
pub fn check_dir_at(root: &Path, today: Date) -> Result<SkillSet, SkillProblem> {
    check_dir_with(&CatalogOptions::new(root), today)
}

/// What a [`SkillCatalog`] opened with `options` would load, without a registry:
/// `soulbase skills check`. The files are read and parsed as a reload reads them
/// and validated by the same function ([`SkillSet::build`]) with the same
/// `options.checks`, so the check and the server agree on every file: the same
/// skills load, the same problems with the same severities. `Err` when the
/// directory itself is unusable.
pub fn check_dir_with(options: &CatalogOptions, today: Date) -> Result<SkillSet, SkillProblem> {
    let root = options.root.as_path();
    let confine = Confinement::new(root).map_err(|why| SkillProblem::error(root, why))?;
    let outcomes = crate::load::load_all(&confine)?;
    let mut skills = Vec::new();
    let mut problems = Vec::new();
    for o in outcomes {
        problems.extend(o.parsed.problems);
        if let Some(s) = o.parsed.skill {
            skills.push(s);
        }
    }
    Ok(SkillSet::build(
        skills,
        problems,
        &options.checks,
        BTreeSet::new(),
        today,
        1,
    ))
}

/// A started skills subsystem: the catalog, its initial report, and the watcher
/// when `skills.watch` is on (dropping it stops watching).
pub struct RunningSkills {
    /// The live catalog.
    pub catalog: SkillCatalog,
    /// What the initial load found.
    pub report: ReloadReport,
    /// The file watcher, if watching.
    pub watcher: Option<crate::watch::SkillWatcher>,
}

/// Loads the skills directory of `config` into `registry` and, when `config.watch`
/// is set, watches it (events plus polling every `poll_interval_ms`). Errors only
/// when the directory is unusable.
pub fn start(
    registry: Registry,
    config: &soulbase_config::SkillsConfig,
) -> SoulResult<RunningSkills> {
    let (catalog, report) = SkillCatalog::open(registry, CatalogOptions::from_config(config))?;
    let watcher = config.watch.then(|| {
        crate::watch::watch(
            catalog.clone(),
            std::time::Duration::from_millis(config.poll_interval_ms),
        )
    });
    Ok(RunningSkills {
        catalog,
        report,
        watcher,
    })
}
