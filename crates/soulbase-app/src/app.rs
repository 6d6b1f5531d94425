//! Configuration → seams (each local, or the gRPC client of a role served
//! elsewhere, chosen here and nowhere else) → the one invoker and its [`Stack`].
//!
//! Each seam is chosen here from configuration, so a role served elsewhere later
//! only swaps one `Arc<dyn …>` for its gRPC client:
//! authorizer (Cedar when `auth.cedar` is set, else the static rules), quota
//! (`quota.backend`: in-process `LocalQuota` or the shared `RedisQuota`, both
//! following reloads), consent (`auth.consent`: issue, verify, revoke), profiles (Grant ∩ Manifest ∩ PolicyConfig,
//! `IntersectingProfiles::follow` over `sandbox`, following reloads), sandbox
//! (`LocalSandbox`: builtin executor with the example skills' handlers, plus the HTTP, WASM and
//! process executors), evidence (the durable spool sink draining into SQLite or
//! Postgres, [`crate::evidence`]), idempotency (SQL, same database), registry state
//! (restored at start; every change made for a caller committed there first
//! through [`App::admin`], and other replicas' changes followed).
//!
//! With the `tools` role, the skills directory (`skills.dir`, `SKILLS_DIR`,
//! `./skills`) is loaded into the registry at start ([`Skills`]), watched when
//! `skills.watch` is set, and its [`SkillTerms`] (cross-skill imports,
//! subscriptions, per-tool rate limits) are a seam of the one invoker. Every
//! surface calls through [`App::stack`].

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use soulbase_auth::{
    Authenticator, Authorizer, CedarPolicy, ConsentKeys, ConsentRequests, ConsentRevocations,
    ConsentService, ConsentVerifier, Ed25519Consent, HmacConsent, MemoryConsentRequests,
    MemoryRevocations, StaticPolicy, new_token_id,
};
use soulbase_config::{
    Config, ConfigHandle, ConfigLoader, ConsentSigning, QuotaBackend, QuotaLimit, ReloadStatus,
    Role,
};
use soulbase_edge::{ConsentDesk, MetadataAuth, SpanMaker, Stack, SubjectResolver};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_grpc::roles::role_channel;
use soulbase_grpc::{
    AuthRoleService, EvidenceRoleService, QosRoleService, RemoteAuth, RemoteEvidence,
    RemoteQuotaGate, RemoteSandbox, SandboxRoleService,
};
use soulbase_observe::{AuditLog, EvidenceSink, EvidenceStore};
use soulbase_qos::{LocalQuota, QuotaGate, QuotaPlan};
use soulbase_qos_redis::{RedisQuota, RedisQuotaOptions};
use soulbase_sandbox::{
    BuiltinExecutor, IntersectingProfiles, LocalSandbox, ProviderKind, Sandbox,
};
use soulbase_sandbox_http::{HttpExecutor, HttpOptions};
use soulbase_sandbox_process::{ProcessExecutor, ProcessOptions};
use soulbase_sandbox_wasm::{WasmExecutor, WasmOptions};
use soulbase_skills::{
    CatalogOptions, ReloadReport, SkillCatalog, SkillTerms, SkillWatcher, StaticSubscriptions,
};
use soulbase_store::{Persistence, SqlConsentRequests, SqlConsentRevocations};
use soulbase_tools::Registry;
use soulbase_tools::pipeline::{IdempotencyStore, Invoker, InvokerBuilder, MemoryIdempotency};
use soulbase_tools::registry::admin::RegistryAdmin;
use soulbase_types::{ActorId, Subject, TenantId};

use crate::audit::{self, AuditTrail};
use crate::builtins;
use crate::evidence::{self, EvidenceFlush};
use crate::metrics::Metrics;

/// The environment variable holding the consent HMAC key (hex, ≥ 32 bytes): with
/// `auth.consent.signing` unset it selects HMAC signing with this key.
pub const CONSENT_KEY_ENV: &str = "SOULBASED_CONSENT_HMAC_KEY";

/// The skills subsystem of a `tools` server.
pub struct Skills {
    /// The live catalog (loaded into [`App::registry`]).
    pub catalog: SkillCatalog,
    /// The skills' terms, held by the invoker on every call.
    pub terms: Arc<SkillTerms>,
    /// `skills.subscriptions`, following configuration reloads.
    pub subscriptions: Arc<StaticSubscriptions>,
    /// The directory watcher (`skills.watch`); dropping it stops watching.
    _watcher: Option<SkillWatcher>,
}

impl std::fmt::Debug for Skills {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Skills")
            .field("catalog", &self.catalog)
            .finish_non_exhaustive()
    }
}

/// What the binary adds to the assembly.
#[derive(Default)]
pub struct Options {
    /// Makes the span each invocation runs in (the server's OpenTelemetry
    /// `execute_tool` span); none for the CLI.
    pub span: Option<SpanMaker>,
}

/// Everything the servers share.
pub struct App {
    /// The configuration in force.
    pub config: ConfigHandle,
    /// The configuration the process started with: what its start-up-only keys
    /// still hold (see [`App::needs_restart`]).
    pub started: Arc<soulbase_config::ConfigSnapshot>,
    /// The loader (file, environment, flags) used for reloads.
    pub loader: ConfigLoader,
    /// The tool registry. Read it freely; change it for a caller only through
    /// [`App::admin`] — a change made on it directly is neither persisted nor
    /// seen by other replicas.
    pub registry: Registry,
    /// Changes to it on someone's behalf: persisted first (shared with the other
    /// replicas on Postgres), then applied.
    pub admin: RegistryAdmin,
    /// The governed invoker.
    pub invoker: Invoker,
    /// The one outer stack around it that every surface calls.
    pub stack: Stack,
    /// Authorizes calls and registry writes.
    pub authorizer: Arc<dyn Authorizer>,
    /// Issues and revokes consent tokens (`auth.consent`) for every surface.
    pub consent_desk: ConsentDesk,
    /// Maps request metadata to subjects.
    pub auth: Arc<dyn SubjectResolver>,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// False until serving, and again once shutdown begins.
    pub ready: AtomicBool,
    /// Whether `server.dev_insecure` was set at start-up.
    pub dev_insecure: bool,
    /// The skills, when the `tools` role runs and a skills directory exists.
    pub skills: Option<Skills>,
    /// The `auth` role's gRPC service, when this process serves it.
    pub auth_role: Option<AuthRoleService>,
    /// The `qos` role's gRPC service, when this process serves it.
    pub qos_role: Option<QosRoleService>,
    /// The `sandbox` role's gRPC service, when this process serves it.
    pub sandbox_role: Option<SandboxRoleService>,
    /// The `evidence` role's gRPC service, when this process serves it.
    pub evidence_role: Option<EvidenceRoleService>,
    /// Evidence, idempotency and registry persistence (with the `tools` or
    /// `evidence` role).
    pub persistence: Option<Arc<Persistence>>,
    /// The audit of changes — registry (through [`App::admin`]), skill states
    /// and set, configuration reloads — kept with the evidence database (memory
    /// without one). Read it with `list`.
    pub audit: Arc<dyn AuditLog>,
    /// What the audit last recorded of the configuration and the skills.
    trail: AuditTrail,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").finish_non_exhaustive()
    }
}

fn consent_file_error(what: &str) -> SoulError {
    SoulError::new(ErrorCode::ConfigInvalid, "the consent key is invalid")
        .with_field("field", "auth.consent.key_file")
        .with_note(what.to_owned())
}

/// The key in `auth.consent.key_file` (hex), or `None` when unset.
fn consent_key_file(cfg: &Config) -> Result<Option<Vec<u8>>, SoulError> {
    let Some(path) = &cfg.auth.consent.key_file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        consent_file_error(&format!("reading {}: {e}", path.display())).with_source(e)
    })?;
    decode_hex(text.trim())
        .map(Some)
        .ok_or_else(|| consent_file_error("the file must hold the key in hex"))
}

/// 32 bytes no one can predict, for a key that lives as long as the process.
fn random_32() -> [u8; 32] {
    let hex = format!("{}{}", new_token_id(), new_token_id());
    decode_hex(&hex)
        .and_then(|b| b.try_into().ok())
        .unwrap_or_else(|| unreachable!("two token ids are 32 bytes of hex"))
}

/// The keys consent tokens are signed and verified with (`auth.consent`).
fn consent_keys(cfg: &Config) -> Result<ConsentKeys, SoulError> {
    let c = &cfg.auth.consent;
    let env_key = std::env::var(CONSENT_KEY_ENV).ok();
    let signing = c.signing.unwrap_or(if env_key.is_some() {
        ConsentSigning::Hmac
    } else {
        ConsentSigning::Ed25519
    });
    if let Some(public) = &c.public_key {
        let bytes: [u8; 32] = decode_hex(public)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| {
                SoulError::new(
                    ErrorCode::ConfigInvalid,
                    "the consent public key is invalid",
                )
                .with_field("field", "auth.consent.public_key")
            })?;
        return Ok(ConsentKeys::Ed25519(Box::new(Ed25519Consent::verifier(
            &bytes,
        )?)));
    }
    let file_key = consent_key_file(cfg)?;
    Ok(match signing {
        ConsentSigning::Hmac => {
            let key = match (file_key, env_key) {
                (Some(k), _) => Some(k),
                (None, Some(hex_key)) => decode_hex(hex_key.trim()),
                (None, None) => None,
            };
            match key {
                Some(k) if k.len() >= 32 => ConsentKeys::Hmac(HmacConsent::new(k)),
                Some(_) => {
                    return Err(consent_file_error(
                        "an HMAC consent key must be at least 32 bytes (64 hex digits)",
                    ));
                }
                None => {
                    tracing::warn!(
                        "auth.consent: no HMAC key (auth.consent.key_file or ${CONSENT_KEY_ENV}): \
                         a key of this process signs consent, and no other process verifies it"
                    );
                    ConsentKeys::Hmac(HmacConsent::new(random_32().to_vec()))
                }
            }
        }
        ConsentSigning::Ed25519 => match file_key {
            Some(k) => {
                let seed: [u8; 32] = k.try_into().map_err(|_| {
                    consent_file_error("an Ed25519 consent key is a 32-byte seed (64 hex digits)")
                })?;
                ConsentKeys::Ed25519(Box::new(Ed25519Consent::from_seed(&seed)))
            }
            None => {
                tracing::info!(
                    "auth.consent: no key_file, so consent is signed with a key of this process: \
                     its tokens verify here until restart"
                );
                ConsentKeys::Ed25519(Box::new(Ed25519Consent::from_seed(&random_32())))
            }
        },
    })
}

/// Where revoked consent token ids are kept: with the evidence database, which
/// replicas share. A process without persistence (an `auth`-only role) uses the
/// configured Postgres database when there is one (connected lazily), else keeps
/// them in memory: it has no data directory of its own to put SQLite in.
async fn consent_revocations(
    cfg: &Config,
    persistence: Option<&Arc<Persistence>>,
) -> Result<Arc<dyn ConsentRevocations>, SoulError> {
    if let Some(p) = persistence {
        return Ok(Arc::new(SqlConsentRevocations::new(p.db.clone())));
    }
    let url = soulbase_store::database_url(cfg);
    if url.starts_with("sqlite:") {
        tracing::info!(
            "consent revocations are kept in memory here: give this process the evidence \
             database (evidence.url) to share them with the tools processes"
        );
        return Ok(Arc::new(MemoryRevocations::default()));
    }
    let db = soulbase_store::Db::connect(&url, cfg.evidence.migrate_on_start).await?;
    Ok(Arc::new(SqlConsentRevocations::new(db)))
}

/// Where consent requests are kept: with the evidence database, which replicas
/// share, like revocations (a process without persistence uses the configured
/// Postgres database when there is one, else memory — it serves no calls that
/// open requests anyway).
async fn consent_requests(
    cfg: &Config,
    persistence: Option<&Arc<Persistence>>,
) -> Result<Arc<dyn ConsentRequests>, SoulError> {
    if let Some(p) = persistence {
        return Ok(Arc::new(SqlConsentRequests::new(p.db.clone())));
    }
    let url = soulbase_store::database_url(cfg);
    if url.starts_with("sqlite:") {
        return Ok(Arc::new(MemoryConsentRequests::default()));
    }
    let db = soulbase_store::Db::connect(&url, cfg.evidence.migrate_on_start).await?;
    Ok(Arc::new(SqlConsentRequests::new(db)))
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
        .collect()
}

impl App {
    /// Builds the seams from `loader`'s configuration. Must run inside a Tokio
    /// runtime: with the `tools` or `evidence` role it opens persistence (database,
    /// spool recovery, drainer), and with `tools` restores the registry. Role
    /// services are built only behind the internal token (or `dev_insecure`).
    /// Returns the app and the evidence flush handle for shutdown.
    pub async fn build(
        loader: ConfigLoader,
        options: Options,
    ) -> Result<(Arc<App>, EvidenceFlush), SoulError> {
        let loader = loader.with_check(sandbox_check);
        let snapshot = loader.load().map_err(|e| {
            SoulError::new(ErrorCode::ConfigInvalid, "the configuration is invalid")
                .with_note(e.to_string())
        })?;
        let config = ConfigHandle::new(snapshot);
        let snap = config.current();
        let cfg = snap.config();
        let roles = &cfg.server.roles;
        let token = internal_token(cfg)?;
        // A role not served here is reached at its configured address; without
        // one it runs in-process behind the tools role.
        let remote_auth = match (&cfg.server.remote.auth, roles.contains(&Role::Auth)) {
            (Some(url), false) => Some(RemoteAuth::new(
                role_channel(url, "server.remote.auth")?,
                token.clone(),
            )),
            _ => None,
        };
        let remote_qos = match (&cfg.server.remote.qos, roles.contains(&Role::Qos)) {
            (Some(url), false) => Some(RemoteQuotaGate::new(
                role_channel(url, "server.remote.qos")?,
                token.clone(),
            )),
            _ => None,
        };
        let (quota, local_gate): (Arc<dyn QuotaGate>, Option<LocalGate>) = match &remote_qos {
            Some(r) => (Arc::new(r.clone()), None),
            None => {
                let l = local_quota(cfg, &config)?;
                (l.gate(), Some(l))
            }
        };
        let remote_sandbox = match (&cfg.server.remote.sandbox, roles.contains(&Role::Sandbox)) {
            (Some(url), false) => Some(RemoteSandbox::new(
                role_channel(url, "server.remote.sandbox")?,
                token.clone(),
            )),
            _ => None,
        };
        let remote_evidence = match (&cfg.server.remote.evidence, roles.contains(&Role::Evidence)) {
            (Some(url), false) => Some(RemoteEvidence::new(
                role_channel(url, "server.remote.evidence")?,
                token.clone(),
            )),
            _ => None,
        };
        let registry = Registry::new();
        let executor = BuiltinExecutor::new();
        let tools_role = roles.contains(&Role::Tools);
        let sandbox_role = roles.contains(&Role::Sandbox);
        let evidence_role = roles.contains(&Role::Evidence);
        // Calls execute here when this process serves the sandbox role, or runs
        // the tools role with no remote sandbox.
        let executes_here = sandbox_role || (tools_role && remote_sandbox.is_none());
        let fixtures = cfg.server.mcp_conformance_tools;
        if executes_here {
            builtins::register_handlers(&executor);
            soulbase_skills::examples::register(&executor);
            if fixtures {
                crate::conformance::register_handlers(&executor);
            }
        }
        if tools_role {
            builtins::register_tools(&registry)?;
            if fixtures {
                crate::conformance::register_tools(&registry)?;
            }
        }
        registry.set_configured(crate::tenants::configured(cfg));
        // Every seam that depends on the configuration follows its handle: an
        // accepted reload is picked up on the next decision, in one style.
        let local_authorizer: Arc<dyn Authorizer> = match &cfg.auth.cedar {
            Some(_) => Arc::new(CedarPolicy::follow(config.clone())?),
            None => Arc::new(StaticPolicy::follow(config.clone())),
        };
        let authenticator = Arc::new(Authenticator::follow(config.clone())?);
        let dev_insecure = cfg.server.dev_insecure;
        if dev_insecure {
            tracing::warn!(
                "server.dev_insecure is set: x-soulbase-tenant / x-soulbase-actor headers are trusted as identity"
            );
        }
        let consent_keys = consent_keys(cfg)?;
        let authorizer: Arc<dyn Authorizer> = match &remote_auth {
            Some(r) => Arc::new(r.clone()),
            None => local_authorizer.clone(),
        };
        // Role services answer other processes without a caller identity of their
        // own: they are served only behind the internal token (or in development).
        // Without one, a tools process runs its roles in-process and serves none.
        let expose_roles = token.is_some() || cfg.server.dev_insecure;
        if !expose_roles && !tools_role {
            return Err(SoulError::new(
                ErrorCode::ConfigInvalid,
                "a process serving only role services must require the internal token \
                 (server.internal_token_env or server.internal_token_file)",
            )
            .with_field("field", "server.internal_token_env"));
        }
        let qos_role = match (roles.contains(&Role::Qos) && expose_roles, &local_gate) {
            (true, Some(q)) => Some(QosRoleService::new(q.gate(), token.clone())),
            _ => None,
        };
        let serves_roles = roles.iter().any(|r| *r != Role::Tools);
        if serves_roles && !expose_roles {
            tracing::info!(
                "auth/qos/sandbox/evidence run in-process only: set \
                 server.internal_token_env or server.internal_token_file to serve them to other processes"
            );
        } else if serves_roles && token.is_none() {
            tracing::warn!(
                "server.dev_insecure: role services are served without an internal token"
            );
        }
        if remote_auth.is_some()
            || remote_qos.is_some()
            || remote_sandbox.is_some()
            || remote_evidence.is_some()
        {
            let r = &cfg.server.remote;
            tracing::info!(
                auth = ?r.auth.as_ref().filter(|_| remote_auth.is_some()),
                qos = ?r.qos.as_ref().filter(|_| remote_qos.is_some()),
                sandbox = ?r.sandbox.as_ref().filter(|_| remote_sandbox.is_some()),
                evidence = ?r.evidence.as_ref().filter(|_| remote_evidence.is_some()),
                "using remote roles"
            );
        }
        // Credentials are checked where the keys are: by the auth role when it is
        // remote, so the tools process needs no `auth` configuration of its own.
        // Validated at load: only with dev_insecure, with valid ids.
        let dev_default = cfg.server.dev_identity.as_ref().and_then(|d| {
            Some(Subject::new(
                TenantId::new(d.tenant.as_str()).ok()?,
                ActorId::new(d.actor.as_str()).ok()?,
            ))
        });
        if let Some(s) = &dev_default {
            tracing::warn!(
                tenant = %s.tenant,
                actor = %s.actor,
                "server.dev_identity is set: requests naming no one act as this identity"
            );
        }
        let auth: Arc<dyn SubjectResolver> = Arc::new(
            match &remote_auth {
                Some(r) => MetadataAuth::remote(Arc::new(r.clone()), dev_insecure),
                None => MetadataAuth::new(Some(authenticator.clone()), dev_insecure),
            }
            .with_dev_default(dev_default),
        );
        if remote_auth.is_some() && (!cfg.auth.api_keys.is_empty() || !cfg.auth.jwt.is_empty()) {
            tracing::warn!(
                "auth.api_keys / auth.jwt are not used here: the remote auth role checks \
                 every credential, so configure them there"
            );
        }
        // Follows reloads: grants and ceiling are read again on the next call.
        let profiles = Arc::new(IntersectingProfiles::follow(config.clone())?);
        let local_sandbox = Arc::new(sandbox(cfg, executor, executes_here)?);
        let sandbox: Arc<dyn Sandbox> = match &remote_sandbox {
            Some(r) => Arc::new(r.clone()),
            None => local_sandbox.clone(),
        };
        let sandbox_role = (sandbox_role && expose_roles)
            .then(|| SandboxRoleService::new(local_sandbox, profiles.clone(), token.clone()));
        let (sink, idempotency, persistence, flush, shared): (
            Arc<dyn EvidenceSink>,
            Arc<dyn IdempotencyStore>,
            _,
            _,
            _,
        ) = if tools_role || evidence_role {
            let drain_to = remote_evidence
                .clone()
                .filter(|_| tools_role)
                .map(|r| Arc::new(r) as Arc<dyn EvidenceStore>);
            let opened = evidence::open(cfg, drain_to).await?;
            // Only the tools role keeps the registry: a process without it must
            // never write the shared one.
            let shared =
                tools_role.then(|| evidence::registry_admin(&opened.persistence, &registry));
            let flush = EvidenceFlush::start(&opened, shared.as_ref(), cfg.evidence.retention_days);
            (
                Arc::new(opened.sink.clone()),
                opened.persistence.idempotency.clone(),
                Some(opened.persistence.clone()),
                flush,
                shared,
            )
        } else {
            (
                Arc::new(evidence::NoEvidence),
                Arc::new(MemoryIdempotency::new()),
                None,
                EvidenceFlush::none(),
                None,
            )
        };
        let audit = audit::open_log(cfg, persistence.as_ref()).await?;
        let admin = shared
            .unwrap_or_else(|| RegistryAdmin::in_memory(registry.clone()))
            .with_audit(audit.clone());
        // Consent is issued and revoked here, and verified here unless the auth
        // role is remote; revocations live with the evidence, shared by replicas.
        let consent_service = Arc::new(ConsentService::new(
            consent_keys,
            consent_revocations(cfg, persistence.as_ref()).await?,
            cfg.auth.consent.max_ttl_ms,
            cfg.auth.consent.default_ttl_ms,
        ));
        let consent_requests = consent_requests(cfg, persistence.as_ref()).await?;
        let consent: Arc<dyn ConsentVerifier> = match &remote_auth {
            Some(r) => Arc::new(r.clone()),
            None => consent_service.clone(),
        };
        let auth_role = (roles.contains(&Role::Auth) && expose_roles).then(|| {
            AuthRoleService::new(
                authenticator.clone(),
                local_authorizer.clone(),
                consent_service.clone(),
                token.clone(),
            )
        });
        let evidence_role = match (evidence_role && expose_roles, &persistence) {
            (true, Some(p)) => Some(EvidenceRoleService::new(p.evidence.clone(), token.clone())),
            _ => None,
        };
        let metrics = Arc::new(
            Metrics::with_max_tools(cfg.observe.metrics_max_tools)
                .max_tenants(cfg.observe.metrics_max_tenants),
        );
        metrics.watch_evidence(flush.stats());
        let skills = if tools_role {
            let tools_redis = match &local_gate {
                Some(LocalGate::Redis(q)) => Some(q.as_ref()),
                _ => None,
            };
            start_skills(cfg, &config, &registry, tools_redis)?
        } else {
            None
        };
        // The stored registry, once the builtins and skills it may hold states of
        // are loaded.
        if let (true, Some(p)) = (tools_role, &persistence) {
            evidence::restore_registry(p, &admin).await?;
        }
        let invoker = InvokerBuilder::new(
            Arc::new(registry.clone()),
            authorizer.clone(),
            quota,
            consent,
            profiles,
            sandbox,
            sink,
            idempotency,
        )
        .follow_config(config.clone())
        .consent_requests(consent_requests.clone());
        let invoker = match &skills {
            Some(s) => invoker.terms(s.terms.clone()),
            None => invoker,
        };
        let invoker = match builtins::fault_hook_from_env() {
            Some(hook) => invoker.fault_hook(hook),
            None => invoker,
        }
        .build();
        // The one outer stack every surface serves calls through.
        let stack = Stack::builder(invoker.clone())
            .observer(metrics.clone())
            .trust_dev_skills(dev_insecure);
        let stack = match options.span {
            Some(span) => stack.span(span),
            None => stack,
        }
        .build();
        let consent_desk = ConsentDesk::new(
            registry.clone(),
            consent_service,
            authorizer.clone(),
            metrics.clone(),
            consent_requests,
            audit.clone(),
        );
        let trail = AuditTrail::new(
            audit.clone(),
            &loader,
            config.current(),
            skills.as_ref().map(|s| &s.catalog),
        );
        let app = Arc::new(App {
            started: config.current(),
            config,
            loader,
            registry,
            admin,
            invoker,
            stack,
            authorizer,
            consent_desk,
            auth,
            metrics,
            ready: AtomicBool::new(false),
            dev_insecure,
            skills,
            auth_role,
            qos_role,
            sandbox_role,
            evidence_role,
            persistence,
            audit,
            trail,
        });
        app.audit_skill_reloads();
        Ok((app, flush))
    }

    /// The keys whose accepted value differs from the one this process started
    /// with and that only a restart applies (`soulbase_config::reference`): every
    /// other seam follows the configuration handle itself (policy, Cedar,
    /// credentials, quotas, subscriptions, the hash recorded in evidence).
    pub fn needs_restart(&self) -> Vec<String> {
        soulbase_config::reference::restart_changes(
            self.started.config(),
            self.config.current().config(),
        )
    }

    /// Applies what the registry takes from the configuration (the tenants'
    /// views), and warns about each accepted change that waits for a restart.
    pub fn apply_current(&self) {
        self.registry
            .set_configured(crate::tenants::configured(self.config.current().config()));
        for key in self.needs_restart() {
            tracing::warn!(key, "configuration changed: takes effect after a restart");
        }
    }

    /// Watches the configuration file (and polls) with `loader`, applying every
    /// accepted snapshot to the seams; dropping the returned watcher stops watching.
    /// What a long-running process (the server, an MCP stdio session) starts once.
    pub fn follow_config(self: &Arc<Self>, loader: ConfigLoader) -> soulbase_config::ConfigWatcher {
        let poll = Duration::from_millis(self.config.current().config().skills.poll_interval_ms);
        let loader = loader.with_check(sandbox_check);
        let watcher = soulbase_config::watch(self.config.clone(), loader, poll);
        let mut status = self.config.subscribe();
        let follower = self.clone();
        tokio::spawn(async move {
            while status.changed().await.is_ok() {
                let s = status.borrow_and_update().clone();
                tracing::info!(status = ?s, "configuration reload");
                follower.trail.config_changed(&follower.config).await;
                follower.apply_current();
            }
        });
        watcher
    }

    /// Re-reads the configuration now for `by` and applies it when valid (the
    /// loader's checks include [`sandbox_check`]); an accepted change is audited
    /// as `by`'s (`config.reload`).
    pub async fn reload(&self, by: &Subject) -> ReloadStatus {
        let status = self
            .trail
            .reload_config(&self.config, &self.loader, by)
            .await;
        self.apply_current();
        status
    }

    /// Re-reads the skills directory now for `by` (off the async workers); a
    /// change of the loaded skills is audited as `by`'s (`skills.reload`).
    /// `None` without skills.
    pub async fn reload_skills(&self, by: &Subject) -> Option<Result<ReloadReport, SoulError>> {
        let s = self.skills.as_ref()?;
        Some(self.trail.reload_skills(&s.catalog, by).await)
    }

    /// Enables or disables skill `name` for `by` (see
    /// `SkillCatalog::set_enabled`), audited as `skill.enable` /
    /// `skill.disable` when its state changed. `TOOL.NOT_FOUND` without skills
    /// or without that skill. The caller authorizes `by` first.
    pub async fn set_skill_enabled(
        &self,
        by: &Subject,
        name: &str,
        enabled: bool,
    ) -> Result<(), SoulError> {
        let s = self.skills.as_ref().ok_or_else(audit::no_skills)?;
        self.trail
            .set_skill_enabled(&s.catalog, by, name, enabled)
            .await
    }

    /// Audits, as the system's, each change of the loaded skills that a reload
    /// not made through [`App::reload_skills`] (the directory watcher) makes.
    fn audit_skill_reloads(self: &Arc<Self>) {
        let Some(s) = &self.skills else { return };
        let mut reloads = s.catalog.reloads();
        let app = Arc::downgrade(self);
        tokio::spawn(async move {
            while reloads.changed().await.is_ok() {
                let Some(app) = app.upgrade() else { return };
                if let Some(s) = &app.skills {
                    app.trail.skills_changed(&s.catalog).await;
                }
            }
        });
    }

    /// Offers the evidence spool's quarantine to the store again for `by`,
    /// through the running sink's drainer (see [`evidence::retry_quarantine`]);
    /// audited as `by`'s (`evidence.quarantine_retry`) when the file changed.
    /// `EVIDENCE.UNAVAILABLE` in a process without an evidence spool. The caller
    /// authorizes `by` first.
    pub async fn retry_quarantine(
        &self,
        by: &Subject,
    ) -> Result<soulbase_evidence::quarantine::RequeueReport, SoulError> {
        let Some(p) = &self.persistence else {
            return Err(SoulError::new(
                ErrorCode::EvidenceUnavailable,
                "this process has no evidence spool (it serves neither the tools nor the \
                 evidence role), so it has no quarantine to offer again",
            )
            .with_field("spool", "none"));
        };
        let file = soulbase_store::spool_dir(self.started.config())
            .join(soulbase_evidence::quarantine::QUARANTINE_FILE)
            .display()
            .to_string();
        evidence::retry_quarantine(p, self.audit.clone(), by, file).await
    }

    /// Whether the server accepts new work.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Marks the server ready or draining.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }
}

/// The local sandbox: builtin handlers, and when calls execute here (the `sandbox`
/// role, or the `tools` role without a remote sandbox) the HTTP, WASM (modules
/// under `sandbox.wasm_module_root`, else `skills.dir`) and process executors.
/// Without a module root the WASM executor is left out (its calls answer
/// `PROVIDER.UNAVAILABLE`) unless the root was configured explicitly, which then
/// refuses start-up.
fn sandbox(
    cfg: &soulbase_config::Config,
    builtin: BuiltinExecutor,
    executes_here: bool,
) -> Result<LocalSandbox, SoulError> {
    let mut sandbox = LocalSandbox::new(builtin);
    if !executes_here {
        return Ok(sandbox);
    }
    let sb = &cfg.sandbox;
    sandbox = sandbox
        .with_executor(
            ProviderKind::Http,
            Arc::new(HttpExecutor::new(HttpOptions::from_config(sb))),
        )
        .with_executor(
            ProviderKind::Process,
            Arc::new(ProcessExecutor::new(ProcessOptions::from_config(sb))),
        );
    match WasmExecutor::new(WasmOptions::from_config(sb, &cfg.skills.dir)) {
        Ok(w) => Ok(sandbox.with_executor(ProviderKind::Wasm, Arc::new(w))),
        Err(e) if sb.wasm_module_root.is_none() => {
            tracing::warn!(
                error = %e,
                dir = %cfg.skills.dir.display(),
                "no WASM module root: WASM tools are unavailable"
            );
            Ok(sandbox)
        }
        Err(e) => Err(SoulError::new(
            ErrorCode::ConfigInvalid,
            "sandbox.wasm_module_root is not usable",
        )
        .with_field("field", "sandbox.wasm_module_root")
        .with_note(e.to_string())),
    }
}

/// The check every load of the configuration gets ([`soulbase_config::ConfigLoader::with_check`]):
/// the sandbox grants, default grant and ceiling must compile into profiles — a
/// capability the profiles would refuse rejects the snapshot at start-up, in the
/// file watcher and on an explicit reload, naming its field
/// (`sandbox.grants[0].capabilities[1].hosts[0]`).
pub fn sandbox_check(cfg: &soulbase_config::Config) -> Vec<(String, String)> {
    match IntersectingProfiles::from_config(&cfg.sandbox) {
        Ok(_) => Vec::new(),
        Err(e) => {
            let path = e.field("field").unwrap_or("sandbox").to_owned();
            let causes = e.audit().causes.join("; ");
            let message = causes
                .strip_prefix(&format!("{path}: "))
                .unwrap_or(&causes)
                .to_owned();
            vec![(path, message)]
        }
    }
}

/// The in-process quota backend of `quota.backend`.
#[derive(Clone)]
enum LocalGate {
    Memory(Arc<LocalQuota>),
    Redis(Arc<RedisQuota>),
}

impl LocalGate {
    fn gate(&self) -> Arc<dyn QuotaGate> {
        match self {
            LocalGate::Memory(q) => q.clone(),
            LocalGate::Redis(q) => q.clone(),
        }
    }
}

/// The in-process quota backend of `quota.backend`, following the configuration.
fn local_quota(
    cfg: &soulbase_config::Config,
    config: &ConfigHandle,
) -> Result<LocalGate, SoulError> {
    Ok(match cfg.quota.backend {
        QuotaBackend::Memory => LocalGate::Memory(Arc::new(LocalQuota::follow(config.clone()))),
        // Connects on the first decision: start-up does not wait for Redis.
        QuotaBackend::Redis => LocalGate::Redis(Arc::new(RedisQuota::follow(
            RedisQuotaOptions::from_config(&cfg.quota)?,
            config.clone(),
        )?)),
    })
}

/// The skills' terms enforcing their per-tool rate limits where the tool
/// quotas are: with `quota.backend: redis`, in the same Redis under a key prefix of
/// their own, so every replica shares them; otherwise in this process. `tools` is
/// the tool quotas' Redis backend when it runs in this process: the skills' limits
/// then share its connection, so a call finding Redis down waits for it once.
fn with_skill_rates(
    terms: SkillTerms,
    cfg: &soulbase_config::Config,
    tools: Option<&RedisQuota>,
) -> Result<SkillTerms, SoulError> {
    if cfg.quota.backend != QuotaBackend::Redis {
        return Ok(terms);
    }
    let no_limits = QuotaPlan::new(&[], &[]);
    let redis = Arc::new(match tools {
        Some(tools) => tools.sharing(format!("{}skills:", tools.prefix()), no_limits),
        None => {
            let mut options = RedisQuotaOptions::from_config(&cfg.quota)?;
            options.prefix.push_str("skills:");
            RedisQuota::new(options, no_limits)?
        }
    });
    let sync = redis.clone();
    Ok(terms.with_quota(
        redis,
        Some(Arc::new(move |limits: &[QuotaLimit]| sync.update(limits))),
    ))
}

/// The internal token of the role services: from the file named by
/// `server.internal_token_file`, or the variable named by
/// `server.internal_token_env` (which must then be set and non-empty).
fn internal_token(cfg: &soulbase_config::Config) -> Result<Option<String>, SoulError> {
    if let Some(file) = &cfg.server.internal_token_file {
        return soulbase_config::read_secret_file(file)
            .map(Some)
            .map_err(|why| {
                SoulError::new(
                    ErrorCode::ConfigInvalid,
                    format!("server.internal_token_file: {why}"),
                )
                .with_field("field", "server.internal_token_file")
            });
    }
    let Some(var) = &cfg.server.internal_token_env else {
        return Ok(None);
    };
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Ok(Some(v.trim().to_owned())),
        _ => Err(SoulError::new(
            ErrorCode::ConfigInvalid,
            format!("server.internal_token_env names {var}, which is not set"),
        )
        .with_field("field", "server.internal_token_env")),
    }
}

/// Loads the skills directory into `registry` and builds the skills' terms. A missing
/// *default* directory (`./skills`) only logs a warning (no skills are served); a
/// configured directory that is missing or unusable refuses start-up.
fn start_skills(
    cfg: &soulbase_config::Config,
    config: &ConfigHandle,
    registry: &Registry,
    tools_redis: Option<&RedisQuota>,
) -> Result<Option<Skills>, SoulError> {
    let dir = &cfg.skills.dir;
    if !dir.exists() && dir.as_path() == Path::new("./skills") {
        tracing::warn!(dir = %dir.display(), "no skills directory: serving without skills");
        return Ok(None);
    }
    // The same options `soulbase skills check` validates with.
    let options = CatalogOptions::for_config(cfg);
    let (catalog, _report) = SkillCatalog::open(registry.clone(), options).map_err(|e| {
        SoulError::new(
            ErrorCode::ConfigInvalid,
            "skills.dir is not a usable skills directory",
        )
        .with_field("field", "skills.dir")
        .with_note(e.to_string())
    })?;
    // The catalog has logged each refused file (path, line, reason).
    tracing::info!(
        dir = %dir.display(),
        skills = catalog.current().len(),
        "skills loaded"
    );
    let subscriptions = Arc::new(StaticSubscriptions::follow(config.clone()));
    let terms = SkillTerms::new(catalog.clone()).with_subscriptions(subscriptions.clone());
    let terms = with_skill_rates(terms, cfg, tools_redis)?;
    let watcher = cfg.skills.watch.then(|| {
        soulbase_skills::watch(
            catalog.clone(),
            Duration::from_millis(cfg.skills.poll_interval_ms),
        )
    });
    Ok(Some(Skills {
        catalog,
        terms: Arc::new(terms),
        subscriptions,
        _watcher: watcher,
    }))
}

#[cfg(test)]
mod tests {
    use super::{consent_keys, decode_hex};
    use soulbase_auth::{ConsentGrant, ConsentIssuer, ConsentKeys, Ed25519Consent};
    use soulbase_config::{Config, ConsentSigning, TlsConfig};
    use soulbase_errors::ErrorCode;
    use soulbase_types::{ActorId, Subject, TenantId, ToolId, UnixMillis};

    /// A token signed by `signer`, and whether `keys` (built from config) open it.
    fn opens(keys: &ConsentKeys, signer: &dyn ConsentIssuer) -> bool {
        let alice = Subject::new(
            TenantId::new("acme").unwrap(),
            ActorId::new("alice").unwrap(),
        );
        let tool = ToolId::new("a.b.c").unwrap();
        let grant = ConsentGrant::for_tool(&alice, &tool, UnixMillis(0), 1_000);
        let token = signer.issue_token(&grant, UnixMillis(0)).unwrap();
        let (ConsentKeys::Ed25519(k), true) = (keys, token.starts_with("e1.")) else {
            return false;
        };
        k.check(&soulbase_auth::ConsentRequest {
            subject: &alice,
            tool: &tool,
            scope: None,
            args_digest: "x",
            token: Some(&token),
            now: UnixMillis(1),
            max_age_ms: None,
        })
        .is_ok()
    }

    #[test]
    fn consent_keys_come_from_the_configured_file_or_public_key() {
        let dir = tempfile::tempdir().unwrap();
        let seed = [9u8; 32];
        let file = dir.path().join("consent.key");
        std::fs::write(&file, format!("{}\n", hex_of(&seed))).unwrap();
        let mut config = Config::default();
        config.auth.consent.signing = Some(ConsentSigning::Ed25519);
        config.auth.consent.key_file = Some(file.clone());
        let signer = Ed25519Consent::from_seed(&seed);
        assert!(opens(&consent_keys(&config).unwrap(), &signer), "key_file");

        let mut verify_only = Config::default();
        verify_only.auth.consent.public_key = Some(hex_of(&signer.public_key()));
        let keys = consent_keys(&verify_only).unwrap();
        assert!(opens(&keys, &signer), "public_key");
        let ConsentKeys::Ed25519(k) = &keys else {
            panic!("{keys:?}")
        };
        let alice = Subject::new(
            TenantId::new("acme").unwrap(),
            ActorId::new("alice").unwrap(),
        );
        let grant =
            ConsentGrant::for_tool(&alice, &ToolId::new("a.b.c").unwrap(), UnixMillis(0), 9);
        assert!(k.issue_token(&grant, UnixMillis(0)).is_err(), "verify only");

        // Without a file, a key of this process: not the configured seed's.
        assert!(!opens(&consent_keys(&Config::default()).unwrap(), &signer));

        config.auth.consent.signing = Some(ConsentSigning::Hmac);
        assert!(matches!(
            consent_keys(&config).unwrap(),
            ConsentKeys::Hmac(_)
        ));
        std::fs::write(&file, "abcd").unwrap();
        let err = consent_keys(&config).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ConfigInvalid);
        assert_eq!(
            err.public().fields.get("field").map(String::as_str),
            Some("auth.consent.key_file")
        );
        std::fs::write(&file, "not hex").unwrap();
        assert_eq!(
            consent_keys(&config).unwrap_err().code(),
            ErrorCode::ConfigInvalid
        );
    }

    fn hex_of(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn server_settings_are_validated_with_their_field_paths() {
        let mut config = Config::default();
        config.server.tls = Some(TlsConfig {
            cert_file: "".into(),
            key_file: "key.pem".into(),
            client_ca_file: None,
        });
        config.server.mcp_allowed_origins =
            vec!["evil.example".into(), "https://ok.example".into()];
        config.server.shutdown_grace_ms = 3_600_000;
        let fields: Vec<String> = config.validate().into_iter().map(|(f, _)| f).collect();
        assert!(
            fields.contains(&"server.tls.cert_file".to_owned()),
            "{fields:?}"
        );
        assert!(
            fields.contains(&"server.mcp_allowed_origins[0]".to_owned()),
            "{fields:?}"
        );
        assert!(!fields.iter().any(|f| f == "server.mcp_allowed_origins[1]"));
        assert!(
            fields.contains(&"server.shutdown_grace_ms".to_owned()),
            "{fields:?}"
        );
        assert!(!Config::default().server.dev_insecure);
    }

    #[test]
    fn hex_keys_decode_or_are_refused() {
        assert_eq!(decode_hex("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(decode_hex("0"), None);
        assert_eq!(decode_hex("zz"), None);
    }
}
