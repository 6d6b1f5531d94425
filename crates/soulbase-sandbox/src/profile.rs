//! Capability profiles: what one call may do, and the seam that builds them.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use serde::Serialize;
use sha2::{Digest, Sha256};
use soulbase_errors::SoulError;
use soulbase_types::TenantId;

use crate::Capability;

/// The capabilities a call runs under, with a hash recorded in its evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Profile {
    capabilities: Vec<Capability>,
    #[serde(skip)]
    hash: String,
}

impl Profile {
    /// A profile of exactly `capabilities`.
    pub fn new(capabilities: Vec<Capability>) -> Self {
        let bytes = serde_json::to_vec(&capabilities).unwrap_or_default();
        let hash = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        Self { capabilities, hash }
    }

    /// The granted capabilities.
    pub fn capabilities(&self) -> &[Capability] {
        &self.capabilities
    }

    /// Hash of the canonical encoding of the capabilities.
    pub fn hash(&self) -> &str {
        &self.hash
    }
}

/// Computes a call's profile: Grant ∩ Manifest ∩ PolicyConfig (SB-08 invariant 5).
pub trait ProfileBuilder: Send + Sync + 'static {
    /// The profile for a call of a tool declaring `declared`, identified by
    /// `manifest_digest` (a cache key: equal digests declare equal capabilities).
    fn build(
        &self,
        tenant: &TenantId,
        manifest_digest: &str,
        declared: &[Capability],
    ) -> Result<Arc<Profile>, SoulError>;
}

/// The in-process builder used when no grant or policy narrows the manifest: the
/// profile is exactly what the manifest declares (which registration already checked).
/// Profiles are cached per manifest digest, so building one costs a map lookup.
#[derive(Default)]
pub struct DeclaredProfiles {
    cache: RwLock<HashMap<String, Arc<Profile>>>,
}

impl DeclaredProfiles {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }
}

impl ProfileBuilder for DeclaredProfiles {
    fn build(
        &self,
        _tenant: &TenantId,
        manifest_digest: &str,
        declared: &[Capability],
    ) -> Result<Arc<Profile>, SoulError> {
        if let Ok(cache) = self.cache.read()
            && let Some(p) = cache.get(manifest_digest)
        {
            return Ok(p.clone());
        }
        let profile = Arc::new(Profile::new(declared.to_vec()));
        if let Ok(mut cache) = self.cache.write() {
            cache.insert(manifest_digest.to_owned(), profile.clone());
        }
        Ok(profile)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_follows_content() {
        let a = Profile::new(vec![Capability::Tmp { max_bytes: 1 }]);
        let b = Profile::new(vec![Capability::Tmp { max_bytes: 1 }]);
        let c = Profile::new(vec![Capability::Tmp { max_bytes: 2 }]);
        assert_eq!(a.hash(), b.hash());
        assert_ne!(a.hash(), c.hash());
        assert!(a.hash().starts_with("sha256:"));
    }

    #[test]
    fn declared_profiles_are_cached_by_digest() {
        let b = DeclaredProfiles::new();
        let t = TenantId::new("t").unwrap();
        let caps = [Capability::Tmp { max_bytes: 1 }];
        let p1 = b.build(&t, "d1", &caps).unwrap();
        let p2 = b.build(&t, "d1", &caps).unwrap();
        assert!(Arc::ptr_eq(&p1, &p2));
        assert_eq!(p1.capabilities(), &caps);
    }
}
