//! `soulbase audit list`: the audit of changes — registry, skill states and
//! set, configuration reloads — newest first: who (`system` for a file watcher
//! or SIGHUP), what, on which target, and the hashes before and after.
//!
//! - With `--server URL` — the server's **HTTP** address (its `--http-addr`,
//!   e.g. `http://127.0.0.1:8080`; `$SOULBASE_SERVER`, a gRPC address, is not
//!   used) — it reads `GET /api/audit` as the caller `--api-key`
//!   (`$SOULBASE_API_KEY`) or `--token` (`$SOULBASE_TOKEN`) authenticates, or on
//!   a development server as `--tenant` / `--actor`. The server shows a caller
//!   its own tenant's records (every tenant's to a caller of the `global`
//!   tenant) and needs `read_evidence` on `soulbase.server.audit`.
//! - Without it, it reads the evidence database (`--database-url`, else the
//!   configuration's, like `soulbase evidence list`): every tenant's records,
//!   or `--tenant`'s.
//!
//! Text output shows instants in UTC as RFC 3339 and hashes cut to 12 digits;
//! `--json` prints `{"records": [...]}` with Unix milliseconds and whole hashes.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::json;
use soulbase_observe::{AuditFilter, AuditKind, AuditLog, AuditRecord, MAX_AUDIT_PAGE};
use soulbase_store::{Db, SqlAuditLog};
use soulbase_types::{TenantId, UnixMillis};

use crate::duration::parse_millis;
use crate::http;
use crate::options::{Common, ConfigArgs, OutputArgs};
use crate::output::{table, truncate};
use crate::target::{self, Failure, Global};
use crate::timestamp::{Zone, human};

/// Arguments of `soulbase audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// The server's HTTP URL (its --http-addr, e.g. http://127.0.0.1:8080), read
    /// through GET /api/audit; without one, the evidence database is read.
    #[arg(long, global = true, value_name = "URL")]
    server: Option<String>,
    /// With --server: API key sent as x-api-key (default: $SOULBASE_API_KEY).
    #[arg(long, global = true, value_name = "KEY")]
    api_key: Option<String>,
    /// With --server: JWT sent as `authorization: Bearer …` (default: $SOULBASE_TOKEN).
    #[arg(long, global = true, value_name = "JWT")]
    token: Option<String>,
    /// With --server on a development server: the actor sent as x-soulbase-actor
    /// (with --tenant as x-soulbase-tenant).
    #[arg(long, global = true)]
    actor: Option<String>,
    /// Without --server: the evidence database (postgres://… or sqlite:…);
    /// default: from the configuration.
    #[arg(long, global = true)]
    database_url: Option<String>,
    /// The configuration (for the database).
    #[command(flatten)]
    config: ConfigArgs,
    /// `--json`: one JSON document.
    #[command(flatten)]
    output: OutputArgs,
    #[command(subcommand)]
    command: AuditCommand,
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// The audit records, newest first.
    List(ListArgs),
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Only this tenant's records (the tenant whose view changed; `global` for
    /// the configuration, skills and global tools).
    #[arg(long)]
    tenant: Option<String>,
    /// Only this kind: registry.register, registry.update, registry.state,
    /// registry.unregister, registry.override, registry.allow_list, skill.enable,
    /// skill.disable, skills.reload, config.reload, consent.approve,
    /// consent.decline, evidence.quarantine_retry.
    #[arg(long)]
    kind: Option<String>,
    /// Only this target: a tool id, a tenant (allow-lists), a skill name, the
    /// skills directory, the configuration file or a consent request id.
    #[arg(long)]
    target: Option<String>,
    /// Records within this long before now: `90s`, `15m`, `2h`, `7d`.
    #[arg(long)]
    since: Option<String>,
    /// At most this many records (1–1000).
    #[arg(long, default_value_t = 50)]
    limit: u32,
}

/// Runs `soulbase audit …`; `common` are the options given before the
/// subcommand.
pub fn run(common: Common, args: AuditArgs) -> ExitCode {
    let AuditCommand::List(list) = args.command;
    let global = Global {
        server: args.server.or(common.server),
        api_key: args.api_key.or(common.api_key),
        token: args.token.or(common.token),
        tenant: list.tenant.clone().or(common.tenant),
        actor: args.actor.or(common.actor),
        config: args.config.config.or(common.config),
        skills_dir: None,
        json: args.output.json || common.json,
    };
    let done = filter(&global, &list).and_then(|filter| {
        target::runtime().and_then(|rt| {
            rt.block_on(async {
                let records = match &global.server {
                    Some(url) => remote(&global, url, &filter).await?,
                    None => local(&global, args.database_url, &filter).await?,
                };
                print(&records, global.json)
            })
        })
    });
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => f.report(),
    }
}

/// The filter the command line asks for (usage errors name the option).
fn filter(global: &Global, list: &ListArgs) -> Result<AuditFilter, Failure> {
    let usage = |m: String| Failure::Usage(m);
    let tenant = global
        .tenant
        .as_deref()
        .map(|t| TenantId::new(t).map_err(|e| usage(format!("--tenant: {}", e.reason))))
        .transpose()?;
    let kind = list
        .kind
        .as_deref()
        .map(|k| {
            k.parse::<AuditKind>()
                .map_err(|e| usage(format!("--kind: {}", e.message())))
        })
        .transpose()?;
    let since = list
        .since
        .as_deref()
        .map(|s| parse_millis("--since", s).map(|ms| UnixMillis(UnixMillis::now().0 - ms)))
        .transpose()
        .map_err(usage)?;
    if list.limit == 0 || list.limit > MAX_AUDIT_PAGE {
        return Err(usage(format!(
            "--limit: must be between 1 and {MAX_AUDIT_PAGE}"
        )));
    }
    Ok(AuditFilter {
        tenant,
        kind,
        target: list.target.clone(),
        since,
        until: None,
        limit: list.limit,
    })
}

/// Reads the records from the evidence database.
async fn local(
    global: &Global,
    database_url: Option<String>,
    filter: &AuditFilter,
) -> Result<Vec<AuditRecord>, Failure> {
    let url = match database_url {
        Some(u) => u,
        None => {
            let snapshot = global
                .loader(true)
                .load()
                .map_err(|e| Failure::Failed(format!("loading the configuration: {e}")))?;
            soulbase_store::database_url(snapshot.config())
        }
    };
    let db = Db::connect(&url, false)
        .await
        .map_err(|e| target::soul_detailed(&e))?;
    let records = SqlAuditLog::new(db.clone()).list(filter).await;
    db.close().await;
    records.map_err(|e| target::soul_detailed(&e))
}

/// Reads the records from a server's `GET /api/audit`.
async fn remote(
    global: &Global,
    url: &str,
    filter: &AuditFilter,
) -> Result<Vec<AuditRecord>, Failure> {
    let mut endpoint = http::endpoint(url, "/api/audit")?;
    let mut query: Vec<(&str, String)> = vec![("limit", filter.limit.to_string())];
    if let Some(t) = &filter.tenant {
        query.push(("tenant", t.to_string()));
    }
    if let Some(k) = filter.kind {
        query.push(("kind", k.as_str().to_owned()));
    }
    if let Some(t) = &filter.target {
        query.push(("target", t.clone()));
    }
    if let Some(s) = filter.since {
        query.push(("since", s.0.max(0).to_string()));
    }
    endpoint
        .query_pairs_mut()
        .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
    let request = http::authed(http::client(Duration::from_secs(60))?.get(endpoint), global)?;
    let body = http::json_answer(request, url).await?;
    serde_json::from_value(body["records"].clone()).map_err(|e| {
        Failure::Failed(format!(
            "UNKNOWN.INTERNAL: {url} answered records this CLI cannot read: {e}"
        ))
    })
}

/// The first 12 digits of a hash, `-` for none.
fn short(hash: Option<&str>) -> String {
    hash.map_or_else(|| "-".to_owned(), |h| h.chars().take(12).collect())
}

fn print(records: &[AuditRecord], json: bool) -> Result<(), Failure> {
    if json {
        println!("{}", crate::output::pretty(&json!({ "records": records })));
        return Ok(());
    }
    if records.is_empty() {
        println!("no audit records");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                human(r.at.0, Zone::Utc),
                r.tenant.to_string(),
                format!("{}/{}", r.actor_tenant, r.actor),
                r.kind.to_string(),
                r.target.clone(),
                format!(
                    "{}→{}",
                    short(r.before_hash.as_deref()),
                    short(r.after_hash.as_deref())
                ),
                truncate(&r.detail, 80),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &[
                "AT (UTC)",
                "TENANT",
                "BY",
                "KIND",
                "TARGET",
                "HASH BEFORE→AFTER",
                "DETAIL"
            ],
            &rows
        )
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(kind: Option<&str>, since: Option<&str>, limit: u32) -> ListArgs {
        ListArgs {
            tenant: None,
            kind: kind.map(str::to_owned),
            target: None,
            since: since.map(str::to_owned),
            limit,
        }
    }

    #[test]
    fn bad_options_are_usage_errors_naming_them() {
        let g = Global::default();
        for (args, flag) in [
            (list(Some("registry.explode"), None, 5), "--kind"),
            (list(None, Some("soon"), 5), "--since"),
            (list(None, None, 0), "--limit"),
        ] {
            match filter(&g, &args) {
                Err(Failure::Usage(m)) => assert!(m.starts_with(flag), "{m}"),
                other => panic!("{flag}: {other:?}"),
            }
        }
        let bad_tenant = Global {
            tenant: Some("a b".into()),
            ..Global::default()
        };
        assert!(matches!(
            filter(&bad_tenant, &list(None, None, 5)),
            Err(Failure::Usage(m)) if m.starts_with("--tenant")
        ));
        let f = filter(&g, &list(Some("skill.disable"), Some("1h"), 5)).unwrap();
        assert_eq!(f.kind, Some(AuditKind::SkillDisable));
        assert!(
            f.since
                .is_some_and(|s| s.0 <= UnixMillis::now().0 - 3_600_000)
        );
    }

    #[test]
    fn hashes_are_shortened_in_text() {
        assert_eq!(short(Some("0123456789abcdef")), "0123456789ab");
        assert_eq!(short(None), "-");
    }
}
