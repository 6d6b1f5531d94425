//! `soulbase`: the Soulbase command line.
//!
//! A thin dispatcher: every subcommand group lives in its own module with its own
//! clap `Args` and a `run` function returning the process exit code.
//!
//! | command | what |
//! |---|---|
//! | `tools list` / `tools get ID` | the tools the tenant sees (table: id, version, state, side effect, description) / one tool in full |
//! | `tools enable ID` / `tools disable ID` | lifecycle moves (`ENABLED` / `PAUSED`), authorized by the policy (`enable` / `disable`) |
//! | `tools export --format F [--model M]` | the tenant's tools as OpenAI / Anthropic / MCP definitions, less those whose `provider_compat` does not admit the model |
//! | `access show\|allow\|override` | the tenant's view of the global tools: its allow-list and its states of global tools |
//! | `invoke ID --args JSON` | one governed call (`--idempotency-key`, `--consent-token`) |
//! | `preflight ID --args JSON` | the dry run: every check, nothing consumed, executed or recorded |
//! | `mcp` | MCP over stdio for one tenant and actor (`--skill` binds a skill) |
//! | `skills …` | validate, list, export a skills directory (CI) |
//! | `evidence show\|list\|replay` | query and replay recorded evidence (local database) |
//! | `evidence quarantine list\|retry` | records the database refused, kept in the spool; offer them again |
//! | `audit list` | the audit of registry, skill and configuration changes (a server's `GET /api/audit` with `--server HTTP_URL`, else the local database) |
//! | `keys new` | mint an API key: the key once, and its `auth.api_keys` entry (only the digest) |
//! | `consent issue TOOL` / `consent revoke ID` | a consent token issued by the server (`--server`) or, offline, signed with `$SOULBASED_CONSENT_HMAC_KEY`; revocation by id |
//! | `chat [PROMPT] --server HTTP_URL --model M` | a conversation through the server's governed agent loop, each tool call shown as it is answered |
//! | `init [DIR]` | scaffold a project: a configuration and one working skill per provider kind |
//!
//! **Where** ([`target`]): with `--server URL` (or `$SOULBASE_SERVER`) the tool
//! commands talk gRPC to a running `soulbased` (`soulbase.tools.v1`), authenticated
//! by `--api-key` (`$SOULBASE_API_KEY`, sent as `x-api-key`), `--token`
//! (`$SOULBASE_TOKEN`, sent as `authorization: Bearer …`) or, for a development
//! server (`server.dev_insecure: true`), `--tenant` / `--actor` sent as
//! `x-soulbase-tenant` / `x-soulbase-actor`. Without a server they run locally: the
//! server's own in-process assembly ([`soulbase_app::App`]) is built from the
//! configuration (`--config FILE`, else `$SOULBASE_CONFIG`, else `./config.yaml`
//! when present; `SOULBASE_*` variables; `--skills-dir`), with the registry state,
//! idempotency records and evidence under `data_dir` (default `./data`), and the
//! call is made as `--tenant` / `--actor` (both required). The policy, quotas,
//! sandbox and evidence apply exactly as on the server; `mcp` always runs locally.
//!
//! **Options** ([`options`]): each command's `--help` lists exactly the options it
//! takes — only `tools`, `invoke` and `preflight` offer `--server`, `--api-key` and
//! `--token`. The shared options are also accepted before the subcommand
//! (`soulbase --server URL tools list`); there the server options are refused by a
//! command that runs locally, and any other option a command has no use for is
//! ignored.
//!
//! **Output**: aligned text by default; `--json` prints one JSON document for
//! scripts. Instants are shown in UTC as RFC 3339 ([`timestamp`]); JSON keeps Unix
//! milliseconds. **Exit codes**: 0 success; 1 the call was denied or failed (the stable
//! error code and message on stderr, e.g. `POLICY.DENY_TOOL: …`); 2 usage errors
//! (e.g. `--args` is not a JSON object).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod access;
mod audit;
mod chat;
mod consent;
mod duration;
mod evidence;
mod http;
mod init;
mod keys;
mod mcp;
mod options;
mod output;
mod scaffold;
mod skills;
mod target;
mod timestamp;
mod tools;

/// Soulbase: governed tool execution for LLM agents.
#[derive(Debug, Parser)]
#[command(
    name = "soulbase",
    version,
    about = "Soulbase: governed tool execution for LLM agents — tools, invoke, preflight and MCP \
             on a server (--server) or locally on the configuration; skills checks; evidence; \
             API keys, consent tokens and new projects.",
    long_about = None,
    after_help = "Each command's --help lists the options it takes. The options above may also be \
                  given before the command; there --server, --api-key and --token are refused by \
                  the commands that run locally (all but tools, invoke and preflight), and any \
                  other option a command has no use for is ignored."
)]
struct Cli {
    #[command(flatten)]
    common: options::Common,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List, inspect, enable and disable tools.
    Tools(tools::ToolsArgs),
    /// Invoke a tool through the governed pipeline.
    Invoke(tools::InvokeArgs),
    /// Dry-run a call: every check, nothing consumed, executed or recorded.
    Preflight(tools::PreflightArgs),
    /// Serve MCP over stdin/stdout for one tenant and actor (local).
    Mcp(mcp::McpArgs),
    /// Validate, list and inspect a skills directory.
    Skills(skills::SkillsArgs),
    /// Query and replay recorded evidence.
    ///
    /// Text output shows instants as RFC 3339 in UTC, and only in UTC (the CLI
    /// carries no time-zone database); --json and --format json keep Unix
    /// milliseconds.
    Evidence(evidence::EvidenceArgs),
    /// The audit of changes: registry, skill states and set, configuration
    /// reloads (from a server's HTTP API with --server, else the local database).
    Audit(audit::AuditArgs),
    /// Talk to a model through the server's governed agent loop: its tool calls
    /// run through the governed path, each shown as it is answered.
    Chat(chat::ChatArgs),
    /// Mint API keys.
    Keys(keys::KeysArgs),
    /// Show and change the tenant's view of the global tools: its allow-list and
    /// its states of global tools.
    Access(access::AccessArgs),
    /// Sign consent tokens with the server's consent key (development).
    Consent(consent::ConsentArgs),
    /// Scaffold a project: config.yaml and one working skill per provider kind.
    Init(init::InitArgs),
}

/// Restores the default action of `SIGPIPE` (Rust ignores it, so a write to a
/// closed pipe fails and `println!` panics): `soulbase evidence list | head` ends
/// quietly, as Unix tools do, when the reader stops reading. Not for `soulbase
/// mcp`, a stdio server that must see its client leave as an error and close its
/// calls' evidence, not die mid-write. (Sockets are unaffected: Rust writes to
/// them with `MSG_NOSIGNAL`.)
#[allow(unsafe_code)]
fn die_quietly_on_closed_pipes() {
    // SAFETY: setting a signal's disposition to its default before any other
    // thread exists; no handler runs Rust code.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    let Cli { common, command } = Cli::parse();
    if !matches!(command, Command::Mcp(_)) {
        die_quietly_on_closed_pipes();
    }
    match command {
        Command::Tools(mut args) => {
            let global = common.for_target(std::mem::take(&mut args.target));
            tools::run_tools(&global, args)
        }
        Command::Invoke(mut args) => {
            let global = common.for_target(std::mem::take(&mut args.target));
            tools::run_invoke(&global, args)
        }
        Command::Preflight(mut args) => {
            let global = common.for_target(std::mem::take(&mut args.target));
            tools::run_preflight(&global, args)
        }
        Command::Mcp(args) => mcp::run(common, args),
        Command::Skills(args) => skills::run(common, args),
        Command::Evidence(args) => evidence::run(common, args),
        Command::Audit(args) => audit::run(common, args),
        Command::Chat(args) => chat::run(common, args),
        Command::Keys(args) => keys::run(common, args),
        Command::Access(mut args) => {
            let global = common.for_target(std::mem::take(&mut args.target));
            access::run(&global, args)
        }
        Command::Consent(args) => consent::run(common, args),
        Command::Init(args) => init::run(common, args),
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;
    use crate::options::SERVER_COMMANDS;
    use crate::target::Failure;

    /// The command tree, built (global options propagated).
    fn tree() -> clap::Command {
        let mut cmd = Cli::command();
        cmd.build();
        cmd
    }

    /// Every command under `cmd` (its path of names), but clap's `help`.
    fn walk<'a>(
        cmd: &'a clap::Command,
        path: Vec<String>,
        out: &mut Vec<(Vec<String>, &'a clap::Command)>,
    ) {
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let mut p = path.clone();
            p.push(sub.get_name().to_owned());
            out.push((p.clone(), sub));
            walk(sub, p, out);
        }
    }

    /// The long options `cmd`'s help lists.
    fn offered(cmd: &clap::Command) -> Vec<String> {
        cmd.get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long().map(str::to_owned))
            .collect()
    }

    fn find<'a>(cmd: &'a clap::Command, path: &[&str]) -> &'a clap::Command {
        path.iter().fold(cmd, |c, name| {
            c.find_subcommand(name)
                .unwrap_or_else(|| panic!("no subcommand {name}"))
        })
    }

    #[test]
    fn the_command_tree_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn only_the_commands_that_reach_a_server_offer_the_server_options() {
        let cmd = tree();
        let mut all = Vec::new();
        walk(&cmd, Vec::new(), &mut all);
        assert!(all.len() > 20, "{}", all.len());
        for (path, sub) in all {
            let offered = offered(sub);
            let remote = SERVER_COMMANDS.contains(&path[0].as_str());
            for flag in ["server", "api-key", "token"] {
                assert_eq!(
                    offered.iter().any(|o| o == flag),
                    remote,
                    "soulbase {} --help and --{flag}: {offered:?}",
                    path.join(" ")
                );
            }
        }
        assert!(!offered(find(&cmd, &["mcp"])).contains(&"server".to_owned()));
    }

    #[test]
    fn quarantine_retry_offers_no_tenant_and_the_queries_do() {
        let cmd = tree();
        assert!(
            !offered(find(&cmd, &["evidence", "quarantine", "retry"]))
                .contains(&"tenant".to_owned())
        );
        for query in [
            &["evidence", "show"][..],
            &["evidence", "list"],
            &["evidence", "replay"],
            &["evidence", "quarantine", "list"],
        ] {
            assert!(
                offered(find(&cmd, query)).contains(&"tenant".to_owned()),
                "{query:?}"
            );
        }
    }

    #[test]
    fn options_before_the_subcommand_reach_the_commands_that_take_them() {
        let cli = Cli::try_parse_from([
            "soulbase",
            "--server",
            "http://a:1",
            "--tenant",
            "acme",
            "--json",
            "tools",
            "list",
            "--actor",
            "me",
        ])
        .unwrap();
        let Command::Tools(args) = cli.command else {
            panic!("not tools")
        };
        let g = cli.common.for_target(args.target);
        assert_eq!(g.server.as_deref(), Some("http://a:1"));
        assert_eq!(g.tenant.as_deref(), Some("acme"));
        assert_eq!(g.actor.as_deref(), Some("me"));
        assert!(g.json);
        // After the subcommand, the command's own value wins.
        let cli = Cli::try_parse_from([
            "soulbase", "--tenant", "a", "invoke", "x.y.z", "--tenant", "b",
        ])
        .unwrap();
        let Command::Invoke(args) = cli.command else {
            panic!("not invoke")
        };
        assert_eq!(
            cli.common.for_target(args.target).tenant.as_deref(),
            Some("b")
        );
    }

    #[test]
    fn a_local_command_refuses_the_server_options_before_it_and_parses_none_after() {
        for (flag, value) in [
            ("--server", "http://a:1"),
            ("--api-key", "k"),
            ("--token", "t"),
        ] {
            let cli = Cli::try_parse_from(["soulbase", flag, value, "mcp"]).unwrap();
            match cli.common.refuse_server("mcp") {
                Err(Failure::Usage(m)) => assert!(m.starts_with(flag), "{m}"),
                other => panic!("{flag}: {other:?}"),
            }
            let after = Cli::try_parse_from(["soulbase", "mcp", flag, value]).unwrap_err();
            assert_eq!(
                after.kind(),
                clap::error::ErrorKind::UnknownArgument,
                "{flag}"
            );
        }
        let cli = Cli::try_parse_from(["soulbase", "--tenant", "a", "mcp"]).unwrap();
        assert!(cli.common.refuse_server("mcp").is_ok());
    }
}
