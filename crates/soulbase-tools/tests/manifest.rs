//! R1: manifest parsing, validation and the compiled tool's schema checks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{base, base_json, manifest, with};
use serde_json::json;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_sandbox::ProviderBinding;
use soulbase_tools::manifest::{Concurrency, Idempotency, SafetyClass, SideEffect};
use soulbase_tools::{ManifestError, ToolManifest, compile};

fn problems(m: ToolManifest) -> Vec<(String, String)> {
    match compile(m) {
        Ok(_) => Vec::new(),
        Err(e) => e
            .problems
            .into_iter()
            .map(|p| (p.path, p.message))
            .collect(),
    }
}

fn paths(m: ToolManifest) -> Vec<String> {
    problems(m).into_iter().map(|p| p.0).collect()
}

const FULL_YAML: &str = r#"
id: weather.forecast.get_forecast
version: 1.2.3
display_name: Weather forecast
description: Returns the forecast for a city.
tags: [weather, Public]
input_schema:
  type: object
  properties:
    city: { type: string }
    units: { type: string, enum: [metric, imperial] }
  required: [city]
output_schema:
  type: object
  properties:
    forecast: { type: string }
scopes:
  - { resource: "soul:net:api.weather.example", action: read }
capabilities:
  - kind: net
    hosts: [api.weather.example]
    schemes: [https]
    ports: [443]
    methods: [GET]
  - kind: tmp
    max_bytes: 1048576
side_effect: network
safety_class: medium
consent: { required: false }
limits: { timeout_ms: 5000, max_bytes_out: 65536 }
concurrency: serial
idempotency: keyed
provider_compat: { openai: "gpt-4o*, o3*", anthropic: "*" }
deprecations:
  - { since: "1.2.0", message: "use weather.forecast.get_forecast_v2", replacement: weather.forecast.get_forecast_v2 }
provider:
  type: http
  endpoint: https://weather.internal:8443
  headers: { Authorization: "Bearer ${WEATHER_TOKEN}" }
  timeout_ms: 4000
obligations:
  - { kind: mask, pointer: /forecast, value: "***" }
"#;

#[test]
fn full_yaml_manifest_parses_and_compiles() {
    let m = ToolManifest::from_yaml_str(FULL_YAML).unwrap();
    assert_eq!(
        m.name, "get_forecast",
        "name defaults to the id's last segment"
    );
    assert_eq!(m.version.to_string(), "1.2.3");
    assert_eq!(m.side_effect, SideEffect::Network);
    assert_eq!(m.safety_class, SafetyClass::Medium);
    assert_eq!(m.concurrency, Concurrency::Serial);
    assert_eq!(m.idempotency, Idempotency::Keyed);
    assert_eq!(m.limits.timeout_ms, 5000);
    assert_eq!(m.limits.max_files, 100, "unset limits keep their defaults");
    assert!(matches!(m.provider, ProviderBinding::Http { .. }));
    let tool = compile(m).unwrap();
    assert_eq!(tool.digest.len(), 64);
    assert_eq!(tool.id().as_str(), "weather.forecast.get_forecast");
}

#[test]
fn defaults_apply() {
    let m = base("a.b.c");
    assert_eq!(m.safety_class, SafetyClass::Low);
    assert!(!m.consent.required);
    assert_eq!(m.limits.timeout_ms, 30_000);
    assert_eq!(m.concurrency, Concurrency::Parallel);
    assert_eq!(m.idempotency, Idempotency::None);
    assert_eq!(m.provider, ProviderBinding::Builtin { handler: None });
    assert!(compile(m).is_ok());
}

#[test]
fn version_serializes_as_a_string() {
    let v = serde_json::to_value(base("a.b.c")).unwrap();
    assert_eq!(v["version"], "1.0.0");
    assert_eq!(v["name"], "c");
}

#[test]
fn json_and_yaml_parse_errors_name_line_and_field() {
    let e =
        ToolManifest::from_yaml_str("id: a.b.c\nversion: 1.0.0\ndescripton: typo\n").unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("descripton"), "{msg}");
    assert!(msg.contains('3'), "names the line: {msg}");

    // A field of the wrong shape is named by its path, with the line.
    let e = ToolManifest::from_yaml_str(
        "id: a.b.c\nversion: 1.0.0\ndescription: d\nlimits:\n  timeout_ms: soon\n",
    )
    .unwrap_err();
    assert_eq!(e.problems[0].path, "limits.timeout_ms", "{e}");
    assert!(e.to_string().contains("line 5"), "{e}");
    let mut v = base_json("a.b.c");
    v["tags"] = json!(["ok", 7]);
    let e = ToolManifest::from_json_str(&v.to_string()).unwrap_err();
    assert_eq!(e.problems[0].path, "tags[1]", "{e}");

    let e = ToolManifest::from_json_str("{\n\"id\": \"a.b.c\",\n\"side_efect\": \"none\"}")
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("side_efect") && msg.contains("line 3"),
        "{msg}"
    );

    let e = ToolManifest::from_json_str(r#"{"id": "A.b.c"}"#).unwrap_err();
    assert!(e.to_string().contains("invalid tool id"), "{e}");
    let mut v = base_json("a.b.c");
    v["version"] = json!("1.0");
    assert!(
        ToolManifest::from_json_str(&v.to_string()).is_err(),
        "semver is enforced"
    );
}

#[test]
fn name_must_match_the_id() {
    assert_eq!(
        paths(with("a.b.c", |v| v["name"] = json!("other"))),
        ["name"]
    );
    assert!(paths(with("a.b.c", |v| v["name"] = json!("c"))).is_empty());
}

#[test]
fn every_problem_is_reported_at_once() {
    let m = with("a.b.c", |v| {
        v["description"] = json!("");
        v["tags"] = json!(["x", "X"]);
        v["scopes"] = json!([{"resource": "", "action": "read"}]);
        v["input_schema"] = json!({"type": "array"});
        v["limits"] = json!({"timeout_ms": 0, "max_files": 0});
        v["obligations"] = json!([{"kind": "redact", "pointer": "secret"}]);
        v["provider_compat"] = json!({"mistral": "*"});
        v["deprecations"] = json!([{"since": "", "message": "m", "replacement": "a.b.c"}]);
    });
    assert_eq!(
        paths(m),
        [
            "description",
            "tags[1]",
            "scopes[0].resource",
            "input_schema",
            "limits.timeout_ms",
            "limits.max_files",
            "provider_compat.mistral",
            "deprecations[0].since",
            "deprecations[0].replacement",
            "obligations[0].pointer",
        ]
    );
}

#[test]
fn schemas_must_compile() {
    let p = problems(with("a.b.c", |v| {
        v["output_schema"] = json!({"type": "object", "properties": {"x": {"type": "strng"}}});
    }));
    assert_eq!(p.len(), 1);
    assert!(p[0].0.starts_with("output_schema"), "{p:?}");
    let p = problems(with("a.b.c", |v| v["input_schema"] = json!("not a schema")));
    assert!(p.iter().any(|(path, _)| path == "input_schema"));
    // Every meta-schema violation is reported, each at its place.
    let p = problems(with("a.b.c", |v| {
        v["input_schema"]["properties"]["city"] = json!({"type": "strng"});
        v["input_schema"]["properties"]["days"] = json!({"minimum": "one"});
    }));
    let paths: Vec<&str> = p.iter().map(|(path, _)| path.as_str()).collect();
    assert!(
        paths
            .iter()
            .any(|x| x.starts_with("input_schema#/properties/city")),
        "{p:?}"
    );
    assert!(
        paths
            .iter()
            .any(|x| x.starts_with("input_schema#/properties/days")),
        "{p:?}"
    );
}

#[test]
fn remote_refs_are_rejected_naming_field_and_ref() {
    let p = problems(with("a.b.c", |v| {
        v["input_schema"]["properties"]["city"] =
            json!({"$ref": "http://schemas.example.com/city.json"});
    }));
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].0, "input_schema#/properties/city/$ref");
    assert!(
        p[0].1.contains("http://schemas.example.com/city.json"),
        "{}",
        p[0].1
    );
    assert!(p[0].1.contains("never fetched"));

    let p = problems(with("a.b.c", |v| {
        v["output_schema"] = json!({"$ref": "https://evil.example/out.json"});
    }));
    assert_eq!(p[0].0, "output_schema#/$ref");

    // A local ref is fine.
    assert!(
        paths(with("a.b.c", |v| {
            v["input_schema"]["$defs"] = json!({"c": {"type": "string"}});
            v["input_schema"]["properties"]["city"] = json!({"$ref": "#/$defs/c"});
        }))
        .is_empty()
    );
}

#[test]
fn input_schema_must_be_an_object_schema() {
    assert_eq!(
        paths(with("a.b.c", |v| v["input_schema"] = json!({"type": "string"}))),
        ["input_schema"]
    );
    assert_eq!(
        paths(with("a.b.c", |v| v["input_schema"] = json!({}))),
        ["input_schema"]
    );
    // The output schema may be anything.
    assert!(paths(with("a.b.c", |v| v["output_schema"] = json!({"type": "string"}))).is_empty());
}

#[test]
fn capabilities_must_cover_the_side_effect() {
    let fs = |access: &str| json!([{"kind": "fs", "paths": ["/data"], "access": [access]}]);
    let cases = [
        ("read", json!([]), false),
        ("read", fs("read"), true),
        ("read", fs("list"), false),
        ("filesystem", fs("list"), true),
        ("filesystem", json!([]), false),
        (
            "network",
            json!([{"kind": "net", "hosts": ["a.example.com"]}]),
            true,
        ),
        ("network", fs("read"), false),
        (
            "process",
            json!([{"kind": "proc", "commands": ["git"]}]),
            true,
        ),
        ("process", json!([]), false),
        ("browser", json!([{"kind": "browser"}]), true),
        ("browser", json!([]), false),
        ("none", json!([]), true),
        ("none", json!([{"kind": "tmp", "max_bytes": 10}]), true),
        (
            "none",
            json!([{"kind": "client", "requests": ["elicitation", "sampling"]}]),
            true,
        ),
    ];
    for (side, caps, ok) in cases {
        let m = with("a.b.c", |v| {
            v["side_effect"] = json!(side);
            v["capabilities"] = caps.clone();
            v["consent"] = json!({"required": true});
        });
        let p = paths(m);
        assert_eq!(p.is_empty(), ok, "{side} with {caps}: {p:?}");
        if !ok {
            assert_eq!(p, ["capabilities"], "{side} with {caps}");
        }
    }
}

/// Only builtin handlers are given the client channel: elsewhere a `client`
/// capability would have no effect, so it is refused naming the capability; an
/// empty one is refused too.
#[test]
fn client_requests_are_for_builtin_tools_only() {
    let client = json!([{"kind": "client", "requests": ["sampling"]}]);
    let builtin = with("a.b.c", |v| v["capabilities"] = client.clone());
    assert!(paths(builtin).is_empty());
    let http = with("a.b.c", |v| {
        v["capabilities"] = client.clone();
        v["provider"] = json!({"type": "http", "endpoint": "https://svc.example.com"});
    });
    assert_eq!(paths(http), ["capabilities[0]"]);
    let empty = with("a.b.c", |v| {
        v["capabilities"] = json!([{"kind": "client", "requests": []}]);
    });
    assert_eq!(paths(empty), ["capabilities[0].requests"]);
}

#[test]
fn write_needs_fs_write() {
    let m = |access: &str| {
        with("a.b.c", |v| {
            v["side_effect"] = json!("write");
            v["capabilities"] =
                json!([{"kind": "fs", "paths": ["out/"], "access": ["read", access]}]);
            v["consent"] = json!({"required": true});
        })
    };
    assert_eq!(paths(m("list")), ["capabilities"]);
    assert!(paths(m("write")).is_empty());
}

#[test]
fn side_effect_none_may_not_declare_real_capabilities() {
    let m = with("a.b.c", |v| {
        v["capabilities"] =
            json!([{"kind": "tmp", "max_bytes": 1}, {"kind": "net", "hosts": ["a.example.com"]}]);
    });
    assert_eq!(paths(m), ["capabilities[1]"]);
}

#[test]
fn consent_rule() {
    let fs_write = json!([{"kind": "fs", "paths": ["/out"], "access": ["write"]}]);
    let proc_ = json!([{"kind": "proc", "commands": ["ls"]}]);
    let read_and_write = json!([{"kind": "fs", "paths": ["/x"], "access": ["read", "write"]}]);
    let read_and_proc = json!([
        {"kind": "fs", "paths": ["/x"], "access": ["read"]},
        {"kind": "proc", "commands": ["rm"]}
    ]);
    for (side, caps, safety) in [
        ("write", fs_write.clone(), "low"),
        ("process", proc_.clone(), "low"),
        ("none", json!([]), "high"),
        // Declaring a milder side effect does not escape consent: the capabilities
        // say what the tool can do.
        ("read", read_and_write, "low"),
        ("read", read_and_proc, "low"),
        ("filesystem", fs_write.clone(), "low"),
    ] {
        let m = |required: bool| {
            with("a.b.c", |v| {
                v["side_effect"] = json!(side);
                v["capabilities"] = caps.clone();
                v["safety_class"] = json!(safety);
                v["consent"] = json!({"required": required, "ttl_ms": 60000});
            })
        };
        let p = problems(m(false));
        assert_eq!(p.len(), 1, "{side}/{safety}: {p:?}");
        assert_eq!(p[0].0, "consent.required");
        assert!(problems(m(true)).is_empty(), "{side}/{safety}");
    }
    // Medium safety with a read side effect needs no consent.
    let m = with("a.b.c", |v| {
        v["safety_class"] = json!("medium");
        v["side_effect"] = json!("read");
        v["capabilities"] = json!([{"kind": "fs", "paths": ["/in"]}]);
    });
    assert!(paths(m).is_empty());
    assert_eq!(
        paths(with("a.b.c", |v| v["consent"] = json!({"ttl_ms": 0}))),
        ["consent.ttl_ms"]
    );
}

#[test]
fn capability_and_provider_problems_carry_their_paths() {
    let m = with("a.b.c", |v| {
        v["side_effect"] = json!("network");
        v["capabilities"] = json!([
            {"kind": "tmp", "max_bytes": 5},
            {"kind": "net", "hosts": ["ok.example.com", "bad host"], "ports": [0]}
        ]);
        v["provider"] = json!({"type": "http", "endpoint": "ftp://x", "timeout_ms": 60000});
        v["limits"] = json!({"timeout_ms": 1000});
    });
    assert_eq!(
        paths(m),
        [
            "capabilities[1].hosts[1]",
            "capabilities[1].ports[0]",
            "provider.endpoint",
            "provider.timeout_ms",
        ]
    );
    let m = with("a.b.c", |v| {
        v["provider"] = json!({"type": "wasm", "module": "m.wasm", "sha256": "abc"})
    });
    assert_eq!(paths(m), ["provider.sha256"]);
}

#[test]
fn unknown_fields_are_refused_everywhere() {
    for edit in [
        json!({"limits": {"timeout": 5}}),
        json!({"consent": {"required": true, "tll_ms": 5}}),
        json!({"capabilities": [{"kind": "fs", "paths": ["/a"], "mode": "rw"}]}),
        json!({"unknown_top": 1}),
    ] {
        let mut v = base_json("a.b.c");
        for (k, val) in edit.as_object().unwrap() {
            v[k] = val.clone();
        }
        assert!(
            ToolManifest::from_json_str(&v.to_string()).is_err(),
            "{edit}"
        );
    }
}

#[test]
fn manifest_error_converts_to_manifest_invalid() {
    let err: ManifestError = compile(with("a.b.c", |v| {
        v["description"] = json!("");
        v["name"] = json!("x");
    }))
    .unwrap_err();
    let soul: SoulError = err.into();
    assert_eq!(soul.code(), ErrorCode::ManifestInvalid);
    assert!(
        soul.message().contains("name:") && soul.message().contains("description:"),
        "{}",
        soul.message()
    );
    let problems: serde_json::Value =
        serde_json::from_str(soul.field("problems").unwrap()).unwrap();
    assert_eq!(problems[0]["path"], "name");
    assert_eq!(problems[1]["path"], "description");
}

#[test]
fn digest_is_stable_and_sensitive() {
    let a = compile(base("a.b.c")).unwrap();
    let b = compile(base("a.b.c")).unwrap();
    assert_eq!(a.digest, b.digest);
    // Key order in the source does not matter.
    let reordered = manifest(json!({
        "side_effect": "none",
        "output_schema": {"required": ["forecast"], "properties": {"forecast": {"type": "string"}}, "type": "object"},
        "input_schema": {"required": ["city"], "type": "object", "properties": {
            "days": {"minimum": 1, "type": "integer"}, "city": {"minLength": 1, "type": "string"}}},
        "description": "Looks up the weather for a city.",
        "version": "1.0.0",
        "id": "a.b.c"
    }));
    assert_eq!(compile(reordered).unwrap().digest, a.digest);
    let c = compile(with("a.b.c", |v| v["description"] = json!("Other."))).unwrap();
    assert_ne!(a.digest, c.digest);
}

#[test]
fn validate_input_reports_the_pointer() {
    let tool = compile(base("a.b.c")).unwrap();
    assert!(
        tool.validate_input(&json!({"city": "Oslo", "days": 3}))
            .is_ok()
    );

    let err = tool
        .validate_input(&json!({"city": "Oslo", "days": "secret-value"}))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::SchemaValidationFailed);
    assert_eq!(err.field("pointer"), Some("/days"));
    assert_eq!(err.field("keyword"), Some("type"));
    assert!(err.message().contains("/days"), "{}", err.message());
    assert!(
        !err.message().contains("secret-value"),
        "never echoes the value: {}",
        err.message()
    );

    let err = tool.validate_input(&json!({"days": 1})).unwrap_err();
    assert_eq!(err.field("pointer"), Some(""));
    assert_eq!(err.field("keyword"), Some("required"));
}

#[test]
fn validate_output_is_an_execution_failure() {
    let tool = compile(base("a.b.c")).unwrap();
    assert!(tool.validate_output(&json!({"forecast": "sunny"})).is_ok());
    let err = tool.validate_output(&json!({"forecast": 42})).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ToolExecutionFailed);
    assert_eq!(err.field("pointer"), Some("/forecast"));
}

#[test]
fn formats_are_asserted() {
    let tool = compile(with("a.b.c", |v| {
        v["input_schema"]["properties"]["when"] = json!({"type": "string", "format": "date"});
    }))
    .unwrap();
    assert!(
        tool.validate_input(&json!({"city": "x", "when": "2026-01-31"}))
            .is_ok()
    );
    let err = tool
        .validate_input(&json!({"city": "x", "when": "yesterday"}))
        .unwrap_err();
    assert_eq!(err.field("pointer"), Some("/when"));
}

#[test]
fn draft_declared_in_schema_is_respected() {
    // Draft-07 `definitions` + `$ref` siblings work when declared.
    let tool = compile(with("a.b.c", |v| {
        v["input_schema"] = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "definitions": {"c": {"type": "string"}},
            "properties": {"city": {"$ref": "#/definitions/c"}}
        });
    }))
    .unwrap();
    assert!(tool.validate_input(&json!({"city": 5})).is_err());
}

#[test]
fn manifests_round_trip_through_json_and_yaml() {
    let m = ToolManifest::from_yaml_str(FULL_YAML).unwrap();
    let json = serde_json::to_string(&m).unwrap();
    let back = ToolManifest::from_json_str(&json).unwrap();
    assert_eq!(back, m);
    // JSON is YAML too.
    assert_eq!(ToolManifest::from_yaml_str(&json).unwrap(), m);
    assert_eq!(compile(back).unwrap().digest, compile(m).unwrap().digest);
}
