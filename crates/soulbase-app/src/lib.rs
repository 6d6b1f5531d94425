//! The assembly: configuration → seams → the one governed stack, in one place.
//!
//! In the spirit of linkerd's `linkerd/app`, this crate is where Soulbase is put
//! together, so the binaries stay thin: `soulbased` adds its listeners (HTTP, gRPC,
//! TLS, shutdown) and OpenTelemetry; `soulbase` (the CLI) adds its commands. Both
//! build the same [`app::App`]:
//!
//! - [`app`]: each seam chosen from configuration — in-process, or the gRPC client
//!   of a role served elsewhere, decided here and nowhere else — the skills
//!   directory and its terms, the invoker, and [`App::stack`](app::App::stack), the
//!   one outer stack every surface calls; reload in one style: every seam follows
//!   the `ConfigHandle` and picks up an accepted snapshot on its next use;
//! - [`evidence`]: persistence (the durable spool into SQLite or Postgres,
//!   idempotency, registry state) and its shutdown flush;
//! - `audit`: the audit of configuration reloads and skill changes (registry
//!   changes are audited by the registry admin), kept with the evidence
//!   ([`App::audit`](app::App::audit));
//! - [`builtins`]: the builtin tools and the crash-drill hooks;
//! - [`conformance`]: the MCP conformance suite's fixture tools, an optional pack
//!   of builtin tools (`server.mcp_conformance_tools`);
//! - [`metrics`]: the Prometheus metrics (a `CallObserver`);
//! - [`stdio`]: MCP over stdio for one subject (`soulbased mcp`, `soulbase mcp`);
//! - `tenants`: the configuration's per-tenant views of the global tools, given to
//!   the registry at start and on every reload.
//!
//! It knows no listener, no HTTP router and no OpenTelemetry exporter.

pub mod app;
mod audit;
pub mod builtins;
pub mod conformance;
pub mod evidence;
pub mod metrics;
pub mod stdio;
mod tenants;

pub use app::{App, Options};
