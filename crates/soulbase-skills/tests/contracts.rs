//! Cross-skill contract checks (R13, seed 000 §5.1 and §9).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::*;
use soulbase_skills::check_dir_at;
use soulbase_skills::contracts::cycles;
use soulbase_skills::model::Date;

fn today() -> Date {
    Date::parse("2026-11-21").unwrap()
}

fn copy_examples(to: &Path) {
    for s in ["zodiac", "jungastro"] {
        std::fs::create_dir_all(to.join(s)).unwrap();
        std::fs::copy(
            repo_skills().join(s).join("SKILL.md"),
            to.join(s).join("SKILL.md"),
        )
        .unwrap();
    }
}

fn errors(dir: &Path) -> Vec<String> {
    check_dir_at(dir, today())
        .unwrap()
        .problems()
        .iter()
        .filter(|p| p.is_error())
        .map(ToString::to_string)
        .collect()
}

/// Every skill of `dir` as parsed, before validation (for the cycle finder).
fn parsed_skills(
    dir: &Path,
) -> std::collections::BTreeMap<String, std::sync::Arc<soulbase_skills::Skill>> {
    let confine = soulbase_skills::confine::Confinement::new(dir).unwrap();
    soulbase_skills::load::load_all(&confine)
        .unwrap()
        .into_iter()
        .filter_map(|o| o.parsed.skill)
        .map(|s| (s.name.clone(), std::sync::Arc::new(s)))
        .collect()
}

fn pkg(name: &str, front: &str) -> String {
    format!("---\nname: {name}\ndescription: skill {name}\n{front}---\nbody\n")
}

const EXPORTS_A: &str = "exports:\n  api_version: \"1.2\"\n  tools:\n    - name: a_tool\n      description: x\n      input_schema: {type: object}\n      output_schema: {type: object}\n";

#[test]
fn the_pair_passes() {
    let dir = tempfile::tempdir().unwrap();
    copy_examples(dir.path());
    assert!(errors(dir.path()).is_empty(), "{:?}", errors(dir.path()));
}

#[test]
fn removing_an_exported_tool_fails_the_consumer() {
    let dir = tempfile::tempdir().unwrap();
    copy_examples(dir.path());
    let p = dir.path().join("zodiac/SKILL.md");
    let text = std::fs::read_to_string(&p).unwrap();
    // Stop exporting get_chart_snapshot: delete its definition and access entries.
    let start = text.find("    - name: get_chart_snapshot").unwrap();
    let end = text.find("  access:").unwrap();
    let mut edited = format!("{}{}", &text[..start], &text[end..]);
    edited = edited
        .replace("    free_tools:\n      - get_chart_snapshot\n", "")
        .replace("      get_chart_snapshot: unlimited\n", "");
    std::fs::write(&p, edited).unwrap();
    let errs = errors(dir.path());
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].contains("jungastro/SKILL.md"), "{}", errs[0]);
    assert!(
        errs[0].contains("imports get_chart_snapshot from zodiac, which does not export it"),
        "{}",
        errs[0]
    );
}

#[test]
fn provider_must_exist_and_be_new_enough() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a/SKILL.md", &pkg("a", EXPORTS_A));
    write(
        dir.path(),
        "b/SKILL.md",
        &pkg(
            "b",
            "imports:\n  - from: a\n    tools: [a_tool]\n    min_version: \"1.3\"\n  - from: ghost\n    tools: [x]\n",
        ),
    );
    let errs = errors(dir.path());
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs.iter()
            .any(|e| e.contains("requires a api_version ≥ 1.3, but it exports 1.2"))
    );
    assert!(
        errs.iter()
            .any(|e| e.contains("imports from skill ghost, which does not exist"))
    );
    // 1.2 satisfies 1.2 and 1.10 > 1.9 numerically.
    write(
        dir.path(),
        "b/SKILL.md",
        &pkg(
            "b",
            "imports:\n  - from: a\n    tools: [a_tool]\n    min_version: \"1.2\"\n",
        ),
    );
    assert!(errors(dir.path()).is_empty());
}

#[test]
fn importing_an_unexported_own_tool_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a/SKILL.md",
        &pkg("a", "tools:\n  - name: private\n    description: x\n"),
    );
    write(
        dir.path(),
        "b/SKILL.md",
        &pkg("b", "imports:\n  - from: a\n    tools: [private]\n"),
    );
    let errs = errors(dir.path());
    assert!(
        errs[0].contains("has it but does not export it"),
        "{errs:?}"
    );
}

#[test]
fn cycles_are_reported_whole() {
    let dir = tempfile::tempdir().unwrap();
    let exp = |t: &str| {
        format!(
            "exports:\n  api_version: \"1.0\"\n  tools:\n    - name: {t}\n      description: x\n      input_schema: {{type: object}}\n      output_schema: {{type: object}}\n"
        )
    };
    write(
        dir.path(),
        "a/SKILL.md",
        &pkg(
            "a",
            &format!("{}imports:\n  - from: b\n    tools: [tb]\n", exp("ta")),
        ),
    );
    write(
        dir.path(),
        "b/SKILL.md",
        &pkg(
            "b",
            &format!("{}imports:\n  - from: c\n    tools: [tc]\n", exp("tb")),
        ),
    );
    write(
        dir.path(),
        "c/SKILL.md",
        &pkg(
            "c",
            &format!("{}imports:\n  - from: a\n    tools: [ta]\n", exp("tc")),
        ),
    );
    write(
        dir.path(),
        "d/SKILL.md",
        &pkg(
            "d",
            &format!("{}imports:\n  - from: d\n    tools: [td]\n", exp("td")),
        ),
    );
    write(
        dir.path(),
        "e/SKILL.md",
        &pkg("e", "imports:\n  - from: a\n    tools: [ta]\n"),
    );
    let errs = errors(dir.path());
    let cycle_errs: Vec<_> = errs.iter().filter(|e| e.contains("import cycle")).collect();
    assert_eq!(cycle_errs.len(), 2, "{errs:?}");
    assert!(
        errs.iter()
            .any(|e| e.contains("import cycle: a → b → c → a")),
        "{errs:?}"
    );
    assert!(
        errs.iter().any(|e| e.contains("import cycle: d → d")),
        "{errs:?}"
    );
    // A skill of a cycle is not loaded, and so neither is anything importing
    // from it: each says why.
    let set = check_dir_at(dir.path(), today()).unwrap();
    assert_eq!(set.len(), 0, "{:?}", set.problems());
    for s in ["b", "c", "e"] {
        assert!(
            errs.iter().any(|e| e.contains(&format!("{s}/SKILL.md"))
                && e.contains("which is not loaded (its file has errors)")),
            "{s}: {errs:?}"
        );
    }
    assert_eq!(cycles(&parsed_skills(dir.path())).len(), 2);
}

#[test]
fn exported_tools_need_both_schemas() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a/SKILL.md",
        &pkg(
            "a",
            "exports:\n  tools:\n    - name: t\n      description: x\n      input_schema: {type: object}\n",
        ),
    );
    let errs = errors(dir.path());
    assert!(
        errs[0].contains("exports.tools[0].output_schema"),
        "{errs:?}"
    );
}

#[test]
fn deprecation_windows_are_at_least_30_days() {
    let dir = tempfile::tempdir().unwrap();
    let dep = |since: &str, removal: &str| {
        format!(
            "{EXPORTS_A}  deprecated:\n    - tool: a_tool\n      since: \"{since}\"\n      removal_date: \"{removal}\"\n"
        )
    };
    write(
        dir.path(),
        "a/SKILL.md",
        &pkg("a", &dep("2026-12-01", "2026-12-20")),
    );
    let errs = errors(dir.path());
    assert!(
        errs[0].contains("19 days, less than the 30-day window"),
        "{errs:?}"
    );
    write(
        dir.path(),
        "a/SKILL.md",
        &pkg("a", &dep("2026-12-01", "2027-01-15")),
    );
    assert!(errors(dir.path()).is_empty());
    // Removing a tool before its announced removal date is an error.
    write(
        dir.path(),
        "a/SKILL.md",
        &pkg(
            "a",
            &format!(
                "{EXPORTS_A}  deprecated:\n    - tool: gone\n      since: \"2026-11-01\"\n      removal_date: \"2027-01-01\"\n"
            ),
        ),
    );
    let errs = errors(dir.path());
    assert!(
        errs[0].contains("gone was removed before its announced removal date"),
        "{errs:?}"
    );
    // An importer of a deprecated tool gets a warning naming the date.
    write(
        dir.path(),
        "a/SKILL.md",
        &pkg("a", &dep("2026-12-01", "2027-01-15")),
    );
    write(
        dir.path(),
        "b/SKILL.md",
        &pkg("b", "imports:\n  - from: a\n    tools: [a_tool]\n"),
    );
    let set = check_dir_at(dir.path(), today()).unwrap();
    assert!(!set.has_errors());
    assert!(set.problems().iter().any(|p| {
        p.reason
            .contains("deprecated and will be removed on 2027-01-15")
    }));
}

#[test]
fn access_terms_must_name_exported_tools() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a/SKILL.md",
        &pkg(
            "a",
            &format!(
                "{EXPORTS_A}  access:\n    requires_subscription: true\n    free_tools: [nope]\n    rate_limit:\n      other: 5/min\n"
            ),
        ),
    );
    let errs = errors(dir.path());
    assert_eq!(errs.len(), 2, "{errs:?}");
    write(
        dir.path(),
        "a/SKILL.md",
        &pkg(
            "a",
            &format!("{EXPORTS_A}  access:\n    rate_limit:\n      a_tool: often\n"),
        ),
    );
    let errs = errors(dir.path());
    assert!(
        errs[0].contains("exports.access.rate_limit.a_tool"),
        "{errs:?}"
    );
}

#[test]
fn same_exported_short_name_in_two_skills_is_namespaced() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a/SKILL.md", &pkg("a", EXPORTS_A));
    write(dir.path(), "b/SKILL.md", &pkg("b", EXPORTS_A));
    let set = check_dir_at(dir.path(), today()).unwrap();
    assert!(!set.has_errors());
    assert!(
        set.problems()
            .iter()
            .any(|p| p.reason.contains("skills.a.a_tool, skills.b.a_tool"))
    );
}

fn tool_exports(t: &str, api: &str) -> String {
    format!(
        "provider: {{type: builtin, handler: echo}}\nexports:\n  api_version: \"{api}\"\n  tools:\n    - name: {t}\n      description: x\n      input_schema: {{type: object}}\n      output_schema: {{type: object}}\n"
    )
}

#[test]
fn min_version_needs_the_same_major() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a/SKILL.md",
        &pkg("a", &tool_exports("t", "2.0")),
    );
    write(
        dir.path(),
        "b/SKILL.md",
        &pkg(
            "b",
            "imports:\n  - from: a\n    tools: [t]\n    min_version: \"1.0\"\n",
        ),
    );
    let errs = errors(dir.path());
    assert!(
        errs.iter()
            .any(|e| e.contains("requires a api_version ≥ 1.0, but it exports 2.0")),
        "{errs:?}"
    );
    write(
        dir.path(),
        "a/SKILL.md",
        &pkg("a", &tool_exports("t", "1.4")),
    );
    assert!(errors(dir.path()).is_empty(), "{:?}", errors(dir.path()));
}

#[tokio::test]
async fn skills_failing_their_contracts_are_not_loaded() {
    let dir = tempfile::tempdir().unwrap();
    // b imports a's tool with a min_version a does not meet.
    write(
        dir.path(),
        "a/SKILL.md",
        &pkg("a", &tool_exports("t", "2.0")),
    );
    write(
        dir.path(),
        "b/SKILL.md",
        &pkg(
            "b",
            "imports:\n  - from: a\n    tools: [t]\n    min_version: \"1.0\"\n",
        ),
    );
    // c and d import each other: a cycle.
    write(
        dir.path(),
        "c/SKILL.md",
        &pkg(
            "c",
            &format!(
                "{}imports:\n  - from: d\n    tools: [td]\n",
                tool_exports("tc", "1.0")
            ),
        ),
    );
    write(
        dir.path(),
        "d/SKILL.md",
        &pkg(
            "d",
            &format!(
                "{}imports:\n  - from: c\n    tools: [tc]\n",
                tool_exports("td", "1.0")
            ),
        ),
    );
    let e = env(dir.path());
    let set = e.catalog.current();
    assert!(set.get("a").is_some());
    for refused in ["b", "c", "d"] {
        assert!(set.get(refused).is_none(), "{refused} loaded");
    }
    // Their tools are not served, whoever calls.
    let gw = Calls::of(&e);
    for (caller, tool) in [(None, "skills.c.tc"), (Some("d"), "skills.c.tc")] {
        let r = gw
            .invoke(
                caller,
                soulbase_tools::pipeline::ToolCall::new(subject(), id(tool), serde_json::json!({})),
            )
            .await;
        assert!(!r.is_ok(), "{caller:?} → {tool}: {r:?}");
    }
    // With a compatible version the import works.
    write(
        dir.path(),
        "a/SKILL.md",
        &pkg("a", &tool_exports("t", "1.1")),
    );
    e.catalog.reload();
    let r = gw
        .invoke(
            Some("b"),
            soulbase_tools::pipeline::ToolCall::new(
                subject(),
                id("skills.a.t"),
                serde_json::json!({}),
            ),
        )
        .await;
    assert!(r.is_ok(), "{r:?}");
}

#[test]
fn a_reported_cycle_is_a_real_closed_path() {
    // a → b, a → c, b → a, c → b: one component {a, b, c}. Walking "the least
    // unvisited neighbour" gives a → b, then c is appended though b does not
    // import c; the report must follow real imports: a → b → a.
    let dir = tempfile::tempdir().unwrap();
    let imp = |from: &[&str]| {
        let mut s = String::from("imports:\n");
        for f in from {
            s.push_str(&format!("  - from: {f}\n    tools: [t{f}]\n"));
        }
        s
    };
    for (n, from) in [("a", vec!["b", "c"]), ("b", vec!["a"]), ("c", vec!["b"])] {
        write(
            dir.path(),
            &format!("{n}/SKILL.md"),
            &pkg(
                n,
                &format!("{}{}", tool_exports(&format!("t{n}"), "1.0"), imp(&from)),
            ),
        );
    }
    let skills = parsed_skills(dir.path());
    let found = cycles(&skills);
    assert_eq!(found.len(), 1, "{found:?}");
    let path = &found[0];
    for (i, from) in path.iter().enumerate() {
        let to = &path[(i + 1) % path.len()];
        assert!(
            skills[from].imports.iter().any(|imp| &imp.from == to),
            "{from} does not import {to}: {path:?}"
        );
    }
}

#[test]
fn deprecations_need_since_and_do_not_expire() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a/SKILL.md",
        &pkg(
            "a",
            &format!(
                "{EXPORTS_A}  deprecated:\n    - tool: a_tool\n      removal_date: \"2027-06-01\"\n"
            ),
        ),
    );
    // Whatever the date, an entry without `since` is an error (not only once
    // the removal date comes near), so CI results do not change with time.
    for day in ["2026-01-01", "2027-05-20"] {
        let set = check_dir_at(dir.path(), Date::parse(day).unwrap()).unwrap();
        assert!(
            set.problems()
                .iter()
                .any(|p| p.is_error() && p.reason.contains("needs `since`")),
            "{day}: {:?}",
            set.problems()
        );
    }
    // With `since`, the verdict is the same on any day.
    write(
        dir.path(),
        "a/SKILL.md",
        &pkg(
            "a",
            &format!(
                "{EXPORTS_A}  deprecated:\n    - tool: a_tool\n      since: \"2026-01-01\"\n      removal_date: \"2027-06-01\"\n"
            ),
        ),
    );
    for day in ["2026-01-01", "2027-05-20"] {
        let set = check_dir_at(dir.path(), Date::parse(day).unwrap()).unwrap();
        assert!(!set.has_errors(), "{day}: {:?}", set.problems());
    }
}

#[test]
fn absurd_years_are_refused_not_panicking() {
    assert!(Date::parse("0000-01-01").is_some());
    assert!(Date::parse("9999-12-31").is_some());
    for s in [
        "10000-01-01",
        "9223372036854775807-01-01",
        "-5-01-01",
        "99999999999999-12-31",
    ] {
        assert!(Date::parse(s).is_none(), "{s}");
    }
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a/SKILL.md",
        &pkg(
            "a",
            &format!(
                "{EXPORTS_A}  deprecated:\n    - tool: a_tool\n      since: \"2026-01-01\"\n      removal_date: \"9223372036854775807-01-01\"\n"
            ),
        ),
    );
    let errs = errors(dir.path());
    assert!(!errs.is_empty());
}
