//! `soulbase evidence …`: query and replay recorded evidence.
//!
//! - `show CALL_ID` — every record of a call (Begin, End, Denial), oldest first.
//! - `list --tenant T [--tool ID] [--status S] [--since D | --from MS] [--to MS]
//!   [--limit N] [--after CURSOR]` — a tenant's calls, newest first, one page; the
//!   cursor for the next page is printed last.
//! - `replay CALL_ID` — the call's key behaviour and result summary rebuilt from its
//!   evidence, with any inconsistency flagged (exit 1 when there are anomalies).
//!   Given an agent-loop conversation's id (`conv_…`, answered as
//!   `soulbase.conversation_id`), the whole conversation: its start, each model
//!   turn with the tool calls it made (each replayed), its end and reason.
//! - `quarantine list [--spool DIR]` — the records the database refused for good,
//!   kept in the spool's `quarantine.jsonl` (works beside a running server).
//! - `quarantine retry [--spool DIR]` — offers them to the database again once the
//!   cause is fixed; those it takes leave the file (exit 1 when any stay). It holds
//!   the spool's lock, so the server using the spool must be stopped first (a
//!   running server offers its own quarantine: `POST /api/quarantine/retry`, the
//!   same code, run by its drainer).
//!
//! `--json` is the same as `--format json`. Text output shows instants in UTC as
//! RFC 3339 (`2026-11-25T10:04:05.123Z`); JSON keeps Unix milliseconds. `--tenant`
//! is each query's own option (also accepted before the subcommand); `retry` has
//! none and refuses one given before it.
//!
//! The database is `--database-url`, else the configuration's (`evidence.url`, or
//! the SQLite file under `data_dir`; `config.yaml` and `SOULBASE_…` variables apply).
//! `show`, `list` and `replay` read the database only: records still in a running
//! server's spool appear once drained. `quarantine` reads the spool (`--spool`,
//! else `<data_dir>/spool` of the configuration); `retry` also writes to the
//! database.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_evidence::quarantine::{self, QuarantineEntry};
use soulbase_observe::{
    CallSummary, ConversationReplay, EndStatus, EvidenceQuery, EvidenceStore, PageCursor, Replay,
    ReplayOutcome, conversation_calls, is_conversation, replay, replay_conversation,
};
use soulbase_store::{Db, SqlEvidenceStore};
use soulbase_types::{ActorId, CallId, TenantId, ToolId, UnixMillis};

use crate::duration::parse_millis;
use crate::options::{Common, ConfigArgs, OutputArgs};
use crate::output::table;
use crate::target::{Failure, Global};
use crate::timestamp::{Zone, human};

/// Arguments of `soulbase evidence`.
#[derive(Debug, Args)]
pub struct EvidenceArgs {
    /// The evidence database (postgres://… or sqlite:…); default: from the configuration.
    #[arg(long, global = true)]
    database_url: Option<String>,
    /// Output format (text shows instants in UTC, RFC 3339; json keeps Unix
    /// milliseconds).
    #[arg(long, value_enum, default_value = "text", global = true)]
    format: Format,
    /// Text output shows instants in the system's local time zone (RFC 3339 with
    /// its offset) instead of UTC.
    #[arg(long, global = true)]
    local: bool,
    /// The configuration (for the database and the spool directory).
    #[command(flatten)]
    config: ConfigArgs,
    /// `--json`: the same as `--format json`.
    #[command(flatten)]
    output: OutputArgs,
    #[command(subcommand)]
    command: EvidenceCommand,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Status {
    Ok,
    Error,
    Timeout,
    Cancelled,
    Aborted,
}

impl From<Status> for EndStatus {
    fn from(s: Status) -> EndStatus {
        match s {
            Status::Ok => EndStatus::Ok,
            Status::Error => EndStatus::Error,
            Status::Timeout => EndStatus::Timeout,
            Status::Cancelled => EndStatus::Cancelled,
            Status::Aborted => EndStatus::Aborted,
        }
    }
}

#[derive(Debug, Subcommand)]
enum EvidenceCommand {
    #[command(flatten)]
    Query(QueryCommand),
    /// Records the database refused for good, kept in the spool's quarantine file.
    Quarantine {
        #[command(subcommand)]
        command: QuarantineCommand,
    },
}

/// The commands that read the evidence database.
#[derive(Debug, Subcommand)]
enum QueryCommand {
    /// Every record of one call, oldest first.
    Show {
        /// The call id, or a conversation's id.
        call_id: String,
        /// Only if the call belongs to this tenant.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// A tenant's calls, newest first, one page at a time.
    List {
        /// The tenant whose calls to list (required).
        #[arg(long)]
        tenant: Option<String>,
        /// Only this tool.
        #[arg(long)]
        tool: Option<String>,
        /// Only calls that ended so.
        #[arg(long, value_enum)]
        status: Option<Status>,
        /// Only calls made by this actor.
        #[arg(long)]
        actor: Option<String>,
        /// Only calls that ended with this stable error code (e.g. `PROVIDER.TIMEOUT`).
        #[arg(long)]
        code: Option<String>,
        /// Calls that began within this long before now: `90s`, `15m`, `2h`, `7d`.
        #[arg(long, conflicts_with = "from")]
        since: Option<String>,
        /// Calls that began at or after this instant (Unix milliseconds).
        #[arg(long)]
        from: Option<i64>,
        /// Calls that began before this instant (Unix milliseconds).
        #[arg(long)]
        to: Option<i64>,
        /// Page size (1–1000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Continue after this cursor (printed at the end of the previous page).
        #[arg(long)]
        after: Option<String>,
    },
    /// Rebuild a call's key behaviour and result summary from its evidence, or a
    /// whole agent-loop conversation from its id (`conv_…`).
    Replay {
        /// The call id.
        call_id: String,
        /// Only if the call belongs to this tenant.
        #[arg(long)]
        tenant: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum QuarantineCommand {
    /// Every quarantined record (line, kind, envelope, call, tenant, why), in file
    /// order.
    List {
        /// The spool directory; default: `<data_dir>/spool` of the configuration.
        #[arg(long)]
        spool: Option<PathBuf>,
        /// Only this tenant's records.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Offer the quarantined records to the database again; those it takes leave
    /// the file, the rest stay as they are.
    ///
    /// Needs the spool's lock: stop the server that uses the spool first (it
    /// cannot start while this runs; a running server retries its own with
    /// `POST /api/quarantine/retry`). Exit 1 while lines stay. It offers every
    /// tenant's records: there is no `--tenant`.
    Retry {
        /// The spool directory; default: `<data_dir>/spool` of the configuration.
        #[arg(long)]
        spool: Option<PathBuf>,
    },
}

/// `explicit` when given, else what `pick` reads off the configuration.
fn or_config<T>(
    explicit: Option<T>,
    global: &Global,
    pick: impl FnOnce(&soulbase_config::Config) -> T,
) -> Result<T, String> {
    if let Some(v) = explicit {
        return Ok(v);
    }
    let snapshot = global
        .loader(true)
        .load()
        .map_err(|e| format!("loading the configuration: {e}"))?;
    Ok(pick(snapshot.config()))
}

fn database_url_of(explicit: Option<String>, global: &Global) -> Result<String, String> {
    or_config(explicit, global, soulbase_store::database_url)
}

fn spool_dir(explicit: Option<PathBuf>, global: &Global) -> Result<PathBuf, String> {
    or_config(explicit, global, soulbase_store::spool_dir)
}

fn err(e: SoulError) -> String {
    let causes = e.audit().causes.join("; ");
    if causes.is_empty() {
        format!("{}: {}", e.code(), e.message())
    } else {
        format!("{}: {} ({causes})", e.code(), e.message())
    }
}

fn tenant_arg(t: Option<String>) -> Result<Option<TenantId>, String> {
    t.map(|t| TenantId::new(t).map_err(|e| format!("--tenant: {e}")))
        .transpose()
}

/// The `list` table: one row per call, its start in UTC (RFC 3339).
fn calls_table(calls: &[CallSummary], zone: Zone) -> String {
    let rows: Vec<Vec<String>> = calls
        .iter()
        .map(|c| {
            let status = c
                .status
                .map(|s| {
                    serde_json::to_value(s)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                })
                .unwrap_or_else(|| "open".into());
            vec![
                human(c.began_at.0, zone),
                c.call_id.to_string(),
                format!("{}@{}", c.tool_id, c.tool_version),
                c.actor.to_string(),
                match c.error_code {
                    Some(e) => format!("{status} {e}"),
                    None => status,
                },
                c.duration_us.map(|d| format!("{d}µs")).unwrap_or_default(),
            ]
        })
        .collect();
    table(
        &["BEGAN (UTC)", "CALL", "TOOL", "ACTOR", "STATUS", "DURATION"],
        &rows,
    )
}

/// A record as pretty JSON for people: its `at` as RFC 3339 in UTC.
fn record_text(record: &serde_json::Value, zone: Zone) -> String {
    let mut v = record.clone();
    if let Some(at) = v.get("at").and_then(serde_json::Value::as_i64) {
        v["at"] = json!(human(at, zone));
    }
    crate::output::pretty(&v)
}

/// One quarantine entry as a JSON object.
fn entry_json(e: &QuarantineEntry) -> serde_json::Value {
    let head = e.head.as_ref();
    json!({
        "line": e.line,
        "refused": e.refused,
        "unreadable": e.unreadable,
        "id": head.map(|h| &h.id),
        "kind": head.map(|h| &h.kind),
        "call_id": head.map(|h| &h.call_id),
        "tenant": head.map(|h| &h.tenant),
    })
}

/// `quarantine list`.
fn list_quarantine(dir: &Path, tenant: Option<&str>, json: bool) -> Result<bool, String> {
    let mut entries = quarantine::read(dir).map_err(err)?;
    if let Some(t) = tenant {
        entries.retain(|e| e.head.as_ref().is_some_and(|h| h.tenant == t));
    }
    if json {
        let all: Vec<_> = entries.iter().map(entry_json).collect();
        println!("{}", serde_json::Value::Array(all));
        return Ok(true);
    }
    if entries.is_empty() {
        println!("no quarantined records in {}", dir.display());
        return Ok(true);
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let (kind, id, call, tenant) = match &e.head {
                Some(h) => (
                    h.kind.clone(),
                    h.id.clone(),
                    h.call_id.clone(),
                    h.tenant.clone(),
                ),
                None => ("-".into(), "-".into(), "-".into(), "-".into()),
            };
            let why = match &e.unreadable {
                Some(u) => format!("unreadable: {u}"),
                None => e.refused.clone(),
            };
            vec![e.line.to_string(), kind, id, call, tenant, why]
        })
        .collect();
    print!(
        "{}",
        crate::output::table(
            &["LINE", "KIND", "ENVELOPE", "CALL", "TENANT", "WHY"],
            &rows
        )
    );
    Ok(true)
}

/// `quarantine retry`: exit 0 when nothing stays in the file.
async fn retry_quarantine(
    dir: &Path,
    database_url: Option<String>,
    global: &Global,
    json: bool,
) -> Result<bool, String> {
    if quarantine::read(dir).map_err(err)?.is_empty() {
        println!("no quarantined records in {}", dir.display());
        return Ok(true);
    }
    let url = database_url_of(database_url, global)?;
    let db = Db::connect(&url, false).await.map_err(err)?;
    let store = SqlEvidenceStore::new(db.clone());
    let report = quarantine::requeue(dir, &store).await;
    db.close().await;
    let report = report.map_err(err)?;
    if json {
        let refused: Vec<_> = report
            .refused
            .iter()
            .map(|(e, why)| {
                let mut v = entry_json(e);
                v["refused_again"] = json!(why);
                v
            })
            .collect();
        let unreadable: Vec<_> = report.unreadable.iter().map(entry_json).collect();
        println!(
            "{}",
            json!({
                "stored": report.stored,
                "refused": refused,
                "unreadable": unreadable,
                "remaining": report.remaining(),
            })
        );
    } else {
        for (e, why) in &report.refused {
            let id = e.head.as_ref().map_or("-", |h| h.id.as_str());
            println!("line {} ({id}): refused again: {why}", e.line);
        }
        for e in &report.unreadable {
            let why = e.unreadable.as_deref().unwrap_or_default();
            println!("line {}: unreadable: {why}", e.line);
        }
        println!(
            "the database took {} record(s); {} refused again, {} unreadable; {} line(s) stay in {}",
            report.stored,
            report.refused.len(),
            report.unreadable.len(),
            report.remaining(),
            dir.join(quarantine::QUARANTINE_FILE).display()
        );
    }
    Ok(report.remaining() == 0)
}

async fn execute(global: &Global, args: EvidenceArgs) -> Result<bool, String> {
    let json = global.json || matches!(args.format, Format::Json);
    match args.command {
        EvidenceCommand::Quarantine {
            command: QuarantineCommand::List { spool, .. },
        } => list_quarantine(&spool_dir(spool, global)?, global.tenant.as_deref(), json),
        EvidenceCommand::Quarantine {
            command: QuarantineCommand::Retry { spool },
        } => retry_quarantine(&spool_dir(spool, global)?, args.database_url, global, json).await,
        EvidenceCommand::Query(command) => {
            let zone = if args.local { Zone::Local } else { Zone::Utc };
            query(global, args.database_url, command, json, zone).await
        }
    }
}

/// `show`, `list` and `replay`: read the database.
async fn query(
    global: &Global,
    database_url: Option<String>,
    command: QueryCommand,
    json: bool,
    zone: Zone,
) -> Result<bool, String> {
    let url = database_url_of(database_url, global)?;
    let db = Db::connect(&url, false).await.map_err(err)?;
    let store = SqlEvidenceStore::new(db.clone());
    let tenant = global.tenant.clone();
    let ok = match command {
        QueryCommand::Show { call_id, .. } => {
            let call_id = CallId::new(call_id).map_err(|e| format!("CALL_ID: {e}"))?;
            let tenant = tenant_arg(tenant)?;
            let ev = store.call(tenant.as_ref(), &call_id).await.map_err(err)?;
            if ev.is_empty() {
                return Err(format!("no evidence is recorded for call {call_id}"));
            }
            for r in &ev.records {
                if json {
                    println!("{}", serde_json::to_string(r).map_err(|e| e.to_string())?);
                } else {
                    let v = serde_json::to_value(r).map_err(|e| e.to_string())?;
                    println!("{}", record_text(&v, zone));
                }
            }
            true
        }
        QueryCommand::List {
            tenant: _,
            tool,
            status,
            actor,
            code,
            since,
            from,
            to,
            limit,
            after,
        } => {
            let tenant = tenant.ok_or("--tenant is required (the tenant whose calls to list)")?;
            let tenant = TenantId::new(tenant).map_err(|e| format!("--tenant: {e}"))?;
            let from = match since {
                Some(s) => Some(UnixMillis(
                    UnixMillis::now().0 - parse_millis("--since", &s)?,
                )),
                None => from.map(UnixMillis),
            };
            let query = EvidenceQuery {
                tenant,
                from,
                to: to.map(UnixMillis),
                tool: tool
                    .map(|t| ToolId::new(t).map_err(|e| format!("--tool: {e}")))
                    .transpose()?,
                status: status.map(Into::into),
                actor: actor
                    .map(|a| ActorId::new(a).map_err(|e| format!("--actor: {e}")))
                    .transpose()?,
                code: code
                    .map(|c| {
                        ErrorCode::parse(&c)
                            .ok_or_else(|| format!("--code: {c} is not a stable error code"))
                    })
                    .transpose()?,
                limit,
                after: after
                    .map(|a| {
                        PageCursor::parse(&a).map_err(|_| "--after: malformed cursor".to_owned())
                    })
                    .transpose()?,
            };
            let page = store.list(&query).await.map_err(err)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&page).map_err(|e| e.to_string())?
                );
            } else {
                if !page.calls.is_empty() {
                    print!("{}", calls_table(&page.calls, zone));
                }
                match &page.next {
                    Some(next) => println!("next page: --after {next}"),
                    None => println!("({} call(s), last page)", page.calls.len()),
                }
            }
            true
        }
        QueryCommand::Replay { call_id, .. } => {
            let call_id = CallId::new(call_id).map_err(|e| format!("CALL_ID: {e}"))?;
            let tenant = tenant_arg(tenant)?;
            let ev = store.call(tenant.as_ref(), &call_id).await.map_err(err)?;
            if is_conversation(&ev) {
                let mut calls = BTreeMap::new();
                for id in conversation_calls(&ev) {
                    let call = store.call(tenant.as_ref(), &id).await.map_err(err)?;
                    calls.insert(id, call);
                }
                let c = replay_conversation(&ev, &calls, &BTreeSet::new()).map_err(err)?;
                if json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&c).map_err(|e| e.to_string())?
                    );
                } else {
                    print!("{}", conversation_text(&c, zone));
                }
                c.anomalies.is_empty()
                    && c.turns
                        .iter()
                        .flat_map(|t| &t.calls)
                        .filter_map(|x| x.replay.as_ref())
                        .all(|r| r.anomalies.is_empty())
            } else {
                let r = replay(&ev).map_err(err)?;
                if json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?
                    );
                } else {
                    print!("{}", replay_text(&r, zone));
                }
                r.anomalies.is_empty()
            }
        }
    };
    db.close().await;
    Ok(ok)
}

/// A call's replay as text, one `label value` line each.
fn replay_text(r: &Replay, zone: Zone) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let mut line = |text: String| {
        let _ = writeln!(out, "{text}");
    };
    line(format!(
        "call      {} (tenant {}, actor {}, origin {:?})",
        r.call_id, r.tenant, r.actor, r.origin
    ));
    match &r.outcome {
        ReplayOutcome::Denied { tool, code, at } => {
            line(format!(
                "outcome   denied before execution: {code} (tool {tool}, at {})",
                human(at.0, zone)
            ));
        }
        ReplayOutcome::Executed(x) => {
            line(format!(
                "tool      {}@{} (manifest {})",
                x.tool_id, x.tool_version, x.manifest_digest
            ));
            line(format!("profile   {}", x.profile_hash));
            line(format!("policy    {}", x.policy_hash));
            line(format!("config    {}", x.config_hash));
            line(format!("args      {}", x.args_digest));
            if let Some(k) = &x.idempotency_key {
                line(format!("idem key  {k}"));
            }
            if let Some(s) = &x.calling_skill {
                line(format!("skill     {s}"));
            }
            line(format!("began     {}", human(x.began_at.0, zone)));
            match x.status {
                Some(s) => line(format!(
                    "ended     {} {:?}{} after {}µs",
                    x.ended_at
                        .map(|t| human(t.0, zone))
                        .unwrap_or_else(|| "-".into()),
                    s,
                    x.error_code.map(|c| format!(" {c}")).unwrap_or_default(),
                    x.duration_us.unwrap_or_default()
                )),
                None => line("ended     (no End recorded)".into()),
            }
            if let Some(o) = &x.output_digest {
                line(format!("output    {o}"));
            }
            for s in &x.side_effects {
                line(format!("effect    {} {}", s.kind, s.target));
            }
            line(format!(
                "usage     calls={} bytes_in={} bytes_out={} cpu_ms={}",
                x.usage.calls, x.usage.bytes_in, x.usage.bytes_out, x.usage.cpu_ms
            ));
        }
    }
    for a in &r.anomalies {
        line(format!("anomaly   {a}"));
    }
    out
}

/// A conversation's replay as text: its start, each turn with its calls (each
/// call's replay indented under it), its end.
fn conversation_text(c: &ConversationReplay, zone: Zone) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "conversation {} (tenant {}, actor {})",
        c.conversation_id, c.tenant, c.actor
    );
    if let (Some(model), Some(at)) = (&c.model, c.started_at) {
        let _ = writeln!(out, "started   {} with model {model}", human(at.0, zone));
    }
    for t in &c.turns {
        let tokens = t
            .tokens
            .map(|u| {
                format!(
                    ", tokens {} ({} prompt, {} completion)",
                    u.total, u.prompt, u.completion
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "turn {}    {} response {}{tokens}",
            t.iteration,
            human(t.at.0, zone),
            t.response_digest
        );
        for x in &t.calls {
            let code = x.code.map(|c| format!(" {c}")).unwrap_or_default();
            let _ = writeln!(out, "  tool call {} {}{code}", x.id, x.tool);
            match &x.replay {
                Some(r) => {
                    for l in replay_text(r, zone).lines() {
                        let _ = writeln!(out, "    {l}");
                    }
                }
                None => {
                    let _ = writeln!(out, "    (answered in place)");
                }
            }
        }
    }
    match &c.end {
        Some(e) => {
            let code = e.error_code.map(|c| format!(" {c}")).unwrap_or_default();
            let _ = writeln!(
                out,
                "ended     {} {}{code} after {} turn(s), {} tool call(s), {} token(s)",
                human(e.at.0, zone),
                e.reason.as_str(),
                e.iterations,
                e.tool_calls,
                e.tokens
            );
        }
        None => {
            let _ = writeln!(out, "ended     (no end recorded)");
        }
    }
    for a in &c.anomalies {
        let _ = writeln!(out, "anomaly   {a}");
    }
    out
}

/// The `--tenant` of the query, if it takes one.
fn own_tenant(command: &EvidenceCommand) -> Option<String> {
    match command {
        EvidenceCommand::Query(
            QueryCommand::Show { tenant, .. }
            | QueryCommand::List { tenant, .. }
            | QueryCommand::Replay { tenant, .. },
        )
        | EvidenceCommand::Quarantine {
            command: QuarantineCommand::List { tenant, .. },
        } => tenant.clone(),
        EvidenceCommand::Quarantine {
            command: QuarantineCommand::Retry { .. },
        } => None,
    }
}

/// Runs `soulbase evidence …`; `common` are the options given before the
/// subcommand. Exit 0 on success, 1 on anomalies found by replay or quarantined
/// lines a retry left in place, 2 on errors.
pub fn run(common: Common, args: EvidenceArgs) -> ExitCode {
    if let Err(f) = common.refuse_server("evidence") {
        return f.report();
    }
    let retry = matches!(
        args.command,
        EvidenceCommand::Quarantine {
            command: QuarantineCommand::Retry { .. }
        }
    );
    if retry && common.tenant.is_some() {
        return Failure::Usage(
            "--tenant: `evidence quarantine retry` offers the whole quarantine file, \
             not one tenant's"
                .into(),
        )
        .report();
    }
    let identity = crate::options::IdentityArgs {
        tenant: own_tenant(&args.command),
        actor: None,
    };
    let global = common.local(identity, args.config.config.clone(), None, args.output.json);
    let global = &global;
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(execute(global, args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
