//! Capability profiles: what one call may do, and the seam that builds them.

use foldhash::{HashMap, HashMapExt};
use std::sync::{Arc, Mutex, RwLock};

use serde::Serialize;
use sha2::{Digest, Sha256};
use soulbase_config::{ConfigHandle, SandboxConfig};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::TenantId;

use crate::Capability;
use crate::intersect::intersect;

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

/// The production builder: a call's profile is the true intersection
/// Grant ∩ Manifest ∩ PolicyConfig (SB-08 invariant 5).
///
/// - **Manifest**: what the tool declares.
/// - **Grant**: what the tenant has been granted ([`IntersectingProfiles::grant`]);
///   tenants without their own grant get the default grant, which is *nothing* unless
///   [`IntersectingProfiles::default_grant`] says otherwise (least privilege).
/// - **PolicyConfig**: the deployment-wide ceiling; `None` means the deployment adds
///   no restriction of its own.
///
/// Built from a followed configuration ([`IntersectingProfiles::follow`]), the grants
/// and the ceiling are those of the handle's current snapshot, recompiled on the first
/// call after a reload: new calls see the new view at once, while a call already
/// holding its [`Profile`] finishes under it.
///
/// Profiles are cached per (tenant, manifest digest) within one view; changing a grant
/// or following a reload starts an empty cache.
pub struct IntersectingProfiles {
    view: RwLock<Arc<View>>,
    handle: Option<ConfigHandle>,
    reload: Mutex<()>,
}

/// One compiled set of grants and ceiling, with the profiles computed under it.
struct View {
    /// The hash of the configuration snapshot compiled (`None`: not from a handle).
    config_hash: Option<String>,
    policy: Option<Vec<Capability>>,
    default_grant: Option<Vec<Capability>>,
    grants: HashMap<TenantId, Option<Vec<Capability>>>,
    cache: RwLock<HashMap<(TenantId, String), Arc<Profile>>>,
}

impl View {
    fn new(policy: Option<Vec<Capability>>) -> Self {
        Self {
            config_hash: None,
            policy,
            default_grant: Some(Vec::new()),
            grants: HashMap::new(),
            cache: RwLock::new(HashMap::new()),
        }
    }

    /// The same grants and ceiling, with an empty cache.
    fn fresh(&self) -> Self {
        Self {
            config_hash: self.config_hash.clone(),
            policy: self.policy.clone(),
            default_grant: self.default_grant.clone(),
            grants: self.grants.clone(),
            cache: RwLock::new(HashMap::new()),
        }
    }

    /// Compiles a `sandbox` section; a problem is `CONFIG.INVALID` naming the field.
    fn compile(config: &SandboxConfig, config_hash: Option<String>) -> Result<Self, SoulError> {
        let mut view = Self::new(parse_capabilities(
            config.ceiling.as_deref(),
            "sandbox.ceiling",
        )?);
        view.config_hash = config_hash;
        view.default_grant =
            parse_capabilities(config.default_grant.as_deref(), "sandbox.default_grant")?;
        for (i, g) in config.grants.iter().enumerate() {
            let tenant = TenantId::new(g.tenant.as_str()).map_err(|e| {
                SoulError::of(ErrorCode::ConfigInvalid)
                    .with_field("field", format!("sandbox.grants[{i}].tenant"))
                    .with_note(format!("sandbox.grants[{i}].tenant: {e}"))
            })?;
            let caps = parse_capabilities(
                g.capabilities.as_deref(),
                &format!("sandbox.grants[{i}].capabilities"),
            )?;
            view.grants.insert(tenant, caps);
        }
        Ok(view)
    }

    fn compute(&self, tenant: &TenantId, declared: &[Capability]) -> Profile {
        let grant = self
            .grants
            .get(tenant)
            .cloned()
            .unwrap_or_else(|| self.default_grant.clone());
        let mut caps = declared.to_vec();
        if let Some(g) = grant {
            caps = intersect(&caps, &g);
        }
        if let Some(p) = &self.policy {
            caps = intersect(&caps, p);
        }
        Profile::new(caps)
    }

    fn build(
        &self,
        tenant: &TenantId,
        manifest_digest: &str,
        declared: &[Capability],
    ) -> Arc<Profile> {
        let key = (tenant.clone(), manifest_digest.to_owned());
        if let Ok(cache) = self.cache.read()
            && let Some(p) = cache.get(&key)
        {
            return p.clone();
        }
        let profile = Arc::new(self.compute(tenant, declared));
        if let Ok(mut cache) = self.cache.write() {
            cache.insert(key, profile.clone());
        }
        profile
    }
}

impl IntersectingProfiles {
    /// A builder under the policy ceiling `policy` (`None`: no ceiling). Tenants have
    /// no grant until one is given, so every profile starts empty.
    pub fn new(policy: Option<Vec<Capability>>) -> Self {
        Self::of(View::new(policy), None)
    }

    fn of(view: View, handle: Option<ConfigHandle>) -> Self {
        Self {
            view: RwLock::new(Arc::new(view)),
            handle,
            reload: Mutex::new(()),
        }
    }

    /// Sets the grant of tenants without their own (`None`: unrestricted, so the
    /// manifest and the policy alone decide).
    pub fn default_grant(self, grant: Option<Vec<Capability>>) -> Self {
        self.change(|v| v.default_grant = grant);
        self
    }

    /// Sets (or replaces) `tenant`'s grant (`None`: unrestricted for this tenant).
    /// On a builder following a configuration, the next accepted reload replaces it
    /// with the configured grants.
    pub fn grant(&self, tenant: TenantId, grant: Option<Vec<Capability>>) {
        self.change(|v| {
            v.grants.insert(tenant, grant);
        });
    }

    /// Removes `tenant`'s own grant, so the default applies again.
    pub fn revoke(&self, tenant: &TenantId) {
        self.change(|v| {
            v.grants.remove(tenant);
        });
    }

    /// Replaces the view with a changed copy (empty cache).
    fn change(&self, f: impl FnOnce(&mut View)) {
        let _guard = self.reload.lock();
        let mut next = self.load().fresh();
        f(&mut next);
        if let Ok(mut v) = self.view.write() {
            *v = Arc::new(next);
        }
    }

    fn load(&self) -> Arc<View> {
        match self.view.read() {
            Ok(v) => v.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Builds the profiles of a deployment from its `sandbox` config section: the
    /// ceiling, the default grant and the per-tenant grants. Every capability is
    /// parsed and validated; a problem is `CONFIG.INVALID` naming the field
    /// (e.g. `sandbox.grants[1].capabilities[0].hosts[2]`).
    pub fn from_config(config: &SandboxConfig) -> Result<Self, SoulError> {
        Ok(Self::of(View::compile(config, None)?, None))
    }

    /// Like [`from_config`](Self::from_config) over the `sandbox` section of
    /// `handle`'s current snapshot, then following it: the first call after an
    /// accepted reload recompiles the grants and the ceiling (one hash comparison per
    /// call otherwise). A section that does not compile is refused here; after a
    /// reload it is logged and the previous grants stay.
    pub fn follow(handle: ConfigHandle) -> Result<Self, SoulError> {
        let snap = handle.current();
        let view = View::compile(&snap.config().sandbox, Some(snap.hash().to_owned()))?;
        Ok(Self::of(view, Some(handle)))
    }

    /// The view in force, recompiled first if the followed configuration changed.
    fn current(&self) -> Arc<View> {
        let view = self.load();
        let Some(handle) = &self.handle else {
            return view;
        };
        let snap = handle.current();
        if view.config_hash.as_deref() == Some(snap.hash()) {
            return view;
        }
        let _guard = self.reload.lock();
        let view = self.load();
        if view.config_hash.as_deref() == Some(snap.hash()) {
            return view;
        }
        let next = match View::compile(&snap.config().sandbox, Some(snap.hash().to_owned())) {
            Ok(next) => next,
            // Keep the previous grants (the server logs why: `App::apply_current`);
            // stop retrying this snapshot.
            Err(_) => {
                let mut kept = view.fresh();
                kept.config_hash = Some(snap.hash().to_owned());
                kept
            }
        };
        let next = Arc::new(next);
        if let Ok(mut v) = self.view.write() {
            *v = next.clone();
        }
        next
    }

    /// Computes the intersection without the cache.
    pub fn compute(&self, tenant: &TenantId, declared: &[Capability]) -> Profile {
        self.current().compute(tenant, declared)
    }
}

/// Parses capabilities written in manifest syntax, naming the field of the first
/// problem (`CONFIG.INVALID`). `None` stays `None` ("unrestricted").
pub fn parse_capabilities(
    values: Option<&[serde_json::Value]>,
    field: &str,
) -> Result<Option<Vec<Capability>>, SoulError> {
    let Some(values) = values else {
        return Ok(None);
    };
    let invalid = |path: String, problem: String| {
        SoulError::of(ErrorCode::ConfigInvalid)
            .with_field("field", path.clone())
            .with_note(format!("{path}: {problem}"))
    };
    let mut out = Vec::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let cap: Capability =
            serde_json::from_value(v.clone()).map_err(|e| invalid(at.clone(), e.to_string()))?;
        if let Some((sub, problem)) = cap.validate().into_iter().next() {
            return Err(invalid(format!("{at}.{sub}"), problem));
        }
        out.push(cap);
    }
    Ok(Some(out))
}

impl ProfileBuilder for IntersectingProfiles {
    fn build(
        &self,
        tenant: &TenantId,
        manifest_digest: &str,
        declared: &[Capability],
    ) -> Result<Arc<Profile>, SoulError> {
        Ok(self.current().build(tenant, manifest_digest, declared))
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

    #[test]
    fn intersecting_profiles_narrow_by_grant_and_policy() {
        use crate::FsAccess;
        let t = TenantId::new("t").unwrap();
        let other = TenantId::new("u").unwrap();
        let policy = vec![
            Capability::Fs {
                paths: vec!["/srv".into()],
                access: [FsAccess::Read, FsAccess::List].into(),
            },
            Capability::Tmp { max_bytes: 1000 },
        ];
        let b = IntersectingProfiles::new(Some(policy));
        let declared = [
            Capability::Fs {
                paths: vec!["/srv/data".into(), "/etc".into()],
                access: [FsAccess::Read, FsAccess::Write].into(),
            },
            Capability::Tmp { max_bytes: 5000 },
        ];
        // No grant yet: nothing.
        assert!(
            b.build(&t, "d", &declared)
                .unwrap()
                .capabilities()
                .is_empty()
        );
        b.grant(t.clone(), None);
        let p = b.build(&t, "d", &declared).unwrap();
        assert_eq!(
            p.capabilities(),
            &[
                Capability::Fs {
                    paths: vec!["/srv/data".into()],
                    access: [FsAccess::Read].into(),
                },
                Capability::Tmp { max_bytes: 1000 },
            ]
        );
        b.grant(t.clone(), Some(vec![Capability::Tmp { max_bytes: 10 }]));
        let p2 = b.build(&t, "d", &declared).unwrap();
        assert_eq!(p2.capabilities(), &[Capability::Tmp { max_bytes: 10 }]);
        assert_ne!(p.hash(), p2.hash());
        assert!(
            b.build(&other, "d", &declared)
                .unwrap()
                .capabilities()
                .is_empty()
        );
        b.revoke(&t);
        assert!(
            b.build(&t, "d", &declared)
                .unwrap()
                .capabilities()
                .is_empty()
        );
    }

    #[test]
    fn built_from_the_config_section() {
        use serde_json::json;
        let mut cfg = SandboxConfig {
            ceiling: Some(vec![json!({"kind": "tmp", "max_bytes": 100})]),
            ..SandboxConfig::default()
        };
        cfg.grants.push(soulbase_config::TenantGrant {
            tenant: "acme".into(),
            capabilities: None,
        });
        let b = IntersectingProfiles::from_config(&cfg).unwrap();
        let declared = [
            Capability::Tmp { max_bytes: 1000 },
            Capability::Proc {
                commands: vec!["/bin/true".into()],
            },
        ];
        let acme = TenantId::new("acme").unwrap();
        let other = TenantId::new("other").unwrap();
        assert_eq!(
            b.build(&acme, "d", &declared).unwrap().capabilities(),
            &[Capability::Tmp { max_bytes: 100 }]
        );
        assert!(
            b.build(&other, "d", &declared)
                .unwrap()
                .capabilities()
                .is_empty()
        );

        cfg.grants[0].capabilities = Some(vec![json!({"kind": "net", "hosts": ["*.com"]})]);
        let e = IntersectingProfiles::from_config(&cfg).err().unwrap();
        assert_eq!(e.code(), ErrorCode::ConfigInvalid);
        assert_eq!(
            e.field("field"),
            Some("sandbox.grants[0].capabilities[0].hosts[0]")
        );
        cfg.ceiling = Some(vec![json!({"kind": "gpu"})]);
        let e = IntersectingProfiles::from_config(&cfg).err().unwrap();
        assert_eq!(e.field("field"), Some("sandbox.ceiling[0]"));
    }

    #[test]
    fn a_followed_configuration_applies_to_the_next_call() {
        use serde_json::json;
        use soulbase_config::{Config, ConfigSnapshot};
        let snapshot = |grant: Option<serde_json::Value>, ceiling: Option<serde_json::Value>| {
            let mut c = Config::default();
            c.sandbox.ceiling = ceiling.map(|v| vec![v]);
            c.sandbox.grants.push(soulbase_config::TenantGrant {
                tenant: "acme".into(),
                capabilities: Some(grant.into_iter().collect()),
            });
            ConfigSnapshot::new(c, vec!["test".into()])
        };
        let tmp = json!({"kind": "tmp", "max_bytes": 100});
        let handle = ConfigHandle::new(snapshot(Some(tmp.clone()), None));
        let b = IntersectingProfiles::follow(handle.clone()).unwrap();
        let acme = TenantId::new("acme").unwrap();
        let declared = [Capability::Tmp { max_bytes: 1000 }];
        let before = b.build(&acme, "d", &declared).unwrap();
        assert_eq!(before.capabilities(), &[Capability::Tmp { max_bytes: 100 }]);

        // A reload removing the grant: the next build is empty, the profile a call
        // already holds is unchanged.
        handle.publish(snapshot(None, None));
        assert!(
            b.build(&acme, "d", &declared)
                .unwrap()
                .capabilities()
                .is_empty()
        );
        assert_eq!(before.capabilities(), &[Capability::Tmp { max_bytes: 100 }]);

        // Granted again under a ceiling: both apply at once, to `compute` as well.
        handle.publish(snapshot(
            Some(tmp),
            Some(json!({"kind": "tmp", "max_bytes": 10})),
        ));
        assert_eq!(
            b.build(&acme, "d", &declared).unwrap().capabilities(),
            &[Capability::Tmp { max_bytes: 10 }]
        );
        assert_eq!(
            b.compute(&acme, &declared).capabilities(),
            &[Capability::Tmp { max_bytes: 10 }]
        );

        // A snapshot whose grants do not compile keeps the previous ones.
        handle.publish(snapshot(
            Some(json!({"kind": "net", "hosts": ["*.com"]})),
            None,
        ));
        assert_eq!(
            b.build(&acme, "d", &declared).unwrap().capabilities(),
            &[Capability::Tmp { max_bytes: 10 }]
        );
    }
}
