//! The `soulbased` binary: `soulbased [serve]` runs the server; `soulbased mcp`
//! serves MCP over stdio for one tenant/actor. See the library docs.
//!
//! Exit status: 0 after a clean stop; 1 when start-up or serving fails; 2 for a
//! bad command line; 3 ([`soulbased::server::EXIT_NOT_DRAINED`]) when a stop's
//! grace period expired with calls still running (they were cancelled, each with a
//! `cancelled` End).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use soulbase_config::ConfigLoader;
use soulbased::app::App;

/// mimalloc: many small cross-thread allocations per call (evidence records are
/// freed by their consumer).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The Soulbase server.
#[derive(Debug, Parser)]
#[command(name = "soulbased", version, about)]
struct Cli {
    /// The config file (default: $SOULBASE_CONFIG, else ./config.yaml if present).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// gRPC listen address (server.grpc_addr).
    #[arg(long, global = true)]
    grpc_addr: Option<String>,
    /// HTTP listen address (server.http_addr).
    #[arg(long, global = true)]
    http_addr: Option<String>,
    /// Development only: trust x-soulbase-tenant / x-soulbase-actor headers.
    #[arg(long, global = true)]
    dev_insecure: bool,
    /// Development quick start, no file needed: trusts identity headers, acts as
    /// tenant `dev` / actor `dev` when a request names no one, allows every tool to
    /// tenant `dev`, and prints how to connect. A config.yaml still overrides it.
    /// Never in production.
    #[arg(long, global = true)]
    dev: bool,
    /// Any configuration value, `--set path=value` (highest precedence).
    #[arg(long = "set", value_name = "PATH=VALUE", global = true)]
    set: Vec<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the configured roles (the default).
    Serve,
    /// Serve MCP over stdin/stdout, acting for one tenant and actor.
    Mcp {
        /// The tenant every call acts for.
        #[arg(long)]
        tenant: String,
        /// The actor every call acts as.
        #[arg(long)]
        actor: String,
        /// Binds the session to this skill: its tool set is the skill's, and its
        /// calls are made as that skill (imports checked).
        #[arg(long)]
        skill: Option<String>,
    },
}

fn loader(cli: &Cli) -> Result<ConfigLoader, String> {
    let mut loader = ConfigLoader::from_process_env();
    if cli.dev {
        loader = loader.with_dev_preset("--dev");
    }
    if let Some(path) = &cli.config {
        loader = loader.with_file(path);
    }
    if let Some(a) = &cli.grpc_addr {
        loader = loader.with_named_flag("--grpc-addr", "server.grpc_addr", a);
    }
    if let Some(a) = &cli.http_addr {
        loader = loader.with_named_flag("--http-addr", "server.http_addr", a);
    }
    if cli.dev_insecure {
        loader = loader.with_named_flag("--dev-insecure", "server.dev_insecure", "true");
    }
    for s in &cli.set {
        let Some((path, value)) = s.split_once('=') else {
            return Err(format!("--set {s}: expected PATH=VALUE"));
        };
        loader = loader.with_flag(path, value);
    }
    Ok(loader)
}

/// Logs to stderr (stdout carries the addresses, and MCP over stdio), filtered by
/// `RUST_LOG` / `observe.log_filter`; with an OTLP endpoint, also the
/// `execute_tool` spans over OTLP/gRPC. Must run inside the Tokio runtime.
fn init_tracing(
    filter: Option<&str>,
    otlp: Option<&str>,
) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = std::env::var("RUST_LOG")
        .ok()
        .or_else(|| filter.map(str::to_owned))
        .unwrap_or_else(|| "info,soulbase::evidence=warn".to_owned());
    let env = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(env);
    let (provider, problem) = match otlp.map(soulbased::telemetry::otlp_provider) {
        None => (None, None),
        Some(Ok(p)) => (Some(p), None),
        Some(Err(e)) => (None, Some(e)),
    };
    let otel = provider.as_ref().map(soulbased::telemetry::layer);
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init();
    if let Some(e) = problem {
        tracing::error!(error = %e, note = ?e.audit().causes, "OpenTelemetry export disabled");
    }
    if let Some(endpoint) = otlp.filter(|_| provider.is_some()) {
        tracing::info!(endpoint, "exporting execute_tool spans over OTLP");
    }
    provider
}

/// Serves until stopped; `Ok(false)` when the shutdown did not drain (calls were
/// cancelled at the end of the grace period).
async fn serve(loader: ConfigLoader, command: Option<Command>) -> Result<bool, String> {
    let options = soulbase_app::Options {
        span: Some(std::sync::Arc::new(soulbased::telemetry::execute_tool_span)),
    };
    let (app, flush) = App::build(loader.clone(), options).await.map_err(|e| {
        let a = e.audit();
        format!(
            "{}: {} {}",
            e.code().as_str(),
            e.message(),
            a.causes.join("; ")
        )
    })?;
    // Hot reload: watch the file; apply each accepted snapshot.
    let _watcher = app.follow_config(loader);
    match command {
        Some(Command::Mcp {
            tenant,
            actor,
            skill,
        }) => soulbased::stdio::serve_mcp(app, flush, &tenant, &actor, skill)
            .await
            .map(|()| true),
        Some(Command::Serve) | None => {
            soulbased::server::run(app, flush, soulbased::server::shutdown_signal())
                .await
                .map(|report| report.drained)
                .map_err(|e| {
                    let a = e.audit();
                    format!(
                        "{}: {} {}",
                        e.code().as_str(),
                        e.message(),
                        a.causes.join("; ")
                    )
                })
        }
    }
}

fn main() -> ExitCode {
    // SAFETY: first thing in `main`: nothing can be opening SQLite yet.
    #[allow(unsafe_code)]
    unsafe {
        soulbased::evidence::install_sqlite_allocator();
    }
    let cli = Cli::parse();
    let loader = match loader(&cli) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("soulbased: {e}");
            return ExitCode::from(2);
        }
    };
    let observe = loader
        .load()
        .ok()
        .map(|s| s.config().observe.clone())
        .unwrap_or_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("soulbased: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let provider = {
        let _rt = runtime.enter();
        init_tracing(
            observe.log_filter.as_deref(),
            observe.otlp_endpoint.as_deref(),
        )
    };
    let served = runtime.block_on(serve(loader, cli.command));
    if let Some(p) = provider
        && let Err(e) = p.shutdown_with_timeout(Duration::from_secs(5))
    {
        tracing::warn!(error = %e, "flushing OpenTelemetry spans failed");
    }
    match served {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(soulbased::server::EXIT_NOT_DRAINED),
        Err(e) => {
            eprintln!("soulbased: {e}");
            ExitCode::FAILURE
        }
    }
}
