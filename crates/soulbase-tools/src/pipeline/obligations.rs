//! Obligations on the output: mask, redact, watermark — addressed by JSON pointer,
//! from the manifest and from the policy that allowed the call.
//!
//! A pointer segment `*` matches every element of an array or every value of an
//! object, so `/items/*/ssn` redacts the field in every item. A pointer that matches
//! nothing is not an error (optional fields may be absent) unless the obligation
//! is `required`. An obligation fails when it reaches a value it cannot transform
//! (a watermark on a number, a boolean, null or an array) or, `required`, reaches
//! none; then its `on_failure` decides: `refuse` withholds the output
//! (`POLICY.DENY_TOOL`, field `obligation`), `degrade` withholds the values it
//! reached (`null`) and answers the rest with a warning.

use serde_json::Value;
use soulbase_errors::{ErrorCode, SoulError};

use crate::manifest::{Obligation, ObligationFailure, ObligationKind};

/// The replacement for redacted values unless the obligation gives one.
const REDACTED: &str = "[REDACTED]";
/// The watermark unless the obligation gives one.
const WATERMARK: &str = "[soulbase]";

fn unescape(seg: &str) -> String {
    seg.replace("~1", "/").replace("~0", "~")
}

/// Masks a string with `with` (its first character; `*` by default), keeping the
/// last four characters of one longer than eight; any other value becomes four
/// mask characters.
fn mask(v: &mut Value, with: Option<&str>) {
    let c = with.and_then(|w| w.chars().next()).unwrap_or('*');
    *v = match v {
        Value::String(s) => {
            let n = s.chars().count();
            let keep = if n > 8 { 4 } else { 0 };
            let tail: String = s.chars().skip(n - keep).collect();
            Value::String(format!("{}{tail}", c.to_string().repeat(n - keep)))
        }
        _ => Value::String(c.to_string().repeat(4)),
    };
}

/// What one obligation did: values reached, and values it could not transform.
#[derive(Default)]
struct Applied {
    reached: usize,
    failed: usize,
}

/// Transforms the value at the end of `segments`; on a value it cannot
/// transform, withholds it (`null`) when `degrade`.
fn apply_at(
    v: &mut Value,
    segments: &[String],
    ob: &Obligation,
    degrade: bool,
    done: &mut Applied,
) {
    let Some((head, rest)) = segments.split_first() else {
        done.reached += 1;
        match ob.kind {
            ObligationKind::Redact => {
                *v = Value::String(ob.value.clone().unwrap_or_else(|| REDACTED.to_owned()))
            }
            ObligationKind::Mask => mask(v, ob.value.as_deref()),
            ObligationKind::Watermark => {
                let mark = ob.value.clone().unwrap_or_else(|| WATERMARK.to_owned());
                match v {
                    Value::String(s) => {
                        s.push(' ');
                        s.push_str(&mark);
                    }
                    Value::Object(map) => {
                        map.insert("_watermark".to_owned(), Value::String(mark));
                    }
                    _ => {
                        done.failed += 1;
                        if degrade {
                            *v = Value::Null;
                        }
                    }
                }
            }
        }
        return;
    };
    match v {
        Value::Object(map) if head == "*" => map
            .values_mut()
            .for_each(|c| apply_at(c, rest, ob, degrade, done)),
        Value::Object(map) => {
            if let Some(c) = map.get_mut(head) {
                apply_at(c, rest, ob, degrade, done);
            }
        }
        Value::Array(items) if head == "*" => items
            .iter_mut()
            .for_each(|c| apply_at(c, rest, ob, degrade, done)),
        Value::Array(items) => {
            if let Some(c) = head.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                apply_at(c, rest, ob, degrade, done);
            }
        }
        _ => {}
    }
}

fn describe(ob: &Obligation) -> String {
    let kind = match ob.kind {
        ObligationKind::Mask => "mask",
        ObligationKind::Redact => "redact",
        ObligationKind::Watermark => "watermark",
    };
    let at = if ob.pointer.is_empty() {
        "/"
    } else {
        ob.pointer.as_str()
    };
    format!("{kind} {at}")
}

/// Applies `obligations` in order to `output`. `Ok` with the warnings of the
/// obligations that degraded it; `Err` (`POLICY.DENY_TOOL`, field `obligation`)
/// when one that refuses failed — the output must then be withheld.
pub fn apply_obligations(
    output: &mut Value,
    obligations: &[Obligation],
) -> Result<Vec<String>, SoulError> {
    let mut warnings = Vec::new();
    for ob in obligations {
        let segments: Vec<String> = if ob.pointer.is_empty() {
            Vec::new()
        } else {
            ob.pointer
                .trim_start_matches('/')
                .split('/')
                .map(unescape)
                .collect()
        };
        let degrade = ob.on_failure == ObligationFailure::Degrade;
        let mut done = Applied::default();
        apply_at(output, &segments, ob, degrade, &mut done);
        let missing = ob.required && done.reached == 0;
        if done.failed == 0 && !missing {
            continue;
        }
        let why = if missing {
            "its pointer reached no value"
        } else {
            "it cannot apply to a value it reached"
        };
        if degrade {
            warnings.push(format!(
                "obligation {} could not be applied ({why}): the values it covers are withheld",
                describe(ob)
            ));
        } else {
            return Err(SoulError::new(
                ErrorCode::PolicyDenyTool,
                "an obligation on the output could not be applied; the output is withheld",
            )
            .with_field("obligation", describe(ob))
            .with_note(why));
        }
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ob(kind: ObligationKind, pointer: &str) -> Obligation {
        Obligation {
            kind,
            pointer: pointer.into(),
            value: None,
            required: false,
            on_failure: ObligationFailure::Refuse,
        }
    }

    #[test]
    fn redact_mask_and_watermark() {
        let mut out = json!({
            "user": {"ssn": "123-45-6789", "card": "4111111111111111", "pin": 1234},
            "items": [{"secret": "a"}, {"secret": "b"}],
            "note": "hello"
        });
        let warnings = apply_obligations(
            &mut out,
            &[
                ob(ObligationKind::Redact, "/user/ssn"),
                ob(ObligationKind::Mask, "/user/card"),
                ob(ObligationKind::Mask, "/user/pin"),
                ob(ObligationKind::Redact, "/items/*/secret"),
                ob(ObligationKind::Watermark, "/note"),
                ob(ObligationKind::Redact, "/absent/field"),
            ],
        )
        .unwrap();
        assert!(warnings.is_empty());
        assert_eq!(out["user"]["ssn"], "[REDACTED]");
        assert_eq!(out["user"]["card"], "************1111");
        assert_eq!(out["user"]["pin"], "****");
        assert_eq!(
            out["items"],
            json!([{"secret": "[REDACTED]"}, {"secret": "[REDACTED]"}])
        );
        assert_eq!(out["note"], "hello [soulbase]");
        assert!(out.get("absent").is_none());
    }

    #[test]
    fn a_mask_uses_its_value_as_the_mask_character() {
        let mut out = json!({"card": "4111111111111111", "pin": 12});
        let with = |pointer: &str| Obligation {
            value: Some("#".into()),
            ..ob(ObligationKind::Mask, pointer)
        };
        apply_obligations(&mut out, &[with("/card"), with("/pin")]).unwrap();
        assert_eq!(out, json!({"card": "############1111", "pin": "####"}));
    }

    #[test]
    fn pointer_escapes_and_indexes() {
        let mut out = json!({"a/b": ["x", "y"]});
        apply_obligations(&mut out, &[ob(ObligationKind::Redact, "/a~1b/1")]).unwrap();
        assert_eq!(out, json!({"a/b": ["x", "[REDACTED]"]}));
    }

    #[test]
    fn a_failing_obligation_refuses_or_degrades_as_it_says() {
        // A watermark cannot mark a number: refused by default, naming it.
        let mut out = json!({"n": 7, "s": "x"});
        let err = apply_obligations(&mut out, &[ob(ObligationKind::Watermark, "/n")]).unwrap_err();
        assert_eq!(err.code(), ErrorCode::PolicyDenyTool);
        assert_eq!(err.field("obligation"), Some("watermark /n"));
        // Degraded: the number is withheld, the rest answered, with a warning.
        let mut out = json!({"n": 7, "s": "x"});
        let degrade = Obligation {
            on_failure: ObligationFailure::Degrade,
            ..ob(ObligationKind::Watermark, "/n")
        };
        let warnings = apply_obligations(&mut out, &[degrade]).unwrap();
        assert_eq!(out, json!({"n": null, "s": "x"}));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        // Required: a pointer reaching nothing fails; optional, it is fine.
        let required = Obligation {
            required: true,
            ..ob(ObligationKind::Redact, "/ssn")
        };
        let err = apply_obligations(&mut json!({"name": "a"}), std::slice::from_ref(&required))
            .unwrap_err();
        assert_eq!(err.field("obligation"), Some("redact /ssn"));
        assert!(apply_obligations(&mut json!({"ssn": "1"}), &[required]).is_ok());
    }
}
