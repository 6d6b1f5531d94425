//! Soulbase's configuration: layered, typed, validated, hashed, hot-reloadable.
//!
//! Layers, lowest first: built-in defaults < the development preset (only with
//! `--dev`, [`DEV_PRESET`]) < `config.yaml` < environment
//! (`SOULBASE_<SECTION>__<FIELD>` and the shorthand `SKILLS_DIR`) < CLI flags
//! (`--set path=value`, or a binary's own flags mapped onto paths). A later layer
//! overrides an earlier one field by field. The merged tree is deserialized into the
//! typed [`Config`] (unknown fields are errors) and validated; every problem names the
//! field path and the layer it came from (the file's path, the variable, the flag).
//!
//! A successful load yields an immutable [`ConfigSnapshot`] with a content hash.
//! [`ConfigHandle`] publishes snapshots lock-free (readers never block; in-flight work
//! keeps the snapshot it loaded), and [`watch`] reloads on file change, keeping the
//! last good snapshot — and reporting why — when the new file is invalid.
//!
//! [`reference`] derives from the model what users read: the JSON Schema of
//! `config.yaml`, `docs/configuration.md`, and which keys a reload applies
//! ([`reference::LIVE_KEYS`]; the others take a restart).
//!
//! IO here is limited to reading the config file and watching it.

mod layers;
mod model;
mod problem;
pub mod reference;
mod snapshot;
mod watcher;

pub use layers::{ConfigCheck, ConfigLoader, DEV_PRESET, Source, read_secret_file};
pub use model::DevIdentity;
pub use model::POLICY_ACTIONS;
pub use model::RemoteRoles;
pub use model::SkillSubscription;
pub use model::TlsConfig;
pub use model::{
    ApiKeyConfig, AuthConfig, BudgetWindow, CedarConfig, ConsentConfig, ConsentSigning,
    JwtAlgorithm, JwtIssuerConfig, JwtKeyConfig, QuotaBudget,
};
pub use model::{
    Config, DurabilityMode, EvidenceBackend, EvidenceConfig, FailMode, ObserveConfig, PolicyConfig,
    PolicyEffect, PolicyRule, QuotaBackend, QuotaConfig, QuotaLimit, Role, ServerConfig,
    SkillsConfig,
};
pub use model::{ModelAllow, ModelConfig, ModelUpstream};
pub use model::{SandboxConfig, TenantConfig, TenantGrant};
pub use problem::{ConfigError, ConfigProblem};
pub use snapshot::{ConfigHandle, ConfigSnapshot, ReloadStatus};
pub use watcher::{ConfigWatcher, watch};
