//! Parsing descriptors and SKILL.md packages, and loading a directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::json;
use soulbase_sandbox::ProviderBinding;
use soulbase_skills::model::{Date, RiskLevel};
use soulbase_skills::{SkillKind, check_dir};
use soulbase_tools::manifest::{SafetyClass, SideEffect};

const SEARCH_LOGS: &str = r#"name: search_logs
description: Search Kubernetes pod logs
provider: http
endpoint: http://127.0.0.1:8081/execute
timeout: 30
headers:
  Authorization: Bearer ${TOKEN}
risk_level: read
parameters:
  type: object
  properties:
    namespace: {type: string, description: Kubernetes namespace}
    pod: {type: string, description: Pod name}
    keyword: {type: string, description: Search keyword}
  required: [namespace, pod]
"#;

#[test]
fn the_seed_descriptor_becomes_an_http_manifest() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "search_logs.yaml", SEARCH_LOGS);
    let set = check_dir(dir.path()).unwrap();
    assert!(!set.has_errors(), "{:?}", set.problems());
    let s = set.get("search_logs").unwrap();
    assert_eq!(s.kind, SkillKind::Descriptor);
    let m = &s.tools[0].compiled.manifest;
    assert_eq!(m.id.as_str(), "skills.search_logs.search_logs");
    assert_eq!(m.side_effect, SideEffect::Network);
    assert_eq!(m.safety_class, SafetyClass::Low);
    assert!(!m.consent.required);
    assert_eq!(m.limits.timeout_ms, 30_000);
    match &m.provider {
        ProviderBinding::Http {
            endpoint,
            path,
            headers,
            timeout_ms,
        } => {
            assert_eq!(endpoint, "http://127.0.0.1:8081");
            assert_eq!(path.as_deref(), Some("/execute"));
            // Not expanded at load: secrets never enter the manifest.
            assert_eq!(headers["Authorization"], "Bearer ${TOKEN}");
            assert_eq!(*timeout_ms, Some(30_000));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(m.input_schema["required"], json!(["namespace", "pod"]));
    // The host is granted so the sandbox guard lets the call through.
    assert!(format!("{:?}", m.capabilities).contains("127.0.0.1"));
}

#[test]
fn risk_levels_map_to_safety_and_consent() {
    let dir = tempfile::tempdir().unwrap();
    for (name, risk) in [("r", "read"), ("w", "write"), ("d", "destructive")] {
        write(
            dir.path(),
            &format!("{name}.yaml"),
            &format!("name: {name}\ndescription: x\nprovider: builtin\nrisk_level: {risk}\n"),
        );
    }
    let set = check_dir(dir.path()).unwrap();
    let m = |n: &str| set.get(n).unwrap().tools[0].compiled.manifest.clone();
    assert_eq!(m("r").safety_class, SafetyClass::Low);
    assert!(!m("r").consent.required);
    assert_eq!(m("w").safety_class, SafetyClass::Medium);
    assert!(m("w").consent.required);
    assert_eq!(m("d").safety_class, SafetyClass::High);
    assert!(m("d").consent.required);
    assert_eq!(m("r").side_effect, SideEffect::None);
    let _ = RiskLevel::default();
}

#[test]
fn a_descriptor_or_package_tool_may_name_itself_for_mcp_and_answer_content() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "chart.yaml",
        "name: chart\ndescription: Draws a chart.\nprovider: builtin\n\
         mcp_name: draw_chart\noutput_content: true\noutput_schema: {type: object}\n",
    );
    write(
        dir.path(),
        "dotted.yaml",
        "name: dotted\ndescription: x\nprovider: builtin\nmcp_name: a.b\n",
    );
    write(
        dir.path(),
        "pack/SKILL.md",
        "---\nname: pack\ndescription: A package.\nprovider: {type: builtin, handler: soulbase.builtin.echo}\n\
         tools:\n  - name: plot\n    description: Plots.\n    mcp_name: plot_it\n    \
         output_content: true\n    output_schema: {type: object}\n---\n# Pack\n",
    );
    let set = check_dir(dir.path()).unwrap();
    let m = |n: &str| set.get(n).unwrap().tools[0].compiled.manifest.clone();
    assert_eq!(m("chart").mcp_name.as_deref(), Some("draw_chart"));
    assert!(m("chart").output_content);
    assert_eq!(m("pack").mcp_name.as_deref(), Some("plot_it"));
    assert!(m("pack").output_content);
    // A name with a dot could be taken for a tool id: refused, naming the field.
    assert!(set.get("dotted").is_none());
    let refused = set
        .problems()
        .iter()
        .find(|p| p.path.ends_with("dotted.yaml"))
        .unwrap_or_else(|| panic!("{:?}", set.problems()));
    assert_eq!(refused.field.as_deref(), Some("mcp_name"), "{refused:?}");
}

#[test]
fn bad_files_are_reported_with_path_line_and_field_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "good.yaml", &descriptor("good", "fine"));
    // Unknown field on line 4.
    write(
        dir.path(),
        "typo.yaml",
        "name: typo\ndescription: x\nprovider: builtin\nrisk_levle: read\n",
    );
    // Broken YAML on line 3.
    write(
        dir.path(),
        "broken.yaml",
        "name: broken\ndescription: x\nprovider: [\n",
    );
    // Bad provider value.
    write(
        dir.path(),
        "ftp.yaml",
        "name: ftp\ndescription: x\nprovider: ftp\n",
    );
    // Missing endpoint; timeout too long.
    write(
        dir.path(),
        "nohttp.yaml",
        "name: nohttp\ndescription: x\nprovider: http\ntimeout: 500\n",
    );
    // Schema that is not an object schema.
    write(
        dir.path(),
        "schema.yaml",
        "name: schema\ndescription: x\nprovider: builtin\nparameters:\n  type: string\n",
    );
    // Bad name.
    write(
        dir.path(),
        "upper.yaml",
        "name: Upper\ndescription: x\nprovider: builtin\n",
    );
    // Duplicate key.
    write(
        dir.path(),
        "dup.yaml",
        "name: dup\nname: dup2\ndescription: x\nprovider: builtin\n",
    );
    let set = check_dir(dir.path()).unwrap();
    assert_eq!(set.len(), 1, "only the good skill loads");
    assert!(set.get("good").is_some());
    let problems = set.problems();
    let find = |file: &str| {
        problems
            .iter()
            .filter(|p| p.path.ends_with(file) && p.is_error())
            .collect::<Vec<_>>()
    };
    let typo = find("typo.yaml");
    assert_eq!(typo.len(), 1);
    assert_eq!(typo[0].line, Some(4), "{}", typo[0]);
    assert!(typo[0].reason.contains("risk_levle"), "{}", typo[0]);
    assert!(find("broken.yaml")[0].line.is_some());
    assert!(
        // The value itself is not echoed (it could be a secret); the choices are.
        find("ftp.yaml")[0].reason.contains("unknown variant")
            && find("ftp.yaml")[0]
                .reason
                .contains("builtin, http, wasm, process"),
        "{}",
        find("ftp.yaml")[0]
    );
    let nohttp: Vec<_> = find("nohttp.yaml")
        .iter()
        .filter_map(|p| p.field.clone())
        .collect();
    assert!(nohttp.contains(&"endpoint".to_owned()), "{nohttp:?}");
    let schema = find("schema.yaml");
    assert_eq!(
        schema[0].field.as_deref(),
        Some("parameters"),
        "{}",
        schema[0]
    );
    assert_eq!(schema[0].line, Some(4));
    assert_eq!(find("upper.yaml")[0].field.as_deref(), Some("name"));
    assert_eq!(find("upper.yaml")[0].line, Some(1));
    assert_eq!(find("dup.yaml").len(), 1);
    // Display names the file and line.
    let shown = typo[0].to_string();
    assert!(
        shown.starts_with("error: ") && shown.contains("typo.yaml:4"),
        "{shown}"
    );
}

#[test]
fn packages_follow_the_agent_skills_rules() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "pdf-tools/SKILL.md",
        "---\nname: pdf-tools\ndescription: Work with PDF files.\nlicense: MIT\nmetadata:\n  author: me\n---\n# PDF tools\n\nUse `scripts/extract.py`.\n",
    );
    write(dir.path(), "pdf-tools/scripts/extract.py", "print('x')\n");
    write(dir.path(), "pdf-tools/references/spec.md", "# spec\n");
    write(
        dir.path(),
        "wrong/SKILL.md",
        "---\nname: other\ndescription: x\n---\n",
    );
    write(
        dir.path(),
        "Caps/SKILL.md",
        "---\nname: Caps\ndescription: x\n---\n",
    );
    write(
        dir.path(),
        "dash-/SKILL.md",
        "---\nname: dash-\ndescription: x\n---\n",
    );
    write(
        dir.path(),
        "long/SKILL.md",
        &format!("---\nname: long\ndescription: {}\n---\n", "x".repeat(1025)),
    );
    write(dir.path(), "nofront/SKILL.md", "# no front matter\n");
    write(
        dir.path(),
        "extra/SKILL.md",
        "---\nname: extra\ndescription: x\nwhatever: 1\n---\nbody",
    );
    let set = check_dir(dir.path()).unwrap();
    let names: Vec<_> = set.skills().map(|s| s.name.clone()).collect();
    assert_eq!(names, ["extra", "pdf-tools"]);
    let pdf = set.get("pdf-tools").unwrap();
    assert_eq!(
        pdf.body.as_deref(),
        Some("# PDF tools\n\nUse `scripts/extract.py`.\n")
    );
    assert_eq!(pdf.resources.len(), 2);
    assert!(pdf.tools.is_empty());
    assert_eq!(pdf.extra["license"], "MIT");
    let err_field = |folder: &str| {
        set.problems()
            .iter()
            .find(|p| p.path.to_string_lossy().contains(folder) && p.is_error())
            .unwrap_or_else(|| panic!("no error for {folder}"))
            .clone()
    };
    assert!(err_field("wrong").reason.contains("folder"));
    assert_eq!(err_field("Caps").field.as_deref(), Some("name"));
    assert_eq!(err_field("dash-").field.as_deref(), Some("name"));
    assert_eq!(err_field("long").field.as_deref(), Some("description"));
    assert_eq!(err_field("nofront").line, Some(1));
    // Unknown front matter fields warn but load.
    assert!(set.problems().iter().any(|p| !p.is_error()
        && p.path.to_string_lossy().contains("extra")
        && p.field.as_deref() == Some("whatever")));
}

#[test]
fn the_example_skills_load_cleanly() {
    let set = check_dir(&repo_skills()).unwrap();
    let errors: Vec<_> = set.problems().iter().filter(|p| p.is_error()).collect();
    assert!(errors.is_empty(), "{errors:?}");
    let zodiac = set.get("zodiac").unwrap();
    assert_eq!(zodiac.title.as_deref(), Some("Western astrology"));
    assert_eq!(
        zodiac.exports.tools,
        ["calculate_zodiac", "get_chart_snapshot"]
    );
    assert!(zodiac.needs_subscription("calculate_zodiac"));
    assert!(!zodiac.needs_subscription("get_chart_snapshot"));
    assert!(zodiac.rate_limit("calculate_zodiac").is_some());
    let j = set.get("jungastro").unwrap();
    assert_eq!(j.imports[0].from, "zodiac");
    // The document is kept verbatim.
    let on_disk = std::fs::read_to_string(repo_skills().join("zodiac/SKILL.md")).unwrap();
    assert_eq!(&*zodiac.content, on_disk);
}

#[test]
fn external_tools_is_a_deprecated_alias_of_imports() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("zodiac")).unwrap();
    std::fs::copy(
        repo_skills().join("zodiac/SKILL.md"),
        dir.path().join("zodiac/SKILL.md"),
    )
    .unwrap();
    write(
        dir.path(),
        "old/SKILL.md",
        "---\nname: old\ndescription: uses the old alias\nexternal_tools:\n  - calculate_zodiac\n  - zodiac.get_chart_snapshot\n---\n",
    );
    let set = check_dir(dir.path()).unwrap();
    assert!(!set.has_errors(), "{:?}", set.problems());
    let warn = set
        .problems()
        .iter()
        .find(|p| p.field.as_deref() == Some("external_tools"))
        .unwrap();
    assert!(!warn.is_error() && warn.reason.contains("deprecated"));
    let old = set.get("old").unwrap();
    let mut tools: Vec<_> = old
        .imports
        .iter()
        .flat_map(|i| {
            assert_eq!(i.from, "zodiac");
            i.tools.clone()
        })
        .collect();
    tools.sort();
    assert_eq!(tools, ["calculate_zodiac", "get_chart_snapshot"]);
}

#[test]
fn loading_never_writes_to_skill_files() {
    let dir = tempfile::tempdir().unwrap();
    let text = "---\nname: keep\ndescription: x\n---\nbody\n";
    write(dir.path(), "keep/SKILL.md", text);
    write(dir.path(), "k.yaml", &descriptor("k", "x"));
    let p = dir.path().join("keep/SKILL.md");
    let before = std::fs::metadata(&p).unwrap().modified().unwrap();
    // Read-only files load fine.
    let mut perms = std::fs::metadata(&p).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&p, perms).unwrap();
    let e = env(dir.path());
    e.catalog.reload();
    assert_eq!(e.catalog.current().len(), 2);
    assert_eq!(std::fs::read_to_string(&p).unwrap(), text);
    assert_eq!(std::fs::metadata(&p).unwrap().modified().unwrap(), before);
}

#[test]
fn dates_and_versions() {
    let d = Date::parse("2026-06-01").unwrap();
    assert_eq!(d.to_string(), "2026-06-01");
    assert_eq!(Date::parse("2026-04-01").unwrap().days_until(d), 61);
    assert!(Date::parse("2026-02-30").is_none());
    assert!(Date::parse("2024-02-29").is_some());
    use soulbase_skills::model::ApiVersion;
    assert!(ApiVersion::parse("1.10").unwrap() > ApiVersion::parse("1.9").unwrap());
    assert_eq!(ApiVersion::parse("2").unwrap().to_string(), "2.0");
    assert!(ApiVersion::parse("x").is_none());
}

#[test]
fn yaml_errors_do_not_quote_values_and_alias_bombs_fail_fast() {
    let dir = tempfile::tempdir().unwrap();
    // A secret in a field of the wrong type: the report must not repeat it.
    write(
        dir.path(),
        "leak.yaml",
        "name: leak\ndescription: x\nprovider: builtin\ntimeout: \"sk-live-TOPSECRET\"\n",
    );
    let set = soulbase_skills::check_dir(dir.path()).unwrap();
    let all: String = set.problems().iter().map(|p| format!("{p}\n")).collect();
    assert!(set.get("leak").is_none());
    assert!(!all.contains("TOPSECRET"), "{all}");
    // An alias bomb far below the default budgets is still refused.
    let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for (prev, name) in ["a", "b", "c", "d"].iter().zip(["b", "c", "d", "e"]) {
        bomb.push_str(&format!(
            "{name}: &{name} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
        ));
    }
    let r = soulbase_skills::yaml::parse::<serde_json::Value>(&bomb, 0);
    assert!(r.is_err(), "an alias bomb expanded");
}
