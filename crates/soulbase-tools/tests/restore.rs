//! `Registry::restore`: one published snapshot, states placed directly, failures
//! reported, and every part of an export (overrides of tools a tenant cannot see
//! included) survives export → restore.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::base;
use soulbase_errors::ErrorCode;
use soulbase_tools::Registry;
use soulbase_tools::registry::{RegistryEvent, TenantOverride, ToolOwner, ToolState};
use soulbase_types::{TenantId, ToolId};

fn id(s: &str) -> ToolId {
    ToolId::new(s).unwrap()
}

fn t(s: &str) -> TenantId {
    TenantId::new(s).unwrap()
}

const G: ToolOwner = ToolOwner::Global;

fn drain(rx: &mut tokio::sync::broadcast::Receiver<RegistryEvent>) -> Vec<RegistryEvent> {
    let mut out = Vec::new();
    while let Ok(e) = rx.try_recv() {
        out.push(e);
    }
    out
}

#[test]
fn a_paused_tool_is_restored_paused_in_one_snapshot_never_enabled() {
    let source = Registry::new();
    source.register(base("demo.a.paused")).unwrap();
    source.enable(&G, &id("demo.a.paused")).unwrap();
    source.pause(&G, &id("demo.a.paused")).unwrap();
    source.register(base("demo.a.live")).unwrap();
    source.enable(&G, &id("demo.a.live")).unwrap();
    let export = source.export();

    let target = Registry::new();
    let mut rx = target.subscribe();
    let report = target.restore(export.clone());
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(report.restored, 2);
    assert_eq!(target.snapshot_version(), 1, "one published snapshot");
    assert_eq!(target.export(), export);
    let g = TenantId::global();
    assert_eq!(
        target.get(&g, &id("demo.a.paused")).unwrap().state,
        ToolState::Paused
    );
    // No event ever moved the paused tool to enabled.
    let events = drain(&mut rx);
    assert!(events.iter().all(|e| !matches!(e,
        RegistryEvent::StateChanged { id: i, to: ToolState::Enabled, .. } if i.as_str() == "demo.a.paused")));
    assert!(events.iter().any(|e| matches!(e,
        RegistryEvent::StateChanged { id: i, from: ToolState::Registered, to: ToolState::Paused, .. }
            if i.as_str() == "demo.a.paused")));

    // Restoring the same export again publishes nothing.
    let again = target.restore(export.clone());
    assert!(again.failed.is_empty(), "{:?}", again.failed);
    assert_eq!(again.restored, 2);
    assert_eq!(target.snapshot_version(), 1);
    assert!(drain(&mut rx).is_empty());
}

#[test]
fn an_existing_registered_tool_goes_straight_to_paused() {
    let source = Registry::new();
    source.register(base("demo.a.x")).unwrap();
    source.enable(&G, &id("demo.a.x")).unwrap();
    source.pause(&G, &id("demo.a.x")).unwrap();
    let target = Registry::new();
    target.register(base("demo.a.x")).unwrap();
    let before = target.snapshot_version();
    let report = target.restore(source.export());
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(target.snapshot_version(), before + 1);
    assert_eq!(
        target
            .get(&TenantId::global(), &id("demo.a.x"))
            .unwrap()
            .state,
        ToolState::Paused
    );
}

#[test]
fn a_state_the_lifecycle_cannot_reach_is_reported_not_counted() {
    // Exported `registered`; the target already has it enabled.
    let source = Registry::new();
    source.register(base("demo.a.x")).unwrap();
    source.register(base("demo.a.y")).unwrap();
    let target = Registry::new();
    target.register(base("demo.a.x")).unwrap();
    target.enable(&G, &id("demo.a.x")).unwrap();
    let report = target.restore(source.export());
    assert_eq!(report.restored, 1, "only demo.a.y was restored");
    assert_eq!(report.failed.len(), 1);
    let (what, err) = &report.failed[0];
    assert!(what.contains("demo.a.x"), "{what}");
    assert_eq!(err.code(), ErrorCode::RegistryConflict);
    assert_eq!(err.field("from"), Some("enabled"));
    assert_eq!(err.field("to"), Some("registered"));
    assert_eq!(
        target
            .get(&TenantId::global(), &id("demo.a.x"))
            .unwrap()
            .state,
        ToolState::Enabled,
        "left as it was"
    );

    // Nothing leaves `deprecated` either.
    let source = Registry::new();
    source.register(base("demo.a.z")).unwrap();
    source.enable(&G, &id("demo.a.z")).unwrap();
    let target = Registry::new();
    target.register(base("demo.a.z")).unwrap();
    target.deprecate(&G, &id("demo.a.z")).unwrap();
    let report = target.restore(source.export());
    assert_eq!(report.restored, 0);
    assert_eq!(report.failed[0].1.field("from"), Some("deprecated"));
}

#[test]
fn overrides_of_unregistered_shadowed_and_hidden_tools_survive_export_and_restore() {
    let source = Registry::new();
    let beta = t("beta");
    let acme = t("acme");
    let gamma = t("gamma");
    // beta pauses a global tool, which is then unregistered: the override stays.
    source.register(base("demo.a.gone")).unwrap();
    source
        .set_tenant_override(&beta, &id("demo.a.gone"), Some(TenantOverride::Paused))
        .unwrap();
    source.unregister(&G, &id("demo.a.gone")).unwrap();
    // acme overrides a global tool, then shadows it with its own.
    source.register(base("demo.a.shared")).unwrap();
    source
        .set_tenant_override(&acme, &id("demo.a.shared"), Some(TenantOverride::Paused))
        .unwrap();
    source.register_for(&acme, base("demo.a.shared")).unwrap();
    // gamma overrides a global tool, then allow-lists something else.
    source
        .set_tenant_override(&gamma, &id("demo.a.shared"), Some(TenantOverride::Enabled))
        .unwrap();
    source
        .set_allow_list(&gamma, Some([id("demo.a.other")].into_iter().collect()))
        .unwrap();
    let export = source.export();
    assert_eq!(export.overrides.len(), 3, "{:?}", export.overrides);

    let target = Registry::new();
    let report = target.restore(export.clone());
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(target.export(), export);
    assert_eq!(target.snapshot_version(), 1);
    // Each still applies as before: the shadowing tool is acme's own.
    let r = target.get(&acme, &id("demo.a.shared")).unwrap();
    assert_eq!(r.owner, ToolOwner::Tenant(acme.clone()));
    assert_eq!(
        target.view().tenant_override(&beta, &id("demo.a.gone")),
        Some(TenantOverride::Paused)
    );
    assert_eq!(
        target.get(&gamma, &id("demo.a.shared")).unwrap_err().code(),
        ErrorCode::ToolNotFound
    );
}

#[test]
fn the_global_tenant_has_no_overrides_to_restore() {
    let source = Registry::new();
    source.register(base("demo.a.x")).unwrap();
    let mut export = source.export();
    export
        .overrides
        .push(soulbase_tools::registry::ExportedOverride {
            tenant: TenantId::global(),
            id: id("demo.a.x"),
            value: TenantOverride::Enabled,
        });
    let target = Registry::new();
    let report = target.restore(export);
    assert_eq!(report.restored, 1);
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].1.code(), ErrorCode::RegistryConflict);
}

#[test]
fn a_large_registry_restores_in_one_snapshot() {
    let source = Registry::new();
    let manifests: Vec<_> = (0..3_000)
        .map(|i| base(&format!("demo.g{}.t{i}", i % 50)))
        .collect();
    let report = source.load(
        &G,
        manifests,
        soulbase_tools::registry::LoadOptions::default(),
    );
    assert!(report.failed.is_empty());
    for i in (0..3_000).step_by(3) {
        source
            .enable(&G, &id(&format!("demo.g{}.t{i}", i % 50)))
            .unwrap();
    }
    let export = source.export();
    let target = Registry::new();
    let report = target.restore(export.clone());
    assert!(report.failed.is_empty());
    assert_eq!(report.restored, 3_000);
    assert_eq!(target.snapshot_version(), 1);
    assert_eq!(target.export(), export);
}
