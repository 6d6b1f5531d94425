//! Soulbase's HTTP executor: a tool that is a JSON-over-HTTP service (seed 001's HTTP
//! provider), reached only where the call's profile allows.
//!
//! ```rust
//! use std::sync::Arc;
//! use soulbase_sandbox::{BuiltinExecutor, LocalSandbox, ProviderKind};
//! use soulbase_sandbox_http::{HttpExecutor, HttpOptions};
//!
//! let http = HttpExecutor::new(HttpOptions {
//!     env_allow: vec!["SEARCH_API_TOKEN".into()], // `${SEARCH_API_TOKEN}` in headers
//!     ..HttpOptions::default()
//! });
//! let sandbox = LocalSandbox::new(BuiltinExecutor::new())
//!     .with_executor(ProviderKind::Http, Arc::new(http));
//! ```
//!
//! What one call does, in order:
//! 1. The endpoint's scheme, host, port and `POST` must be granted by a `net`
//!    capability (hosts exact or `*.label` wildcards, never by suffix).
//! 2. Header values have `${VAR}` expanded, only for variables on
//!    [`HttpOptions::env_allow`]; any other reference is refused.
//! 3. The arguments are `POST`ed as JSON to `endpoint` + `path` (default `/execute`),
//!    with a timeout of the binding's `timeout_ms`, else the call's timeout, else 30 s,
//!    never more than 120 s.
//! 4. Every address is checked before a connection: an IP literal directly, a name
//!    after this executor resolves it ([`GuardedResolver`]). Loopback, private,
//!    link-local, cloud-metadata and other special ranges are refused unless the
//!    profile lists that IP literally in a `net` host. No proxy is ever used.
//! 5. Redirects are not followed unless [`HttpOptions::max_redirects`] allows; each
//!    hop is then checked again from step 1 (the method and body are kept).
//! 6. The response must be 2xx with a JSON content type (`application/json` or
//!    `+json`), at most the call's `max_bytes_out` (else [`HttpOptions::max_response_bytes`]).
//!
//! Errors: a refused host or address → `SANDBOX.CAPABILITY_BLOCKED`; timeout →
//! `PROVIDER.TIMEOUT`; cannot connect, 502/503/504/429 → `PROVIDER.UNAVAILABLE`;
//! any other non-2xx, a non-JSON or oversized response, an unfollowed redirect →
//! `TOOL.EXECUTION_FAILED`.

mod address;
mod executor;
mod resolver;

pub use address::restricted_reason;
pub use executor::{DEFAULT_TIMEOUT, HttpExecutor, HttpOptions};
pub use resolver::{AddressRefused, GuardedResolver, check_address};
