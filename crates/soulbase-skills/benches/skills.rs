//! Skills benchmarks (run with `cargo xtask bench -p soulbase-skills --bench skills`).
//!
//! Percentiles of individually timed operations:
//! - cold load of 1,000 skills (700 YAML descriptors + 300 SKILL.md packages, each
//!   compiled and registered) — target ≤ 500 ms;
//! - 100 single-file edits with the watcher running, from the write returning to
//!   the new version being resolvable in the registry — target p99 ≤ 1 s;
//! - listing 100 enabled skills (the selection phase) — target ≤ 20 µs; also the
//!   tool list for one skill (core ∪ own ∪ imports) over 100 skills.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::time::{Duration, Instant};

use soulbase_skills::{CatalogOptions, SkillCatalog, list_skills, tools_for_skill, watch};
use soulbase_testkit::report;
use soulbase_tools::Registry;
use soulbase_types::{TenantId, ToolId};

fn descriptor(name: &str, description: &str) -> String {
    format!(
        "name: {name}\ndescription: {description}\nprovider: builtin\nrisk_level: read\nparameters:\n  type: object\n  properties:\n    namespace: {{type: string}}\n    pod: {{type: string}}\n    keyword: {{type: string}}\n  required: [namespace, pod]\n"
    )
}

fn package(name: &str) -> String {
    format!(
        "---\nname: {name}\ndescription: package {name}\nversion: 1.0.0\nexports:\n  api_version: \"1.0\"\n  tools:\n    - name: run\n      description: run it\n      input_schema: {{type: object, properties: {{q: {{type: string}}}}}}\n      output_schema: {{type: object}}\n---\n# {name}\n\nUsage text.\n"
    )
}

fn populate(dir: &Path, descriptors: usize, packages: usize) {
    for i in 0..descriptors {
        std::fs::write(
            dir.join(format!("d{i:04}.yaml")),
            descriptor(&format!("d{i:04}"), "a skill"),
        )
        .unwrap();
    }
    for i in 0..packages {
        let d = dir.join(format!("p{i:04}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("SKILL.md"), package(&format!("p{i:04}"))).unwrap();
    }
}

fn cold_load() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path(), 700, 300);
    let mut samples = Vec::new();
    for _ in 0..10 {
        let start = Instant::now();
        let (catalog, report) =
            SkillCatalog::open(Registry::new(), CatalogOptions::new(dir.path())).unwrap();
        samples.push(start.elapsed());
        assert_eq!(catalog.current().len(), 1000);
        assert_eq!(report.errors().count(), 0);
    }
    report("cold load 1,000 skills", samples);
}

fn edits() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path(), 100, 0);
    let registry = Registry::new();
    let (catalog, _) =
        SkillCatalog::open(registry.clone(), CatalogOptions::new(dir.path())).unwrap();
    let _watcher = watch(catalog, Duration::from_millis(500));
    let tenant = TenantId::new("bench").unwrap();
    let mut samples = Vec::new();
    for i in 0..100 {
        let name = format!("d{:04}", i % 100);
        let id = ToolId::new(format!("skills.{name}.{name}")).unwrap();
        let desc = format!("edit {i}");
        let start = Instant::now();
        std::fs::write(
            dir.path().join(format!("{name}.yaml")),
            descriptor(&name, &desc),
        )
        .unwrap();
        let deadline = start + Duration::from_secs(10);
        loop {
            if registry
                .get(&tenant, &id)
                .is_ok_and(|r| r.tool.manifest.description == desc)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "edit {i} not applied within 10 s"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        samples.push(start.elapsed());
    }
    report("single-file edit, write to effect", samples);
}

fn listing() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path(), 50, 50);
    let registry = Registry::new();
    let (catalog, _) =
        SkillCatalog::open(registry.clone(), CatalogOptions::new(dir.path())).unwrap();
    let tenant = TenantId::new("bench").unwrap();
    let mut samples = Vec::with_capacity(100_000);
    for _ in 0..100_000 {
        let start = Instant::now();
        let set = catalog.current();
        let list = list_skills(&set);
        std::hint::black_box(&list);
        samples.push(start.elapsed());
        assert_eq!(list.len(), 100);
    }
    report("list 100 enabled skills", samples);
    let mut samples = Vec::with_capacity(10_000);
    for _ in 0..10_000 {
        let start = Instant::now();
        let set = catalog.current();
        let tools = tools_for_skill(&set, &registry.view(), &tenant, "p0001").unwrap();
        std::hint::black_box(&tools);
        samples.push(start.elapsed());
    }
    report("tool set of one skill (100 skills)", samples);
}

fn main() {
    cold_load();
    edits();
    listing();
}
