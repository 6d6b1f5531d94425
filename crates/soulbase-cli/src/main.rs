//! `soulbase`: the Soulbase command line.
//!
//! A thin dispatcher: every subcommand group lives in its own module with its own
//! clap `Args` and a `run` function returning the process exit code.
//!
//! | command | what |
//! |---|---|
//! | `tools list` / `tools get ID` | the tools the tenant sees (table: id, version, state, side effect, description) / one tool in full |
//! | `tools enable ID` / `tools disable ID` | lifecycle moves (`ENABLED` / `PAUSED`), authorized by the policy (`enable` / `disable`) |
//! | `invoke ID --args JSON` | one governed call (`--idempotency-key`, `--consent-token`) |
//! | `preflight ID --args JSON` | the dry run: every check, nothing consumed, executed or recorded |
//! | `mcp` | MCP over stdio for one tenant and actor (`--skill` binds a skill) |
//! | `skills …` | validate, list, export a skills directory (CI) |
//! | `evidence show\|list\|replay` | query and replay recorded evidence (local database) |
//! | `evidence quarantine list\|retry` | records the database refused, kept in the spool; offer them again |
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
//! **Output**: aligned text by default; `--json` prints one JSON document for
//! scripts. **Exit codes**: 0 success; 1 the call was denied or failed (the stable
//! error code and message on stderr, e.g. `POLICY.DENY_TOOL: …`); 2 usage errors
//! (e.g. `--args` is not a JSON object).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod evidence;
mod mcp;
mod output;
mod skills;
mod target;
mod tools;

/// Soulbase: governed tool execution for LLM agents.
#[derive(Debug, Parser)]
#[command(
    name = "soulbase",
    version,
    about = "Soulbase: governed tool execution for LLM agents — tools, invoke, preflight and MCP \
             on a server (--server) or locally on the configuration; skills checks; evidence.",
    long_about = None
)]
struct Cli {
    #[command(flatten)]
    global: target::Global,
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
    Evidence(evidence::EvidenceArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Tools(args) => tools::run_tools(&cli.global, args),
        Command::Invoke(args) => tools::run_invoke(&cli.global, args),
        Command::Preflight(args) => tools::run_preflight(&cli.global, args),
        Command::Mcp(args) => mcp::run(&cli.global, args),
        Command::Skills(args) => skills::run(args),
        Command::Evidence(args) => evidence::run(&cli.global, args),
    }
}
