//! [`CedarPolicy`]: the Cedar engine behind the [`Authorizer`] seam, hot-reloaded.

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use soulbase_config::{CedarConfig, ConfigHandle};
use soulbase_errors::{ErrorCode, SoulError};

use crate::cedar::CedarPolicySet;
use crate::isolation::check_tenant;
use crate::{Authorizer, AuthzRequest, Decision};

/// Reads the policy sources named by `auth.cedar`: each file, then the inline text.
pub fn read_sources(config: &CedarConfig) -> Result<Vec<(String, String)>, SoulError> {
    let mut sources = Vec::new();
    for (i, path) in config.files.iter().enumerate() {
        let text = std::fs::read_to_string(path).map_err(|e| {
            SoulError::new(
                ErrorCode::ConfigInvalid,
                "a Cedar policy file cannot be read",
            )
            .with_field("field", format!("auth.cedar.files[{i}]"))
            .with_note(format!("{}: {e}", path.display()))
        })?;
        sources.push((file_name(path), text));
    }
    if let Some(text) = &config.policies {
        sources.push(("inline".to_owned(), text.clone()));
    }
    Ok(sources)
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

struct Loaded {
    /// Hash of the configuration snapshot the set was loaded from (when following one).
    config_hash: String,
    set: Arc<CedarPolicySet>,
}

/// Deny-by-default authorization by Cedar policies, swappable at runtime.
///
/// Bound to a [`ConfigHandle`] (see [`CedarPolicy::follow`]), it reloads the policies
/// when a new configuration snapshot is published: new requests see the new policies
/// at once, a set that fails to load or validate is refused and the previous one stays
/// (logged). In-flight decisions finish on the set they started with.
pub struct CedarPolicy {
    loaded: ArcSwap<Loaded>,
    handle: Option<ConfigHandle>,
    reload: std::sync::Mutex<()>,
}

fn deny(note: String) -> SoulError {
    SoulError::of(ErrorCode::PolicyDenyTool).with_note(note)
}

impl CedarPolicy {
    /// A decision point over `sources` (`(name, cedar text)`).
    pub fn from_sources(sources: &[(String, String)]) -> Result<Self, SoulError> {
        let set = CedarPolicySet::compile(sources)?;
        Ok(Self {
            loaded: ArcSwap::from_pointee(Loaded {
                config_hash: String::new(),
                set: Arc::new(set),
            }),
            handle: None,
            reload: std::sync::Mutex::new(()),
        })
    }

    /// A decision point over the policies of `auth.cedar`.
    pub fn from_config(config: &CedarConfig) -> Result<Self, SoulError> {
        Self::from_sources(&read_sources(config)?)
    }

    /// A decision point following `handle`: the policies of the current snapshot's
    /// `auth.cedar` (none configured: everything is denied), reloaded with each new one.
    pub fn follow(handle: ConfigHandle) -> Result<Self, SoulError> {
        let snap = handle.current();
        let cedar = snap.config().auth.cedar.clone().unwrap_or_default();
        let set = CedarPolicySet::compile(&read_sources(&cedar)?)?;
        Ok(Self {
            loaded: ArcSwap::from_pointee(Loaded {
                config_hash: snap.hash().to_owned(),
                set: Arc::new(set),
            }),
            handle: Some(handle),
            reload: std::sync::Mutex::new(()),
        })
    }

    /// Replaces the policies; on error the current ones stay and the error is returned.
    pub fn update(&self, sources: &[(String, String)]) -> Result<(), SoulError> {
        let set = CedarPolicySet::compile(sources)?;
        let config_hash = self.loaded.load().config_hash.clone();
        self.loaded.store(Arc::new(Loaded {
            config_hash,
            set: Arc::new(set),
        }));
        Ok(())
    }

    /// Re-reads the policies of the followed configuration now (e.g. after a policy
    /// file changed without the configuration changing, or on SIGHUP).
    pub fn reload(&self) -> Result<(), SoulError> {
        let Some(handle) = &self.handle else {
            return Ok(());
        };
        let snap = handle.current();
        let cedar = snap.config().auth.cedar.clone().unwrap_or_default();
        let set = CedarPolicySet::compile(&read_sources(&cedar)?)?;
        self.loaded.store(Arc::new(Loaded {
            config_hash: snap.hash().to_owned(),
            set: Arc::new(set),
        }));
        Ok(())
    }

    /// The policy set in force, reloading first if the followed configuration changed.
    pub fn current(&self) -> Arc<CedarPolicySet> {
        let loaded = self.loaded.load();
        if let Some(handle) = &self.handle {
            let snap = handle.current();
            if snap.hash() != loaded.config_hash {
                drop(loaded);
                self.refresh(snap.hash());
                return self.loaded.load().set.clone();
            }
        }
        loaded.set.clone()
    }

    fn refresh(&self, hash: &str) {
        let Ok(_guard) = self.reload.lock() else {
            return;
        };
        if self.loaded.load().config_hash == hash {
            return; // another caller reloaded meanwhile
        }
        match self.reload() {
            Ok(()) => {
                tracing::info!(policy_hash = %self.loaded.load().set.hash(), "Cedar policies reloaded")
            }
            Err(e) => {
                tracing::warn!(error = %e.audit().causes.join("; "), "Cedar policies rejected; keeping the previous ones");
                // Remember the snapshot so a broken file is not re-read on every call.
                let set = self.loaded.load().set.clone();
                self.loaded.store(Arc::new(Loaded {
                    config_hash: hash.to_owned(),
                    set,
                }));
            }
        }
    }

    /// The hash of the policies in force.
    pub fn hash(&self) -> String {
        self.current().hash().to_owned()
    }

    /// The decision, synchronously.
    pub fn decide(&self, req: &AuthzRequest<'_>) -> Result<Decision, SoulError> {
        check_tenant(req)?;
        let set = self.current();
        let obligations = set.evaluate(req).map_err(deny)?;
        Ok(Decision {
            policy_hash: set.hash().to_owned(),
            obligations,
        })
    }
}

#[async_trait]
impl Authorizer for CedarPolicy {
    async fn authorize(&self, req: AuthzRequest<'_>) -> Result<Decision, SoulError> {
        self.decide(&req)
    }
}
