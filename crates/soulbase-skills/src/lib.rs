//! Soulbase skills (R12, R13): skill authors ship capabilities as files that load,
//! reload and unload at runtime, and skills call each other only through declared
//! contracts.
//!
//! **Sources → manifests.** A skills directory holds YAML descriptors
//! ([`descriptor`], seed 001: one file, one tool) and `SKILL.md` packages
//! ([`package`]: front matter + Markdown body, `scripts/`, `references/`, with seed
//! 000's `exports` / `imports`). Each tool becomes a
//! [`soulbase_tools::ToolManifest`] with id `skills.<skill>.<tool>`; `risk_level`
//! maps to side effect, safety class and consent ([`risk`]); provider bindings are
//! `soulbase_sandbox::ProviderBinding`s (builtin, http, wasm, process). YAML is read
//! with serde-saphyr; problems name the file, line and field ([`SkillProblem`]).
//! Files are only ever read.
//!
//! **Loading and hot reload.** [`SkillCatalog`] loads the directory into a
//! [`soulbase_tools::Registry`] and reloads it on demand ([`SkillCatalog::reload`],
//! the API's manual reload), on file events with a polling fallback ([`watch()`]),
//! and on SIGHUP ([`watch::reload_on_sighup`]). A reload applies every tool change
//! in one registry snapshot and publishes an immutable [`SkillSet`], so readers
//! never see a half-loaded set. A bad file is reported and skipped; a previously
//! good skill stays in force until its file is fixed; files resolving outside the
//! skills root (symlinks followed) are refused ([`confine`]) — the root itself may
//! be anywhere, whatever the working directory.
//!
//! **One validator.** The server's load and reload and `soulbase skills check`
//! ([`check_dir_with`], from the same [`CatalogOptions::for_config`]) validate
//! through one function, [`SkillSet::build`], with one set of severities: an
//! error refuses the file (never loaded, the report and the log say why), a
//! warning never does. Errors: anything a parser refuses, a name clash (two files
//! defining one skill: both refused, each problem naming both files), and every
//! contract error. Warnings include an `${ENV}` header reference that is unset or
//! not on `sandbox.http_env_allow` (the HTTP executor refuses those calls).
//!
//! **Contracts.** [`contracts`] checks providers, imports ⊆ exports, api versions,
//! cycles, schemas, deprecation windows and names — at start-up, on every reload,
//! and in `soulbase skills check`; a skill failing them is not loaded (nor, in
//! turn, a skill importing from it). At runtime [`SkillTerms`] are the invoker's `CallTerms`
//! seam, consulted inside the one governed pipeline (so their refusals are evidenced,
//! refunded, traced and preflighted like any other), with the calling skill the
//! surface set from the caller's authorized binding (never a client claim):
//! `SKILL.NOT_IMPORTED`; a provider's access terms —
//! `SUBSCRIPTION.REQUIRED` ([`SubscriptionStore`]) and per-tool rate limits
//! through a QoS `QuotaGate` — on every call of its exported tools by anyone but
//! the provider itself; a [`CrossSkillRecord`] per cross-skill call. A `skills.`
//! tool with no owner in the current set is never treated as a core tool.
//!
//! **Model-facing views** ([`views`]): a skill's tool set (core ∪ own ∪ imports),
//! the two-phase protocol (`list_skills` → `get_skill_info` → `run_skill`), and the
//! system-prompt sections; a disabled skill ([`SkillCatalog::set_enabled`]) leaves
//! them all from the next request on.
//!
//! This is an edge crate: it reads and watches the file system. [`examples`] and
//! [`service`] back the repository's example `skills/` directory.

pub mod access;
pub mod catalog;
mod common;
pub mod confine;
pub mod contracts;
pub mod descriptor;
pub mod examples;
pub mod load;
pub mod model;
pub mod package;
pub mod problem;
pub mod risk;
pub mod service;
pub mod set;
pub mod terms;
pub mod views;
pub mod watch;
pub mod yaml;

pub use access::{
    CrossSkillAudit, CrossSkillRecord, MemoryAudit, StaticSubscriptions, SubscriptionStore,
    TracingAudit,
};
pub use catalog::{
    CatalogOptions, ReloadReport, RunningSkills, SkillCatalog, check_dir, check_dir_at,
    check_dir_with, start,
};
pub use model::{RiskLevel, Skill, SkillKind, SkillTool};
pub use problem::{Severity, SkillProblem};
pub use set::{Checks, SkillSet, SkillSummary};
pub use terms::{SkillTerms, rate_limits};
pub use views::{
    SkillInfo, get_skill_info, list_skills, skill_shows, system_prompt_sections, tools_for_skill,
};
pub use watch::{SkillWatcher, watch};
