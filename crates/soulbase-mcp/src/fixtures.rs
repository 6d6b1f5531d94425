//! The conformance suite's fixture resources and prompts (`test://static-text`,
//! `test://static-binary`, the template `test://template/{id}/data`,
//! `test://watched-resource`; `test_simple_prompt`, `test_prompt_with_arguments`,
//! `test_prompt_with_embedded_resource`, `test_prompt_with_image`), served beside
//! the skills' when the server is built [`with_fixtures`](crate::McpServer::with_fixtures)
//! (`server.mcp_conformance_tools`, off by default; the pack's tools are ordinary
//! manifests in `soulbase-app`). They are constant data, the same for every
//! caller: nothing runs and no file is read to answer them, so there is nothing
//! to govern; they exist for conformance testing, not for users.

use rmcp::model::{GetPromptResult, Prompt, Resource, ResourceContents, ResourceTemplate};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

/// A 1×1 PNG, base64.
const PNG: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";

const TEMPLATE_PREFIX: &str = "test://template/";
const TEMPLATE_SUFFIX: &str = "/data";

/// Constant fixture data in rmcp's types (the JSON is this module's own, so it
/// always reads; `None` would only mean a typo here, caught by the tests).
fn of<T: DeserializeOwned>(v: Value) -> Option<T> {
    serde_json::from_value(v).ok()
}

fn resource_list() -> [Value; 3] {
    [
        json!({"uri": "test://static-text", "name": "static-text", "mimeType": "text/plain",
               "description": "A static text resource (conformance fixture)"}),
        json!({"uri": "test://static-binary", "name": "static-binary", "mimeType": "image/png",
               "description": "A static binary resource (conformance fixture)"}),
        json!({"uri": "test://watched-resource", "name": "watched-resource",
               "mimeType": "text/plain",
               "description": "A resource to subscribe to (conformance fixture)"}),
    ]
}

/// The fixture resources, for `resources/list`.
pub(crate) fn resources() -> Vec<Resource> {
    resource_list().into_iter().filter_map(of).collect()
}

/// The fixture template, for `resources/templates/list`.
pub(crate) fn templates() -> Vec<ResourceTemplate> {
    of(
        json!({"uriTemplate": "test://template/{id}/data", "name": "template-data",
              "mimeType": "application/json",
              "description": "Data for an id (conformance fixture)"}),
    )
    .into_iter()
    .collect()
}

/// Whether `uri` is a fixture resource (what `resources/subscribe` accepts:
/// constant, so a subscription never reports a change).
pub(crate) fn is_resource(uri: &str) -> bool {
    read(uri).is_some()
}

/// A fixture resource's contents; `None` for any other URI.
pub(crate) fn read(uri: &str) -> Option<ResourceContents> {
    let contents = match uri {
        "test://static-text" => json!({"uri": uri, "mimeType": "text/plain",
            "text": "This is the content of the static text resource."}),
        "test://watched-resource" => json!({"uri": uri, "mimeType": "text/plain",
            "text": "The watched resource's content."}),
        "test://static-binary" => json!({"uri": uri, "mimeType": "image/png", "blob": PNG}),
        _ => {
            let id = uri
                .strip_prefix(TEMPLATE_PREFIX)?
                .strip_suffix(TEMPLATE_SUFFIX)
                .filter(|id| !id.is_empty() && !id.contains('/'))?;
            json!({"uri": uri, "mimeType": "application/json",
                   "text": json!({"id": id, "templateTest": true,
                                  "data": format!("Data for ID: {id}")}).to_string()})
        }
    };
    of(contents)
}

/// The fixture prompts, for `prompts/list`.
pub(crate) fn prompts() -> Vec<Prompt> {
    [
        json!({"name": "test_simple_prompt", "description": "A simple prompt without arguments"}),
        json!({"name": "test_prompt_with_arguments", "description": "A prompt with arguments",
               "arguments": [
                   {"name": "arg1", "description": "First test argument", "required": true},
                   {"name": "arg2", "description": "Second test argument", "required": true}]}),
        json!({"name": "test_prompt_with_embedded_resource",
               "description": "A prompt embedding a resource",
               "arguments": [{"name": "resourceUri", "description": "The URI to embed",
                              "required": true}]}),
        json!({"name": "test_prompt_with_image", "description": "A prompt with an image"}),
    ]
    .into_iter()
    .filter_map(of)
    .collect()
}

/// Why a fixture prompt was refused: its missing argument.
pub(crate) type MissingArgument = &'static str;

/// Fixture prompt `name` with `arguments`: `None` for any other name, the
/// missing argument's name when one is required and absent.
pub(crate) fn prompt(
    name: &str,
    arguments: Option<&Map<String, Value>>,
) -> Option<Result<GetPromptResult, MissingArgument>> {
    let arg = |k: &'static str| -> Result<String, MissingArgument> {
        arguments
            .and_then(|a| a.get(k))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or(k)
    };
    let user = |content: Value| json!({"role": "user", "content": content});
    let messages = match name {
        "test_simple_prompt" => vec![user(
            json!({"type": "text", "text": "This is a simple prompt for testing."}),
        )],
        "test_prompt_with_arguments" => {
            let (a1, a2) = match (arg("arg1"), arg("arg2")) {
                (Ok(a1), Ok(a2)) => (a1, a2),
                (Err(k), _) | (_, Err(k)) => return Some(Err(k)),
            };
            vec![user(json!({"type": "text",
                "text": format!("Prompt with arguments: arg1='{a1}', arg2='{a2}'")}))]
        }
        "test_prompt_with_embedded_resource" => {
            let uri = match arg("resourceUri") {
                Ok(u) => u,
                Err(k) => return Some(Err(k)),
            };
            vec![
                user(
                    json!({"type": "resource", "resource": {"uri": uri, "mimeType": "text/plain",
                    "text": "Embedded resource content for testing."}}),
                ),
                user(
                    json!({"type": "text", "text": "Please process the embedded resource above."}),
                ),
            ]
        }
        "test_prompt_with_image" => vec![
            user(json!({"type": "image", "data": PNG, "mimeType": "image/png"})),
            user(json!({"type": "text", "text": "Please analyze the image above."})),
        ],
        _ => return None,
    };
    of(json!({"messages": messages})).map(Ok)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn every_fixture_reads_as_rmcps_types() {
        assert_eq!(resources().len(), 3);
        assert_eq!(templates().len(), 1);
        assert_eq!(prompts().len(), 4);
        for uri in [
            "test://static-text",
            "test://static-binary",
            "test://watched-resource",
        ] {
            assert!(read(uri).is_some(), "{uri}");
        }
        let templated = serde_json::to_value(read("test://template/123/data").unwrap()).unwrap();
        assert!(templated["text"].as_str().unwrap().contains("123"));
        assert!(read("test://template//data").is_none());
        assert!(read("skill://x/SKILL.md").is_none());
        for name in ["test_simple_prompt", "test_prompt_with_image"] {
            assert!(prompt(name, None).unwrap().is_ok(), "{name}");
        }
        let args: Map<String, Value> =
            serde_json::from_value(json!({"arg1": "v1", "arg2": "v2"})).unwrap();
        let got = prompt("test_prompt_with_arguments", Some(&args))
            .unwrap()
            .unwrap();
        let text = serde_json::to_string(&got).unwrap();
        assert!(text.contains("v1") && text.contains("v2"), "{text}");
        assert_eq!(
            prompt("test_prompt_with_arguments", None)
                .unwrap()
                .unwrap_err(),
            "arg1"
        );
        let uri: Map<String, Value> =
            serde_json::from_value(json!({"resourceUri": "test://example-resource"})).unwrap();
        let got = prompt("test_prompt_with_embedded_resource", Some(&uri))
            .unwrap()
            .unwrap();
        assert!(
            serde_json::to_string(&got)
                .unwrap()
                .contains("\"type\":\"resource\"")
        );
        assert!(prompt("another", None).is_none());
    }
}
