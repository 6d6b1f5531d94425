//! Reading a skills directory: which files are skills, confinement, parsing.
//!
//! Layout: every `*.yaml` / `*.yml` file directly in the root is a descriptor;
//! every folder directly in the root that holds a `SKILL.md` is a package. Hidden
//! entries (`.name`) and editor leftovers (`~`, `.swp`, `.tmp`) are ignored, as
//! are other files and folders (a folder may hold a descriptor's WASM module).

use std::path::{Path, PathBuf};

use crate::confine::Confinement;
use crate::descriptor::{Parsed, parse_descriptor};
use crate::package::parse_package;
use crate::problem::SkillProblem;

/// The largest skill file read, in bytes.
pub const MAX_SKILL_FILE_BYTES: u64 = 1 << 20;

/// A skill source found in the directory.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Candidate {
    /// The file (a descriptor, or a package's `SKILL.md`), as found under the root.
    pub path: PathBuf,
    /// For a package, its folder.
    pub package_dir: Option<PathBuf>,
}

/// One file's outcome.
#[derive(Debug, Clone)]
pub struct FileOutcome {
    /// The file.
    pub path: PathBuf,
    /// SHA-256 of its bytes (empty when it could not be read).
    pub digest: String,
    /// The parse result.
    pub parsed: Parsed,
}

fn ignored(name: &str) -> bool {
    name.starts_with('.') || name.ends_with('~') || name.ends_with(".swp") || name.ends_with(".tmp")
}

/// Lists the skill sources under `root`, sorted by path.
pub fn discover(root: &Path) -> Result<Vec<Candidate>, SkillProblem> {
    let rd = std::fs::read_dir(root)
        .map_err(|e| SkillProblem::error(root, format!("cannot read the skills directory: {e}")))?;
    let mut out = Vec::new();
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if ignored(&name) {
            continue;
        }
        let path = entry.path();
        // `is_dir`/`is_file` follow symlinks; confinement is checked when read.
        if path.is_dir() {
            let md = path.join("SKILL.md");
            if md.symlink_metadata().is_ok() {
                out.push(Candidate {
                    path: md,
                    package_dir: Some(path),
                });
            }
        } else if name.ends_with(".yaml") || name.ends_with(".yml") {
            out.push(Candidate {
                path,
                package_dir: None,
            });
        }
    }
    out.sort();
    Ok(out)
}

/// Reads a candidate's bytes after the confinement check.
pub fn read_candidate(c: &Candidate, confine: &Confinement) -> Result<Vec<u8>, SkillProblem> {
    if let Some(dir) = &c.package_dir {
        confine
            .resolve(dir)
            .map_err(|why| SkillProblem::error(&c.path, why))?;
    }
    let real = confine
        .resolve(&c.path)
        .map_err(|why| SkillProblem::error(&c.path, why))?;
    crate::common::read_regular_file(&real, MAX_SKILL_FILE_BYTES)
        .map_err(|why| SkillProblem::error(&c.path, why))
}

/// Parses a candidate from its bytes.
pub fn parse_candidate(c: &Candidate, bytes: &[u8], confine: &Confinement) -> Parsed {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            return Parsed::failed(vec![SkillProblem::error(
                &c.path,
                format!("is not UTF-8 text ({e})"),
            )]);
        }
    };
    match &c.package_dir {
        Some(dir) => parse_package(&c.path, dir, text, confine),
        None => parse_descriptor(&c.path, text, confine),
    }
}

/// Reads and parses every skill source of `confine`'s root.
pub fn load_all(confine: &Confinement) -> Result<Vec<FileOutcome>, SkillProblem> {
    let candidates = discover(confine.given_root())?;
    Ok(candidates
        .iter()
        .map(|c| match read_candidate(c, confine) {
            Ok(bytes) => FileOutcome {
                path: c.path.clone(),
                digest: crate::common::sha256_hex(&bytes),
                parsed: parse_candidate(c, &bytes, confine),
            },
            Err(p) => FileOutcome {
                path: c.path.clone(),
                digest: String::new(),
                parsed: Parsed::failed(vec![p]),
            },
        })
        .collect())
}
