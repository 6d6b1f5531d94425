//! R1 SemVer rules: what a new version may change.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::with;
use serde_json::json;
use soulbase_tools::{ToolManifest, check_upgrade};

fn v(version: &str, edit: impl FnOnce(&mut serde_json::Value)) -> ToolManifest {
    with("w.f.get", |m| {
        m["version"] = json!(version);
        edit(m);
    })
}

fn same(version: &str) -> ToolManifest {
    v(version, |_| {})
}

fn paths(prev: &ToolManifest, next: &ToolManifest) -> Vec<String> {
    check_upgrade(prev, next)
        .into_iter()
        .map(|p| p.path)
        .collect()
}

#[test]
fn version_must_increase() {
    let prev = same("1.2.0");
    assert_eq!(paths(&prev, &same("1.2.0")), ["version"]);
    assert_eq!(paths(&prev, &same("1.1.9")), ["version"]);
    assert!(paths(&prev, &same("1.2.1")).is_empty());
    // Build metadata does not count as an increase.
    assert_eq!(paths(&prev, &same("1.2.0+build.7")), ["version"]);
}

#[test]
fn ids_must_match() {
    let other = with("w.f.other", |m| m["version"] = json!("2.0.0"));
    assert_eq!(paths(&same("1.0.0"), &other), ["id"]);
}

#[test]
fn minor_may_add_an_optional_field() {
    let next = v("1.1.0", |m| {
        m["input_schema"]["properties"]["units"] = json!({"type": "string"});
    });
    assert!(check_upgrade(&same("1.0.0"), &next).is_empty());
}

#[test]
fn minor_may_not_add_a_required_field() {
    let next = v("1.1.0", |m| {
        m["input_schema"]["properties"]["units"] = json!({"type": "string"});
        m["input_schema"]["required"] = json!(["city", "units"]);
    });
    let p = check_upgrade(&same("1.0.0"), &next);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].path, "input_schema#/properties/units");
    assert!(
        p[0].message.contains("required") && p[0].message.contains("MAJOR"),
        "{}",
        p[0].message
    );
}

#[test]
fn minor_may_not_make_an_existing_field_required() {
    let next = v("1.1.0", |m| {
        m["input_schema"]["required"] = json!(["city", "days"])
    });
    assert_eq!(
        paths(&same("1.0.0"), &next),
        ["input_schema#/properties/days"]
    );
}

#[test]
fn minor_may_not_remove_a_field() {
    let next = v("1.1.0", |m| {
        m["input_schema"]["properties"]
            .as_object_mut()
            .unwrap()
            .remove("days");
    });
    let p = check_upgrade(&same("1.0.0"), &next);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].path, "input_schema#/properties/days");
    assert!(p[0].message.contains("removed"));
}

#[test]
fn minor_may_not_change_a_type_but_may_widen_it() {
    let narrowed = v("1.1.0", |m| {
        m["input_schema"]["properties"]["days"] = json!({"type": "string"})
    });
    assert_eq!(
        paths(&same("1.0.0"), &narrowed),
        ["input_schema#/properties/days"]
    );
    let widened = v("1.1.0", |m| {
        m["input_schema"]["properties"]["days"] = json!({"type": ["number", "null"]});
    });
    assert!(
        paths(&same("1.0.0"), &widened).is_empty(),
        "integer → number|null accepts more"
    );
}

#[test]
fn minor_may_not_close_additional_properties() {
    let next = v("1.1.0", |m| {
        m["input_schema"]["additionalProperties"] = json!(false)
    });
    assert_eq!(
        paths(&same("1.0.0"), &next),
        ["input_schema#/additionalProperties"]
    );
}

#[test]
fn nested_objects_are_compared() {
    let with_nested = |version: &str, required: serde_json::Value| {
        v(version, |m| {
            m["input_schema"]["properties"]["where"] = json!({
                "type": "object",
                "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                "required": required
            });
        })
    };
    let prev = with_nested("1.0.0", json!(["lat"]));
    let next = with_nested("1.1.0", json!(["lat", "lon"]));
    assert_eq!(
        paths(&prev, &next),
        ["input_schema#/properties/where/properties/lon"]
    );
}

#[test]
fn patch_may_not_change_the_input_schema_at_all() {
    let next = v("1.0.1", |m| {
        m["input_schema"]["properties"]["units"] = json!({"type": "string"});
    });
    let p = check_upgrade(&same("1.0.0"), &next);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].path, "input_schema");
    assert!(p[0].message.contains("PATCH"));
    // A description change is fine in a PATCH.
    let doc = v("1.0.1", |m| m["description"] = json!("Better words."));
    assert!(check_upgrade(&same("1.0.0"), &doc).is_empty());
}

#[test]
fn major_may_break_anything() {
    let next = v("2.0.0", |m| {
        m["input_schema"] =
            json!({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]});
        m["output_schema"] = json!({"type": "string"});
    });
    assert!(check_upgrade(&same("1.4.2"), &next).is_empty());
}

#[test]
fn output_fields_may_not_disappear_below_major() {
    let next = v("1.1.0", |m| {
        m["output_schema"] = json!({"type": "object", "properties": {"temp": {"type": "number"}}});
    });
    assert_eq!(
        paths(&same("1.0.0"), &next),
        ["output_schema#/properties/forecast"]
    );
    let loosened = v("1.1.0", |m| m["output_schema"]["required"] = json!([]));
    assert_eq!(
        paths(&same("1.0.0"), &loosened),
        ["output_schema#/properties/forecast"]
    );
    let added = v("1.1.0", |m| {
        m["output_schema"]["properties"]["temp"] = json!({"type": "number"})
    });
    assert!(paths(&same("1.0.0"), &added).is_empty());
}

#[test]
fn zero_versions_follow_cargo() {
    let breaking = |version: &str| {
        v(version, |m| {
            m["input_schema"]["required"] = json!(["city", "days"])
        })
    };
    assert!(
        paths(&same("0.3.1"), &breaking("0.4.0")).is_empty(),
        "0.y bump is breaking-allowed"
    );
    assert_eq!(
        paths(&same("0.3.1"), &breaking("0.3.2")).len(),
        1,
        "0.y.z bump is additive only"
    );
    assert!(
        paths(&same("0.0.1"), &breaking("0.0.2")).is_empty(),
        "0.0.z is always breaking"
    );
    assert!(
        paths(&same("1.0.0-alpha.1"), &breaking("1.0.0")).is_empty(),
        "pre-releases promise nothing"
    );
}

/// Applies `edit` to the input schema of a 1.1.0 and returns the paths of problems
/// against 1.0.0.
fn minor_input(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<String> {
    let next = v("1.1.0", |m| edit(&mut m["input_schema"]));
    paths(&same("1.0.0"), &next)
}

#[test]
fn minor_input_changes_are_default_deny() {
    type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;
    let breaking: Vec<(&str, Edit, &str)> = vec![
        (
            "an enum is added",
            Box::new(|s| s["properties"]["city"]["enum"] = json!(["Paris"])),
            "input_schema#/properties/city/enum",
        ),
        (
            "a const is added",
            Box::new(|s| s["properties"]["days"]["const"] = json!(3)),
            "input_schema#/properties/days/const",
        ),
        (
            "a pattern is added",
            Box::new(|s| s["properties"]["city"]["pattern"] = json!("^[A-Z]")),
            "input_schema#/properties/city/pattern",
        ),
        (
            "a bound is tightened",
            Box::new(|s| s["properties"]["city"]["minLength"] = json!(3)),
            "input_schema#/properties/city/minLength",
        ),
        (
            "a bound is added",
            Box::new(|s| s["properties"]["days"]["maximum"] = json!(7)),
            "input_schema#/properties/days/maximum",
        ),
        (
            "additionalProperties becomes a schema",
            Box::new(|s| s["additionalProperties"] = json!({"type": "string"})),
            "input_schema#/additionalProperties",
        ),
        (
            "a type moves behind a $ref",
            Box::new(|s| {
                s["properties"]["city"] = json!({"$ref": "#/$defs/c"});
                s["$defs"] = json!({"c": {"type": "integer"}});
            }),
            "input_schema#/$defs",
        ),
        (
            "a property schema becomes false",
            Box::new(|s| s["properties"]["days"] = json!(false)),
            "input_schema#/properties/days",
        ),
    ];
    for (what, edit, path) in breaking {
        let p = minor_input(edit);
        assert!(p.iter().any(|x| x == path), "{what}: {p:?}");
    }
}

#[test]
fn minor_input_widenings_are_allowed() {
    assert!(
        minor_input(|s| s["properties"]["city"]
            .as_object_mut()
            .unwrap()
            .remove("minLength")
            .map(|_| ())
            .unwrap())
        .is_empty()
    );
    assert!(minor_input(|s| s["properties"]["days"]["minimum"] = json!(0)).is_empty());
    assert!(minor_input(|s| s["required"] = json!([])).is_empty());
    assert!(minor_input(|s| s["additionalProperties"] = json!(true)).is_empty());
    assert!(minor_input(|s| s["description"] = json!("now documented")).is_empty());
    // An enum may grow in a MINOR, not shrink.
    let with_enum = v("1.0.0", |m| {
        m["input_schema"]["properties"]["city"]["enum"] = json!(["Paris", "Oslo"])
    });
    let grown = v("1.1.0", |m| {
        m["input_schema"]["properties"]["city"]["enum"] = json!(["Paris", "Oslo", "Rome"])
    });
    let shrunk = v("1.1.0", |m| {
        m["input_schema"]["properties"]["city"]["enum"] = json!(["Paris"])
    });
    assert!(paths(&with_enum, &grown).is_empty());
    assert_eq!(
        paths(&with_enum, &shrunk),
        ["input_schema#/properties/city/enum"]
    );
}

#[test]
fn minor_output_may_narrow_but_not_widen() {
    let prev = v("1.0.0", |m| {
        m["output_schema"]["properties"]["forecast"]["enum"] = json!(["sun", "rain"])
    });
    let narrower = v("1.1.0", |m| {
        m["output_schema"]["properties"]["forecast"]["enum"] = json!(["sun"])
    });
    let wider = v("1.1.0", |m| {
        m["output_schema"]["properties"]["forecast"]["enum"] = json!(["sun", "rain", "snow"])
    });
    assert!(paths(&prev, &narrower).is_empty());
    assert_eq!(
        paths(&prev, &wider),
        ["output_schema#/properties/forecast/enum"]
    );
}

#[test]
fn permissions_and_caller_obligations_change_only_with_a_major() {
    let escalated = v("1.1.0", |m| {
        m["side_effect"] = json!("network");
        m["capabilities"] = json!([{"kind": "net", "hosts": ["api.example.com"]}]);
    });
    assert_eq!(
        paths(&same("1.0.0"), &escalated),
        ["side_effect", "capabilities"]
    );
    let consent = v("1.0.1", |m| {
        m["consent"] = json!({"required": true});
    });
    assert_eq!(paths(&same("1.0.0"), &consent), ["consent.required"]);
    let major = v("2.0.0", |m| {
        m["side_effect"] = json!("network");
        m["capabilities"] = json!([{"kind": "net", "hosts": ["api.example.com"]}]);
    });
    assert!(paths(&same("1.0.0"), &major).is_empty());
}

#[test]
fn the_mcp_name_and_the_output_shape_change_only_with_a_major() {
    let renamed = v("1.1.0", |m| m["mcp_name"] = json!("get_it"));
    assert_eq!(paths(&same("1.0.0"), &renamed), ["mcp_name"]);
    let content = v("1.1.0", |m| m["output_content"] = json!(true));
    assert_eq!(paths(&same("1.0.0"), &content), ["output_content"]);
    let major = v("2.0.0", |m| {
        m["mcp_name"] = json!("get_it");
        m["output_content"] = json!(true);
    });
    assert!(paths(&same("1.0.0"), &major).is_empty());
}
