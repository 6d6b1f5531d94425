//! SemVer rules for replacing a registered version with a new one.

use std::collections::BTreeSet;

use semver::Version;
use serde_json::{Map, Value};

use super::schema::{canonical_json, escape_pointer, type_set};
use super::{Problem, ToolManifest};

/// How much a version bump permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bump {
    /// Anything may change.
    Breaking,
    /// Only additive changes: optional input fields, widened input types.
    Additive,
    /// The input schema may not change at all.
    Patch,
}

fn bump(prev: &Version, next: &Version) -> Bump {
    if !prev.pre.is_empty() || next.major != prev.major {
        // A pre-release promises nothing (as in Cargo).
        Bump::Breaking
    } else if prev.major == 0 && (next.minor != prev.minor || prev.minor == 0) {
        // Cargo's convention: 0.y is the breaking position, and every 0.0.z is breaking.
        Bump::Breaking
    } else if next.minor != prev.minor || (prev.major == 0 && next.patch != prev.patch) {
        Bump::Additive
    } else {
        Bump::Patch
    }
}

/// Whether `next` may replace `prev`; every violation is returned (empty = allowed).
///
/// Rules:
/// - same `id`; `next.version` has higher SemVer precedence than `prev.version`;
/// - a MAJOR bump may change anything;
/// - a MINOR bump may only add *optional* input properties (and widen a
///   property's type); removing an input property, making one required (new or
///   existing), narrowing or changing its type, or closing `additionalProperties`
///   needs a MAJOR bump;
/// - a PATCH bump may not change the input schema at all (canonical comparison);
/// - below MAJOR, output properties may not be removed, stop being required, or
///   have their type widened/changed (callers rely on them).
///
/// `0.y.z` follows Cargo: a `y` bump counts as MAJOR and a `z` bump as MINOR; every
/// `0.0.z` bump and any bump from a pre-release counts as MAJOR.
///
/// Limits of the comparison: it is structural over `type`, `properties`,
/// `required` and `additionalProperties`, recursing into nested object
/// `properties` and into `items`. It does not resolve `$ref`, does not look inside
/// `anyOf`/`oneOf`/`allOf`/`if`, and does not compare value constraints (`enum`,
/// `pattern`, `minimum`, `maxLength`, …); a MINOR that tightens those is not caught
/// (a PATCH that changes them is, since a PATCH may not change the schema at all).
pub fn check_upgrade(prev: &ToolManifest, next: &ToolManifest) -> Vec<Problem> {
    let mut out = Vec::new();
    if prev.id != next.id {
        out.push(Problem::new(
            "id",
            format!("{} cannot replace {}: ids differ", next.id, prev.id),
        ));
        return out;
    }
    if next.version.cmp_precedence(&prev.version) != std::cmp::Ordering::Greater {
        out.push(Problem::new(
            "version",
            format!(
                "{} must be greater than the registered version {}",
                next.version, prev.version
            ),
        ));
        return out;
    }
    let level = bump(&prev.version, &next.version);
    if level == Bump::Breaking {
        return out;
    }

    let mut changes = Vec::new();
    diff_input(&prev.input_schema, &next.input_schema, "", &mut changes);
    let mut breaking = Vec::new();
    for c in changes.iter().filter(|c| c.breaking) {
        breaking.push(Problem::new(
            format!("input_schema#{}", c.pointer),
            format!("{} — needs a MAJOR version bump", c.what),
        ));
    }
    if level == Bump::Patch
        && canonical_json(&prev.input_schema) != canonical_json(&next.input_schema)
    {
        out.push(Problem::new(
            "input_schema",
            format!(
                "a PATCH release ({} → {}) may not change the input schema; \
                 bump MINOR to add optional fields, MAJOR for breaking changes",
                prev.version, next.version
            ),
        ));
    }
    out.extend(breaking);

    let mut out_changes = Vec::new();
    diff_output(
        &prev.output_schema,
        &next.output_schema,
        "",
        &mut out_changes,
    );
    for c in out_changes {
        out.push(Problem::new(
            format!("output_schema#{}", c.pointer),
            format!("{} — needs a MAJOR version bump", c.what),
        ));
    }
    out
}

/// One structural difference between two schemas.
struct Change {
    pointer: String,
    what: String,
    breaking: bool,
}

fn props(schema: &Value) -> Option<&Map<String, Value>> {
    schema.get("properties").and_then(Value::as_object)
}

fn required(schema: &Value) -> BTreeSet<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Whether type set `wide` accepts every value type set `narrow` accepts
/// (`None` = any type; `number` covers `integer`).
fn covers(wide: &Option<BTreeSet<String>>, narrow: &Option<BTreeSet<String>>) -> bool {
    match (wide, narrow) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(w), Some(n)) => n
            .iter()
            .all(|t| w.contains(t) || (t == "integer" && w.contains("number"))),
    }
}

fn show(t: &Option<BTreeSet<String>>) -> String {
    match t {
        None => "any".to_owned(),
        Some(s) => s.iter().cloned().collect::<Vec<_>>().join("|"),
    }
}

fn closes_additional(prev: &Value, next: &Value) -> bool {
    let closed = |s: &Value| s.get("additionalProperties") == Some(&Value::Bool(false));
    !closed(prev) && closed(next)
}

fn diff_input(prev: &Value, next: &Value, at: &str, out: &mut Vec<Change>) {
    let (pt, nt) = (type_set(prev), type_set(next));
    if !covers(&nt, &pt) {
        out.push(Change {
            pointer: at.to_owned(),
            what: format!("type changed from {} to {}", show(&pt), show(&nt)),
            breaking: true,
        });
    }
    let empty = Map::new();
    let (pp, np) = (props(prev), props(next));
    if pp.is_some() || np.is_some() {
        let (pp, np) = (pp.unwrap_or(&empty), np.unwrap_or(&empty));
        let (pr, nr) = (required(prev), required(next));
        for (name, ps) in pp {
            let here = format!("{at}/properties/{}", escape_pointer(name));
            match np.get(name) {
                None => out.push(Change {
                    pointer: here,
                    what: format!("input property {name:?} was removed"),
                    breaking: true,
                }),
                Some(ns) => diff_input(ps, ns, &here, out),
            }
        }
        for name in nr.difference(&pr) {
            let what = if pp.contains_key(*name) {
                format!("input property {name:?} became required")
            } else {
                format!("new input property {name:?} is required")
            };
            out.push(Change {
                pointer: format!("{at}/properties/{}", escape_pointer(name)),
                what,
                breaking: true,
            });
        }
        for name in np
            .keys()
            .filter(|k| !pp.contains_key(*k) && !nr.contains(k.as_str()))
        {
            out.push(Change {
                pointer: format!("{at}/properties/{}", escape_pointer(name)),
                what: format!("optional input property {name:?} added"),
                breaking: false,
            });
        }
    }
    if closes_additional(prev, next) {
        out.push(Change {
            pointer: format!("{at}/additionalProperties"),
            what: "additionalProperties was closed (false)".to_owned(),
            breaking: true,
        });
    }
    if let (Some(pi), Some(ni)) = (prev.get("items"), next.get("items"))
        && pi.is_object()
        && ni.is_object()
    {
        diff_input(pi, ni, &format!("{at}/items"), out);
    }
}

fn diff_output(prev: &Value, next: &Value, at: &str, out: &mut Vec<Change>) {
    let (pt, nt) = (type_set(prev), type_set(next));
    if !covers(&pt, &nt) {
        out.push(Change {
            pointer: at.to_owned(),
            what: format!("output type changed from {} to {}", show(&pt), show(&nt)),
            breaking: true,
        });
    }
    if let Some(pp) = props(prev) {
        let empty = Map::new();
        let np = props(next).unwrap_or(&empty);
        let nr = required(next);
        for (name, ps) in pp {
            let here = format!("{at}/properties/{}", escape_pointer(name));
            match np.get(name) {
                None => out.push(Change {
                    pointer: here,
                    what: format!("output property {name:?} was removed"),
                    breaking: true,
                }),
                Some(ns) => {
                    if required(prev).contains(name.as_str()) && !nr.contains(name.as_str()) {
                        out.push(Change {
                            pointer: here.clone(),
                            what: format!("output property {name:?} is no longer required"),
                            breaking: true,
                        });
                    }
                    diff_output(ps, ns, &here, out);
                }
            }
        }
    }
    if let (Some(pi), Some(ni)) = (prev.get("items"), next.get("items"))
        && pi.is_object()
        && ni.is_object()
    {
        diff_output(pi, ni, &format!("{at}/items"), out);
    }
}
