//! Content digests: how evidence refers to arguments and outputs without storing them.

use sha2::{Digest, Sha256};

/// `sha256:<hex>` of raw bytes.
pub fn digest_bytes(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// `sha256:<hex>` of a JSON value's canonical encoding (object keys sorted, no whitespace).
///
/// Equal values digest equally whatever their original key order, so a replay or an
/// idempotent retry can be matched by digest.
pub fn digest_json(value: &serde_json::Value) -> String {
    // serde_json's Map is a BTreeMap (the preserve_order feature is off), so
    // serialization is already key-sorted and compact.
    digest_bytes(&serde_json::to_vec(value).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
