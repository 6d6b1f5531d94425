//! `soulbase skills …`: validate, list and inspect a skills directory.
//!
//! - `check [DIR]` — validates the directory exactly as the server loads it (the
//!   same function, the same severities, the checks the configuration asks for,
//!   such as `sandbox.http_env_allow`); prints one line per problem
//!   (`error: path:line: field: reason`) and exits 1 when any is an error (for
//!   CI; a file with an error is one the server does not load), 0 otherwise.
//!   `--format json` prints a JSON report.
//! - `list [DIR]` — name and short description of every valid skill.
//! - `show NAME [--dir DIR]` — the skill's document, verbatim.
//! - `export [DIR] [--skill NAME] [--format openai|anthropic] [--strict]` — the
//!   tool list a model would see (for a skill: core ∪ own ∪ imports).
//! - `prompt [DIR]` — the system-prompt sections for the enabled tools and skills.
//!
//! `DIR` defaults to `skills.dir` of the configuration (`--config`, else
//! `$SOULBASE_CONFIG` or `./config.yaml`; `SKILLS_DIR`), then `./skills`. The
//! directory may be anywhere; every skill file must resolve (symlinks followed)
//! inside it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use soulbase_skills::model::Date;
use soulbase_skills::{CatalogOptions, SkillCatalog, SkillSet, check_dir_with};
use soulbase_tools::Registry;
use soulbase_tools::discovery::{anthropic, openai};
use soulbase_types::TenantId;

use crate::options::{Common, ConfigArgs};

/// Arguments of `soulbase skills`.
#[derive(Debug, Args)]
pub struct SkillsArgs {
    /// The configuration naming the default directory.
    #[command(flatten)]
    config: ConfigArgs,
    #[command(subcommand)]
    command: SkillsCommand,
}

#[derive(Debug, Clone, Args)]
struct DirArgs {
    /// The skills directory (default: skills.dir of the configuration or $SKILLS_DIR, then ./skills).
    dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ReportFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ExportFormat {
    Openai,
    Anthropic,
}

#[derive(Debug, Subcommand)]
enum SkillsCommand {
    /// Validate every skill and the cross-skill contracts; exit 1 on any error.
    Check {
        #[command(flatten)]
        dir: DirArgs,
        /// Output format.
        #[arg(long, value_enum, default_value = "text")]
        format: ReportFormat,
        /// Treat warnings as errors.
        #[arg(long)]
        deny_warnings: bool,
        /// Check deprecation windows as of this date (YYYY-MM-DD) instead of today.
        #[arg(long)]
        today: Option<String>,
    },
    /// List the valid skills: name and short description.
    List {
        #[command(flatten)]
        dir: DirArgs,
    },
    /// Print a skill's document (SKILL.md or descriptor) verbatim.
    Show {
        /// The skill name.
        name: String,
        /// The skills directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Print the tool list a model would see, in a provider's format.
    Export {
        #[command(flatten)]
        dir: DirArgs,
        /// Only what this skill may use (core ∪ own ∪ imports).
        #[arg(long)]
        skill: Option<String>,
        /// Provider format.
        #[arg(long, value_enum, default_value = "openai")]
        format: ExportFormat,
        /// OpenAI strict mode.
        #[arg(long)]
        strict: bool,
    },
    /// Print the system-prompt sections for the enabled tools and skills.
    Prompt {
        #[command(flatten)]
        dir: DirArgs,
    },
}

/// Runs `soulbase skills`; `common` are the options given before the subcommand.
pub fn run(common: Common, args: SkillsArgs) -> ExitCode {
    if let Err(f) = common.refuse_server("skills") {
        return f.report();
    }
    let config = args.config.config.or(common.config);
    let config = config.as_deref();
    let result = match args.command {
        SkillsCommand::Check {
            dir,
            format,
            deny_warnings,
            today,
        } => check(&dir, config, format, deny_warnings, today.as_deref()),
        SkillsCommand::List { dir } => list(&dir, config),
        SkillsCommand::Show { name, dir } => show(&DirArgs { dir }, config, &name),
        SkillsCommand::Export {
            dir,
            skill,
            format,
            strict,
        } => export(&dir, config, skill.as_deref(), format, strict),
        SkillsCommand::Prompt { dir } => prompt(&dir, config),
    };
    match result {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
    }
}

/// The directory: the argument, else `skills.dir` from the layered configuration
/// (`config`, else `config.yaml` or `SOULBASE_CONFIG`, then `SKILLS_DIR`), else
/// `./skills`.
fn resolve_dir(args: &DirArgs, config: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(d) = &args.dir {
        return Ok(d.clone());
    }
    Ok(shown_dir(&load_config(config)?.skills.dir))
}

/// The layered configuration (`config`, else `config.yaml` or `SOULBASE_CONFIG`,
/// then the environment), as the server reads it.
fn load_config(config: Option<&Path>) -> Result<soulbase_config::Config, String> {
    let mut loader = soulbase_config::ConfigLoader::from_process_env();
    if let Some(file) = config {
        loader = loader.with_file(file);
    }
    let snapshot = loader.load().map_err(|e| e.to_string())?;
    Ok(snapshot.config().clone())
}

/// `./skills` shown as `skills`.
fn shown_dir(dir: &Path) -> PathBuf {
    match dir.strip_prefix("./") {
        Ok(rel) if !rel.as_os_str().is_empty() => rel.to_path_buf(),
        _ => dir.to_path_buf(),
    }
}

/// The options the server would load the skills with (`CatalogOptions::for_config`
/// of the same layered configuration), on `DIR` when given.
fn check_options(args: &DirArgs, config: Option<&Path>) -> Result<CatalogOptions, String> {
    let cfg = load_config(config)?;
    let mut options = CatalogOptions::for_config(&cfg);
    options.root = match &args.dir {
        Some(d) => d.clone(),
        None => shown_dir(&cfg.skills.dir),
    };
    Ok(options)
}

fn check(
    args: &DirArgs,
    config: Option<&Path>,
    format: ReportFormat,
    deny_warnings: bool,
    today: Option<&str>,
) -> Result<ExitCode, String> {
    let options = check_options(args, config)?;
    let dir = options.root.clone();
    let today = match today {
        Some(t) => Date::parse(t).ok_or_else(|| format!("--today {t:?} is not YYYY-MM-DD"))?,
        None => Date::today(),
    };
    let set = check_dir_with(&options, today).map_err(|p| p.to_string())?;
    let errors = set.problems().iter().filter(|p| p.is_error()).count();
    let warnings = set.problems().len() - errors;
    let failed = errors > 0 || (deny_warnings && warnings > 0);
    let mut out = std::io::stdout().lock();
    match format {
        ReportFormat::Text => {
            for p in set.problems() {
                let _ = writeln!(out, "{p}");
            }
            let _ = writeln!(
                out,
                "{}: {} skill(s) in {}, {errors} error(s), {warnings} warning(s)",
                if failed { "FAILED" } else { "ok" },
                set.len(),
                dir.display()
            );
        }
        ReportFormat::Json => {
            let report = json!({
                "ok": !failed,
                "dir": dir.display().to_string(),
                "skills": set.skills().map(|s| json!({
                    "name": s.name,
                    "kind": s.kind,
                    "path": s.path.display().to_string(),
                    "tools": s.tools.iter().map(|t| t.id().as_str()).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
                "errors": errors,
                "warnings": warnings,
                "problems": set.problems(),
            });
            let _ = writeln!(out, "{report:#}");
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn open(
    args: &DirArgs,
    config: Option<&Path>,
) -> Result<(SkillCatalog, std::sync::Arc<SkillSet>), String> {
    let dir = resolve_dir(args, config)?;
    let (catalog, report) = SkillCatalog::open(Registry::new(), CatalogOptions::new(&dir))
        .map_err(|e| e.message().to_owned())?;
    for p in report.errors() {
        eprintln!("{p}");
    }
    let set = catalog.current();
    Ok((catalog, set))
}

fn list(args: &DirArgs, config: Option<&Path>) -> Result<ExitCode, String> {
    let (_, set) = open(args, config)?;
    let mut out = std::io::stdout().lock();
    for s in soulbase_skills::list_skills(&set).iter() {
        let _ = writeln!(out, "{}\t{}", s.name, s.description);
    }
    Ok(ExitCode::SUCCESS)
}

fn show(args: &DirArgs, config: Option<&Path>, name: &str) -> Result<ExitCode, String> {
    let (_, set) = open(args, config)?;
    let info = soulbase_skills::get_skill_info(&set, name).map_err(|e| e.message().to_owned())?;
    let _ = std::io::stdout().lock().write_all(info.content.as_bytes());
    Ok(ExitCode::SUCCESS)
}

fn tenant() -> Result<TenantId, String> {
    TenantId::new("default").map_err(|e| e.to_string())
}

fn export(
    args: &DirArgs,
    config: Option<&Path>,
    skill: Option<&str>,
    format: ExportFormat,
    strict: bool,
) -> Result<ExitCode, String> {
    let (catalog, set) = open(args, config)?;
    let view = catalog.registry().view();
    let tenant = tenant()?;
    let specs = match skill {
        Some(s) => soulbase_skills::tools_for_skill(&set, &view, &tenant, s)
            .map_err(|e| e.message().to_owned())?,
        None => soulbase_skills::views::enabled_tools(&set, &view, &tenant),
    };
    let exported = match format {
        ExportFormat::Openai => openai::export(&specs, strict),
        ExportFormat::Anthropic => anthropic::export(&specs),
    };
    for w in &exported.warnings {
        eprintln!("warning: {}: {}: {}", w.tool, w.location, w.message);
    }
    let _ = writeln!(std::io::stdout().lock(), "{:#}", json!(exported.tools));
    Ok(ExitCode::SUCCESS)
}

fn prompt(args: &DirArgs, config: Option<&Path>) -> Result<ExitCode, String> {
    let (catalog, set) = open(args, config)?;
    let view = catalog.registry().view();
    let tools = soulbase_skills::views::enabled_tools(&set, &view, &tenant()?);
    let text =
        soulbase_skills::system_prompt_sections(&tools, &soulbase_skills::list_skills(&set), None);
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(ExitCode::SUCCESS)
}
