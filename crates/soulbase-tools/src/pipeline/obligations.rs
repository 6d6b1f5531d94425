//! Obligations on the output: mask, redact, watermark — addressed by JSON pointer.
//!
//! A pointer segment `*` matches every element of an array or every value of an
//! object, so `/items/*/ssn` redacts the field in every item. A pointer that matches
//! nothing is not an error: optional fields may be absent.

use serde_json::Value;

use crate::manifest::{Obligation, ObligationKind};

/// The replacement for redacted values unless the obligation gives one.
const REDACTED: &str = "[REDACTED]";
/// The watermark unless the obligation gives one.
const WATERMARK: &str = "[soulbase]";

fn unescape(seg: &str) -> String {
    seg.replace("~1", "/").replace("~0", "~")
}

fn mask(v: &mut Value) {
    *v = match v {
        Value::String(s) => {
            let n = s.chars().count();
            let keep = if n > 8 { 4 } else { 0 };
            let tail: String = s.chars().skip(n - keep).collect();
            Value::String(format!("{}{tail}", "*".repeat(n - keep)))
        }
        _ => Value::String("****".to_owned()),
    };
}

fn apply_at(v: &mut Value, segments: &[String], ob: &Obligation) {
    let Some((head, rest)) = segments.split_first() else {
        match ob.kind {
            ObligationKind::Redact => {
                *v = Value::String(ob.value.clone().unwrap_or_else(|| REDACTED.to_owned()))
            }
            ObligationKind::Mask => mask(v),
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
                    _ => {}
                }
            }
        }
        return;
    };
    match v {
        Value::Object(map) if head == "*" => map.values_mut().for_each(|c| apply_at(c, rest, ob)),
        Value::Object(map) => {
            if let Some(c) = map.get_mut(head) {
                apply_at(c, rest, ob);
            }
        }
        Value::Array(items) if head == "*" => items.iter_mut().for_each(|c| apply_at(c, rest, ob)),
        Value::Array(items) => {
            if let Some(c) = head.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                apply_at(c, rest, ob);
            }
        }
        _ => {}
    }
}

/// Applies `obligations` in order to `output`.
pub fn apply_obligations(output: &mut Value, obligations: &[Obligation]) {
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
        apply_at(output, &segments, ob);
    }
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
        }
    }

    #[test]
    fn redact_mask_and_watermark() {
        let mut out = json!({
            "user": {"ssn": "123-45-6789", "card": "4111111111111111", "pin": 1234},
            "items": [{"secret": "a"}, {"secret": "b"}],
            "note": "hello"
        });
        apply_obligations(
            &mut out,
            &[
                ob(ObligationKind::Redact, "/user/ssn"),
                ob(ObligationKind::Mask, "/user/card"),
                ob(ObligationKind::Mask, "/user/pin"),
                ob(ObligationKind::Redact, "/items/*/secret"),
                ob(ObligationKind::Watermark, "/note"),
                ob(ObligationKind::Redact, "/absent/field"),
            ],
        );
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
    fn pointer_escapes_and_indexes() {
        let mut out = json!({"a/b": ["x", "y"]});
        apply_obligations(&mut out, &[ob(ObligationKind::Redact, "/a~1b/1")]);
        assert_eq!(out, json!({"a/b": ["x", "[REDACTED]"]}));
    }
}
