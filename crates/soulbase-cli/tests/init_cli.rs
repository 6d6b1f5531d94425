//! `soulbase init` end to end: the real binary scaffolds a project whose skills
//! pass `soulbase skills check` and whose configuration loads. (Running it with the
//! real server, every tool invoked: soulbased's `tests/init.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

fn soulbase(cwd: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_soulbase"));
    for (k, _) in std::env::vars() {
        if k.starts_with("SOULBASE_") || k == "SKILLS_DIR" {
            cmd.env_remove(k);
        }
    }
    cmd.args(args).current_dir(cwd).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const TOOLS: [&str; 4] = [
    "skills.greet.greet",
    "skills.hello-http.hello-http",
    "skills.text-length.count",
    "skills.hello-native.hello",
];

#[test]
fn the_scaffold_checks_clean_and_is_not_overwritten_without_force() {
    let work = tempfile::tempdir().unwrap();
    let o = soulbase(work.path(), &["init", "proj"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    for expected in [
        "config.yaml",
        "cd proj",
        "soulbased --config config.yaml",
        "python3 services/hello_service.py",
        "soulbase consent issue skills.hello-native.hello --tenant dev --actor dev",
    ] {
        assert!(text.contains(expected), "{expected}: {text}");
    }
    for tool in TOOLS {
        assert!(
            text.contains(&format!("/api/tools/{tool}/invoke")),
            "{tool}: {text}"
        );
    }

    // Every skill loads, without an error or a warning, and provides its tool.
    let check = soulbase(
        work.path(),
        &["skills", "check", "proj/skills", "--format", "json"],
    );
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
    let report: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(report["errors"], 0, "{report:#}");
    assert_eq!(report["warnings"], 0, "{report:#}");
    let tools: Vec<&str> = report["skills"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["tools"].as_array().unwrap())
        .map(|t| t.as_str().unwrap())
        .collect();
    for tool in TOOLS {
        assert!(tools.contains(&tool), "{tool}: {tools:?}");
    }
    let check = soulbase(work.path(), &["skills", "check", "proj/skills"]);
    assert!(
        stdout(&check).contains("ok: 4 skill(s)"),
        "{}",
        stdout(&check)
    );

    // The configuration loads; its proc grant names the script's real path.
    let project = work.path().join("proj");
    let config = project.join("config.yaml");
    let snapshot = soulbase_config::ConfigLoader::new()
        .with_file(&config)
        .load()
        .unwrap();
    let grants = serde_json::to_string(&snapshot.config().sandbox.grants).unwrap();
    let script = project
        .join("skills/hello-native/hello.sh")
        .canonicalize()
        .unwrap();
    assert!(
        grants.contains(&format!("{:?}", script.to_str().unwrap())),
        "{grants}"
    );

    // A second init refuses, naming the files, and changes nothing.
    std::fs::write(&config, "# edited\n").unwrap();
    let again = soulbase(work.path(), &["init", "proj"]);
    assert_eq!(again.status.code(), Some(2), "{}", stdout(&again));
    assert!(
        stderr(&again).contains("config.yaml") && stderr(&again).contains("--force"),
        "{}",
        stderr(&again)
    );
    assert_eq!(std::fs::read_to_string(&config).unwrap(), "# edited\n");

    // --force writes the scaffold again and leaves other files alone.
    std::fs::write(project.join("skills/mine.yaml"), "# mine\n").unwrap();
    let forced = soulbase(work.path(), &["init", "proj", "--force"]);
    assert_eq!(forced.status.code(), Some(0), "{}", stderr(&forced));
    assert!(
        std::fs::read_to_string(&config)
            .unwrap()
            .contains("dev_insecure: true")
    );
    assert_eq!(
        std::fs::read_to_string(project.join("skills/mine.yaml")).unwrap(),
        "# mine\n"
    );
}

#[test]
fn init_defaults_to_the_current_directory_and_takes_the_identity_and_port() {
    let work = tempfile::tempdir().unwrap();
    let o = soulbase(
        work.path(),
        &[
            "init",
            "--tenant",
            "acme",
            "--actor",
            "alice",
            "--service-port",
            "9123",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stdout(&o).contains("\n  cd "), "{}", stdout(&o));
    let config = std::fs::read_to_string(work.path().join("config.yaml")).unwrap();
    assert!(
        config.contains(r#"dev_identity: { tenant: "acme", actor: "alice" }"#),
        "{config}"
    );
    assert!(config.contains("ports: [9123]"), "{config}");
    let http = std::fs::read_to_string(work.path().join("skills/hello-http.yaml")).unwrap();
    assert!(
        http.contains("endpoint: http://127.0.0.1:9123/execute"),
        "{http}"
    );
}

#[test]
fn bad_input_is_a_usage_error_naming_the_flag() {
    let work = tempfile::tempdir().unwrap();
    for (args, named) in [
        (vec!["init", "--tenant", "bad tenant"], "--tenant"),
        (vec!["init", "--actor", ""], "--actor"),
        (vec!["init", "--service-port", "0"], "--service-port"),
        (vec!["--server", "http://127.0.0.1:1", "init"], "--server"),
    ] {
        let o = soulbase(work.path(), &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stdout(&o));
        assert!(stderr(&o).contains(named), "{args:?}: {}", stderr(&o));
    }
    assert_eq!(
        std::fs::read_dir(work.path()).unwrap().count(),
        0,
        "nothing written"
    );
}
