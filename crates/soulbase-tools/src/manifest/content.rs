//! Content beyond JSON: the output convention of a tool whose manifest sets
//! `output_content` (see [`ToolManifest::output_content`](super::ToolManifest)).
//!
//! Such a tool answers an object. Its reserved key [`CONTENT_KEY`] (optional)
//! holds an array of content blocks shaped as MCP's, checked against
//! [`CONTENT_SCHEMA`]; every other key is the structured part, checked against the
//! manifest's `output_schema`:
//!
//! ```json
//! {"content": [
//!    {"type": "text", "text": "Here is the chart"},
//!    {"type": "image", "data": "iVBORw0…", "mimeType": "image/png"},
//!    {"type": "audio", "data": "UklGR…", "mimeType": "audio/wav"},
//!    {"type": "resource", "resource": {"uri": "test://r", "mimeType": "text/plain", "text": "…"}}
//!  ],
//!  "rows": 3}
//! ```

use std::sync::LazyLock;

use jsonschema::Validator;
use serde_json::{Map, Value, json};

/// The reserved output key holding the content blocks.
pub const CONTENT_KEY: &str = "content";

/// The JSON Schema of the content blocks (an array): `text`; `image` and `audio`
/// with base64 `data` and a `mimeType`; `resource` embedding `{uri, mimeType?,
/// text}` or `{uri, mimeType?, blob}` (base64). Each block may carry MCP
/// `annotations` and `_meta` objects; nothing else.
pub static CONTENT_SCHEMA: LazyLock<Value> = LazyLock::new(|| {
    let base64 = json!({"type": "string", "pattern": "^[A-Za-z0-9+/]*={0,2}$"});
    let extras = json!({
        "annotations": {"type": "object"},
        "_meta": {"type": "object"}
    });
    let block = |kind: &str, mut props: Map<String, Value>, required: &[&str]| {
        props.insert("type".into(), json!({"const": kind}));
        if let Value::Object(e) = &extras {
            props.extend(e.clone());
        }
        let mut required: Vec<&str> = required.to_vec();
        required.push("type");
        json!({
            "type": "object",
            "properties": props,
            "required": required,
            "additionalProperties": false
        })
    };
    let media = |kind: &str| {
        let mut p = Map::new();
        p.insert("data".into(), base64.clone());
        p.insert("mimeType".into(), json!({"type": "string", "minLength": 1}));
        block(kind, p, &["data", "mimeType"])
    };
    let mut text = Map::new();
    text.insert("text".into(), json!({"type": "string"}));
    let resource_body = |key: &str, schema: Value| {
        json!({
            "type": "object",
            "properties": {
                "uri": {"type": "string", "minLength": 1},
                "mimeType": {"type": "string"},
                key: schema,
                "_meta": {"type": "object"}
            },
            "required": ["uri", key],
            "additionalProperties": false
        })
    };
    let mut resource = Map::new();
    resource.insert(
        "resource".into(),
        json!({"oneOf": [
            resource_body("text", json!({"type": "string"})),
            resource_body("blob", base64.clone()),
        ]}),
    );
    json!({
        "type": "array",
        "items": {"oneOf": [
            block("text", text, &["text"]),
            media("image"),
            media("audio"),
            block("resource", resource, &["resource"]),
        ]}
    })
});

static CONTENT_VALIDATOR: LazyLock<Option<Validator>> =
    LazyLock::new(|| jsonschema::validator_for(&CONTENT_SCHEMA).ok());

/// Checks content blocks against [`CONTENT_SCHEMA`]: `Err` names the JSON
/// pointer (within the blocks) and keyword of the first violation.
pub fn check_blocks(blocks: &Value) -> Result<(), (String, String)> {
    let Some(v) = CONTENT_VALIDATOR.as_ref() else {
        return Err((String::new(), "schema".into()));
    };
    v.validate(blocks).map_err(|e| {
        (
            e.instance_path().as_str().to_owned(),
            e.kind().keyword().to_owned(),
        )
    })
}

/// An `output_content` tool's output split into its content blocks (`None` when
/// it has none, or is not an object) and its structured part (the object without
/// [`CONTENT_KEY`]; the output itself when it is not an object).
pub fn split(output: &Value) -> (Option<&Value>, Value) {
    match output {
        Value::Object(map) => {
            let structured: Map<String, Value> = map
                .iter()
                .filter(|(k, _)| k.as_str() != CONTENT_KEY)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            (map.get(CONTENT_KEY), Value::Object(structured))
        }
        other => (None, other.clone()),
    }
}

/// The bytes base64 text `b64` decodes to.
fn decoded_len(b64: &str) -> usize {
    let padding = b64.bytes().rev().take_while(|b| *b == b'=').count();
    (b64.len() / 4 * 3).saturating_sub(padding)
}

/// What a model is told of base64 it cannot see: the media type and size.
fn described(mime: Option<&Value>, b64: &Value) -> Value {
    let mime = mime
        .and_then(Value::as_str)
        .unwrap_or("application/octet-stream");
    let bytes = b64.as_str().map_or(0, decoded_len);
    Value::String(format!("[{mime}, {bytes} bytes, not shown to the model]"))
}

/// An `output_content` tool's output as a model reads it (the agent loop, tool
/// call routing): each image and audio block's `data` and each embedded
/// resource's `blob` replaced by its media type and size, everything else kept.
/// A model's tool message is text: base64 there is tokens it pays for and
/// cannot see. MCP clients, HTTP and gRPC get the blocks whole.
pub fn for_model(output: &Value) -> Value {
    let mut out = output.clone();
    let Some(Value::Array(blocks)) = out.get_mut(CONTENT_KEY) else {
        return out;
    };
    for block in blocks {
        let Some(b) = block.as_object_mut() else {
            continue;
        };
        if let Some(data) = b.get("data") {
            let text = described(b.get("mimeType"), data);
            b.insert("data".into(), text);
        }
        if let Some(Value::Object(r)) = b.get_mut("resource")
            && let Some(blob) = r.get("blob")
        {
            let text = described(r.get("mimeType"), blob);
            r.insert("blob".into(), text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_block_shapes_are_checked() {
        let ok = json!([
            {"type": "text", "text": "hi"},
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
            {"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav"},
            {"type": "resource", "resource": {"uri": "test://a", "mimeType": "text/plain", "text": "t"}},
            {"type": "resource", "resource": {"uri": "test://b", "blob": "AAEC"}}
        ]);
        assert_eq!(check_blocks(&ok), Ok(()));
        for bad in [
            json!({"type": "text", "text": "not an array"}),
            json!([{"type": "video", "data": "AA=="}]),
            json!([{"type": "image", "data": "not base64!", "mimeType": "image/png"}]),
            json!([{"type": "image", "data": "AA=="}]),
            json!([{"type": "text", "text": "x", "extra": 1}]),
            json!([{"type": "resource", "resource": {"uri": "u"}}]),
        ] {
            assert!(check_blocks(&bad).is_err(), "{bad}");
        }
        let err = check_blocks(&json!([{"type": "text", "text": 1}])).unwrap_err();
        assert!(err.0.starts_with("/0"), "{err:?}");
    }

    #[test]
    fn a_model_is_told_the_media_type_and_size_not_the_bytes() {
        let out = json!({"content": [
            {"type": "text", "text": "chart"},
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "test://b", "blob": "AAEC"}}
        ], "n": 1});
        let seen = for_model(&out);
        assert_eq!(seen["content"][0], out["content"][0]);
        assert_eq!(
            seen["content"][1]["data"],
            "[image/png, 8 bytes, not shown to the model]"
        );
        assert_eq!(
            seen["content"][2]["resource"]["blob"],
            "[application/octet-stream, 3 bytes, not shown to the model]"
        );
        assert_eq!(seen["n"], 1);
        assert_eq!(for_model(&json!({"n": 2})), json!({"n": 2}));
    }

    #[test]
    fn the_structured_part_is_the_rest() {
        let out = json!({"content": [{"type": "text", "text": "t"}], "n": 1});
        let (blocks, rest) = split(&out);
        assert_eq!(blocks, Some(&json!([{"type": "text", "text": "t"}])));
        assert_eq!(rest, json!({"n": 1}));
        assert_eq!(split(&json!({"n": 2})), (None, json!({"n": 2})));
    }
}
