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
    Record, RecordKey, RegistryEvent, TenantOverride, ToolOwner, ToolState,
};
use soulbase_types::{TenantId, ToolId};

const G: ToolOwner = ToolOwner::Global;

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
    a.register(&G, base("demo.a.x"), true).await.unwrap();
    assert_eq!(state(a.registry(), "demo.a.x"), Some(ToolState::Enabled));
    let stored = ledger.fetch(&[key("demo.a.x")]).await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].revision, 1);
    assert!(matches!(&stored[0].record, Some(Record::Tool(t)) if t.state == ToolState::Enabled));
    a.set_state(&G, &id("demo.a.x"), StateChange::Pause)
        .await
        .unwrap();
    assert_eq!(a.revision(&key("demo.a.x")), 2);
}

#[tokio::test]
async fn a_refused_change_commits_nothing() {
    let (a, _, ledger) = two();
    a.register(&G, base("demo.a.x"), false).await.unwrap();
    // registered → paused is not a legal move.
    let err = a
        .set_state(&G, &id("demo.a.x"), StateChange::Pause)
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::RegistryConflict);
    assert_eq!(
        ledger.fetch(&[key("demo.a.x")]).await.unwrap()[0].revision,
        1
    );
    // A change that changes nothing commits nothing.
    a.set_state(&G, &id("demo.a.x"), StateChange::Enable)
        .await
        .unwrap();
    a.set_state(&G, &id("demo.a.x"), StateChange::Enable)
        .await
        .unwrap();
    assert_eq!(a.revision(&key("demo.a.x")), 2);
}

#[tokio::test]
async fn a_stale_change_is_a_conflict_and_the_loser_takes_the_newer_record() {
    let (a, b, ledger) = two();
    a.register(&G, base("demo.a.x"), true).await.unwrap();
    b.apply_stored(ledger.fetch(&[key("demo.a.x")]).await.unwrap());
    assert_eq!(state(b.registry(), "demo.a.x"), Some(ToolState::Enabled));
    // A pauses; B, which has not heard of it, deprecates from the old revision.
    a.set_state(&G, &id("demo.a.x"), StateChange::Pause)
        .await
        .unwrap();
    let err = b
        .set_state(&G, &id("demo.a.x"), StateChange::Deprecate)
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::RegistryConflict);
    assert_eq!(err.field("tool_id"), Some("demo.a.x"));
    // Nothing of B's was committed, and B now holds A's record.
    assert_eq!(b.revision(&key("demo.a.x")), 2);
    assert_eq!(state(b.registry(), "demo.a.x"), Some(ToolState::Paused));
    // The retry starts from it and wins.
    b.set_state(&G, &id("demo.a.x"), StateChange::Deprecate)
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
    a.register(&G, base("demo.a.x"), true).await.unwrap();
    let v1 = ledger.fetch(&[key("demo.a.x")]).await.unwrap();
    a.set_state(&G, &id("demo.a.x"), StateChange::Pause)
        .await
        .unwrap();
    let v2 = ledger.fetch(&[key("demo.a.x")]).await.unwrap();
    let mut events = b.registry().subscribe();
    b.apply_stored(v2.clone());
    // An older record arriving late, or the same one again, changes nothing.
    assert_eq!(b.apply_stored(v1).restored, 0);
    assert_eq!(b.apply_stored(v2).restored, 0);
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
    a.unregister(&G, &id("demo.a.x")).await.unwrap();
    b.apply_stored(ledger.fetch(&[key("demo.a.x")]).await.unwrap());
    assert_eq!(state(b.registry(), "demo.a.x"), None);
}

#[tokio::test]
async fn every_record_a_change_touches_is_committed_together() {
    let (a, b, ledger) = two();
    let acme = TenantId::new("acme").unwrap();
    a.register(&G, base("demo.a.x"), false).await.unwrap();
    a.set_tenant_override(&acme, &id("demo.a.x"), Some(TenantOverride::Enabled))
        .await
        .unwrap();
    a.set_allow_list(&acme, Some([id("demo.a.x")].into_iter().collect()))
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
    a.unregister(&G, &id("demo.a.x")).await.unwrap();
    let stored: Vec<Committed> = ledger
        .fetch(&[key("demo.a.x"), over.clone(), allow.clone()])
        .await
        .unwrap();
    let revs: Vec<(u64, bool)> = stored
        .iter()
        .map(|c| (c.revision, c.record.is_some()))
        .collect();
    assert_eq!(revs, vec![(2, false), (2, false), (1, true)]);
    // Another process applying them ends in the same state.
    b.apply_stored(stored);
    assert_eq!(b.registry().export(), a.registry().export());
    assert_eq!(
        b.registry().view().allow_list(&acme),
        Some(vec![id("demo.a.x")])
    );
}
