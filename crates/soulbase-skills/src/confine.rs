//! Path confinement: a skill file must resolve (symlinks included) inside the
//! skills root and, when required, inside the working directory.

use std::path::{Path, PathBuf};

/// Where skill files may live.
#[derive(Debug, Clone)]
pub struct Confinement {
    given: PathBuf,
    root: PathBuf,
    within: Option<PathBuf>,
}

impl Confinement {
    /// Files must resolve inside `root` (canonicalized here) and, if given, inside
    /// `within` (e.g. the working directory). Errors when a directory cannot be
    /// resolved or `root` itself lies outside `within`.
    pub fn new(root: &Path, within: Option<&Path>) -> Result<Self, String> {
        let real_root = std::fs::canonicalize(root)
            .map_err(|e| format!("cannot open the skills directory {}: {e}", root.display()))?;
        if !real_root.is_dir() {
            return Err(format!("{} is not a directory", root.display()));
        }
        let within = match within {
            Some(w) => {
                let real = std::fs::canonicalize(w)
                    .map_err(|e| format!("cannot resolve {}: {e}", w.display()))?;
                if !real_root.starts_with(&real) {
                    return Err(format!(
                        "the skills directory {} resolves to {}, outside the working directory {}",
                        root.display(),
                        real_root.display(),
                        real.display()
                    ));
                }
                Some(real)
            }
            None => None,
        };
        Ok(Self {
            given: root.to_path_buf(),
            root: real_root,
            within,
        })
    }

    /// The skills root as given (paths in reports are shown under it).
    pub fn given_root(&self) -> &Path {
        &self.given
    }

    /// The canonical skills root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves `path` (following symlinks) and checks it stays inside the root and
    /// the working directory; the error names where it resolves to.
    pub fn resolve(&self, path: &Path) -> Result<PathBuf, String> {
        let real = std::fs::canonicalize(path)
            .map_err(|e| format!("cannot resolve {}: {e}", path.display()))?;
        if !real.starts_with(&self.root) {
            return Err(format!(
                "resolves to {}, outside the skills directory {}; refused",
                real.display(),
                self.root.display()
            ));
        }
        if let Some(w) = &self.within
            && !real.starts_with(w)
        {
            return Err(format!(
                "resolves to {}, outside the working directory {}; refused",
                real.display(),
                w.display()
            ));
        }
        Ok(real)
    }
}
