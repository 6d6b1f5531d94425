//! `cargo xtask fixtures`: rebuilds the sandbox test fixtures from their sources.
//!
//! - `fixtures/wasm/*.wat` → `*.wasm` with the `wat` crate (pure Rust, always works).
//! - `fixtures/wasm/*.c` → `*.wasm` with Debian's `clang --target=wasm32-wasi`
//!   (`clang`, `lld`, `wasi-libc`); skipped with a notice when clang is missing.
//!
//! The built binaries are committed, so tests never need this task; rerun it after
//! editing a source and commit the result. `fixtures/wasm/SHA256SUMS` lists the
//! digests a manifest pins.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::{Result, root, run_cmd};

/// Rebuilds every fixture and rewrites `SHA256SUMS`.
pub fn run() -> Result<()> {
    let dir = root().join("fixtures").join("wasm");
    let mut entries: Vec<_> = fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    let clang = Command::new("clang").arg("--version").output().is_ok();
    for src in &entries {
        let out = src.with_extension("wasm");
        match src.extension().and_then(|e| e.to_str()) {
            Some("wat") => {
                let bytes = wat::parse_file(src).map_err(|e| format!("{}: {e}", src.display()))?;
                fs::write(&out, bytes).map_err(|e| format!("{}: {e}", out.display()))?;
                eprintln!("xtask: built {}", rel(&out));
            }
            Some("c") if clang => run_cmd(
                &format!("clang {}", rel(src)),
                Command::new("clang")
                    .args(["--target=wasm32-wasi", "-O2", "-o"])
                    .arg(&out)
                    .arg(src),
            )?,
            Some("c") => eprintln!(
                "xtask: skipped {} (install clang, lld and wasi-libc to rebuild it)",
                rel(src)
            ),
            _ => {}
        }
    }
    let mut sums = String::new();
    let mut wasm: Vec<_> = fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "wasm"))
        .collect();
    wasm.sort();
    for w in wasm {
        let bytes = fs::read(&w).map_err(|e| format!("{}: {e}", w.display()))?;
        let name = w
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let _ = writeln!(sums, "{}  {name}", hex::encode(Sha256::digest(&bytes)));
    }
    let path = dir.join("SHA256SUMS");
    fs::write(&path, sums).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!("xtask: wrote {}", rel(&path));
    Ok(())
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}
