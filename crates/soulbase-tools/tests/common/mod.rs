//! Shared test helpers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use soulbase_tools::ToolManifest;

/// A minimal valid manifest as JSON, to be tweaked by tests.
pub fn base_json(id: &str) -> Value {
    json!({
        "id": id,
        "version": "1.0.0",
        "description": "Looks up the weather for a city.",
        "input_schema": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1},
                "days": {"type": "integer", "minimum": 1}
            },
            "required": ["city"]
        },
        "output_schema": {
            "type": "object",
            "properties": {"forecast": {"type": "string"}},
            "required": ["forecast"]
        },
        "side_effect": "none"
    })
}

/// A manifest from JSON (panics on a parse error: tests only).
pub fn manifest(v: Value) -> ToolManifest {
    ToolManifest::from_json_str(&v.to_string()).unwrap()
}

/// A valid manifest with id `id`.
pub fn base(id: &str) -> ToolManifest {
    manifest(base_json(id))
}

/// Applies `edit` to the base JSON of `id` and parses it.
pub fn with(id: &str, edit: impl FnOnce(&mut Value)) -> ToolManifest {
    let mut v = base_json(id);
    edit(&mut v);
    manifest(v)
}
