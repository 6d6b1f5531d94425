//! `soulbase mcp`: MCP over stdin/stdout for one tenant and actor, on the local
//! configuration (the same session as `soulbased mcp`, [`soulbase_app::stdio::serve_mcp`]).

use std::process::ExitCode;

use clap::Args;
use soulbase_app::App;

use crate::options::{Common, ConfigArgs, IdentityArgs, SkillsDirArgs};
use crate::target::{self, Failure, SERVER_ENV, soul_detailed};

/// Arguments of `soulbase mcp` (`--tenant` / `--actor` required).
///
/// It has no `--server`: it serves the local configuration (point an MCP client at
/// a server's `/mcp` endpoint instead).
#[derive(Debug, Args)]
pub struct McpArgs {
    /// Who the session acts as.
    #[command(flatten)]
    identity: IdentityArgs,
    /// The configuration.
    #[command(flatten)]
    config: ConfigArgs,
    /// The skills directory.
    #[command(flatten)]
    skills_dir: SkillsDirArgs,
    /// Binds the session to this skill: its tool set is the skill's, and its calls
    /// are made as that skill (imports checked).
    #[arg(long)]
    skill: Option<String>,
}

/// Runs `soulbase mcp` until the client closes stdin; `common` are the options
/// given before the subcommand.
pub fn run(common: Common, args: McpArgs) -> ExitCode {
    if let Err(f) = common.refuse_server("mcp") {
        return f.report();
    }
    if std::env::var_os(SERVER_ENV).is_some_and(|v| !v.is_empty()) {
        return Failure::Usage(format!(
            "mcp serves the local configuration; ${SERVER_ENV} is not supported \
             (unset it, or point the MCP client at the server's /mcp endpoint instead)"
        ))
        .report();
    }
    let global = common.local(
        args.identity,
        args.config.config,
        args.skills_dir.skills_dir,
        false,
    );
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
