//! `soulbased`: the Soulbase server.
//!
//! One process serves the roles chosen in configuration (`server.roles`): `tools`
//! (registry, invoker, HTTP API, MCP, skills), `auth` (`soulbase.auth.v1`), `qos`
//! (`soulbase.qos.v1`), `sandbox` (`soulbase.sandbox.v1`) and `evidence`
//! (`soulbase.evidence.v1`). A `tools` role reaches a role served elsewhere at
//! `server.remote.{auth,qos,sandbox,evidence}` through its gRPC client; otherwise the
//! seam runs in-process behind it ([`app::App`]). With a remote evidence role the
//! tools role still spools every record durably on its own disk and drains the
//! spool to it, so an evidence outage loses nothing.
//!
//! - gRPC on `server.grpc_addr` ([`server`]): `soulbase.tools.v1.ToolRegistry`,
//!   `soulbase.tools.v1.ToolInvoker`, `grpc.health.v1.Health` and reflection,
//!   optional TLS / mTLS (rustls, ring provider; feature `tls`).
//! - HTTP on `server.http_addr` ([`http_api`]): the JSON API under `/api`,
//!   `/healthz`, `/readyz`, `/metrics` (Prometheus text, [`metrics`]) and MCP
//!   streamable HTTP at `/mcp`; over HTTPS (and mTLS) with `server.tls`
//!   ([`https`], the same files as the gRPC listener).
//! - Self-protection ([`listener`]): both listeners served by one loop —
//!   `TCP_NODELAY` and TCP keep-alive on every accepted socket, a connection cap
//!   per listener that sheds those that never completed a request first, a
//!   first-request (HTTP/2 preface included) and idle timeout, HTTP/2 stream caps
//!   and pings; on HTTP the body limit and body-read timeout on every route and
//!   bounded MCP sessions (`server.max_connections`,
//!   `server.grpc_max_connections`, `server.*_timeout_ms`,
//!   `server.max_body_bytes`, `server.http2_*`, `server.mcp_*`).
//! - Configuration from defaults < `config.yaml` < `SOULBASE_*` environment < flags,
//!   hot-reloaded (file watch and `POST /api/reload`).
//! - Graceful shutdown on SIGTERM / SIGINT: readiness drops, listeners stop
//!   accepting, in-flight calls get `server.shutdown_grace_ms` to finish, then the
//!   registry is saved and the evidence spool drained into the store. Calls still
//!   running when the grace expires are cancelled, each with a `cancelled` End
//!   recorded before the spool is drained, and the binary exits with
//!   [`server::EXIT_NOT_DRAINED`] (3) instead of 0.
//! - Persistence ([`evidence`]): evidence through the durable spool into SQLite
//!   (default, under `data_dir`) or Postgres, idempotency records and registry state
//!   in the same database; `GET /api/evidence/{call_id}` reads a call back, and
//!   `GET /api/audit` ([`audit_api`]) the audit of registry, skill and
//!   configuration changes kept there.
//! - OpenTelemetry ([`telemetry`]): with `observe.otlp_endpoint`, one
//!   `execute_tool {tool}` span per HTTP/gRPC/MCP invocation (GenAI attributes) is
//!   exported over OTLP/gRPC.
//! - Sandbox: profiles are Grant ∩ Manifest ∩ PolicyConfig (`sandbox.*`), executed
//!   by the builtin, HTTP, WASM and process executors.
//! - Authentication from metadata through the [`soulbase_edge::SubjectResolver`]
//!   seam: API keys / JWTs (`auth.*`), development headers only with
//!   `server.dev_insecure: true`.

pub use soulbase_app::{app, builtins, evidence, metrics, stdio};

pub mod access_api;
pub mod audit_api;
pub mod bodies;
pub mod consent_api;
pub mod console;
pub mod evidence_api;
pub mod http_api;
#[cfg(feature = "tls")]
pub mod https;
pub mod listener;
pub mod model_api;
pub mod openapi;
pub mod overview_api;
pub mod quarantine_api;
pub mod server;
pub mod telemetry;
pub mod tool_state_api;
