//! `soulbase init [DIR]`: scaffolds a working project — a configuration and one
//! skill per provider kind ([`crate::scaffold`]) — and prints the commands that run
//! it.
//!
//! It refuses to overwrite any file of the scaffold (exit 2, naming them) unless
//! `--force`, which overwrites those files and leaves every other file alone. The
//! directories it creates are made `0755` and the files `0644` (programs `0755`):
//! when `soulbased` runs as root, native tools run as `nobody` and must be able to
//! read their script. It warns when a directory on the way to the script is not
//! searchable by other users.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use soulbase_types::{ActorId, TenantId};

use crate::options::Common;
use crate::scaffold::{self, NATIVE_SCRIPT, Params, TOOLS};
use crate::target::Failure;

/// The server's default HTTP address (`server.http_addr`), which the scaffold keeps.
const SERVER_HTTP: &str = "127.0.0.1:8080";

/// Arguments of `soulbase init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// The project directory (created when missing).
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// Overwrite the scaffold's files where they exist (other files are left alone).
    #[arg(long)]
    force: bool,
    /// The tenant the configuration allows and grants, and the development identity
    /// acts for [default: dev].
    #[arg(long)]
    tenant: Option<String>,
    /// The development identity's actor [default: dev].
    #[arg(long)]
    actor: Option<String>,
    /// The loopback port of the HTTP skill's example service.
    #[arg(long, default_value_t = 8091, value_parser = clap::value_parser!(u16).range(1..))]
    service_port: u16,
}

/// Runs `soulbase init`; `common` are the options given before the subcommand.
pub fn run(common: Common, args: InitArgs) -> ExitCode {
    if let Err(f) = common.refuse_server("init") {
        return f.report();
    }
    match init(common, args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => f.report(),
    }
}

fn io_failure(what: &str, path: &Path, e: &std::io::Error) -> Failure {
    Failure::Failed(format!("cannot {what} {}: {e}", path.display()))
}

fn init(common: Common, args: InitArgs) -> Result<(), Failure> {
    let tenant = args
        .tenant
        .or(common.tenant)
        .unwrap_or_else(|| "dev".into());
    let actor = args.actor.or(common.actor).unwrap_or_else(|| "dev".into());
    TenantId::new(tenant.as_str()).map_err(|e| Failure::Usage(format!("--tenant: {e}")))?;
    ActorId::new(actor.as_str()).map_err(|e| Failure::Usage(format!("--actor: {e}")))?;
    let dir = &args.dir;

    let existing: Vec<&str> = scaffold::paths()
        .filter(|p| std::fs::symlink_metadata(dir.join(p)).is_ok())
        .collect();
    if !existing.is_empty() && !args.force {
        return Err(Failure::Usage(format!(
            "{} already exist{} in {}: pass --force to overwrite the scaffold's files \
             (other files are left alone)",
            existing.join(", "),
            if existing.len() == 1 { "s" } else { "" },
            dir.display()
        )));
    }

    ensure_dir(dir)?;
    let root = dir
        .canonicalize()
        .map_err(|e| io_failure("resolve", dir, &e))?;
    let native = root.join(NATIVE_SCRIPT);
    let native_command = native
        .to_str()
        .ok_or_else(|| {
            Failure::Usage(format!(
                "{}: the path is not UTF-8, which a proc grant cannot name",
                root.display()
            ))
        })?
        .to_owned();
    let params = Params {
        tenant,
        actor,
        service_port: args.service_port,
        native_command,
    };
    let files = scaffold::files(&params);
    for f in &files {
        write_file(&root, f)?;
    }

    let mut out = std::io::stdout().lock();
    let _ = out.write_all(summary(dir, &files, &params).as_bytes());
    if let Some(dir) = unsearchable_ancestor(&native) {
        eprintln!(
            "warning: {} is not searchable by other users: when soulbased runs as root, native \
             tools run as nobody (uid 65534) and cannot reach {NATIVE_SCRIPT} \
             (chmod o+x {0})",
            dir.display()
        );
    }
    Ok(())
}

/// Creates `dir` and its missing parents, each `0755`.
fn ensure_dir(dir: &Path) -> Result<(), Failure> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        ensure_dir(parent)?;
    }
    std::fs::create_dir(dir).map_err(|e| io_failure("create", dir, &e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| io_failure("set the mode of", dir, &e))
}

/// Writes one scaffold file under `root`, replacing what is there (a symlink is
/// replaced, never followed).
fn write_file(root: &Path, f: &scaffold::ScaffoldFile) -> Result<(), Failure> {
    let path = root.join(f.path);
    if let Some(parent) = path.parent() {
        ensure_dir(parent)?;
    }
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.is_dir() => {
            return Err(Failure::Failed(format!(
                "{} is a directory; the scaffold needs a file there",
                path.display()
            )));
        }
        Ok(_) => std::fs::remove_file(&path).map_err(|e| io_failure("replace", &path, &e))?,
        Err(_) => {}
    }
    std::fs::write(&path, &f.text).map_err(|e| io_failure("write", &path, &e))?;
    let mode = if f.executable { 0o755 } else { 0o644 };
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| io_failure("set the mode of", &path, &e))
}

/// The first directory on the way to `file` that other users cannot search.
fn unsearchable_ancestor(file: &Path) -> Option<PathBuf> {
    file.ancestors()
        .skip(1)
        .find(|d| std::fs::metadata(d).is_ok_and(|m| m.mode() & 0o001 == 0))
        .map(Path::to_path_buf)
}

/// `s` quoted for a POSIX shell when it needs it.
fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:@%+=,".contains(c));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// What was created and the commands that run it.
fn summary(dir: &Path, files: &[scaffold::ScaffoldFile], p: &Params) -> String {
    let mut s = format!("Created a Soulbase project in {}:\n", dir.display());
    let width = files.iter().map(|f| f.path.len()).max().unwrap_or(0) + 2;
    for f in files {
        s.push_str(&format!("  {:<width$}{}\n", f.path, f.what));
    }
    s.push_str("\nRun it (one shell, from the project directory):\n");
    let mut steps: Vec<(String, String)> = Vec::new();
    if dir != Path::new(".") {
        steps.push((
            format!("cd {}", shell_quote(&dir.display().to_string())),
            String::new(),
        ));
    }
    steps.extend([
        (
            "soulbase skills check skills".to_owned(),
            "validate the skills, as CI would".to_owned(),
        ),
        (
            "export SOULBASED_CONSENT_HMAC_KEY=$(python3 -c 'import secrets; print(secrets.token_hex(32))')"
                .to_owned(),
            String::new(),
        ),
        (
            "python3 services/hello_service.py &".to_owned(),
            format!("the http skill's service, 127.0.0.1:{}", p.service_port),
        ),
        (
            "soulbased --config config.yaml &".to_owned(),
            format!("HTTP and MCP on {SERVER_HTTP}, gRPC on 127.0.0.1:50051"),
        ),
    ]);
    let width = steps
        .iter()
        .filter(|(_, note)| !note.is_empty())
        .map(|(cmd, _)| cmd.len())
        .max()
        .unwrap_or(0)
        + 2;
    for (cmd, note) in &steps {
        if note.is_empty() {
            s.push_str(&format!("  {cmd}\n"));
        } else {
            s.push_str(&format!("  {cmd:<width$}# {note}\n"));
        }
    }
    s.push_str(&format!(
        "\nCall each tool (the development identity acts as tenant {}, actor {}):\n",
        p.tenant, p.actor
    ));
    for (kind, tool, example) in TOOLS {
        let consent = if kind == "process" {
            format!(
                "-H \"x-soulbase-consent: $(soulbase consent issue {tool} --tenant {} --actor {})\" ",
                p.tenant, p.actor
            )
        } else {
            String::new()
        };
        s.push_str(&format!(
            "  curl -s -X POST {consent}-d '{example}' http://{SERVER_HTTP}/api/tools/{tool}/invoke\n"
        ));
    }
    s.push_str(&format!(
        "\nThe native tool needs consent, as every native tool does: `soulbase consent issue` \
         signs the token\nwith $SOULBASED_CONSENT_HMAC_KEY, the key the server verifies it with.\n\
         \nFor production: remove server.dev_insecure and server.dev_identity from config.yaml \
         and give each\ncaller an API key: soulbase keys new --id NAME --tenant {} --actor NAME\n",
        p.tenant
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting() {
        assert_eq!(shell_quote("my-project/x"), "my-project/x");
        assert_eq!(shell_quote("my project"), "'my project'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn finds_a_directory_others_cannot_search() {
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        let file = inner.join("f");
        std::fs::write(&file, "").unwrap();
        let mode = |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
        mode(dir.path(), 0o755).unwrap();
        mode(&dir.path().join("a"), 0o700).unwrap();
        mode(&inner, 0o755).unwrap();
        assert_eq!(
            unsearchable_ancestor(&file).as_deref(),
            Some(dir.path().join("a").as_path())
        );
        mode(&dir.path().join("a"), 0o711).unwrap();
        let root_ok = unsearchable_ancestor(dir.path()).is_none();
        assert_eq!(unsearchable_ancestor(&file).is_none(), root_ok);
    }
}
