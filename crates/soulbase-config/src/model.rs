//! The typed configuration tree and its semantic validation.
//!
//! Every struct denies unknown fields so a typo is an error, not a silently ignored
//! setting. Defaults are the embedded, zero-infrastructure setup: SQLite evidence
//! under `data_dir`, in-process quota, `./skills`, all roles in one process.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use soulbase_types::Rate;

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where embedded state lives (SQLite evidence, the evidence spool).
    pub data_dir: PathBuf,
    /// Listening addresses and roles.
    pub server: ServerConfig,
    /// The watched skills directory.
    pub skills: SkillsConfig,
    /// Evidence storage and durability.
    pub evidence: EvidenceConfig,
    /// Quotas and rate limits.
    pub quota: QuotaConfig,
    /// The static authorization policy (deny by default).
    pub policy: PolicyConfig,
    /// Authentication (API keys, JWT issuers) and the Cedar policy engine.
    pub auth: AuthConfig,
    /// Tracing and metrics.
    pub observe: ObserveConfig,
    /// Sandbox profiles (policy ceiling, tenant grants) and executors.
    pub sandbox: SandboxConfig,
    /// The governed agent loop (`POST /v1/chat/completions`): its upstream model
    /// API and limits. Without an upstream the route answers `PROVIDER.UNAVAILABLE`.
    pub model: ModelConfig,
    /// Per-tenant views of the global tools, decided by the operator: an
    /// allow-list and per-tool states, applied on top of what the registry API
    /// stored for the tenant (both allow-lists must admit a tool; these states
    /// win). Reloads apply to the next call.
    pub tenants: Vec<TenantConfig>,
}

/// One tenant's view of the global tools (`tenants[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant.
    pub tenant: String,
    /// If set, the only global tools the tenant sees (exact tool ids); its own
    /// tools are not affected.
    #[serde(default)]
    pub allow: Option<Vec<String>>,
    /// Global tools enabled for this tenant whatever their own state (a paused
    /// or deprecated tool stays so).
    #[serde(default)]
    pub enable: Vec<String>,
    /// Global tools paused for this tenant.
    #[serde(default)]
    pub pause: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./data"),
            server: ServerConfig::default(),
            skills: SkillsConfig::default(),
            evidence: EvidenceConfig::default(),
            quota: QuotaConfig::default(),
            policy: PolicyConfig::default(),
            auth: AuthConfig::default(),
            observe: ObserveConfig::default(),
            sandbox: SandboxConfig::default(),
            model: ModelConfig::default(),
            tenants: Vec::new(),
        }
    }
}

/// The governed agent loop's upstream and limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// The OpenAI-compatible chat completions API the loop talks to; none: the
    /// loop is off.
    pub upstream: Option<ModelUpstream>,
    /// Iterations (model turns) of a conversation when the request names none.
    pub max_iterations: u32,
    /// The most iterations a request may ask for (`max_iterations` in its body).
    pub max_iterations_cap: u32,
    /// Which models each tenant may use (`*` patterns as for tools, e.g.
    /// `gpt-4o*`); a tenant with no entry may use none.
    pub allow: Vec<ModelAllow>,
    /// The most tool calls one conversation may make (1 ..= 10000): calls past it
    /// are refused in place with `QUOTA.BUDGET_EXCEEDED`, which the model's next
    /// turn sees.
    pub max_tool_calls: u32,
    /// The most tokens one conversation may use (the upstream's reported
    /// `usage.total_tokens`, summed over its turns); past it the conversation ends
    /// with reason `budget`. None: no bound.
    pub max_tokens: Option<u64>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            upstream: None,
            max_iterations: 8,
            max_iterations_cap: 32,
            allow: Vec::new(),
            max_tool_calls: 64,
            max_tokens: None,
        }
    }
}

/// An OpenAI-compatible upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelUpstream {
    /// The API's base URL, e.g. `https://api.openai.com/v1` (the loop posts to
    /// `{base_url}/chat/completions`).
    pub base_url: String,
    /// The environment variable holding its API key (sent as `Authorization:
    /// Bearer`); none sends no key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// How long one model turn may take; then the conversation ends with
    /// `PROVIDER.TIMEOUT`.
    #[serde(default = "default_model_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_model_timeout_ms() -> u64 {
    60_000
}

/// The models one tenant may use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelAllow {
    /// The tenant.
    pub tenant: String,
    /// Model name patterns (`*` at the end matches any suffix; `*` alone, any).
    pub models: Vec<String>,
}

/// A role `soulbased` can serve locally; roles not served locally are reached remotely.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Tool registry and invoker.
    Tools,
    /// Authentication, authorization, consent.
    Auth,
    /// Quotas and rate limits.
    Qos,
    /// Sandboxed execution.
    Sandbox,
    /// Evidence storage and query.
    Evidence,
}

/// The identity `server.dev_identity` gives a request that names none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DevIdentity {
    /// The tenant.
    pub tenant: String,
    /// The actor.
    pub actor: String,
}

/// Server addresses and roles.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Roles served by this process.
    pub roles: Vec<Role>,
    /// gRPC listen address.
    pub grpc_addr: SocketAddr,
    /// HTTP/JSON, MCP and metrics listen address.
    pub http_addr: SocketAddr,
    /// How long in-flight calls may take to finish on shutdown.
    pub shutdown_grace_ms: u64,
    /// Development only: accept the unauthenticated `x-soulbase-tenant` /
    /// `x-soulbase-actor` headers as the caller's identity. Never in production.
    pub dev_insecure: bool,
    /// Development only (needs `dev_insecure`): the identity of a request that
    /// names none — no credential and neither development header — so stock
    /// clients (curl, MCP clients) connect with no custom headers. Read at start-up.
    pub dev_identity: Option<DevIdentity>,
    /// TLS (and mTLS) for the gRPC and HTTP listeners; plaintext when absent.
    pub tls: Option<TlsConfig>,
    /// Browser origins allowed on the MCP endpoint (`Origin` validation), beside
    /// the server's own loopback origin (`http://127.0.0.1:PORT` — or `localhost`,
    /// `[::1]` — when the request's `Host` is that same address); requests without
    /// an `Origin` header always pass. Empty: any other browser origin is refused.
    pub mcp_allowed_origins: Vec<String>,
    /// Where roles this process does not serve are reached (gRPC endpoints).
    pub remote: RemoteRoles,
    /// The environment variable holding the internal token of the role services
    /// (auth, qos, sandbox, evidence): served, they require it in `x-soulbase-internal-token`;
    /// remote clients send it. Unset: no token (network policy / mTLS only).
    pub internal_token_env: Option<String>,
    /// A file holding the internal token (e.g. a mounted Kubernetes Secret);
    /// read at start-up, surrounding whitespace trimmed. Exclusive with
    /// `internal_token_env`.
    pub internal_token_file: Option<PathBuf>,
    /// Most connections the HTTP listener holds at once (plain or TLS, counted from
    /// accept). At the cap the oldest connection that has not yet sent a complete
    /// request (else the oldest idle one) is closed for the new one; when every
    /// connection is busy the new one is closed. Clamped at start-up (with
    /// `grpc_max_connections`) to what the process's open-file limit leaves room for.
    pub max_connections: usize,
    /// Most connections the gRPC listener holds at once, with the same shedding as
    /// `max_connections` (a connection that has not yet sent the HTTP/2 preface and
    /// a request goes first). A cap of its own, so a flood on one port cannot close
    /// or refuse the other port's connections.
    pub grpc_max_connections: usize,
    /// How long a client may take to send its first request (from accept, TLS
    /// handshake and HTTP/2 preface included; gRPC and HTTP), and an HTTP/1
    /// client a later request's line and headers (from the previous response);
    /// then the connection is closed.
    pub header_read_timeout_ms: u64,
    /// How long an HTTP request's body may take to arrive whole (from its headers);
    /// then the request is answered 408 in the JSON error envelope and its HTTP/1
    /// connection closed. Streaming responses (MCP) are not limited by it.
    pub body_read_timeout_ms: u64,
    /// How long a connection (gRPC or HTTP) may stay open with no request in
    /// progress (HTTP/1 keep-alive or HTTP/2); then it is closed, at most an
    /// eighth of this later (it is checked on a timer, not on every request).
    pub idle_timeout_ms: u64,
    /// The largest request body accepted on any HTTP route (API and MCP); a larger
    /// one is answered 413 with the JSON error envelope.
    pub max_body_bytes: usize,
    /// Most concurrent HTTP/2 streams per connection (gRPC and HTTP listeners).
    pub http2_max_concurrent_streams: u32,
    /// How often an HTTP/2 connection with no traffic is pinged (gRPC and HTTP
    /// listeners).
    pub http2_keepalive_interval_ms: u64,
    /// How long an HTTP/2 ping may go unanswered before the connection is closed.
    pub http2_keepalive_timeout_ms: u64,
    /// TCP keep-alive idle time set on every accepted socket (gRPC and HTTP), so
    /// connections to vanished peers are found; 0 leaves keep-alive off.
    pub tcp_keepalive_ms: u64,
    /// Most live MCP sessions (streamable HTTP) in total; an `initialize` beyond it
    /// is refused with `QUOTA.RATE_LIMITED`. A session holds ~140 KiB (rmcp's
    /// worker and channels), so the default 256 bounds them to ~36 MiB.
    pub mcp_max_sessions: usize,
    /// Most live MCP sessions of one tenant; an `initialize` beyond it is refused
    /// with `QUOTA.RATE_LIMITED`.
    pub mcp_max_sessions_per_tenant: usize,
    /// An MCP session with no request in progress for this long is closed.
    pub mcp_session_idle_ms: u64,
    /// Registers the MCP conformance suite's fixture tools (`test_simple_text`,
    /// `test_image_content`, … as global builtin tools `soulbase.conformance.*`,
    /// enabled; calls still need policy) and serves its fixture resources
    /// (`test://…`) and prompts (`test_*_prompt`) over MCP. For conformance
    /// testing only.
    pub mcp_conformance_tools: bool,
}

/// gRPC endpoints (`http://host:port`) of roles served elsewhere. The role clients
/// speak plaintext HTTP/2: keep the role services on a private network (NetworkPolicy,
/// a service mesh's mTLS) and require the internal token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RemoteRoles {
    /// The `auth` role (authorization and consent), when not served here.
    pub auth: Option<String>,
    /// The `qos` role (quotas), when not served here.
    pub qos: Option<String>,
    /// The `sandbox` role (execution), when not served here.
    pub sandbox: Option<String>,
    /// The `evidence` role (durable evidence store), when not served here. The
    /// `tools` role still spools every record locally first and drains the spool
    /// to it, so an unreachable evidence role loses nothing.
    pub evidence: Option<String>,
}

/// Server TLS (rustls): PEM files, re-read at start-up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The certificate chain (PEM).
    pub cert_file: PathBuf,
    /// The private key (PEM).
    pub key_file: PathBuf,
    /// When set, clients must present a certificate signed by this CA (mTLS).
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            roles: vec![
                Role::Tools,
                Role::Auth,
                Role::Qos,
                Role::Sandbox,
                Role::Evidence,
            ],
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 50051)),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            shutdown_grace_ms: 10_000,
            dev_insecure: false,
            dev_identity: None,
            tls: None,
            mcp_allowed_origins: Vec::new(),
            remote: RemoteRoles::default(),
            internal_token_env: None,
            internal_token_file: None,
            max_connections: 1024,
            grpc_max_connections: 1024,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            idle_timeout_ms: 120_000,
            max_body_bytes: 2 * 1024 * 1024,
            http2_max_concurrent_streams: 256,
            http2_keepalive_interval_ms: 30_000,
            http2_keepalive_timeout_ms: 10_000,
            tcp_keepalive_ms: 60_000,
            mcp_max_sessions: 256,
            mcp_max_sessions_per_tenant: 32,
            mcp_session_idle_ms: 300_000,
            mcp_conformance_tools: false,
        }
    }
}

/// The skills directory and how it is watched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SkillsConfig {
    /// The directory of YAML descriptors and SKILL.md packages (`SKILLS_DIR`).
    pub dir: PathBuf,
    /// Whether to apply changes while running.
    pub watch: bool,
    /// How often the skills directory (and the configuration file) is checked
    /// for changes besides file events: the fallback where events are unavailable
    /// or lost, such as a shared NFS volume changed from another machine. Each
    /// check wakes an idle server (5 s by default: well under 1 ms of CPU a second).
    pub poll_interval_ms: u64,
    /// Subscriptions to skills whose exports require one (seed 000 `access`).
    pub subscriptions: Vec<SkillSubscription>,
}

impl Default for SkillsConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("./skills"),
            watch: true,
            poll_interval_ms: 5_000,
            subscriptions: Vec::new(),
        }
    }
}

/// A subscription of a tenant (or one of its actors) to a skill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillSubscription {
    /// The subscribing tenant.
    pub tenant: String,
    /// The actor, or `*` (the default) for every actor of the tenant.
    #[serde(default = "star")]
    pub actor: String,
    /// The skill subscribed to (its name).
    pub skill: String,
}

/// Where evidence is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EvidenceBackend {
    /// An SQLite file under `data_dir` (the embedded default).
    Sqlite,
    /// PostgreSQL at `evidence.url` (production).
    Postgres,
}

/// When evidence must be durable relative to the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityMode {
    /// Begin is durable before execution (for a call that can change nothing:
    /// before its result), End before the result returns (default).
    Sync,
    /// Batched in the background; a crash may lose the last few milliseconds.
    Async,
}

/// Evidence storage and durability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EvidenceConfig {
    /// Which store.
    pub backend: EvidenceBackend,
    /// Database URL; required for Postgres, defaults to `<data_dir>/evidence.db` for SQLite.
    pub url: Option<String>,
    /// A file holding the database URL (e.g. a mounted Kubernetes Secret): read
    /// by the loader into `url` (surrounding whitespace trimmed) on every load.
    /// Exclusive with `url`.
    pub url_file: Option<PathBuf>,
    /// Sync (default) or async durability.
    pub durability: DurabilityMode,
    /// The spool's cap; past it new calls are refused with `EVIDENCE.UNAVAILABLE`.
    /// Unset (the default): derived at start-up from the free space of the volume
    /// holding the spool (plus what the spool already holds), less its disk reserve
    /// and the segments written ahead, at most 1 GiB — so the cap, not a full disk,
    /// is what refuses calls.
    pub spool_max_bytes: Option<u64>,
    /// Apply migrations at start-up.
    pub migrate_on_start: bool,
    /// How long evidence is kept.
    pub retention_days: u32,
    /// How long a keyed call's idempotency key stays its replica's without a
    /// heartbeat (renewed every quarter of it): the longest a retry waits for a key
    /// held by a replica that died. At least 100 ms; default 4000.
    pub idempotency_lease_ms: u64,
}

impl Default for EvidenceConfig {
    fn default() -> Self {
        Self {
            backend: EvidenceBackend::Sqlite,
            url: None,
            url_file: None,
            durability: DurabilityMode::Sync,
            spool_max_bytes: None,
            migrate_on_start: true,
            retention_days: 30,
            idempotency_lease_ms: 4_000,
        }
    }
}

/// Which quota backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum QuotaBackend {
    /// In this process (one replica).
    Memory,
    /// Shared through Redis (several replicas).
    Redis,
}

/// What to do when the quota backend is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Refuse calls (default).
    Closed,
    /// Allow calls and log a warning.
    Open,
}

/// One rate limit: who it applies to and the rate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaLimit {
    /// Tenant, or `*` for every tenant (each tenant gets its own bucket).
    #[serde(default = "star")]
    pub tenant: String,
    /// Tool id pattern: exact id, `group.pkg.*`, or `*` (every tool). The agent
    /// loop's model turns count as `soulbase.model.turn`, limited only by a
    /// pattern naming them (not `*`).
    #[serde(default = "star")]
    pub tool: String,
    /// The rate, e.g. `100/min`.
    #[schemars(with = "String")]
    pub rate: Rate,
}

/// Quotas and rate limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct QuotaConfig {
    /// In-process or Redis.
    pub backend: QuotaBackend,
    /// Redis URL when the backend is Redis.
    pub redis_url: Option<String>,
    /// A file holding the Redis URL (e.g. a mounted Kubernetes Secret): read by
    /// the loader into `redis_url` (surrounding whitespace trimmed) on every
    /// load. Exclusive with `redis_url`.
    pub redis_url_file: Option<PathBuf>,
    /// Behaviour when the backend is unreachable.
    pub on_backend_failure: FailMode,
    /// The limits.
    pub limits: Vec<QuotaLimit>,
    /// Budgets over fixed windows (calls, bytes, CPU), per tenant, tool and actor.
    pub budgets: Vec<QuotaBudget>,
}

/// The fixed window a budget is counted over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BudgetWindow {
    /// One second.
    Sec,
    /// One minute.
    Min,
    /// One hour.
    Hour,
    /// One day (UTC).
    Day,
}

impl BudgetWindow {
    /// The window's length in milliseconds.
    pub fn millis(self) -> u64 {
        match self {
            BudgetWindow::Sec => 1_000,
            BudgetWindow::Min => 60_000,
            BudgetWindow::Hour => 3_600_000,
            BudgetWindow::Day => 86_400_000,
        }
    }
}

/// A budget: how much a tenant (or one actor) may use of a tool set per window.
/// A call is refused with `QUOTA.BUDGET_EXCEEDED` once any amount is used up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaBudget {
    /// Tenant, or `*` for every tenant (each tenant gets its own counters).
    #[serde(default = "star")]
    pub tenant: String,
    /// Tool id pattern: exact id, `group.pkg.*`, or `*` (every tool). The agent
    /// loop's model turns count as `soulbase.model.turn`, limited only by a
    /// pattern naming them (not `*`).
    #[serde(default = "star")]
    pub tool: String,
    /// Actor the budget applies to, or `*` for all actors.
    #[serde(default = "star")]
    pub actor: String,
    /// Count separately per actor (otherwise the tenant's actors share the budget).
    #[serde(default)]
    pub per_actor: bool,
    /// The window.
    pub window: BudgetWindow,
    /// Calls per window.
    #[serde(default)]
    pub calls: Option<u64>,
    /// Argument bytes per window.
    #[serde(default)]
    pub bytes_in: Option<u64>,
    /// Output bytes per window.
    #[serde(default)]
    pub bytes_out: Option<u64>,
    /// CPU milliseconds per window.
    #[serde(default)]
    pub cpu_ms: Option<u64>,
}

impl Default for QuotaConfig {
    fn default() -> Self {
        Self {
            backend: QuotaBackend::Memory,
            redis_url: None,
            redis_url_file: None,
            on_backend_failure: FailMode::Closed,
            limits: Vec::new(),
            budgets: Vec::new(),
        }
    }
}

/// Allow or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PolicyEffect {
    /// Grants, unless some deny rule matches.
    Allow,
    /// Refuses; wins over any allow.
    Deny,
}

fn star() -> String {
    "*".to_owned()
}

fn star_list() -> Vec<String> {
    vec![star()]
}

/// One static policy rule. A call is allowed when some allow rule matches and no deny rule does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    /// Allow or deny.
    pub effect: PolicyEffect,
    /// Tenant the rule applies to, or `*`.
    #[serde(default = "star")]
    pub tenant: String,
    /// Actors the rule applies to (`*` for all).
    #[serde(default = "star_list")]
    pub actors: Vec<String>,
    /// Tool id patterns: exact id, `group.*`, `group.pkg.*`, or `*`.
    pub tools: Vec<String>,
    /// Actions ([`POLICY_ACTIONS`] or `*`); defaults to `invoke`, which also grants
    /// `list` and `preflight` in an allow rule.
    #[serde(default = "default_actions")]
    pub actions: Vec<String>,
    /// Allow rules only: match only a caller holding every scope the tool's
    /// manifest declares (`resource#action`, among the scopes of its API key or
    /// JWT). Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_scopes: bool,
    /// Allow rules only: what a call this rule allows must have done to its
    /// output before anyone sees it — `{kind: mask | redact | watermark,
    /// pointer, value?, required?, on_failure?: refuse | degrade}` — applied with
    /// the manifest's obligations, before the output is digested into evidence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub obligations: Vec<soulbase_types::Obligation>,
}

/// The action names a policy rule may use: exactly `soulbase_auth::Action::ALL`
/// (that crate's tests hold the two lists equal).
pub const POLICY_ACTIONS: &[&str] = &[
    "invoke",
    "preflight",
    "list",
    "read_evidence",
    "register",
    "update",
    "unregister",
    "enable",
    "disable",
    "deprecate",
    "reload",
    "consent_issue",
];

fn default_actions() -> Vec<String> {
    vec!["invoke".to_owned()]
}

/// The static, in-process policy (replaced by the policy engine where configured).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Rules; with none, everything is denied.
    pub rules: Vec<PolicyRule>,
}

/// Authentication and the policy engine.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// API keys, stored as SHA-256 digests; remove an entry (or set `revoked`) to revoke it.
    pub api_keys: Vec<ApiKeyConfig>,
    /// Trusted JWT issuers.
    pub jwt: Vec<JwtIssuerConfig>,
    /// The Cedar policy engine; when set it replaces `policy.rules`.
    pub cedar: Option<CedarConfig>,
    /// Consent tokens: how they are signed and how long they may live.
    pub consent: ConsentConfig,
}

/// How consent tokens are signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ConsentSigning {
    /// Ed25519 (`e1.` tokens): verifiers can hold only the public key.
    Ed25519,
    /// HMAC-SHA256 with one shared key (`v1.` tokens).
    Hmac,
}

/// Consent tokens (issued by `POST /api/consent`, gRPC `Consent.Issue` and
/// `soulbase consent issue`; verified for every tool whose manifest requires consent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ConsentConfig {
    /// `ed25519` or `hmac`. Unset: `hmac` when $SOULBASED_CONSENT_HMAC_KEY is set
    /// (its key), else `ed25519`.
    pub signing: Option<ConsentSigning>,
    /// A file holding the signing key in hex: for Ed25519 a 32-byte seed, for HMAC
    /// at least 32 bytes. Unset: HMAC reads $SOULBASED_CONSENT_HMAC_KEY, Ed25519
    /// makes a key for this process (its tokens verify only here, until restart).
    pub key_file: Option<PathBuf>,
    /// Ed25519 only, instead of `key_file`: verify with this public key (64 hex
    /// digits) and issue nothing — a replica that only checks consent.
    pub public_key: Option<String>,
    /// The longest a consent token may live, issued here or elsewhere (from its
    /// issue time). Default 1 h.
    pub max_ttl_ms: u64,
    /// The lifetime of a token issued without one asked for. Default 10 min.
    pub default_ttl_ms: u64,
}

impl Default for ConsentConfig {
    fn default() -> Self {
        Self {
            signing: None,
            key_file: None,
            public_key: None,
            max_ttl_ms: 3_600_000,
            default_ttl_ms: 600_000,
        }
    }
}

/// One API key. The key itself (`sbk_<id>_<secret>`) is never stored, only its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// The key id (the `<id>` part of the key), unique.
    pub id: String,
    /// Lowercase hex SHA-256 of the whole key.
    pub sha256: String,
    /// The tenant the key acts for.
    pub tenant: String,
    /// The actor the key acts as.
    pub actor: String,
    /// Roles granted to the key's subject.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Scopes granted to the key's subject.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// A revoked key is refused like an unknown one.
    #[serde(default)]
    pub revoked: bool,
}

/// A JWT signing algorithm Soulbase accepts (`none` never is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum JwtAlgorithm {
    /// HMAC-SHA256 with a shared secret.
    HS256,
    /// RSA PKCS#1 v1.5 with SHA-256.
    RS256,
    /// ECDSA P-256 with SHA-256.
    ES256,
}

/// One verification key of an issuer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JwtKeyConfig {
    /// Key id matched against the token's `kid` header, when both are present.
    #[serde(default)]
    pub kid: Option<String>,
    /// The algorithm this key verifies.
    pub alg: JwtAlgorithm,
    /// HS256: the environment variable holding the shared secret (never the secret itself).
    #[serde(default)]
    pub secret_env: Option<String>,
    /// RS256 / ES256: the PEM-encoded public key.
    #[serde(default)]
    pub public_key_pem: Option<String>,
}

/// A trusted token issuer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JwtIssuerConfig {
    /// The `iss` claim tokens must carry.
    pub issuer: String,
    /// Accepted `aud` values (at least one).
    pub audience: Vec<String>,
    /// Keys given inline.
    #[serde(default)]
    pub keys: Vec<JwtKeyConfig>,
    /// A JWKS file (RSA and P-256 keys), re-read on every configuration reload.
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// Binds the issuer to one tenant: its tokens act for it whatever they claim.
    #[serde(default)]
    pub tenant: Option<String>,
    /// The claim carrying the tenant when the issuer is not bound to one.
    #[serde(default = "default_tenant_claim")]
    pub tenant_claim: String,
    /// Clock skew tolerated on `exp` and `nbf`, in seconds.
    #[serde(default = "default_leeway")]
    pub leeway_s: u64,
}

fn default_tenant_claim() -> String {
    "tenant".to_owned()
}

fn default_leeway() -> u64 {
    30
}

/// Cedar policies: files and/or inline text, validated against Soulbase's schema at load.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CedarConfig {
    /// Policy files (`.cedar`), read on every configuration reload.
    pub files: Vec<PathBuf>,
    /// Policies written inline in the configuration.
    pub policies: Option<String>,
}

/// Tracing and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ObserveConfig {
    /// OTLP gRPC endpoint for traces; none disables export.
    pub otlp_endpoint: Option<String>,
    /// `tracing` filter directive, e.g. `info,soulbase=debug`.
    pub log_filter: Option<String>,
    /// How many distinct tools `soulbase_tool_calls_total` labels by name; calls of
    /// tools past the first this many are counted under `tool="other"`, so a
    /// registry of any size keeps the metric bounded. 0 turns the per-tool
    /// series off. Default 200.
    pub metrics_max_tools: usize,
    /// How many distinct tenants `soulbase_budget_consumed_total` labels by name;
    /// the consumption of tenants past the first this many is counted under
    /// `tenant="other"`. 0 turns the per-tenant series off. Default 200.
    pub metrics_max_tenants: usize,
}

impl Default for ObserveConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            log_filter: None,
            metrics_max_tools: 200,
            metrics_max_tenants: 200,
        }
    }
}

/// Checks whether a tool pattern is well formed: `*`, an exact id, or a prefix ending in `.*`.
fn check_tool_pattern(p: &str) -> Result<(), String> {
    if soulbase_types::ToolPattern::parse(p).is_err() {
        return Err(format!(
            "{p:?} is not a tool pattern (use *, group.*, group.pkg.* or group.pkg.name)"
        ));
    }
    if p == "*" {
        return Ok(());
    }
    let body = p.strip_suffix(".*").unwrap_or(p);
    let ok = !body.is_empty()
        && body.split('.').count() <= 3
        && body.split('.').all(|s| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{p:?} is not a tool pattern (use *, group.*, group.pkg.* or group.pkg.name)"
        ))
    }
}

impl Config {
    /// Semantic checks serde cannot express; returns `(field path, problem)` pairs.
    pub fn validate(&self) -> Vec<(String, String)> {
        let mut problems = self.validate_model();
        let mut push = |path: String, msg: String| problems.push((path, msg));
        if self.server.roles.is_empty() {
            push("server.roles".into(), "must name at least one role".into());
        }
        let unique: BTreeSet<_> = self.server.roles.iter().collect();
        if unique.len() != self.server.roles.len() {
            push("server.roles".into(), "lists a role twice".into());
        }
        if self.server.shutdown_grace_ms > 600_000 {
            push(
                "server.shutdown_grace_ms".into(),
                "must be at most 600000 (10 minutes)".into(),
            );
        }
        self.validate_server_limits(&mut push);
        if let Some(tls) = &self.server.tls {
            for (field, path) in [("cert_file", &tls.cert_file), ("key_file", &tls.key_file)] {
                if path.as_os_str().is_empty() {
                    push(format!("server.tls.{field}"), "must not be empty".into());
                }
            }
        }
        if let Some(id) = &self.server.dev_identity {
            if !self.server.dev_insecure {
                push(
                    "server.dev_identity".into(),
                    "is honoured only with server.dev_insecure: true (development only)".into(),
                );
            }
            if soulbase_types::TenantId::new(id.tenant.as_str()).is_err() {
                push(
                    "server.dev_identity.tenant".into(),
                    "is not a valid tenant id".into(),
                );
            }
            if soulbase_types::ActorId::new(id.actor.as_str()).is_err() {
                push(
                    "server.dev_identity.actor".into(),
                    "is not a valid actor id".into(),
                );
            }
        }
        for (i, o) in self.server.mcp_allowed_origins.iter().enumerate() {
            if !(o == "null" || o.starts_with("http://") || o.starts_with("https://")) {
                push(
                    format!("server.mcp_allowed_origins[{i}]"),
                    "must be an origin with a scheme (https://host[:port]) or null".into(),
                );
            }
        }
        self.validate_tenants(&mut push);
        for (i, sub) in self.skills.subscriptions.iter().enumerate() {
            for (field, value) in [
                ("tenant", &sub.tenant),
                ("actor", &sub.actor),
                ("skill", &sub.skill),
            ] {
                if value.trim().is_empty() {
                    push(
                        format!("skills.subscriptions[{i}].{field}"),
                        "must not be empty".into(),
                    );
                }
            }
        }
        for (field, url) in [
            ("server.remote.auth", &self.server.remote.auth),
            ("server.remote.qos", &self.server.remote.qos),
            ("server.remote.sandbox", &self.server.remote.sandbox),
            ("server.remote.evidence", &self.server.remote.evidence),
        ] {
            if let Some(url) = url
                && !url.starts_with("http://")
            {
                push(
                    field.into(),
                    "must start with http:// (role clients speak plaintext HTTP/2)".into(),
                );
            }
        }
        if self.server.internal_token_env.is_some() && self.server.internal_token_file.is_some() {
            push(
                "server.internal_token_file".into(),
                "set either server.internal_token_env or server.internal_token_file, not both"
                    .into(),
            );
        }
        if self
            .server
            .internal_token_env
            .as_ref()
            .is_some_and(|v| v.trim().is_empty())
        {
            push(
                "server.internal_token_env".into(),
                "must name an environment variable".into(),
            );
        }
        if self.skills.poll_interval_ms < 50 {
            push(
                "skills.poll_interval_ms".into(),
                "must be at least 50".into(),
            );
        }
        if self.evidence.backend == EvidenceBackend::Postgres && self.evidence.url.is_none() {
            push(
                "evidence.url".into(),
                "is required when evidence.backend is postgres".into(),
            );
        }
        if let Some(url) = &self.evidence.url {
            let ok = match self.evidence.backend {
                EvidenceBackend::Postgres => {
                    url.starts_with("postgres://") || url.starts_with("postgresql://")
                }
                EvidenceBackend::Sqlite => url.starts_with("sqlite:"),
            };
            if !ok {
                push(
                    "evidence.url".into(),
                    "does not match evidence.backend (postgres:// or sqlite:)".into(),
                );
            }
        }
        if self.evidence.idempotency_lease_ms < 100 {
            push(
                "evidence.idempotency_lease_ms".into(),
                "must be at least 100".into(),
            );
        }
        if self.evidence.spool_max_bytes.is_some_and(|b| b < 1 << 20) {
            push(
                "evidence.spool_max_bytes".into(),
                "must be at least 1 MiB".into(),
            );
        }
        if self.evidence.retention_days == 0 {
            push(
                "evidence.retention_days".into(),
                "must be at least 1".into(),
            );
        }
        match (&self.quota.backend, &self.quota.redis_url) {
            (QuotaBackend::Redis, None) => push(
                "quota.redis_url".into(),
                "is required when quota.backend is redis".into(),
            ),
            (_, Some(url)) if !(url.starts_with("redis://") || url.starts_with("rediss://")) => {
                push(
                    "quota.redis_url".into(),
                    "must start with redis:// or rediss://".into(),
                )
            }
            _ => {}
        }
        for (i, limit) in self.quota.limits.iter().enumerate() {
            if let Err(e) = check_tool_pattern(&limit.tool) {
                push(format!("quota.limits[{i}].tool"), e);
            }
        }
        for (i, budget) in self.quota.budgets.iter().enumerate() {
            if let Err(e) = check_tool_pattern(&budget.tool) {
                push(format!("quota.budgets[{i}].tool"), e);
            }
            let amounts = [
                budget.calls,
                budget.bytes_in,
                budget.bytes_out,
                budget.cpu_ms,
            ];
            if amounts.iter().all(Option::is_none) {
                push(
                    format!("quota.budgets[{i}]"),
                    "must set at least one of calls, bytes_in, bytes_out, cpu_ms".into(),
                );
            }
        }
        self.validate_auth(&mut push);
        self.validate_sandbox(&mut push);
        for (i, rule) in self.policy.rules.iter().enumerate() {
            if rule.tools.is_empty() {
                push(
                    format!("policy.rules[{i}].tools"),
                    "must list at least one tool pattern".into(),
                );
            }
            for (j, t) in rule.tools.iter().enumerate() {
                if let Err(e) = check_tool_pattern(t) {
                    push(format!("policy.rules[{i}].tools[{j}]"), e);
                }
            }
            if rule.actors.is_empty() {
                push(
                    format!("policy.rules[{i}].actors"),
                    "must list at least one actor or *".into(),
                );
            }
            if rule.effect == PolicyEffect::Deny && !rule.obligations.is_empty() {
                push(
                    format!("policy.rules[{i}].obligations"),
                    "only an allow rule binds what it allows with obligations".into(),
                );
            }
            for (j, ob) in rule.obligations.iter().enumerate() {
                if let Some(why) = ob.pointer_problem() {
                    push(
                        format!("policy.rules[{i}].obligations[{j}].pointer"),
                        why.into(),
                    );
                }
            }
            for (j, a) in rule.actions.iter().enumerate() {
                if a != "*" && !POLICY_ACTIONS.contains(&a.as_str()) {
                    push(
                        format!("policy.rules[{i}].actions[{j}]"),
                        format!(
                            "unknown action {a:?}; one of {}, or *",
                            POLICY_ACTIONS.join(", ")
                        ),
                    );
                }
            }
        }
        problems
    }

    /// `tenants[]`: real tenant ids, each once, not the global tenant; real tool
    /// ids, none both enabled and paused.
    fn validate_tenants(&self, push: &mut impl FnMut(String, String)) {
        let mut seen = BTreeSet::new();
        for (i, t) in self.tenants.iter().enumerate() {
            match soulbase_types::TenantId::new(t.tenant.as_str()) {
                Err(e) => push(format!("tenants[{i}].tenant"), e.reason.to_string()),
                Ok(id) if id == soulbase_types::TenantId::global() => push(
                    format!("tenants[{i}].tenant"),
                    "the global tenant sees every global tool; name a tenant".into(),
                ),
                Ok(_) if !seen.insert(t.tenant.as_str()) => push(
                    format!("tenants[{i}].tenant"),
                    format!("tenant {} is configured twice", t.tenant),
                ),
                Ok(_) => {}
            }
            let lists = [
                ("allow", t.allow.as_deref().unwrap_or_default()),
                ("enable", &t.enable[..]),
                ("pause", &t.pause[..]),
            ];
            for (field, ids) in lists {
                for (j, tool) in ids.iter().enumerate() {
                    if let Err(e) = soulbase_types::ToolId::new(tool.as_str()) {
                        push(format!("tenants[{i}].{field}[{j}]"), e.reason.to_string());
                    }
                }
            }
            for (j, tool) in t.pause.iter().enumerate() {
                if t.enable.contains(tool) {
                    push(
                        format!("tenants[{i}].pause[{j}]"),
                        format!("{tool} is also in enable"),
                    );
                }
            }
        }
    }

    /// The agent loop's section: a usable upstream URL, iteration bounds, tenants.
    fn validate_model(&self) -> Vec<(String, String)> {
        let m = &self.model;
        let mut out = Vec::new();
        if let Some(u) = &m.upstream {
            if !(u.base_url.starts_with("http://") || u.base_url.starts_with("https://")) {
                out.push((
                    "model.upstream.base_url".into(),
                    "must be an http:// or https:// URL".into(),
                ));
            }
            if !(1..=600_000).contains(&u.timeout_ms) {
                out.push((
                    "model.upstream.timeout_ms".into(),
                    "must be between 1 and 600000".into(),
                ));
            }
            if u.api_key_env.as_deref().is_some_and(str::is_empty) {
                out.push((
                    "model.upstream.api_key_env".into(),
                    "must name a variable (or be left out)".into(),
                ));
            }
        }
        if !(1..=100).contains(&m.max_iterations_cap) {
            out.push((
                "model.max_iterations_cap".into(),
                "must be between 1 and 100".into(),
            ));
        }
        if !(1..=10_000).contains(&m.max_tool_calls) {
            out.push((
                "model.max_tool_calls".into(),
                "must be between 1 and 10000".into(),
            ));
        }
        if m.max_tokens == Some(0) {
            out.push((
                "model.max_tokens".into(),
                "must be at least 1 (or left out: no bound)".into(),
            ));
        }
        if m.max_iterations == 0 || m.max_iterations > m.max_iterations_cap {
            out.push((
                "model.max_iterations".into(),
                "must be at least 1 and at most model.max_iterations_cap".into(),
            ));
        }
        for (i, a) in m.allow.iter().enumerate() {
            if a.tenant.is_empty() {
                out.push((
                    format!("model.allow[{i}].tenant"),
                    "must not be empty".into(),
                ));
            }
            if a.models.is_empty() {
                out.push((
                    format!("model.allow[{i}].models"),
                    "must name a model".into(),
                ));
            }
        }
        out
    }

    /// Whether `tenant` may use `model` (`model.allow`).
    pub fn model_allowed(&self, tenant: &str, model: &str) -> bool {
        self.model.allow.iter().any(|a| {
            a.tenant == tenant
                && a.models.iter().any(|p| match p.strip_suffix('*') {
                    Some(prefix) => model.starts_with(prefix),
                    None => p == model,
                })
        })
    }

    /// The server's connection, timeout, body and session limits.
    fn validate_server_limits(&self, push: &mut impl FnMut(String, String)) {
        let s = &self.server;
        let counts: [(&str, u64, u64); 6] = [
            (
                "server.max_connections",
                s.max_connections as u64,
                1_000_000,
            ),
            (
                "server.grpc_max_connections",
                s.grpc_max_connections as u64,
                1_000_000,
            ),
            (
                "server.http2_max_concurrent_streams",
                u64::from(s.http2_max_concurrent_streams),
                100_000,
            ),
            (
                "server.mcp_max_sessions",
                s.mcp_max_sessions as u64,
                1_000_000,
            ),
            (
                "server.mcp_max_sessions_per_tenant",
                s.mcp_max_sessions_per_tenant as u64,
                1_000_000,
            ),
            // 64 KiB .. 1 GiB.
            ("server.max_body_bytes", s.max_body_bytes as u64, 1 << 30),
        ];
        for (field, value, max) in counts {
            let min = if field == "server.max_body_bytes" {
                64 * 1024
            } else {
                1
            };
            if value < min || value > max {
                push(field.into(), format!("must be between {min} and {max}"));
            }
        }
        if s.mcp_max_sessions_per_tenant > s.mcp_max_sessions {
            push(
                "server.mcp_max_sessions_per_tenant".into(),
                "must not exceed server.mcp_max_sessions".into(),
            );
        }
        // Timeouts: at least 10 ms, at most a day (0 is not "off").
        for (field, value) in [
            ("server.header_read_timeout_ms", s.header_read_timeout_ms),
            ("server.body_read_timeout_ms", s.body_read_timeout_ms),
            ("server.idle_timeout_ms", s.idle_timeout_ms),
            (
                "server.http2_keepalive_interval_ms",
                s.http2_keepalive_interval_ms,
            ),
            (
                "server.http2_keepalive_timeout_ms",
                s.http2_keepalive_timeout_ms,
            ),
            ("server.mcp_session_idle_ms", s.mcp_session_idle_ms),
        ] {
            if !(10..=86_400_000).contains(&value) {
                push(
                    field.into(),
                    "must be between 10 and 86400000 (a day)".into(),
                );
            }
        }
        if s.tcp_keepalive_ms != 0 && !(1_000..=86_400_000).contains(&s.tcp_keepalive_ms) {
            push(
                "server.tcp_keepalive_ms".into(),
                "must be 0 (off) or between 1000 and 86400000 (a day)".into(),
            );
        }
    }

    fn validate_auth(&self, push: &mut impl FnMut(String, String)) {
        self.validate_consent(push);
        let mut ids = BTreeSet::new();
        for (i, key) in self.auth.api_keys.iter().enumerate() {
            let field = |f: &str| format!("auth.api_keys[{i}].{f}");
            if key.id.is_empty()
                || !key
                    .id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-')
            {
                push(field("id"), "must be non-empty letters, digits or -".into());
            }
            if !ids.insert(key.id.as_str()) {
                push(field("id"), "is used by another key".into());
            }
            let hex_ok = key.sha256.len() == 64
                && key
                    .sha256
                    .chars()
                    .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
            if !hex_ok {
                push(field("sha256"), "must be 64 lowercase hex digits".into());
            }
            if soulbase_types::TenantId::new(key.tenant.as_str()).is_err() {
                push(field("tenant"), "is not a valid tenant id".into());
            }
            if soulbase_types::ActorId::new(key.actor.as_str()).is_err() {
                push(field("actor"), "is not a valid actor id".into());
            }
        }
        for (i, iss) in self.auth.jwt.iter().enumerate() {
            let field = |f: &str| format!("auth.jwt[{i}].{f}");
            if iss.issuer.is_empty() {
                push(field("issuer"), "must not be empty".into());
            }
            if iss.audience.is_empty() {
                push(field("audience"), "must list at least one audience".into());
            }
            if iss.keys.is_empty() && iss.jwks_file.is_none() {
                push(field("keys"), "must list a key or set jwks_file".into());
            }
            if let Some(t) = &iss.tenant
                && soulbase_types::TenantId::new(t.as_str()).is_err()
            {
                push(field("tenant"), "is not a valid tenant id".into());
            }
            for (j, k) in iss.keys.iter().enumerate() {
                let kf = format!("auth.jwt[{i}].keys[{j}]");
                match k.alg {
                    JwtAlgorithm::HS256 if k.secret_env.is_none() => {
                        push(format!("{kf}.secret_env"), "is required for HS256".into())
                    }
                    JwtAlgorithm::RS256 | JwtAlgorithm::ES256 if k.public_key_pem.is_none() => {
                        push(
                            format!("{kf}.public_key_pem"),
                            "is required for RS256 and ES256".into(),
                        )
                    }
                    _ => {}
                }
            }
        }
    }
}

/// The sandbox: the PolicyConfig side of a call's profile (Grant ∩ Manifest ∩
/// PolicyConfig) and the executors' settings. Capabilities are written in manifest
/// syntax (`{kind: fs, paths: [...], access: [...]}`) and checked by the sandbox when
/// it is built from this section (`IntersectingProfiles::from_config`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    /// The deployment-wide ceiling; `null` (the default) adds no restriction.
    pub ceiling: Option<Vec<serde_json::Value>>,
    /// What tenants without their own grant may do: `[]` (the default) is nothing,
    /// `null` is unrestricted (the manifest and the ceiling alone decide).
    pub default_grant: Option<Vec<serde_json::Value>>,
    /// Per-tenant grants.
    pub grants: Vec<TenantGrant>,
    /// Where WASM modules named by manifests are found; defaults to `skills.dir`.
    pub wasm_module_root: Option<PathBuf>,
    /// Linear memory cap of one WASM call, in bytes (64 KiB ..= 4 GiB).
    pub wasm_max_memory_bytes: u64,
    /// Environment variables HTTP provider headers may reference as `${VAR}`.
    pub http_env_allow: Vec<String>,
    /// Redirects an HTTP call follows (each re-checked); 0 never follows (≤ 10).
    pub http_max_redirects: u32,
    /// Where per-call scratch directories are created; defaults to the system temp dir.
    pub scratch_dir: Option<PathBuf>,
    /// How native (`process`) tools are isolated from the host: `namespaces` (the
    /// default: fresh user, PID, mount, network, IPC and UTS namespaces with a mount
    /// tree of only the granted paths, under Landlock and seccomp; where the host
    /// cannot create them, native tools are refused) or `landlock-only` (Landlock,
    /// seccomp and rlimits without namespaces, for hosts that forbid user namespaces).
    pub process_isolation: String,
    /// How many spare launches of native tools may wait at once (0 ..= 64; 0 turns
    /// them off): after each call the same launch — command, grants, limits — is
    /// built ahead and waits, confined, before `exec`, so the next such call skips
    /// the sandbox's construction. Each waiting spare holds a few processes and a
    /// thread (see `docs/sandbox.md`).
    pub process_spares: u32,
    /// WASM instances one tenant may have running at once (at least 1), so one
    /// tenant cannot take the whole instance pool (64); a call over it is refused
    /// with `QUOTA.RATE_LIMITED`. Defaults to half the pool (32); 64 or more leaves
    /// only the pool's own limit.
    pub wasm_max_instances_per_tenant: u32,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            ceiling: None,
            default_grant: Some(Vec::new()),
            grants: Vec::new(),
            wasm_module_root: None,
            wasm_max_memory_bytes: 64 << 20,
            http_env_allow: Vec::new(),
            http_max_redirects: 0,
            scratch_dir: None,
            process_isolation: "namespaces".into(),
            process_spares: 8,
            wasm_max_instances_per_tenant: 32,
        }
    }
}

/// One tenant's grant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantGrant {
    /// The tenant.
    pub tenant: String,
    /// Its capabilities; `null` is unrestricted.
    pub capabilities: Option<Vec<serde_json::Value>>,
}

impl Config {
    fn validate_consent(&self, push: &mut impl FnMut(String, String)) {
        let c = &self.auth.consent;
        let field = |f: &str| format!("auth.consent.{f}");
        if c.max_ttl_ms == 0 {
            push(field("max_ttl_ms"), "must be greater than 0".into());
        }
        if c.default_ttl_ms == 0 || c.default_ttl_ms > c.max_ttl_ms {
            push(
                field("default_ttl_ms"),
                "must be greater than 0 and at most max_ttl_ms".into(),
            );
        }
        if let Some(key) = &c.public_key {
            let hex_ok = key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit());
            if !hex_ok {
                push(
                    field("public_key"),
                    "must be 64 hex digits (an Ed25519 public key)".into(),
                );
            }
            if c.signing == Some(ConsentSigning::Hmac) {
                push(field("public_key"), "is for `signing: ed25519` only".into());
            }
            if c.key_file.is_some() {
                push(field("public_key"), "cannot be given with key_file".into());
            }
        }
    }

    fn validate_sandbox(&self, push: &mut impl FnMut(String, String)) {
        let sb = &self.sandbox;
        if !(64 << 10..=4 << 30).contains(&sb.wasm_max_memory_bytes) {
            push(
                "sandbox.wasm_max_memory_bytes".into(),
                "must be between 65536 (64 KiB) and 4294967296 (4 GiB)".into(),
            );
        }
        if !matches!(
            sb.process_isolation.as_str(),
            "namespaces" | "landlock-only"
        ) {
            push(
                "sandbox.process_isolation".into(),
                "must be namespaces or landlock-only".into(),
            );
        }
        if sb.process_spares > 64 {
            push("sandbox.process_spares".into(), "must be at most 64".into());
        }
        if sb.wasm_max_instances_per_tenant == 0 {
            push(
                "sandbox.wasm_max_instances_per_tenant".into(),
                "must be at least 1".into(),
            );
        }
        if sb.http_max_redirects > 10 {
            push(
                "sandbox.http_max_redirects".into(),
                "must be at most 10".into(),
            );
        }
        for (i, var) in sb.http_env_allow.iter().enumerate() {
            let ok = !var.is_empty()
                && !var.starts_with(|c: char| c.is_ascii_digit())
                && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                push(
                    format!("sandbox.http_env_allow[{i}]"),
                    format!("{var:?} is not an environment variable name"),
                );
            }
        }
        let mut tenants = BTreeSet::new();
        for (i, g) in sb.grants.iter().enumerate() {
            if g.tenant.trim().is_empty() {
                push(
                    format!("sandbox.grants[{i}].tenant"),
                    "must not be empty".into(),
                );
            } else if !tenants.insert(g.tenant.as_str()) {
                push(
                    format!("sandbox.grants[{i}].tenant"),
                    format!("tenant {} is granted twice", g.tenant),
                );
            }
        }
    }
}
