//! The MCP conformance fixture pack (`server.mcp_conformance_tools`): the tools the
//! official MCP conformance suite (`@modelcontextprotocol/conformance`) calls by
//! fixed plain names, as ordinary global builtin tools `soulbase.conformance.*`
//! with manifests like any other — each names itself for MCP with `mcp_name` and
//! answers content blocks with `output_content` — so every call goes through the
//! governed pipeline (policy, quota, sandbox, evidence) like any tool's.
//!
//! | id (`soulbase.conformance.…`) | `mcp_name` | answers |
//! |---|---|---|
//! | `simple_text` | `test_simple_text` | a text block |
//! | `image_content` | `test_image_content` | a 1×1 PNG image block |
//! | `audio_content` | `test_audio_content` | a short WAV audio block |
//! | `embedded_resource` | `test_embedded_resource` | an embedded text resource |
//! | `multiple_content_types` | `test_multiple_content_types` | text, image and resource |
//! | `tool_with_logging` | `test_tool_with_logging` | three info log messages ~50 ms apart, then text |
//! | `tool_with_progress` | `test_tool_with_progress` | progress 0, 50 and 100 of 100 ~50 ms apart, then text |
//! | `error_handling` | `test_error_handling` | always fails (`TOOL.EXECUTION_FAILED`) |
//! | `json_schema_2020_12` | `json_schema_2020_12_tool` | its arguments as text; a JSON Schema 2020-12 input schema (`$schema`, `$defs`, `$ref`) |
//! | `sampling` | `test_sampling` | asks the client's model to complete its `prompt` (`sampling/createMessage`), answers `LLM response: …` |
//! | `elicitation` | `test_elicitation` | asks the user its `message` for a username and an email (`elicitation/create`), answers what they said |
//! | `elicitation_sep1034_defaults` | `test_elicitation_sep1034_defaults` | asks the user a form whose every primitive field has a default (SEP-1034) |
//! | `elicitation_sep1330_enums` | `test_elicitation_sep1330_enums` | asks the user a form of the five enum shapes (SEP-1330) |
//! | `reconnection` | `test_reconnection` | lets the client poll (its response stream is closed mid-call, SEP-1699), then answers text |
//!
//! The last four declare a `client` capability for what they ask, so the
//! pipeline lets the request through and records it in their End; a client that
//! cannot answer makes them fail (`SANDBOX.CAPABILITY_BLOCKED`).
//!
//! Off by default: they exist for conformance testing, not for users.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_sandbox::{
    BuiltinExecutor, BuiltinHandler, ClientRequest, ClientResponse, ExecOutput, LogLevel, Reporter,
    SamplingMessage, SamplingRole,
};
use soulbase_tools::{Registry, ToolManifest, ToolOwner};

/// The id prefix of the pack's tools.
pub const PREFIX: &str = "soulbase.conformance.";

/// A 1×1 red PNG, base64.
pub const PNG: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";
/// Eight samples of silence, 8 kHz 8-bit mono WAV, base64.
pub const WAV: &str = "UklGRiwAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQgAAACAgICAgICAgA==";

/// The pause between a fixture's reports (what the suite's fixtures do).
const STEP: Duration = Duration::from_millis(50);

/// One fixture: its id's last segment, MCP name, description and behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fixture {
    SimpleText,
    Image,
    Audio,
    EmbeddedResource,
    Mixed,
    Logging,
    Progress,
    Error,
    JsonSchema,
    Sampling,
    Elicitation,
    ElicitationDefaults,
    ElicitationEnums,
    Reconnection,
}

const ALL: [Fixture; 14] = [
    Fixture::SimpleText,
    Fixture::Image,
    Fixture::Audio,
    Fixture::EmbeddedResource,
    Fixture::Mixed,
    Fixture::Logging,
    Fixture::Progress,
    Fixture::Error,
    Fixture::JsonSchema,
    Fixture::Sampling,
    Fixture::Elicitation,
    Fixture::ElicitationDefaults,
    Fixture::ElicitationEnums,
    Fixture::Reconnection,
];

impl Fixture {
    fn parts(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::SimpleText => (
                "simple_text",
                "test_simple_text",
                "Returns a simple text response (MCP conformance fixture).",
            ),
            Self::Image => (
                "image_content",
                "test_image_content",
                "Returns a 1x1 PNG image (MCP conformance fixture).",
            ),
            Self::Audio => (
                "audio_content",
                "test_audio_content",
                "Returns a short WAV audio clip (MCP conformance fixture).",
            ),
            Self::EmbeddedResource => (
                "embedded_resource",
                "test_embedded_resource",
                "Returns an embedded text resource (MCP conformance fixture).",
            ),
            Self::Mixed => (
                "multiple_content_types",
                "test_multiple_content_types",
                "Returns text, image and resource content together (MCP conformance fixture).",
            ),
            Self::Logging => (
                "tool_with_logging",
                "test_tool_with_logging",
                "Sends three log messages while it runs (MCP conformance fixture).",
            ),
            Self::Progress => (
                "tool_with_progress",
                "test_tool_with_progress",
                "Reports progress 0, 50 and 100 of 100 while it runs (MCP conformance fixture).",
            ),
            Self::Error => (
                "error_handling",
                "test_error_handling",
                "Always fails (MCP conformance fixture).",
            ),
            Self::JsonSchema => (
                "json_schema_2020_12",
                "json_schema_2020_12_tool",
                "Tool with JSON Schema 2020-12 features",
            ),
            Self::Sampling => (
                "sampling",
                "test_sampling",
                "Asks the client's model to complete a prompt (MCP conformance fixture).",
            ),
            Self::Elicitation => (
                "elicitation",
                "test_elicitation",
                "Asks the user for a username and an email (MCP conformance fixture).",
            ),
            Self::ElicitationDefaults => (
                "elicitation_sep1034_defaults",
                "test_elicitation_sep1034_defaults",
                "Asks the user a form with a default for every field (MCP conformance fixture, SEP-1034).",
            ),
            Self::ElicitationEnums => (
                "elicitation_sep1330_enums",
                "test_elicitation_sep1330_enums",
                "Asks the user a form of every enum shape (MCP conformance fixture, SEP-1330).",
            ),
            Self::Reconnection => (
                "reconnection",
                "test_reconnection",
                "Lets the client poll: its response stream is closed mid-call (MCP conformance fixture, SEP-1699).",
            ),
        }
    }

    fn id(self) -> String {
        format!("{PREFIX}{}", self.parts().0)
    }

    fn manifest(self) -> Value {
        let (_, mcp_name, description) = self.parts();
        let input = match self {
            Self::JsonSchema => json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "$defs": {
                    "address": {
                        "type": "object",
                        "properties": {
                            "street": {"type": "string"},
                            "city": {"type": "string"}
                        }
                    }
                },
                "properties": {
                    "name": {"type": "string"},
                    "address": {"$ref": "#/$defs/address"}
                },
                "additionalProperties": false
            }),
            Self::Sampling => json!({
                "type": "object",
                "properties": {"prompt": {"type": "string", "description": "The prompt to send to the LLM"}},
                "required": ["prompt"],
                "additionalProperties": false
            }),
            Self::Elicitation => json!({
                "type": "object",
                "properties": {"message": {"type": "string", "description": "The message to show the user"}},
                "required": ["message"],
                "additionalProperties": false
            }),
            _ => json!({"type": "object", "additionalProperties": false}),
        };
        let asks = match self {
            Self::Sampling => json!([{"kind": "client", "requests": ["sampling"]}]),
            Self::Elicitation | Self::ElicitationDefaults | Self::ElicitationEnums => {
                json!([{"kind": "client", "requests": ["elicitation"]}])
            }
            _ => json!([]),
        };
        json!({
            "id": self.id(),
            "version": "1.0.0",
            "description": description,
            "tags": ["builtin", "conformance"],
            "mcp_name": mcp_name,
            "output_content": true,
            "input_schema": input,
            "output_schema": {"type": "object", "additionalProperties": false},
            "side_effect": "none",
            "capabilities": asks
        })
    }

    /// The form an elicitation fixture asks the user to fill in.
    fn form(self) -> Value {
        match self {
            Self::ElicitationDefaults => json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "User name", "default": "John Doe"},
                    "age": {"type": "integer", "description": "User age", "default": 30},
                    "score": {"type": "number", "description": "User score", "default": 95.5},
                    "status": {
                        "type": "string",
                        "description": "User status",
                        "enum": ["active", "inactive", "pending"],
                        "default": "active"
                    },
                    "verified": {"type": "boolean", "description": "Verification status", "default": true}
                }
            }),
            Self::ElicitationEnums => json!({
                "type": "object",
                "properties": {
                    "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
                    "titledSingle": {"type": "string", "oneOf": [
                        {"const": "value1", "title": "First Option"},
                        {"const": "value2", "title": "Second Option"},
                        {"const": "value3", "title": "Third Option"}
                    ]},
                    "legacyEnum": {
                        "type": "string",
                        "enum": ["opt1", "opt2", "opt3"],
                        "enumNames": ["Option One", "Option Two", "Option Three"]
                    },
                    "untitledMulti": {
                        "type": "array",
                        "items": {"type": "string", "enum": ["option1", "option2", "option3"]}
                    },
                    "titledMulti": {
                        "type": "array",
                        "items": {"anyOf": [
                            {"const": "value1", "title": "First Choice"},
                            {"const": "value2", "title": "Second Choice"},
                            {"const": "value3", "title": "Third Choice"}
                        ]}
                    }
                }
            }),
            _ => json!({
                "type": "object",
                "properties": {
                    "username": {"type": "string", "description": "User's response"},
                    "email": {"type": "string", "description": "User's email address"}
                },
                "required": ["username", "email"]
            }),
        }
    }

    async fn run(self, args: Value, reporter: Reporter) -> Result<Value, SoulError> {
        let text = |t: &str| json!({"type": "text", "text": t});
        let image = json!({"type": "image", "data": PNG, "mimeType": "image/png"});
        let blocks = match self {
            Self::SimpleText => vec![text("This is a simple text response for testing.")],
            Self::Image => vec![image],
            Self::Audio => vec![json!({"type": "audio", "data": WAV, "mimeType": "audio/wav"})],
            Self::EmbeddedResource => vec![json!({"type": "resource", "resource": {
                "uri": "test://embedded-resource",
                "mimeType": "text/plain",
                "text": "This is an embedded resource content."
            }})],
            Self::Mixed => vec![
                text("Multiple content types test:"),
                image,
                json!({"type": "resource", "resource": {
                    "uri": "test://mixed-content-resource",
                    "mimeType": "application/json",
                    "text": "{\"test\":\"data\",\"value\":123}"
                }}),
            ],
            Self::Logging => {
                reporter.log(LogLevel::Info, "Tool execution started");
                tokio::time::sleep(STEP).await;
                reporter.log(LogLevel::Info, "Tool processing data");
                tokio::time::sleep(STEP).await;
                reporter.log(LogLevel::Info, "Tool execution completed");
                vec![text("Tool with logging executed successfully")]
            }
            Self::Progress => {
                reporter.progress(0.0, 100.0, None);
                tokio::time::sleep(STEP).await;
                reporter.progress(50.0, 100.0, None);
                tokio::time::sleep(STEP).await;
                reporter.progress(100.0, 100.0, None);
                vec![text("Tool with progress executed successfully")]
            }
            Self::Error => {
                return Err(SoulError::new(
                    ErrorCode::ToolExecutionFailed,
                    "This tool intentionally returns an error for testing",
                ));
            }
            Self::JsonSchema => vec![text(&format!("Received: {args}"))],
            Self::Reconnection => {
                reporter.let_client_poll();
                vec![text("Reconnection test completed successfully")]
            }
            Self::Sampling => {
                let prompt = args
                    .get("prompt")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let asked = ClientRequest::Sampling {
                    messages: vec![SamplingMessage {
                        role: SamplingRole::User,
                        text: prompt.to_owned(),
                    }],
                    system_prompt: None,
                    max_tokens: 100,
                };
                match reporter.ask(asked).await? {
                    ClientResponse::Sampling { text: answer, .. } => {
                        vec![text(&format!("LLM response: {answer}"))]
                    }
                    other => return Err(unexpected(&other)),
                }
            }
            Self::Elicitation | Self::ElicitationDefaults | Self::ElicitationEnums => {
                let (message, lead) = match self {
                    Self::Elicitation => (
                        args.get("message")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                        "User response",
                    ),
                    Self::ElicitationDefaults => (
                        "Test client default value handling - please accept with defaults".into(),
                        "Elicitation completed",
                    ),
                    _ => (
                        "Test enum schema variants - please choose".into(),
                        "Elicitation completed",
                    ),
                };
                let asked = ClientRequest::Elicitation {
                    message,
                    schema: self.form(),
                };
                match reporter.ask(asked).await? {
                    ClientResponse::Elicitation { action, content } => {
                        let content = content.unwrap_or_else(|| json!({}));
                        vec![text(&format!(
                            "{lead}: action={}, content={content}",
                            action.as_str()
                        ))]
                    }
                    other => return Err(unexpected(&other)),
                }
            }
        };
        Ok(json!({ "content": blocks }))
    }
}

#[async_trait]
impl BuiltinHandler for Fixture {
    async fn call(&self, args: Value) -> Result<ExecOutput, SoulError> {
        self.call_reporting(args, Reporter::none()).await
    }

    async fn call_reporting(
        &self,
        args: Value,
        reporter: Reporter,
    ) -> Result<ExecOutput, SoulError> {
        self.run(args, reporter).await.map(ExecOutput::value)
    }
}

/// A client answer of the wrong kind (a broken surface).
fn unexpected(answer: &ClientResponse) -> SoulError {
    SoulError::new(
        ErrorCode::ToolExecutionFailed,
        "the client answered a different request",
    )
    .with_note(format!("{answer:?}"))
}

/// The pack's manifests.
pub fn manifests() -> Vec<Value> {
    ALL.iter().map(|f| f.manifest()).collect()
}

/// Registers the pack's handlers on `executor`.
pub fn register_handlers(executor: &BuiltinExecutor) {
    for f in ALL {
        executor.register(f.id(), Arc::new(f));
    }
}

/// Registers and enables the pack's tools as global tools.
pub fn register_tools(registry: &Registry) -> Result<(), SoulError> {
    for m in manifests() {
        let manifest = ToolManifest::from_json_str(&m.to_string()).map_err(SoulError::from)?;
        let id = manifest.id.clone();
        registry.register(manifest)?;
        registry.enable(&ToolOwner::Global, &id)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::Mutex;

    use soulbase_sandbox::{Report, ReportSink};

    use super::*;

    #[test]
    fn the_pack_registers_with_plain_mcp_names() {
        let registry = Registry::new();
        register_tools(&registry).unwrap();
        let tenant = soulbase_types::TenantId::new("acme").unwrap();
        assert_eq!(registry.list_enabled(&tenant).len(), ALL.len());
        assert_eq!(
            registry
                .mcp_tool(&tenant, "test_image_content")
                .map(|id| id.to_string()),
            Some("soulbase.conformance.image_content".to_owned())
        );
    }

    #[derive(Default)]
    struct Collect(Mutex<Vec<Report>>);

    impl ReportSink for Collect {
        fn report(&self, report: Report) {
            self.0.lock().unwrap().push(report);
        }
    }

    /// A client that accepts every elicitation and answers every sampling.
    struct Agreeable;

    #[async_trait]
    impl soulbase_sandbox::ClientSink for Agreeable {
        fn offers(&self, _kind: soulbase_sandbox::ClientRequestKind) -> bool {
            true
        }

        async fn request(&self, request: ClientRequest) -> Result<ClientResponse, SoulError> {
            Ok(match request {
                ClientRequest::Elicitation { .. } => ClientResponse::Elicitation {
                    action: soulbase_sandbox::ElicitationAction::Accept,
                    content: Some(json!({"username": "ada"})),
                },
                ClientRequest::Sampling { .. } => ClientResponse::Sampling {
                    text: "42".into(),
                    model: "m".into(),
                    stop_reason: None,
                },
            })
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn outputs_fit_their_manifests_and_reports_reach_the_reporter() {
        for f in ALL {
            let tool = soulbase_tools::compile(
                ToolManifest::from_json_str(&f.manifest().to_string()).unwrap(),
            )
            .unwrap();
            let sink = Arc::new(Collect::default());
            let reporter = Reporter::new(sink.clone()).with_client(Arc::new(Agreeable));
            let args = json!({"prompt": "p", "message": "m"});
            match f.run(args, reporter).await {
                Ok(out) => tool.validate_output(&out).unwrap(),
                Err(e) => {
                    assert_eq!(f, Fixture::Error);
                    assert_eq!(e.code(), ErrorCode::ToolExecutionFailed);
                }
            }
            let reports = sink.0.lock().unwrap().clone();
            let expected = match f {
                Fixture::Logging | Fixture::Progress => 3,
                Fixture::Reconnection => 1,
                _ => 0,
            };
            assert_eq!(reports.len(), expected, "{f:?}");
            if f == Fixture::Reconnection {
                assert_eq!(reports[0], Report::Poll);
            }
        }
    }

    /// Without a client to ask, the asking fixtures fail with the code the
    /// governed channel gives.
    #[tokio::test(flavor = "current_thread")]
    async fn asking_fixtures_fail_without_a_client() {
        for f in [Fixture::Sampling, Fixture::Elicitation] {
            let e = f
                .run(json!({"prompt": "p", "message": "m"}), Reporter::none())
                .await
                .unwrap_err();
            assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked, "{f:?}");
        }
    }
}
