//! Where the tool commands run: a remote `soulbased` over gRPC, or the server's
//! in-process assembly built from the local configuration.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use soulbase_app::App;
use soulbase_app::evidence::EvidenceFlush;
use soulbase_config::ConfigLoader;
use soulbase_errors::SoulError;
use soulbase_grpc::Credentials;
use soulbase_types::{ActorId, Subject, TenantId};
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};

/// `$SOULBASE_SERVER`: the default for `--server`.
pub const SERVER_ENV: &str = "SOULBASE_SERVER";
/// `$SOULBASE_API_KEY`: the default for `--api-key`.
pub const API_KEY_ENV: &str = "SOULBASE_API_KEY";
/// `$SOULBASE_TOKEN`: the default for `--token`.
pub const TOKEN_ENV: &str = "SOULBASE_TOKEN";

/// The options a command runs with, resolved from its own arguments and those given
/// before the subcommand ([`crate::options`]).
#[derive(Debug, Clone, Default)]
pub struct Global {
    /// The server's gRPC URL (`--server`); without one (and no $SOULBASE_SERVER),
    /// tool commands run locally on the configuration.
    pub server: Option<String>,
    /// API key sent as x-api-key (`--api-key`, default $SOULBASE_API_KEY).
    pub api_key: Option<String>,
    /// JWT sent as `authorization: Bearer …` (`--token`, default $SOULBASE_TOKEN).
    pub token: Option<String>,
    /// The tenant to act for (`--tenant`).
    pub tenant: Option<String>,
    /// The actor to act as (`--actor`).
    pub actor: Option<String>,
    /// The config file (`--config`).
    pub config: Option<PathBuf>,
    /// The skills directory (`--skills-dir`).
    pub skills_dir: Option<PathBuf>,
    /// One JSON document instead of text (`--json`).
    pub json: bool,
}

/// Variables of the CLI itself, kept out of the configuration's environment layer
/// (`SOULBASE_SERVER` would otherwise replace the whole `server` section).
const CLI_VARS: [&str; 3] = [SERVER_ENV, API_KEY_ENV, TOKEN_ENV];

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A command's failure and its exit code.
#[derive(Debug)]
pub enum Failure {
    /// Exit 2: the command line is wrong.
    Usage(String),
    /// Exit 1: the call was denied or failed, or the target is unusable.
    Failed(String),
}

impl Failure {
    /// Prints the message to stderr and returns the exit code.
    pub fn report(self) -> ExitCode {
        match self {
            Failure::Usage(m) => {
                eprintln!("soulbase: {m}");
                ExitCode::from(2)
            }
            Failure::Failed(m) => {
                eprintln!("{m}");
                ExitCode::from(1)
            }
        }
    }
}

/// `CODE: message` for a failure.
pub fn soul(e: &SoulError) -> Failure {
    Failure::Failed(format!("{}: {}", e.code().as_str(), e.message()))
}

/// `CODE: message (causes)` for a failure to start (configuration, database).
pub fn soul_detailed(e: &SoulError) -> Failure {
    let causes = e.audit().causes.join("; ");
    if causes.is_empty() {
        soul(e)
    } else {
        Failure::Failed(format!("{}: {} ({causes})", e.code().as_str(), e.message()))
    }
}

impl Global {
    /// The server URL, if any (flag, then environment).
    pub fn server_url(&self) -> Option<String> {
        self.server.clone().or_else(|| env_nonempty(SERVER_ENV))
    }

    /// The credentials for a remote server: API key, else bearer token, else the
    /// development headers when `--tenant` and `--actor` are given.
    pub fn credentials(&self) -> Credentials {
        if let Some(k) = self.api_key.clone().or_else(|| env_nonempty(API_KEY_ENV)) {
            Credentials::ApiKey(k)
        } else if let Some(t) = self.token.clone().or_else(|| env_nonempty(TOKEN_ENV)) {
            Credentials::Bearer(t)
        } else if self.tenant.is_some() || self.actor.is_some() {
            Credentials::DevHeaders
        } else {
            Credentials::None
        }
    }

    /// The subject from `--tenant` / `--actor`, both required.
    pub fn subject(&self) -> Result<Subject, Failure> {
        let tenant = self
            .tenant
            .as_deref()
            .ok_or_else(|| Failure::Usage("--tenant is required (the tenant to act for)".into()))?;
        let actor = self
            .actor
            .as_deref()
            .ok_or_else(|| Failure::Usage("--actor is required (the actor to act as)".into()))?;
        let tenant =
            TenantId::new(tenant).map_err(|e| Failure::Usage(format!("--tenant: {}", e.reason)))?;
        let actor =
            ActorId::new(actor).map_err(|e| Failure::Usage(format!("--actor: {}", e.reason)))?;
        Ok(Subject::new(tenant, actor))
    }

    /// The subject a remote call names: `--tenant` / `--actor` when given (the
    /// development headers), else a placeholder the server replaces with the
    /// subject its credentials establish.
    pub fn remote_subject(&self) -> Result<Subject, Failure> {
        match self.credentials() {
            Credentials::DevHeaders => self.subject(),
            _ => {
                let tenant = TenantId::new("cli")
                    .map_err(|e| Failure::Failed(format!("internal: {}", e.reason)))?;
                let actor = ActorId::new("cli")
                    .map_err(|e| Failure::Failed(format!("internal: {}", e.reason)))?;
                Ok(Subject::new(tenant, actor))
            }
        }
    }

    /// The configuration loader for local mode: the file, the `SOULBASE_*`
    /// environment (without the CLI's own variables) and `--skills-dir`; for a
    /// `one_shot` run the skills directory is not watched.
    pub fn loader(&self, one_shot: bool) -> ConfigLoader {
        let env: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| !CLI_VARS.contains(&k.as_str()))
            .collect();
        let named = env
            .iter()
            .find(|(k, _)| k == "SOULBASE_CONFIG")
            .map(|(_, v)| PathBuf::from(v));
        let mut loader = ConfigLoader::new().with_env(env);
        loader = match (&self.config, named) {
            (Some(path), _) => loader.with_file(path),
            (None, Some(path)) => loader.with_file(path),
            (None, None) => loader.with_optional_file("config.yaml"),
        };
        if let Some(dir) = &self.skills_dir {
            loader = loader.with_named_flag("--skills-dir", "skills.dir", dir.to_string_lossy());
        }
        if one_shot {
            loader = loader.with_named_flag("soulbase (one-shot)", "skills.watch", "false");
        }
        loader
    }

    /// Attaches the credentials to a registry request.
    pub fn authenticate<T>(&self, req: &mut tonic::Request<T>) -> Result<(), Failure> {
        let md = req.metadata_mut();
        let value = |v: &str, what: &str| {
            MetadataValue::try_from(v)
                .map_err(|_| Failure::Usage(format!("{what}: not a valid header value")))
        };
        match self.credentials() {
            Credentials::None => {}
            Credentials::ApiKey(k) => {
                md.insert("x-api-key", value(&k, "--api-key")?);
            }
            Credentials::Bearer(t) => {
                md.insert("authorization", value(&format!("Bearer {t}"), "--token")?);
            }
            Credentials::DevHeaders => {
                let s = self.subject()?;
                md.insert("x-soulbase-tenant", value(s.tenant.as_str(), "--tenant")?);
                md.insert("x-soulbase-actor", value(s.actor.as_str(), "--actor")?);
            }
        }
        Ok(())
    }
}

/// The local in-process server.
pub struct Local {
    /// The assembled app.
    pub app: Arc<App>,
    /// Saves the registry and drains the evidence spool; call [`Local::close`].
    flush: EvidenceFlush,
    /// Who the commands act as.
    pub subject: Subject,
}

impl Local {
    /// Builds the app from the local configuration, acting as `--tenant` / `--actor`.
    pub async fn open(global: &Global) -> Result<Local, Failure> {
        let subject = global.subject()?;
        let (app, flush) = App::build(global.loader(true), Default::default())
            .await
            .map_err(|e| soul_detailed(&e))?;
        Ok(Local {
            app,
            flush,
            subject,
        })
    }

    /// Saves the registry state and drains the evidence spool into the store.
    pub async fn close(self) {
        self.flush.flush(Duration::from_secs(5)).await;
    }
}

/// A channel to `url`.
pub async fn channel(url: &str) -> Result<Channel, Failure> {
    Endpoint::from_shared(url.to_owned())
        .map_err(|e| Failure::Usage(format!("--server {url}: not a URL ({e})")))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| {
            Failure::Failed(format!(
                "PROVIDER.UNAVAILABLE: cannot reach {url}: {}",
                source_chain(&e)
            ))
        })
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A runtime for one command.
pub fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::Failed(format!("cannot start the runtime: {e}")))
}
