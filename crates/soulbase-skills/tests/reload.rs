//! Loading into the registry, hot reload through the watcher, manual reload,
//! confinement, clashes, disabling, and the model-facing views (seed 001 §9).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use soulbase_skills::{
    CatalogOptions, SkillCatalog, get_skill_info, list_skills, system_prompt_sections,
    tools_for_skill, watch,
};
use soulbase_tools::discovery::openai;
use soulbase_tools::pipeline::ToolCall;
use soulbase_tools::{Registry, ToolState};

const WITHIN: Duration = Duration::from_secs(5);

fn state(e: &Env, tool: &str) -> Option<ToolState> {
    e.registry.get(&tenant(), &id(tool)).ok().map(|r| r.state)
}

fn description(e: &Env, tool: &str) -> Option<String> {
    e.registry
        .get(&tenant(), &id(tool))
        .ok()
        .map(|r| r.tool.manifest.description.clone())
}

#[test]
fn create_modify_delete_are_applied_by_the_watcher() {
    let dir = tempfile::tempdir().unwrap();
    let e = env(dir.path());
    let _w = watch(e.catalog.clone(), Duration::from_millis(200));
    assert!(e.catalog.current().is_empty());

    write(dir.path(), "hello.yaml", &descriptor("hello", "first"));
    assert!(
        wait_until(WITHIN, || state(&e, "skills.hello.hello")
            == Some(ToolState::Enabled)),
        "created file is registered and enabled"
    );

    write(dir.path(), "hello.yaml", &descriptor("hello", "second"));
    assert!(
        wait_until(WITHIN, || description(&e, "skills.hello.hello").as_deref()
            == Some("second")),
        "modified file updates the tool"
    );

    write(
        dir.path(),
        "pkg/SKILL.md",
        "---\nname: pkg\ndescription: a package\ntools:\n  - name: t\n    description: d\n    provider: {type: builtin, handler: echo}\n---\nbody\n",
    );
    assert!(wait_until(WITHIN, || state(&e, "skills.pkg.t")
        == Some(ToolState::Enabled)));

    std::fs::remove_file(dir.path().join("hello.yaml")).unwrap();
    assert!(
        wait_until(WITHIN, || state(&e, "skills.hello.hello").is_none()),
        "deleted file unregisters the tool"
    );
    std::fs::remove_dir_all(dir.path().join("pkg")).unwrap();
    assert!(wait_until(WITHIN, || e.catalog.current().is_empty()));
    assert!(state(&e, "skills.pkg.t").is_none());
}

#[test]
fn manual_reload_and_list_enabled() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &descriptor("a", "tool a"));
    write(dir.path(), "b.yaml", &descriptor("b", "tool b"));
    let e = env(dir.path());
    assert_eq!(e.report.added, ["a", "b"]);
    let enabled: Vec<_> = e
        .registry
        .list_enabled(&tenant())
        .iter()
        .map(|r| r.id().to_string())
        .collect();
    assert_eq!(enabled, ["skills.a.a", "skills.b.b"]);

    write(dir.path(), "c.yaml", &descriptor("c", "tool c"));
    std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
    let r = e.catalog.reload();
    assert_eq!(r.added, ["c"]);
    assert_eq!(r.removed, ["a"]);
    let r = e.catalog.reload();
    assert!(!r.changed(), "an unchanged directory changes nothing");
    let names: Vec<_> = list_skills(&e.catalog.current())
        .iter()
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(names, ["b", "c"]);
}

#[test]
fn openai_export_of_enabled_skills() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "search_logs.yaml",
        "name: search_logs\ndescription: Search logs\nprovider: builtin\nhandler: echo\nparameters:\n  type: object\n  properties:\n    pod: {type: string}\n  required: [pod]\n",
    );
    let e = env(dir.path());
    let specs =
        soulbase_skills::views::enabled_tools(&e.catalog.current(), &e.registry.view(), &tenant());
    let export = openai::export(&specs, false);
    assert_eq!(
        export.tools,
        vec![json!({
            "type": "function",
            "function": {
                "name": "skills__search_logs__search_logs",
                "description": "Search logs",
                "parameters": {"type": "object", "properties": {"pod": {"type": "string"}}, "required": ["pod"]},
            }
        })]
    );
    assert_eq!(
        export.names.to_id("skills__search_logs__search_logs"),
        Some(id("skills.search_logs.search_logs"))
    );
}

#[test]
fn a_good_skill_survives_its_file_turning_bad() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &descriptor("a", "good"));
    write(dir.path(), "b.yaml", &descriptor("b", "other"));
    let e = env(dir.path());
    write(dir.path(), "a.yaml", "name: a\ndescription: [broken\n");
    let r = e.catalog.reload();
    assert_eq!(r.kept_previous.len(), 1);
    assert!(
        r.errors()
            .any(|p| p.path.ends_with("a.yaml") && p.line.is_some())
    );
    assert_eq!(description(&e, "skills.a.a").as_deref(), Some("good"));
    assert_eq!(state(&e, "skills.b.b"), Some(ToolState::Enabled));
    // A reload with the same bad bytes still keeps it and still reports.
    let r = e.catalog.reload();
    assert_eq!(r.kept_previous.len(), 1);
    assert_eq!(description(&e, "skills.a.a").as_deref(), Some("good"));
    // Fixed: the new version applies.
    write(dir.path(), "a.yaml", &descriptor("a", "fixed"));
    let r = e.catalog.reload();
    assert!(r.kept_previous.is_empty());
    assert_eq!(description(&e, "skills.a.a").as_deref(), Some("fixed"));
    // A brand-new bad file is reported and skipped.
    write(dir.path(), "z.yaml", "nonsense: true\n");
    let r = e.catalog.reload();
    assert!(r.errors().any(|p| p.path.ends_with("z.yaml")));
    assert_eq!(e.catalog.current().len(), 2);
}

#[cfg(unix)]
#[test]
fn files_resolving_outside_the_root_are_refused_wherever_the_root_is() {
    let outside = tempfile::tempdir().unwrap();
    write(outside.path(), "evil.yaml", &descriptor("evil", "outside"));
    write(
        outside.path(),
        "evilpkg/SKILL.md",
        "---\nname: evilpkg\ndescription: x\n---\n",
    );
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "ok.yaml", &descriptor("ok", "inside"));
    std::os::unix::fs::symlink(
        outside.path().join("evil.yaml"),
        dir.path().join("evil.yaml"),
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.path().join("evilpkg"), dir.path().join("evilpkg")).unwrap();
    // A symlink that stays inside the root is fine.
    std::os::unix::fs::symlink(dir.path().join("ok.yaml"), dir.path().join("alias.yml")).unwrap();
    let e = env(dir.path());
    let refused: Vec<_> = e
        .report
        .errors()
        .filter(|p| p.reason.contains("outside the skills directory"))
        .map(|p| p.path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(refused.len(), 2, "{:?}", e.report.problems);
    assert!(state(&e, "skills.evil.evil").is_none());
    assert!(e.catalog.current().get("evilpkg").is_none());
    assert_eq!(state(&e, "skills.ok.ok"), Some(ToolState::Enabled));

    // The same holds for a skills root outside the working directory (the image's
    // /etc/soulbase/skills): its own files load, the escaping symlink does not.
    assert!(!dir.path().starts_with(std::env::current_dir().unwrap()));
    let (c, r) = SkillCatalog::open(Registry::new(), CatalogOptions::new(dir.path())).unwrap();
    assert!(c.current().get("ok").is_some());
    assert!(c.current().get("evil").is_none());
    assert!(
        r.errors()
            .any(|p| p.reason.contains("outside the skills directory"))
    );
}

#[test]
fn a_name_clash_refuses_both_files_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &descriptor("same", "from a"));
    write(dir.path(), "b.yaml", &descriptor("same", "from b"));
    write(dir.path(), "other.yaml", &descriptor("other", "unrelated"));
    let e = env(dir.path());
    // Neither takes over: both are refused, each with an error naming both files.
    assert!(state(&e, "skills.same.same").is_none());
    assert!(e.catalog.current().get("same").is_none());
    assert_eq!(state(&e, "skills.other.other"), Some(ToolState::Enabled));
    let clash: Vec<_> = e
        .report
        .errors()
        .filter(|p| p.reason.contains("defined by both"))
        .collect();
    assert_eq!(clash.len(), 2, "{:?}", e.report.problems);
    for (p, file) in clash.iter().zip(["a.yaml", "b.yaml"]) {
        assert!(p.path.ends_with(file), "{p}");
        assert!(
            p.reason.contains("a.yaml") && p.reason.contains("b.yaml"),
            "{}",
            p.reason
        );
    }
    // Removing one of them loads the other.
    std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
    let r = e.catalog.reload();
    assert_eq!(r.errors().count(), 0, "{:?}", r.problems);
    assert_eq!(
        description(&e, "skills.same.same").as_deref(),
        Some("from b")
    );
}

#[tokio::test]
async fn disabling_a_skill_removes_it_from_every_view_at_once() {
    let e = env(&repo_skills());
    let t = tenant();
    let set = e.catalog.current();
    assert!(list_skills(&set).iter().any(|s| s.name == "zodiac"));
    let own = tools_for_skill(&set, &e.registry.view(), &t, "jungastro").unwrap();
    assert!(
        own.iter()
            .any(|s| s.name.as_str() == "skills.zodiac.calculate_zodiac")
    );

    e.catalog.set_enabled("zodiac", false).unwrap();
    let set = e.catalog.current();
    assert!(!list_skills(&set).iter().any(|s| s.name == "zodiac"));
    assert!(get_skill_info(&set, "zodiac").is_err());
    let tools = tools_for_skill(&set, &e.registry.view(), &t, "jungastro").unwrap();
    assert!(
        !tools
            .iter()
            .any(|s| s.name.as_str().starts_with("skills.zodiac.")),
        "{tools:?}"
    );
    let prompt = system_prompt_sections(
        &soulbase_skills::views::enabled_tools(&set, &e.registry.view(), &t),
        &list_skills(&set),
        None,
    );
    assert!(!prompt.contains("zodiac`"), "{prompt}");
    assert!(prompt.contains("`jungastro`"));
    // Calls are refused too.
    let r = e
        .invoker
        .invoke(ToolCall::new(
            subject(),
            id("skills.zodiac.calculate_zodiac"),
            json!({"birth_date": "1990-07-04"}),
        ))
        .await;
    assert_eq!(r.error_code.map(|c| c.as_str()), Some("TOOL.DISABLED"));
    // It stays disabled across reloads, and comes back when enabled.
    e.catalog.reload();
    assert!(!e.catalog.current().is_enabled("zodiac"));
    assert_eq!(
        state(&e, "skills.zodiac.calculate_zodiac"),
        Some(ToolState::Paused)
    );
    e.catalog.set_enabled("zodiac", true).unwrap();
    assert!(
        list_skills(&e.catalog.current())
            .iter()
            .any(|s| s.name == "zodiac")
    );
    assert_eq!(
        state(&e, "skills.zodiac.calculate_zodiac"),
        Some(ToolState::Enabled)
    );
    assert!(e.catalog.set_enabled("nope", false).is_err());
}

#[test]
fn the_two_phase_views() {
    let e = env(&repo_skills());
    let set = e.catalog.current();
    // Phase 1: name + short description only.
    let list = list_skills(&set);
    let z = list.iter().find(|s| s.name == "zodiac").unwrap();
    assert!(
        z.description
            .starts_with("Compute a Western astrology birth chart")
    );
    let json = serde_json::to_value(z).unwrap();
    assert_eq!(json.as_object().unwrap().len(), 2);
    // Phase 2: the full SKILL.md, verbatim.
    let info = get_skill_info(&set, "zodiac").unwrap();
    let on_disk = std::fs::read_to_string(repo_skills().join("zodiac/SKILL.md")).unwrap();
    assert_eq!(&*info.content, on_disk);
    assert!(
        info.body
            .as_deref()
            .unwrap()
            .starts_with("# Western astrology")
    );
    assert_eq!(info.tools, ["calculate_zodiac", "get_chart_snapshot"]);
    assert!(get_skill_info(&set, "missing").is_err());
    // A skill's tool set: core ∪ own ∪ authorized imports, nothing else.
    let tools: Vec<String> = tools_for_skill(&set, &e.registry.view(), &tenant(), "jungastro")
        .unwrap()
        .iter()
        .map(|s| s.name.to_string())
        .collect();
    assert_eq!(
        tools,
        [
            "skills.jungastro.interpret_chart",
            "skills.zodiac.calculate_zodiac",
            "skills.zodiac.get_chart_snapshot"
        ]
    );
    let zt: Vec<String> = tools_for_skill(&set, &e.registry.view(), &tenant(), "zodiac")
        .unwrap()
        .iter()
        .map(|s| s.name.to_string())
        .collect();
    assert_eq!(
        zt,
        [
            "skills.zodiac.calculate_zodiac",
            "skills.zodiac.get_chart_snapshot"
        ]
    );
    // Core tools (registered by the host, not by a skill) are in every skill's set.
    e.registry
        .register(soulbase_tools::ToolManifest::from_yaml_str(
            "id: core.util.now\nversion: 1.0.0\ndescription: the time\ninput_schema: {type: object}\noutput_schema: {}\nside_effect: none\n",
        ).unwrap())
        .unwrap();
    e.registry
        .enable(&soulbase_tools::ToolOwner::Global, &id("core.util.now"))
        .unwrap();
    let zt = tools_for_skill(&set, &e.registry.view(), &tenant(), "zodiac").unwrap();
    assert!(zt.iter().any(|s| s.name.as_str() == "core.util.now"));
    // The prompt sections list the enabled tools and skills.
    let p = system_prompt_sections(&zt, &list, None);
    assert!(p.contains("## Available Tools") && p.contains("## Skills (Available)"));
    assert!(!p.contains("## Tool Calling Guidelines"), "{p}");
    // With a bound on the loop, the guidelines state it (seed 003).
    let g = system_prompt_sections(&zt, &list, Some(10));
    assert!(g.starts_with(&p), "{g}");
    assert!(g.contains("## Tool Calling Guidelines") && g.contains("Maximum iterations: 10"));
    assert!(p.contains("You have access to the following tools:"), "{p}");
    assert!(
        !p.contains("## Tools (Available)"),
        "seed 003's heading: {p}"
    );
    assert!(p.contains("- `zodiac`: Compute a Western astrology birth chart"));
    assert_eq!(system_prompt_sections(&[], &[], Some(3)), "");
}

#[test]
fn the_watcher_polls_and_can_be_triggered() {
    let dir = tempfile::tempdir().unwrap();
    let e = env(dir.path());
    let w = watch(e.catalog.clone(), Duration::from_millis(100));
    // The fingerprint used by polling changes with any skill file change.
    let before = soulbase_skills::watch::fingerprint(dir.path());
    write(dir.path(), "p.yaml", &descriptor("p", "polled"));
    assert_ne!(before, soulbase_skills::watch::fingerprint(dir.path()));
    assert!(wait_until(WITHIN, || state(&e, "skills.p.p").is_some()));
    w.trigger();
    drop(w); // stops and joins the thread
}

#[test]
fn start_from_config_loads_and_watches() {
    // Inside the working directory (the package root when tests run).
    let dir = tempfile::Builder::new()
        .prefix(".start-test-")
        .tempdir_in(env!("CARGO_MANIFEST_DIR"))
        .unwrap();
    write(dir.path(), "a.yaml", &descriptor("a", "x"));
    let cfg = soulbase_config::SkillsConfig {
        dir: dir.path().to_path_buf(),
        watch: true,
        poll_interval_ms: 100,
        subscriptions: Vec::new(),
    };
    let registry = Registry::new();
    let running = soulbase_skills::start(registry.clone(), &cfg).unwrap();
    assert_eq!(running.catalog.current().len(), 1);
    assert!(running.watcher.is_some());
    write(dir.path(), "b.yaml", &descriptor("b", "y"));
    assert!(wait_until(WITHIN, || running.catalog.current().len() == 2));
    // Outside the working directory: served all the same (the working directory
    // plays no part in confinement).
    let outside = tempfile::tempdir().unwrap();
    write(outside.path(), "c.yaml", &descriptor("c", "z"));
    let running = soulbase_skills::start(
        Registry::new(),
        &soulbase_config::SkillsConfig {
            dir: outside.path().to_path_buf(),
            ..cfg
        },
    )
    .unwrap();
    assert!(running.catalog.current().get("c").is_some());
}
