//! The edge every surface shares, without a wire protocol of its own.
//!
//! HTTP (axum), gRPC (tonic), MCP (rmcp, over streamable HTTP and stdio) and the
//! CLI's local mode all serve the same governed call through one [`Stack`]:
//!
//! - [`subject`]: request metadata → [`Subject`](soulbase_types::Subject) (API
//!   keys, JWTs, development headers only when enabled), checked in-process or by
//!   the auth role ([`CredentialCheck`]);
//! - [`binding`]: which skill a call is made for, and who may claim one;
//! - [`meta`]: a call's options as headers, metadata or MCP `_meta` carry them;
//! - [`observe`]: the metrics hook, labelled by [`Surface`];
//! - [`stack`]: the outer stack — binding, option checks, metrics, the
//!   `execute_tool` span — around the one [`Invoker`](soulbase_tools::pipeline::Invoker),
//!   and the governed tool list;
//! - [`model`]: the model-facing surface on that stack — the caller's tools as
//!   OpenAI / Anthropic / MCP definitions, and a model's tool calls routed and
//!   answered in its API's shape;
//! - [`consent`]: the [`ConsentDesk`] every surface issues and revokes consent
//!   tokens through, and approvers answer consent requests through;
//! - [`agent`]: the governed agent loop — a conversation with a model behind
//!   [`ModelUpstream`], its tool calls run through the stack, up to a bound.
//!
//! This crate knows `http::HeaderMap` (the common currency of HTTP headers and
//! gRPC metadata) and nothing of tonic, axum, rmcp or a database: every edge crate
//! can use it.

pub mod agent;
pub mod binding;
pub mod consent;
pub mod meta;
pub mod model;
pub mod observe;
pub mod stack;
pub mod subject;

pub use agent::{
    Conversation, ConversationRequest, ModelUpstream, SKILL_INFO_TOOL, SkillInfoHook, StopReason,
};
pub use binding::{ALL_SKILLS_SCOPE, Binding, SKILL_HEADER, SKILL_HEADER_NAME};
pub use consent::{ConsentAsk, ConsentDesk, ConsentRequestView, IssuedView, issued_json};
pub use meta::CallMeta;
pub use model::{CallStyle, ExportFormat, ModelTools};
pub use observe::{CallObserver, NoopObserver, Surface};
pub use stack::{CallRequest, SpanMaker, Stack, StackBuilder, boxed_in_place};
pub use subject::{CredentialCheck, MetadataAuth, SubjectResolver};
