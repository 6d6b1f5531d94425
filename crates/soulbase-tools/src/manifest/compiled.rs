//! A validated manifest with its schemas compiled.

use std::fmt;
use std::sync::Arc;

use jsonschema::Validator;
use serde_json::Value;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_sandbox::CapabilityDomain;

use super::ToolManifest;
use crate::discovery::ToolSpec;

/// A manifest that passed [`compile`](super::compile), with both schemas compiled
/// exactly once. Cheap to share: hold it in an `Arc`.
#[derive(Clone)]
pub struct CompiledTool {
    /// The validated manifest (`name` filled in).
    pub manifest: Arc<ToolManifest>,
    /// The compiled input schema.
    pub input: Arc<Validator>,
    /// The compiled output schema.
    pub output: Arc<Validator>,
    /// SHA-256 (hex) of the manifest's canonical JSON (keys sorted at every level):
    /// identifies this exact declaration in evidence and change detection.
    pub digest: String,
    /// The model-facing spec, built once.
    pub(crate) spec: ToolSpec,
    /// Lower-cased name, display name and description, for keyword queries.
    pub(crate) haystack: Box<str>,
    /// Index terms, computed once.
    pub(crate) terms: IndexTerms,
    /// The version as text, formatted once (every Begin records it).
    pub(crate) version_text: Box<str>,
    /// The manifest's `scopes` as the authorizer sees them (`resource#action`),
    /// formatted once.
    pub scope_names: Vec<String>,
}

/// What the registry indexes a tool by, precomputed at compile time so that
/// registering and querying allocate nothing per term.
#[derive(Debug, Clone)]
pub(crate) struct IndexTerms {
    /// The id's group.
    pub group: Arc<str>,
    /// The tags, lower-cased and deduplicated.
    pub tags: Box<[Arc<str>]>,
    /// The capability domains declared, deduplicated.
    pub capabilities: Vec<CapabilityDomain>,
}

impl IndexTerms {
    pub(crate) fn of(m: &ToolManifest) -> Self {
        let mut tags: Vec<String> = m.tags.iter().map(|t| t.to_lowercase()).collect();
        tags.sort();
        tags.dedup();
        let mut capabilities: Vec<CapabilityDomain> =
            m.capabilities.iter().map(|c| c.domain()).collect();
        capabilities.sort();
        capabilities.dedup();
        Self {
            group: Arc::from(m.id.group()),
            tags: tags.into_iter().map(Arc::from).collect(),
            capabilities,
        }
    }
}

impl CompiledTool {
    /// The tool id.
    pub fn id(&self) -> &soulbase_types::ToolId {
        &self.manifest.id
    }

    /// The tool version.
    pub fn version(&self) -> &semver::Version {
        &self.manifest.version
    }

    /// The version as text (`1.2.3`), formatted once at compile time.
    pub fn version_text(&self) -> &str {
        &self.version_text
    }

    /// The restricted, model-facing view (name, description, input schema).
    pub fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    /// Checks call arguments against the input schema.
    ///
    /// On failure: `SCHEMA.VALIDATION_FAILED` with field `pointer` (the JSON pointer
    /// of the first offending value in `args`, `""` for the root) and `keyword`. The
    /// message names the pointer and the rule but never echoes the value, which may
    /// be secret.
    pub fn validate_input(&self, args: &Value) -> Result<(), SoulError> {
        match self.input.validate(args) {
            Ok(()) => Ok(()),
            Err(e) => {
                let pointer = e.instance_path().as_str().to_owned();
                let message = format!(
                    "arguments do not match the input schema at {}: {}",
                    describe(&pointer),
                    e.masked()
                );
                Err(SoulError::new(ErrorCode::SchemaValidationFailed, message)
                    .with_field("pointer", pointer)
                    .with_field("keyword", e.kind().keyword().to_owned())
                    .with_field("tool_id", self.manifest.id.as_str()))
            }
        }
    }

    /// Checks a tool's result against the output schema.
    ///
    /// On failure: `TOOL.EXECUTION_FAILED` (the tool broke its contract, the caller
    /// did nothing wrong) with fields `pointer` and `keyword`; the detail goes to the
    /// audit notes, masked.
    ///
    /// A tool with `output_content` answers an object: its `content` blocks are
    /// checked against [`CONTENT_SCHEMA`](super::content::CONTENT_SCHEMA) (field
    /// `pointer` then starts with `/content`), the rest against the output schema.
    pub fn validate_output(&self, output: &Value) -> Result<(), SoulError> {
        if !self.manifest.output_content {
            return self.validate_structured(output);
        }
        if !output.is_object() {
            return Err(SoulError::new(
                ErrorCode::ToolExecutionFailed,
                "the tool's output must be an object holding its content blocks",
            )
            .with_field("pointer", "")
            .with_field("keyword", "type")
            .with_field("tool_id", self.manifest.id.as_str()));
        }
        let (blocks, structured) = super::content::split(output);
        if let Some(blocks) = blocks
            && let Err((at, keyword)) = super::content::check_blocks(blocks)
        {
            let pointer = format!("/{}{at}", super::content::CONTENT_KEY);
            return Err(SoulError::new(
                ErrorCode::ToolExecutionFailed,
                format!(
                    "the tool's content blocks are not valid at {}",
                    describe(&pointer)
                ),
            )
            .with_field("pointer", pointer)
            .with_field("keyword", keyword)
            .with_field("tool_id", self.manifest.id.as_str()));
        }
        self.validate_structured(&structured)
    }

    fn validate_structured(&self, output: &Value) -> Result<(), SoulError> {
        match self.output.validate(output) {
            Ok(()) => Ok(()),
            Err(e) => {
                let pointer = e.instance_path().as_str().to_owned();
                let message = format!(
                    "the tool's output does not match its output schema at {}",
                    describe(&pointer)
                );
                Err(SoulError::new(ErrorCode::ToolExecutionFailed, message)
                    .with_field("pointer", pointer)
                    .with_field("keyword", e.kind().keyword().to_owned())
                    .with_field("tool_id", self.manifest.id.as_str())
                    .with_note(format!("output schema violation: {}", e.masked())))
            }
        }
    }
}

fn describe(pointer: &str) -> String {
    if pointer.is_empty() {
        "the root".to_owned()
    } else {
        format!("{pointer:?}")
    }
}

impl fmt::Debug for CompiledTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledTool")
            .field("id", &self.manifest.id)
            .field("version", &self.manifest.version.to_string())
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}
