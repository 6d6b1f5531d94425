//! `soulbase evidence …`: query and replay recorded evidence.
//!
//! - `show CALL_ID` — every record of a call (Begin, End, Denial), oldest first.
//! - `list --tenant T [--tool ID] [--status S] [--since D | --from MS] [--to MS]
//!   [--limit N] [--after CURSOR]` — a tenant's calls, newest first, one page; the
//!   cursor for the next page is printed last.
//! - `replay CALL_ID` — the call's key behaviour and result summary rebuilt from its
//!   evidence, with any inconsistency flagged (exit 1 when there are anomalies).
//!
//! `--tenant` is the global option; `--json` is the same as `--format json`.
//!
//! The database is `--database-url`, else the configuration's (`evidence.url`, or
//! the SQLite file under `data_dir`; `config.yaml` and `SOULBASE_…` variables apply).
//! It reads the database only: records still in a running server's spool appear once
//! drained.

use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use soulbase_errors::SoulError;
use soulbase_observe::{
    CallSummary, EndStatus, EvidenceQuery, EvidenceStore, PageCursor, ReplayOutcome, replay,
};
use soulbase_store::{Db, SqlEvidenceStore};
use soulbase_types::{CallId, TenantId, ToolId, UnixMillis};

use crate::target::Global;

/// Arguments of `soulbase evidence`.
#[derive(Debug, Args)]
pub struct EvidenceArgs {
    /// The evidence database (postgres://… or sqlite:…); default: from the configuration.
    #[arg(long, global = true)]
    database_url: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text", global = true)]
    format: Format,
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
    /// Every record of one call, oldest first.
    ///
    /// Only if the call belongs to the global `--tenant`, when given.
    Show {
        /// The call id.
        call_id: String,
    },
    /// A tenant's calls (the global `--tenant`, required), newest first, one page at
    /// a time.
    List {
        /// Only this tool.
        #[arg(long)]
        tool: Option<String>,
        /// Only calls that ended so.
        #[arg(long, value_enum)]
        status: Option<Status>,
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
    /// Rebuild a call's key behaviour and result summary from its evidence.
    ///
    /// Only if the call belongs to the global `--tenant`, when given.
    Replay {
        /// The call id.
        call_id: String,
    },
}

/// Parses `90s`, `15m`, `2h`, `7d` into milliseconds.
fn parse_since(s: &str) -> Result<i64, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = num
        .parse()
        .map_err(|_| format!("--since {s:?}: expected a number and a unit (s, m, h, d)"))?;
    let per = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("--since {s:?}: the unit must be s, m, h or d")),
    };
    Ok(n.saturating_mul(per))
}

fn database_url(explicit: Option<String>, global: &Global) -> Result<String, String> {
    if let Some(url) = explicit {
        return Ok(url);
    }
    let snapshot = global
        .loader(true)
        .load()
        .map_err(|e| format!("loading the configuration: {e}"))?;
    Ok(soulbase_store::database_url(snapshot.config()))
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

fn summary_line(c: &CallSummary) -> String {
    format!(
        "{}  {}  {}@{}  {}  {}{}  {}",
        c.began_at.0,
        c.call_id,
        c.tool_id,
        c.tool_version,
        c.actor,
        c.status
            .map(|s| serde_json::to_value(s)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default())
            .unwrap_or_else(|| "open".into()),
        c.error_code.map(|e| format!(" {e}")).unwrap_or_default(),
        c.duration_us.map(|d| format!("{d}µs")).unwrap_or_default(),
    )
}

async fn execute(global: &Global, args: EvidenceArgs) -> Result<bool, String> {
    let url = database_url(args.database_url, global)?;
    let db = Db::connect(&url, false).await.map_err(err)?;
    let store = SqlEvidenceStore::new(db.clone());
    let json = global.json || matches!(args.format, Format::Json);
    let tenant = global.tenant.clone();
    let ok = match args.command {
        EvidenceCommand::Show { call_id } => {
            let call_id = CallId::new(call_id).map_err(|e| format!("CALL_ID: {e}"))?;
            let tenant = tenant_arg(tenant)?;
            let ev = store.call(tenant.as_ref(), &call_id).await.map_err(err)?;
            if ev.is_empty() {
                return Err(format!("no evidence is recorded for call {call_id}"));
            }
            for r in &ev.records {
                let line = if json {
                    serde_json::to_string(r)
                } else {
                    serde_json::to_string_pretty(r)
                };
                println!("{}", line.map_err(|e| e.to_string())?);
            }
            true
        }
        EvidenceCommand::List {
            tool,
            status,
            since,
            from,
            to,
            limit,
            after,
        } => {
            let tenant = tenant.ok_or("--tenant is required (the tenant whose calls to list)")?;
            let tenant = TenantId::new(tenant).map_err(|e| format!("--tenant: {e}"))?;
            let from = match since {
                Some(s) => Some(UnixMillis(UnixMillis::now().0 - parse_since(&s)?)),
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
                for c in &page.calls {
                    println!("{}", summary_line(c));
                }
                match &page.next {
                    Some(next) => println!("next page: --after {next}"),
                    None => println!("({} call(s), last page)", page.calls.len()),
                }
            }
            true
        }
        EvidenceCommand::Replay { call_id } => {
            let call_id = CallId::new(call_id).map_err(|e| format!("CALL_ID: {e}"))?;
            let tenant = tenant_arg(tenant)?;
            let ev = store.call(tenant.as_ref(), &call_id).await.map_err(err)?;
            let r = replay(&ev).map_err(err)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?
                );
            } else {
                println!(
                    "call      {} (tenant {}, actor {}, origin {:?})",
                    r.call_id, r.tenant, r.actor, r.origin
                );
                match &r.outcome {
                    ReplayOutcome::Denied { tool, code, at } => {
                        println!(
                            "outcome   denied before execution: {code} (tool {tool}, at {})",
                            at.0
                        );
                    }
                    ReplayOutcome::Executed(x) => {
                        println!(
                            "tool      {}@{} (manifest {})",
                            x.tool_id, x.tool_version, x.manifest_digest
                        );
                        println!("profile   {}", x.profile_hash);
                        println!("policy    {}", x.policy_hash);
                        println!("config    {}", x.config_hash);
                        println!("args      {}", x.args_digest);
                        if let Some(k) = &x.idempotency_key {
                            println!("idem key  {k}");
                        }
                        if let Some(s) = &x.calling_skill {
                            println!("skill     {s}");
                        }
                        println!("began     {}", x.began_at.0);
                        match x.status {
                            Some(s) => println!(
                                "ended     {} {:?}{} after {}µs",
                                x.ended_at.map(|t| t.0).unwrap_or_default(),
                                s,
                                x.error_code.map(|c| format!(" {c}")).unwrap_or_default(),
                                x.duration_us.unwrap_or_default()
                            ),
                            None => println!("ended     (no End recorded)"),
                        }
                        if let Some(o) = &x.output_digest {
                            println!("output    {o}");
                        }
                        for s in &x.side_effects {
                            println!("effect    {} {}", s.kind, s.target);
                        }
                        println!(
                            "usage     calls={} bytes_in={} bytes_out={} cpu_ms={}",
                            x.usage.calls, x.usage.bytes_in, x.usage.bytes_out, x.usage.cpu_ms
                        );
                    }
                }
                for a in &r.anomalies {
                    println!("anomaly   {a}");
                }
            }
            r.anomalies.is_empty()
        }
    };
    db.close().await;
    Ok(ok)
}

/// Runs `soulbase evidence …`; exit 0 on success, 1 on anomalies found by replay,
/// 2 on errors.
pub fn run(global: &Global, args: EvidenceArgs) -> ExitCode {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_parses_units_and_refuses_garbage() {
        assert_eq!(parse_since("90s").unwrap(), 90_000);
        assert_eq!(parse_since("2h").unwrap(), 7_200_000);
        assert_eq!(parse_since("7d").unwrap(), 604_800_000);
        assert!(parse_since("7w").is_err());
        assert!(parse_since("h").is_err());
    }
}
