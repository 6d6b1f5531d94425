//! `soulbase skills …` end to end: the real binary on real directories.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo_skills() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills")
}

fn soulbase(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_soulbase"))
        .args(args)
        .current_dir(cwd)
        .env_remove("SKILLS_DIR")
        .env("SEARCH_LOGS_TOKEN", "test")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn copy_pair(to: &Path) {
    for s in ["zodiac", "jungastro"] {
        std::fs::create_dir_all(to.join("skills").join(s)).unwrap();
        std::fs::copy(
            repo_skills().join(s).join("SKILL.md"),
            to.join("skills").join(s).join("SKILL.md"),
        )
        .unwrap();
    }
}

#[test]
fn check_passes_on_the_examples() {
    let root = repo_skills().join("..");
    let o = soulbase(&["skills", "check", "skills"], &root);
    assert!(
        o.status.success(),
        "{}{}",
        stdout(&o),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout(&o).contains("ok: 4 skill(s)"), "{}", stdout(&o));
}

#[test]
fn check_fails_when_a_consumer_loses_an_import() {
    let work = tempfile::tempdir().unwrap();
    copy_pair(work.path());
    let o = soulbase(&["skills", "check"], work.path());
    assert!(o.status.success(), "{}", stdout(&o));
    let p = work.path().join("skills/zodiac/SKILL.md");
    let text = std::fs::read_to_string(&p).unwrap();
    let start = text.find("    - name: calculate_zodiac").unwrap();
    let end = text.find("    - name: get_chart_snapshot").unwrap();
    let edited = format!("{}{}", &text[..start], &text[end..]).replace(
        "    rate_limit:\n      calculate_zodiac: 50/day\n",
        "    rate_limit:\n",
    );
    std::fs::write(&p, edited).unwrap();
    let o = soulbase(&["skills", "check"], work.path());
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let out = stdout(&o);
    assert!(out.contains("error: skills/jungastro/SKILL.md"), "{out}");
    assert!(
        out.contains("imports calculate_zodiac from zodiac, which does not export it"),
        "{out}"
    );
    assert!(out.contains("FAILED"), "{out}");
    // JSON for machines.
    let o = soulbase(&["skills", "check", "--format", "json"], work.path());
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["errors"], 1);
    assert_eq!(v["problems"][0]["severity"], "error");
}

#[test]
fn check_reports_cycles_and_bad_files_with_lines() {
    let work = tempfile::tempdir().unwrap();
    let d = work.path().join("skills");
    std::fs::create_dir_all(d.join("a")).unwrap();
    std::fs::create_dir_all(d.join("b")).unwrap();
    let exp = |t: &str, from: &str, imp: &str| {
        format!(
            "---\nname: {t}\ndescription: x\nexports:\n  api_version: \"1.0\"\n  tools:\n    - name: t_{t}\n      description: x\n      input_schema: {{type: object}}\n      output_schema: {{type: object}}\nimports:\n  - from: {from}\n    tools: [{imp}]\n---\n"
        )
    };
    std::fs::write(d.join("a/SKILL.md"), exp("a", "b", "t_b")).unwrap();
    std::fs::write(d.join("b/SKILL.md"), exp("b", "a", "t_a")).unwrap();
    std::fs::write(
        d.join("bad.yaml"),
        "name: bad\ndescription: x\nprovider: builtin\ntimeout: -1\n",
    )
    .unwrap();
    let o = soulbase(&["skills", "check"], work.path());
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert!(out.contains("import cycle: a → b → a"), "{out}");
    assert!(out.contains("skills/bad.yaml:4: timeout"), "{out}");
}

#[test]
fn a_directory_outside_the_working_directory_is_served() {
    // The image runs from /var/lib/soulbase with its skills in /etc/soulbase/skills:
    // where the command runs from plays no part.
    let work = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    copy_pair(elsewhere.path());
    let dir = elsewhere
        .path()
        .join("skills")
        .to_string_lossy()
        .into_owned();
    let o = soulbase(&["skills", "check", &dir], work.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = soulbase(&["skills", "list", &dir], work.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!stdout(&o).trim().is_empty());
    // The flag that used to lift the rule is gone with it.
    let o = soulbase(
        &["skills", "check", &dir, "--allow-outside-workdir"],
        work.path(),
    );
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn list_show_export_prompt() {
    let work = tempfile::tempdir().unwrap();
    copy_pair(work.path());
    let o = soulbase(&["skills", "list"], work.path());
    assert_eq!(
        stdout(&o)
            .lines()
            .map(|l| l.split('\t').next().unwrap().to_owned())
            .collect::<Vec<_>>(),
        ["jungastro", "zodiac"]
    );
    let o = soulbase(&["skills", "show", "zodiac"], work.path());
    let on_disk = std::fs::read_to_string(work.path().join("skills/zodiac/SKILL.md")).unwrap();
    assert_eq!(stdout(&o), on_disk);
    let o = soulbase(&["skills", "export", "--skill", "zodiac"], work.path());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<_> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        names,
        [
            "skills__zodiac__calculate_zodiac",
            "skills__zodiac__get_chart_snapshot"
        ]
    );
    let o = soulbase(&["skills", "export", "--format", "anthropic"], work.path());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 3);
    assert!(v[0]["input_schema"].is_object());
    let o = soulbase(&["skills", "prompt"], work.path());
    assert!(stdout(&o).contains("## Skills (Available)"));
    let o = soulbase(&["skills", "show", "nope"], work.path());
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn the_directory_comes_from_config_yaml_or_skills_dir() {
    let work = tempfile::tempdir().unwrap();
    let d = work.path().join("custom");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("only.yaml"),
        "name: only\ndescription: from the configured dir\nprovider: builtin\n",
    )
    .unwrap();
    std::fs::write(
        work.path().join("config.yaml"),
        "skills:\n  dir: ./custom\n",
    )
    .unwrap();
    let o = soulbase(&["skills", "list"], work.path());
    assert!(stdout(&o).starts_with("only\t"), "{}", stdout(&o));
    std::fs::remove_file(work.path().join("config.yaml")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_soulbase"))
        .args(["skills", "list"])
        .current_dir(work.path())
        .env("SKILLS_DIR", "custom")
        .output()
        .unwrap();
    assert!(stdout(&o).starts_with("only\t"), "{}", stdout(&o));
    // --config names another file, after the subcommand or before it.
    std::fs::write(work.path().join("other.yaml"), "skills:\n  dir: ./custom\n").unwrap();
    for args in [
        &["skills", "--config", "other.yaml", "list"][..],
        &["--config", "other.yaml", "skills", "list"],
    ] {
        let o = soulbase(args, work.path());
        assert!(stdout(&o).starts_with("only\t"), "{args:?}: {}", stdout(&o));
    }
    // An invalid config is reported, not ignored.
    std::fs::write(work.path().join("config.yaml"), "skills:\n  dri: x\n").unwrap();
    let o = soulbase(&["skills", "list"], work.path());
    assert_eq!(o.status.code(), Some(2));
}

/// `path` relative to the skills directory, `/`-separated.
fn under_skills(path: &str) -> String {
    let p = path.replace('\\', "/");
    match p.rfind("skills/") {
        Some(i) => p[i + "skills/".len()..].to_owned(),
        None => p,
    }
}

/// The check's verdict: the skills it loads and the distinct (file, severity)
/// problems, from `--format json`.
fn cli_verdict(dir: &Path, args: &[&str]) -> (i32, Vec<String>, Vec<(String, String)>) {
    let o = Command::new(env!("CARGO_BIN_EXE_soulbase"))
        .args(["skills", "check", "--format", "json"])
        .args(args)
        .current_dir(dir)
        .env_remove("SKILLS_DIR")
        .env_remove("SOULBASE_CONFIG")
        .env_remove("ADVERSARIAL_TOKEN")
        .env_remove("SEARCH_LOGS_TOKEN")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|_| panic!("{}{}", stdout(&o), String::from_utf8_lossy(&o.stderr)));
    let mut skills: Vec<String> = v["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect();
    skills.sort();
    let mut problems: Vec<(String, String)> = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                under_skills(p["path"].as_str().unwrap()),
                p["severity"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    problems.sort();
    problems.dedup();
    (o.status.code().unwrap(), skills, problems)
}

/// What the server's load path (`SkillCatalog::open` with
/// `CatalogOptions::for_config`, as `soulbase-app` assembles it) loads from the
/// configuration file `config` (the defaults when `None`) with `skills.dir` =
/// `dir`.
fn server_verdict(config: Option<&Path>, dir: &Path) -> (Vec<String>, Vec<(String, String)>) {
    let mut loader = soulbase_config::ConfigLoader::new();
    if let Some(file) = config {
        loader = loader.with_file(file);
    }
    let snapshot = loader.load().unwrap();
    let mut options = soulbase_skills::CatalogOptions::for_config(snapshot.config());
    options.root = dir.to_path_buf();
    let (catalog, report) =
        soulbase_skills::SkillCatalog::open(soulbase_tools::Registry::new(), options).unwrap();
    let skills: Vec<String> = catalog.current().skills().map(|s| s.name.clone()).collect();
    let mut problems: Vec<(String, String)> = report
        .problems
        .iter()
        .map(|p| {
            let sev = if p.is_error() { "error" } else { "warning" };
            (under_skills(&p.path.display().to_string()), sev.to_owned())
        })
        .collect();
    problems.sort();
    problems.dedup();
    (skills, problems)
}

fn owned(loaded: &[&str], problems: &[(&str, &str)]) -> (Vec<String>, Vec<(String, String)>) {
    (
        loaded.iter().map(|s| (*s).to_owned()).collect(),
        problems
            .iter()
            .map(|(f, s)| ((*f).to_owned(), (*s).to_owned()))
            .collect(),
    )
}

#[test]
fn the_check_and_the_server_load_agree_on_an_adversarial_directory() {
    let work = tempfile::tempdir().unwrap();
    let (loaded, problems) = soulbase_testkit::skills::adversarial(work.path());
    let expected = owned(&loaded, &problems);
    // The default configuration (no config.yaml) and one allowing the variable.
    let (code, cli_skills, cli_problems) = cli_verdict(work.path(), &["skills"]);
    assert_eq!(code, 1);
    let server = server_verdict(None, &work.path().join("skills"));
    assert_eq!((cli_skills.clone(), cli_problems.clone()), server);
    assert_eq!((cli_skills, cli_problems), expected);

    std::fs::write(
        work.path().join("config.yaml"),
        "sandbox:\n  http_env_allow: [ADVERSARIAL_TOKEN]\n",
    )
    .unwrap();
    let (code, cli_skills, cli_problems) = cli_verdict(work.path(), &["skills"]);
    assert_eq!(code, 1);
    let server = server_verdict(
        Some(&work.path().join("config.yaml")),
        &work.path().join("skills"),
    );
    assert_eq!((cli_skills, cli_problems.clone()), server);
    // Allowed but unset: still a warning (the executor would find it unset).
    assert!(cli_problems.contains(&("token.yaml".to_owned(), "warning".to_owned())));
}

#[test]
fn the_check_and_the_server_load_agree_on_the_examples_with_no_errors() {
    let root = repo_skills().join("..");
    let (code, cli_skills, cli_problems) = cli_verdict(&root, &["skills"]);
    let server = server_verdict(None, &repo_skills());
    assert_eq!((cli_skills.clone(), cli_problems.clone()), server);
    assert_eq!(code, 0, "{cli_problems:?}");
    assert_eq!(
        cli_skills,
        ["jungastro", "search_logs", "text-length", "zodiac"]
    );
    assert!(
        cli_problems.iter().all(|(_, sev)| sev == "warning"),
        "{cli_problems:?}"
    );
}
