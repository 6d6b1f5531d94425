//! The audit of changes: who changed the registry, a skill's state, the skill set,
//! the configuration or the evidence quarantine, or decided a consent request,
//! when, and what it was before and after.
//!
//! Every change that succeeded is one [`AuditRecord`] appended to an [`AuditLog`]
//! after the change took effect (a refused change records nothing, nor does a
//! request that changed nothing). The server keeps the log with its evidence
//! database (soulbase-store's `SqlAuditLog`, shared by replicas);
//! [`MemoryAuditLog`] is for tests and processes without a database. The record
//! holds hashes of the thing before and after ([`state_hash`]), never its content.

use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{ActorId, EnvelopeId, Subject, TenantId, UnixMillis};

use crate::canonical_json;

/// The most records one [`AuditLog::list`] returns.
pub const MAX_AUDIT_PAGE: u32 = 1_000;

/// The longest [`AuditRecord::detail`] kept, in characters (longer ones are cut,
/// ending in `…`).
pub const MAX_DETAIL_CHARS: usize = 500;

macro_rules! kinds {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// What changed: a closed set of stable names (`registry.register`, …).
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
        )]
        pub enum AuditKind {
            $($(#[$doc])* #[serde(rename = $name)] $variant,)*
        }

        impl AuditKind {
            /// Every kind.
            pub const ALL: &'static [AuditKind] = &[$(AuditKind::$variant,)*];

            /// The kind's stable name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(AuditKind::$variant => $name,)*
                }
            }
        }
    };
}

kinds! {
    /// A tool registered (target: the tool id).
    RegistryRegister = "registry.register",
    /// A tool's manifest replaced by a new version.
    RegistryUpdate = "registry.update",
    /// A tool's lifecycle state changed (enabled, paused, deprecated).
    RegistryState = "registry.state",
    /// A tool removed.
    RegistryUnregister = "registry.unregister",
    /// A tenant's override of a global tool's state set or cleared.
    RegistryOverride = "registry.override",
    /// A tenant's allow-list of global tools set or removed (target: the tenant).
    RegistryAllowList = "registry.allow_list",
    /// A skill enabled (target: the skill name).
    SkillEnable = "skill.enable",
    /// A skill disabled (target: the skill name).
    SkillDisable = "skill.disable",
    /// A reload of the skills directory that changed the loaded skills (target:
    /// the directory).
    SkillsReload = "skills.reload",
    /// An accepted configuration reload that changed the configuration (target:
    /// the configuration's sources).
    ConfigReload = "config.reload",
    /// A consent request approved: a token issued for its requester (target:
    /// the request id).
    ConsentApprove = "consent.approve",
    /// A consent request declined (target: the request id).
    ConsentDecline = "consent.decline",
    /// The evidence spool's quarantine offered to the store again, changing it:
    /// records left it, or the reason of one still refused changed (target: the
    /// quarantine file).
    EvidenceQuarantineRetry = "evidence.quarantine_retry",
}

impl fmt::Display for AuditKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AuditKind {
    type Err = SoulError;

    /// Parses a stable name; an unknown one is `SCHEMA.VALIDATION_FAILED` naming
    /// the field `kind`.
    fn from_str(s: &str) -> Result<Self, SoulError> {
        AuditKind::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = AuditKind::ALL.iter().map(|k| k.as_str()).collect();
                invalid("kind", format!("kind must be one of {}", names.join(", ")))
            })
    }
}

/// One change, as the audit keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct AuditRecord {
    /// Unique, time-ordered id (a UUIDv7): the record's key.
    pub id: EnvelopeId,
    /// When the change took effect.
    pub at: UnixMillis,
    /// The tenant whose view changed: the tool's owner, the tenant of an override
    /// or allow-list; the global tenant for global tools, skills and the
    /// configuration.
    pub tenant: TenantId,
    /// Who made the change ([`ActorId::system`] for a file watcher or a signal).
    pub actor: ActorId,
    /// The tenant of the actor (the global tenant for the system actor).
    pub actor_tenant: TenantId,
    /// What changed.
    pub kind: AuditKind,
    /// What it changed: a tool id, a tenant (allow-list), a skill name, the skills
    /// directory or the configuration's sources.
    pub target: String,
    /// [`state_hash`] of the thing before; `None` when it did not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_hash: Option<String>,
    /// [`state_hash`] of the thing after; `None` when it no longer exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_hash: Option<String>,
    /// A short human description (at most [`MAX_DETAIL_CHARS`]).
    #[serde(default)]
    pub detail: String,
}

impl AuditRecord {
    /// A record of `kind` on `target` in `tenant`, made now by `by`, with no
    /// hashes and no detail yet.
    pub fn new(tenant: TenantId, by: &Subject, kind: AuditKind, target: impl Into<String>) -> Self {
        Self {
            id: EnvelopeId::generate(),
            at: UnixMillis::now(),
            tenant,
            actor: by.actor.clone(),
            actor_tenant: by.tenant.clone(),
            kind,
            target: target.into(),
            before_hash: None,
            after_hash: None,
            detail: String::new(),
        }
    }

    /// Sets the hashes before and after (builder style).
    pub fn hashes(mut self, before: Option<String>, after: Option<String>) -> Self {
        self.before_hash = before;
        self.after_hash = after;
        self
    }

    /// Sets the detail, cut to [`MAX_DETAIL_CHARS`] (builder style).
    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        let detail = detail.into();
        self.detail = match detail.char_indices().nth(MAX_DETAIL_CHARS - 1) {
            Some((cut, _)) if detail.chars().count() > MAX_DETAIL_CHARS => {
                format!("{}…", &detail[..cut])
            }
            _ => detail,
        };
        self
    }
}

/// The subject of changes no person asked for ([`ActorId::system`] of the global
/// tenant): the configuration and skills watchers, a SIGHUP.
pub fn system_subject() -> Subject {
    Subject::new(TenantId::global(), ActorId::system())
}

/// The hash an [`AuditRecord`] holds of a thing: the lowercase hex SHA-256 of its
/// canonical JSON ([`canonical_json`]), the same form as the configuration hash
/// recorded in evidence.
pub fn state_hash(value: &serde_json::Value) -> String {
    hex::encode(Sha256::digest(canonical_json(value)))
}

/// Which records [`AuditLog::list`] returns: all conditions given must hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditFilter {
    /// Only this tenant's records (`None`: every tenant's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<TenantId>,
    /// Only this kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<AuditKind>,
    /// Only this target (exactly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Records at or after this instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<UnixMillis>,
    /// Records strictly before this instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<UnixMillis>,
    /// At most this many, 1..=[`MAX_AUDIT_PAGE`].
    pub limit: u32,
}

impl AuditFilter {
    /// The newest `limit` records of every tenant.
    pub fn newest(limit: u32) -> Self {
        Self {
            tenant: None,
            kind: None,
            target: None,
            since: None,
            until: None,
            limit,
        }
    }

    /// Checks the limit and the range; errors name the field.
    pub fn validate(&self) -> Result<(), SoulError> {
        if self.limit == 0 || self.limit > MAX_AUDIT_PAGE {
            return Err(invalid(
                "limit",
                format!("limit must be between 1 and {MAX_AUDIT_PAGE}"),
            ));
        }
        if let (Some(since), Some(until)) = (self.since, self.until)
            && since.0 > until.0
        {
            return Err(invalid("since", "since must not be after until"));
        }
        Ok(())
    }

    /// Whether `r` passes the filter (the limit aside).
    pub fn matches(&self, r: &AuditRecord) -> bool {
        self.tenant.as_ref().is_none_or(|t| *t == r.tenant)
            && self.kind.is_none_or(|k| k == r.kind)
            && self.target.as_ref().is_none_or(|t| *t == r.target)
            && self.since.is_none_or(|s| r.at >= s)
            && self.until.is_none_or(|u| r.at < u)
    }
}

fn invalid(field: &str, message: impl Into<std::borrow::Cow<'static, str>>) -> SoulError {
    SoulError::new(ErrorCode::SchemaValidationFailed, message).with_field("field", field)
}

/// Where audit records are kept.
#[async_trait]
pub trait AuditLog: Send + Sync + 'static {
    /// Appends `record`; appending a record whose id is stored already is
    /// harmless. An error is an outage (`EVIDENCE.UNAVAILABLE`).
    async fn append(&self, record: &AuditRecord) -> Result<(), SoulError>;

    /// The records `filter` selects, newest first (by time; within one
    /// millisecond, the last appended first), at most `filter.limit`. A filter that does not [validate](AuditFilter::validate)
    /// is refused.
    async fn list(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>, SoulError>;
}

/// An audit log in memory (lost on restart, not shared between processes).
#[derive(Debug, Default)]
pub struct MemoryAuditLog {
    records: Mutex<Vec<AuditRecord>>,
}

impl MemoryAuditLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every record, in the order appended.
    pub fn records(&self) -> Vec<AuditRecord> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[async_trait]
impl AuditLog for MemoryAuditLog {
    async fn append(&self, record: &AuditRecord) -> Result<(), SoulError> {
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        if !records.iter().any(|r| r.id == record.id) {
            records.push(record.clone());
        }
        Ok(())
    }

    async fn list(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>, SoulError> {
        filter.validate()?;
        // Last appended first, then (a stable sort) newest first.
        let mut found: Vec<AuditRecord> = self
            .records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .rev()
            .filter(|r| filter.matches(r))
            .cloned()
            .collect();
        found.sort_by_key(|r| std::cmp::Reverse(r.at));
        found.truncate(usize::try_from(filter.limit).unwrap_or(usize::MAX));
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn subject(t: &str, a: &str) -> Subject {
        Subject::new(TenantId::new(t).unwrap(), ActorId::new(a).unwrap())
    }

    fn at(mut r: AuditRecord, ms: i64) -> AuditRecord {
        r.at = UnixMillis(ms);
        r
    }

    #[test]
    fn kinds_have_stable_names_that_parse_back() {
        for k in AuditKind::ALL {
            assert_eq!(k.as_str().parse::<AuditKind>().unwrap(), *k);
            assert_eq!(
                serde_json::to_value(k).unwrap(),
                serde_json::json!(k.as_str())
            );
        }
        let e = "registry.explode".parse::<AuditKind>().unwrap_err();
        assert_eq!(e.code(), ErrorCode::SchemaValidationFailed);
        assert_eq!(e.field("field"), Some("kind"));
        assert_eq!(AuditKind::ConfigReload.to_string(), "config.reload");
    }

    #[test]
    fn hashes_are_hex_sha256_of_canonical_json_whatever_the_key_order() {
        let a: serde_json::Value = serde_json::from_str(r#"{"b":1,"a":2}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"a":2, "b":1}"#).unwrap();
        assert_eq!(state_hash(&a), state_hash(&b));
        assert_eq!(state_hash(&a).len(), 64);
        assert!(state_hash(&a).bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(state_hash(&a), state_hash(&serde_json::json!({"a": 3})));
    }

    #[test]
    fn a_long_detail_is_cut() {
        let by = subject("acme", "alice");
        let r = AuditRecord::new(TenantId::global(), &by, AuditKind::ConfigReload, "x")
            .detail("é".repeat(MAX_DETAIL_CHARS + 10));
        assert_eq!(r.detail.chars().count(), MAX_DETAIL_CHARS);
        assert!(r.detail.ends_with('…'));
        let short = AuditRecord::new(TenantId::global(), &by, AuditKind::ConfigReload, "x")
            .detail("é".repeat(MAX_DETAIL_CHARS));
        assert_eq!(short.detail.chars().count(), MAX_DETAIL_CHARS);
        assert!(!short.detail.ends_with('…'));
        assert_eq!(r.actor_tenant.as_str(), "acme");
        assert_eq!(system_subject().actor.as_str(), "system");
    }

    #[test]
    fn bad_filters_name_their_field() {
        let e = AuditFilter::newest(0).validate().unwrap_err();
        assert_eq!(e.field("field"), Some("limit"));
        let e = AuditFilter::newest(MAX_AUDIT_PAGE + 1)
            .validate()
            .unwrap_err();
        assert_eq!(e.field("field"), Some("limit"));
        let e = AuditFilter {
            since: Some(UnixMillis(5)),
            until: Some(UnixMillis(4)),
            ..AuditFilter::newest(1)
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.field("field"), Some("since"));
    }

    #[tokio::test]
    async fn the_memory_log_filters_and_lists_newest_first() {
        let log = MemoryAuditLog::new();
        let alice = subject("acme", "alice");
        let acme = TenantId::new("acme").unwrap();
        let globex = TenantId::new("globex").unwrap();
        let one = at(
            AuditRecord::new(acme.clone(), &alice, AuditKind::RegistryRegister, "a.b.c")
                .hashes(None, Some("h1".into())),
            10,
        );
        let two = at(
            AuditRecord::new(acme.clone(), &alice, AuditKind::RegistryState, "a.b.c")
                .hashes(Some("h1".into()), Some("h2".into())),
            20,
        );
        let other = at(
            AuditRecord::new(globex.clone(), &alice, AuditKind::RegistryState, "a.b.c"),
            30,
        );
        for r in [&one, &two, &other, &one] {
            log.append(r).await.unwrap();
        }
        assert_eq!(log.records().len(), 3, "an id is appended once");
        let all = log.list(&AuditFilter::newest(10)).await.unwrap();
        assert_eq!(all, vec![other.clone(), two.clone(), one.clone()]);
        let acme_only = AuditFilter {
            tenant: Some(acme.clone()),
            ..AuditFilter::newest(10)
        };
        assert_eq!(
            log.list(&acme_only).await.unwrap(),
            vec![two.clone(), one.clone()]
        );
        let states = AuditFilter {
            kind: Some(AuditKind::RegistryState),
            since: Some(UnixMillis(20)),
            until: Some(UnixMillis(30)),
            ..AuditFilter::newest(10)
        };
        assert_eq!(log.list(&states).await.unwrap(), vec![two.clone()]);
        let target = AuditFilter {
            target: Some("x.y.z".into()),
            ..AuditFilter::newest(10)
        };
        assert!(log.list(&target).await.unwrap().is_empty());
        assert_eq!(
            log.list(&AuditFilter::newest(1)).await.unwrap(),
            vec![other]
        );
        assert!(log.list(&AuditFilter::newest(0)).await.is_err());
        // Within one millisecond, the last appended comes first, whatever the ids.
        let same: Vec<AuditRecord> = (0..20)
            .map(|_| {
                at(
                    AuditRecord::new(acme.clone(), &alice, AuditKind::RegistryState, "t"),
                    40,
                )
            })
            .collect();
        for r in &same {
            log.append(r).await.unwrap();
        }
        let target = AuditFilter {
            target: Some("t".into()),
            ..AuditFilter::newest(100)
        };
        let listed = log.list(&target).await.unwrap();
        assert_eq!(listed, same.into_iter().rev().collect::<Vec<_>>());
    }
}
