//! The configuration's `tenants[]` as the registry's configured tenant views
//! ([`Registry::set_configured`](soulbase_tools::Registry::set_configured)):
//! applied when the app is built and again on every accepted reload.

use std::collections::HashMap;

use soulbase_config::Config;
use soulbase_tools::registry::{TenantAccess, TenantOverride};
use soulbase_types::{TenantId, ToolId};

/// Each configured tenant's access. Entries were validated at load
/// (`Config::validate`), so an id that does not parse cannot occur; one would be
/// left out rather than widen anything: an allow-list keeps its other ids.
pub(crate) fn configured(cfg: &Config) -> HashMap<TenantId, TenantAccess> {
    let ids = |list: &[String]| -> Vec<ToolId> {
        list.iter()
            .filter_map(|t| ToolId::new(t.as_str()).ok())
            .collect()
    };
    cfg.tenants
        .iter()
        .filter_map(|t| {
            let tenant = TenantId::new(t.tenant.as_str()).ok()?;
            let mut overrides = std::collections::BTreeMap::new();
            for id in ids(&t.enable) {
                overrides.insert(id, TenantOverride::Enabled);
            }
            for id in ids(&t.pause) {
                overrides.insert(id, TenantOverride::Paused);
            }
            let access = TenantAccess {
                allow: t.allow.as_deref().map(|a| ids(a).into_iter().collect()),
                overrides,
            };
            Some((tenant, access))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_become_an_allow_list_and_overrides() {
        let cfg: Config = serde_json::from_value(serde_json::json!({
            "tenants": [
                {"tenant": "acme", "allow": ["a.b.c", "a.b.d"], "pause": ["a.b.d"]},
                {"tenant": "beta", "enable": ["a.b.c"]}
            ]
        }))
        .unwrap();
        let got = configured(&cfg);
        let id = |s: &str| ToolId::new(s).unwrap();
        let acme = &got[&TenantId::new("acme").unwrap()];
        assert_eq!(acme.allow, Some([id("a.b.c"), id("a.b.d")].into()));
        assert_eq!(
            acme.overrides,
            [(id("a.b.d"), TenantOverride::Paused)].into()
        );
        let beta = &got[&TenantId::new("beta").unwrap()];
        assert_eq!(beta.allow, None);
        assert_eq!(
            beta.overrides,
            [(id("a.b.c"), TenantOverride::Enabled)].into()
        );
    }
}
