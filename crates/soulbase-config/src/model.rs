//! The typed configuration tree and its semantic validation.
//!
//! Every struct denies unknown fields so a typo is an error, not a silently ignored
//! setting. Defaults are the embedded, zero-infrastructure setup: SQLite evidence
//! under `data_dir`, in-process quota, `./skills`, all roles in one process.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use soulbase_types::Rate;

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where embedded state lives (SQLite evidence, the evidence spool).
    pub data_dir: PathBuf,
    /// Listening addresses and roles.
    pub server: ServerConfig,
    /// The watched skills directory.
    pub skills: SkillsConfig,
    /// Evidence storage and durability.
    pub evidence: EvidenceConfig,
    /// Quotas and rate limits.
    pub quota: QuotaConfig,
    /// The static authorization policy (deny by default).
    pub policy: PolicyConfig,
    /// Tracing and metrics.
    pub observe: ObserveConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./data"),
            server: ServerConfig::default(),
            skills: SkillsConfig::default(),
            evidence: EvidenceConfig::default(),
            quota: QuotaConfig::default(),
            policy: PolicyConfig::default(),
            observe: ObserveConfig::default(),
        }
    }
}

/// A role `soulbased` can serve locally; roles not served locally are reached remotely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Tool registry and invoker.
    Tools,
    /// Authentication, authorization, consent.
    Auth,
    /// Quotas and rate limits.
    Qos,
    /// Sandboxed execution.
    Sandbox,
    /// Evidence storage and query.
    Evidence,
}

/// Server addresses and roles.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Roles served by this process.
    pub roles: Vec<Role>,
    /// gRPC listen address.
    pub grpc_addr: SocketAddr,
    /// HTTP/JSON, MCP and metrics listen address.
    pub http_addr: SocketAddr,
    /// How long in-flight calls may take to finish on shutdown.
    pub shutdown_grace_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            roles: vec![
                Role::Tools,
                Role::Auth,
                Role::Qos,
                Role::Sandbox,
                Role::Evidence,
            ],
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 50051)),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            shutdown_grace_ms: 10_000,
        }
    }
}

/// The skills directory and how it is watched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SkillsConfig {
    /// The directory of YAML descriptors and SKILL.md packages (`SKILLS_DIR`).
    pub dir: PathBuf,
    /// Whether to apply changes while running.
    pub watch: bool,
    /// Polling interval for the fallback when file events are unavailable.
    pub poll_interval_ms: u64,
}

impl Default for SkillsConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("./skills"),
            watch: true,
            poll_interval_ms: 500,
        }
    }
}

/// Where evidence is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvidenceBackend {
    /// An SQLite file under `data_dir` (the embedded default).
    Sqlite,
    /// PostgreSQL at `evidence.url` (production).
    Postgres,
}

/// When evidence must be durable relative to the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityMode {
    /// Begin is durable before execution, End before the result returns (default).
    Sync,
    /// Batched in the background; a crash may lose the last few milliseconds.
    Async,
}

/// Evidence storage and durability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvidenceConfig {
    /// Which store.
    pub backend: EvidenceBackend,
    /// Database URL; required for Postgres, defaults to `<data_dir>/evidence.db` for SQLite.
    pub url: Option<String>,
    /// Sync (default) or async durability.
    pub durability: DurabilityMode,
    /// The spool's cap; past it new calls are refused with `EVIDENCE.UNAVAILABLE`.
    pub spool_max_bytes: u64,
    /// Apply migrations at start-up.
    pub migrate_on_start: bool,
    /// How long evidence is kept.
    pub retention_days: u32,
}

impl Default for EvidenceConfig {
    fn default() -> Self {
        Self {
            backend: EvidenceBackend::Sqlite,
            url: None,
            durability: DurabilityMode::Sync,
            spool_max_bytes: 1 << 30,
            migrate_on_start: true,
            retention_days: 30,
        }
    }
}

/// Which quota backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuotaBackend {
    /// In this process (one replica).
    Memory,
    /// Shared through Redis (several replicas).
    Redis,
}

/// What to do when the quota backend is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Refuse calls (default).
    Closed,
    /// Allow calls and log a warning.
    Open,
}

/// One rate limit: who it applies to and the rate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaLimit {
    /// Tenant, or `*` for every tenant (each tenant gets its own bucket).
    #[serde(default = "star")]
    pub tenant: String,
    /// Tool id pattern: exact id, `group.pkg.*`, or `*`.
    #[serde(default = "star")]
    pub tool: String,
    /// The rate, e.g. `100/min`.
    pub rate: Rate,
}

/// Quotas and rate limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuotaConfig {
    /// In-process or Redis.
    pub backend: QuotaBackend,
    /// Redis URL when the backend is Redis.
    pub redis_url: Option<String>,
    /// Behaviour when the backend is unreachable.
    pub on_backend_failure: FailMode,
    /// The limits.
    pub limits: Vec<QuotaLimit>,
}

impl Default for QuotaConfig {
    fn default() -> Self {
        Self {
            backend: QuotaBackend::Memory,
            redis_url: None,
            on_backend_failure: FailMode::Closed,
            limits: Vec::new(),
        }
    }
}

/// Allow or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyEffect {
    /// Grants, unless some deny rule matches.
    Allow,
    /// Refuses; wins over any allow.
    Deny,
}

fn star() -> String {
    "*".to_owned()
}

fn star_list() -> Vec<String> {
    vec![star()]
}

/// One static policy rule. A call is allowed when some allow rule matches and no deny rule does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    /// Allow or deny.
    pub effect: PolicyEffect,
    /// Tenant the rule applies to, or `*`.
    #[serde(default = "star")]
    pub tenant: String,
    /// Actors the rule applies to (`*` for all).
    #[serde(default = "star_list")]
    pub actors: Vec<String>,
    /// Tool id patterns: exact id, `group.*`, `group.pkg.*`, or `*`.
    pub tools: Vec<String>,
    /// Actions (`invoke`, …); defaults to `invoke`.
    #[serde(default = "default_actions")]
    pub actions: Vec<String>,
}

fn default_actions() -> Vec<String> {
    vec!["invoke".to_owned()]
}

/// The static, in-process policy (replaced by the policy engine where configured).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Rules; with none, everything is denied.
    pub rules: Vec<PolicyRule>,
}

/// Tracing and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ObserveConfig {
    /// OTLP gRPC endpoint for traces; none disables export.
    pub otlp_endpoint: Option<String>,
    /// `tracing` filter directive, e.g. `info,soulbase=debug`.
    pub log_filter: Option<String>,
}

/// Checks whether a tool pattern is well formed: `*`, an exact id, or a prefix ending in `.*`.
fn check_tool_pattern(p: &str) -> Result<(), String> {
    if p == "*" {
        return Ok(());
    }
    let body = p.strip_suffix(".*").unwrap_or(p);
    let ok = !body.is_empty()
        && body.split('.').count() <= 3
        && body.split('.').all(|s| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{p:?} is not a tool pattern (use *, group.*, group.pkg.* or group.pkg.name)"
        ))
    }
}

impl Config {
    /// Semantic checks serde cannot express; returns `(field path, problem)` pairs.
    pub fn validate(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut push = |path: String, msg: String| problems.push((path, msg));
        if self.server.roles.is_empty() {
            push("server.roles".into(), "must name at least one role".into());
        }
        let unique: BTreeSet<_> = self.server.roles.iter().collect();
        if unique.len() != self.server.roles.len() {
            push("server.roles".into(), "lists a role twice".into());
        }
        if self.skills.poll_interval_ms < 50 {
            push(
                "skills.poll_interval_ms".into(),
                "must be at least 50".into(),
            );
        }
        if self.evidence.backend == EvidenceBackend::Postgres && self.evidence.url.is_none() {
            push(
                "evidence.url".into(),
                "is required when evidence.backend is postgres".into(),
            );
        }
        if let Some(url) = &self.evidence.url {
            let ok = match self.evidence.backend {
                EvidenceBackend::Postgres => {
                    url.starts_with("postgres://") || url.starts_with("postgresql://")
                }
                EvidenceBackend::Sqlite => url.starts_with("sqlite:"),
            };
            if !ok {
                push(
                    "evidence.url".into(),
                    "does not match evidence.backend (postgres:// or sqlite:)".into(),
                );
            }
        }
        if self.evidence.spool_max_bytes < 1 << 20 {
            push(
                "evidence.spool_max_bytes".into(),
                "must be at least 1 MiB".into(),
            );
        }
        if self.evidence.retention_days == 0 {
            push(
                "evidence.retention_days".into(),
                "must be at least 1".into(),
            );
        }
        match (&self.quota.backend, &self.quota.redis_url) {
            (QuotaBackend::Redis, None) => push(
                "quota.redis_url".into(),
                "is required when quota.backend is redis".into(),
            ),
            (_, Some(url)) if !(url.starts_with("redis://") || url.starts_with("rediss://")) => {
                push(
                    "quota.redis_url".into(),
                    "must start with redis:// or rediss://".into(),
                )
            }
            _ => {}
        }
        for (i, limit) in self.quota.limits.iter().enumerate() {
            if let Err(e) = check_tool_pattern(&limit.tool) {
                push(format!("quota.limits[{i}].tool"), e);
            }
        }
        for (i, rule) in self.policy.rules.iter().enumerate() {
            if rule.tools.is_empty() {
                push(
                    format!("policy.rules[{i}].tools"),
                    "must list at least one tool pattern".into(),
                );
            }
            for (j, t) in rule.tools.iter().enumerate() {
                if let Err(e) = check_tool_pattern(t) {
                    push(format!("policy.rules[{i}].tools[{j}]"), e);
                }
            }
            if rule.actors.is_empty() {
                push(
                    format!("policy.rules[{i}].actors"),
                    "must list at least one actor or *".into(),
                );
            }
        }
        problems
    }
}
