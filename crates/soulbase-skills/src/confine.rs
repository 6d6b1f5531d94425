//! Path confinement: a skill file must resolve (symlinks included) inside the
//! skills root.
//!
//! The skills root itself may live anywhere — `/etc/soulbase/skills` in the image,
//! a ConfigMap mount in Kubernetes, a path an MCP host names while starting
//! `soulbased mcp` from its own directory. Where the process runs from does not
//! matter; what is confined is every file read through the root.

use std::path::{Path, PathBuf};

/// Where skill files may live.
#[derive(Debug, Clone)]
pub struct Confinement {
    given: PathBuf,
    root: PathBuf,
}

impl Confinement {
    /// Files must resolve inside `root` (canonicalized here). Errors when the
    /// directory cannot be resolved or is not a directory.
    pub fn new(root: &Path) -> Result<Self, String> {
        let real_root = std::fs::canonicalize(root)
            .map_err(|e| format!("cannot open the skills directory {}: {e}", root.display()))?;
        if !real_root.is_dir() {
            return Err(format!("{} is not a directory", root.display()));
        }
        Ok(Self {
            given: root.to_path_buf(),
            root: real_root,
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

    /// Resolves `path` (following symlinks) and checks it stays inside the root;
    /// the error names where it resolves to.
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
        Ok(real)
    }
}
