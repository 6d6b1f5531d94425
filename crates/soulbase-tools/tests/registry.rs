//! R2: lifecycle, tenancy, overrides, allow-lists, queries, events, loading.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeSet, HashMap};

use common::{base, with};
use serde_json::json;
use soulbase_errors::ErrorCode;
use soulbase_sandbox::CapabilityDomain;
use soulbase_tools::manifest::{SafetyClass, SideEffect};
use soulbase_tools::registry::{
    LoadOptions, OwnerFilter, RegistryEvent, TenantAccess, TenantOverride, ToolFilter, ToolOwner,
    ToolState, UpgradePolicy,
};
use soulbase_tools::{Registry, compile};
use soulbase_types::{TenantId, ToolId};
use tokio::sync::broadcast::error::TryRecvError;

fn id(s: &str) -> ToolId {
    ToolId::new(s).unwrap()
}

fn t(s: &str) -> TenantId {
    TenantId::new(s).unwrap()
}

const G: ToolOwner = ToolOwner::Global;

fn ids(list: &[soulbase_tools::ResolvedTool]) -> Vec<String> {
    list.iter().map(|r| r.id().to_string()).collect()
}

fn state_of(reg: &Registry, id_: &str) -> ToolState {
    reg.get(&TenantId::global(), &id(id_)).unwrap().state
}

#[test]
fn register_starts_registered_and_refuses_duplicates() {
    let reg = Registry::new();
    reg.register(base("a.b.c")).unwrap();
    assert_eq!(state_of(&reg, "a.b.c"), ToolState::Registered);
    let err = reg.register(base("a.b.c")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::RegistryConflict);
    assert_eq!(err.field("tool_id"), Some("a.b.c"));
}

#[test]
fn register_reports_manifest_problems() {
    let reg = Registry::new();
    let err = reg
        .register(with("a.b.c", |v| v["description"] = json!("")))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::ManifestInvalid);
    assert!(err.field("problems").unwrap().contains("description"));
    assert_eq!(reg.snapshot_version(), 0, "nothing was published");
}

#[test]
fn every_legal_transition() {
    use ToolState::*;
    let reg = Registry::new();
    let a = id("a.b.c");
    reg.register(base("a.b.c")).unwrap();
    reg.enable(&G, &a).unwrap();
    assert_eq!(state_of(&reg, "a.b.c"), Enabled);
    reg.pause(&G, &a).unwrap();
    assert_eq!(state_of(&reg, "a.b.c"), Paused);
    reg.enable(&G, &a).unwrap();
    assert_eq!(state_of(&reg, "a.b.c"), Enabled);
    reg.disable(&G, &a).unwrap();
    assert_eq!(state_of(&reg, "a.b.c"), Paused);
    reg.deprecate(&G, &a).unwrap();
    assert_eq!(state_of(&reg, "a.b.c"), Deprecated);

    // registered → deprecated and enabled → deprecated.
    for (name, setup) in [("r.r.r", vec![]), ("e.e.e", vec![Enabled])] {
        reg.register(base(name)).unwrap();
        for s in setup {
            assert_eq!(s, Enabled);
            reg.enable(&G, &id(name)).unwrap();
        }
        reg.deprecate(&G, &id(name)).unwrap();
        assert_eq!(state_of(&reg, name), Deprecated);
    }

    // Any state → removed.
    for name in ["a.b.c", "r.r.r"] {
        reg.unregister(&G, &id(name)).unwrap();
        assert_eq!(
            reg.get(&TenantId::global(), &id(name)).unwrap_err().code(),
            ErrorCode::ToolNotFound
        );
    }
    reg.register(base("x.y.z")).unwrap();
    reg.unregister(&G, &id("x.y.z")).unwrap();
}

#[test]
fn every_illegal_transition_is_a_conflict_naming_from_and_to() {
    use ToolState::*;
    let reg = Registry::new();
    let a = id("a.b.c");
    reg.register(base("a.b.c")).unwrap();

    // registered → paused
    let err = reg.pause(&G, &a).unwrap_err();
    assert_eq!(err.code(), ErrorCode::RegistryConflict);
    assert_eq!(err.field("from"), Some("registered"));
    assert_eq!(err.field("to"), Some("paused"));

    // deprecated → enabled / paused
    reg.deprecate(&G, &a).unwrap();
    for (op, to) in [
        (
            Registry::enable as fn(&Registry, &ToolOwner, &ToolId) -> _,
            "enabled",
        ),
        (Registry::pause, "paused"),
    ] {
        let err = op(&reg, &G, &a).unwrap_err();
        assert_eq!(err.code(), ErrorCode::RegistryConflict);
        assert_eq!(err.field("from"), Some("deprecated"));
        assert_eq!(err.field("to"), Some(to));
        assert!(err.message().contains("deprecated") && err.message().contains(to));
    }
    assert_eq!(state_of(&reg, "a.b.c"), Deprecated);

    // The state table itself.
    let all = [Registered, Enabled, Paused, Deprecated];
    let legal = [
        (Registered, Enabled),
        (Enabled, Paused),
        (Paused, Enabled),
        (Registered, Deprecated),
        (Enabled, Deprecated),
        (Paused, Deprecated),
    ];
    for from in all {
        for to in all {
            assert_eq!(
                from.can_transition_to(to),
                legal.contains(&(from, to)),
                "{from} → {to}"
            );
        }
    }
}

#[test]
fn same_state_is_a_no_op() {
    let reg = Registry::new();
    let a = id("a.b.c");
    reg.register(base("a.b.c")).unwrap();
    reg.enable(&G, &a).unwrap();
    let v = reg.snapshot_version();
    reg.enable(&G, &a).unwrap();
    assert_eq!(reg.snapshot_version(), v);
}

#[test]
fn operations_on_unknown_tools_are_not_found() {
    let reg = Registry::new();
    let a = id("a.b.c");
    for r in [
        reg.enable(&G, &a),
        reg.pause(&G, &a),
        reg.deprecate(&G, &a),
        reg.unregister(&G, &a),
        reg.update(&G, base("a.b.c")).map(|_| ()),
    ] {
        assert_eq!(r.unwrap_err().code(), ErrorCode::ToolNotFound);
    }
}

#[test]
fn resolve_requires_enabled() {
    let reg = Registry::new();
    let a = id("a.b.c");
    let tenant = t("acme");
    reg.register(base("a.b.c")).unwrap();
    let err = reg.resolve(&tenant, &a).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ToolDisabled);
    assert_eq!(err.field("state"), Some("registered"));
    reg.enable(&G, &a).unwrap();
    let r = reg.resolve(&tenant, &a).unwrap();
    assert_eq!(r.state, ToolState::Enabled);
    assert_eq!(r.owner, ToolOwner::Global);
    reg.pause(&G, &a).unwrap();
    assert_eq!(
        reg.resolve(&tenant, &a).unwrap_err().code(),
        ErrorCode::ToolDisabled
    );
    reg.deprecate(&G, &a).unwrap();
    assert_eq!(
        reg.resolve(&tenant, &a).unwrap_err().code(),
        ErrorCode::ToolDisabled
    );
    assert_eq!(
        reg.resolve(&tenant, &id("no.such.tool"))
            .unwrap_err()
            .code(),
        ErrorCode::ToolNotFound
    );
}

#[test]
fn tenants_never_see_each_others_tools() {
    let reg = Registry::new();
    let (a, b) = (t("tenant-a"), t("tenant-b"));
    let secret = id("a.private.tool");
    reg.register_for(&a, base("a.private.tool")).unwrap();
    reg.enable(&ToolOwner::Tenant(a.clone()), &secret).unwrap();

    assert_eq!(
        reg.resolve(&a, &secret).unwrap().owner,
        ToolOwner::Tenant(a.clone())
    );
    for err in [
        reg.get(&b, &secret).unwrap_err(),
        reg.resolve(&b, &secret).unwrap_err(),
    ] {
        assert_eq!(
            err.code(),
            ErrorCode::ToolNotFound,
            "not FORBIDDEN: existence stays hidden"
        );
    }
    assert_eq!(
        reg.get(&TenantId::global(), &secret).unwrap_err().code(),
        ErrorCode::ToolNotFound
    );
    assert!(reg.list(&b, &ToolFilter::default()).is_empty());
    assert!(reg.available_specs(&b).is_empty());
    assert_eq!(ids(&reg.list_enabled(&a)), ["a.private.tool"]);

    // B cannot manage A's tool either.
    let err = reg
        .pause(&ToolOwner::Tenant(b.clone()), &secret)
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::ToolNotFound);
    let err = reg
        .set_tenant_override(&b, &secret, Some(TenantOverride::Paused))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::ToolNotFound);
}

#[test]
fn tenant_tools_shadow_global_ones() {
    let reg = Registry::new();
    let a = t("acme");
    let x = id("web.search.query");
    reg.register(base("web.search.query")).unwrap();
    reg.enable(&G, &x).unwrap();
    reg.register_for(
        &a,
        with("web.search.query", |v| {
            v["description"] = json!("Acme's own search.")
        }),
    )
    .unwrap();

    // Acme sees its own (registered, not enabled) version; others see the global one.
    let mine = reg.get(&a, &x).unwrap();
    assert_eq!(mine.owner, ToolOwner::Tenant(a.clone()));
    assert_eq!(mine.tool.manifest.description, "Acme's own search.");
    assert_eq!(
        reg.resolve(&a, &x).unwrap_err().code(),
        ErrorCode::ToolDisabled
    );
    assert_eq!(
        reg.resolve(&t("other"), &x).unwrap().owner,
        ToolOwner::Global
    );

    let listed = reg.list(&a, &ToolFilter::default());
    assert_eq!(listed.len(), 1, "no duplicate from the shadowed global");
    assert_eq!(listed[0].owner, ToolOwner::Tenant(a.clone()));

    reg.unregister(&ToolOwner::Tenant(a.clone()), &x).unwrap();
    assert_eq!(reg.get(&a, &x).unwrap().owner, ToolOwner::Global);
}

#[test]
fn per_tenant_overrides() {
    let reg = Registry::new();
    let (a, b) = (t("a"), t("b"));
    let x = id("g.p.x");
    reg.register(base("g.p.x")).unwrap();
    reg.enable(&G, &x).unwrap();

    // B pauses the global tool just for itself.
    reg.set_tenant_override(&b, &x, Some(TenantOverride::Paused))
        .unwrap();
    assert_eq!(
        reg.resolve(&b, &x).unwrap_err().code(),
        ErrorCode::ToolDisabled
    );
    assert!(reg.resolve(&a, &x).is_ok());
    assert!(reg.list_enabled(&b).is_empty());
    assert_eq!(ids(&reg.list_enabled(&a)), ["g.p.x"]);
    assert_eq!(
        reg.view().tenant_override(&b, &x),
        Some(TenantOverride::Paused)
    );
    assert_eq!(
        ids(&reg.list(
            &b,
            &ToolFilter {
                state: Some(ToolState::Paused),
                ..Default::default()
            }
        )),
        ["g.p.x"]
    );

    // A global pause wins over a tenant's "enabled".
    reg.set_tenant_override(&a, &x, Some(TenantOverride::Enabled))
        .unwrap();
    reg.pause(&G, &x).unwrap();
    assert_eq!(
        reg.resolve(&a, &x).unwrap_err().code(),
        ErrorCode::ToolDisabled
    );
    reg.enable(&G, &x).unwrap();

    // Clearing restores the global state.
    reg.set_tenant_override(&b, &x, None).unwrap();
    assert!(reg.resolve(&b, &x).is_ok());
    assert_eq!(reg.view().tenant_override(&b, &x), None);

    // A tenant may opt in to a tool that is only registered globally.
    let y = id("g.p.y");
    reg.register(base("g.p.y")).unwrap();
    reg.set_tenant_override(&a, &y, Some(TenantOverride::Enabled))
        .unwrap();
    assert!(reg.resolve(&a, &y).is_ok());
    assert_eq!(
        reg.resolve(&b, &y).unwrap_err().code(),
        ErrorCode::ToolDisabled
    );
    assert_eq!(ids(&reg.list_enabled(&a)), ["g.p.x", "g.p.y"]);

    // Overrides need an existing global tool; the global tenant has none.
    assert_eq!(
        reg.set_tenant_override(&a, &id("no.such.tool"), Some(TenantOverride::Paused))
            .unwrap_err()
            .code(),
        ErrorCode::ToolNotFound
    );
    assert_eq!(
        reg.set_tenant_override(&TenantId::global(), &x, Some(TenantOverride::Paused))
            .unwrap_err()
            .code(),
        ErrorCode::RegistryConflict
    );

    // A tenant's opt-in was about the tool it saw. Unregistered and replaced by
    // another tool under the same id, the newcomer is not enabled for that tenant;
    // a restrictive override (pause) stays as the tenant's policy about the id.
    reg.set_tenant_override(&b, &y, Some(TenantOverride::Paused))
        .unwrap();
    reg.unregister(&G, &y).unwrap();
    reg.register(base("g.p.y")).unwrap();
    assert_eq!(reg.view().tenant_override(&a, &y), None);
    assert_eq!(
        reg.resolve(&a, &y).unwrap_err().code(),
        ErrorCode::ToolDisabled
    );
    assert_eq!(
        reg.view().tenant_override(&b, &y),
        Some(TenantOverride::Paused)
    );
}

#[test]
fn allow_lists_restrict_global_tools_only() {
    let reg = Registry::new();
    let a = t("a");
    for name in ["g.p.one", "g.p.two", "g.p.three"] {
        reg.register(base(name)).unwrap();
        reg.enable(&G, &id(name)).unwrap();
    }
    reg.register_for(&a, base("own.p.tool")).unwrap();
    reg.enable(&ToolOwner::Tenant(a.clone()), &id("own.p.tool"))
        .unwrap();

    reg.set_allow_list(&a, Some(BTreeSet::from([id("g.p.two")])))
        .unwrap();
    assert_eq!(ids(&reg.list_enabled(&a)), ["g.p.two", "own.p.tool"]);
    assert_eq!(
        reg.get(&a, &id("g.p.one")).unwrap_err().code(),
        ErrorCode::ToolNotFound
    );
    assert_eq!(reg.view().allow_list(&a), Some(vec![id("g.p.two")]));
    // Other tenants are unaffected.
    assert_eq!(reg.list_enabled(&t("b")).len(), 3);

    reg.set_allow_list(&a, None).unwrap();
    assert_eq!(reg.list_enabled(&a).len(), 4);
}

#[test]
fn configured_access_applies_on_top_of_the_stored_one() {
    let reg = Registry::new();
    let a = t("a");
    for name in ["g.p.one", "g.p.two", "g.p.three"] {
        reg.register(base(name)).unwrap();
        reg.enable(&G, &id(name)).unwrap();
    }
    reg.set_allow_list(&a, Some(BTreeSet::from([id("g.p.one"), id("g.p.two")])))
        .unwrap();
    reg.set_tenant_override(&a, &id("g.p.two"), Some(TenantOverride::Paused))
        .unwrap();
    let mut events = reg.subscribe();
    // The configuration: a narrower allow-list, and g.p.two enabled for `a`.
    let access = TenantAccess {
        allow: Some(BTreeSet::from([id("g.p.two"), id("g.p.three")])),
        overrides: [(id("g.p.two"), TenantOverride::Enabled)].into(),
    };
    reg.set_configured(HashMap::from([(a.clone(), access.clone())]));
    assert_eq!(
        events.try_recv().unwrap(),
        RegistryEvent::AllowListChanged { tenant: a.clone() }
    );
    // Both allow-lists must admit a tool; the configured override wins.
    assert_eq!(ids(&reg.list_enabled(&a)), ["g.p.two"]);
    assert_eq!(
        reg.get(&a, &id("g.p.two")).unwrap().state,
        ToolState::Enabled
    );
    for hidden in ["g.p.one", "g.p.three"] {
        assert_eq!(
            reg.get(&a, &id(hidden)).unwrap_err().code(),
            ErrorCode::ToolNotFound
        );
    }
    assert_eq!(
        ids(&reg.list(
            &a,
            &ToolFilter {
                state: Some(ToolState::Enabled),
                ..Default::default()
            }
        )),
        ["g.p.two"]
    );
    assert_eq!(reg.view().configured(&a), Some(&access));
    assert_eq!(
        reg.list_enabled(&t("b")).len(),
        3,
        "other tenants unaffected"
    );
    // The same configuration again changes nothing and says nothing.
    reg.set_configured(HashMap::from([(a.clone(), access)]));
    assert_eq!(events.try_recv().unwrap_err(), TryRecvError::Empty);
    // Dropped from the configuration: the stored rules alone apply again.
    reg.set_configured(HashMap::new());
    assert_eq!(ids(&reg.list_enabled(&a)), ["g.p.one"]);
    assert_eq!(
        reg.get(&a, &id("g.p.two")).unwrap().state,
        ToolState::Paused
    );
    assert_eq!(
        events.try_recv().unwrap(),
        RegistryEvent::AllowListChanged { tenant: a.clone() }
    );
}

#[test]
fn filters_use_the_indexes_and_combine_with_and() {
    let reg = Registry::new();
    let a = t("acme");
    let add = |owner: &ToolOwner, name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let m = with(name, |v| edit(v));
        reg.register_in(owner, m).unwrap();
        reg.enable(owner, &id(name)).unwrap();
    };
    add(&G, "fs.files.read", &|v| {
        v["tags"] = json!(["files", "Read-Only"]);
        v["side_effect"] = json!("read");
        v["capabilities"] = json!([{"kind": "fs", "paths": ["/data"]}]);
        v["description"] = json!("Reads a FILE from the data directory.");
    });
    add(&G, "fs.files.write", &|v| {
        v["tags"] = json!(["files"]);
        v["side_effect"] = json!("write");
        v["safety_class"] = json!("high");
        v["consent"] = json!({"required": true});
        v["capabilities"] = json!([{"kind": "fs", "paths": ["/data"], "access": ["write"]}, {"kind": "tmp", "max_bytes": 1024}]);
    });
    add(&G, "web.search.query", &|v| {
        v["tags"] = json!(["web"]);
        v["side_effect"] = json!("network");
        v["display_name"] = json!("Web Search");
        v["capabilities"] = json!([{"kind": "net", "hosts": ["search.example.com"]}]);
    });
    add(&ToolOwner::Tenant(a.clone()), "acme.crm.lookup", &|v| {
        v["tags"] = json!(["crm", "files"]);
    });
    reg.register(base("misc.util.echo")).unwrap(); // registered only

    let q = |f: ToolFilter| ids(&reg.list(&a, &f));
    assert_eq!(
        q(ToolFilter {
            group: Some("fs".into()),
            ..Default::default()
        }),
        ["fs.files.read", "fs.files.write"]
    );
    assert_eq!(
        q(ToolFilter {
            tag: Some("FILES".into()),
            ..Default::default()
        }),
        ["acme.crm.lookup", "fs.files.read", "fs.files.write"]
    );
    assert_eq!(
        q(ToolFilter {
            tag: Some("read-only".into()),
            ..Default::default()
        }),
        ["fs.files.read"]
    );
    assert_eq!(
        q(ToolFilter {
            safety_class: Some(SafetyClass::High),
            ..Default::default()
        }),
        ["fs.files.write"]
    );
    assert_eq!(
        q(ToolFilter {
            side_effect: Some(SideEffect::Network),
            ..Default::default()
        }),
        ["web.search.query"]
    );
    assert_eq!(
        q(ToolFilter {
            capability: Some(CapabilityDomain::Fs),
            ..Default::default()
        }),
        ["fs.files.read", "fs.files.write"]
    );
    assert_eq!(
        q(ToolFilter {
            capability: Some(CapabilityDomain::Tmp),
            ..Default::default()
        }),
        ["fs.files.write"]
    );
    assert_eq!(
        q(ToolFilter {
            keyword: Some("file".into()),
            ..Default::default()
        }),
        ["fs.files.read"],
        "description, case-insensitive"
    );
    assert_eq!(
        q(ToolFilter {
            keyword: Some("web search".into()),
            ..Default::default()
        }),
        ["web.search.query"],
        "display name"
    );
    assert_eq!(
        q(ToolFilter {
            state: Some(ToolState::Registered),
            ..Default::default()
        }),
        ["misc.util.echo"]
    );
    assert_eq!(
        q(ToolFilter {
            owner: Some(OwnerFilter::Tenant),
            ..Default::default()
        }),
        ["acme.crm.lookup"]
    );
    assert_eq!(
        q(ToolFilter {
            owner: Some(OwnerFilter::Global),
            tag: Some("files".into()),
            ..Default::default()
        }),
        ["fs.files.read", "fs.files.write"]
    );
    // AND across criteria.
    assert_eq!(
        q(ToolFilter {
            tag: Some("files".into()),
            side_effect: Some(SideEffect::Write),
            ..Default::default()
        }),
        ["fs.files.write"]
    );
    assert!(
        q(ToolFilter {
            tag: Some("web".into()),
            group: Some("fs".into()),
            ..Default::default()
        })
        .is_empty()
    );
    assert!(
        q(ToolFilter {
            tag: Some("nope".into()),
            ..Default::default()
        })
        .is_empty()
    );
    assert_eq!(q(ToolFilter::default()).len(), 5);
    assert_eq!(
        reg.list(&t("other"), &ToolFilter::default()).len(),
        4,
        "no acme tool"
    );

    // The operator's view of one owner, with own states.
    let owned = reg.list_owned(&ToolOwner::Tenant(a.clone()), &ToolFilter::default());
    assert_eq!(ids(&owned), ["acme.crm.lookup"]);
    assert_eq!(reg.list_owned(&G, &ToolFilter::enabled()).len(), 3);
    assert!(
        reg.list_owned(&ToolOwner::Tenant(t("nobody")), &ToolFilter::default())
            .is_empty()
    );
}

#[test]
fn state_filter_sees_overrides_in_both_directions() {
    let reg = Registry::new();
    let a = t("a");
    for name in ["g.p.one", "g.p.two", "g.p.three"] {
        reg.register(base(name)).unwrap();
    }
    reg.enable(&G, &id("g.p.one")).unwrap();
    reg.enable(&G, &id("g.p.two")).unwrap();
    reg.set_tenant_override(&a, &id("g.p.two"), Some(TenantOverride::Paused))
        .unwrap();
    reg.set_tenant_override(&a, &id("g.p.three"), Some(TenantOverride::Enabled))
        .unwrap();
    assert_eq!(ids(&reg.list_enabled(&a)), ["g.p.one", "g.p.three"]);
    let tagged = ToolFilter {
        state: Some(ToolState::Enabled),
        group: Some("g".into()),
        ..Default::default()
    };
    assert_eq!(ids(&reg.list(&a, &tagged)), ["g.p.one", "g.p.three"]);
    let other_group = ToolFilter {
        state: Some(ToolState::Enabled),
        group: Some("h".into()),
        ..Default::default()
    };
    assert!(reg.list(&a, &other_group).is_empty());
}

#[test]
fn update_checks_semver_and_keeps_state() {
    let reg = Registry::new();
    let x = id("w.f.get");
    reg.register(base("w.f.get")).unwrap();
    reg.enable(&G, &x).unwrap();

    let breaking = with("w.f.get", |v| {
        v["version"] = json!("1.1.0");
        v["input_schema"]["required"] = json!(["city", "days"]);
    });
    let err = reg.update(&G, breaking).unwrap_err();
    assert_eq!(err.code(), ErrorCode::RegistryConflict);
    assert!(
        err.field("problems")
            .unwrap()
            .contains("input_schema#/properties/days")
    );
    assert_eq!(
        reg.get(&TenantId::global(), &x)
            .unwrap()
            .tool
            .version()
            .to_string(),
        "1.0.0"
    );

    let additive = with("w.f.get", |v| {
        v["version"] = json!("1.1.0");
        v["input_schema"]["properties"]["units"] = json!({"type": "string"});
    });
    let compiled = reg.update(&G, additive).unwrap();
    let now = reg.resolve(&t("x"), &x).unwrap();
    assert_eq!(now.state, ToolState::Enabled, "state kept");
    assert_eq!(now.tool.version().to_string(), "1.1.0");
    assert_eq!(now.tool.digest, compiled.digest);

    let invalid = with("w.f.get", |v| {
        v["version"] = json!("2.0.0");
        v["description"] = json!("");
    });
    assert_eq!(
        reg.update(&G, invalid).unwrap_err().code(),
        ErrorCode::ManifestInvalid
    );
}

#[test]
fn events_are_published_in_order() {
    let reg = Registry::new();
    let mut rx = reg.subscribe();
    let x = id("a.b.c");
    let tenant = t("acme");
    reg.register(base("a.b.c")).unwrap();
    reg.enable(&G, &x).unwrap();
    reg.update(&G, with("a.b.c", |v| v["version"] = json!("1.0.1")))
        .unwrap();
    reg.set_tenant_override(&tenant, &x, Some(TenantOverride::Paused))
        .unwrap();
    reg.set_allow_list(&tenant, Some(BTreeSet::new())).unwrap();
    reg.register_for(&tenant, base("own.p.t")).unwrap();
    reg.unregister(&G, &x).unwrap();
    assert!(
        reg.pause(&G, &id("own.p.t")).is_err(),
        "errors publish nothing"
    );

    let v = |s: &str| semver::Version::parse(s).unwrap();
    let expected = vec![
        RegistryEvent::Registered {
            tenant: None,
            id: x.clone(),
            version: v("1.0.0"),
        },
        RegistryEvent::StateChanged {
            tenant: None,
            id: x.clone(),
            from: ToolState::Registered,
            to: ToolState::Enabled,
        },
        RegistryEvent::Updated {
            tenant: None,
            id: x.clone(),
            from: v("1.0.0"),
            to: v("1.0.1"),
        },
        RegistryEvent::OverrideChanged {
            tenant: tenant.clone(),
            id: x.clone(),
            value: Some(TenantOverride::Paused),
        },
        RegistryEvent::StateChanged {
            tenant: Some(tenant.clone()),
            id: x.clone(),
            from: ToolState::Enabled,
            to: ToolState::Paused,
        },
        RegistryEvent::AllowListChanged {
            tenant: tenant.clone(),
        },
        RegistryEvent::Registered {
            tenant: Some(tenant.clone()),
            id: id("own.p.t"),
            version: v("1.0.0"),
        },
        RegistryEvent::Unregistered {
            tenant: None,
            id: x.clone(),
            version: v("1.0.1"),
        },
    ];
    for e in expected {
        assert_eq!(rx.try_recv().unwrap(), e);
    }
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    assert_eq!(
        reg.snapshot_version(),
        7,
        "one snapshot per successful change"
    );
}

#[test]
fn views_are_consistent_snapshots() {
    let reg = Registry::new();
    let x = id("a.b.c");
    reg.register(base("a.b.c")).unwrap();
    reg.enable(&G, &x).unwrap();
    let before = reg.view();
    reg.pause(&G, &x).unwrap();
    assert!(
        before.resolve(&t("a"), &x).is_ok(),
        "an old view keeps answering from its instant"
    );
    assert!(
        reg.resolve(&t("a"), &x).is_err(),
        "new reads see the pause at once"
    );
    assert!(before.version() < reg.view().version());
    assert!(
        reg.available_specs(&t("a")).is_empty(),
        "disabled tools vanish from the available view"
    );
}

#[test]
fn available_specs_are_the_enabled_visible_tools() {
    let reg = Registry::new();
    let a = t("a");
    reg.register(base("g.p.on")).unwrap();
    reg.enable(&G, &id("g.p.on")).unwrap();
    reg.register(base("g.p.off")).unwrap();
    reg.register_for(&a, base("a.p.mine")).unwrap();
    reg.enable(&ToolOwner::Tenant(a.clone()), &id("a.p.mine"))
        .unwrap();
    let specs = reg.available_specs(&a);
    let names: Vec<String> = specs.iter().map(|s| s.id().to_string()).collect();
    assert_eq!(names, ["a.p.mine", "g.p.on"]);
    let spec = specs[1].spec();
    assert_eq!(spec.name, id("g.p.on"));
    assert_eq!(spec.input_schema["type"], "object");
    let json = serde_json::to_value(&spec).unwrap();
    assert_eq!(
        json.as_object().unwrap().len(),
        3,
        "only name, description, input_schema: {json}"
    );
}

#[test]
fn load_later_wins_and_bad_manifests_are_skipped() {
    let reg = Registry::new();
    let batch = vec![
        with("a.b.one", |v| v["description"] = json!("first")),
        with("a.b.bad", |v| v["description"] = json!("")),
        with("a.b.one", |v| v["description"] = json!("second")),
        base("a.b.two"),
    ];
    let report = reg.load(
        &G,
        batch,
        LoadOptions {
            enable_new: true,
            ..Default::default()
        },
    );
    assert_eq!(report.registered, [id("a.b.one"), id("a.b.two")]);
    assert_eq!(report.duplicates, [id("a.b.one")]);
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].index, 1);
    assert_eq!(report.failed[0].error.code(), ErrorCode::ManifestInvalid);
    let one = reg.resolve(&t("x"), &id("a.b.one")).unwrap();
    assert_eq!(one.tool.manifest.description, "second");

    // Reloading the same definitions changes nothing.
    let v = reg.snapshot_version();
    let report = reg.load(&G, vec![base("a.b.two")], LoadOptions::default());
    assert_eq!(report.unchanged, [id("a.b.two")]);
    assert_eq!(reg.snapshot_version(), v);

    // A breaking edit without a version bump: refused under Enforce, applied under Replace.
    let edited = || {
        with("a.b.two", |v| {
            v["input_schema"]["required"] = json!(["city", "days"])
        })
    };
    let report = reg.load(&G, vec![edited()], LoadOptions::default());
    assert_eq!(report.failed[0].error.code(), ErrorCode::RegistryConflict);
    let report = reg.load(
        &G,
        vec![edited()],
        LoadOptions {
            enable_new: false,
            upgrade: UpgradePolicy::Replace,
        },
    );
    assert_eq!(report.updated, [id("a.b.two")]);
    assert_eq!(
        reg.get(&TenantId::global(), &id("a.b.two")).unwrap().state,
        ToolState::Enabled,
        "state kept"
    );
}

#[test]
fn global_tenant_id_means_global_scope() {
    let reg = Registry::new();
    reg.register_for(&TenantId::global(), base("a.b.c"))
        .unwrap();
    assert_eq!(
        reg.get(&t("anyone"), &id("a.b.c")).unwrap().owner,
        ToolOwner::Global
    );
}

#[test]
fn clones_share_one_registry_across_threads() {
    let reg = Registry::new();
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let reg = reg.clone();
            std::thread::spawn(move || {
                for i in 0..25 {
                    let tool = compile(base(&format!("w{w}.p.t{i}"))).unwrap();
                    reg.register_compiled(&ToolOwner::Global, tool.into())
                        .unwrap();
                    reg.enable(&ToolOwner::Global, &id(&format!("w{w}.p.t{i}")))
                        .unwrap();
                }
            })
        })
        .collect();
    let reader = {
        let reg = reg.clone();
        std::thread::spawn(move || {
            let mut last = 0;
            for _ in 0..200 {
                let view = reg.view();
                assert!(view.version() >= last, "versions never go back");
                last = view.version();
                let n = view.list_enabled(&t("r")).len();
                assert!(n <= 100);
            }
        })
    };
    for w in writers {
        w.join().unwrap();
    }
    reader.join().unwrap();
    assert_eq!(reg.list_enabled(&t("r")).len(), 100);
    assert_eq!(reg.snapshot_version(), 200);
}

#[test]
fn results_are_in_id_order_whatever_the_registration_order() {
    let reg = Registry::new();
    let a = t("acme");
    let names = ["m.z.z", "a.a.b", "q.q.q", "a.a.a", "z.a.a", "b.c.d"];
    for (i, name) in names.iter().enumerate() {
        if i % 2 == 0 {
            reg.register(base(name)).unwrap();
            reg.enable(&G, &id(name)).unwrap();
        } else {
            reg.register_for(&a, base(name)).unwrap();
            reg.enable(&ToolOwner::Tenant(a.clone()), &id(name))
                .unwrap();
        }
    }
    let mut sorted = names.map(str::to_owned).to_vec();
    sorted.sort();
    assert_eq!(ids(&reg.list_enabled(&a)), sorted);
    assert_eq!(ids(&reg.list(&a, &ToolFilter::default())), sorted);
    let specs: Vec<String> = reg
        .available_specs(&a)
        .iter()
        .map(|s| s.id().to_string())
        .collect();
    assert_eq!(specs, sorted);
    assert_eq!(
        ids(&reg.list_owned(&G, &ToolFilter::default())),
        ["m.z.z", "q.q.q", "z.a.a"]
    );
}

#[test]
fn an_update_keeps_indexes_in_step() {
    let reg = Registry::new();
    let x = id("a.b.c");
    reg.register(with("a.b.c", |v| v["tags"] = json!(["old"])))
        .unwrap();
    reg.enable(&G, &x).unwrap();
    reg.update(
        &G,
        with("a.b.c", |v| {
            v["version"] = json!("1.0.1");
            v["tags"] = json!(["new"]);
        }),
    )
    .unwrap();
    let tag = |s: &str| {
        reg.list(
            &t("a"),
            &ToolFilter {
                tag: Some(s.into()),
                ..Default::default()
            },
        )
    };
    assert!(tag("old").is_empty());
    assert_eq!(ids(&tag("new")), ["a.b.c"]);
    assert_eq!(reg.list_enabled(&t("a")).len(), 1);
    reg.unregister(&G, &x).unwrap();
    assert!(tag("new").is_empty());
    assert!(reg.list_enabled(&t("a")).is_empty());
}

#[tokio::test]
async fn tenant_event_streams_carry_only_what_the_tenant_can_see() {
    let reg = Registry::new();
    let (a, b) = (t("a"), t("b"));
    let mut for_a = reg.subscribe_for(&a);
    let mut for_b = reg.subscribe_for(&b);
    // B sees only global tools on its allow-list.
    reg.set_allow_list(&b, Some(BTreeSet::from([id("g.p.shared")])))
        .unwrap();
    reg.register_for(&a, base("a.own.secret")).unwrap();
    reg.register(base("g.p.hidden")).unwrap();
    reg.register(base("g.p.shared")).unwrap();
    reg.set_tenant_override(&a, &id("g.p.shared"), Some(TenantOverride::Paused))
        .unwrap();
    reg.register_for(&b, base("b.own.tool")).unwrap();

    let mut seen_a = Vec::new();
    let mut seen_b = Vec::new();
    // A final marker visible to both ends each drain, so recv never waits forever.
    reg.register(base("g.p.marker")).unwrap();
    reg.set_allow_list(
        &b,
        Some(BTreeSet::from([id("g.p.shared"), id("g.p.marker")])),
    )
    .unwrap();
    reg.update(&G, with("g.p.marker", |v| v["version"] = json!("1.0.1")))
        .unwrap();
    loop {
        let e = for_a.recv().await.unwrap();
        let done = matches!(&e, RegistryEvent::Updated { id, .. } if id.as_str() == "g.p.marker");
        seen_a.push(e);
        if done {
            break;
        }
    }
    loop {
        let e = for_b.recv().await.unwrap();
        let done = matches!(&e, RegistryEvent::Updated { id, .. } if id.as_str() == "g.p.marker");
        seen_b.push(e);
        if done {
            break;
        }
    }
    let ids_in = |events: &[RegistryEvent]| -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                RegistryEvent::Registered { id, .. }
                | RegistryEvent::Updated { id, .. }
                | RegistryEvent::StateChanged { id, .. }
                | RegistryEvent::Unregistered { id, .. }
                | RegistryEvent::OverrideChanged { id, .. } => id.to_string(),
                RegistryEvent::AllowListChanged { tenant } => format!("allow:{tenant}"),
            })
            .collect()
    };
    let a_ids = ids_in(&seen_a);
    let b_ids = ids_in(&seen_b);
    assert!(a_ids.contains(&"a.own.secret".to_owned()), "{a_ids:?}");
    assert!(a_ids.contains(&"g.p.hidden".to_owned()), "{a_ids:?}");
    assert!(
        !a_ids
            .iter()
            .any(|i| i.starts_with("b.") || i.starts_with("allow:")),
        "{a_ids:?}"
    );
    assert!(b_ids.contains(&"b.own.tool".to_owned()), "{b_ids:?}");
    assert!(b_ids.contains(&"g.p.shared".to_owned()), "{b_ids:?}");
    assert!(
        !b_ids
            .iter()
            .any(|i| i.starts_with("a.") || i == "g.p.hidden"),
        "another tenant's tools and hidden globals never reach B: {b_ids:?}"
    );
    // A's override of the shared tool is A's business only.
    assert_eq!(
        seen_b
            .iter()
            .filter(|e| matches!(e, RegistryEvent::OverrideChanged { .. }))
            .count(),
        0
    );
}

/// `mcp_name` is unique in every tenant's view: a batch's second holder, a
/// tenant tool taking a global tool's name and a global tool taking a tenant's
/// are refused; a tool's own new version keeps its name; unregistering frees it.
#[test]
fn mcp_names_are_unique_in_every_view() {
    let named = |tool: &str, name: &str| with(tool, |m| m["mcp_name"] = json!(name));
    let reg = Registry::new();
    let report = reg.load(
        &G,
        vec![named("a.b.one", "plain"), named("a.b.two", "plain")],
        LoadOptions::default(),
    );
    assert_eq!(ids_of(&report.registered), ["a.b.one"]);
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].error.code(), ErrorCode::RegistryConflict);
    assert_eq!(
        reg.mcp_tool(&t("acme"), "plain").map(|i| i.to_string()),
        Some("a.b.one".to_owned())
    );
    let err = reg
        .register_for(&t("acme"), named("t.b.mine", "plain"))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::RegistryConflict);
    reg.register_for(&t("acme"), named("t.b.mine", "mine"))
        .unwrap();
    assert_eq!(
        reg.mcp_tool(&t("acme"), "mine").map(|i| i.to_string()),
        Some("t.b.mine".to_owned())
    );
    assert_eq!(reg.mcp_tool(&t("other"), "mine"), None);
    let err = reg.register(named("g.b.theirs", "mine")).unwrap_err();
    assert_eq!(err.code(), ErrorCode::RegistryConflict);
    // A new version of the holder keeps its own name.
    let next = with("a.b.one", |m| {
        m["mcp_name"] = json!("plain");
        m["version"] = json!("1.0.1");
    });
    reg.update(&G, next).unwrap();
    reg.unregister(&G, &id("a.b.one")).unwrap();
    assert_eq!(reg.mcp_tool(&t("acme"), "plain"), None);
    reg.register(named("a.b.two", "plain")).unwrap();
}

fn ids_of(list: &[ToolId]) -> Vec<String> {
    list.iter().map(ToString::to_string).collect()
}
