//! `GET /api/overview`: what the caller's tenant's calls did lately — the
//! console's overview page.
//!
//! Computed from the evidence store (the same calls `GET /api/evidence` lists:
//! only tools whose evidence the caller may read): over the last `window_s`
//! seconds, at most [`MAX_CALLS`] calls, newest first — how many, per second,
//! by status, by error code, each surface's and each tool's p50/p99 execution
//! time — and the calls refused before they ran, by code (at most [`MAX_CALLS`]
//! too). A caller of the `global` tenant (the operator) also gets the process's
//! evidence queue: records not yet in the store, written, quarantined, spool
//! bytes, drain lag.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use soulbase_errors::SoulError;
use soulbase_grpc::convert;
use soulbase_observe::{EndStatus, EvidenceQuery, MAX_PAGE};
use soulbase_types::{TenantId, ToolId, UnixMillis};

use crate::app::App;
use crate::evidence_api::{readable, readable_denials};
use crate::http_api::{answer, error_response, subject};

/// The window without `window_s`: five minutes.
pub const DEFAULT_WINDOW_S: u64 = 300;
/// The longest window: a day.
pub const MAX_WINDOW_S: u64 = 86_400;

/// The most calls one overview reads.
pub const MAX_CALLS: usize = 10_000;

/// `GET /api/overview` query.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OverviewQuery {
    /// The window, in seconds back from now (default 300, at most 86,400).
    #[schemars(with = "Option<u64>", range(min = 1, max = MAX_WINDOW_S))]
    pub window_s: Option<String>,
}

/// One tool's calls in the window.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ToolFigures {
    /// The tool.
    pub tool: ToolId,
    /// Calls that began in the window.
    pub calls: u64,
    /// Calls that ended other than `ok`.
    pub failed: u64,
    /// Median execution time of its ended calls, microseconds.
    pub p50_us: u64,
    /// 99th percentile, microseconds.
    pub p99_us: u64,
}

/// One surface's calls in the window.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct SurfaceFigures {
    /// `grpc`, `http`, `mcp`, `cli`, or `unrecorded` (calls made by linking the
    /// crates, and records written before the surface was recorded).
    pub surface: String,
    /// Calls that began in the window.
    pub calls: u64,
    /// Calls that ended other than `ok`.
    pub failed: u64,
    /// Median execution time of its ended calls, microseconds.
    pub p50_us: u64,
    /// 99th percentile, microseconds.
    pub p99_us: u64,
}

/// The process's evidence queue (for the operator).
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct EvidenceQueue {
    /// Records accepted and not yet in the store.
    pub depth: u64,
    /// Records this process wrote to the store.
    pub written: u64,
    /// Records the store refused for good (quarantined).
    pub quarantined: u64,
    /// Bytes in the spool.
    pub spool_bytes: u64,
    /// How long the store has been behind the spool, milliseconds: an upper
    /// bound on the age of the oldest record not yet in the store (0 while
    /// caught up).
    pub drain_lag_ms: u64,
}

/// `GET /api/overview`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Overview {
    /// The tenant.
    pub tenant: TenantId,
    /// The window, seconds.
    pub window_s: u64,
    /// When it was computed (Unix ms).
    pub at: UnixMillis,
    /// Calls that began in the window.
    pub calls: u64,
    /// `calls / window_s`.
    pub calls_per_second: f64,
    /// Whether more calls began in the window than were read ([`MAX_CALLS`]).
    pub truncated: bool,
    /// Calls by how they ended (`open` for those still running).
    pub by_status: BTreeMap<String, u64>,
    /// Failed calls by stable error code.
    pub by_code: BTreeMap<String, u64>,
    /// Each surface's figures, busiest first.
    pub surfaces: Vec<SurfaceFigures>,
    /// Each tool's figures, busiest first.
    pub tools: Vec<ToolFigures>,
    /// Calls refused before they ran in the window.
    pub denials: u64,
    /// Those refusals by stable error code.
    pub denials_by_code: BTreeMap<String, u64>,
    /// The evidence queue: for a caller of the `global` tenant only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<EvidenceQueue>,
}

fn window_of(q: &OverviewQuery) -> Result<u64, SoulError> {
    match q.window_s.as_deref() {
        None => Ok(DEFAULT_WINDOW_S),
        Some(w) => w
            .parse::<u64>()
            .ok()
            .filter(|n| (1..=MAX_WINDOW_S).contains(n))
            .ok_or_else(|| {
                convert::invalid(
                    "window_s",
                    format!("window_s must be between 1 and {MAX_WINDOW_S}"),
                )
            }),
    }
}

/// An End status as its JSON names it (`ok`, `error`, …).
fn status_text(s: EndStatus) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The `q`-th quantile of sorted `v` (0 when empty).
fn quantile(v: &[u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v[i.min(v.len() - 1)]
}

async fn overview(
    app: &App,
    headers: &HeaderMap,
    q: &OverviewQuery,
) -> Result<Overview, SoulError> {
    let subject = subject(app, headers).await?;
    let window_s = window_of(q)?;
    let now = UnixMillis::now();
    let from = UnixMillis(now.0.saturating_sub(window_s.saturating_mul(1_000) as i64));
    let mut calls = Vec::new();
    let mut truncated = false;
    if let Some(p) = &app.persistence {
        // What this process accepted a moment ago is read too (a call's End
        // reaches the store through the spool).
        crate::evidence_api::drained(app).await;
        let mut query = EvidenceQuery::tenant(subject.tenant.clone(), MAX_PAGE);
        query.from = Some(from);
        loop {
            let page = p.evidence.list(&query).await?;
            calls.extend(page.calls);
            if calls.len() >= MAX_CALLS {
                truncated = page.next.is_some() || calls.len() > MAX_CALLS;
                calls.truncate(MAX_CALLS);
                break;
            }
            match page.next {
                Some(next) => query.after = Some(next),
                None => break,
            }
        }
    }
    let calls = readable(
        app,
        &subject,
        calls,
        |c| c.tool_id.clone(),
        &mut HashMap::new(),
    )
    .await;
    let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_code: BTreeMap<String, u64> = BTreeMap::new();
    let mut per_tool: HashMap<ToolId, (u64, u64, Vec<u64>)> = HashMap::new();
    let mut per_surface: HashMap<String, (u64, u64, Vec<u64>)> = HashMap::new();
    let mut counted = 0u64;
    for call in calls {
        counted += 1;
        let status = call.status.map_or_else(|| "open".to_owned(), status_text);
        let failed = call.status.is_some_and(|s| s != EndStatus::Ok);
        *by_status.entry(status).or_default() += 1;
        if let Some(code) = call.error_code {
            *by_code.entry(code.as_str().to_owned()).or_default() += 1;
        }
        let surface = call
            .surface
            .map_or("unrecorded", soulbase_types::Surface::as_str);
        for entry in [
            per_tool.entry(call.tool_id).or_default(),
            per_surface.entry(surface.to_owned()).or_default(),
        ] {
            entry.0 += 1;
            entry.1 += u64::from(failed);
            if let Some(us) = call.duration_us {
                entry.2.push(us);
            }
        }
    }
    let mut tools: Vec<ToolFigures> = per_tool
        .into_iter()
        .map(|(tool, (calls, failed, mut us))| {
            us.sort_unstable();
            ToolFigures {
                tool,
                calls,
                failed,
                p50_us: quantile(&us, 0.5),
                p99_us: quantile(&us, 0.99),
            }
        })
        .collect();
    tools.sort_by(|a, b| b.calls.cmp(&a.calls).then_with(|| a.tool.cmp(&b.tool)));
    let mut surfaces: Vec<SurfaceFigures> = per_surface
        .into_iter()
        .map(|(surface, (calls, failed, mut us))| {
            us.sort_unstable();
            SurfaceFigures {
                surface,
                calls,
                failed,
                p50_us: quantile(&us, 0.5),
                p99_us: quantile(&us, 0.99),
            }
        })
        .collect();
    surfaces.sort_by(|a, b| {
        b.calls
            .cmp(&a.calls)
            .then_with(|| a.surface.cmp(&b.surface))
    });
    let (denials, denials_by_code) = denials_in(app, &subject, from).await?;
    let evidence = (subject.tenant == TenantId::global())
        .then(|| app.metrics.evidence_stats())
        .flatten()
        .map(|s| EvidenceQueue {
            depth: s.depth(),
            written: s.written(),
            quarantined: s.quarantined(),
            spool_bytes: s.spool_bytes(),
            drain_lag_ms: u64::try_from(s.drain_lag().as_millis()).unwrap_or(u64::MAX),
        });
    Ok(Overview {
        tenant: subject.tenant,
        window_s,
        at: now,
        calls: counted,
        calls_per_second: counted as f64 / window_s as f64,
        truncated,
        by_status,
        by_code,
        surfaces,
        tools,
        denials,
        denials_by_code,
        evidence,
    })
}

/// The caller's readable denials since `from` (at most [`MAX_CALLS`] read), and
/// how many of each code.
async fn denials_in(
    app: &App,
    subject: &soulbase_types::Subject,
    from: UnixMillis,
) -> Result<(u64, BTreeMap<String, u64>), SoulError> {
    let mut by_code: BTreeMap<String, u64> = BTreeMap::new();
    let mut count = 0u64;
    let Some(p) = &app.persistence else {
        return Ok((count, by_code));
    };
    let mut query = EvidenceQuery::tenant(subject.tenant.clone(), MAX_PAGE);
    query.from = Some(from);
    let mut cache = HashMap::new();
    let mut read = 0usize;
    loop {
        let page = p.evidence.list_denials(&query).await?;
        read += page.denials.len();
        for d in readable_denials(app, subject, page.denials, &mut cache).await? {
            count += 1;
            *by_code.entry(d.code.as_str().to_owned()).or_default() += 1;
        }
        match page.next {
            Some(next) if read < MAX_CALLS => query.after = Some(next),
            _ => break,
        }
    }
    Ok((count, by_code))
}

/// `GET /api/overview?window_s=`: the caller's tenant's recent calls, summed.
pub(crate) async fn get_overview(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    query: Result<Query<OverviewQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = query else {
        return error_response(&convert::invalid(
            "query",
            "unknown or malformed query parameter (window_s)",
        ));
    };
    answer(&app, StatusCode::OK, overview(&app, &headers, &q).await)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn quantiles_of_sorted_values() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), 51);
        assert_eq!(quantile(&v, 0.99), 99);
        assert_eq!(quantile(&[], 0.5), 0);
        assert_eq!(quantile(&[7], 0.99), 7);
    }

    #[test]
    fn the_window_is_bounded_and_named_when_bad() {
        assert_eq!(
            window_of(&OverviewQuery::default()).unwrap(),
            DEFAULT_WINDOW_S
        );
        for bad in ["0", "86401", "soon"] {
            let q = OverviewQuery {
                window_s: Some(bad.into()),
            };
            assert_eq!(
                window_of(&q).unwrap_err().field("field"),
                Some("window_s"),
                "{bad}"
            );
        }
    }
}
