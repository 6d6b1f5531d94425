//! Helpers shared by Soulbase's own tests and benchmarks.
//!
//! Only ever a `dev-dependency`: shipped crates must not link it. It holds the few
//! things every integration test and benchmark would otherwise repeat — where the
//! real Postgres and Redis are (as `cargo xtask test` provisions them), a unique name
//! for a throwaway database, and a percentile report for latency samples.

use std::time::Duration;

pub mod postgres;
pub mod skills;
pub mod volume;

pub use postgres::{PgCluster, find_binary, free_port};

/// The Postgres server URL for tests, from `DATABASE_URL`.
///
/// Panics with a message saying how to provide one: tests that need Postgres must
/// fail loudly rather than skip when it is missing.
pub fn database_url() -> String {
    service_url("DATABASE_URL", "Postgres")
}

/// The Redis server URL for tests, from `REDIS_URL`. Panics like [`database_url`].
pub fn redis_url() -> String {
    service_url("REDIS_URL", "Redis")
}

fn service_url(var: &str, what: &str) -> String {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => url,
        _ => panic!(
            "{var} is not set: this test needs a real {what}. Run the suite through \
             `cargo xtask test` (it provisions one), or set {var} yourself"
        ),
    }
}

/// A database name no other test run uses: `<prefix>_<uuid>` in lower case,
/// valid as an unquoted Postgres identifier and as a SQLite file stem.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// `base` (a Postgres server URL, with or without a database path) pointed at
/// database `name`, keeping any query string.
pub fn with_database(base: &str, name: &str) -> String {
    let (head, query) = match base.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (base, None),
    };
    let authority_end = head
        .find("://")
        .map(|i| i + 3)
        .and_then(|start| head[start..].find('/').map(|j| start + j))
        .unwrap_or(head.len());
    let mut url = format!("{}/{name}", &head[..authority_end]);
    if let Some(q) = query {
        url.push('?');
        url.push_str(q);
    }
    url
}

/// Latency percentiles of one benchmark, as printed by [`report`].
#[derive(Debug, Clone, Copy)]
pub struct Percentiles {
    /// Number of samples.
    pub n: usize,
    /// Median.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Slowest sample.
    pub max: Duration,
}

/// Sorts `samples`, prints one aligned line with their percentiles under `name`, and
/// returns them. Benchmarks report percentiles of individually timed operations,
/// never means.
pub fn report(name: &str, mut samples: Vec<Duration>) -> Percentiles {
    samples.sort_unstable();
    let at = |q: f64| {
        samples
            .get(((samples.len().saturating_sub(1)) as f64 * q) as usize)
            .copied()
            .unwrap_or_default()
    };
    let p = Percentiles {
        n: samples.len(),
        p50: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        max: samples.last().copied().unwrap_or_default(),
    };
    println!(
        "{name:<40} n={:<7} p50={:>9.2?} p90={:>9.2?} p99={:>9.2?} max={:>9.2?}",
        p.n, p.p50, p.p90, p.p99, p.max
    );
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_database_replaces_or_adds_the_path_and_keeps_the_query() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/test", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            with_database("postgres://postgres@h:1/a?sslmode=disable", "b"),
            "postgres://postgres@h:1/b?sslmode=disable"
        );
    }

    #[test]
    fn report_orders_samples_before_taking_percentiles() {
        let samples = (1..=100).rev().map(Duration::from_micros).collect();
        let p = report("t", samples);
        assert_eq!(p.n, 100);
        assert_eq!(p.p50, Duration::from_micros(50));
        assert_eq!(p.p99, Duration::from_micros(99));
        assert_eq!(p.max, Duration::from_micros(100));
    }

    #[test]
    fn unique_names_differ_and_are_identifiers() {
        let (a, b) = (unique_name("ev"), unique_name("ev"));
        assert_ne!(a, b);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        );
    }
}
