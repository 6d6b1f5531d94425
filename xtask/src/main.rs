//! `cargo xtask`: Soulbase's project tasks.
//!
//! - `codegen [--check]` — regenerate `crates/soulbase-proto/src/gen` from `proto/`
//!   with protox (pure Rust, no system `protoc`), the configuration reference
//!   (`docs/configuration.md`, `docs/config.schema.json`) and the HTTP API's
//!   OpenAPI document (`docs/openapi.json`, written by a `soulbased` test);
//!   `--check` fails when stale.
//! - `migrate [--database-url URL]` — apply `migrations/postgres` (or `migrations/sqlite`
//!   for a `sqlite:` URL) to `DATABASE_URL`.
//! - `test [ARGS…]` — fmt check, clippy `-D warnings`, codegen check, then the whole test
//!   suite with Postgres and Redis provisioned (see [`services`]), the Python tools
//!   and clients installed (`.ci/python-tools`, cached) unless `SOULBASE_PYTHON_TOOLS`
//!   names them, and Node 22 with the MCP conformance suite (`.ci/node-tools`,
//!   cached) unless `SOULBASE_NODE_TOOLS` names them.
//! - `fixtures` — rebuild the sandbox test fixtures (`fixtures/wasm/*.wat` → `.wasm`).
//! - `bench [ARGS…]` — benchmarks, with the same services provisioned.
//! - `services -- CMD…` — run any command with the services provisioned.

mod codegen;
mod fixtures;
mod migrate;
mod services;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

/// An error message for the user; xtask prints it and exits non-zero.
type Result<T, E = String> = std::result::Result<T, E>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("codegen") => codegen::run(args[1..].iter().any(|a| a == "--check")),
        Some("migrate") => migrate::run(&args[1..]),
        Some("fixtures") => fixtures::run(),
        Some("test") => test(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("services") => with_services(&args[1..]),
        Some("help") | Some("--help") | Some("-h") | None => {
            print_help();
            Ok(())
        }
        Some(other) => Err(format!("unknown task {other:?}; run `cargo xtask help`")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("xtask: error: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn print_help() {
    println!(
        "cargo xtask <task>\n\n\
         codegen [--check]            regenerate gRPC code, the config reference and the OpenAPI document (--check: fail if stale)\n\
         migrate [--database-url URL] apply migrations/ to DATABASE_URL\n\
         test [ARGS...]               fmt, clippy, codegen check, and the test suite with Postgres + Redis\n\
         fixtures                     rebuild sandbox fixtures (fixtures/wasm/*.wat -> .wasm, SHA256SUMS)\n\
         bench [ARGS...]              benchmarks with Postgres + Redis\n\
         services -- CMD...           run CMD with DATABASE_URL and REDIS_URL provisioned"
    );
}

/// The workspace root (the parent of this crate).
pub(crate) fn root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

pub(crate) fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// Runs a command, echoing it, and fails with its exit status.
pub(crate) fn run_cmd(step: &str, cmd: &mut Command) -> Result<()> {
    let started = Instant::now();
    eprintln!("xtask: ▶ {step}");
    let status = cmd
        .status()
        .map_err(|e| format!("{step}: could not start {:?}: {e}", cmd.get_program()))?;
    if !status.success() {
        return Err(format!("{step} failed ({status})"));
    }
    eprintln!("xtask: ✔ {step} ({:.1}s)", started.elapsed().as_secs_f64());
    Ok(())
}

fn test(extra: &[String]) -> Result<()> {
    let started = Instant::now();
    run_cmd(
        "cargo fmt --check",
        cargo().args(["fmt", "--all", "--", "--check"]),
    )?;
    run_cmd(
        "cargo clippy -D warnings",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    // The OpenAPI document is checked by the suite below (a `soulbased` unit
    // test), not by a build of its own here.
    codegen::check_before_tests()?;
    let python_tools = python_tools()?;
    let node_tools = node_tools()?;
    let chromium = chromium()?;
    let services = services::Services::provision()?;
    let mut cmd = cargo();
    cmd.args(["test", "--workspace", "--locked"]).args(extra);
    cmd.env("SOULBASE_PYTHON_TOOLS", python_tools);
    cmd.env("SOULBASE_NODE_TOOLS", node_tools);
    cmd.env("SOULBASE_CHROMIUM", chromium);
    services.apply(&mut cmd);
    let outcome = run_cmd("cargo test", &mut cmd);
    drop(services);
    outcome?;
    eprintln!(
        "xtask: all checks passed in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The directory holding the Python tools and clients the tests use (the deploy
/// scan's, the MCP SDK, grpcio, schemathesis): `SOULBASE_PYTHON_TOOLS` when set,
/// else the virtualenv `.ci/python-tools` installs them into (once; later runs
/// reuse it).
fn python_tools() -> Result<String> {
    tool_dir(
        "SOULBASE_PYTHON_TOOLS",
        ".ci/python-tools",
        "the Python tools and clients the tests use",
        "python3 with venv and pip, and PyPI",
    )
}

/// The directory holding Node 22 and the MCP conformance suite:
/// `SOULBASE_NODE_TOOLS` when set, else what `.ci/node-tools` installs from the
/// npm registry (once; later runs reuse it).
fn node_tools() -> Result<String> {
    tool_dir(
        "SOULBASE_NODE_TOOLS",
        ".ci/node-tools",
        "Node 22 and the MCP conformance suite",
        "npm (any Node version) and the npm registry",
    )
}

/// The Chromium the console's browser tests drive: `SOULBASE_CHROMIUM` when
/// set, else what `.ci/browser` finds or installs (Debian's `chromium`, as root).
fn chromium() -> Result<String> {
    tool_dir(
        "SOULBASE_CHROMIUM",
        ".ci/browser",
        "Chromium for the console's browser tests",
        "Debian's chromium package (apt-get, as root)",
    )
}

/// `var` when set, else the directory the installer `script` prints.
fn tool_dir(var: &str, script: &str, what: &str, needs: &str) -> Result<String> {
    if let Ok(dir) = std::env::var(var) {
        return Ok(dir);
    }
    eprintln!("xtask: ▶ {script} ({what})");
    let out = Command::new(root().join(script))
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("{script} could not run: {e}; it needs {needs}"))?;
    if !out.status.success() {
        return Err(format!(
            "{script} failed ({}); it needs {needs}",
            out.status
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn bench(extra: &[String]) -> Result<()> {
    let services = services::Services::provision()?;
    let mut cmd = cargo();
    cmd.args(["bench", "--locked"]);
    if !extra
        .iter()
        .any(|a| a == "-p" || a == "--package" || a.starts_with("--package="))
    {
        cmd.arg("--workspace");
    }
    cmd.args(extra);
    services.apply(&mut cmd);
    run_cmd("cargo bench", &mut cmd)
}

fn with_services(args: &[String]) -> Result<()> {
    let args = match args.first().map(String::as_str) {
        Some("--") => &args[1..],
        _ => args,
    };
    let (program, rest) = args
        .split_first()
        .ok_or("usage: cargo xtask services -- CMD [ARGS...]")?;
    let services = services::Services::provision()?;
    let mut cmd = Command::new(program);
    cmd.args(rest);
    services.apply(&mut cmd);
    run_cmd(program, &mut cmd)
}
