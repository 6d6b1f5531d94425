//! The options several commands share, and which command takes which.
//!
//! Each command declares the groups it uses (flattened into its own arguments), so
//! its `--help` lists exactly what it takes: only `tools`, `invoke` and `preflight`
//! reach a server, so only they offer [`ServerArgs`]. The same options are also
//! accepted before the subcommand ([`Common`]: `soulbase --server URL tools list`);
//! there an option the command has no use for is ignored, except the server options,
//! which a command that never reaches a server refuses ([`Common::refuse_server`]).

use std::path::PathBuf;

use clap::Args;

use crate::target::{Failure, Global};

/// The commands that reach a server with `--server`; every other command runs
/// locally and refuses the server options.
pub const SERVER_COMMANDS: [&str; 7] = [
    "tools",
    "invoke",
    "preflight",
    "consent",
    "audit",
    "access",
    "chat",
];

/// Where a tool command runs and how it authenticates there.
#[derive(Debug, Clone, Default, Args)]
pub struct ServerArgs {
    /// The server's gRPC URL, e.g. http://127.0.0.1:50051 (default: $SOULBASE_SERVER);
    /// without one, the command runs locally on the configuration.
    #[arg(long, global = true, value_name = "URL")]
    pub server: Option<String>,
    /// API key sent as x-api-key (default: $SOULBASE_API_KEY — prefer the variable:
    /// command-line arguments are visible to other users of the machine).
    #[arg(long, global = true, value_name = "KEY")]
    pub api_key: Option<String>,
    /// JWT sent as `authorization: Bearer …` (default: $SOULBASE_TOKEN — prefer the
    /// variable).
    #[arg(long, global = true, value_name = "JWT")]
    pub token: Option<String>,
}

/// Who a command acts as.
#[derive(Debug, Clone, Default, Args)]
pub struct IdentityArgs {
    /// The tenant to act for (local mode; development servers: x-soulbase-tenant).
    #[arg(long, global = true)]
    pub tenant: Option<String>,
    /// The actor to act as (local mode; development servers: x-soulbase-actor).
    #[arg(long, global = true)]
    pub actor: Option<String>,
}

/// The configuration file.
#[derive(Debug, Clone, Default, Args)]
pub struct ConfigArgs {
    /// The config file (default: $SOULBASE_CONFIG, else ./config.yaml if present).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// The skills directory, for commands that build the tool set.
#[derive(Debug, Clone, Default, Args)]
pub struct SkillsDirArgs {
    /// Local mode: the skills directory (skills.dir).
    #[arg(long, global = true, value_name = "DIR")]
    pub skills_dir: Option<PathBuf>,
}

/// Text or JSON output.
#[derive(Debug, Clone, Default, Args)]
pub struct OutputArgs {
    /// Print one JSON document instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

/// Everything a tool command (`tools`, `invoke`, `preflight`) takes.
#[derive(Debug, Clone, Default, Args)]
pub struct TargetArgs {
    #[command(flatten)]
    server: ServerArgs,
    #[command(flatten)]
    identity: IdentityArgs,
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    skills_dir: SkillsDirArgs,
    #[command(flatten)]
    output: OutputArgs,
}

/// The shared options given before the subcommand.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Options before the subcommand")]
pub struct Common {
    /// Tools, invoke and preflight: the server's gRPC URL (default: $SOULBASE_SERVER).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// Tools, invoke and preflight: API key sent as x-api-key (default: $SOULBASE_API_KEY).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Tools, invoke and preflight: JWT sent as a bearer token (default: $SOULBASE_TOKEN).
    #[arg(long, value_name = "JWT")]
    pub token: Option<String>,
    /// The tenant, for the commands that take --tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// The actor, for the commands that take --actor.
    #[arg(long)]
    pub actor: Option<String>,
    /// The config file, for the commands that take --config.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The skills directory, for the commands that take --skills-dir.
    #[arg(long, value_name = "DIR")]
    pub skills_dir: Option<PathBuf>,
    /// JSON output, for the commands that take --json.
    #[arg(long)]
    pub json: bool,
}

impl Common {
    /// Refuses `--server`, `--api-key` and `--token` given before `command`, which
    /// runs locally (exit 2, naming the option).
    pub fn refuse_server(&self, command: &str) -> Result<(), Failure> {
        let given = [
            ("--server", self.server.is_some()),
            ("--api-key", self.api_key.is_some()),
            ("--token", self.token.is_some()),
        ];
        match given.iter().find(|(_, set)| *set) {
            Some((flag, _)) => Err(Failure::Usage(format!(
                "{flag}: `soulbase {command}` runs locally and does not reach a server \
                 (only {} do); see `soulbase {command} --help`",
                SERVER_COMMANDS.join(", ")
            ))),
            None => Ok(()),
        }
    }

    /// The options of a tool command: its own, else those given before it.
    pub fn for_target(self, own: TargetArgs) -> Global {
        let server = own.server.server.or_else(|| self.server.clone());
        let api_key = own.server.api_key.or_else(|| self.api_key.clone());
        let token = own.server.token.or_else(|| self.token.clone());
        let local = self.local(
            own.identity,
            own.config.config,
            own.skills_dir.skills_dir,
            own.output.json,
        );
        Global {
            server,
            api_key,
            token,
            ..local
        }
    }

    /// The options of a local command: its own, else those given before it (none
    /// of the server options).
    pub fn local(
        self,
        identity: IdentityArgs,
        config: Option<PathBuf>,
        skills_dir: Option<PathBuf>,
        json: bool,
    ) -> Global {
        Global {
            server: None,
            api_key: None,
            token: None,
            tenant: identity.tenant.or(self.tenant),
            actor: identity.actor.or(self.actor),
            config: config.or(self.config),
            skills_dir: skills_dir.or(self.skills_dir),
            json: json || self.json,
        }
    }
}
