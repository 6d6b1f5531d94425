//! OpenAI function calling export, with the strict (structured outputs) transform.
//!
//! Shape: `{"type":"function","function":{"name","description","parameters","strict"?}}`.
//!
//! With `strict`, OpenAI constrains decoding to the schema but accepts only a subset
//! of JSON Schema. [`strict_schema`] rewrites a schema into that subset:
//! - every object schema gets `additionalProperties: false` and lists every
//!   property in `required` — recursively through `properties`, `items`, `anyOf`,
//!   `$defs`/`definitions`;
//! - a property that was optional is made nullable (`"type": ["string","null"]`
//!   for scalars, `anyOf: [schema, {"type":"null"}]` for objects, arrays, `$ref`s);
//!   the model then sends `null` for "absent", and [`restore_optional`] turns those
//!   nulls back into absent fields before the arguments are validated against the
//!   tool's real schema;
//! - keywords outside the subset are removed with a warning. Kept: `type`,
//!   `properties`, `required`, `additionalProperties`, `items`, `enum`, `const`,
//!   `anyOf`, `$ref`, `$defs`, `definitions`, `description`, `title`, `pattern`,
//!   `format` (date-time, time, date, duration, email, hostname, ipv4, ipv6, uuid),
//!   `multipleOf`, `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`,
//!   `minItems`, `maxItems`. Removed: e.g. `minLength`, `maxLength`,
//!   `patternProperties`, `if`/`then`/`else`, `dependentRequired`,
//!   `unevaluatedProperties`, `minProperties`, `maxProperties`, `uniqueItems`,
//!   `default`, `not`, `allOf`. `oneOf` becomes `anyOf` (with a warning).
//!   Dropping a constraint is safe: the server still validates the arguments
//!   against the full schema before anything runs.
//!
//! Some schemas cannot be expressed without refusing valid arguments: a free-form
//! map (`additionalProperties: {schema}`, or a nested object with no declared
//! properties), a property that accepts anything, tuple `items`, an object whose
//! members also come from `allOf`/`patternProperties`/`dependentSchemas`/`if`, a
//! `required` name missing from `properties`, a `$ref` that is not a pointer into
//! `$defs`. Such a tool is exported with `strict: false` and its schema as is, plus
//! a warning, rather than with a schema that would make it unusable.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::schema_util::{pointer_join, resolve_local_ref};
use super::{Export, ExportWarning, NameMap, ToolSpec};

/// `format` values OpenAI strict mode supports.
const FORMATS: &[&str] = &[
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
];

/// Keywords copied unchanged (their values are not subschemas).
const PLAIN_KEYWORDS: &[&str] = &[
    "type",
    "enum",
    "const",
    "description",
    "title",
    "pattern",
    "multipleOf",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minItems",
    "maxItems",
];

/// Keywords that can admit members an object does not list in `properties`:
/// dropping them and closing the object would refuse valid arguments.
const OPENING_KEYWORDS: &[&str] = &[
    "allOf",
    "patternProperties",
    "dependentSchemas",
    "if",
    "then",
    "else",
    "unevaluatedProperties",
];

/// Keywords removed silently: identifiers and comments with no meaning for a model.
const SILENT_DROP: &[&str] = &["$schema", "$id", "$comment", "$anchor"];

/// Exports `specs` for OpenAI function calling, strict or not.
pub fn export(specs: &[ToolSpec], strict: bool) -> Export {
    let names = NameMap::new(specs.iter().map(|s| &s.name));
    let mut warnings = Vec::new();
    let tools = specs
        .iter()
        .map(|spec| export_one(spec, &names, strict, &mut warnings))
        .collect();
    Export {
        tools,
        names,
        warnings,
    }
}

fn export_one(
    spec: &ToolSpec,
    names: &NameMap,
    strict: bool,
    warnings: &mut Vec<ExportWarning>,
) -> Value {
    let name = names
        .name(&spec.name)
        .map(str::to_owned)
        .unwrap_or_else(|| NameMap::provider_name(&spec.name));
    let mut function = Map::new();
    function.insert("name".into(), Value::String(name));
    function.insert(
        "description".into(),
        Value::String(spec.description.clone()),
    );
    if strict {
        match strict_schema(&spec.input_schema) {
            Ok((schema, notes)) => {
                warnings.extend(notes.into_iter().map(|n| ExportWarning {
                    tool: spec.name.clone(),
                    location: n.location,
                    message: n.message,
                }));
                function.insert("parameters".into(), schema);
                function.insert("strict".into(), Value::Bool(true));
            }
            Err(SchemaNote {
                location,
                message: why,
            }) => {
                warnings.push(ExportWarning {
                    tool: spec.name.clone(),
                    location,
                    message: format!("exported with strict: false because {why}"),
                });
                function.insert("parameters".into(), plain_schema(&spec.input_schema));
                function.insert("strict".into(), Value::Bool(false));
            }
        }
    } else {
        function.insert("parameters".into(), plain_schema(&spec.input_schema));
    }
    json!({"type": "function", "function": Value::Object(function)})
}

/// The schema with `$schema` removed (OpenAI ignores or rejects it).
fn plain_schema(schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Some(map) = s.as_object_mut() {
        map.remove("$schema");
    }
    s
}

/// A remark about one place in a schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaNote {
    /// JSON pointer into the original schema (`""` for the root).
    pub location: String,
    /// What was changed, or why it cannot be expressed.
    pub message: String,
}

/// Rewrites `schema` into OpenAI's strict subset (see the module documentation).
///
/// Returns the new schema and what was changed, or where and why strict mode
/// cannot express the schema.
pub fn strict_schema(schema: &Value) -> Result<(Value, Vec<SchemaNote>), SchemaNote> {
    let mut warnings = Vec::new();
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(note(String::new(), "the root is not an object schema"));
    }
    let out = transform(schema, "", &mut warnings)?;
    Ok((out, warnings))
}

type Warnings = Vec<SchemaNote>;

fn note(location: impl Into<String>, message: impl Into<String>) -> SchemaNote {
    SchemaNote {
        location: location.into(),
        message: message.into(),
    }
}

fn transform(node: &Value, at: &str, warnings: &mut Warnings) -> Result<Value, SchemaNote> {
    let map = match node {
        Value::Object(map) => map,
        Value::Bool(true) => return Err(note(at.to_owned(), "a schema accepts any value")),
        Value::Bool(false) => return Err(note(at.to_owned(), "a schema accepts no value")),
        _ => {
            return Err(note(
                at.to_owned(),
                "a schema is neither an object nor a boolean",
            ));
        }
    };
    let mut out = Map::new();
    for (k, v) in map {
        let here = pointer_join(at, k);
        match k.as_str() {
            "properties" | "required" | "additionalProperties" => {} // handled below
            k if PLAIN_KEYWORDS.contains(&k) => {
                out.insert(k.to_owned(), v.clone());
            }
            "$ref" => match v.as_str() {
                // Wrapping optional properties moves what `#/properties/...` points
                // at, and `$id`/`$anchor` are dropped: only `$defs` pointers survive.
                Some(r) if r == "#" || r.starts_with("#/$defs/") || r.starts_with("#/definitions/") => {
                    out.insert("$ref".into(), v.clone());
                }
                _ => {
                    return Err(note(
                        here,
                        format!("$ref {v} is not a pointer into $defs (anchors, $id and property pointers cannot be exported)"),
                    ));
                }
            },
            k if SILENT_DROP.contains(&k) => {}
            "format" => match v.as_str() {
                Some(f) if FORMATS.contains(&f) => {
                    out.insert("format".into(), v.clone());
                }
                _ => warnings.push(note(here, format!("format {v} is not supported in strict mode; removed"))),
            },
            "items" => match v {
                Value::Object(_) => {
                    out.insert("items".into(), transform(v, &here, warnings)?);
                }
                _ => return Err(note(here, "`items` is not a single object schema")),
            },
            "$defs" | "definitions" => {
                let mut defs = Map::new();
                if let Value::Object(d) = v {
                    for (name, schema) in d {
                        defs.insert(name.clone(), transform(schema, &pointer_join(&here, name), warnings)?);
                    }
                }
                out.insert(k.to_owned(), Value::Object(defs));
            }
            "anyOf" | "oneOf" => {
                if k == "oneOf" {
                    if map.contains_key("anyOf") {
                        return Err(note(here, "both `anyOf` and `oneOf` are present"));
                    }
                    warnings.push(note(here.clone(), "`oneOf` is not supported in strict mode; exported as `anyOf`"));
                }
                let mut branches = Vec::new();
                for (i, b) in v.as_array().into_iter().flatten().enumerate() {
                    branches.push(transform(b, &format!("{here}/{i}"), warnings)?);
                }
                out.insert("anyOf".into(), Value::Array(branches));
            }
            other => warnings.push(note(
                here,
                format!("keyword `{other}` is not supported in strict mode; removed (the server still enforces it)"),
            )),
        }
    }

    let declares_object = match map.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        _ => map.contains_key("properties"),
    };
    if declares_object {
        if let Some(k) = OPENING_KEYWORDS.iter().find(|k| map.contains_key(**k)) {
            return Err(note(
                pointer_join(at, k),
                format!("`{k}` on an object can admit members strict mode would refuse"),
            ));
        }
        let empty = Map::new();
        let props = map
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let required: BTreeSet<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        match map.get("additionalProperties") {
            Some(Value::Bool(false)) => {}
            // A nested object with no declared members is free-form: closing it
            // would leave the model only `{}`. (An argument-less root is fine.)
            None if props.is_empty() && !at.is_empty() => {
                return Err(note(
                    at.to_owned(),
                    "an object with no declared properties (free-form) cannot be expressed",
                ));
            }
            None => {}
            Some(_) if props.is_empty() => {
                return Err(note(
                    pointer_join(at, "additionalProperties"),
                    "an object with free-form members (a map) cannot be expressed",
                ));
            }
            Some(_) => warnings.push(note(
                pointer_join(at, "additionalProperties"),
                "extra properties cannot be sent in strict mode; set to false",
            )),
        }
        if let Some(r) = required.iter().find(|r| !props.contains_key(**r)) {
            // The server would refuse every call that leaves it out, and strict
            // mode could never send it.
            return Err(note(
                pointer_join(at, "required"),
                format!("required property {r:?} is not declared in `properties`"),
            ));
        }
        let props_at = pointer_join(at, "properties");
        let mut new_props = Map::new();
        let mut all = Vec::new();
        for (name, ps) in props {
            let mut t = transform(ps, &pointer_join(&props_at, name), warnings)?;
            if !required.contains(name.as_str()) {
                t = nullable(t);
            }
            new_props.insert(name.clone(), t);
            all.push(Value::String(name.clone()));
        }
        if !out.contains_key("type") {
            out.insert("type".into(), Value::String("object".into()));
        }
        out.insert("properties".into(), Value::Object(new_props));
        out.insert("required".into(), Value::Array(all));
        out.insert("additionalProperties".into(), Value::Bool(false));
    }

    if !["type", "enum", "const", "anyOf", "$ref"]
        .iter()
        .any(|k| out.contains_key(*k))
    {
        return Err(note(
            at.to_owned(),
            "a schema has no type (it accepts any value)",
        ));
    }
    Ok(Value::Object(out))
}

/// Makes a (transformed) schema accept `null` too.
fn nullable(schema: Value) -> Value {
    let Value::Object(mut map) = schema else {
        return schema;
    };
    if allows_null_shallow(&map) {
        return Value::Object(map);
    }
    let has = |k: &str| map.contains_key(k);
    let scalar = match map.get("type") {
        Some(Value::String(t)) => !matches!(t.as_str(), "object" | "array"),
        Some(Value::Array(ts)) => !ts.iter().any(|t| t == "object" || t == "array"),
        _ => false,
    };
    // In place only where `type` and `enum` are the sole constraints on the value;
    // any other constraint that refuses null (`const`, `anyOf`, `$ref`) means wrap.
    if scalar && !has("const") && !has("anyOf") && !has("$ref") {
        match map.get_mut("type") {
            Some(Value::String(t)) => {
                let t = std::mem::take(t);
                map.insert("type".into(), json!([t, "null"]));
            }
            Some(Value::Array(ts)) if !ts.iter().any(|t| t == "null") => {
                ts.push(Value::String("null".into()));
            }
            _ => {}
        }
        push_null_to_enum(&mut map);
        return Value::Object(map);
    }
    if !has("type") && !has("const") && !has("$ref") {
        if has("enum") && !has("anyOf") {
            push_null_to_enum(&mut map);
            return Value::Object(map);
        }
        if has("anyOf") && !has("enum") {
            if let Some(Value::Array(branches)) = map.get_mut("anyOf") {
                branches.push(json!({"type": "null"}));
            }
            return Value::Object(map);
        }
    }
    // Objects, arrays, $refs, consts, mixed constraints: wrap, keeping the
    // description visible.
    let description = map.get("description").cloned();
    let mut wrapper = Map::new();
    if let Some(d) = description {
        wrapper.insert("description".into(), d);
    }
    wrapper.insert(
        "anyOf".into(),
        json!([Value::Object(map), {"type": "null"}]),
    );
    Value::Object(wrapper)
}

fn push_null_to_enum(map: &mut Map<String, Value>) {
    if let Some(Value::Array(values)) = map.get_mut("enum")
        && !values.contains(&Value::Null)
    {
        values.push(Value::Null);
    }
}

/// Whether a schema node admits `null` by its own keywords: every constraint present
/// (`type`, `enum`, `const`, `anyOf`) must admit it; a `$ref` is assumed not to.
fn allows_null_shallow(map: &Map<String, Value>) -> bool {
    let type_ok = match map.get("type") {
        None => true,
        Some(Value::String(t)) => t == "null",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "null"),
        Some(_) => false,
    };
    let enum_ok = map
        .get("enum")
        .is_none_or(|e| e.as_array().is_some_and(|e| e.contains(&Value::Null)));
    let const_ok = map.get("const").is_none_or(Value::is_null);
    let any_of_ok = map.get("anyOf").is_none_or(|bs| {
        bs.as_array().is_some_and(|bs| {
            bs.iter()
                .any(|b| b.as_object().is_some_and(allows_null_shallow))
        })
    });
    type_ok && enum_ok && const_ok && any_of_ok && !map.contains_key("$ref")
}

/// Undoes the strict transform's "optional ⇒ nullable" on a model's arguments.
///
/// Walks `args` along the tool's *original* `schema`: a member whose value is
/// `null`, that is not `required` there, and whose own schema does not accept
/// `null`, is removed (the model meant "absent"). Recurses through nested object
/// `properties`, array `items`, chains of local `$ref`s (`#/...`, up to 32 levels)
/// and, for a union of object shapes (`anyOf`/`oneOf`), the first branch whose
/// properties name every member sent. Call it before validating arguments that
/// came from a strict OpenAI export.
pub fn restore_optional(schema: &Value, args: &mut Value) {
    restore(schema, schema, args, 0);
}

/// Follows a chain of local `$ref`s (at most 32) to the schema that has content.
fn deref<'a>(root: &'a Value, mut schema: &'a Value) -> Option<&'a Value> {
    for _ in 0..32 {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => schema = resolve_local_ref(root, r)?,
            None => return Some(schema),
        }
    }
    None
}

fn restore(root: &Value, schema: &Value, args: &mut Value, depth: usize) {
    if depth > 32 {
        return;
    }
    let Some(schema) = deref(root, schema) else {
        return;
    };
    match args {
        Value::Object(members) => {
            let Some(props) = schema.get("properties").and_then(Value::as_object) else {
                // A union of object shapes: follow the branch the members fit.
                if let Some(branch) = fitting_branch(root, schema, members) {
                    restore(root, branch, args, depth + 1);
                }
                return;
            };
            let required: BTreeSet<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            members.retain(|name, value| {
                !(value.is_null()
                    && !required.contains(name.as_str())
                    && props
                        .get(name)
                        .is_some_and(|ps| !accepts_null(root, ps, depth + 1)))
            });
            for (name, value) in members.iter_mut() {
                if let Some(ps) = props.get(name) {
                    restore(root, ps, value, depth + 1);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items").filter(|i| i.is_object()) {
                for item in items {
                    restore(root, item_schema, item, depth + 1);
                }
            }
        }
        _ => {}
    }
}

/// The first `anyOf`/`oneOf` branch declaring `properties` that names every member
/// of `members`: the shape the model was filling in.
fn fitting_branch<'a>(
    root: &'a Value,
    schema: &'a Value,
    members: &Map<String, Value>,
) -> Option<&'a Value> {
    let branches = schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))
        .and_then(Value::as_array)?;
    branches.iter().filter_map(|b| deref(root, b)).find(|b| {
        b.get("properties")
            .and_then(Value::as_object)
            .is_some_and(|props| members.keys().all(|k| props.contains_key(k)))
    })
}

/// Whether the original schema admits `null`: every constraint present must.
fn accepts_null(root: &Value, schema: &Value, depth: usize) -> bool {
    if depth > 32 {
        return true;
    }
    let Value::Object(map) = schema else {
        return schema == &Value::Bool(true);
    };
    let ref_ok = map.get("$ref").and_then(Value::as_str).is_none_or(|r| {
        resolve_local_ref(root, r).is_none_or(|t| accepts_null(root, t, depth + 1))
    });
    let union_ok = map
        .get("anyOf")
        .or_else(|| map.get("oneOf"))
        .and_then(Value::as_array)
        .is_none_or(|bs| bs.iter().any(|b| accepts_null(root, b, depth + 1)));
    let all_ok = map
        .get("allOf")
        .and_then(Value::as_array)
        .is_none_or(|bs| bs.iter().all(|b| accepts_null(root, b, depth + 1)));
    let mut own = map.clone();
    own.remove("anyOf");
    own.remove("$ref");
    ref_ok && union_ok && all_ok && allows_null_shallow(&own)
}
