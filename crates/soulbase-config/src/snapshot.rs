//! Immutable snapshots and the handle that publishes them.

use std::ops::Deref;
use std::sync::Arc;

use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::{Config, ConfigError, ConfigLoader};

/// One loaded, validated configuration. Never changes; reloads make a new one.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigSnapshot {
    config: Config,
    hash: String,
    sources: Vec<String>,
}

impl ConfigSnapshot {
    /// Wraps a validated config, computing its content hash.
    pub fn new(config: Config, sources: Vec<String>) -> Self {
        // Struct fields serialize in a fixed order and maps are sorted, so equal
        // configurations hash equally whatever layers produced them.
        let bytes = serde_json::to_vec(&config).unwrap_or_default();
        let hash = hex::encode(Sha256::digest(&bytes));
        Self {
            config,
            hash,
            sources,
        }
    }

    /// The typed configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Hex SHA-256 of the effective configuration; recorded in evidence as the config hash.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// The layers that contributed, lowest first.
    pub fn sources(&self) -> &[String] {
        &self.sources
    }
}

impl Deref for ConfigSnapshot {
    type Target = Config;
    fn deref(&self) -> &Config {
        &self.config
    }
}

/// The outcome of the latest load or reload, as observed by subscribers.
#[derive(Debug, Clone, PartialEq)]
pub enum ReloadStatus {
    /// The first snapshot.
    Loaded {
        /// Its hash.
        hash: String,
    },
    /// A new snapshot replaced the previous one.
    Applied {
        /// The new hash.
        hash: String,
        /// The replaced hash.
        previous: String,
    },
    /// The file changed but the effective configuration did not.
    Unchanged {
        /// The current hash.
        hash: String,
    },
    /// The new configuration was invalid; the previous snapshot stays in force.
    Rejected {
        /// Why.
        error: ConfigError,
        /// The hash of the snapshot kept.
        kept: String,
    },
}

struct Inner {
    current: ArcSwap<ConfigSnapshot>,
    status: watch::Sender<ReloadStatus>,
}

/// Shares the current snapshot. Cloning is cheap; all clones see the same snapshot.
///
/// Readers call [`ConfigHandle::current`] once per request and keep the `Arc`, so a
/// request started before a reload finishes under the configuration it started with.
#[derive(Clone)]
pub struct ConfigHandle {
    inner: Arc<Inner>,
}

impl ConfigHandle {
    /// A handle publishing `initial`.
    pub fn new(initial: ConfigSnapshot) -> Self {
        let (status, _) = watch::channel(ReloadStatus::Loaded {
            hash: initial.hash().to_owned(),
        });
        Self {
            inner: Arc::new(Inner {
                current: ArcSwap::from_pointee(initial),
                status,
            }),
        }
    }

    /// The current snapshot (lock-free).
    pub fn current(&self) -> Arc<ConfigSnapshot> {
        self.inner.current.load_full()
    }

    /// Observes reload outcomes.
    pub fn subscribe(&self) -> watch::Receiver<ReloadStatus> {
        self.inner.status.subscribe()
    }

    /// Publishes `next` if it differs from the current snapshot.
    pub fn publish(&self, next: ConfigSnapshot) -> ReloadStatus {
        let previous = self.current();
        let status = if previous.hash() == next.hash() {
            ReloadStatus::Unchanged {
                hash: previous.hash().to_owned(),
            }
        } else {
            let status = ReloadStatus::Applied {
                hash: next.hash().to_owned(),
                previous: previous.hash().to_owned(),
            };
            self.inner.current.store(Arc::new(next));
            tracing::info!(hash = %self.current().hash(), "configuration applied");
            status
        };
        self.inner.status.send_replace(status.clone());
        status
    }

    /// Records that a reload failed; the current snapshot stays.
    pub fn reject(&self, error: ConfigError) -> ReloadStatus {
        tracing::warn!(%error, "configuration change rejected; keeping the previous configuration");
        let status = ReloadStatus::Rejected {
            error,
            kept: self.current().hash().to_owned(),
        };
        self.inner.status.send_replace(status.clone());
        status
    }

    /// Re-runs `loader` and applies the result, or keeps the current snapshot when invalid.
    pub fn reload(&self, loader: &ConfigLoader) -> ReloadStatus {
        match loader.load() {
            Ok(next) => self.publish(next),
            Err(e) => self.reject(e),
        }
    }

    pub(crate) fn reload_with_bytes(
        &self,
        loader: &ConfigLoader,
        bytes: Option<&[u8]>,
    ) -> ReloadStatus {
        match loader.load_with_file_bytes(bytes) {
            Ok(next) => self.publish(next),
            Err(e) => self.reject(e),
        }
    }
}
