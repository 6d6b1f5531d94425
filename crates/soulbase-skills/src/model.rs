//! The loaded form of a skill, whatever file it came from.

use std::path::PathBuf;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use soulbase_tools::CompiledTool;
use soulbase_types::ToolId;

/// The tool-id group every skill tool lives in: `skills.<skill>.<tool>`.
pub const SKILL_GROUP: &str = "skills";

/// Where a skill came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SkillKind {
    /// A YAML descriptor file (seed 001 §5.4.2): one skill, one tool.
    Descriptor,
    /// A folder with a `SKILL.md` (front matter + Markdown body).
    Package,
}

/// How risky a skill tool is; mapped onto the manifest's side effect, safety class
/// and consent (see [`crate::risk`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RiskLevel {
    /// Reads only (the default): safety `low`.
    #[default]
    Read,
    /// Changes state: safety `medium`, consent required.
    Write,
    /// Destroys state: safety `high`, consent required.
    Destructive,
}

/// One tool a skill provides.
#[derive(Debug, Clone)]
pub struct SkillTool {
    /// The short name (unique within the skill).
    pub name: String,
    /// Whether other skills may import it (listed under `exports.tools`).
    pub exported: bool,
    /// The validated, compiled manifest (`skills.<skill>.<name>`).
    pub compiled: Arc<CompiledTool>,
}

impl SkillTool {
    /// The tool id.
    pub fn id(&self) -> &ToolId {
        &self.compiled.manifest.id
    }
}

/// A skill's `exports` (seed 000 §3): what other skills may call, and on what terms.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Exports {
    /// The contract version, `major.minor` (compared with importers' `min_version`).
    pub api_version: Option<ApiVersion>,
    /// Names of the exported tools.
    pub tools: Vec<String>,
    /// Access terms.
    pub access: Access,
    /// Deprecation notices.
    pub deprecated: Vec<DeprecatedTool>,
}

/// Who may call a skill's exported tools and how often.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Access {
    /// Callers need a subscription to this skill (except for `free_tools`).
    pub requires_subscription: bool,
    /// Exported tools callable without a subscription.
    pub free_tools: Vec<String>,
    /// Per-tool rate limits (`None` = `unlimited`).
    pub rate_limit: Vec<(String, Option<soulbase_types::Rate>)>,
}

/// A deprecation notice for an exported tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeprecatedTool {
    /// The tool.
    pub tool: String,
    /// When it was deprecated (`YYYY-MM-DD`), if stated.
    pub since: Option<Date>,
    /// When it will be removed.
    pub removal_date: Date,
    /// What to use instead.
    pub replacement: Option<String>,
}

/// One `imports` entry: tools this skill calls in another skill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Import {
    /// The provider skill.
    pub from: String,
    /// The imported tool names.
    pub tools: Vec<String>,
    /// The lowest acceptable `exports.api_version` of the provider.
    pub min_version: Option<ApiVersion>,
    /// Whether this came from the deprecated `external_tools` alias.
    pub via_alias: bool,
}

/// A `major.minor` contract version, ordered numerically (`1.10 > 1.9`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ApiVersion {
    /// Breaking changes bump this.
    pub major: u64,
    /// Additions bump this.
    pub minor: u64,
}

impl ApiVersion {
    /// Parses `M`, `M.N` (or `M.N.P`, ignoring the patch).
    pub fn parse(s: &str) -> Option<ApiVersion> {
        let mut parts = s.trim().split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = match parts.next() {
            Some(p) => p.parse().ok()?,
            None => 0,
        };
        if let Some(p) = parts.next() {
            p.parse::<u64>().ok()?;
        }
        if parts.next().is_some() {
            return None;
        }
        Some(ApiVersion { major, minor })
    }
}

impl std::fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A calendar date (proleptic Gregorian), enough for deprecation windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Date {
    /// Days since 1970-01-01.
    pub days: i64,
}

impl Date {
    /// Parses `YYYY-MM-DD`; years 0–9999 only (anything else is `None`).
    pub fn parse(s: &str) -> Option<Date> {
        let mut it = s.trim().splitn(3, '-');
        let y: i64 = it.next()?.parse().ok()?;
        if !(0..=9999).contains(&y) {
            return None;
        }
        let m: i64 = it.next()?.parse().ok()?;
        let d: i64 = it.next()?.parse().ok()?;
        if !(1..=12).contains(&m) || d < 1 || d > days_in_month(y, m) {
            return None;
        }
        Some(Date {
            days: days_from_civil(y, m, d),
        })
    }

    /// Today (UTC).
    pub fn today() -> Date {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Date {
            days: i64::try_from(secs / 86_400).unwrap_or(0),
        }
    }

    /// Whole days from `self` to `later` (negative if `later` is earlier).
    pub fn days_until(self, later: Date) -> i64 {
        later.days - self.days
    }
}

impl std::fmt::Display for Date {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (y, m, d) = civil_from_days(self.days);
        write!(f, "{y:04}-{m:02}-{d:02}")
    }
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

// Howard Hinnant's civil calendar algorithms.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// One loaded skill.
#[derive(Debug, Clone)]
pub struct Skill {
    /// The skill's name: its identity, the middle segment of its tool ids.
    pub name: String,
    /// The human title (a package's `display_name`, or the front matter `name` when
    /// an `id` is given), if different from `name`.
    pub title: Option<String>,
    /// The short description shown in the selection phase.
    pub description: String,
    /// The skill's version, when declared.
    pub version: Option<String>,
    /// Descriptor or package.
    pub kind: SkillKind,
    /// The file it was loaded from (`SKILL.md` for a package).
    pub path: PathBuf,
    /// The skill's folder (a package's folder, or the skills root for a descriptor).
    pub dir: PathBuf,
    /// The whole source file, verbatim (for a package: the full SKILL.md).
    pub content: Arc<str>,
    /// The Markdown body after the front matter (packages only), verbatim.
    pub body: Option<Arc<str>>,
    /// The tools it provides, in declaration order.
    pub tools: Vec<SkillTool>,
    /// What it exports.
    pub exports: Exports,
    /// What it imports.
    pub imports: Vec<Import>,
    /// Files under `scripts/` and `references/` (relative to `dir`).
    pub resources: Vec<PathBuf>,
    /// Extra front matter kept for clients (`license`, `metadata`, …).
    pub extra: serde_json::Map<String, Value>,
    /// SHA-256 of the source file, hex.
    pub digest: String,
}

impl Skill {
    /// The tool called `name`, if this skill has one.
    pub fn tool(&self, name: &str) -> Option<&SkillTool> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The tool id `skills.<skill>.<tool>`, if the parts are valid id segments.
    pub fn tool_id(skill: &str, tool: &str) -> Option<ToolId> {
        ToolId::from_parts(SKILL_GROUP, skill, tool).ok()
    }

    /// The exported-tool access terms for `tool`: whether it needs a subscription.
    pub fn needs_subscription(&self, tool: &str) -> bool {
        self.exports.access.requires_subscription
            && !self.exports.access.free_tools.iter().any(|t| t == tool)
    }

    /// The declared rate limit for `tool`, if any.
    pub fn rate_limit(&self, tool: &str) -> Option<soulbase_types::Rate> {
        self.exports
            .access
            .rate_limit
            .iter()
            .find(|(t, _)| t == tool)
            .and_then(|(_, r)| *r)
    }
}
