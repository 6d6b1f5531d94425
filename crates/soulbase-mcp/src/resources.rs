//! Skills as MCP resources: each skill that shows to the caller offers its source
//! file (a package's `SKILL.md`, a descriptor's YAML) and, for a package, every
//! other file in its folder, as `skill://{name}/{path}`.
//!
//! Visibility is the caller's skills only ([`soulbase_skills::skill_shows`]: a
//! skill shows when a tool of it is in the caller's governed list). `resources/read`
//! answers the bytes as they are on disk — the source file as loaded, verbatim —
//! text when they are UTF-8, base64 otherwise. A path is served only if it is one of
//! the listed files of that skill, resolved inside the skill's folder (symbolic
//! links leading out are neither listed nor read).

use std::path::{Path, PathBuf};

use base64::Engine as _;
use rmcp::model::{Resource, ResourceContents, ResourceTemplate};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_skills::{Skill, SkillKind, SkillSet};
use soulbase_tools::registry::AvailableSpec;

/// The URI scheme of skill resources.
pub const SCHEME: &str = "skill://";
/// Most files listed per package.
const MAX_FILES: usize = 256;
/// Deepest folder level listed inside a package.
const MAX_DEPTH: usize = 4;
/// The largest file served.
const MAX_BYTES: u64 = 4 << 20;

/// The URI of `rel` (a `/`-separated path inside the skill) of skill `name`.
pub fn uri(name: &str, rel: &str) -> String {
    format!("{SCHEME}{name}/{rel}")
}

/// `(skill name, path)` of a skill URI.
pub fn parse(uri: &str) -> Option<(&str, &str)> {
    let rest = uri.strip_prefix(SCHEME)?;
    let (name, rel) = rest.split_once('/')?;
    (!name.is_empty() && !rel.is_empty()).then_some((name, rel))
}

/// The skills that show to a caller with `available` tools.
pub fn shown<'a>(set: &'a SkillSet, available: &[AvailableSpec]) -> Vec<&'a Skill> {
    set.skills()
        .filter(|s| soulbase_skills::skill_shows(set, available, &s.name))
        .map(|s| &**s)
        .collect()
}

/// The files of `skill` it serves, relative, `/`-separated, sorted: the source
/// file first.
pub fn files(skill: &Skill) -> Vec<String> {
    let source = skill
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut out = vec![source.clone()];
    if matches!(skill.kind, SkillKind::Package) {
        let Ok(root) = skill.dir.canonicalize() else {
            return out;
        };
        let mut found = Vec::new();
        walk(&root, &root, 0, &mut found);
        found.sort();
        out.extend(found.into_iter().filter(|f| *f != source).take(MAX_FILES));
    }
    out
}

fn walk(root: &Path, dir: &Path, depth: usize, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if out.len() >= MAX_FILES {
            return;
        }
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        // Resolved, so a link out of the package is left out.
        let Ok(path) = entry.path().canonicalize() else {
            continue;
        };
        if !path.starts_with(root) {
            continue;
        }
        if path.is_dir() {
            if depth < MAX_DEPTH {
                walk(root, &path, depth + 1, out);
            }
        } else if let Ok(rel) = path.strip_prefix(root) {
            let parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push(parts.join("/"));
        }
    }
}

/// A file's media type, from its extension.
pub fn mime_type(rel: &str) -> &'static str {
    match rel
        .rsplit_once('.')
        .map(|(_, ext)| ext.to_ascii_lowercase())
    {
        Some(e) if e == "md" => "text/markdown",
        Some(e) if e == "yaml" || e == "yml" => "application/yaml",
        Some(e) if e == "json" => "application/json",
        Some(e) if e == "wasm" => "application/wasm",
        Some(e) if e == "py" => "text/x-python",
        Some(e) if e == "sh" => "text/x-shellscript",
        Some(e) if e == "png" => "image/png",
        Some(e) if e == "jpg" || e == "jpeg" => "image/jpeg",
        Some(e) if e == "txt" || e == "wat" => "text/plain",
        _ => "application/octet-stream",
    }
}

/// `resources/list`: the files of the skills that show, in name order.
pub fn list(set: &SkillSet, available: &[AvailableSpec]) -> Vec<Resource> {
    let mut out = Vec::new();
    for skill in shown(set, available) {
        for (i, rel) in files(skill).into_iter().enumerate() {
            let mut r = Resource::new(uri(&skill.name, &rel), format!("{}/{rel}", skill.name))
                .with_mime_type(mime_type(&rel));
            if i == 0 {
                r = r
                    .with_title(skill.title.clone().unwrap_or_else(|| skill.name.clone()))
                    .with_description(skill.description.clone());
            }
            if let Ok(meta) = std::fs::metadata(path_of(skill, &rel)) {
                r = r.with_size(meta.len());
            }
            out.push(r);
        }
    }
    out
}

/// `resources/templates/list`.
pub fn templates() -> Vec<ResourceTemplate> {
    vec![
        ResourceTemplate::new(format!("{SCHEME}{{name}}/SKILL.md"), "skill")
            .with_title("A skill's SKILL.md")
            .with_description(
                "The full SKILL.md of a skill package, verbatim (the usage phase of a skill).",
            )
            .with_mime_type("text/markdown"),
        ResourceTemplate::new(format!("{SCHEME}{{name}}/{{path}}"), "skill-file")
            .with_title("A file of a skill")
            .with_description("Any file of a skill package, verbatim."),
    ]
}

fn path_of(skill: &Skill, rel: &str) -> PathBuf {
    rel.split('/')
        .fold(skill.dir.clone(), |p, part| p.join(part))
}

fn not_found(uri: &str) -> SoulError {
    SoulError::new(ErrorCode::ToolNotFound, "no such resource").with_field("uri", uri)
}

/// `resources/read` of `uri` for a caller with `available` tools.
pub fn read(
    set: &SkillSet,
    available: &[AvailableSpec],
    uri: &str,
) -> Result<ResourceContents, SoulError> {
    let (name, rel) = parse(uri).ok_or_else(|| {
        SoulError::new(
            ErrorCode::SchemaValidationFailed,
            "a skill resource URI is skill://{name}/{path}",
        )
        .with_field("uri", uri)
    })?;
    let skill = shown(set, available)
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| not_found(uri))?;
    let files = files(skill);
    if !files.iter().any(|f| f == rel) {
        return Err(not_found(uri));
    }
    // The source file as loaded (what the skill's tools were built from).
    let bytes = if files.first().is_some_and(|f| f == rel) {
        skill.content.as_bytes().to_vec()
    } else {
        let path = path_of(skill, rel);
        match std::fs::metadata(&path) {
            Ok(m) if m.len() > MAX_BYTES => {
                return Err(SoulError::new(
                    ErrorCode::SchemaValidationFailed,
                    "the file is too large to serve",
                )
                .with_field("uri", uri)
                .with_field("max_bytes", MAX_BYTES.to_string()));
            }
            _ => {}
        }
        std::fs::read(&path).map_err(|e| not_found(uri).with_note(e.to_string()))?
    };
    let mime = mime_type(rel);
    Ok(match String::from_utf8(bytes) {
        Ok(text) => ResourceContents::text(text, uri).with_mime_type(mime),
        Err(e) => ResourceContents::blob(
            base64::engine::general_purpose::STANDARD.encode(e.into_bytes()),
            uri,
        )
        .with_mime_type(mime),
    })
}

/// A digest of what `read` would answer for `uri` now (`None` when it would
/// fail): what a subscription compares between reloads.
pub fn fingerprint(set: &SkillSet, available: &[AvailableSpec], uri: &str) -> Option<String> {
    let contents = read(set, available, uri).ok()?;
    let v = serde_json::to_string(&contents).ok()?;
    Some(format!("{}:{}", v.len(), fnv1a(&v)))
}

/// A cheap stable hash (FNV-1a, 64 bits) of `s`: a change detector, not a digest
/// anyone relies on.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip_and_refuse_malformed_ones() {
        assert_eq!(
            parse(&uri("zodiac", "SKILL.md")),
            Some(("zodiac", "SKILL.md"))
        );
        assert_eq!(
            parse("skill://zodiac/references/a.md"),
            Some(("zodiac", "references/a.md"))
        );
        for bad in [
            "file:///etc/passwd",
            "skill://",
            "skill://zodiac",
            "skill:///SKILL.md",
            "skill://zodiac/",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn media_types_follow_the_extension() {
        assert_eq!(mime_type("SKILL.md"), "text/markdown");
        assert_eq!(mime_type("x.YAML"), "application/yaml");
        assert_eq!(mime_type("bin"), "application/octet-stream");
    }
}
