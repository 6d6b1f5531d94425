//! Pieces shared by the descriptor and package parsers.

use std::path::Path;
use std::sync::Arc;

use semver::Version;
use sha2::{Digest, Sha256};
use soulbase_sandbox::ProviderBinding;
use soulbase_tools::{CompiledTool, compile};

use crate::confine::Confinement;
use crate::model::{SKILL_GROUP, Skill};
use crate::problem::SkillProblem;
use crate::risk::{ToolDecl, env_refs, manifest};

/// The SHA-256 of `bytes`, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The largest WASM module read, in bytes.
pub const MAX_MODULE_BYTES: u64 = 32 << 20;

/// Reads `path` if it is a regular file of at most `max` bytes. Special files
/// (FIFOs, devices, sockets) and directories are refused *before* opening, so a
/// FIFO can never block the loader, and the read itself is capped at `max + 1`
/// bytes so a file that grows meanwhile cannot exhaust memory. `path` should be
/// already resolved (no symlink); its `symlink_metadata` is what is checked.
pub fn read_regular_file(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("cannot read: {e}"))?;
    if !meta.is_file() {
        return Err("is not a regular file; refused".into());
    }
    if meta.len() > max {
        return Err(format!("is larger than {max} bytes; refused"));
    }
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read: {e}"))?;
    // Re-check the opened file: the path may have been swapped since.
    let opened = file.metadata().map_err(|e| format!("cannot read: {e}"))?;
    if !opened.is_file() {
        return Err("is not a regular file; refused".into());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(format!("is larger than {max} bytes; refused"));
    }
    Ok(bytes)
}

/// Checks a tool or descriptor name against the tool-id segment rules (lowercase
/// letters, digits, `_`, `-`; starts with a letter or digit; 1–64 characters).
pub fn check_segment(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err("must be 1 to 64 characters".into());
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit()) {
        return Err("must start with a lowercase letter or digit".into());
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
    {
        return Err("may contain only lowercase letters, digits, `_` and `-`".into());
    }
    Ok(())
}

/// The Agent Skills name rule for packages: 1–64 characters of lowercase letters,
/// digits and `-`, not starting or ending with `-`, no `--`.
pub fn check_package_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.chars().count() > 64 {
        return Err("must be 1 to 64 characters".into());
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err("may contain only lowercase letters, digits and `-`".into());
    }
    if name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        return Err("must not start or end with `-` or contain `--`".into());
    }
    Ok(())
}

/// Parses a skill version; `None` → `0.0.0`. A `major.minor` is read as `major.minor.0`.
pub fn parse_version(v: Option<&str>) -> Result<Version, String> {
    match v {
        None => Ok(Version::new(0, 0, 0)),
        Some(s) => Version::parse(s.trim())
            .or_else(|_| Version::parse(&format!("{}.0", s.trim())))
            .map_err(|_| format!("{s:?} is not a SemVer version (like 1.2.0)")),
    }
}

/// Post-processes a provider binding for a skill in `dir`: a WASM module path is
/// resolved inside the skills root (refused outside it) and its digest computed
/// or checked; a process `command` is resolved as [`resolve_command`] says;
/// `${ENV}` header references are checked (missing variables warn).
pub fn prepare_provider(
    binding: &mut ProviderBinding,
    dir: &Path,
    confine: &Confinement,
    file: &Path,
    field: &str,
    problems: &mut Vec<SkillProblem>,
) {
    // A WASM module is resolved first: its digest is computed when not given.
    if let ProviderBinding::Wasm { module, sha256 } = binding {
        let candidate = dir.join(&*module);
        match confine.resolve(&candidate) {
            Ok(real) => match read_regular_file(&real, MAX_MODULE_BYTES) {
                Ok(bytes) => {
                    let actual = sha256_hex(&bytes);
                    if sha256.is_empty() {
                        *sha256 = actual;
                    } else if !sha256.eq_ignore_ascii_case(&actual) {
                        problems.push(
                            SkillProblem::error(
                                file,
                                format!("does not match the module's digest {actual}"),
                            )
                            .in_field(format!("{field}.sha256")),
                        );
                    }
                    // Relative to the skills root: the WASM executor's module root.
                    if let Ok(rel) = real.strip_prefix(confine.root()) {
                        *module = rel.to_string_lossy().into_owned();
                    }
                }
                Err(e) => problems.push(
                    SkillProblem::error(file, format!("the module {e}"))
                        .in_field(format!("{field}.module")),
                ),
            },
            Err(why) => {
                problems.push(SkillProblem::error(file, why).in_field(format!("{field}.module")))
            }
        }
    }
    if let ProviderBinding::Process { command, .. } = binding {
        match resolve_command(command, dir, confine) {
            Ok(Some(real)) => *command = real,
            Ok(None) => {}
            Err(why) => {
                problems.push(SkillProblem::error(file, why).in_field(format!("{field}.command")))
            }
        }
    }
    for (f, why) in binding.validate() {
        let at = if f.is_empty() {
            field.to_owned()
        } else {
            format!("{field}.{f}")
        };
        if problems
            .iter()
            .any(|p| p.field.as_deref() == Some(at.as_str()))
        {
            continue;
        }
        problems.push(SkillProblem::error(file, why).in_field(at));
    }
    if let ProviderBinding::Http { headers, .. } = binding {
        for (name, value) in headers.iter() {
            match env_refs(value) {
                Ok(vars) => {
                    for v in vars {
                        if std::env::var_os(&v).is_none() {
                            problems.push(
                                SkillProblem::warning(
                                    file,
                                    format!("references ${{{v}}}, which is not set"),
                                )
                                .in_field(format!("{field}.headers.{name}")),
                            );
                        }
                    }
                }
                Err(why) => problems.push(
                    SkillProblem::error(file, why).in_field(format!("{field}.headers.{name}")),
                ),
            }
        }
    }
}

/// Resolves a process provider's `command` for a skill in `dir`:
///
/// - an **absolute** command is refused: a skill ships its program (e.g.
///   `scripts/run.sh`) or names one the operator put on the process executor's
///   search path;
/// - a **relative path** (`scripts/run.sh`, `./run.sh`), or a bare name that is a
///   file in the skill's folder, is resolved inside the folder, confined to the
///   skills root like a WASM module (symlinks out are refused), must be a regular
///   file, and is replaced by its absolute real path (`Ok(Some(..))`) — the form
///   the executor runs and the `proc` grant names;
/// - any other bare name (`python3`) is left for the process executor to find on
///   its operator-configured search path (`Ok(None)`).
pub fn resolve_command(
    command: &str,
    dir: &Path,
    confine: &Confinement,
) -> Result<Option<String>, String> {
    let path = Path::new(command);
    if path.is_absolute() {
        return Err(format!(
            "absolute command {command:?} refused: ship the program in the skill's folder (e.g. scripts/run.sh) and name it relatively"
        ));
    }
    let bare = path.components().count() == 1 && !command.starts_with('.');
    let candidate = dir.join(path);
    if bare && std::fs::symlink_metadata(&candidate).is_err() {
        return Ok(None);
    }
    let real = confine.resolve(&candidate)?;
    let meta =
        std::fs::symlink_metadata(&real).map_err(|e| format!("cannot read {command}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{command} is not a regular file; refused"));
    }
    Ok(Some(real.to_string_lossy().into_owned()))
}

/// The `${ENV}` references in `skill`'s HTTP headers that the HTTP executor's
/// allow-list (`sandbox.http_env_allow`) does not contain, as **warnings**: the
/// skill loads, and the executor refuses every call sending such a header
/// (`SANDBOX.CAPABILITY_BLOCKED`) until the variable is allowed — the allow-list
/// is enforced where the secret would leave, whatever was loaded.
pub fn env_not_allowed(skill: &Skill, allow: &[String]) -> Vec<SkillProblem> {
    let mut out: Vec<SkillProblem> = Vec::new();
    let (prefix, line) = match skill.kind {
        crate::model::SkillKind::Descriptor => {
            ("headers", crate::yaml::key_line(&skill.content, "headers"))
        }
        crate::model::SkillKind::Package => ("provider.headers", None),
    };
    for t in &skill.tools {
        if let ProviderBinding::Http { headers, .. } = &t.compiled.manifest.provider {
            for (name, value) in headers {
                for v in env_refs(value).unwrap_or_default() {
                    if allow.contains(&v) {
                        continue;
                    }
                    let p = SkillProblem::warning(
                        &skill.path,
                        format!(
                            "references ${{{v}}}, which is not on sandbox.http_env_allow: every call is refused (SANDBOX.CAPABILITY_BLOCKED) until it is added"
                        ),
                    )
                    .in_field(format!("{prefix}.{name}"))
                    .at_line(line);
                    if !out.contains(&p) {
                        out.push(p);
                    }
                }
            }
        }
    }
    out
}

/// Builds and compiles the manifest of one tool, reporting manifest problems
/// against `file` under `field`.
pub fn compile_tool(
    decl: ToolDecl,
    file: &Path,
    field: &str,
    line: Option<u64>,
    problems: &mut Vec<SkillProblem>,
) -> Option<Arc<CompiledTool>> {
    match compile(manifest(decl)) {
        Ok(c) => Some(Arc::new(c)),
        Err(e) => {
            for p in e.problems {
                let at = match (field.is_empty(), p.path.is_empty()) {
                    (_, true) => field.to_owned(),
                    (true, false) => p.path.clone(),
                    (false, false) => format!("{field}.{}", p.path),
                };
                problems.push(
                    SkillProblem::error(file, p.message)
                        .in_field(at)
                        .at_line(line),
                );
            }
            None
        }
    }
}

/// The tool id of `tool` in `skill`, or a problem.
pub fn tool_id(skill: &str, tool: &str) -> Result<soulbase_types::ToolId, String> {
    Skill::tool_id(skill, tool)
        .ok_or_else(|| format!("{SKILL_GROUP}.{skill}.{tool} is not a valid tool id"))
}
