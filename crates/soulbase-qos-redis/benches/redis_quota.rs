//! Redis quota decisions on loopback: reserve, reserve+settle with a budget, check.
//!
//! `cargo xtask bench -p soulbase-qos-redis --bench redis_quota` (needs `REDIS_URL`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use soulbase_config::{BudgetWindow, QuotaBudget, QuotaLimit};
use soulbase_observe::BudgetUsage;
use soulbase_qos::{QuotaGate, QuotaPlan, QuotaRequest};
use soulbase_qos_redis::{RedisQuota, RedisQuotaOptions};
use soulbase_types::{ActorId, Rate, TenantId, ToolId};

const N: usize = 20_000;

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let url = soulbase_testkit::redis_url();
    let mut options = RedisQuotaOptions::new(url);
    options.prefix = format!("{}:", soulbase_testkit::unique_name("bench_qos"));
    let limits = [QuotaLimit {
        tenant: "*".into(),
        tool: "*".into(),
        rate: Rate::parse("1000000000/sec").unwrap(),
    }];
    let budgets = [QuotaBudget {
        tenant: "*".into(),
        tool: "*".into(),
        actor: "*".into(),
        per_actor: false,
        window: BudgetWindow::Day,
        calls: Some(u64::MAX / 4),
        bytes_in: None,
        bytes_out: Some(u64::MAX / 4),
        cpu_ms: None,
    }];
    let rate_only = RedisQuota::new(options.clone(), QuotaPlan::new(&limits, &[])).unwrap();
    let with_budget = RedisQuota::new(options, QuotaPlan::new(&limits, &budgets)).unwrap();
    let tenant = TenantId::new("acme").unwrap();
    let actor = ActorId::new("alice").unwrap();
    let tool = ToolId::new("fs.files.read").unwrap();
    let req = QuotaRequest {
        tenant: &tenant,
        actor: &actor,
        tool: &tool,
    };
    for _ in 0..1_000 {
        let r = rate_only.reserve(req).await.unwrap();
        rate_only.settle(r, BudgetUsage::default()).await.unwrap();
    }
    let mut samples: Vec<Duration> = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        let r = rate_only.reserve(req).await.unwrap();
        rate_only.settle(r, BudgetUsage::default()).await.unwrap();
        samples.push(t.elapsed());
    }
    soulbase_testkit::report("redis reserve+settle (rate limit)", samples);

    let mut samples: Vec<Duration> = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        let r = with_budget.reserve(req).await.unwrap();
        samples.push(t.elapsed());
        with_budget
            .settle(
                r,
                BudgetUsage {
                    calls: 1,
                    bytes_in: 10,
                    bytes_out: 10,
                    cpu_ms: 1,
                },
            )
            .await
            .unwrap();
    }
    soulbase_testkit::report("redis reserve (rate + budget)", samples);

    let mut samples: Vec<Duration> = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        let r = with_budget.reserve(req).await.unwrap();
        with_budget
            .settle(
                r,
                BudgetUsage {
                    calls: 1,
                    bytes_in: 10,
                    bytes_out: 10,
                    cpu_ms: 1,
                },
            )
            .await
            .unwrap();
        samples.push(t.elapsed());
    }
    soulbase_testkit::report("redis reserve+settle (rate + budget)", samples);

    let mut samples: Vec<Duration> = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        with_budget.check(req).await.unwrap();
        samples.push(t.elapsed());
    }
    soulbase_testkit::report("redis check (dry run)", samples);
}
