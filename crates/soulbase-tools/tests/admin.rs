//! Registry changes on someone's behalf: persisted first, then applied; stale
//! changes refused by revision; records applied once, in revision order.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::base;
use soulbase_errors::ErrorCode;
use soulbase_tools::Registry;
use soulbase_tools::registry::admin::{
    Committed, MemoryLedger, RegistryAdmin, RegistryLedger, StateChange,
};
use soulbase_tools::registry::{
    Record, RecordKey, RegistryEvent, Take, TenantOverride, ToolOwner, ToolState,
};
use soulbase_types::{TenantId, ToolId};

const G: ToolOwner = ToolOwner::Global;

/// Who the test's registry changes are made by.
fn by() -> soulbase_types::Subject {
    soulbase_types::Subject::new(
        TenantId::new("acme").unwrap(),
        soulbase_types::ActorId::new("ops").unwrap(),
    )
}

fn id(s: &str) -> ToolId {
    ToolId::new(s).unwrap()
}

fn key(s: &str) -> RecordKey {
    RecordKey::Tool {
        owner: G,
        id: id(s),
    }
}

fn state(r: &Registry, s: &str) -> Option<ToolState> {
    r.get(&TenantId::global(), &id(s)).ok().map(|t| t.state)
}

/// Two processes sharing one ledger, each with its own registry.
fn two() -> (RegistryAdmin, RegistryAdmin, Arc<MemoryLedger>) {
    let ledger = Arc::new(MemoryLedger::default());
    (
        RegistryAdmin::new(Registry::new(), ledger.clone()),
        RegistryAdmin::new(Registry::new(), ledger.clone()),
        ledger,
    )
}

#[tokio::test]
async fn a_change_is_committed_then_applied_with_its_revision() {
    let (a, _, ledger) = two();
    a.register(&by(), &G, base("demo.a.x"), true).await.unwrap();
    assert_eq!(state(a.registry(), "demo.a.x"), Some(ToolState::Enabled));
    let stored = ledger.fetch(&[key("demo.a.x")]).await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].revision, 1);
    assert!(matches!(&stored[0].record, Some(Record::Tool(t)) if t.state == ToolState::Enabled));
    a.set_state(&by(), &G, &id("demo.a.x"), StateChange::Pause)
        .await
        .unwrap();
    assert_eq!(a.revision(&key("demo.a.x")), 2);
}

#[tokio::test]
async fn a_refused_change_commits_nothing() {
    let (a, _, ledger) = two();
    a.register(&by(), &G, base("demo.a.x"), false)
        .await
        .unwrap();
    // registered → paused is not a legal move.
    let err = a
        .set_state(&by(), &G, &id("demo.a.x"), StateChange::Pause)
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::RegistryConflict);
    assert_eq!(
        ledger.fetch(&[key("demo.a.x")]).await.unwrap()[0].revision,
        1
    );
    // A change that changes nothing commits nothing.
    a.set_state(&by(), &G, &id("demo.a.x"), StateChange::Enable)
        .await
        .unwrap();
    a.set_state(&by(), &G, &id("demo.a.x"), StateChange::Enable)
        .await
        .unwrap();
    assert_eq!(a.revision(&key("demo.a.x")), 2);
}

#[tokio::test]
async fn a_stale_change_is_a_conflict_and_the_loser_takes_the_newer_record() {
    let (a, b, ledger) = two();
    a.register(&by(), &G, base("demo.a.x"), true).await.unwrap();
    b.apply_stored(ledger.fetch(&[key("demo.a.x")]).await.unwrap());
    assert_eq!(state(b.registry(), "demo.a.x"), Some(ToolState::Enabled));
    // A pauses; B, which has not heard of it, deprecates from the old revision.
    a.set_state(&by(), &G, &id("demo.a.x"), StateChange::Pause)
        .await
        .unwrap();
    let err = b
        .set_state(&by(), &G, &id("demo.a.x"), StateChange::Deprecate)
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::RegistryConflict);
    assert_eq!(err.field("tool_id"), Some("demo.a.x"));
    // Nothing of B's was committed, and B now holds A's record.
    assert_eq!(b.revision(&key("demo.a.x")), 2);
    assert_eq!(state(b.registry(), "demo.a.x"), Some(ToolState::Paused));
    // The retry starts from it and wins.
    b.set_state(&by(), &G, &id("demo.a.x"), StateChange::Deprecate)
        .await
        .unwrap();
    assert_eq!(
        ledger.fetch(&[key("demo.a.x")]).await.unwrap()[0].revision,
        3
    );
}

#[tokio::test]
async fn stored_records_apply_once_in_revision_order_with_events() {
    let (a, b, ledger) = two();
    a.register(&by(), &G, base("demo.a.x"), true).await.unwrap();
    let v1 = ledger.fetch(&[key("demo.a.x")]).await.unwrap();
    a.set_state(&by(), &G, &id("demo.a.x"), StateChange::Pause)
        .await
        .unwrap();
    let v2 = ledger.fetch(&[key("demo.a.x")]).await.unwrap();
    let mut events = b.registry().subscribe();
    b.apply_stored(v2.clone());
    // An older record arriving late, or the same one again, changes nothing.
    assert!(b.apply_stored(v1).placed.is_empty());
    assert!(b.apply_stored(v2).placed.is_empty());
    assert_eq!(state(b.registry(), "demo.a.x"), Some(ToolState::Paused));
    assert!(matches!(
        events.try_recv().unwrap(),
        RegistryEvent::Registered { .. }
    ));
    assert!(matches!(
        events.try_recv().unwrap(),
        RegistryEvent::StateChanged {
            to: ToolState::Paused,
            ..
        }
    ));
    assert!(events.try_recv().is_err());
    // A removal is a record too.
    a.unregister(&by(), &G, &id("demo.a.x")).await.unwrap();
    b.apply_stored(ledger.fetch(&[key("demo.a.x")]).await.unwrap());
    assert_eq!(state(b.registry(), "demo.a.x"), None);
}

#[tokio::test]
async fn every_record_a_change_touches_is_committed_together() {
    let (a, b, ledger) = two();
    let acme = TenantId::new("acme").unwrap();
    a.register(&by(), &G, base("demo.a.x"), false)
        .await
        .unwrap();
    a.set_tenant_override(&by(), &acme, &id("demo.a.x"), Some(TenantOverride::Enabled))
        .await
        .unwrap();
    a.set_allow_list(&by(), &acme, Some([id("demo.a.x")].into_iter().collect()))
        .await
        .unwrap();
    let over = RecordKey::Override {
        tenant: acme.clone(),
        id: id("demo.a.x"),
    };
    let allow = RecordKey::AllowList {
        tenant: acme.clone(),
    };
    // Unregistering a global tool also drops the tenants' enabling overrides of
    // it: both records are committed by the one change.
    a.unregister(&by(), &G, &id("demo.a.x")).await.unwrap();
    let stored: Vec<Committed> = ledger
        .fetch(&[key("demo.a.x"), over.clone(), allow.clone()])
        .await
        .unwrap();
    let revs: Vec<(u64, bool)> = stored
        .iter()
        .map(|c| (c.revision, c.record.is_some()))
        .collect();
    // The tool: registered (1), its override set (2: an override commits its
    // tool's record too), unregistered (3).
    assert_eq!(revs, vec![(3, false), (2, false), (1, true)]);
    // Another process applying them ends in the same state.
    b.apply_stored(stored);
    assert_eq!(b.registry().export(), a.registry().export());
    assert_eq!(
        b.registry().view().allow_list(&acme),
        Some(vec![id("demo.a.x")])
    );
}

#[tokio::test]
async fn a_stored_record_is_placed_as_its_committer_decided() {
    let (a, b, ledger) = two();
    a.register(&by(), &G, base("demo.a.x"), true).await.unwrap();
    b.apply_stored(ledger.fetch(&[key("demo.a.x")]).await.unwrap());
    // A replaces the tool: unregistered, then a new one registered (not enabled).
    a.unregister(&by(), &G, &id("demo.a.x")).await.unwrap();
    let mut v2 = base("demo.a.x");
    v2.version = "2.0.0".parse().unwrap();
    a.register(&by(), &G, v2, false).await.unwrap();
    // B hears only of the last record: `enabled → registered` is no lifecycle
    // move, but the record is what the tool is now, so B takes it as it is.
    let last = ledger.fetch(&[key("demo.a.x")]).await.unwrap();
    assert_eq!(last[0].revision, 3);
    let report = b.apply_stored(last);
    assert_eq!(report.placed, vec![key("demo.a.x")]);
    assert_eq!(b.registry().export(), a.registry().export());
    assert_eq!(state(b.registry(), "demo.a.x"), Some(ToolState::Registered));
    // And B's next change starts from it.
    b.set_state(&by(), &G, &id("demo.a.x"), StateChange::Enable)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_override_conflicts_with_a_concurrent_change_of_its_tool() {
    let (a, b, ledger) = two();
    let acme = TenantId::new("acme").unwrap();
    a.register(&by(), &G, base("demo.a.x"), false)
        .await
        .unwrap();
    b.apply_stored(ledger.fetch(&[key("demo.a.x")]).await.unwrap());
    // A unregisters the tool (dropping the enabling overrides it knows of);
    // meanwhile B, which has not heard of it, enables it for a tenant.
    a.unregister(&by(), &G, &id("demo.a.x")).await.unwrap();
    let err = b
        .set_tenant_override(&by(), &acme, &id("demo.a.x"), Some(TenantOverride::Enabled))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::RegistryConflict);
    assert_eq!(err.field("reason"), Some("stale_revision"));
    let over = RecordKey::Override {
        tenant: acme,
        id: id("demo.a.x"),
    };
    assert!(
        ledger.fetch(&[over]).await.unwrap().is_empty(),
        "nothing committed"
    );
    // B took the newer record: the tool is gone there too.
    assert_eq!(state(b.registry(), "demo.a.x"), None);
}

#[tokio::test]
async fn state_only_records_keep_the_local_manifest_and_existence() {
    let ledger = Arc::new(MemoryLedger::default());
    let policy = |k: &RecordKey| match k {
        RecordKey::Tool { id, .. } if id.group() == "soulbase" => Take::StateOnly,
        _ => Take::Whole,
    };
    let a = RegistryAdmin::new(Registry::new(), ledger.clone());
    let local = Registry::new();
    local.register(base("soulbase.builtin.x")).unwrap();
    local.enable(&G, &id("soulbase.builtin.x")).unwrap();
    let b = RegistryAdmin::with_take_policy(local.clone(), ledger.clone(), Arc::new(policy));
    // Another process's older definition of the builtin, paused.
    let mut old = base("soulbase.builtin.x");
    old.description = "an older build's description".into();
    a.register(&by(), &G, old, true).await.unwrap();
    a.set_state(&by(), &G, &id("soulbase.builtin.x"), StateChange::Pause)
        .await
        .unwrap();
    a.register(&by(), &G, base("soulbase.builtin.gone"), true)
        .await
        .unwrap();
    let stored = ledger
        .fetch(&[key("soulbase.builtin.x"), key("soulbase.builtin.gone")])
        .await
        .unwrap();
    let report = b.apply_stored(stored);
    // The state is taken, the manifest is this build's own, and a builtin this
    // build does not have is not created (nor counted as placed).
    assert_eq!(report.placed, vec![key("soulbase.builtin.x")]);
    let held = local
        .get(&TenantId::global(), &id("soulbase.builtin.x"))
        .unwrap();
    assert_eq!(held.state, ToolState::Paused);
    assert_ne!(
        held.tool.manifest.description,
        "an older build's description"
    );
    assert_eq!(state(&local, "soulbase.builtin.gone"), None);
}

/// Every committed change is one audit record naming who made it, the tenant
/// whose view changed, the target and the record's hash before and after; a
/// refused change and a change that changed nothing record nothing, and
/// records applied from another process were audited there.
#[tokio::test]
async fn every_committed_change_is_audited_once_with_its_actor_and_hashes() {
    use soulbase_observe::{AuditFilter, AuditKind, AuditLog, MemoryAuditLog};
    let ledger = Arc::new(MemoryLedger::default());
    let log = Arc::new(MemoryAuditLog::new());
    let a = RegistryAdmin::new(Registry::new(), ledger.clone()).with_audit(log.clone());
    let acme = TenantId::new("acme").unwrap();
    let own = ToolOwner::Tenant(acme.clone());
    a.register(&by(), &G, base("demo.a.x"), false)
        .await
        .unwrap();
    a.set_state(&by(), &G, &id("demo.a.x"), StateChange::Enable)
        .await
        .unwrap();
    // Refused (a registered tool cannot be paused), then changing nothing.
    a.set_state(&by(), &G, &id("demo.a.y"), StateChange::Pause)
        .await
        .unwrap_err();
    a.set_state(&by(), &G, &id("demo.a.x"), StateChange::Enable)
        .await
        .unwrap();
    a.register(&by(), &own, base("acme.own.tool"), true)
        .await
        .unwrap();
    a.set_tenant_override(&by(), &acme, &id("demo.a.x"), Some(TenantOverride::Paused))
        .await
        .unwrap();
    a.set_allow_list(&by(), &acme, Some([id("demo.a.x")].into_iter().collect()))
        .await
        .unwrap();
    let mut v2 = base("demo.a.x");
    v2.version = "1.1.0".parse().unwrap();
    a.update(&by(), &G, v2).await.unwrap();
    a.unregister(&by(), &own, &id("acme.own.tool"))
        .await
        .unwrap();
    let records = log.records();
    let kinds: Vec<(AuditKind, &str, &str)> = records
        .iter()
        .map(|r| (r.kind, r.tenant.as_str(), r.target.as_str()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (AuditKind::RegistryRegister, "global", "demo.a.x"),
            (AuditKind::RegistryState, "global", "demo.a.x"),
            (AuditKind::RegistryRegister, "acme", "acme.own.tool"),
            (AuditKind::RegistryOverride, "acme", "demo.a.x"),
            (AuditKind::RegistryAllowList, "acme", "acme"),
            (AuditKind::RegistryUpdate, "global", "demo.a.x"),
            (AuditKind::RegistryUnregister, "acme", "acme.own.tool"),
        ]
    );
    for r in &records {
        assert_eq!((r.actor.as_str(), r.actor_tenant.as_str()), ("ops", "acme"));
        assert_ne!(r.before_hash, r.after_hash, "{r:?}");
    }
    // Registered: nothing before; the state change starts where it ended.
    assert_eq!(records[0].before_hash, None);
    assert_eq!(records[1].before_hash, records[0].after_hash);
    assert_eq!(
        records[1].detail,
        "version 1.0.0, registered → version 1.0.0, enabled"
    );
    assert_eq!(records[5].before_hash, records[1].after_hash);
    assert_eq!(records[6].after_hash, None, "removed");
    // Another process applying the committed records audits nothing.
    let log_b = Arc::new(MemoryAuditLog::new());
    let b = RegistryAdmin::new(Registry::new(), ledger.clone()).with_audit(log_b.clone());
    b.apply_stored(ledger.fetch(&[key("demo.a.x")]).await.unwrap());
    assert!(
        log_b
            .list(&AuditFilter::newest(10))
            .await
            .unwrap()
            .is_empty()
    );
}
