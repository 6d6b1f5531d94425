//! `cargo xtask codegen`: proto/ → crates/soulbase-proto/src/gen, the
//! configuration reference generated from the config model (`docs/configuration.md`,
//! `docs/config.schema.json`), and the HTTP API's OpenAPI document generated from
//! the server's code (`docs/openapi.json`).

use std::fs;
use std::path::{Path, PathBuf};

use prost::Message;

use crate::{Result, cargo, root, run_cmd};

/// Every `.proto` file under `dir`, sorted, relative to `dir`.
fn proto_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = fs::read_dir(&d).map_err(|e| format!("reading {}: {e}", d.display()))?;
        for entry in entries {
            let path = entry
                .map_err(|e| format!("reading {}: {e}", d.display()))?
                .path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "proto") {
                let rel = path.strip_prefix(dir).map_err(|e| e.to_string())?;
                out.push(rel.to_path_buf());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Generates all code into `out` (which must exist and be empty).
fn generate(out: &Path) -> Result<()> {
    let proto_dir = root().join("proto");
    let files = proto_files(&proto_dir)?;
    if files.is_empty() {
        return Err(format!("no .proto files under {}", proto_dir.display()));
    }
    let fds =
        protox::compile(&files, [&proto_dir]).map_err(|e| format!("compiling protos: {e:?}"))?;
    fs::write(out.join("descriptor.bin"), fds.encode_to_vec()).map_err(|e| e.to_string())?;
    tonic_prost_build::configure()
        .out_dir(out)
        .include_file("mod.rs")
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .compile_fds(fds)
        .map_err(|e| format!("generating Rust code: {e}"))?;
    Ok(())
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    if !dir.exists() {
        return Ok(files);
    }
    for entry in fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let bytes = fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        files.push((name, bytes));
    }
    files.sort();
    Ok(files)
}

/// Regenerates the committed code and docs, or with `check` verifies they are up
/// to date.
pub fn run(check: bool) -> Result<()> {
    grpc(check)?;
    config_reference(check)?;
    openapi(check)
}

/// The check `cargo xtask test` makes before the test suite: all of `run(true)`
/// but the OpenAPI document's, which the suite itself checks (its test is one of
/// `soulbased`'s unit tests), so the document costs no build of its own there —
/// `cargo test -p soulbased` alone would build the server's dependencies with
/// other features than the workspace build that follows.
pub fn check_before_tests() -> Result<()> {
    grpc(true)?;
    config_reference(true)
}

/// The test that holds `docs/openapi.json` to what `soulbased::openapi::document`
/// generates; with `SOULBASE_BLESS` set it writes the file instead.
const OPENAPI_TEST: &str = "openapi::tests::the_committed_document_is_generated";

/// The OpenAPI document of the HTTP API, `docs/openapi.json`. It is generated
/// from the server's code (route table, body types, the stable codes), so xtask
/// asks the server's own test to write or check it rather than linking the
/// server (which would build it with xtask's features).
fn openapi(check: bool) -> Result<()> {
    let mut cmd = cargo();
    cmd.args([
        "test",
        "-p",
        "soulbased",
        "--lib",
        "--",
        "--exact",
        OPENAPI_TEST,
    ]);
    if check {
        cmd.env_remove("SOULBASE_BLESS");
        run_cmd("the OpenAPI document is up to date", &mut cmd).map_err(|e| {
            format!("{e}: docs/openapi.json is stale; run `cargo xtask codegen` and commit")
        })
    } else {
        cmd.env("SOULBASE_BLESS", "1");
        run_cmd("generate docs/openapi.json", &mut cmd)
    }
}

/// The configuration reference: its Markdown and its JSON Schema.
fn config_reference(check: bool) -> Result<()> {
    let schema = serde_json::to_string_pretty(&soulbase_config::reference::json_schema())
        .map_err(|e| format!("encoding the config schema: {e}"))?
        + "\n";
    let files = [
        (
            "docs/configuration.md",
            soulbase_config::reference::markdown(),
        ),
        ("docs/config.schema.json", schema),
    ];
    for (rel, fresh) in files {
        let path = root().join(rel);
        let committed = fs::read_to_string(&path).unwrap_or_default();
        if committed == fresh {
            continue;
        }
        if check {
            return Err(format!(
                "{rel} is stale (the config model changed); run `cargo xtask codegen` and commit"
            ));
        }
        fs::write(&path, fresh).map_err(|e| format!("writing {rel}: {e}"))?;
        eprintln!("xtask: ✔ generated {rel}");
    }
    if check {
        eprintln!("xtask: ✔ the configuration reference is up to date");
    }
    Ok(())
}

/// The gRPC code.
fn grpc(check: bool) -> Result<()> {
    let target = root().join("crates/soulbase-proto/src/gen");
    let tmp = tempfile::tempdir().map_err(|e| format!("creating a temp dir: {e}"))?;
    generate(tmp.path())?;
    let fresh = read_dir_sorted(tmp.path())?;
    if check {
        let committed = read_dir_sorted(&target)?;
        if committed != fresh {
            let names: Vec<&str> = fresh.iter().map(|(n, _)| n.as_str()).collect();
            return Err(format!(
                "generated gRPC code in {} is stale (expected files {names:?}); run `cargo xtask codegen` and commit",
                target.display()
            ));
        }
        eprintln!("xtask: ✔ codegen is up to date");
        return Ok(());
    }
    if target.exists() {
        fs::remove_dir_all(&target).map_err(|e| format!("clearing {}: {e}", target.display()))?;
    }
    fs::create_dir_all(&target).map_err(|e| e.to_string())?;
    for (name, bytes) in fresh {
        fs::write(target.join(&name), bytes).map_err(|e| format!("writing {name}: {e}"))?;
    }
    eprintln!("xtask: ✔ generated {}", target.display());
    Ok(())
}
