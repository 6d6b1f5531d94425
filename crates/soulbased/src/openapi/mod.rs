//! The OpenAPI 3.1 document of the HTTP API, generated from the code: the paths
//! from [`ROUTES`] with each route's operation ([`operations`]), the schemas of
//! the bodies from the Rust types the handlers serialize and read
//! (`#[derive(JsonSchema)]`, [`crate::bodies`]), the few bodies that are built ad
//! hoc or whose type cannot derive a schema described in code ([`described`]),
//! and the error responses from the stable codes' table (`soulbase_errors::CODES`).
//!
//! The document is committed as `docs/openapi.json` and served from that file
//! (`GET /api/openapi.json`); a test holds the file to [`document`] and `cargo
//! xtask codegen` rewrites it (see [`render`]).

mod described;
mod errors;
mod operations;

use std::collections::BTreeMap;

use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde_json::{Map, Value, json};
use soulbase_edge::ExportFormat;
use soulbase_edge::subject::{API_KEY_HEADER, DEV_ACTOR_HEADER, DEV_TENANT_HEADER};

use crate::http_api::ROUTES;

/// The OpenAPI document of the HTTP API, as [`render`] writes it.
pub fn document() -> Value {
    let mut spec = Spec::new();
    let mut paths: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
    for route in ROUTES {
        if let Some(op) = operations::operation(route, &mut spec) {
            paths
                .entry(route.path)
                .or_default()
                .insert(route.method.as_str().to_lowercase(), op.into_json());
        }
    }
    let mut doc = json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Soulbase HTTP API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": INFO,
        },
        "servers": [{"url": "/"}],
        "tags": TAGS.iter().map(|(name, description)| json!({"name": name, "description": description})).collect::<Vec<_>>(),
        "security": [
            {"apiKey": []},
            {"bearer": []},
            {"devTenant": [], "devActor": []},
        ],
        "paths": paths,
        "components": {
            "securitySchemes": security_schemes(),
            "parameters": operations::shared_parameters(),
            "responses": errors::shared_responses(&mut spec),
            "schemas": spec.into_schemas(),
        },
    });
    plain_docs(&mut doc);
    sorted(doc)
}

/// `doc` as committed: pretty JSON with sorted keys and a final newline, so the
/// text is the same whichever serde_json features a build turned on.
pub fn render(doc: &Value) -> String {
    let mut text = serde_json::to_string_pretty(&sorted(doc.clone())).unwrap_or_default();
    text.push('\n');
    text
}

/// What the document says of itself and of what every route shares.
const INFO: &str = "The HTTP/JSON API of `soulbased`: the governed tool list, preflight and \
invocation, skills, the model-facing routes, evidence, audit, consent, access, and operations. \
MCP (streamable HTTP at `/mcp`) and gRPC are described by their own protocols, not here.\n\n\
Every error is the envelope `Error` (`{\"error\": {code, message, fields?, retry, \
retry_after_ms?, correlation_id?}}`) with the HTTP status of its stable code; an invoke answers \
the whole `CallResult` with that status. An unknown route is 404 and a wrong method 405 in the \
same envelope (`SCHEMA.VALIDATION_FAILED`, `fields.field` `path` / `method`). Every route refuses \
a body larger than `server.max_body_bytes` (413) or slower than `server.body_read_timeout_ms` \
(408).\n\n\
Authentication: an API key (`x-api-key: sbk_<id>_<secret>`, or as a bearer token) or a JWT \
(`Authorization: Bearer`). The `x-soulbase-tenant` / `x-soulbase-actor` headers are development \
only: honoured only with `server.dev_insecure: true`, where a request naming no one may act as \
`server.dev_identity`.\n\n\
Generated from the server's code by `cargo xtask codegen` (do not edit `docs/openapi.json` by \
hand); checked against the route table and by fuzzing a running server \
(crates/soulbased/tests/openapi.rs).";

/// The operations' tags, in the order they are listed.
const TAGS: &[(&str, &str)] = &[
    ("tools", "The governed tool list, preflight and invocation."),
    ("skills", "Skills and their administration."),
    ("model", "For agents speaking the OpenAI or Anthropic API."),
    ("evidence", "Reading a call's evidence back."),
    (
        "audit",
        "The audit of registry, skill and configuration changes.",
    ),
    (
        "consent",
        "Issuing and revoking consent tokens for tools that require consent.",
    ),
    (
        "access",
        "A tenant's view of the global tools: its allow-list and its states of global tools.",
    ),
    (
        "operations",
        "Reload, health, metrics and schemas; unauthenticated except reload.",
    ),
];

/// How a caller authenticates (the headers `soulbase_edge::subject` reads).
fn security_schemes() -> Value {
    json!({
        "apiKey": {
            "type": "apiKey",
            "in": "header",
            "name": API_KEY_HEADER,
            "description": "An API key, `sbk_<id>_<secret>` (`auth.api_keys`); also accepted as `Authorization: Bearer sbk_…`.",
        },
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "JWT",
            "description": "A JWT checked against `auth.jwt`.",
        },
        "devTenant": {
            "type": "apiKey",
            "in": "header",
            "name": DEV_TENANT_HEADER,
            "description": "Development only (`server.dev_insecure: true`): the tenant to act as, with the actor header. Never enable in production.",
        },
        "devActor": {
            "type": "apiKey",
            "in": "header",
            "name": DEV_ACTOR_HEADER,
            "description": "Development only (`server.dev_insecure: true`): the actor to act as, with the tenant header.",
        },
    })
}

/// `T`, or `null`: the schema of a field that must be present but may be
/// `null` (an `Option` read with `deserialize_with`, which serde does not let
/// be absent).
pub(crate) fn nullable<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    let inner = generator.subschema_for::<T>();
    schemars::json_schema!({"anyOf": [inner, {"type": "null"}]})
}

/// The schema of an export format's name: every [`ExportFormat`].
pub(crate) fn export_format_schema(_: &mut SchemaGenerator) -> Schema {
    let names: Vec<&str> = ExportFormat::ALL.iter().map(|f| f.as_str()).collect();
    schemars::json_schema!({"type": "string", "enum": names})
}

/// Where the component schemas come from while the document is built.
pub(crate) struct Spec {
    /// Response bodies: the schema of what serde writes.
    responses: SchemaGenerator,
    /// Request bodies and parameters: the schema of what serde reads.
    requests: SchemaGenerator,
    /// Schemas described in code ([`described`]), by name.
    described: BTreeMap<&'static str, Value>,
}

/// Where component schemas are referenced from.
const SCHEMAS: &str = "#/components/schemas/";

impl Spec {
    fn new() -> Self {
        let settings = SchemaSettings::draft2020_12().with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        });
        Spec {
            responses: settings.clone().for_serialize().into_generator(),
            requests: settings.for_deserialize().into_generator(),
            described: BTreeMap::new(),
        }
    }

    /// The schema of a response body of type `T` (a reference to its component).
    pub(crate) fn response<T: JsonSchema>(&mut self) -> Value {
        self.responses.subschema_for::<T>().to_value()
    }

    /// The schema of a request body of type `T`.
    pub(crate) fn request<T: JsonSchema>(&mut self) -> Value {
        self.requests.subschema_for::<T>().to_value()
    }

    /// The query parameters `T` (a query struct) reads: one per field, with its
    /// doc comment as description; an `Option` field is an optional parameter.
    pub(crate) fn query<T: JsonSchema>(&mut self) -> Vec<Value> {
        let schema = T::json_schema(&mut self.requests).to_value();
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let Some(properties) = schema["properties"].as_object() else {
            return Vec::new();
        };
        properties
            .iter()
            .map(|(name, field)| {
                let mut field = not_null(field.clone());
                let description = field.as_object_mut().and_then(|f| {
                    if f.get("default").is_some_and(Value::is_null) {
                        f.remove("default");
                    }
                    f.remove("description")
                });
                let mut param = json!({
                    "name": name,
                    "in": "query",
                    "required": required.contains(&name.as_str()),
                    "schema": field,
                });
                if let Some(d) = description {
                    param["description"] = d;
                }
                param
            })
            .collect()
    }

    /// A schema described in code, registered as component `name`; its reference.
    pub(crate) fn described(&mut self, name: &'static str, schema: Value) -> Value {
        self.described.insert(name, schema);
        json!({"$ref": format!("{SCHEMAS}{name}")})
    }

    /// Every component schema. A name both generators define with different
    /// schemas (a type read and written differently) keeps the response's under
    /// its name and the request's as `<name>Input`.
    fn into_schemas(mut self) -> Map<String, Value> {
        let mut schemas = self.responses.take_definitions(true);
        for schema in schemas.values_mut() {
            never_null_when_absent(schema);
        }
        for (name, schema) in self.requests.take_definitions(true) {
            match schemas.get(&name) {
                Some(existing) if *existing != schema => {
                    schemas.insert(format!("{name}Input"), schema);
                }
                _ => {
                    schemas.insert(name, schema);
                }
            }
        }
        for (name, schema) in self.described {
            schemas.insert(name.to_owned(), schema);
        }
        schemas
    }
}

/// `schema` without `null` among the values it admits: a parameter that is
/// absent is not sent as `null`.
fn not_null(mut schema: Value) -> Value {
    let is_null = |s: &Value| s.get("type").and_then(Value::as_str) == Some("null");
    if let Some(types) = schema.get_mut("type").and_then(Value::as_array_mut) {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            schema["type"] = types[0].clone();
        }
    }
    for key in ["anyOf", "oneOf"] {
        let Some(alternatives) = schema.get_mut(key).and_then(Value::as_array_mut) else {
            continue;
        };
        alternatives.retain(|s| !is_null(s));
        if let [only] = alternatives.as_slice() {
            let only = only.clone();
            if let Some(obj) = schema.as_object_mut() {
                obj.remove(key);
                if let Some(inner) = only.as_object() {
                    for (k, v) in inner {
                        obj.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                }
            }
        }
    }
    schema
}

/// `schema` (of what serde writes) with no `null` admitted for an optional
/// property: serde leaves such a field out (`skip_serializing_if =
/// "Option::is_none"`, the only way a field of these types is optional) rather
/// than writing `null`.
fn never_null_when_absent(schema: &mut Value) {
    match schema {
        Value::Object(obj) => {
            let required: Vec<String> = obj
                .get("required")
                .and_then(Value::as_array)
                .map(|r| {
                    r.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            if let Some(Value::Object(properties)) = obj.get_mut("properties") {
                for (name, property) in properties.iter_mut() {
                    if !required.contains(name) {
                        *property = not_null(property.take());
                    }
                }
            }
            obj.values_mut().for_each(never_null_when_absent);
        }
        Value::Array(items) => items.iter_mut().for_each(never_null_when_absent),
        _ => {}
    }
}

/// Rustdoc link syntax in descriptions made plain Markdown: ``[`x`](path)`` and
/// ``[`x`]`` become `` `x` `` (the paths are the code's, not the reader's).
fn plain_docs(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                match v {
                    Value::String(text) if key == "description" => *text = unlink(text),
                    _ => plain_docs(v),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(plain_docs),
        _ => {}
    }
}

/// `text` with each ``[`x`]`` or ``[`x`](…)`` written `` `x` ``, and without
/// link reference definitions (``[`x`]: path``).
fn unlink(text: &str) -> String {
    let kept: Vec<&str> = text
        .lines()
        .filter(|line| !(line.starts_with('[') && line.contains("]: ")))
        .collect();
    let text = kept.join("\n");
    let text = text.trim_end();
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("[`") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let Some(close) = after.find("`]") else {
            out.push_str(&rest[start..]);
            return out;
        };
        out.push_str(&after[..close + 1]);
        rest = &after[close + 2..];
        if rest.starts_with('(')
            && let Some(end) = rest.find(')')
        {
            rest = &rest[end + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// `value` with every object's keys in sorted order.
fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests;
