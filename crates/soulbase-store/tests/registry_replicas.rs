#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Replicas sharing one Postgres act as one registry: a change committed through
//! one reaches the others within a second (NOTIFY, or reading back after the
//! listening connection was lost), and concurrent changes to one tool resolve by
//! revision — one wins, the other is told `REGISTRY.CONFLICT`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::fresh_postgres_on;
use serde_json::json;
use soulbase_errors::ErrorCode;
use soulbase_store::{Db, RegistryStore};
use soulbase_tools::ToolManifest;
use soulbase_tools::registry::admin::{RegistryAdmin, StateChange};
use soulbase_tools::registry::{Registry, RegistryEvent, ToolOwner, ToolState};
use soulbase_types::{TenantId, ToolId};

/// How soon another replica must see a change (the bound).
const WITHIN: Duration = Duration::from_secs(1);

/// Who the test's registry changes are made by.
fn by() -> soulbase_types::Subject {
    soulbase_types::Subject::new(
        TenantId::new("acme").unwrap(),
        soulbase_types::ActorId::new("ops").unwrap(),
    )
}

fn manifest(id: &str) -> ToolManifest {
    ToolManifest::from_json_str(
        &json!({
            "id": id, "version": "1.0.0", "description": "a tool",
            "input_schema": {"type": "object"}, "output_schema": {"type": "object"},
            "side_effect": "none"
        })
        .to_string(),
    )
    .unwrap()
}

struct Replica {
    registry: Registry,
    admin: RegistryAdmin,
    follower: tokio::task::JoinHandle<()>,
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

/// A replica: its own registry and pool on the shared database, following it.
async fn replica(url: &str) -> Replica {
    let store = RegistryStore::new(Db::connect(url, false).await.unwrap());
    let registry = Registry::new();
    let admin = RegistryAdmin::new(registry.clone(), Arc::new(store.clone()));
    store.restore_into(&admin).await.unwrap();
    let follower = store.follow(admin.clone());
    Replica {
        registry,
        admin,
        follower,
    }
}

fn state(r: &Replica, id: &ToolId) -> Option<ToolState> {
    r.registry
        .list_owned(&ToolOwner::Global, &Default::default())
        .into_iter()
        .find(|t| t.id() == id)
        .map(|t| t.state)
}

/// Waits (bounded by [`WITHIN`]) until `r` holds `id` in `want` (`None`: absent).
async fn sees(r: &Replica, id: &ToolId, want: Option<ToolState>) {
    let mut events = r.registry.subscribe();
    let reached = tokio::time::timeout(WITHIN, async {
        while state(r, id) != want {
            let _ = events.recv().await;
        }
    })
    .await;
    assert!(
        reached.is_ok(),
        "{id} not {want:?} within {WITHIN:?}: {:?}",
        state(r, id)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_registry_changes_and_resolve_conflicts_by_revision() {
    let (_db, url) = fresh_postgres_on(&soulbase_testkit::database_url()).await;
    let a = replica(&url).await;
    let b = replica(&url).await;
    let c = replica(&url).await;
    let g = ToolOwner::Global;
    let id = ToolId::new("demo.shared.tool").unwrap();

    // Every change through A reaches B and C.
    let mut b_events = b.registry.subscribe_for(&TenantId::new("acme").unwrap());
    a.admin
        .register(&by(), &g, manifest("demo.shared.tool"), true)
        .await
        .unwrap();
    sees(&b, &id, Some(ToolState::Enabled)).await;
    sees(&c, &id, Some(ToolState::Enabled)).await;
    // …with the events that drive MCP list_changed and gRPC watchers.
    let first = tokio::time::timeout(WITHIN, b_events.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(first, RegistryEvent::Registered { ref id, .. } if id.as_str() == "demo.shared.tool"),
        "{first:?}"
    );
    a.admin
        .set_state(&by(), &g, &id, StateChange::Pause)
        .await
        .unwrap();
    sees(&b, &id, Some(ToolState::Paused)).await;
    sees(&c, &id, Some(ToolState::Paused)).await;

    // Concurrent changes to one tool from two replicas: one wins, the other is
    // refused (never a silent last writer), and all three end on the winner's.
    let ops = by();
    let (ra, rb) = tokio::join!(
        a.admin.set_state(&ops, &g, &id, StateChange::Enable),
        b.admin.set_state(&ops, &g, &id, StateChange::Deprecate)
    );
    let won = match (&ra, &rb) {
        (Ok(()), Err(e)) | (Err(e), Ok(())) => {
            assert_eq!(e.code(), ErrorCode::RegistryConflict, "{e}");
            assert_eq!(e.field("tool_id"), Some("demo.shared.tool"));
            if ra.is_ok() {
                ToolState::Enabled
            } else {
                ToolState::Deprecated
            }
        }
        other => panic!("exactly one change must win: {other:?}"),
    };
    for r in [&a, &b, &c] {
        sees(r, &id, Some(won)).await;
    }

    // A change committed while a replica's listening connection is down reaches
    // it all the same once it listens again (it reads everything back).
    let other = ToolId::new("demo.shared.other").unwrap();
    let admin_pool = sqlx::PgPool::connect(&url).await.unwrap();
    let killed: Vec<(bool,)> = sqlx::query_as(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND query LIKE 'LISTEN%'",
    )
    .fetch_all(&admin_pool)
    .await
    .unwrap();
    assert_eq!(killed.len(), 3, "three listening connections");
    a.admin
        .register(&by(), &g, manifest("demo.shared.other"), true)
        .await
        .unwrap();
    sees(&b, &other, Some(ToolState::Enabled)).await;
    sees(&c, &other, Some(ToolState::Enabled)).await;

    // Removal reaches the others too.
    c.admin.unregister(&by(), &g, &other).await.unwrap();
    sees(&a, &other, None).await;
    sees(&b, &other, None).await;
    admin_pool.close().await;
}
