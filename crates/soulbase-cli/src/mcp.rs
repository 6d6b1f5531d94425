//! `soulbase mcp`: MCP over stdin/stdout for one tenant and actor, on the local
//! configuration (the same session as `soulbased mcp`, [`soulbase_app::stdio::serve_mcp`]).

use std::process::ExitCode;

use clap::Args;
use soulbase_app::App;

use crate::target::{self, Failure, Global, soul_detailed};

/// Arguments of `soulbase mcp` (with the global `--tenant` / `--actor`, required).
#[derive(Debug, Args)]
pub struct McpArgs {
    /// Binds the session to this skill: its tool set is the skill's, and its calls
    /// are made as that skill (imports checked).
    #[arg(long)]
    skill: Option<String>,
}

/// Runs `soulbase mcp` until the client closes stdin.
pub fn run(global: &Global, args: McpArgs) -> ExitCode {
    if global.server_url().is_some() {
        return Failure::Usage(
            "mcp serves the local configuration; --server / $SOULBASE_SERVER is not supported \
             (point the MCP client at the server's /mcp endpoint instead)"
                .into(),
        )
        .report();
    }
    let subject = match global.subject() {
        Ok(s) => s,
        Err(f) => return f.report(),
    };
    let done = target::runtime().and_then(|rt| {
        rt.block_on(async {
            // A long-lived session: the skills directory and the file are watched.
            let loader = global.loader(false);
            let (app, flush) = App::build(loader.clone(), Default::default())
                .await
                .map_err(|e| soul_detailed(&e))?;
            let _watcher = app.follow_config(loader);
            soulbase_app::stdio::serve_mcp(
                app,
                flush,
                subject.tenant.as_str(),
                subject.actor.as_str(),
                args.skill,
            )
            .await
            .map_err(Failure::Failed)
        })
    });
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => f.report(),
    }
}
