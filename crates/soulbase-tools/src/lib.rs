//! Soulbase's tool SDK: declare, register and discover tools.
//!
//! Every tool call travels one governed path: **declared** (a manifest) →
//! **registered** (per tenant) → **discovered** (a restricted list for the model)
//! → preflighted → executed in a sandbox → evidenced → returned. This crate owns
//! the first three steps:
//!
//! - [`manifest`] — [`ToolManifest`] (R1), loaded from YAML or JSON, validated by
//!   [`compile`] with every problem reported at once, schemas compiled exactly once
//!   into a [`CompiledTool`]; [`check_upgrade`] enforces the SemVer rules;
//!   [`manifest::content`], the content blocks of an `output_content` tool.
//! - [`registry`] — the multi-tenant [`Registry`] (R2): lifecycle states, tenant
//!   scoping with shadowing, overrides and allow-lists (stored, and configured on
//!   top: [`Registry::set_configured`]), indexed queries, the AvailableSpec view,
//!   lock-free reads from immutable snapshots, change events; changes made for
//!   someone go through [`registry::admin`] (persisted, audited), a tenant's own
//!   view through [`registry::access`]; [`Registry::mcp_tool`] resolves a plain
//!   `mcp_name`, unique in every tenant's view.
//! - [`discovery`] — what a model may see ([`ToolSpec`], R3), the OpenAI and
//!   Anthropic exports with provider-safe names ([`NameMap`]), and which providers
//!   and models a tool fits ([`discovery::compat`]).
//!
//! Errors are [`soulbase_errors::SoulError`]s with stable codes:
//! `MANIFEST.INVALID`, `REGISTRY.CONFLICT`, `TOOL.NOT_FOUND`, `TOOL.DISABLED`,
//! `SCHEMA.VALIDATION_FAILED`, `TOOL.EXECUTION_FAILED`.

pub mod discovery;
pub mod manifest;
pub mod pipeline;
pub mod registry;

pub use discovery::{NameMap, ToolSpec};
pub use manifest::{
    CompiledTool, Deprecation, ManifestError, Problem, ToolManifest, check_upgrade, compile,
    day_start_secs,
};
pub use registry::{
    Registry, RegistryEvent, RegistryView, ResolvedTool, ToolFilter, ToolOwner, ToolState,
};
