//! JSON Schema compilation: offline, once, with the dialect defaulting to 2020-12.

use std::collections::BTreeSet;

use jsonschema::{Draft, PatternOptions, Validator};
use serde_json::Value;

use super::Problem;

/// Meta-schema URIs a manifest schema may declare in `$schema` (without a trailing `#`).
const KNOWN_DIALECTS: &[(&str, Draft)] = &[
    (
        "https://json-schema.org/draft/2020-12/schema",
        Draft::Draft202012,
    ),
    (
        "http://json-schema.org/draft/2020-12/schema",
        Draft::Draft202012,
    ),
    (
        "https://json-schema.org/draft/2019-09/schema",
        Draft::Draft201909,
    ),
    (
        "http://json-schema.org/draft/2019-09/schema",
        Draft::Draft201909,
    ),
    ("http://json-schema.org/draft-07/schema", Draft::Draft7),
    ("https://json-schema.org/draft-07/schema", Draft::Draft7),
    ("http://json-schema.org/draft-06/schema", Draft::Draft6),
    ("https://json-schema.org/draft-06/schema", Draft::Draft6),
    ("http://json-schema.org/draft-04/schema", Draft::Draft4),
    ("https://json-schema.org/draft-04/schema", Draft::Draft4),
];

/// Keywords whose values are data, not subschemas: never scanned for `$ref`.
const DATA_KEYWORDS: &[&str] = &["enum", "const", "default", "examples"];

/// Compiles `schema` (found at manifest field `field`) once, offline.
///
/// Problems are pushed to `out`; `None` is returned when any was found. Remote or
/// otherwise non-local `$ref`/`$dynamicRef` are refused up front with the ref named
/// (they would never be fetched anyway: the validator is built offline, so nothing
/// reaches the network or the file system even if another crate in the build
/// enables jsonschema's resolvers). Patterns use the linear-time `regex` engine, so
/// an author cannot plant a catastrophic-backtracking pattern; look-around is
/// therefore unsupported. `format` is asserted, not just annotated.
pub(crate) fn compile_schema(
    field: &str,
    schema: &Value,
    out: &mut Vec<Problem>,
) -> Option<Validator> {
    let before = out.len();
    if !matches!(schema, Value::Object(_) | Value::Bool(_)) {
        out.push(Problem::new(
            field,
            "must be a JSON Schema (an object or a boolean)",
        ));
        return None;
    }

    let mut ids = BTreeSet::new();
    collect_ids(schema, &mut ids);
    scan_refs(schema, field, "", &ids, out);

    let declared = schema.get("$schema");
    let draft = match declared {
        None => Some(Draft::Draft202012),
        Some(Value::String(uri)) => {
            let uri = uri.trim_end_matches('#');
            match KNOWN_DIALECTS.iter().find(|(u, _)| *u == uri) {
                Some((_, d)) => Some(*d),
                None => {
                    out.push(Problem::new(
                        format!("{field}#/$schema"),
                        format!(
                            "unsupported dialect {:?}: use JSON Schema 2020-12 (the default), 2019-09, draft-07, -06 or -04",
                            short(uri)
                        ),
                    ));
                    None
                }
            }
        }
        Some(_) => {
            out.push(Problem::new(
                format!("{field}#/$schema"),
                "must be a string",
            ));
            None
        }
    };
    if out.len() > before {
        return None;
    }
    let draft = draft?;

    // Every way the schema breaks its dialect's meta-schema, not just the first.
    if let Some(meta) = meta_validator(draft) {
        let mut bad = false;
        for e in meta.iter_errors(schema) {
            bad = true;
            let at = e.instance_path().as_str();
            let path = if at.is_empty() {
                field.to_owned()
            } else {
                format!("{field}#{at}")
            };
            out.push(Problem::new(
                path,
                format!("is not a valid JSON Schema: {e}"),
            ));
        }
        if bad {
            return None;
        }
    }

    let built = jsonschema::options()
        .with_draft(draft)
        .offline()
        .should_validate_formats(true)
        .with_pattern_options(PatternOptions::regex())
        .build(schema);
    match built {
        Ok(v) => Some(v),
        Err(e) => {
            let at = e.instance_path().as_str();
            let path = if at.is_empty() {
                field.to_owned()
            } else {
                format!("{field}#{at}")
            };
            out.push(Problem::new(
                path,
                format!("does not compile as a JSON Schema: {e}"),
            ));
            None
        }
    }
}

/// The meta-schema validator of a bundled dialect.
fn meta_validator(draft: Draft) -> Option<jsonschema::meta::MetaValidator<'static>> {
    match draft {
        Draft::Draft4 => Some(jsonschema::draft4::meta::validator()),
        Draft::Draft6 => Some(jsonschema::draft6::meta::validator()),
        Draft::Draft7 => Some(jsonschema::draft7::meta::validator()),
        Draft::Draft201909 => Some(jsonschema::draft201909::meta::validator()),
        Draft::Draft202012 => Some(jsonschema::draft202012::meta::validator()),
        _ => None,
    }
}

/// Collects every `$id` declared anywhere in the document (these are local).
fn collect_ids(v: &Value, ids: &mut BTreeSet<String>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                if k == "$id" {
                    if let Value::String(id) = child {
                        ids.insert(id.trim_end_matches('#').to_owned());
                    }
                } else if !DATA_KEYWORDS.contains(&k.as_str()) {
                    collect_ids(child, ids);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect_ids(i, ids)),
        _ => {}
    }
}

/// Refuses every reference that does not point into this document.
///
/// Local means: a fragment (`#`, `#/$defs/x`, `#anchor`), or a URI whose part before
/// `#` is an `$id` declared in this same document.
fn scan_refs(v: &Value, field: &str, at: &str, ids: &BTreeSet<String>, out: &mut Vec<Problem>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                let here = format!("{at}/{}", escape_pointer(k));
                if matches!(k.as_str(), "$ref" | "$dynamicRef" | "$recursiveRef") {
                    if let Value::String(r) = child {
                        let base = r.split('#').next().unwrap_or_default();
                        if !r.starts_with('#') && !ids.contains(base) {
                            let what = if r.starts_with("http://") || r.starts_with("https://") {
                                "remote"
                            } else {
                                "non-local"
                            };
                            out.push(Problem::new(
                                format!("{field}#{here}"),
                                format!(
                                    "{what} {k} {:?} is not allowed: references are never fetched; \
                                     inline the definition under $defs and use a local ref like \"#/$defs/name\"",
                                    short(r)
                                ),
                            ));
                        }
                    }
                } else if !DATA_KEYWORDS.contains(&k.as_str()) {
                    scan_refs(child, field, &here, ids, out);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                scan_refs(item, field, &format!("{at}/{i}"), ids, out);
            }
        }
        _ => {}
    }
}

/// Escapes one JSON pointer segment (`~` → `~0`, `/` → `~1`).
pub(crate) fn escape_pointer(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

fn short(s: &str) -> String {
    s.chars().take(120).collect()
}

/// The normalized `type` of a schema: `None` when unconstrained.
pub(crate) fn type_set(schema: &Value) -> Option<BTreeSet<String>> {
    match schema.get("type")? {
        Value::String(t) => Some(BTreeSet::from([t.clone()])),
        Value::Array(ts) => Some(
            ts.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
        ),
        _ => None,
    }
}

/// Canonical JSON: object keys sorted at every level, no insignificant whitespace.
///
/// Independent of serde_json's `preserve_order` feature, so a digest computed here
/// never changes because some other crate in the build toggled it.
pub(crate) fn canonical_json(v: &Value) -> String {
    String::from_utf8(soulbase_observe::canonical_json(v)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn canonical_sorts_keys_recursively() {
        let v = json!({"b": 1, "a": {"d": [true, null, "x\"y"], "c": 1.5}});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":{"c":1.5,"d":[true,null,"x\"y"]},"b":1}"#
        );
    }

    #[test]
    fn local_refs_and_ids_are_accepted() {
        let mut out = Vec::new();
        let s = json!({
            "$id": "https://example.com/s.json",
            "type": "object",
            "$defs": {"x": {"type": "string"}},
            "properties": {
                "a": {"$ref": "#/$defs/x"},
                "b": {"$ref": "https://example.com/s.json#/$defs/x"},
                "c": {"const": {"$ref": "http://data.example/not-a-ref"}}
            }
        });
        assert!(
            compile_schema("input_schema", &s, &mut out).is_some(),
            "{out:?}"
        );
    }

    #[test]
    fn non_local_refs_are_refused_with_path_and_ref() {
        let mut out = Vec::new();
        let s = json!({"type": "object", "properties": {
            "a": {"$ref": "http://evil.example/schema.json"},
            "b": {"$ref": "other.json#/x"}
        }});
        assert!(compile_schema("output_schema", &s, &mut out).is_none());
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].path, "output_schema#/properties/a/$ref");
        assert!(out[0].message.contains("remote"));
        assert!(out[0].message.contains("http://evil.example/schema.json"));
        assert!(out[1].message.contains("non-local"));
    }

    #[test]
    fn dialects() {
        let mut out = Vec::new();
        let d7 = json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"});
        assert!(compile_schema("input_schema", &d7, &mut out).is_some());
        let bad = json!({"$schema": "https://example.com/my-dialect", "type": "object"});
        assert!(compile_schema("input_schema", &bad, &mut out).is_none());
        assert_eq!(out[0].path, "input_schema#/$schema");
    }

    #[test]
    fn invalid_schemas_are_reported() {
        let mut out = Vec::new();
        assert!(compile_schema("input_schema", &json!({"type": "strng"}), &mut out).is_none());
        assert!(out[0].path.starts_with("input_schema"), "{out:?}");
        let mut out = Vec::new();
        assert!(compile_schema("input_schema", &json!(42), &mut out).is_none());
        let mut out = Vec::new();
        let lookaround = json!({"type": "string", "pattern": "(?=a)b"});
        assert!(compile_schema("input_schema", &lookaround, &mut out).is_none());
    }
}
