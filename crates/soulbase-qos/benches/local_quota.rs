//! In-process quota decisions: reserve+settle with rate limits, with budgets, and check.
//!
//! `cargo xtask bench -p soulbase-qos --bench local_quota`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use soulbase_config::{BudgetWindow, QuotaBudget, QuotaLimit};
use soulbase_observe::BudgetUsage;
use soulbase_qos::{LocalQuota, QuotaGate, QuotaRequest};
use soulbase_types::{ActorId, Rate, TenantId, ToolId};

const N: usize = 200_000;

fn limit(tool: &str, rate: &str) -> QuotaLimit {
    QuotaLimit {
        tenant: "*".into(),
        tool: tool.into(),
        rate: Rate::parse(rate).unwrap(),
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn bench(name: &str, q: &LocalQuota, tenants: &[TenantId]) {
    let actor = ActorId::new("alice").unwrap();
    let tool = ToolId::new("fs.files.read").unwrap();
    let mut samples: Vec<Duration> = Vec::with_capacity(N);
    for i in 0..N + 10_000 {
        let req = QuotaRequest {
            tenant: &tenants[i % tenants.len()],
            actor: &actor,
            tool: &tool,
        };
        let t = Instant::now();
        let r = q.reserve(req).await.unwrap();
        q.settle(
            r,
            BudgetUsage {
                calls: 1,
                bytes_in: 10,
                bytes_out: 10,
                cpu_ms: 0,
            },
        )
        .await
        .unwrap();
        if i >= 10_000 {
            samples.push(t.elapsed());
        }
    }
    soulbase_testkit::report(name, samples);
}

async fn run() {
    let tenants: Vec<TenantId> = (0..100)
        .map(|i| TenantId::new(format!("tenant-{i}")).unwrap())
        .collect();
    let limits = [
        limit("*", "1000000000/sec"),
        limit("fs.*", "1000000000/sec"),
        limit("net.*", "10/min"),
    ];
    let rates = LocalQuota::new(&limits);
    bench("local reserve+settle (2 rate limits)", &rates, &tenants).await;

    let budgets = [QuotaBudget {
        tenant: "*".into(),
        tool: "*".into(),
        actor: "*".into(),
        per_actor: true,
        window: BudgetWindow::Day,
        calls: Some(u64::MAX / 4),
        bytes_in: None,
        bytes_out: Some(u64::MAX / 4),
        cpu_ms: None,
    }];
    let both = LocalQuota::with_budgets(&limits, &budgets);
    bench("local reserve+settle (2 limits + budget)", &both, &tenants).await;
}
