//! `SKILL.md` packages: a folder holding `SKILL.md` (YAML front matter between
//! `---` lines, then a Markdown body), optionally `scripts/` and `references/`.
//!
//! Front matter fields: the Agent Skills ones (`name`, `description`, `license`,
//! `compatibility`, `metadata`, `allowed-tools`) and seed 000's (`id`, `version`,
//! `exports`, `imports`, and `external_tools`, a deprecated alias of `imports`),
//! plus Soulbase's `provider` (the default binding of the skill's tools) and
//! `tools` (tools that are the skill's own, not exported).
//!
//! The skill's identity is `id` when given (then `name` is a display title), else
//! `name`; either way it follows the Agent Skills name rule and equals the folder
//! name. The file is only ever read; the body is kept verbatim.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};
use soulbase_sandbox::ProviderBinding;

use crate::common::{
    check_package_name, check_segment, compile_tool, parse_version, prepare_provider, sha256_hex,
    tool_id,
};
use crate::confine::Confinement;
use crate::descriptor::Parsed;
use crate::model::{
    Access, ApiVersion, Date, DeprecatedTool, Exports, Import, RiskLevel, Skill, SkillKind,
    SkillTool,
};
use crate::problem::SkillProblem;
use crate::risk::ToolDecl;
use crate::yaml::{key_line, parse};

/// The front matter keys this parser knows; others are kept and warned about.
const KNOWN: &[&str] = &[
    "name",
    "description",
    "id",
    "version",
    "license",
    "compatibility",
    "metadata",
    "allowed-tools",
    "provider",
    "tools",
    "exports",
    "imports",
    "external_tools",
];

#[derive(Debug, Deserialize)]
struct RawFront {
    name: String,
    description: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    provider: Option<ProviderBinding>,
    #[serde(default)]
    tools: Vec<RawTool>,
    #[serde(default)]
    exports: Option<RawExports>,
    #[serde(default)]
    imports: Vec<RawImport>,
    #[serde(default)]
    external_tools: Option<Vec<String>>,
    #[serde(flatten)]
    rest: BTreeMap<String, Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTool {
    name: String,
    description: String,
    #[serde(default)]
    input_schema: Option<Value>,
    #[serde(default)]
    output_schema: Option<Value>,
    #[serde(default)]
    provider: Option<ProviderBinding>,
    #[serde(default)]
    risk_level: RiskLevel,
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    mcp_name: Option<String>,
    #[serde(default)]
    output_content: bool,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawExportEntry {
    Named(String),
    Tool(Box<RawTool>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExports {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    tools: Vec<RawExportEntry>,
    #[serde(default)]
    access: RawAccess,
    #[serde(default)]
    deprecated: Vec<RawDeprecated>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAccess {
    #[serde(default)]
    requires_subscription: bool,
    #[serde(default)]
    free_tools: Vec<String>,
    #[serde(default)]
    rate_limit: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeprecated {
    tool: String,
    removal_date: String,
    #[serde(default)]
    since: Option<String>,
    #[serde(default)]
    replacement: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawImport {
    from: String,
    tools: Vec<String>,
    #[serde(default)]
    min_version: Option<String>,
}

/// Splits a SKILL.md into (front matter, body, lines before the front matter text).
fn split_front_matter(text: &str) -> Result<(&str, &str, u64), String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let first_end = text.find('\n').ok_or("must start with a `---` line")?;
    if text[..first_end].trim_end() != "---" {
        return Err("must start with a `---` line opening the YAML front matter".into());
    }
    let after = &text[first_end + 1..];
    let mut offset = 0;
    for line in after.split_inclusive('\n') {
        if line.trim_end() == "---" {
            let front = &after[..offset];
            let body = &after[offset + line.len()..];
            return Ok((front, body, 1));
        }
        offset += line.len();
    }
    Err("has no closing `---` line after the front matter".into())
}

/// Lists files under `scripts/` and `references/` (relative to `dir`), skipping any
/// that resolve outside the skills root.
fn resources(dir: &Path, confine: &Confinement) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in ["scripts", "references"] {
        let mut stack = vec![(dir.join(sub), 0u8)];
        while let Some((d, depth)) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                if confine.resolve(&p).is_err() {
                    continue;
                }
                if p.is_dir() {
                    if depth < 4 {
                        stack.push((p, depth + 1));
                    }
                } else if let Ok(rel) = p.strip_prefix(dir) {
                    out.push(rel.to_path_buf());
                }
            }
        }
    }
    out.sort();
    out
}

fn seconds(t: Option<f64>) -> Result<Option<u64>, String> {
    match t {
        None => Ok(None),
        Some(t) if t.is_finite() && t > 0.0 => Ok(Some((t * 1000.0).round() as u64)),
        Some(_) => Err("must be a positive number of seconds".into()),
    }
}

/// Parses the package whose `SKILL.md` is `file`, in folder `dir`, with contents `text`.
pub fn parse_package(file: &Path, dir: &Path, text: &str, confine: &Confinement) -> Parsed {
    let (front, body, offset) = match split_front_matter(text) {
        Ok(parts) => parts,
        Err(why) => return Parsed::failed(vec![SkillProblem::error(file, why).at_line(Some(1))]),
    };
    let raw: RawFront = match parse(front, offset) {
        Ok(r) => r,
        Err(e) => {
            return Parsed::failed(vec![
                SkillProblem::error(file, format!("invalid front matter: {}", e.message))
                    .at_line(e.line),
            ]);
        }
    };
    let line = |k: &str| key_line(front, k).map(|l| l + offset);
    let mut problems = Vec::new();
    let folder = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (ident, ident_field, title) = match &raw.id {
        Some(id) => (id.clone(), "id", Some(raw.name.clone())),
        None => (raw.name.clone(), "name", None),
    };
    if let Err(why) = check_package_name(&ident) {
        problems.push(
            SkillProblem::error(file, why)
                .in_field(ident_field)
                .at_line(line(ident_field)),
        );
    } else if ident != folder {
        problems.push(
            SkillProblem::error(file, format!("must equal its folder name {folder:?}"))
                .in_field(ident_field)
                .at_line(line(ident_field)),
        );
    }
    if let Some(t) = &title
        && (t.trim().is_empty() || t.chars().count() > 64)
    {
        problems.push(
            SkillProblem::error(file, "must be 1 to 64 characters")
                .in_field("name")
                .at_line(line("name")),
        );
    }
    let dlen = raw.description.trim().chars().count();
    if dlen == 0 || raw.description.chars().count() > 1024 {
        problems.push(
            SkillProblem::error(file, "must be 1 to 1024 characters")
                .in_field("description")
                .at_line(line("description")),
        );
    }
    let version = match parse_version(raw.version.as_deref()) {
        Ok(v) => v,
        Err(why) => {
            problems.push(
                SkillProblem::error(file, why)
                    .in_field("version")
                    .at_line(line("version")),
            );
            semver::Version::new(0, 0, 0)
        }
    };
    let mut extra = serde_json::Map::new();
    for (k, v) in &raw.rest {
        if !KNOWN.contains(&k.as_str()) {
            problems.push(
                SkillProblem::warning(file, "is not a known SKILL.md field; kept but unused")
                    .in_field(k.clone())
                    .at_line(line(k)),
            );
        }
        extra.insert(k.clone(), v.clone());
    }

    let mut default_provider = raw.provider.clone();
    if let Some(p) = default_provider.as_mut() {
        prepare_provider(p, dir, confine, file, "provider", &mut problems);
    }

    // Tools: own (`tools`) then exported (`exports.tools`), each with its field path.
    let mut decls: Vec<(RawTool, bool, String)> = Vec::new();
    let mut export_names: Vec<String> = Vec::new();
    for (i, t) in raw.tools.into_iter().enumerate() {
        decls.push((t, false, format!("tools[{i}]")));
    }
    let mut exports = Exports::default();
    if let Some(ex) = raw.exports {
        exports.api_version = match ex.api_version.as_deref() {
            None => None,
            Some(s) => {
                let v = ApiVersion::parse(s);
                if v.is_none() {
                    problems.push(
                        SkillProblem::error(file, format!("{s:?} is not a major.minor version"))
                            .in_field("exports.api_version")
                            .at_line(line("exports")),
                    );
                }
                v
            }
        };
        for (i, entry) in ex.tools.into_iter().enumerate() {
            match entry {
                RawExportEntry::Named(n) => export_names.push(n),
                RawExportEntry::Tool(t) => {
                    export_names.push(t.name.clone());
                    decls.push((*t, true, format!("exports.tools[{i}]")));
                }
            }
        }
        let mut rate_limit = Vec::new();
        for (tool, rate) in ex.access.rate_limit {
            if rate.trim() == "unlimited" {
                rate_limit.push((tool, None));
            } else {
                match soulbase_types::Rate::parse(&rate) {
                    Ok(r) => rate_limit.push((tool, Some(r))),
                    Err(e) => problems.push(
                        SkillProblem::error(file, e.to_string())
                            .in_field(format!("exports.access.rate_limit.{tool}"))
                            .at_line(line("exports")),
                    ),
                }
            }
        }
        exports.access = Access {
            requires_subscription: ex.access.requires_subscription,
            free_tools: ex.access.free_tools,
            rate_limit,
        };
        for (i, d) in ex.deprecated.into_iter().enumerate() {
            let field = format!("exports.deprecated[{i}]");
            let removal = Date::parse(&d.removal_date);
            if removal.is_none() {
                problems.push(
                    SkillProblem::error(
                        file,
                        format!("{:?} is not a YYYY-MM-DD date", d.removal_date),
                    )
                    .in_field(format!("{field}.removal_date"))
                    .at_line(line("exports")),
                );
            }
            let since = match d.since.as_deref() {
                None => None,
                Some(s) => {
                    let parsed = Date::parse(s);
                    if parsed.is_none() {
                        problems.push(
                            SkillProblem::error(file, format!("{s:?} is not a YYYY-MM-DD date"))
                                .in_field(format!("{field}.since"))
                                .at_line(line("exports")),
                        );
                    }
                    parsed
                }
            };
            if let Some(removal_date) = removal {
                exports.deprecated.push(DeprecatedTool {
                    tool: d.tool,
                    since,
                    removal_date,
                    replacement: d.replacement,
                });
            }
        }
    }

    let mut imports = Vec::new();
    for (i, imp) in raw.imports.into_iter().enumerate() {
        let min_version = match imp.min_version.as_deref() {
            None => None,
            Some(s) => {
                let v = ApiVersion::parse(s);
                if v.is_none() {
                    problems.push(
                        SkillProblem::error(file, format!("{s:?} is not a major.minor version"))
                            .in_field(format!("imports[{i}].min_version"))
                            .at_line(line("imports")),
                    );
                }
                v
            }
        };
        imports.push(Import {
            from: imp.from,
            tools: imp.tools,
            min_version,
            via_alias: false,
        });
    }
    if let Some(ext) = raw.external_tools {
        problems.push(
            SkillProblem::warning(
                file,
                "is deprecated; declare `imports: [{from: <skill>, tools: [...]}]` instead",
            )
            .in_field("external_tools")
            .at_line(line("external_tools")),
        );
        // `skill.tool` (or `skill/tool`) names its provider; a bare name is resolved
        // against the exporters when the whole set is known.
        let mut by_from: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for e in ext {
            let (from, tool) = match e.split_once(['.', '/']) {
                Some((f, t)) => (f.to_owned(), t.to_owned()),
                None => (String::new(), e),
            };
            by_from.entry(from).or_default().push(tool);
        }
        for (from, tools) in by_from {
            imports.push(Import {
                from,
                tools,
                min_version: None,
                via_alias: true,
            });
        }
    }

    // Compile every tool.
    let mut tools: Vec<SkillTool> = Vec::new();
    for (t, exported, field) in decls {
        if let Err(why) = check_segment(&t.name) {
            problems.push(SkillProblem::error(file, why).in_field(format!("{field}.name")));
            continue;
        }
        if tools.iter().any(|x| x.name == t.name) {
            problems.push(
                SkillProblem::error(file, format!("tool {} is declared twice", t.name))
                    .in_field(format!("{field}.name")),
            );
            continue;
        }
        // A tool exported by name (`exports.tools: [name]`) is exported too: the
        // schema requirement applies whichever way it was exported.
        let exported_any = exported || export_names.contains(&t.name);
        if exported_any && (t.input_schema.is_none() || t.output_schema.is_none()) {
            let missing = if t.input_schema.is_none() {
                "input_schema"
            } else {
                "output_schema"
            };
            problems.push(
                SkillProblem::error(
                    file,
                    "every exported tool needs input_schema and output_schema",
                )
                .in_field(format!("{field}.{missing}"))
                .at_line(line("exports")),
            );
            continue;
        }
        let timeout_ms = match seconds(t.timeout) {
            Ok(v) => v,
            Err(why) => {
                problems.push(SkillProblem::error(file, why).in_field(format!("{field}.timeout")));
                continue;
            }
        };
        let provider = match t.provider {
            Some(mut p) => {
                prepare_provider(
                    &mut p,
                    dir,
                    confine,
                    file,
                    &format!("{field}.provider"),
                    &mut problems,
                );
                p
            }
            None => default_provider.clone().unwrap_or_default(),
        };
        let Ok(id) = tool_id(&ident, &t.name) else {
            continue; // the identity problem is already reported
        };
        let decl = ToolDecl {
            id,
            version: version.clone(),
            description: t.description,
            input_schema: t
                .input_schema
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            output_schema: t.output_schema.unwrap_or_else(|| json!({})),
            provider,
            risk: t.risk_level,
            timeout_ms,
            tags: t.tags,
            mcp_name: t.mcp_name,
            output_content: t.output_content,
        };
        let tline = if exported {
            line("exports")
        } else {
            line("tools")
        };
        if let Some(compiled) = compile_tool(decl, file, &field, tline, &mut problems) {
            tools.push(SkillTool {
                name: t.name,
                exported,
                compiled,
            });
        }
    }
    // Exports named by string must refer to an own tool, which becomes exported.
    for n in export_names {
        match tools.iter_mut().find(|t| t.name == n) {
            Some(t) => {
                t.exported = true;
                if !exports.tools.contains(&n) {
                    exports.tools.push(n);
                }
            }
            None if problems.iter().any(SkillProblem::is_error) => {}
            None => problems.push(
                SkillProblem::error(
                    file,
                    format!("exports {n}, which the skill does not declare"),
                )
                .in_field("exports.tools")
                .at_line(line("exports")),
            ),
        }
    }

    if problems.iter().any(SkillProblem::is_error) {
        return Parsed::failed(problems);
    }
    let skill = Skill {
        name: ident,
        title,
        description: raw.description,
        version: raw.version,
        kind: SkillKind::Package,
        path: file.to_path_buf(),
        dir: dir.to_path_buf(),
        content: Arc::from(text),
        body: Some(Arc::from(body)),
        tools,
        exports,
        imports,
        resources: resources(dir, confine),
        extra,
        digest: sha256_hex(text.as_bytes()),
    };
    Parsed {
        skill: Some(skill),
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_matter_split() {
        let (f, b, o) = split_front_matter("---\nname: a\n---\n# Body\ntext\n").unwrap();
        assert_eq!(f, "name: a\n");
        assert_eq!(b, "# Body\ntext\n");
        assert_eq!(o, 1);
        let (f, b, _) = split_front_matter("---\r\nname: a\r\n---\r\nbody").unwrap();
        assert_eq!(f, "name: a\r\n");
        assert_eq!(b, "body");
        assert!(split_front_matter("name: a\n").is_err());
        assert!(split_front_matter("---\nname: a\n").is_err());
    }
}
