//! The audit of the changes this process applies outside the registry admin:
//! configuration reloads, skill-set reloads and skill enable/disable.
//!
//! The log ([`open_log`]) lives with the evidence database (shared by replicas),
//! else in memory. [`AuditTrail`] remembers the configuration and skill set it
//! last audited, so each change is recorded exactly once whichever path applied
//! it: an explicit reload (`POST /api/reload`) records it as its caller's, a file
//! watcher or SIGHUP as the system actor's ([`soulbase_observe::system_subject`]).
//! A reload that was rejected or changed nothing records nothing. Registry
//! changes are audited by `RegistryAdmin` itself (`with_audit`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::json;
use soulbase_config::{Config, ConfigHandle, ConfigLoader, ConfigSnapshot, ReloadStatus};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::{
    AuditKind, AuditLog, AuditRecord, MemoryAuditLog, state_hash, system_subject,
};
use soulbase_skills::{ReloadReport, SkillCatalog, SkillSet};
use soulbase_store::{Persistence, SqlAuditLog};
use soulbase_types::{Subject, TenantId};

/// How many names a detail lists before `and N more`.
const NAMES_SHOWN: usize = 20;

/// Where the audit of changes is kept: with the evidence database, which replicas
/// share. A process without persistence (a role-only process) uses the configured
/// Postgres database when there is one, else keeps it in memory.
pub(crate) async fn open_log(
    cfg: &Config,
    persistence: Option<&Arc<Persistence>>,
) -> Result<Arc<dyn AuditLog>, SoulError> {
    if let Some(p) = persistence {
        return Ok(Arc::new(SqlAuditLog::new(p.db.clone())));
    }
    let url = soulbase_store::database_url(cfg);
    if url.starts_with("sqlite:") {
        tracing::info!(
            "the audit of changes is kept in memory here: give this process the evidence \
             database (evidence.url) to keep it with the tools processes'"
        );
        return Ok(Arc::new(MemoryAuditLog::new()));
    }
    let db = soulbase_store::Db::connect(&url, cfg.evidence.migrate_on_start).await?;
    Ok(Arc::new(SqlAuditLog::new(db)))
}

/// Appends `record` to `log`; a log that fails cannot undo the change it
/// describes, so the record is logged at ERROR instead.
pub(crate) async fn append(log: &dyn AuditLog, record: AuditRecord) {
    if let Err(e) = log.append(&record).await {
        tracing::error!(
            error = %e,
            record = ?record,
            "audit record lost: the change took effect but could not be audited"
        );
    }
}

/// `a, b, c and N more`.
fn names(list: &[String]) -> String {
    let shown: Vec<&str> = list.iter().take(NAMES_SHOWN).map(String::as_str).collect();
    let more = list.len().saturating_sub(NAMES_SHOWN);
    if more > 0 {
        format!("{} and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// The skills of a set by name, with their definitions' digests.
fn skill_digests(set: &SkillSet) -> BTreeMap<String, String> {
    set.skills()
        .map(|s| (s.name.clone(), s.digest.clone()))
        .collect()
}

/// What the audit last recorded of the configuration and the skill set.
pub(crate) struct AuditTrail {
    log: Arc<dyn AuditLog>,
    /// The configuration's target: its file, else `config`.
    config_target: String,
    config: tokio::sync::Mutex<Arc<ConfigSnapshot>>,
    /// Also serializes skill enable/disable, so each change is seen once.
    skills: tokio::sync::Mutex<BTreeMap<String, String>>,
}

impl AuditTrail {
    /// A trail starting from the configuration and skill set the process started
    /// with.
    pub(crate) fn new(
        log: Arc<dyn AuditLog>,
        loader: &ConfigLoader,
        started: Arc<ConfigSnapshot>,
        skills: Option<&SkillCatalog>,
    ) -> Self {
        let config_target = loader
            .file()
            .map_or_else(|| "config".to_owned(), |p| p.display().to_string());
        let digests = skills.map_or_else(BTreeMap::new, |c| skill_digests(&c.current()));
        Self {
            log,
            config_target,
            config: tokio::sync::Mutex::new(started),
            skills: tokio::sync::Mutex::new(digests),
        }
    }

    /// Records a configuration that differs from the one last audited as
    /// changed by `by` (`config.reload`, global tenant): both snapshots' hashes
    /// (the hash evidence records) and the changed keys.
    async fn record_config(
        &self,
        audited: &mut Arc<ConfigSnapshot>,
        config: &ConfigHandle,
        by: &Subject,
    ) {
        let now = config.current();
        if now.hash() == audited.hash() {
            return;
        }
        let keys = soulbase_config::reference::changed_keys(audited.config(), now.config());
        let record = AuditRecord::new(
            TenantId::global(),
            by,
            AuditKind::ConfigReload,
            self.config_target.clone(),
        )
        .hashes(Some(audited.hash().to_owned()), Some(now.hash().to_owned()))
        .detail(format!("changed: {}", names(&keys)));
        append(self.log.as_ref(), record).await;
        *audited = now;
    }

    /// Re-reads the configuration with `loader` for `by`, recording the change
    /// if it was accepted and changed something (and, first, a change a watcher
    /// applied that was not recorded yet, as the system's).
    pub(crate) async fn reload_config(
        &self,
        config: &ConfigHandle,
        loader: &ConfigLoader,
        by: &Subject,
    ) -> ReloadStatus {
        let mut audited = self.config.lock().await;
        self.record_config(&mut audited, config, &system_subject())
            .await;
        let status = config.reload(loader);
        self.record_config(&mut audited, config, by).await;
        status
    }

    /// Records a configuration a watcher applied, as the system's.
    pub(crate) async fn config_changed(&self, config: &ConfigHandle) {
        let mut audited = self.config.lock().await;
        self.record_config(&mut audited, config, &system_subject())
            .await;
    }

    /// Records a skill set that differs from the one last audited as reloaded by
    /// `by` (`skills.reload`): added, updated and removed skills, and hashes of
    /// the set (names and definition digests).
    async fn record_skills(
        &self,
        audited: &mut BTreeMap<String, String>,
        catalog: &SkillCatalog,
        by: &Subject,
    ) {
        let now = skill_digests(&catalog.current());
        if now == *audited {
            return;
        }
        let added: Vec<String> = now
            .keys()
            .filter(|k| !audited.contains_key(*k))
            .cloned()
            .collect();
        let removed: Vec<String> = audited
            .keys()
            .filter(|k| !now.contains_key(*k))
            .cloned()
            .collect();
        let updated: Vec<String> = now
            .iter()
            .filter(|(k, d)| audited.get(*k).is_some_and(|old| old != *d))
            .map(|(k, _)| k.clone())
            .collect();
        let mut parts = Vec::new();
        for (what, list) in [
            ("added", &added),
            ("updated", &updated),
            ("removed", &removed),
        ] {
            if !list.is_empty() {
                parts.push(format!("{what}: {}", names(list)));
            }
        }
        let record = AuditRecord::new(
            TenantId::global(),
            by,
            AuditKind::SkillsReload,
            catalog.root().display().to_string(),
        )
        .hashes(
            Some(state_hash(&json!(*audited))),
            Some(state_hash(&json!(now))),
        )
        .detail(parts.join("; "));
        append(self.log.as_ref(), record).await;
        *audited = now;
    }

    /// Re-reads the skills directory for `by`, recording a change of the loaded
    /// skills (and, first, one a watcher made that was not recorded yet).
    pub(crate) async fn reload_skills(
        &self,
        catalog: &SkillCatalog,
        by: &Subject,
    ) -> Result<ReloadReport, SoulError> {
        let mut audited = self.skills.lock().await;
        self.record_skills(&mut audited, catalog, &system_subject())
            .await;
        let report = catalog.reload_async().await;
        self.record_skills(&mut audited, catalog, by).await;
        report
    }

    /// Records a skill set a watcher reloaded, as the system's.
    pub(crate) async fn skills_changed(&self, catalog: &SkillCatalog) {
        let mut audited = self.skills.lock().await;
        self.record_skills(&mut audited, catalog, &system_subject())
            .await;
    }

    /// Enables or disables skill `name` for `by`; a change of its state is one
    /// `skill.enable` / `skill.disable` record (global tenant, the skill as
    /// target, hashes of its definition digest and state before and after).
    pub(crate) async fn set_skill_enabled(
        &self,
        catalog: &SkillCatalog,
        by: &Subject,
        name: &str,
        enabled: bool,
    ) -> Result<(), SoulError> {
        let _one = self.skills.lock().await;
        let was = catalog.current().is_enabled(name);
        catalog.set_enabled_async(name, enabled).await?;
        let set = catalog.current();
        let Some(skill) = set.get(name) else {
            return Ok(());
        };
        if was == enabled {
            return Ok(());
        }
        let hash =
            |on: bool| state_hash(&json!({"skill": name, "digest": skill.digest, "enabled": on}));
        let kind = if enabled {
            AuditKind::SkillEnable
        } else {
            AuditKind::SkillDisable
        };
        let record = AuditRecord::new(TenantId::global(), by, kind, name)
            .hashes(Some(hash(was)), Some(hash(enabled)))
            .detail(format!(
                "{} ({} tool(s))",
                if enabled { "enabled" } else { "disabled" },
                skill.tools.len()
            ));
        append(self.log.as_ref(), record).await;
        Ok(())
    }
}

/// `TOOL.NOT_FOUND`: this process serves no skills.
pub(crate) fn no_skills() -> SoulError {
    SoulError::new(ErrorCode::ToolNotFound, "this server serves no skills")
}

#[cfg(test)]
mod tests {
    use super::*;
    use soulbase_observe::{AuditFilter, MemoryAuditLog};
    use soulbase_skills::CatalogOptions;
    use soulbase_tools::Registry;
    use soulbase_types::ActorId;

    fn alice() -> Subject {
        Subject::new(
            TenantId::new("acme").unwrap(),
            ActorId::new("alice").unwrap(),
        )
    }

    /// (kind, actor, detail) of each record, oldest first.
    fn kinds(log: &MemoryAuditLog) -> Vec<(AuditKind, String, String)> {
        log.records()
            .into_iter()
            .map(|r| (r.kind, r.actor.to_string(), r.detail))
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_configuration_change_is_recorded_once_by_whoever_applied_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, "quota:\n  limits: []\n").unwrap();
        let loader = ConfigLoader::new().with_file(&file);
        let handle = ConfigHandle::new(loader.load().unwrap());
        let first = handle.current().hash().to_owned();
        let log = Arc::new(MemoryAuditLog::new());
        let trail = AuditTrail::new(log.clone(), &loader, handle.current(), None);

        // An explicit reload that changed something: the caller's.
        std::fs::write(&file, "skills:\n  poll_interval_ms: 900\n").unwrap();
        let status = trail.reload_config(&handle, &loader, &alice()).await;
        assert!(matches!(status, ReloadStatus::Applied { .. }), "{status:?}");
        // Nothing changed, then a rejected file: nothing recorded.
        trail.reload_config(&handle, &loader, &alice()).await;
        std::fs::write(&file, "server: {roles: []}\n").unwrap();
        let status = trail.reload_config(&handle, &loader, &alice()).await;
        assert!(
            matches!(status, ReloadStatus::Rejected { .. }),
            "{status:?}"
        );
        // A watcher applies the next edit; the explicit reload after it finds
        // nothing new of its own, and the change is recorded once, the system's.
        std::fs::write(&file, "skills:\n  poll_interval_ms: 800\n").unwrap();
        handle.reload(&loader);
        trail.reload_config(&handle, &loader, &alice()).await;
        trail.config_changed(&handle).await;
        assert_eq!(
            kinds(&log),
            vec![
                (
                    AuditKind::ConfigReload,
                    "alice".into(),
                    "changed: skills.poll_interval_ms".into()
                ),
                (
                    AuditKind::ConfigReload,
                    "system".into(),
                    "changed: skills.poll_interval_ms".into()
                ),
            ]
        );
        let records = log.records();
        assert_eq!(records[0].before_hash.as_deref(), Some(first.as_str()));
        assert_eq!(records[1].before_hash, records[0].after_hash);
        assert_eq!(
            records[1].after_hash.as_deref(),
            Some(handle.current().hash())
        );
        assert_eq!(records[0].target, file.display().to_string());
        assert_eq!(records[0].tenant, TenantId::global());
    }

    fn note(name: &str, description: &str) -> String {
        format!(
            "name: {name}\ndescription: {description}\nprovider: builtin\n\
             handler: soulbase.builtin.echo\nrisk_level: read\nparameters:\n  type: object\n"
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn skill_states_and_reloads_are_recorded_once_each() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("note.yaml"), note("note", "Echo a note.")).unwrap();
        let (catalog, _) =
            SkillCatalog::open(Registry::new(), CatalogOptions::new(dir.path())).unwrap();
        let log = Arc::new(MemoryAuditLog::new());
        let loader = ConfigLoader::new();
        let trail = AuditTrail::new(
            log.clone(),
            &loader,
            Arc::new(loader.load().unwrap()),
            Some(&catalog),
        );
        // Disabled twice (the second changes nothing), an unknown skill refused,
        // enabled again.
        for enabled in [false, false] {
            trail
                .set_skill_enabled(&catalog, &alice(), "note", enabled)
                .await
                .unwrap();
        }
        trail
            .set_skill_enabled(&catalog, &alice(), "ghost", false)
            .await
            .unwrap_err();
        trail
            .set_skill_enabled(&catalog, &alice(), "note", true)
            .await
            .unwrap();
        // The watcher reloads a new file; an explicit reload after it changes
        // nothing more.
        std::fs::write(dir.path().join("memo.yaml"), note("memo", "A memo.")).unwrap();
        catalog.reload();
        trail.skills_changed(&catalog).await;
        trail.reload_skills(&catalog, &alice()).await.unwrap();
        // An explicit reload that removes one: the caller's.
        std::fs::remove_file(dir.path().join("note.yaml")).unwrap();
        trail.reload_skills(&catalog, &alice()).await.unwrap();
        assert_eq!(
            kinds(&log),
            vec![
                (
                    AuditKind::SkillDisable,
                    "alice".into(),
                    "disabled (1 tool(s))".into()
                ),
                (
                    AuditKind::SkillEnable,
                    "alice".into(),
                    "enabled (1 tool(s))".into()
                ),
                (
                    AuditKind::SkillsReload,
                    "system".into(),
                    "added: memo".into()
                ),
                (
                    AuditKind::SkillsReload,
                    "alice".into(),
                    "removed: note".into()
                ),
            ]
        );
        let records = log.list(&AuditFilter::newest(10)).await.unwrap();
        let (disable, enable) = (&records[3], &records[2]);
        assert_eq!(disable.target, "note");
        assert_eq!(enable.before_hash, disable.after_hash);
        assert_eq!(enable.after_hash, disable.before_hash);
        assert_eq!(records[0].before_hash, records[1].after_hash);
    }

    #[test]
    fn long_lists_of_names_are_cut() {
        let list: Vec<String> = (0..25).map(|i| format!("k{i}")).collect();
        let text = names(&list);
        assert!(text.ends_with("k19 and 5 more"), "{text}");
        assert_eq!(names(&list[..2]), "k0, k1");
    }
}
