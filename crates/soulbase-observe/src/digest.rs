//! Content digests: how evidence refers to arguments and outputs without storing them.

use sha2::{Digest, Sha256};

use crate::json;

/// `sha256:<hex>` of raw bytes.
///
/// The hex digits are written into a buffer of their own (`hex::encode` collects
/// them a `char` at a time, which cost more than the rest of a call's two digests
/// outside SHA-256 itself).
pub fn digest_bytes(bytes: &[u8]) -> String {
    const PREFIX: &str = "sha256:";
    let mut hex = [0u8; 64];
    // 32 bytes of digest fill exactly 64 digits: the call cannot fail.
    let _ = hex::encode_to_slice(Sha256::digest(bytes), &mut hex);
    let mut out = String::with_capacity(PREFIX.len() + hex.len());
    out.push_str(PREFIX);
    out.push_str(std::str::from_utf8(&hex).unwrap_or_default());
    out
}

/// `sha256:<hex>` of a JSON value's canonical encoding (see [`canonical_json`]).
///
/// Equal values digest equally whatever their original key order, so a replay or an
/// idempotent retry can be matched by digest.
pub fn digest_json(value: &serde_json::Value) -> String {
    digest_bytes(&canonical_json(value))
}

/// The canonical encoding of a JSON value: object keys sorted (by bytes) at every
/// level, no insignificant whitespace, strings escaped as serde_json escapes them
/// (by the evidence encoder's string writer, `json::write_str`, which writes the
/// same bytes 16 at a time).
///
/// It does not depend on serde_json's `preserve_order` feature (which any crate in a
/// build may switch on), so digests and stored records never change with it. Every
/// digest of JSON in Soulbase goes through here.
pub fn canonical_json(value: &serde_json::Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, child)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                json::write_str(out, key);
                out.push(b':');
                write_canonical(child, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::String(s) => json::write_str(out, s),
        // Scalars have one encoding; writing into a Vec cannot fail.
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_the_lowercase_hex_of_sha256() {
        // FIPS 180-2's example: stored digests stay comparable across builds.
        assert_eq!(
            digest_bytes(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn key_order_does_not_matter() {
        let a: serde_json::Value = serde_json::from_str(r#"{"b":1,"a":[1,2]}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{ "a": [1, 2], "b": 1 }"#).unwrap();
        assert_eq!(digest_json(&a), digest_json(&b));
        assert_ne!(
            digest_json(&a),
            digest_json(&serde_json::json!({"a": [2, 1], "b": 1}))
        );
        assert!(digest_json(&a).starts_with("sha256:"));
        assert_eq!(digest_json(&a).len(), 7 + 64);
    }

    /// Stored digests stay comparable with those of earlier builds: keys and strings
    /// are escaped byte for byte as `serde_json` escapes them.
    #[test]
    fn canonical_strings_are_serde_json_strings() {
        let specials = (0u8..0x20)
            .map(char::from)
            .chain(['"', '\\', '/', '\u{7f}', 'é', '😀']);
        for c in specials {
            for s in [
                c.to_string(),
                format!("{}{c}{}", "k".repeat(17), "v".repeat(3)),
            ] {
                let quoted = serde_json::to_string(&s).unwrap();
                let v = serde_json::json!({ s.clone(): s });
                assert_eq!(
                    String::from_utf8(canonical_json(&v)).unwrap(),
                    format!("{{{quoted}:{quoted}}}")
                );
            }
        }
    }

    #[test]
    fn canonical_form_sorts_nested_keys_and_escapes_strings() {
        let v = serde_json::json!({"b": 1, "a": {"d": [true, null, "x\"y"], "c": 1.5}});
        assert_eq!(
            String::from_utf8(canonical_json(&v)).unwrap(),
            r#"{"a":{"c":1.5,"d":[true,null,"x\"y"]},"b":1}"#
        );
    }
}
