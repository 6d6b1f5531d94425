//! The static, in-process policy from `policy.rules`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use sha2::{Digest, Sha256};
use soulbase_config::{ConfigHandle, PolicyConfig, PolicyEffect, PolicyRule};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{Obligation, ToolPattern};

use crate::{Action, Authorizer, AuthzRequest, Decision};

#[derive(Debug)]
struct Rule {
    deny: bool,
    tenant: Option<String>,
    actors: Option<HashSet<String>>,
    tools: Vec<ToolPattern>,
    /// The actions it covers, one bit per [`Action`] ([`bit`]).
    actions: u16,
    /// Matches only a subject holding every scope the tool declares.
    require_scopes: bool,
    /// What an allow rule requires of the output.
    obligations: Vec<Obligation>,
}

/// The bit of `action` in a rule's action mask.
fn bit(action: Action) -> u16 {
    1 << (action as u16)
}

/// The mask of every action.
fn all_actions() -> u16 {
    Action::ALL.iter().fold(0, |m, a| m | bit(*a))
}

impl Rule {
    fn compile(r: &PolicyRule) -> Self {
        Rule {
            deny: r.effect == PolicyEffect::Deny,
            tenant: (r.tenant != "*").then(|| r.tenant.clone()),
            actors: (!r.actors.iter().any(|a| a == "*"))
                .then(|| r.actors.iter().cloned().collect()),
            tools: r
                .tools
                .iter()
                // Validation refused malformed patterns; one that slips through matches nothing.
                .filter_map(|t| ToolPattern::parse(t).ok())
                .collect(),
            actions: Self::action_mask(r),
            require_scopes: r.require_scopes,
            obligations: r.obligations.clone(),
        }
    }

    /// The actions `r` names (`*`: all); an allow rule granting `invoke` also
    /// grants `list` and `preflight`. An unknown name covers nothing.
    fn action_mask(r: &PolicyRule) -> u16 {
        let mut mask = r.actions.iter().fold(0, |m, name| {
            if name == "*" {
                m | all_actions()
            } else {
                m | name.parse::<Action>().map_or(0, bit)
            }
        });
        if r.effect == PolicyEffect::Allow && mask & bit(Action::Invoke) != 0 {
            mask |= Action::ALL
                .iter()
                .filter(|a| a.implied_by_invoke())
                .fold(0, |m, a| m | bit(*a));
        }
        mask
    }

    /// Whether the rule is about this subject and tool (whatever the action).
    fn applies(&self, req: &AuthzRequest<'_>) -> bool {
        self.tenant
            .as_deref()
            .is_none_or(|t| t == req.subject.tenant.as_str())
            && self
                .actors
                .as_ref()
                .is_none_or(|a| a.contains(req.subject.actor.as_str()))
            && self.tools.iter().any(|p| p.matches(req.tool))
            && (!self.require_scopes
                || req
                    .tool_scopes
                    .iter()
                    .all(|sc| req.subject.scopes.contains(sc)))
    }
}

/// The rules indexed by tenant: a request can only match the rules for every tenant
/// (`*`) and those for its own tenant, so only those are scanned.
struct Compiled {
    /// Rules with tenant `*`.
    any_tenant: Vec<Rule>,
    /// Rules for one tenant, by tenant.
    by_tenant: HashMap<String, Vec<Rule>>,
    hash: String,
}

impl Compiled {
    fn new(config: &PolicyConfig) -> Self {
        let bytes = serde_json::to_vec(config).unwrap_or_default();
        let mut any_tenant = Vec::new();
        let mut by_tenant: HashMap<String, Vec<Rule>> = HashMap::new();
        for rule in config.rules.iter().map(Rule::compile) {
            match &rule.tenant {
                Some(t) => by_tenant.entry(t.clone()).or_default().push(rule),
                None => any_tenant.push(rule),
            }
        }
        Compiled {
            any_tenant,
            by_tenant,
            hash: format!("sha256:{}", hex::encode(Sha256::digest(&bytes))),
        }
    }

    /// The rules that can apply to a subject of `tenant`.
    fn candidates(&self, tenant: &str) -> impl Iterator<Item = &Rule> {
        self.any_tenant
            .iter()
            .chain(self.by_tenant.get(tenant).into_iter().flatten())
    }
}

/// Deny-by-default rules from configuration: allowed only when some allow rule matches
/// and no deny rule does. Swappable at runtime without blocking readers; bound to a
/// `ConfigHandle` ([`follow`](Self::follow)) it picks up each new snapshot's rules
/// on the next decision, as the Cedar engine and the authenticator do.
pub struct StaticPolicy {
    compiled: ArcSwap<Compiled>,
    /// The followed configuration, and the hash of the snapshot compiled.
    handle: Option<(ConfigHandle, ArcSwap<String>)>,
}

impl StaticPolicy {
    /// Compiles `config`.
    pub fn new(config: &PolicyConfig) -> Self {
        Self {
            compiled: ArcSwap::from_pointee(Compiled::new(config)),
            handle: None,
        }
    }

    /// The rules of `handle`'s current snapshot, recompiled when a new one is
    /// accepted (checked on each decision: one pointer comparison).
    pub fn follow(handle: ConfigHandle) -> Self {
        let snap = handle.current();
        Self {
            compiled: ArcSwap::from_pointee(Compiled::new(&snap.config().policy)),
            handle: Some((handle, ArcSwap::from_pointee(snap.hash().to_owned()))),
        }
    }

    /// Replaces the rules (hot reload); calls already past authorization are unaffected.
    pub fn update(&self, config: &PolicyConfig) {
        self.compiled.store(Arc::new(Compiled::new(config)));
    }

    /// The hash of the rules in force.
    pub fn hash(&self) -> String {
        self.current().hash.clone()
    }

    /// The rules in force, recompiled first if the followed configuration changed.
    fn current(&self) -> Arc<Compiled> {
        if let Some((handle, seen)) = &self.handle {
            let snap = handle.current();
            if snap.hash() != seen.load().as_str() {
                self.update(&snap.config().policy);
                seen.store(Arc::new(snap.hash().to_owned()));
            }
        }
        self.compiled.load_full()
    }

    /// The decision, synchronously.
    pub fn decide(&self, req: &AuthzRequest<'_>) -> Result<Decision, SoulError> {
        self.decide_all(req, bit(req.action))
    }

    /// Whether every action of `mask` is allowed on `req`'s subject and tool, in
    /// one scan of the rules (`req.action` is not consulted).
    fn decide_all(&self, req: &AuthzRequest<'_>, mask: u16) -> Result<Decision, SoulError> {
        // Structural isolation: no rule can grant another tenant's tool.
        crate::isolation::check_tenant(req)?;
        let compiled = self.current();
        let mut allowed = 0u16;
        let mut obligations: Vec<Obligation> = Vec::new();
        // Deny wins whatever the order, so scanning the two groups in turn is exact.
        for rule in compiled.candidates(req.subject.tenant.as_str()) {
            let hit = rule.actions & mask;
            if hit == 0 || !rule.applies(req) {
                continue;
            }
            if rule.deny {
                return Err(SoulError::of(ErrorCode::PolicyDenyTool));
            }
            allowed |= hit;
            // Every allow rule that matched binds the output with its obligations.
            for ob in &rule.obligations {
                if !obligations.contains(ob) {
                    obligations.push(ob.clone());
                }
            }
        }
        if allowed == mask {
            Ok(Decision {
                policy_hash: compiled.hash.clone(),
                obligations,
            })
        } else {
            Err(SoulError::of(ErrorCode::PolicyDenyTool).with_note("no allow rule matched"))
        }
    }
}

#[async_trait]
impl Authorizer for StaticPolicy {
    async fn authorize(&self, req: AuthzRequest<'_>) -> Result<Decision, SoulError> {
        self.decide(&req)
    }

    async fn authorize_all(
        &self,
        req: AuthzRequest<'_>,
        actions: &[Action],
    ) -> Result<Decision, SoulError> {
        let mask = actions.iter().fold(0, |m, a| m | bit(*a));
        self.decide_all(&req, mask)
    }
}

#[cfg(test)]
mod tests {
    use soulbase_types::{ActorId, Subject, TenantId, ToolId};

    use super::*;

    fn asking<'a>(subject: &'a Subject, tool: &'a ToolId, action: Action) -> AuthzRequest<'a> {
        AuthzRequest {
            subject,
            tool,
            tool_tenant: None,
            action,
            tool_scopes: &[],
        }
    }

    #[test]
    fn a_followed_configuration_is_picked_up_on_the_next_decision() {
        let snapshot = |rules: Vec<PolicyRule>| {
            let mut c = soulbase_config::Config::default();
            c.policy.rules = rules;
            soulbase_config::ConfigSnapshot::new(c, vec![])
        };
        let handle = ConfigHandle::new(snapshot(vec![]));
        let policy = StaticPolicy::follow(handle.clone());
        let who = Subject::new(TenantId::new("acme").unwrap(), ActorId::new("bob").unwrap());
        let tool = ToolId::new("a.b.c").unwrap();
        assert!(policy.decide(&asking(&who, &tool, Action::Invoke)).is_err());
        handle.publish(snapshot(vec![rule(
            PolicyEffect::Allow,
            "acme",
            &["*"],
            &["*"],
        )]));
        assert!(policy.decide(&asking(&who, &tool, Action::Invoke)).is_ok());
        // Invoke implies list and preflight; not administration.
        assert!(policy.decide(&asking(&who, &tool, Action::List)).is_ok());
        assert!(
            policy
                .decide(&asking(&who, &tool, Action::Preflight))
                .is_ok()
        );
        assert!(policy.decide(&asking(&who, &tool, Action::Enable)).is_err());
        // A deny rule on list hides the tool though invoke is allowed.
        let mut deny_list = rule(PolicyEffect::Deny, "acme", &["*"], &["*"]);
        deny_list.actions = vec!["list".into()];
        handle.publish(snapshot(vec![
            rule(PolicyEffect::Allow, "acme", &["*"], &["*"]),
            deny_list,
        ]));
        assert!(policy.decide(&asking(&who, &tool, Action::List)).is_err());
        assert!(policy.decide(&asking(&who, &tool, Action::Invoke)).is_ok());
    }

    fn rule(effect: PolicyEffect, tenant: &str, actors: &[&str], tools: &[&str]) -> PolicyRule {
        PolicyRule {
            effect,
            tenant: tenant.into(),
            actors: actors.iter().map(|s| s.to_string()).collect(),
            tools: tools.iter().map(|s| s.to_string()).collect(),
            actions: vec!["invoke".into()],
            require_scopes: false,
            obligations: Vec::new(),
        }
    }

    fn ask(p: &StaticPolicy, tenant: &str, actor: &str, tool: &str) -> Result<Decision, SoulError> {
        let subject = Subject::new(TenantId::new(tenant).unwrap(), ActorId::new(actor).unwrap());
        let tool = ToolId::new(tool).unwrap();
        p.decide(&AuthzRequest {
            subject: &subject,
            tool: &tool,
            tool_tenant: None,
            action: Action::Invoke,
            tool_scopes: &[],
        })
    }

    #[test]
    fn empty_policy_denies() {
        let p = StaticPolicy::new(&PolicyConfig::default());
        assert_eq!(
            ask(&p, "t", "a", "a.b.c").unwrap_err().code(),
            ErrorCode::PolicyDenyTool
        );
    }

    #[test]
    fn allow_matches_by_tenant_actor_and_pattern() {
        let p = StaticPolicy::new(&PolicyConfig {
            rules: vec![rule(
                PolicyEffect::Allow,
                "acme",
                &["alice"],
                &["fs.files.*"],
            )],
        });
        assert!(ask(&p, "acme", "alice", "fs.files.read").is_ok());
        assert!(ask(&p, "acme", "bob", "fs.files.read").is_err());
        assert!(ask(&p, "other", "alice", "fs.files.read").is_err());
        assert!(
            ask(&p, "acme", "alice", "fs.filesx.read").is_err(),
            "prefix is per segment"
        );
    }

    #[test]
    fn deny_wins() {
        let p = StaticPolicy::new(&PolicyConfig {
            rules: vec![
                rule(PolicyEffect::Allow, "*", &["*"], &["*"]),
                rule(PolicyEffect::Deny, "*", &["*"], &["sys.proc.*"]),
            ],
        });
        assert!(ask(&p, "t", "a", "fs.files.read").is_ok());
        assert_eq!(
            ask(&p, "t", "a", "sys.proc.exec").unwrap_err().code(),
            ErrorCode::PolicyDenyTool
        );
    }

    #[test]
    fn rules_for_every_tenant_and_for_the_own_tenant_combine_and_deny_wins() {
        let p = StaticPolicy::new(&PolicyConfig {
            rules: vec![
                rule(PolicyEffect::Allow, "*", &["*"], &["fs.files.*"]),
                rule(PolicyEffect::Deny, "acme", &["mallory"], &["*"]),
                rule(PolicyEffect::Allow, "beta", &["bob"], &["net.http.*"]),
                rule(PolicyEffect::Deny, "*", &["eve"], &["*"]),
                rule(PolicyEffect::Deny, "beta", &["*"], &["fs.files.delete"]),
            ],
        });
        // `*` allow applies to every tenant.
        assert!(ask(&p, "acme", "alice", "fs.files.read").is_ok());
        assert!(ask(&p, "gamma", "alice", "fs.files.read").is_ok());
        // A tenant deny beats a `*` allow, only in its tenant.
        assert!(ask(&p, "acme", "mallory", "fs.files.read").is_err());
        assert!(ask(&p, "beta", "mallory", "fs.files.read").is_ok());
        // A tenant allow applies only in its tenant.
        assert!(ask(&p, "beta", "bob", "net.http.get").is_ok());
        assert!(ask(&p, "acme", "bob", "net.http.get").is_err());
        // A `*` deny beats a tenant allow.
        assert!(ask(&p, "beta", "eve", "net.http.get").is_err());
        assert!(ask(&p, "acme", "eve", "fs.files.read").is_err());
        // A tenant deny beats a `*` allow for that tenant's subjects only.
        assert!(ask(&p, "beta", "bob", "fs.files.delete").is_err());
        assert!(ask(&p, "acme", "bob", "fs.files.delete").is_ok());
    }

    #[test]
    fn other_tenants_tool_is_never_granted() {
        let p = StaticPolicy::new(&PolicyConfig {
            rules: vec![rule(PolicyEffect::Allow, "*", &["*"], &["*"])],
        });
        let subject = Subject::new(TenantId::new("a").unwrap(), ActorId::new("x").unwrap());
        let owner = TenantId::new("b").unwrap();
        let tool = ToolId::new("b.p.t").unwrap();
        let err = p
            .decide(&AuthzRequest {
                subject: &subject,
                tool: &tool,
                tool_tenant: Some(&owner),
                action: Action::Invoke,
                tool_scopes: &[],
            })
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ToolNotFound);
    }

    #[test]
    fn update_swaps_rules_and_hash() {
        let p = StaticPolicy::new(&PolicyConfig::default());
        let before = p.hash();
        p.update(&PolicyConfig {
            rules: vec![rule(PolicyEffect::Allow, "*", &["*"], &["*"])],
        });
        assert_ne!(p.hash(), before);
        assert_eq!(ask(&p, "t", "a", "a.b.c").unwrap().policy_hash, p.hash());
    }
}
