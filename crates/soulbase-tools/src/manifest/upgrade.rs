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
/// - below MAJOR the contract holds: what the tool may do and what callers must
///   bring (`side_effect`, `safety_class`, `capabilities`, `scopes`, `consent.required`,
///   `idempotency`) is unchanged, so an upgrade can never widen a live tool's
///   permissions without a MAJOR (which operators review); nor do the name MCP
///   callers call it by (`mcp_name`) and the shape of its output
///   (`output_content`) change;
/// - a MINOR bump may only *widen* the input schema: add optional properties, widen
///   a type, drop a `required` name, open `additionalProperties`, widen an `enum`,
///   relax a bound (`minimum`, `maxLength`, …) or remove a constraint. The
///   comparison is default-deny: any other difference in a keyword that constrains
///   values (`pattern`, `format`, `$ref`, `$defs`, `anyOf`, `allOf`, `if`, …) counts
///   as breaking;
/// - a PATCH bump may not change the input schema at all (canonical comparison);
/// - below MAJOR the output may only narrow: properties are not removed and stay
///   required, types do not widen, an `enum` does not grow, bounds do not relax, and
///   any other constraint keyword stays as it was.
///
/// `0.y.z` follows Cargo: a `y` bump counts as MAJOR and a `z` bump as MINOR; every
/// `0.0.z` bump and any bump from a pre-release counts as MAJOR.
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
    check_contract(prev, next, &mut out);

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

/// The parts of a manifest that say what the tool may do and what callers must
/// bring: any change needs a MAJOR version.
fn check_contract(prev: &ToolManifest, next: &ToolManifest, out: &mut Vec<Problem>) {
    let fields: [(&str, bool); 8] = [
        ("side_effect", prev.side_effect == next.side_effect),
        ("safety_class", prev.safety_class == next.safety_class),
        (
            "capabilities",
            same_json(&prev.capabilities, &next.capabilities),
        ),
        ("scopes", same_json(&prev.scopes, &next.scopes)),
        (
            "consent.required",
            prev.consent.required == next.consent.required,
        ),
        ("idempotency", prev.idempotency == next.idempotency),
        // What MCP callers call it by, and the shape of what it answers.
        ("mcp_name", prev.mcp_name == next.mcp_name),
        ("output_content", prev.output_content == next.output_content),
    ];
    for (field, unchanged) in fields {
        if !unchanged {
            out.push(Problem::new(
                field,
                format!(
                    "changed below a MAJOR version ({} → {}): what a tool may do and what \
                     callers must bring change only with a MAJOR bump",
                    prev.version, next.version
                ),
            ));
        }
    }
}

/// Whether two serializable values have the same canonical JSON.
fn same_json<T: serde::Serialize>(a: &T, b: &T) -> bool {
    match (serde_json::to_value(a), serde_json::to_value(b)) {
        (Ok(a), Ok(b)) => canonical_json(&a) == canonical_json(&b),
        _ => false,
    }
}

/// Keywords that describe and never constrain: changes are always allowed.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "examples",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$comment",
    "$schema",
    "$id",
    "$anchor",
];

/// Keywords compared structurally by `diff_input`/`diff_output` themselves.
const STRUCTURAL: &[&str] = &["type", "properties", "required", "items"];

/// Lower bounds: relaxing means lowering (or removing) them.
const LOWER_BOUNDS: &[&str] = &[
    "minimum",
    "exclusiveMinimum",
    "minLength",
    "minItems",
    "minProperties",
    "minContains",
];

/// Upper bounds: relaxing means raising (or removing) them.
const UPPER_BOUNDS: &[&str] = &[
    "maximum",
    "exclusiveMaximum",
    "maxLength",
    "maxItems",
    "maxProperties",
    "maxContains",
];

/// Keywords whose presence admits more values (removing them narrows).
const WIDENING_WHEN_PRESENT: &[&str] = &[
    "additionalProperties",
    "patternProperties",
    "unevaluatedProperties",
    "unevaluatedItems",
];

/// How a keyword's value moved from `prev` to `next`, for values accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Same,
    Wider,
    Narrower,
    /// Different in a way not known to be either (default-deny treats it as both).
    Changed,
}

fn direction(keyword: &str, prev: Option<&Value>, next: Option<&Value>) -> Direction {
    use Direction::*;
    if prev == next {
        return Same;
    }
    if let (Some(p), Some(n)) = (prev, next)
        && canonical_json(p) == canonical_json(n)
    {
        return Same;
    }
    let num = |v: Option<&Value>| v.and_then(Value::as_f64);
    if LOWER_BOUNDS.contains(&keyword) {
        return match (num(prev), num(next)) {
            (_, None) => Wider,
            (None, Some(_)) => Narrower,
            (Some(p), Some(n)) if n < p => Wider,
            _ => Narrower,
        };
    }
    if UPPER_BOUNDS.contains(&keyword) {
        return match (num(prev), num(next)) {
            (_, None) => Wider,
            (None, Some(_)) => Narrower,
            (Some(p), Some(n)) if n > p => Wider,
            _ => Narrower,
        };
    }
    if keyword == "enum" {
        let set = |v: Option<&Value>| -> Option<BTreeSet<String>> {
            v.and_then(Value::as_array)
                .map(|a| a.iter().map(canonical_json).collect())
        };
        return match (set(prev), set(next)) {
            (_, None) => Wider,
            (None, Some(_)) => Narrower,
            (Some(p), Some(n)) if n.is_superset(&p) => Wider,
            (Some(p), Some(n)) if n.is_subset(&p) => Narrower,
            _ => Changed,
        };
    }
    if keyword == "additionalProperties" {
        let open = |v: Option<&Value>| v.is_none() || v == Some(&Value::Bool(true));
        return match (open(prev), open(next)) {
            (false, true) | (true, true) => Wider,
            (true, false) => Narrower,
            _ => Changed,
        };
    }
    if WIDENING_WHEN_PRESENT.contains(&keyword) {
        return Changed;
    }
    // Any other constraint: removing it widens, adding or changing it is unknown.
    match next {
        None => Wider,
        Some(_) => Changed,
    }
}

/// Every keyword of `prev` or `next` outside the structural and annotation sets,
/// with how it moved.
fn keyword_moves(prev: &Value, next: &Value) -> Vec<(String, Direction)> {
    let empty = Map::new();
    let pm = prev.as_object().unwrap_or(&empty);
    let nm = next.as_object().unwrap_or(&empty);
    let keys: BTreeSet<&str> = pm.keys().chain(nm.keys()).map(String::as_str).collect();
    keys.into_iter()
        .filter(|k| !ANNOTATIONS.contains(k) && !STRUCTURAL.contains(k))
        .map(|k| (k.to_owned(), direction(k, pm.get(k), nm.get(k))))
        .filter(|(_, d)| *d != Direction::Same)
        .collect()
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

/// Boolean schemas: `true` accepts everything, `false` nothing. `Some(widened)` when
/// either side is one (and the comparison is done), `None` otherwise.
fn boolean_schemas(prev: &Value, next: &Value) -> Option<bool> {
    match (prev, next) {
        (Value::Bool(p), Value::Bool(n)) => Some(n >= p),
        (_, Value::Bool(n)) => Some(*n),
        (Value::Bool(p), _) => Some(!*p),
        _ => None,
    }
}

fn diff_input(prev: &Value, next: &Value, at: &str, out: &mut Vec<Change>) {
    if let Some(widened) = boolean_schemas(prev, next) {
        if !widened {
            out.push(Change {
                pointer: at.to_owned(),
                what: "the input schema was narrowed to a boolean schema".to_owned(),
                breaking: true,
            });
        }
        return;
    }
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
    for (keyword, moved) in keyword_moves(prev, next) {
        if matches!(moved, Direction::Narrower | Direction::Changed) {
            out.push(Change {
                pointer: format!("{at}/{}", escape_pointer(&keyword)),
                what: format!("input keyword `{keyword}` was added or tightened"),
                breaking: true,
            });
        }
    }
    match (prev.get("items"), next.get("items")) {
        (Some(pi), Some(ni)) if pi.is_object() && ni.is_object() => {
            diff_input(pi, ni, &format!("{at}/items"), out);
        }
        (_, None) => {}
        (pi, Some(ni)) if pi.is_none_or(|p| canonical_json(p) != canonical_json(ni)) => {
            out.push(Change {
                pointer: format!("{at}/items"),
                what: "input `items` was added or changed".to_owned(),
                breaking: true,
            });
        }
        _ => {}
    }
}

fn diff_output(prev: &Value, next: &Value, at: &str, out: &mut Vec<Change>) {
    if let Some(widened) = boolean_schemas(prev, next) {
        if widened && prev != next {
            out.push(Change {
                pointer: at.to_owned(),
                what: "the output schema was widened to a boolean schema".to_owned(),
                breaking: true,
            });
        }
        return;
    }
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
        let (pr, nr) = (required(prev), required(next));
        for (name, ps) in pp {
            let here = format!("{at}/properties/{}", escape_pointer(name));
            match np.get(name) {
                None => out.push(Change {
                    pointer: here,
                    what: format!("output property {name:?} was removed"),
                    breaking: true,
                }),
                Some(ns) => {
                    if pr.contains(name.as_str()) && !nr.contains(name.as_str()) {
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
    for (keyword, moved) in keyword_moves(prev, next) {
        if matches!(moved, Direction::Wider | Direction::Changed) {
            out.push(Change {
                pointer: format!("{at}/{}", escape_pointer(&keyword)),
                what: format!("output keyword `{keyword}` was removed, relaxed or changed"),
                breaking: true,
            });
        }
    }
    match (prev.get("items"), next.get("items")) {
        (Some(pi), Some(ni)) if pi.is_object() && ni.is_object() => {
            diff_output(pi, ni, &format!("{at}/items"), out);
        }
        (None, _) => {}
        (Some(pi), ni) if ni.is_none_or(|n| canonical_json(pi) != canonical_json(n)) => {
            out.push(Change {
                pointer: format!("{at}/items"),
                what: "output `items` was removed or changed".to_owned(),
                breaking: true,
            });
        }
        _ => {}
    }
}
