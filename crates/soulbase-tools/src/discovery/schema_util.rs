//! Small JSON Schema helpers for exports.

use serde_json::Value;

/// `at` + `/` + the escaped `segment`, as a JSON pointer.
pub(crate) fn pointer_join(at: &str, segment: &str) -> String {
    format!("{at}/{}", segment.replace('~', "~0").replace('/', "~1"))
}

/// Resolves a local reference (`#` or `#/json/pointer`) against the document root.
pub(crate) fn resolve_local_ref<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    if pointer.is_empty() {
        Some(root)
    } else {
        root.pointer(pointer)
    }
}
