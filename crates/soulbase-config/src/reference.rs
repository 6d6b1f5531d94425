//! The configuration's reference, derived from the typed model so it cannot drift:
//! the JSON Schema of `config.yaml` (served to editors, committed as
//! `docs/config.schema.json`), which keys an accepted reload applies to running
//! work ([`LIVE_KEYS`]; every other key takes a restart, and a reload that changes
//! one says so — [`restart_changes`]), and `docs/configuration.md` ([`markdown`]).
//! `cargo xtask codegen --check` fails when the committed files are stale.

use serde_json::{Map, Value, json};

use crate::Config;
use crate::layers::is_under;

/// The keys an accepted reload applies to the next call: the policy, credentials and
/// Cedar policies, quota limits and budgets, skill subscriptions, the sandbox grants
/// and ceiling (a call already running keeps the profile it started with), the
/// tenants' views of the global tools. Every
/// other key is read at start-up and takes effect after a restart — among them the
/// executors' settings (`sandbox.process_*`, `sandbox.wasm_*`, `sandbox.http_*`,
/// `sandbox.scratch_dir`), which configure executors built once, and the consent
/// keys and limits (`auth.consent`).
pub const LIVE_KEYS: &[&str] = &[
    "policy",
    "auth.api_keys",
    "auth.jwt",
    "auth.cedar",
    "quota.limits",
    "quota.budgets",
    "skills.subscriptions",
    "model",
    "sandbox.ceiling",
    "sandbox.default_grant",
    "sandbox.grants",
    "tenants",
];

/// Whether a reload applies the key at dotted `path` without a restart.
pub fn reloads_live(path: &str) -> bool {
    LIVE_KEYS.iter().any(|k| is_under(path, k))
}

/// The keys whose value differs between the configuration a process started with
/// (`running`) and an accepted new one, and that take a restart to apply: what a
/// reload must report instead of silently ignoring. Dotted paths, sorted.
pub fn restart_changes(running: &Config, new: &Config) -> Vec<String> {
    let (Ok(a), Ok(b)) = (serde_json::to_value(running), serde_json::to_value(new)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    differing(&a, &b, "", &mut out);
    out.retain(|p| !reloads_live(p));
    out
}

/// Every key whose value differs between two configurations, live or not:
/// dotted paths (objects descended into, lists and scalars compared whole),
/// sorted. Names only, never values (the audit of a reload records these).
pub fn changed_keys(before: &Config, after: &Config) -> Vec<String> {
    let (Ok(a), Ok(b)) = (serde_json::to_value(before), serde_json::to_value(after)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    differing(&a, &b, "", &mut out);
    out
}

/// Leaf paths (objects descended into; lists and scalars compared whole) where
/// `a` and `b` differ.
fn differing(a: &Value, b: &Value, prefix: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let path = join(prefix, k);
                match (x.get(k), y.get(k)) {
                    (Some(v), Some(w)) => differing(v, w, &path, out),
                    _ => out.push(path),
                }
            }
        }
        _ if a != b => out.push(prefix.to_owned()),
        _ => {}
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

/// The JSON Schema (2020-12) of `config.yaml`: every key with its type,
/// description (the model's doc comments) and default, unknown keys refused, and
/// `x-reload: live | restart` on each section's keys.
pub fn json_schema() -> Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(Config)).unwrap_or(Value::Null);
    if let Value::Object(root) = &mut schema {
        root.insert(
            "title".into(),
            json!("soulbased configuration (config.yaml)"),
        );
        let defs = root
            .get("$defs")
            .cloned()
            .and_then(|d| d.as_object().cloned())
            .unwrap_or_default();
        let mut annotated = defs.clone();
        if let Some(Value::Object(props)) = root.get_mut("properties") {
            for (section, prop) in props.iter_mut() {
                mark(prop, section);
                if let Some(def) = def_name(prop)
                    && let Some(Value::Object(d)) = annotated.get_mut(&def)
                    && let Some(Value::Object(children)) = d.get_mut("properties")
                {
                    for (key, child) in children.iter_mut() {
                        mark(child, &join(section, key));
                    }
                }
            }
        }
        root.insert("$defs".into(), Value::Object(annotated));
    }
    schema
}

fn mark(prop: &mut Value, path: &str) {
    if let Value::Object(p) = prop {
        let reload = if reloads_live(path) {
            "live"
        } else {
            "restart"
        };
        p.insert("x-reload".into(), json!(reload));
    }
}

/// The definition a property refers to (directly, or as `T or null`).
fn def_name(prop: &Value) -> Option<String> {
    if let Some(r) = prop.get("$ref").and_then(Value::as_str) {
        return r.rsplit('/').next().map(str::to_owned);
    }
    prop.get("anyOf")
        .and_then(Value::as_array)?
        .iter()
        .find_map(def_name)
}

/// `docs/configuration.md`: every key with its type, default, reload behaviour and
/// description, one table per section and per nested object.
pub fn markdown() -> String {
    let schema = json_schema();
    let defaults = serde_json::to_value(Config::default()).unwrap_or(Value::Null);
    let empty = Map::new();
    let defs = schema
        .get("$defs")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut out = String::from(MARKDOWN_HEAD);
    let mut tables = Vec::new();
    let root = Table {
        path: String::new(),
        schema: &schema,
    };
    tables.push(root);
    let mut i = 0;
    while i < tables.len() {
        let (path, schema) = (tables[i].path.clone(), tables[i].schema);
        i += 1;
        let Some(props) = schema.get("properties").and_then(Value::as_object) else {
            continue;
        };
        out.push_str(&if path.is_empty() {
            "\n## Top level\n\n".to_owned()
        } else {
            format!("\n## `{path}`\n\n")
        });
        if let Some(d) = schema.get("description").and_then(Value::as_str) {
            out.push_str(&one_paragraph(d));
            out.push_str("\n\n");
        }
        out.push_str("| key | type | default | reload | description |\n|---|---|---|---|---|\n");
        for (key, prop) in props {
            let full = join(&path, key);
            let nested = nested_object(prop, defs);
            let default = if path.contains("[]") {
                prop.get("default")
            } else {
                pointer(&defaults, &full)
            };
            // A field the schema does not list as required has a default
            // (`#[serde(default)]` on the field, which the schema cannot show).
            let listed = schema
                .get("required")
                .and_then(Value::as_array)
                .is_some_and(|r| r.iter().any(|k| k == key.as_str()));
            let default = match (default, nested) {
                (Some(_), Some(("", _))) => "see below".to_owned(),
                (Some(v), _) => format!("`{}`", cell(&short(v))),
                (None, _) if listed => "required".to_owned(),
                (None, _) => "optional".to_owned(),
            };
            let reload = if reloads_live(&full) {
                "live"
            } else if LIVE_KEYS.iter().any(|k| is_under(k, &full)) {
                "per key"
            } else {
                "restart"
            };
            out.push_str(&format!(
                "| `{full}` | {} | {default} | {reload} | {} |\n",
                cell(&type_of(prop, defs)),
                cell(&one_paragraph(
                    prop.get("description")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                )),
            ));
            if let Some((suffix, def)) = nested {
                tables.push(Table {
                    path: format!("{full}{suffix}"),
                    schema: def,
                });
            }
        }
    }
    out
}

struct Table<'a> {
    path: String,
    schema: &'a Value,
}

const MARKDOWN_HEAD: &str = "# Configuration reference

<!-- Generated from crates/soulbase-config by `cargo xtask codegen`; do not edit. -->

`soulbased` and `soulbase` read their configuration in layers, each overriding the
one before it key by key: built-in defaults < the development preset (`--dev` only)
< `config.yaml` (or the file named by `--config` / `SOULBASE_CONFIG`) < environment
variables (`SOULBASE_SECTION__KEY`, e.g. `SOULBASE_SERVER__HTTP_ADDR`; `SKILLS_DIR`
for `skills.dir`) < command-line flags (`--set path=value`, `--http-addr`, …).
Unknown keys are errors, and every error names the key and the layer it came from.

**Reload**: the file is watched (and `SIGHUP` or `POST /api/reload` re-reads it). A
new file that fails validation is refused and the running configuration stays. Keys
marked *live* apply to the next call; keys marked *restart* are read at start-up —
a reload that changes one logs a warning and lists it in the reload's answer
(`needs_restart`).

**Editors**: the JSON Schema of this file is [`config.schema.json`](config.schema.json),
also served by a running server at `GET /api/config/schema` (e.g. with the YAML
language server: `# yaml-language-server: $schema=http://127.0.0.1:8080/api/config/schema`).
";

/// Where a property holds an object of its own (directly, optional, or as the
/// items of a list): the path suffix (`""` or `"[]"`) and its definition.
fn nested_object<'a>(
    prop: &'a Value,
    defs: &'a Map<String, Value>,
) -> Option<(&'static str, &'a Value)> {
    let resolve = |v: &'a Value| -> Option<&'a Value> {
        let def = defs.get(&def_name(v)?)?;
        def.get("properties").map(|_| def)
    };
    if let Some(d) = resolve(prop) {
        return Some(("", d));
    }
    let items = prop.get("items")?;
    resolve(items).map(|d| ("[]", d))
}

/// A short human name of a property's type.
fn type_of(prop: &Value, defs: &Map<String, Value>) -> String {
    if let Some(name) = prop.get("$ref").and_then(Value::as_str) {
        let name = name.rsplit('/').next().unwrap_or(name);
        return match defs.get(name) {
            Some(def) if def.get("properties").is_some() => "object".to_owned(),
            Some(def) => type_of(def, defs),
            None => name.to_owned(),
        };
    }
    if let Some(any) = prop.get("anyOf").and_then(Value::as_array) {
        let parts: Vec<String> = any.iter().map(|v| type_of(v, defs)).collect();
        return parts.join(" or ");
    }
    if let Some(one) = prop.get("oneOf").and_then(Value::as_array) {
        let parts: Vec<String> = one.iter().map(|v| type_of(v, defs)).collect();
        return parts.join(" | ");
    }
    if let Some(c) = prop.get("const") {
        return format!("`{c}`");
    }
    if let Some(e) = prop.get("enum").and_then(Value::as_array) {
        let parts: Vec<String> = e.iter().map(|v| format!("`{v}`")).collect();
        return parts.join(" | ");
    }
    let base = |t: &str| match t {
        "array" => format!(
            "list of {}",
            prop.get("items")
                .map_or_else(|| "any".to_owned(), |i| type_of(i, defs))
        ),
        "object" => "map".to_owned(),
        other => other.to_owned(),
    };
    match prop.get("type") {
        Some(Value::String(t)) => base(t),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .map(base)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "any".to_owned(),
    }
}

fn pointer<'a>(tree: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(tree, |v, k| v.get(k))
}

/// A value as compact JSON, cut at 60 characters.
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        let cut: String = s.chars().take(57).collect();
        format!("{cut}…")
    } else {
        s
    }
}

/// A doc comment's first paragraph on one line, intra-doc links as plain code.
fn one_paragraph(doc: &str) -> String {
    doc.replace("[`", "`")
        .replace("`]", "`")
        .split("\n\n")
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Text safe inside a Markdown table cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_names_the_changed_keys_that_need_a_restart() {
        let running = Config::default();
        let mut new = running.clone();
        new.server.shutdown_grace_ms += 1;
        new.skills.dir = "/elsewhere".into();
        new.policy.rules.push(crate::PolicyRule {
            effect: crate::PolicyEffect::Allow,
            tenant: "t".into(),
            actors: vec!["*".into()],
            tools: vec!["*".into()],
            actions: vec!["invoke".into()],
            require_scopes: false,
            obligations: Vec::new(),
        });
        new.quota.limits.push(crate::QuotaLimit {
            tenant: "*".into(),
            tool: "*".into(),
            rate: "1/s".parse().unwrap(),
        });
        assert_eq!(
            restart_changes(&running, &new),
            vec![
                "server.shutdown_grace_ms".to_owned(),
                "skills.dir".to_owned()
            ]
        );
        assert!(restart_changes(&running, &running).is_empty());
        assert_eq!(
            changed_keys(&running, &new),
            vec![
                "policy.rules".to_owned(),
                "quota.limits".to_owned(),
                "server.shutdown_grace_ms".to_owned(),
                "skills.dir".to_owned()
            ]
        );
        assert!(changed_keys(&new, &new).is_empty());
    }

    #[test]
    fn every_live_key_exists_in_the_model() {
        let tree = serde_json::to_value(Config::default()).unwrap();
        for k in LIVE_KEYS {
            assert!(
                pointer(&tree, k).is_some(),
                "{k} is not a configuration key"
            );
        }
    }

    #[test]
    fn the_schema_describes_and_marks_every_section_key() {
        let schema = json_schema();
        let server = &schema["$defs"]["ServerConfig"]["properties"];
        assert_eq!(server["http_addr"]["x-reload"], "restart");
        assert!(
            server["http_addr"]["description"]
                .as_str()
                .unwrap()
                .contains("listen address")
        );
        assert_eq!(
            schema["$defs"]["QuotaConfig"]["properties"]["limits"]["x-reload"],
            "live"
        );
        assert_eq!(schema["properties"]["policy"]["x-reload"], "live");
        assert_eq!(
            schema["additionalProperties"], false,
            "unknown keys are refused"
        );
    }

    #[test]
    fn the_reference_lists_every_key_of_the_defaults() {
        let md = markdown();
        let tree = serde_json::to_value(Config::default()).unwrap();
        let mut leaves = Vec::new();
        fn walk(v: &Value, prefix: &str, out: &mut Vec<String>) {
            match v {
                Value::Object(m) if !m.is_empty() => {
                    for (k, w) in m {
                        walk(w, &join(prefix, k), out);
                    }
                }
                _ => out.push(prefix.to_owned()),
            }
        }
        walk(&tree, "", &mut leaves);
        for key in leaves {
            assert!(
                md.contains(&format!("| `{key}` |")),
                "{key} is missing from the reference"
            );
        }
        assert!(
            md.contains("| `policy.rules[].effect` |"),
            "list items are described"
        );
    }
}
