//! R3: model-facing specs and the OpenAI / Anthropic exports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::with;
use serde_json::{Value, json};
use soulbase_tools::compile;
use soulbase_tools::discovery::{NameMap, ToolSpec, anthropic, openai};
use soulbase_types::ToolId;

fn spec(id: &str, schema: Value) -> ToolSpec {
    ToolSpec {
        name: ToolId::new(id).unwrap(),
        description: format!("The {id} tool."),
        input_schema: Arc::new(schema),
    }
}

/// A schema with optional and nested fields, arrays of objects, a $ref and
/// keywords strict mode does not support.
fn rich_schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 200},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50},
            "mode": {"type": "string", "enum": ["fast", "deep"]},
            "filters": {
                "type": "object",
                "properties": {
                    "site": {"type": "string", "format": "hostname"},
                    "since": {"type": "string", "format": "date"},
                    "lang": {"type": "string", "format": "bcp47"}
                },
                "required": ["site"],
                "minProperties": 1
            },
            "sort": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"field": {"type": "string"}, "desc": {"type": "boolean"}},
                    "required": ["field"]
                },
                "uniqueItems": true
            },
            "origin": {"$ref": "#/$defs/point"}
        },
        "required": ["query"],
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}, "label": {"type": "string"}},
                "required": ["lat", "lon"]
            }
        }
    })
}

/// Visits every object schema in a (strict) schema.
fn each_object_schema(
    v: &Value,
    at: &str,
    f: &mut dyn FnMut(&str, &serde_json::Map<String, Value>),
) {
    match v {
        Value::Object(map) => {
            let is_object = map.get("type") == Some(&json!("object"))
                || map
                    .get("type")
                    .and_then(Value::as_array)
                    .is_some_and(|t| t.contains(&json!("object")));
            if is_object {
                f(at, map);
            }
            for (k, child) in map {
                if k == "enum" || k == "const" {
                    continue;
                }
                each_object_schema(child, &format!("{at}/{k}"), f);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                each_object_schema(item, &format!("{at}/{i}"), f);
            }
        }
        _ => {}
    }
}

#[test]
fn strict_export_closes_every_object_and_requires_every_property() {
    let specs = [spec("web.search.query", rich_schema())];
    let export = openai::export(&specs, true);
    assert_eq!(export.tools.len(), 1);
    let tool = &export.tools[0];
    assert_eq!(tool["type"], "function");
    assert_eq!(tool["function"]["name"], "web__search__query");
    assert_eq!(tool["function"]["strict"], true);
    assert_eq!(
        tool["function"]["description"],
        "The web.search.query tool."
    );
    let params = &tool["function"]["parameters"];
    assert!(params.get("$schema").is_none());

    let mut objects = Vec::new();
    each_object_schema(params, "", &mut |at, map| {
        objects.push(at.to_owned());
        assert_eq!(
            map.get("additionalProperties"),
            Some(&json!(false)),
            "at {at}"
        );
        let props: Vec<&String> = map
            .get("properties")
            .and_then(Value::as_object)
            .unwrap()
            .keys()
            .collect();
        let required: Vec<&str> = map["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap())
            .collect();
        let mut p: Vec<&str> = props.iter().map(|s| s.as_str()).collect();
        let mut r = required.clone();
        p.sort_unstable();
        r.sort_unstable();
        assert_eq!(p, r, "every property is required at {at}");
    });
    // root, filters, sort items, $defs/point
    assert_eq!(objects.len(), 4, "{objects:?}");

    let props = &params["properties"];
    // Required stays as is; optional scalars become nullable.
    assert_eq!(props["query"]["type"], "string");
    assert_eq!(props["limit"]["type"], json!(["integer", "null"]));
    assert_eq!(
        props["limit"]["minimum"], 1,
        "supported constraints are kept"
    );
    assert_eq!(props["mode"]["type"], json!(["string", "null"]));
    assert_eq!(props["mode"]["enum"], json!(["fast", "deep", null]));
    // Optional objects, arrays and refs are wrapped in anyOf with null.
    let filters = &props["filters"]["anyOf"];
    assert_eq!(filters[1], json!({"type": "null"}));
    assert_eq!(
        filters[0]["properties"]["site"]["type"], "string",
        "nested required stays non-null"
    );
    assert_eq!(
        filters[0]["properties"]["since"]["type"],
        json!(["string", "null"])
    );
    assert_eq!(filters[0]["properties"]["since"]["format"], "date");
    assert!(
        filters[0]["properties"]["lang"].get("format").is_none(),
        "unsupported format dropped"
    );
    assert!(filters[0].get("minProperties").is_none());
    assert_eq!(
        props["sort"]["anyOf"][0]["items"]["properties"]["desc"]["type"],
        json!(["boolean", "null"])
    );
    assert_eq!(props["origin"]["anyOf"][0]["$ref"], "#/$defs/point");
    assert_eq!(
        params["$defs"]["point"]["properties"]["label"]["type"],
        json!(["string", "null"])
    );
    assert!(props["query"].get("minLength").is_none());

    // Each dropped keyword is reported.
    let dropped: Vec<&str> = export
        .warnings
        .iter()
        .map(|w| w.location.as_str())
        .collect();
    for at in [
        "/properties/query/minLength",
        "/properties/query/maxLength",
        "/properties/filters/minProperties",
        "/properties/filters/properties/lang/format",
        "/properties/sort/uniqueItems",
    ] {
        assert!(
            dropped.contains(&at),
            "missing warning for {at}: {dropped:?}"
        );
    }
    assert!(
        export
            .warnings
            .iter()
            .all(|w| w.tool.as_str() == "web.search.query")
    );
}

#[test]
fn strict_export_of_a_real_manifest() {
    let tool = compile(with("w.f.get", |_| {})).unwrap();
    let export = openai::export(&[tool.spec()], true);
    let params = &export.tools[0]["function"]["parameters"];
    assert_eq!(params["additionalProperties"], false);
    assert_eq!(params["required"], json!(["city", "days"]));
    assert_eq!(
        params["properties"]["days"]["type"],
        json!(["integer", "null"])
    );
}

#[test]
fn non_strict_export_passes_the_schema_through() {
    let specs = [spec("web.search.query", rich_schema())];
    let export = openai::export(&specs, false);
    let f = &export.tools[0]["function"];
    assert!(f.get("strict").is_none());
    let mut expected = rich_schema();
    expected.as_object_mut().unwrap().remove("$schema");
    assert_eq!(f["parameters"], expected);
    assert!(export.warnings.is_empty());
}

#[test]
fn inexpressible_schemas_fall_back_to_non_strict() {
    let map_schema = json!({"type": "object", "properties": {
        "labels": {"type": "object", "additionalProperties": {"type": "string"}}
    }});
    let anything =
        json!({"type": "object", "properties": {"payload": {}}, "required": ["payload"]});
    let export = openai::export(
        &[
            spec("a.b.map", map_schema.clone()),
            spec("a.b.any", anything),
        ],
        true,
    );
    for tool in &export.tools {
        assert_eq!(tool["function"]["strict"], false);
    }
    assert_eq!(export.tools[0]["function"]["parameters"], map_schema);
    assert_eq!(export.warnings.len(), 2);
    assert!(export.warnings[0].message.contains("strict: false"));
    assert_eq!(
        export.warnings[0].location,
        "/properties/labels/additionalProperties"
    );
    assert_eq!(export.warnings[1].location, "/properties/payload");
}

#[test]
fn schemas_strict_mode_would_make_unusable_are_refused_not_mangled() {
    let cases = [
        // allOf can add members; closing the object would refuse them.
        (
            json!({"type": "object", "allOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]}]}),
            "/allOf",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string"}},
                   "patternProperties": {"^x-": {"type": "string"}}}),
            "/patternProperties",
        ),
        // A nested free-form object could only ever be `{}`.
        (
            json!({"type": "object", "properties": {"meta": {"type": "object"}}}),
            "/properties/meta",
        ),
        // A required member that is not declared could never be sent.
        (
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"]}),
            "/required",
        ),
        // Anchors and $id are dropped by the export, so refs to them would dangle.
        (
            json!({"type": "object", "$defs": {"c": {"$anchor": "city", "type": "string"}},
                   "properties": {"city": {"$ref": "#city"}}, "required": ["city"]}),
            "/properties/city/$ref",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"$ref": "#/properties/a"}}}),
            "/properties/b/$ref",
        ),
    ];
    for (schema, location) in cases {
        let err = openai::strict_schema(&schema).unwrap_err();
        assert_eq!(err.location, location, "{schema}: {}", err.message);
        let export = openai::export(&[spec("a.b.c", schema.clone())], true);
        assert_eq!(export.tools[0]["function"]["strict"], false, "{schema}");
    }
    // An argument-less tool is fine: the model sends `{}`.
    let (out, _) = openai::strict_schema(&json!({"type": "object"})).unwrap();
    assert_eq!(out["additionalProperties"], false);
}

#[test]
fn optional_fields_become_nullable_only_where_every_constraint_admits_null() {
    let schema = json!({"type": "object", "properties": {
        // `type` admits null but `enum` does not: null must be added to the enum.
        "a": {"type": ["string", "null"], "enum": ["x", "y"]},
        // A sibling anyOf refuses null: widening `type` alone would not do.
        "b": {"type": "string", "anyOf": [{"type": "string", "format": "email"}, {"type": "string", "maxLength": 3}]},
        // Already nullable in both: left alone, no duplicate null.
        "c": {"type": ["string", "null"], "enum": ["x", null]},
        "d": {"type": "string", "enum": ["x"]}
    }});
    let (out, _) = openai::strict_schema(&schema).unwrap();
    let p = &out["properties"];
    assert_eq!(p["a"]["enum"], json!(["x", "y", null]));
    assert_eq!(p["b"]["anyOf"][1], json!({"type": "null"}), "{}", p["b"]);
    assert_eq!(
        p["c"],
        json!({"type": ["string", "null"], "enum": ["x", null]})
    );
    assert_eq!(
        p["d"],
        json!({"type": ["string", "null"], "enum": ["x", null]})
    );
}

#[test]
fn restore_optional_follows_unions_and_ref_chains() {
    let schema = json!({
        "type": "object",
        "properties": {
            "target": {"anyOf": [
                {"type": "object",
                 "properties": {"path": {"type": "string"}, "mode": {"type": "string"}},
                 "required": ["path"]},
                {"type": "string"}
            ]},
            "loc": {"$ref": "#/$defs/alias"}
        },
        "required": ["target"],
        "$defs": {
            "alias": {"$ref": "#/$defs/point"},
            "point": {"type": "object",
                      "properties": {"lat": {"type": "number"}, "label": {"type": "string"}},
                      "required": ["lat"]}
        }
    });
    let mut args = json!({
        "target": {"path": "/a", "mode": null},
        "loc": {"lat": 1.5, "label": null}
    });
    openai::restore_optional(&schema, &mut args);
    assert_eq!(args, json!({"target": {"path": "/a"}, "loc": {"lat": 1.5}}));
    let m = with("w.s.u", |v| v["input_schema"] = schema.clone());
    compile(m).unwrap().validate_input(&args).unwrap();
}

#[test]
fn one_of_becomes_any_of() {
    let schema = json!({"type": "object", "properties": {
        "target": {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    }, "required": ["target"]});
    let (out, warnings) = openai::strict_schema(&schema).unwrap();
    assert_eq!(
        out["properties"]["target"],
        json!({"anyOf": [{"type": "string"}, {"type": "integer"}]})
    );
    assert_eq!(warnings.len(), 1);
}

#[test]
fn restore_optional_undoes_the_nullable_transform() {
    let schema = rich_schema();
    let mut args = json!({
        "query": "rust",
        "limit": null,
        "mode": null,
        "filters": {"site": "docs.rs", "since": null, "lang": null},
        "sort": [{"field": "date", "desc": null}],
        "origin": {"lat": 1.0, "lon": 2.0, "label": null}
    });
    openai::restore_optional(&schema, &mut args);
    assert_eq!(
        args,
        json!({
            "query": "rust",
            "filters": {"site": "docs.rs"},
            "sort": [{"field": "date"}],
            "origin": {"lat": 1.0, "lon": 2.0}
        })
    );
    // The restored arguments now validate against the real schema.
    let m = with("w.s.q", |v| v["input_schema"] = rich_schema());
    compile(m).unwrap().validate_input(&args).unwrap();

    // Nulls that the schema allows, or that are required, are kept.
    let schema = json!({"type": "object", "properties": {
        "a": {"type": ["string", "null"]}, "b": {"type": "string"}
    }, "required": ["b"]});
    let mut args = json!({"a": null, "b": null});
    openai::restore_optional(&schema, &mut args);
    assert_eq!(args, json!({"a": null, "b": null}));
}

#[test]
fn anthropic_export_shape() {
    let specs = [
        spec("fs.files.read_file", rich_schema()),
        spec("a__b.c.d", json!({"type": "object"})),
    ];
    let export = anthropic::export(&specs);
    let t0 = &export.tools[0];
    assert_eq!(t0["name"], "fs__files__read_file");
    assert_eq!(t0["description"], "The fs.files.read_file tool.");
    assert_eq!(
        t0["input_schema"]["properties"]["query"]["minLength"], 1,
        "schema passed through"
    );
    assert!(t0["input_schema"].get("$schema").is_none());
    assert_eq!(t0.as_object().unwrap().len(), 3);
    // Round trip through the returned name map.
    for (tool, s) in export.tools.iter().zip(&specs) {
        let name = tool["name"].as_str().unwrap();
        assert!(
            name.len() <= 64
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        );
        assert_eq!(export.names.to_id(name).as_ref(), Some(&s.name));
    }
}

#[test]
fn exports_share_names_and_round_trip() {
    let long = format!("{}.{}.{}", "g".repeat(30), "p".repeat(30), "n".repeat(30));
    let specs = [
        spec("a__b.c.d", json!({"type": "object"})),
        spec("a.b__c.d", json!({"type": "object"})),
        spec(&long, json!({"type": "object"})),
        spec("plain.tool.name", json!({"type": "object"})),
    ];
    let o = openai::export(&specs, true);
    let a = anthropic::export(&specs);
    assert_eq!(o.names, a.names);
    let mut seen = std::collections::BTreeSet::new();
    for (tool, s) in o.tools.iter().zip(&specs) {
        let name = tool["function"]["name"].as_str().unwrap();
        assert!(seen.insert(name.to_owned()), "names are unique");
        assert!(name.len() <= 64);
        assert_eq!(o.names.to_id(name), Some(s.name.clone()));
        assert_eq!(NameMap::provider_name(&s.name), name);
    }
    assert_eq!(o.names.to_id("made_up"), None);
}
