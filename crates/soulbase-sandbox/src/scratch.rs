//! The per-call temp directory granted by a `tmp` capability: created fresh (mode
//! 0700, a name never used before), size-capped, removed when the call ends.
//!
//! This is file-system IO in the core crate, defended: every executor needs the same
//! lifecycle, and keeping it here means one implementation of "fresh, capped, gone".

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use soulbase_errors::{ErrorCode, SoulError};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh scratch directory for one call; removed (with its contents) on drop.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
    max_bytes: u64,
    max_files: Option<u64>,
}

impl Scratch {
    /// Creates a new, empty directory under `parent` (which must exist), capped at
    /// `max_bytes`. Fails with `PROVIDER.UNAVAILABLE` when it cannot be created.
    pub fn create(parent: &Path, max_bytes: u64) -> Result<Self, SoulError> {
        for _ in 0..16 {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or_default();
            let name = format!(
                "soulbase-call-{}-{}-{nanos:08x}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            );
            let path = parent.join(name);
            match fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {
                    let path = path.canonicalize().map_err(unavailable)?;
                    return Ok(Self {
                        path,
                        max_bytes,
                        max_files: None,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(unavailable(e)),
            }
        }
        Err(SoulError::of(ErrorCode::ProviderUnavailable)
            .with_note("could not find a fresh scratch directory name"))
    }

    /// The directory (absolute, symlink-free).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The cap in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Caps the number of files the call may leave here (the manifest's
    /// `limits.max_files`; `None`: no cap). Every entry counts: files,
    /// directories, links.
    pub fn limit_files(mut self, max: Option<u32>) -> Self {
        self.max_files = max.map(u64::from);
        self
    }

    /// The cap on entries, if any.
    pub fn max_files(&self) -> Option<u64> {
        self.max_files
    }

    /// Bytes currently held (regular files, recursively; symlinks not followed).
    pub fn usage(&self) -> u64 {
        self.walk().0
    }

    /// Entries currently held (files, directories and links, recursively).
    pub fn files(&self) -> u64 {
        self.walk().1
    }

    /// (bytes of regular files, entries), recursively; symlinks not followed.
    fn walk(&self) -> (u64, u64) {
        fn walk(dir: &Path, bytes: &mut u64, entries: &mut u64, depth: usize) {
            if depth > 64 {
                return;
            }
            let Ok(list) = fs::read_dir(dir) else {
                return;
            };
            for e in list.flatten() {
                *entries = entries.saturating_add(1);
                let Ok(meta) = e.metadata() else { continue };
                if meta.is_dir() {
                    walk(&e.path(), bytes, entries, depth + 1);
                } else if meta.is_file() {
                    *bytes = bytes.saturating_add(meta.len());
                }
            }
        }
        let (mut bytes, mut entries) = (0, 0);
        walk(&self.path, &mut bytes, &mut entries, 0);
        (bytes, entries)
    }

    /// Fails with `SANDBOX.CAPABILITY_BLOCKED` when the directory holds more bytes or
    /// more entries than its caps (executors call this after the tool ran; the
    /// process executor also caps each file with `RLIMIT_FSIZE` while it runs).
    pub fn check(&self) -> Result<(), SoulError> {
        let (used, files) = self.walk();
        if let Some(max) = self.max_files
            && files > max
        {
            return Err(SoulError::of(ErrorCode::SandboxCapabilityBlocked)
                .with_note(format!(
                    "the call left {files} files in its scratch space; max_files is {max}"
                ))
                .with_field("max_files", max.to_string()));
        }
        if used > self.max_bytes {
            return Err(
                SoulError::of(ErrorCode::SandboxCapabilityBlocked).with_note(format!(
                    "the call wrote {used} bytes of scratch space; {} are granted",
                    self.max_bytes
                )),
            );
        }
        Ok(())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

fn unavailable(e: io::Error) -> SoulError {
    SoulError::of(ErrorCode::ProviderUnavailable)
        .with_note("cannot create the scratch directory")
        .with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_capped_and_removed() {
        let parent = std::env::temp_dir();
        let a = Scratch::create(&parent, 10).unwrap();
        let b = Scratch::create(&parent, 10).unwrap();
        assert_ne!(a.path(), b.path());
        assert_eq!(fs::read_dir(a.path()).unwrap().count(), 0);
        fs::write(a.path().join("x"), b"12345").unwrap();
        assert!(a.check().is_ok());
        fs::create_dir(a.path().join("d")).unwrap();
        fs::write(a.path().join("d/y"), b"123456").unwrap();
        assert_eq!(a.usage(), 11);
        assert_eq!(
            a.check().unwrap_err().code(),
            ErrorCode::SandboxCapabilityBlocked
        );
        let kept = a.path().to_path_buf();
        drop(a);
        assert!(!kept.exists());
    }

    #[test]
    fn entries_are_capped_by_max_files() {
        let s = Scratch::create(&std::env::temp_dir(), 1 << 20)
            .unwrap()
            .limit_files(Some(2));
        fs::create_dir(s.path().join("d")).unwrap();
        fs::write(s.path().join("d/a"), b"").unwrap();
        assert_eq!(s.files(), 2);
        assert!(s.check().is_ok(), "two entries are within max_files 2");
        fs::write(s.path().join("b"), b"").unwrap();
        let err = s.check().unwrap_err();
        assert_eq!(err.code(), ErrorCode::SandboxCapabilityBlocked);
        assert_eq!(err.field("max_files"), Some("2"), "{err:?}");
    }
}
