//! Prometheus metrics, written in the text exposition format (0.0.4) by hand.
//!
//! - `soulbase_calls_total{surface,status}` — finished calls;
//! - `soulbase_denials_total{surface,code}` — calls and requests refused by
//!   governance (authentication, policy, consent, quota, …), by stable code;
//! - `soulbase_errors_total{surface,code}` — failed calls and malformed requests, by
//!   stable code;
//! - `soulbase_call_duration_seconds{surface}` — latency histogram;
//! - `soulbase_tool_calls_total{tool,status}` — finished calls by tool, for at most
//!   `observe.metrics_max_tools` tools (the rest as `tool="other"`);
//! - `soulbase_budget_consumed_total{tenant,resource}` — what calls were charged
//!   (`calls`, `bytes_in`, `bytes_out`, `cpu_ms`: the End's usage, as settled into
//!   budgets), for at most `observe.metrics_max_tenants` tenants (the rest as
//!   `tenant="other"`);
//! - `soulbase_consent_issued_total` — consent tokens issued (refusals are
//!   `soulbase_denials_total{code="CONSENT.REQUIRED"}`);
//! - `soulbase_budget_remaining_calls{tenant,tool}` — calls left under the tightest
//!   limit, as last seen by a preflight;
//! - `soulbase_evidence_queue_depth`, `soulbase_evidence_written_total`,
//!   `soulbase_evidence_quarantined_total`, `soulbase_evidence_drain_lag_seconds`;
//! - `soulbase_calls_in_flight`, `soulbase_registry_snapshot_version`;
//! - `soulbase_http_connections` (held by the HTTP listener, at most
//!   `server.max_connections`), `soulbase_grpc_connections` (held by the gRPC
//!   listener, at most `server.grpc_max_connections`), `soulbase_mcp_sessions`
//!   (live MCP sessions).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use soulbase_edge::{CallObserver, Surface};
use soulbase_errors::ErrorCode;
use soulbase_qos::BudgetSnapshot;
use soulbase_tools::pipeline::{CallResult, CallStatus};
use soulbase_types::{TenantId, ToolId};

use crate::evidence::EvidenceStats;

/// Histogram bucket upper bounds, in seconds.
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

#[derive(Default)]
struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(
            d.as_nanos().min(u128::from(u64::MAX)) as u64,
            Ordering::Relaxed,
        );
    }
}

const SURFACES: [Surface; 4] = [Surface::Grpc, Surface::Http, Surface::Mcp, Surface::Cli];

fn surface_index(s: Surface) -> usize {
    match s {
        Surface::Grpc => 0,
        Surface::Http => 1,
        Surface::Mcp => 2,
        Surface::Cli => 3,
    }
}

/// Something a listener holds a number of (its connections), reported as a gauge.
pub trait Held: Send + Sync + 'static {
    /// How many are held now.
    fn held(&self) -> usize;
}

/// `N` counters per name, for the first `max` names seen, the rest summed under
/// `other`: a label of bounded cardinality however many tools or tenants there
/// are (`max` 0: nothing is counted).
struct Capped<const N: usize> {
    named: BTreeMap<String, [u64; N]>,
    other: [u64; N],
    max: usize,
}

impl<const N: usize> Capped<N> {
    fn new(max: usize) -> Self {
        Self {
            named: BTreeMap::new(),
            other: [0; N],
            max,
        }
    }

    /// Adds `amounts` to `name`'s counters (or `other`'s, past the cap).
    fn add(&mut self, name: &str, amounts: [u64; N]) {
        if self.max == 0 {
            return;
        }
        let row = if self.named.contains_key(name) || self.named.len() < self.max {
            self.named.entry(name.to_owned()).or_insert([0; N])
        } else {
            &mut self.other
        };
        for (total, n) in row.iter_mut().zip(amounts) {
            *total = total.saturating_add(n);
        }
    }

    /// The rows to report, by name, then `other` when it counted anything.
    fn rows(&self) -> impl Iterator<Item = (&str, &[u64; N])> {
        self.named
            .iter()
            .map(|(name, c)| (name.as_str(), c))
            .chain((self.other != [0; N]).then_some(("other", &self.other)))
    }
}

/// Finished calls per tool and status (`ok`, `denied`, `error`), for
/// `observe.metrics_max_tools` tools.
type ToolCounts = Capped<3>;

/// What calls were charged per tenant (calls, bytes in, bytes out, CPU ms), for
/// `observe.metrics_max_tenants` tenants.
type TenantUsage = Capped<4>;

const RESOURCES: [&str; 4] = ["calls", "bytes_in", "bytes_out", "cpu_ms"];

/// The process's metrics. Cheap to update from any thread.
pub struct Metrics {
    calls: [[AtomicU64; 3]; SURFACES.len()],
    latency: [Histogram; SURFACES.len()],
    denials: Mutex<BTreeMap<(Surface, ErrorCode), u64>>,
    errors: Mutex<BTreeMap<(Surface, ErrorCode), u64>>,
    budgets: Mutex<BTreeMap<(String, String), u64>>,
    evidence: Mutex<Option<Arc<EvidenceStats>>>,
    registry_version: AtomicU64,
    in_flight: AtomicU64,
    connections: Mutex<Option<Arc<dyn Held>>>,
    grpc_connections: Mutex<Option<Arc<dyn Held>>>,
    mcp_sessions: Mutex<Option<Arc<soulbase_mcp::sessions::McpSessions>>>,
    /// Finished calls by tool and status.
    tool_calls: Mutex<ToolCounts>,
    /// Charged usage by tenant.
    tenant_usage: Mutex<TenantUsage>,
    consent_issued: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn status_index(s: CallStatus) -> usize {
    match s {
        CallStatus::Ok => 0,
        CallStatus::Denied => 1,
        CallStatus::Error => 2,
    }
}

const STATUSES: [&str; 3] = ["ok", "denied", "error"];

/// Escapes a label value (backslash, quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The size of a watched collection (0 until one is watched).
fn watched_len<T: ?Sized>(slot: &Mutex<Option<Arc<T>>>, len: impl Fn(&T) -> usize) -> usize {
    slot.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .map_or(0, |t| len(t))
}

fn bump(map: &Mutex<BTreeMap<(Surface, ErrorCode), u64>>, key: (Surface, ErrorCode)) {
    let mut m = map.lock().unwrap_or_else(PoisonError::into_inner);
    *m.entry(key).or_default() += 1;
}

impl Metrics {
    /// Empty metrics, labelling up to 200 tools by name.
    pub fn new() -> Self {
        Self::with_max_tools(200)
    }

    /// Empty metrics labelling up to `max_tools` tools by name
    /// (`observe.metrics_max_tools`; 0: no per-tool series) and 200 tenants.
    pub fn with_max_tools(max_tools: usize) -> Self {
        Self {
            calls: Default::default(),
            latency: Default::default(),
            denials: Mutex::default(),
            errors: Mutex::default(),
            budgets: Mutex::default(),
            evidence: Mutex::default(),
            registry_version: AtomicU64::default(),
            in_flight: AtomicU64::default(),
            connections: Mutex::default(),
            grpc_connections: Mutex::default(),
            mcp_sessions: Mutex::default(),
            tool_calls: Mutex::new(Capped::new(max_tools)),
            tenant_usage: Mutex::new(Capped::new(200)),
            consent_issued: AtomicU64::default(),
        }
    }

    /// These metrics labelling up to `max` tenants by name
    /// (`observe.metrics_max_tenants`; 0: no per-tenant series).
    pub fn max_tenants(self, max: usize) -> Self {
        self.tenant_usage
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .max = max;
        self
    }

    fn charge(&self, tenant: &TenantId, usage: &soulbase_observe::BudgetUsage) {
        self.tenant_usage
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(
                tenant.as_str(),
                [usage.calls, usage.bytes_in, usage.bytes_out, usage.cpu_ms],
            );
    }

    /// Counts a consent token issued (by any surface).
    pub fn consent_issued(&self) {
        self.consent_issued.fetch_add(1, Ordering::Relaxed);
    }

    fn count_tool(&self, tool: &ToolId, status: CallStatus) {
        let mut counts = [0; 3];
        counts[status_index(status)] = 1;
        self.tool_calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(tool.as_str(), counts);
    }

    /// Reports the evidence queue of `stats`.
    pub fn watch_evidence(&self, stats: Arc<EvidenceStats>) {
        *self.evidence.lock().unwrap_or_else(PoisonError::into_inner) = Some(stats);
    }

    /// The evidence queue's counters, when watched ([`Metrics::watch_evidence`]).
    pub fn evidence_stats(&self) -> Option<Arc<EvidenceStats>> {
        self.evidence
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reports the HTTP listener's connections.
    pub fn watch_connections(&self, c: Arc<dyn Held>) {
        *self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(c);
    }

    /// Reports the gRPC listener's connections.
    pub fn watch_grpc_connections(&self, c: Arc<dyn Held>) {
        *self
            .grpc_connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(c);
    }

    /// Reports the live MCP sessions.
    pub fn watch_mcp_sessions(&self, s: Arc<soulbase_mcp::sessions::McpSessions>) {
        *self
            .mcp_sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(s);
    }

    /// Records the registry's snapshot counter.
    pub fn set_registry_version(&self, v: u64) {
        self.registry_version.store(v, Ordering::Relaxed);
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let _ = writeln!(out, "# HELP soulbase_calls_total Finished tool calls.");
        let _ = writeln!(out, "# TYPE soulbase_calls_total counter");
        for s in SURFACES {
            for (i, st) in STATUSES.iter().enumerate() {
                let n = self.calls[surface_index(s)][i].load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "soulbase_calls_total{{surface=\"{}\",status=\"{st}\"}} {n}",
                    s.as_str()
                );
            }
        }
        for (name, help, map) in [
            (
                "soulbase_denials_total",
                "Calls and requests refused by governance, by stable code.",
                &self.denials,
            ),
            (
                "soulbase_errors_total",
                "Failed calls, by stable code.",
                &self.errors,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let m = map.lock().unwrap_or_else(PoisonError::into_inner);
            for ((s, code), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "{name}{{surface=\"{}\",code=\"{}\"}} {n}",
                    s.as_str(),
                    code.as_str()
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP soulbase_tool_calls_total Finished tool calls by tool (observe.metrics_max_tools named, the rest as other)."
        );
        let _ = writeln!(out, "# TYPE soulbase_tool_calls_total counter");
        {
            let m = self
                .tool_calls
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for (tool, counts) in m.rows() {
                for (st, n) in STATUSES.iter().zip(counts).filter(|(_, n)| **n > 0) {
                    let _ = writeln!(
                        out,
                        "soulbase_tool_calls_total{{tool=\"{}\",status=\"{st}\"}} {n}",
                        escape(tool)
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            "# HELP soulbase_budget_consumed_total What calls were charged, by tenant (observe.metrics_max_tenants named, the rest as other) and resource."
        );
        let _ = writeln!(out, "# TYPE soulbase_budget_consumed_total counter");
        {
            let m = self
                .tenant_usage
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for (tenant, totals) in m.rows() {
                for (resource, n) in RESOURCES.iter().zip(totals) {
                    let _ = writeln!(
                        out,
                        "soulbase_budget_consumed_total{{tenant=\"{}\",resource=\"{resource}\"}} {n}",
                        escape(tenant)
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            "# HELP soulbase_consent_issued_total Consent tokens issued."
        );
        let _ = writeln!(out, "# TYPE soulbase_consent_issued_total counter");
        let _ = writeln!(
            out,
            "soulbase_consent_issued_total {}",
            self.consent_issued.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP soulbase_call_duration_seconds Tool call latency as seen by the server."
        );
        let _ = writeln!(out, "# TYPE soulbase_call_duration_seconds histogram");
        for s in SURFACES {
            let h = &self.latency[surface_index(s)];
            let mut cumulative = 0;
            for (i, b) in BUCKETS.iter().enumerate() {
                cumulative += h.counts[i].load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "soulbase_call_duration_seconds_bucket{{surface=\"{}\",le=\"{b}\"}} {cumulative}",
                    s.as_str()
                );
            }
            let count = h.count.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "soulbase_call_duration_seconds_bucket{{surface=\"{}\",le=\"+Inf\"}} {count}",
                s.as_str()
            );
            let sum = h.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
            let _ = writeln!(
                out,
                "soulbase_call_duration_seconds_sum{{surface=\"{}\"}} {sum}",
                s.as_str()
            );
            let _ = writeln!(
                out,
                "soulbase_call_duration_seconds_count{{surface=\"{}\"}} {count}",
                s.as_str()
            );
        }
        let _ = writeln!(
            out,
            "# HELP soulbase_budget_remaining_calls Calls left under the tightest limit, as last seen by a preflight."
        );
        let _ = writeln!(out, "# TYPE soulbase_budget_remaining_calls gauge");
        for ((tenant, tool), n) in self
            .budgets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            let _ = writeln!(
                out,
                "soulbase_budget_remaining_calls{{tenant=\"{}\",tool=\"{}\"}} {n}",
                escape(tenant),
                escape(tool)
            );
        }
        let stats = self
            .evidence
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let (depth, written, quarantined, lag) = stats.map_or((0, 0, 0, 0.0), |s| {
            (
                s.depth(),
                s.written(),
                s.quarantined(),
                s.drain_lag().as_secs_f64(),
            )
        });
        let _ = writeln!(
            out,
            "# HELP soulbase_evidence_queue_depth Evidence records accepted but not yet in the store."
        );
        let _ = writeln!(out, "# TYPE soulbase_evidence_queue_depth gauge");
        let _ = writeln!(out, "soulbase_evidence_queue_depth {depth}");
        let _ = writeln!(
            out,
            "# HELP soulbase_evidence_written_total Evidence records written to the store."
        );
        let _ = writeln!(out, "# TYPE soulbase_evidence_written_total counter");
        let _ = writeln!(out, "soulbase_evidence_written_total {written}");
        let _ = writeln!(
            out,
            "# HELP soulbase_evidence_quarantined_total Evidence records the store refused, kept in the spool's quarantine.jsonl."
        );
        let _ = writeln!(out, "# TYPE soulbase_evidence_quarantined_total counter");
        let _ = writeln!(out, "soulbase_evidence_quarantined_total {quarantined}");
        let _ = writeln!(
            out,
            "# HELP soulbase_evidence_drain_lag_seconds How long the store has been behind the spool (an upper bound on the age of the oldest record not yet in the store; 0 while caught up)."
        );
        let _ = writeln!(out, "# TYPE soulbase_evidence_drain_lag_seconds gauge");
        let _ = writeln!(out, "soulbase_evidence_drain_lag_seconds {lag}");
        let _ = writeln!(
            out,
            "# HELP soulbase_calls_in_flight Calls inside the pipeline right now."
        );
        let _ = writeln!(out, "# TYPE soulbase_calls_in_flight gauge");
        let _ = writeln!(
            out,
            "soulbase_calls_in_flight {}",
            self.in_flight.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP soulbase_registry_snapshot_version The registry's change counter."
        );
        let _ = writeln!(out, "# TYPE soulbase_registry_snapshot_version gauge");
        let _ = writeln!(
            out,
            "soulbase_registry_snapshot_version {}",
            self.registry_version.load(Ordering::Relaxed)
        );
        for (name, help, count) in [
            (
                "soulbase_http_connections",
                "Connections the HTTP listener holds.",
                watched_len(&self.connections, |c| c.held()),
            ),
            (
                "soulbase_grpc_connections",
                "Connections the gRPC listener holds.",
                watched_len(&self.grpc_connections, |c| c.held()),
            ),
            (
                "soulbase_mcp_sessions",
                "Live MCP sessions.",
                watched_len(&self.mcp_sessions, |s| s.len()),
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name} {count}");
        }
        out
    }
}

impl CallObserver for Metrics {
    fn call_started(&self, _surface: Surface) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    fn call_finished(
        &self,
        surface: Surface,
        tool: &ToolId,
        result: &CallResult,
        elapsed: Duration,
    ) {
        let si = surface_index(surface);
        // Saturating: a finish without a start (e.g. a direct observer call) must not wrap.
        let _ = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        self.calls[si][status_index(result.status)].fetch_add(1, Ordering::Relaxed);
        self.count_tool(tool, result.status);
        self.latency[si].observe(elapsed);
        if let Some(code) = result.error_code {
            match result.status {
                CallStatus::Denied => bump(&self.denials, (surface, code)),
                _ => bump(&self.errors, (surface, code)),
            }
        }
    }

    fn budget_seen(&self, tenant: &TenantId, tool: &ToolId, budget: &BudgetSnapshot) {
        if let Some(n) = budget.remaining {
            self.budgets
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert((tenant.to_string(), tool.to_string()), n);
        }
    }

    fn refused(&self, surface: Surface, code: ErrorCode) {
        if soulbase_tools::pipeline::is_denial(code) {
            bump(&self.denials, (surface, code));
        } else {
            bump(&self.errors, (surface, code));
        }
    }

    fn consent_issued(&self) {
        Metrics::consent_issued(self);
    }

    fn usage_charged(&self, tenant: &TenantId, usage: &soulbase_observe::BudgetUsage) {
        self.charge(tenant, usage);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use soulbase_types::CallId;

    #[test]
    fn tools_past_the_cap_are_counted_as_other() {
        let result = |status| CallResult {
            status,
            ..CallResult::refused(
                CallId::generate(),
                &soulbase_errors::SoulError::of(ErrorCode::PolicyDenyTool),
            )
        };
        let m = Metrics::with_max_tools(2);
        for (tool, status) in [
            ("a.b.one", CallStatus::Ok),
            ("a.b.two", CallStatus::Ok),
            ("a.b.three", CallStatus::Denied),
            ("a.b.one", CallStatus::Ok),
            ("a.b.four", CallStatus::Ok),
        ] {
            m.call_finished(
                Surface::Http,
                &ToolId::new(tool).unwrap(),
                &result(status),
                Duration::from_micros(5),
            );
        }
        m.consent_issued();
        let text = m.render();
        assert!(
            text.contains("soulbase_tool_calls_total{tool=\"a.b.one\",status=\"ok\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("soulbase_tool_calls_total{tool=\"a.b.two\",status=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("soulbase_tool_calls_total{tool=\"other\",status=\"denied\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("soulbase_tool_calls_total{tool=\"other\",status=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            !text.contains("a.b.three") && !text.contains("a.b.four"),
            "{text}"
        );
        assert!(text.contains("soulbase_consent_issued_total 1"), "{text}");
        let off = Metrics::with_max_tools(0);
        off.call_finished(
            Surface::Http,
            &ToolId::new("a.b.one").unwrap(),
            &result(CallStatus::Ok),
            Duration::from_micros(5),
        );
        assert!(!off.render().contains("soulbase_tool_calls_total{"));
    }

    #[test]
    fn charged_usage_is_summed_per_tenant_up_to_the_cap() {
        let m = Metrics::new().max_tenants(1);
        let usage = soulbase_observe::BudgetUsage {
            calls: 1,
            bytes_in: 10,
            bytes_out: 20,
            cpu_ms: 3,
        };
        for tenant in ["acme", "acme", "beta"] {
            m.usage_charged(&TenantId::new(tenant).unwrap(), &usage);
        }
        let text = m.render();
        for (line, n) in [
            ("tenant=\"acme\",resource=\"calls\"", 2),
            ("tenant=\"acme\",resource=\"bytes_in\"", 20),
            ("tenant=\"acme\",resource=\"bytes_out\"", 40),
            ("tenant=\"acme\",resource=\"cpu_ms\"", 6),
            ("tenant=\"other\",resource=\"calls\"", 1),
        ] {
            assert!(
                text.contains(&format!("soulbase_budget_consumed_total{{{line}}} {n}")),
                "{line}: {text}"
            );
        }
        assert!(!text.contains("beta"), "{text}");
        let off = Metrics::new().max_tenants(0);
        off.usage_charged(&TenantId::new("acme").unwrap(), &usage);
        assert!(!off.render().contains("soulbase_budget_consumed_total{"));
    }

    #[test]
    fn render_counts_calls_denials_and_latency() {
        let m = Metrics::new();
        let tool = ToolId::new("a.b.c").unwrap();
        let ok = CallResult {
            call_id: CallId::generate(),
            status: CallStatus::Ok,
            error_code: None,
            error: None,
            output: None,
            evidence_ref: None,
            replayed: false,
            warnings: Vec::new(),
            usage: None,
        };
        m.call_finished(Surface::Grpc, &tool, &ok, Duration::from_micros(300));
        let denied = CallResult {
            status: CallStatus::Denied,
            error_code: Some(ErrorCode::PolicyDenyTool),
            ..ok.clone()
        };
        m.call_finished(Surface::Http, &tool, &denied, Duration::from_millis(2));
        m.refused(Surface::Grpc, ErrorCode::AuthUnauthenticated);
        let text = m.render();
        assert!(text.contains("soulbase_calls_total{surface=\"grpc\",status=\"ok\"} 1"));
        assert!(text.contains("soulbase_calls_total{surface=\"http\",status=\"denied\"} 1"));
        assert!(
            text.contains("soulbase_denials_total{surface=\"http\",code=\"POLICY.DENY_TOOL\"} 1")
        );
        assert!(
            text.contains(
                "soulbase_denials_total{surface=\"grpc\",code=\"AUTH.UNAUTHENTICATED\"} 1"
            )
        );
        assert!(
            text.contains(
                "soulbase_call_duration_seconds_bucket{surface=\"grpc\",le=\"0.0005\"} 1"
            )
        );
        assert!(text.contains("soulbase_call_duration_seconds_count{surface=\"http\"} 1"));
        // Every sample line is `name{labels} value` or `name value`.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
