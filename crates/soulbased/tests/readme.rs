//! The README's quick start and tour run as written, against the built binaries.
//!
//! The blocks between `<!-- tour -->` and `<!-- /tour -->` in `README.md` are run in
//! order, in a fresh directory holding a copy of the repository's `skills/`, with
//! nothing else written: the first (`cargo run … -p soulbased -- --dev`) starts the
//! server in the background; every later `sh` block runs under `bash -euo pipefail`
//! and every `python` block with the test's Python (which has the `mcp` SDK). A
//! `cargo` on `PATH` maps `cargo run [--release] -p PKG -- ARGS` onto the binaries
//! this test run built, so no nested build happens. The only rewrite is the two
//! listen addresses (`127.0.0.1:8080`, `127.0.0.1:50051`), replaced by the ports the
//! server bound, so the test never depends on those ports being free.
//!
//! A block followed by a `text` block must print what that block shows, `…`
//! standing for any text (compared with whitespace runs collapsed). Every `yaml`
//! block of the README must load as a valid `config.yaml`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const README_ADDR_HTTP: &str = "127.0.0.1:8080";
const README_ADDR_GRPC: &str = "127.0.0.1:50051";

/// A fenced block: its info string's first word and its text.
#[derive(Debug, Clone)]
struct Block {
    lang: String,
    body: String,
    line: usize,
}

fn readme() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join("README.md")).unwrap()
}

fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (n, line) in text.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                open = Some(Block {
                    lang: info.split_whitespace().next().unwrap_or("").to_owned(),
                    body: String::new(),
                    line: n + 1,
                });
            }
            (Some(_), Some(_)) => out.push(open.take().unwrap()),
            (Some(b), None) => {
                b.body.push_str(line);
                b.body.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "README.md: an unclosed code block");
    out
}

/// The tour: the blocks between the markers.
fn tour(text: &str) -> Vec<Block> {
    let start = text
        .find("<!-- tour -->")
        .expect("README.md has no <!-- tour --> marker");
    let end = text
        .find("<!-- /tour -->")
        .expect("README.md has no <!-- /tour --> marker");
    let before = text[..start].lines().count();
    blocks(&text[start..end])
        .into_iter()
        .map(|mut b| {
            b.line += before;
            b
        })
        .collect()
}

/// Whether `actual` shows `expected`, `…` standing for any text: the pieces between
/// the `…`s appear in order, the first at the start and the last at the end.
fn shows(actual: &str, expected: &str) -> bool {
    let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let actual = squash(actual);
    let pieces: Vec<String> = expected.split('…').map(squash).collect();
    let (first, rest) = pieces.split_first().expect("split yields one piece");
    let Some(mut left) = actual.strip_prefix(first.as_str()) else {
        return false;
    };
    let Some((last, middle)) = rest.split_last() else {
        return left.is_empty();
    };
    for piece in middle {
        match left.find(piece.as_str()) {
            Some(at) => left = &left[at + piece.len()..],
            None => return false,
        }
    }
    left.ends_with(last.as_str())
}

/// A directory with a `cargo` that runs this test run's binaries.
fn shims(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = format!(
        r#"#!/bin/sh
# The README test's cargo: `cargo run [--release] -p PKG [--] ARGS` runs PKG's binary.
[ "$1" = run ] || {{ echo "the README test runs only 'cargo run', not: cargo $*" >&2; exit 2; }}
shift
pkg=
while [ $# -gt 0 ]; do
  case "$1" in
    --release|-q) shift ;;
    -p) pkg=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "the README test's cargo does not know $1" >&2; exit 2 ;;
  esac
done
case "$pkg" in
  soulbased) exec '{server}' "$@" ;;
  soulbase-cli) exec '{cli}' "$@" ;;
  *) echo "the README test's cargo cannot run package $pkg" >&2; exit 2 ;;
esac
"#,
        server = env!("CARGO_BIN_EXE_soulbased"),
        cli = common::cli_bin().display(),
    );
    let cargo = bin.join("cargo");
    std::fs::write(&cargo, script).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// The environment every block runs in: the shims first on `PATH`, no
/// `SOULBASE_*` variable of the test's own environment.
fn command(program: &Path, dir: &Path, bin: &Path) -> Command {
    let mut cmd = Command::new(program);
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    cmd.current_dir(dir)
        .env("PATH", path)
        .env("RUST_LOG", "warn");
    for (k, _) in std::env::vars() {
        if k.starts_with("SOULBASE_") || k == "SKILLS_DIR" {
            cmd.env_remove(k);
        }
    }
    cmd
}

struct Started {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the server block in the background (on ephemeral ports); returns it with
/// the HTTP and gRPC addresses it bound.
fn start_server(block: &Block, dir: &Path, bin: &Path) -> (Started, String, String) {
    assert!(
        block.body.contains("-p soulbased") && block.lang == "sh",
        "README.md:{}: the tour must start with the command that runs the server",
        block.line
    );
    let mut cmd = command(Path::new("bash"), dir, bin);
    cmd.args([
        "-euo",
        "pipefail",
        "-c",
        &format!("exec {}", block.body.trim()),
    ])
    .env("SOULBASE_SERVER__HTTP_ADDR", "127.0.0.1:0")
    .env("SOULBASE_SERVER__GRPC_ADDR", "127.0.0.1:0")
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let started = Started { child, lines };
    let (mut http, mut grpc) = (None, None);
    let mut printed = Vec::new();
    loop {
        let line = started
            .lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                panic!(
                    "README.md:{}: the server did not start: {printed:?}",
                    block.line
                )
            });
        if let Some(a) = line.strip_prefix("soulbased: http listening on ") {
            http = Some(a.to_owned());
        }
        if let Some(a) = line.strip_prefix("soulbased: grpc listening on ") {
            grpc = Some(a.to_owned());
        }
        let done = line.starts_with("soulbased: MCP clients");
        printed.push(line);
        if done {
            break;
        }
    }
    let banner = printed.join("\n");
    assert!(
        banner.contains("DEVELOPMENT MODE") && banner.contains("curl"),
        "the --dev server must say it is for development and how to connect:\n{banner}"
    );
    (started, http.unwrap(), grpc.unwrap())
}

/// Runs one tour block; its stdout.
fn run(block: &Block, dir: &Path, bin: &Path, http: &str, grpc: &str) -> String {
    let body = block
        .body
        .replace(README_ADDR_HTTP, http)
        .replace(README_ADDR_GRPC, grpc);
    let mut cmd = match block.lang.as_str() {
        "sh" => {
            let mut c = command(Path::new("bash"), dir, bin);
            c.args(["-euo", "pipefail", "-c", &body]);
            c
        }
        "python" => {
            let mut c = command(&common::python(), dir, bin);
            c.args(["-c", &body]);
            c
        }
        other => panic!(
            "README.md:{}: the tour cannot run a `{other}` block",
            block.line
        ),
    };
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "README.md:{}: the block failed ({}):\n{}\nstdout:\n{stdout}\nstderr:\n{}",
        block.line,
        out.status,
        block.body,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_quick_start_and_the_tour_work_as_written() {
    let text = readme();
    let tour = tour(&text);
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let copied = Command::new("cp")
        .arg("-R")
        .arg(root.join("skills"))
        .arg(dir.path().join("skills"))
        .status()
        .unwrap();
    assert!(copied.success());
    let bin = shims(dir.path());
    let (mut server, http, grpc) = start_server(&tour[0], dir.path(), &bin);
    let mut ran = 0;
    let mut i = 1;
    while i < tour.len() {
        let block = &tour[i];
        let expected = tour.get(i + 1).filter(|b| b.lang == "text");
        let stdout = run(block, dir.path(), &bin, &http, &grpc);
        if let Some(e) = expected {
            let want = e.body.replace(README_ADDR_HTTP, &http);
            assert!(
                shows(&stdout, &want),
                "README.md:{}: the block printed\n{stdout}\nbut the README shows (line {})\n{}",
                block.line,
                e.line,
                e.body
            );
            i += 1;
        }
        ran += 1;
        i += 1;
    }
    assert!(ran >= 4, "the tour ran only {ran} blocks");
    // The server is still up and well after the tour.
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the server stopped during the tour"
    );
    let _ = server.lines.try_recv();
}

#[test]
fn every_yaml_block_of_the_readme_is_a_valid_config() {
    let mut checked = 0;
    for b in blocks(&readme()).into_iter().filter(|b| b.lang == "yaml") {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, &b.body).unwrap();
        if let Err(e) = soulbase_config::ConfigLoader::new().with_file(&path).load() {
            panic!(
                "README.md:{}: the configuration example is refused: {e}",
                b.line
            );
        }
        checked += 1;
    }
    assert!(checked >= 1, "the README shows no configuration");
}

#[test]
fn the_output_matcher_needs_every_piece_in_order() {
    assert!(shows(r#"{"a":1,"b":"x y"}"#, r#"{"a":1,…}"#));
    assert!(shows("id call_123 ok", "id call_… ok"));
    assert!(!shows("id call_123 failed", "id call_… ok"));
    assert!(!shows("x {\"a\":1}", "{\"a\":1}"), "the start must match");
    assert!(!shows("{\"a\":1} tail", "{\"a\":1}"), "the end must match");
    assert!(shows(r#"{"a":{"b":1},"c":2}"#, r#"{"a":{…},…}"#));
    assert!(shows("a b c", "a … c"));
}
