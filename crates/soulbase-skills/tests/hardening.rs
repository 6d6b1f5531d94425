//! Regression tests for the review of the skills loader, contracts and views:
//! stale registry entries, special files, symlinks, exports, module edits,
//! contract errors at runtime, cycles, deprecations and dates.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use soulbase_sandbox::ProviderBinding;
use soulbase_skills::views::enabled_tools;
use soulbase_skills::{CatalogOptions, SkillCatalog, check_dir_at};
use soulbase_tools::Registry;

fn wasm_module(skill: &soulbase_skills::Skill) -> (String, String) {
    match &skill.tools[0].compiled.manifest.provider {
        ProviderBinding::Wasm { module, sha256 } => (module.clone(), sha256.clone()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn open_removes_skill_tools_no_file_provides() {
    // A registry that already holds skills.* tools (e.g. restored from a
    // persisted registry) for skills that are no longer on disk.
    let old = tempfile::tempdir().unwrap();
    write(old.path(), "gone.yaml", &descriptor("gone", "stale"));
    write(old.path(), "kept.yaml", &descriptor("kept", "stays"));
    let registry = Registry::new();
    let (_c, _r) = SkillCatalog::open(registry.clone(), CatalogOptions::new(old.path())).unwrap();
    assert!(registry.get(&tenant(), &id("skills.gone.gone")).is_ok());

    let now = tempfile::tempdir().unwrap();
    write(now.path(), "kept.yaml", &descriptor("kept", "stays"));
    let (c, _r) = SkillCatalog::open(registry.clone(), CatalogOptions::new(now.path())).unwrap();
    assert!(
        registry.get(&tenant(), &id("skills.gone.gone")).is_err(),
        "a skills.* tool with no file behind it is removed on open"
    );
    let listed: Vec<String> = enabled_tools(&c.current(), &registry.view(), &tenant())
        .into_iter()
        .map(|s| s.name.as_str().to_owned())
        .collect();
    assert_eq!(listed, vec!["skills.kept.kept".to_owned()]);
}

#[test]
fn views_hide_skill_tools_without_an_owner() {
    // A skills.* tool in the registry that the current set does not own (the
    // window of a reload) is never shown as a core tool.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &descriptor("a", "a"));
    let e = env(dir.path());
    let other = tempfile::tempdir().unwrap();
    write(other.path(), "b.yaml", &descriptor("b", "b"));
    let set_b = check_dir_at(other.path(), soulbase_skills::model::Date::today()).unwrap();
    let b = set_b.get("b").unwrap().tools[0].compiled.clone();
    e.registry
        .register_compiled(&soulbase_tools::ToolOwner::Global, b)
        .unwrap();
    e.registry
        .enable(&soulbase_tools::ToolOwner::Global, &id("skills.b.b"))
        .unwrap();
    let set = e.catalog.current();
    let names: Vec<String> = enabled_tools(&set, &e.registry.view(), &tenant())
        .into_iter()
        .map(|s| s.name.as_str().to_owned())
        .collect();
    assert_eq!(names, vec!["skills.a.a".to_owned()]);
    let names: Vec<String> =
        soulbase_skills::tools_for_skill(&set, &e.registry.view(), &tenant(), "a")
            .unwrap()
            .into_iter()
            .map(|s| s.name.as_str().to_owned())
            .collect();
    assert_eq!(names, vec!["skills.a.a".to_owned()]);
}

fn mkfifo(path: &std::path::Path) {
    let st = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn fifos_are_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "ok.yaml", &descriptor("ok", "fine"));
    mkfifo(&dir.path().join("fifo.yaml"));
    std::fs::create_dir(dir.path().join("pkg")).unwrap();
    mkfifo(&dir.path().join("pkg/SKILL.md"));
    // A WASM module that is a FIFO.
    write(
        dir.path(),
        "w/SKILL.md",
        "---\nname: w\ndescription: x\nprovider: {type: wasm, module: m.wasm, sha256: \"\"}\ntools:\n  - name: t\n    description: x\n---\n",
    );
    mkfifo(&dir.path().join("w/m.wasm"));

    let (tx, rx) = std::sync::mpsc::channel();
    let root = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let r = SkillCatalog::open(Registry::new(), CatalogOptions::new(root)).map(|(c, r)| {
            (
                c.current()
                    .skills()
                    .map(|s| s.name.clone())
                    .collect::<Vec<_>>(),
                r.problems,
            )
        });
        let _ = tx.send(r);
    });
    let (names, problems) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the loader hung on a FIFO")
        .unwrap();
    assert_eq!(names, vec!["ok".to_owned()]);
    for f in ["fifo.yaml", "SKILL.md"] {
        assert!(
            problems.iter().any(|p| p.is_error()
                && p.path.ends_with(f)
                && p.reason.contains("not a regular file")),
            "{f}: {problems:?}"
        );
    }
    assert!(
        problems
            .iter()
            .any(|p| p.reason.contains("not a regular file") && p.path.ends_with("w/SKILL.md")),
        "{problems:?}"
    );
}

#[test]
fn the_fingerprint_does_not_follow_symlinks_out_of_the_root() {
    let outside = tempfile::tempdir().unwrap();
    write(outside.path(), "sub/file.txt", "one");
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "ok.yaml", &descriptor("ok", "fine"));
    std::os::unix::fs::symlink(outside.path().join("sub"), dir.path().join("linked")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("sub/file.txt"),
        dir.path().join("file.txt"),
    )
    .unwrap();
    let before = soulbase_skills::watch::fingerprint(dir.path());
    write(outside.path(), "sub/file.txt", "two, longer");
    write(outside.path(), "sub/new.txt", "new");
    assert_eq!(
        soulbase_skills::watch::fingerprint(dir.path()),
        before,
        "changes outside the root, reached through symlinks, are not watched"
    );
    write(dir.path(), "ok.yaml", &descriptor("ok", "changed text"));
    assert_ne!(soulbase_skills::watch::fingerprint(dir.path()), before);
}

#[test]
fn a_stream_of_events_cannot_postpone_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &descriptor("a", "a"));
    let e = env(dir.path());
    let watcher = soulbase_skills::watch(e.catalog.clone(), Duration::from_secs(3600));
    // Linux always has inotify; without file events this test would prove nothing.
    assert!(
        watcher.has_events(),
        "file events (inotify) are unavailable, so the debounce cannot be tested"
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let noise = {
        let stop = stop.clone();
        let p = dir.path().join("noise.txt");
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::fs::write(&p, i.to_string()).unwrap();
                i += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    write(dir.path(), "b.yaml", &descriptor("b", "b"));
    let applied = wait_until(Duration::from_secs(2), || {
        e.catalog.current().get("b").is_some()
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    noise.join().unwrap();
    drop(watcher);
    assert!(
        applied,
        "a continuous stream of events postponed the reload"
    );
}

#[test]
fn tools_exported_by_name_need_schemas() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "p/SKILL.md",
        "---\nname: p\ndescription: x\nprovider: {type: builtin, handler: echo}\ntools:\n  - name: t\n    description: x\nexports:\n  api_version: \"1.0\"\n  tools: [t]\n---\n",
    );
    let set = check_dir_at(dir.path(), soulbase_skills::model::Date::today()).unwrap();
    assert!(set.get("p").is_none());
    assert!(
        set.problems()
            .iter()
            .any(|p| p.is_error() && p.reason.contains("input_schema and output_schema")),
        "{:?}",
        set.problems()
    );
}

#[test]
fn editing_a_wasm_module_takes_effect_on_reload() {
    let dir = tempfile::tempdir().unwrap();
    let wat = std::fs::read_to_string(repo_skills().join("text-length/text_length.wat")).unwrap();
    write(dir.path(), "w/m.wat", &wat);
    write(
        dir.path(),
        "w/SKILL.md",
        "---\nname: w\ndescription: x\nprovider: {type: wasm, module: m.wat, sha256: \"\"}\ntools:\n  - name: t\n    description: x\n---\n",
    );
    let e = env(dir.path());
    let (_, before) = wasm_module(e.catalog.current().get("w").unwrap());
    assert!(!e.catalog.reload().changed(), "nothing changed yet");
    write(dir.path(), "w/m.wat", &format!("{wat}\n;; edited\n"));
    let r = e.catalog.reload();
    assert_eq!(r.updated, vec!["w".to_owned()]);
    let (_, after) = wasm_module(e.catalog.current().get("w").unwrap());
    assert_ne!(
        before, after,
        "the module digest follows the module's bytes"
    );
    let reg = e.registry.get(&tenant(), &id("skills.w.t")).unwrap();
    match &reg.tool.manifest.provider {
        ProviderBinding::Wasm { sha256, .. } => assert_eq!(sha256, &after),
        other => panic!("{other:?}"),
    }
}

#[test]
fn process_commands_resolve_inside_the_package_and_absolute_ones_are_refused() {
    let outside = tempfile::tempdir().unwrap();
    write(outside.path(), "evil.sh", "#!/bin/sh\n");
    let dir = tempfile::tempdir().unwrap();
    let pkg = |name: &str, command: &str| {
        format!(
            "---\nname: {name}\ndescription: x\nprovider: {{type: process, command: \"{command}\"}}\ntools:\n  - name: t\n    description: x\n---\n"
        )
    };
    write(dir.path(), "p/scripts/run.sh", "#!/bin/sh\necho '{}'\n");
    write(dir.path(), "p/SKILL.md", &pkg("p", "scripts/run.sh"));
    write(dir.path(), "abs/SKILL.md", &pkg("abs", "/bin/sh"));
    write(dir.path(), "up/SKILL.md", &pkg("up", "../../evil.sh"));
    write(
        dir.path(),
        "gone/SKILL.md",
        &pkg("gone", "scripts/missing.sh"),
    );
    write(dir.path(), "d/SKILL.md", &pkg("d", "scripts"));
    std::fs::create_dir_all(dir.path().join("d/scripts")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("evil.sh"), dir.path().join("link.sh")).unwrap();
    write(dir.path(), "l/SKILL.md", &pkg("l", "../link.sh"));
    let set = check_dir_at(dir.path(), soulbase_skills::model::Date::today()).unwrap();
    let p = set.get("p").expect("the package with scripts/run.sh loads");
    match &p.tools[0].compiled.manifest.provider {
        ProviderBinding::Process { command, .. } => {
            let real = std::fs::canonicalize(dir.path().join("p/scripts/run.sh")).unwrap();
            assert_eq!(std::path::Path::new(command), real);
        }
        other => panic!("{other:?}"),
    }
    for bad in ["abs", "up", "gone", "d", "l"] {
        assert!(set.get(bad).is_none(), "{bad} must be refused");
        assert!(
            set.problems().iter().any(|pr| pr.is_error()
                && pr.path.parent().unwrap().ends_with(bad)
                && pr.field.as_deref() == Some("provider.command")),
            "{bad}: {:?}",
            set.problems()
        );
    }
}

/// Changed consciously (issue 32, one validator): a header variable not on
/// `sandbox.http_env_allow` used to refuse the skill at load, which refused the
/// repository's own example on the default (empty, safe) allow-list while
/// `skills check` passed it. It is now a warning at load, in the server and the
/// check alike, naming the variable and the key; the skill loads, and the HTTP
/// executor still refuses every call sending that header
/// (`SANDBOX.CAPABILITY_BLOCKED`, soulbase-sandbox-http), so nothing leaves that
/// the allow-list does not allow.
#[test]
fn header_env_references_are_checked_against_the_http_allow_list_at_load() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "h.yaml",
        "name: h\ndescription: x\nprovider: http\nendpoint: http://127.0.0.1:9/execute\nheaders:\n  Authorization: Bearer ${H_TOKEN}\n",
    );
    let not_allowed = |r: &soulbase_skills::ReloadReport| {
        r.problems
            .iter()
            .filter(|p| {
                p.reason.contains("${H_TOKEN}") && p.reason.contains("sandbox.http_env_allow")
            })
            .cloned()
            .collect::<Vec<_>>()
    };
    let (c, r) = SkillCatalog::open(
        Registry::new(),
        CatalogOptions::new(dir.path()).http_env_allow(vec!["OTHER".into()]),
    )
    .unwrap();
    assert!(c.current().get("h").is_some(), "{:?}", r.problems);
    let found = not_allowed(&r);
    assert_eq!(found.len(), 1, "{:?}", r.problems);
    assert!(!found[0].is_error());
    assert_eq!(found[0].field.as_deref(), Some("headers.Authorization"));
    // The check says the same from the same options.
    let set = soulbase_skills::check_dir_with(
        &CatalogOptions::new(dir.path()).http_env_allow(vec!["OTHER".into()]),
        soulbase_skills::model::Date::today(),
    )
    .unwrap();
    assert!(set.get("h").is_some());
    assert_eq!(
        set.problems()
            .iter()
            .filter(|p| p.reason.contains("sandbox.http_env_allow"))
            .cloned()
            .collect::<Vec<_>>(),
        found
    );
    let (c, r) = SkillCatalog::open(
        Registry::new(),
        CatalogOptions::new(dir.path()).http_env_allow(vec!["H_TOKEN".into()]),
    )
    .unwrap();
    assert!(c.current().get("h").is_some(), "{:?}", r.problems);
    assert!(not_allowed(&r).is_empty(), "{:?}", r.problems);
}

#[test]
fn skill_info_of_a_descriptor_is_a_usage_document_without_the_binding() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        repo_skills().join("search_logs.yaml"),
        dir.path().join("search_logs.yaml"),
    )
    .unwrap();
    write(
        dir.path(),
        "p/SKILL.md",
        "---\nname: p\ndescription: x\nprovider: {type: builtin, handler: echo}\ntools:\n  - name: t\n    description: x\n---\n# Body\n",
    );
    let set = check_dir_at(dir.path(), soulbase_skills::model::Date::today()).unwrap();
    let info = soulbase_skills::get_skill_info(&set, "search_logs").unwrap();
    for secret in [
        "127.0.0.1",
        "8081",
        "Authorization",
        "SEARCH_LOGS_TOKEN",
        "${",
    ] {
        assert!(
            !info.content.contains(secret),
            "{secret} in {}",
            info.content
        );
    }
    for part in [
        "search_logs",
        "Search Kubernetes pod logs",
        "namespace",
        "keyword",
    ] {
        assert!(
            info.content.contains(part),
            "{part} missing: {}",
            info.content
        );
    }
    // A package's SKILL.md stays verbatim.
    let info = soulbase_skills::get_skill_info(&set, "p").unwrap();
    assert_eq!(
        &*info.content,
        std::fs::read_to_string(dir.path().join("p/SKILL.md")).unwrap()
    );
}

#[tokio::test]
async fn enabling_and_reloading_have_async_variants() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &descriptor("a", "a"));
    let e = env(dir.path());
    e.catalog.set_enabled_async("a", false).await.unwrap();
    assert!(!e.catalog.current().is_enabled("a"));
    assert!(soulbase_skills::list_skills(&e.catalog.current()).is_empty());
    let err = e
        .catalog
        .set_enabled_async("ghost", true)
        .await
        .unwrap_err();
    assert_eq!(err.code().as_str(), "TOOL.NOT_FOUND");
    write(dir.path(), "b.yaml", &descriptor("b", "b"));
    let r = e.catalog.reload_async().await.unwrap();
    assert_eq!(r.added, vec!["b".to_owned()]);
    assert!(!e.catalog.current().is_enabled("a"), "the choice survives");
    e.catalog.set_enabled_async("a", true).await.unwrap();
    assert!(e.catalog.current().is_enabled("a"));
}
