//! Structural path matching: paths are normalized and compared by components, never
//! as strings, and symlinks are resolved before a check.
//!
//! The lexical half ([`normalize`], [`path_covers`]) does no IO. [`resolve`] reads
//! file-system metadata (it follows symlinks through `canonicalize`); that is the one
//! IO this crate does, and it is unavoidable: a check on the unresolved path would let
//! `granted/link -> /etc` through.

use std::io;
use std::path::{Component, Path, PathBuf};

use soulbase_errors::{ErrorCode, SoulError};

/// Lexically normalizes `path`: drops `.` components and resolves `..` against the
/// components before it. Returns `None` when `..` would climb above the start of the
/// path (for a relative path) or above `/` — an escape is never silently clamped.
pub fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    let mut depth = 0usize;
    for c in path.components() {
        match c {
            Component::Prefix(_) => return None,
            Component::RootDir => out.push("/"),
            Component::CurDir => {}
            Component::ParentDir => {
                if depth == 0 {
                    return None;
                }
                out.pop();
                depth -= 1;
            }
            Component::Normal(n) => {
                out.push(n);
                depth += 1;
            }
        }
    }
    Some(out)
}

/// Whether the granted path `grant` covers `target`: `target` is `grant` itself or
/// lies below it, compared component by component after lexical normalization.
/// `/data` covers `/data/x` but not `/database`; a `..` escape never matches.
pub fn path_covers(grant: &Path, target: &Path) -> bool {
    match (normalize(grant), normalize(target)) {
        (Some(g), Some(t)) => t.starts_with(g),
        _ => false,
    }
}

/// Resolves `path` to the absolute, symlink-free path the kernel would open.
///
/// A relative path is taken relative to `root` (refused without one). The longest
/// existing ancestor is canonicalized (following every symlink); components that do
/// not exist yet are appended lexically, and a `..` among them is refused. So the
/// result is what a check must compare, also for a file about to be created.
pub fn resolve(path: &Path, root: Option<&Path>) -> Result<PathBuf, SoulError> {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        match root {
            Some(r) => r.join(path),
            None => {
                return Err(blocked(format!(
                    "relative path {} needs a sandbox root",
                    path.display()
                )));
            }
        }
    };
    let mut existing = joined.as_path();
    let mut rest: Vec<&std::ffi::OsStr> = Vec::new();
    loop {
        match existing.canonicalize() {
            Ok(mut base) => {
                for part in rest.iter().rev() {
                    if *part == ".." {
                        return Err(blocked(format!(
                            "path {} climbs out of a directory that does not exist",
                            path.display()
                        )));
                    }
                    if *part != "." {
                        base.push(part);
                    }
                }
                return Ok(base);
            }
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || e.kind() == io::ErrorKind::NotADirectory =>
            {
                let name = existing.file_name();
                let parent = existing.parent();
                match (name, parent) {
                    (Some(n), Some(p)) => {
                        rest.push(n);
                        existing = p;
                    }
                    // `..` as the last component has no file_name: resolve lexically.
                    _ => match normalize(existing) {
                        Some(n) if n != existing => {
                            return resolve(&n.join(rest.iter().rev().collect::<PathBuf>()), root);
                        }
                        _ => {
                            return Err(blocked(format!(
                                "path {} cannot be resolved",
                                path.display()
                            )));
                        }
                    },
                }
            }
            Err(e) => {
                return Err(blocked(format!(
                    "path {} cannot be resolved: {e}",
                    path.display()
                )));
            }
        }
    }
}

fn blocked(note: String) -> SoulError {
    SoulError::of(ErrorCode::SandboxCapabilityBlocked).with_note(note)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_resolves_dots_and_refuses_escapes() {
        assert_eq!(
            normalize(Path::new("/a/./b/../c")),
            Some(PathBuf::from("/a/c"))
        );
        assert_eq!(normalize(Path::new("a/b/..")), Some(PathBuf::from("a")));
        assert_eq!(normalize(Path::new("/..")), None);
        assert_eq!(normalize(Path::new("../x")), None);
        assert_eq!(normalize(Path::new("a/../../x")), None);
    }

    #[test]
    fn covers_by_components() {
        assert!(path_covers(Path::new("/data"), Path::new("/data")));
        assert!(path_covers(Path::new("/data"), Path::new("/data/x/y")));
        assert!(path_covers(Path::new("/data/"), Path::new("/data/x")));
        assert!(!path_covers(Path::new("/data"), Path::new("/database")));
        assert!(!path_covers(
            Path::new("/data"),
            Path::new("/data/../etc/passwd")
        ));
        assert!(path_covers(Path::new("/data"), Path::new("/data/a/../b")));
        assert!(!path_covers(Path::new("/data/x"), Path::new("/data")));
        assert!(!path_covers(Path::new("data"), Path::new("/data")));
    }
}
