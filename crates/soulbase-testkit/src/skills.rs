//! Skills directories for tests: an adversarial one, with one file per way a
//! skill can fail to load (or load with a warning), shared by the CLI's check
//! tests and the server's, which must agree on it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

/// An adversarial skills directory at `root/skills`, one row per way a file can
/// fail (or only warn), plus a program outside it (`root/escape.sh`). Returns the
/// expected outcome: the skills that load, and the (file, severity) problems.
pub fn adversarial(root: &Path) -> (Vec<&'static str>, Vec<(&'static str, &'static str)>) {
    let d = root.join("skills");
    let put = |rel: &str, text: &str| {
        let p = d.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    let echo = "provider: builtin\nhandler: soulbase.builtin.echo\n";
    let pkg = |name: &str, front: &str| {
        format!("---\nname: {name}\ndescription: skill {name}\n{front}---\n# {name}\n")
    };
    let tool = "      description: x\n      input_schema: {type: object}\n      output_schema: {type: object}\n";
    let own =
        "    description: x\n    input_schema: {type: object}\n    output_schema: {type: object}\n";
    // Loads cleanly.
    put(
        "good.yaml",
        &format!("name: good\ndescription: fine\n{echo}"),
    );
    // Bad YAML; an unknown descriptor field.
    put("bad_yaml.yaml", "name: [unclosed\ndescription: x\n");
    put(
        "unknown_field.yaml",
        &format!("name: unknown_field\ndescription: x\n{echo}colour: red\n"),
    );
    // A provider exporting pub_t (api 1.0) and keeping priv_t.
    put(
        "prov/SKILL.md",
        &pkg(
            "prov",
            &format!(
                "provider: {{type: builtin, handler: soulbase.builtin.echo}}\ntools:\n  - name: priv_t\n{own}exports:\n  api_version: \"1.0\"\n  tools:\n    - name: pub_t\n{tool}"
            ),
        ),
    );
    // Imports of an unexported tool; a min_version above the provider's.
    put(
        "grabby/SKILL.md",
        &pkg("grabby", "imports:\n  - from: prov\n    tools: [priv_t]\n"),
    );
    put(
        "too-new/SKILL.md",
        &pkg(
            "too-new",
            "imports:\n  - from: prov\n    tools: [pub_t]\n    min_version: \"1.5\"\n",
        ),
    );
    // Imports from a skill refused above.
    put(
        "chained/SKILL.md",
        &pkg("chained", "imports:\n  - from: grabby\n    tools: [x]\n"),
    );
    // A descriptor beside the package of the same name.
    put(
        "clash.yaml",
        &format!("name: clash\ndescription: x\n{echo}"),
    );
    put(
        "clash/SKILL.md",
        &pkg(
            "clash",
            &format!(
                "provider: {{type: builtin, handler: soulbase.builtin.echo}}\ntools:\n  - name: t\n{own}"
            ),
        ),
    );
    // A header variable neither allowed nor set: a warning, the skill loads.
    put(
        "token.yaml",
        "name: token\ndescription: x\nprovider: http\nendpoint: http://127.0.0.1:9/execute\nheaders:\n  Authorization: Bearer ${ADVERSARIAL_TOKEN}\n",
    );
    // A process command outside the package (and the root).
    std::fs::write(root.join("escape.sh"), "#!/bin/sh\n").unwrap();
    put(
        "escape/SKILL.md",
        &pkg(
            "escape",
            &format!(
                "provider: {{type: process, command: ../../escape.sh}}\ntools:\n  - name: t\n{own}"
            ),
        ),
    );
    // An unknown front-matter field: kept, warned about.
    put(
        "extra/SKILL.md",
        &pkg(
            "extra",
            &format!(
                "colour: red\n{echo_pkg}",
                echo_pkg = "provider: {type: builtin, handler: soulbase.builtin.echo}\n"
            ),
        ),
    );
    let loaded = vec!["extra", "good", "prov", "token"];
    let problems = vec![
        ("bad_yaml.yaml", "error"),
        ("chained/SKILL.md", "error"),
        ("clash.yaml", "error"),
        ("clash/SKILL.md", "error"),
        ("escape/SKILL.md", "error"),
        ("extra/SKILL.md", "warning"),
        ("grabby/SKILL.md", "error"),
        ("token.yaml", "warning"),
        ("too-new/SKILL.md", "error"),
        ("unknown_field.yaml", "error"),
    ];
    (loaded, problems)
}
