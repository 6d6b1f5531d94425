//! The Cedar policy decision point.
//!
//! Policies are Cedar text (files and/or inline, from `auth.cedar`), validated at load
//! against [`SCHEMA`] in strict mode: a policy that does not validate is a load error
//! and the previous policy set stays in force. At decision time:
//!
//! - tenant isolation comes first and no policy can lift it (see [`crate::isolation`]);
//! - **any evaluation error makes the decision deny** — Cedar itself skips an erroring
//!   policy (even a `forbid`), which could turn a broken forbid into an allow;
//! - forbid wins, and with no satisfied permit the answer is deny (also for an empty
//!   policy set).
//!
//! For speed, policies are indexed at load by their scope: the tenant their principal
//! constraint names (`principal in Soul::Tenant::"acme"`, `principal ==
//! Soul::Actor::"acme/alice"`), the one actor an `==` constraint names, and the tool,
//! package or group their resource constraint names. A decision evaluates only the
//! slices that can apply to the request; Cedar's semantics (deny unless some permit
//! holds and no forbid does) make evaluating the slices separately and combining them
//! exactly equivalent to evaluating them all.
//!
//! The entities a decision is evaluated over are built once: each subject's principal
//! entity (keyed by the whole subject — tenant, actor, roles, scopes) is kept in a
//! store whose transitive closure is computed, each tool's resource entity (keyed by
//! id and owner) alongside; a decision clones the subject's store and adds the tool
//! (Cedar then only computes the tool's closure). Both caches belong to the policy set,
//! so a reload starts them empty, and they are bounded. The request is built without
//! schema validation: the schema validated the policies at load, and the request's
//! types and action are fixed by construction (an unknown action is denied first).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::str::FromStr;
use std::sync::{Arc, RwLock};

use cedar_policy::{
    Authorizer as CedarEngine, Context, Decision as CedarDecision, Effect, Entities, Entity,
    EntityId, EntityTypeName, EntityUid, Policy, PolicyId, PolicySet, PrincipalConstraint, Request,
    ResourceConstraint, RestrictedExpression, Schema, ValidationMode, Validator,
};
use sha2::{Digest, Sha256};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{Obligation, Subject, TenantId, ToolId};

use crate::AuthzRequest;

/// The Cedar schema policies are validated against (namespace `Soul`).
///
/// - `Soul::Actor::"<tenant>/<actor>"`, member of `Soul::Tenant::"<tenant>"` and of
///   `Soul::Role::"<role>"` for each role; attributes `tenant`, `actor`, `scopes`.
/// - `Soul::Tool::"<group>.<pkg>.<name>"`, member of `Soul::Package::"<group>.<pkg>"`
///   and `Soul::Group::"<group>"`; attributes `id`, `tenant` (owner, `""` for global
///   tools) and `global`.
/// - Context: `tool_scopes`, the scopes the tool's manifest declares
///   (`resource#action`), e.g. `principal.scopes.containsAll(context.tool_scopes)`.
/// - Actions: exactly [`Action::ALL`](crate::Action::ALL) — `invoke`, `preflight`,
///   `list`, `read_evidence` (on resource `Soul::Tool::"soulbase.server.audit"`:
///   reading the audit of changes; on `Soul::Tool::"soulbase.server.conversations"`:
///   an agent-loop conversation's own evidence), the registry/skill administration actions `register`,
///   `update`, `unregister`, `enable`, `disable`, `deprecate`, `reload` (on
///   resource `Soul::Tool::"soulbase.server.config"`), and `consent_issue` (issuing
///   consent for a tool; revoking on `Soul::Tool::"soulbase.server.consent"`).
pub const SCHEMA: &str = r#"
namespace Soul {
  entity Tenant;
  entity Role;
  entity Actor in [Tenant, Role] = { "tenant": String, "actor": String, "scopes": Set<String> };
  entity Group;
  entity Package in [Group];
  entity Tool in [Package, Group] = { "id": String, "tenant": String, "global": Bool };
  action invoke, preflight, list, read_evidence, register, update, unregister, enable, disable, deprecate, reload, consent_issue
    appliesTo { principal: [Actor], resource: [Tool], context: { "tool_scopes": Set<String> } };
}
"#;

fn invalid(msg: impl Into<String>) -> SoulError {
    SoulError::new(ErrorCode::ConfigInvalid, "the Cedar policies are invalid")
        .with_field("field", "auth.cedar")
        .with_note(msg.into())
}

fn type_name(name: &str) -> Result<EntityTypeName, SoulError> {
    EntityTypeName::from_str(name).map_err(|e| invalid(format!("entity type {name}: {e}")))
}

/// The compiled policy set: validated, indexed and hashed.
pub struct CedarPolicySet {
    /// Policies confined to one tenant by their principal constraint, by tenant.
    tenants: HashMap<String, PrincipalSlices>,
    /// Policies confined to no tenant.
    global: PrincipalSlices,
    hash: String,
    count: usize,
    engine: CedarEngine,
    types: Types,
    actions: HashMap<crate::Action, EntityUid>,
    /// Exact decision cache: the decision is a pure function of the request (every
    /// input — tenant, actor, roles, scopes, tool, owner, action — is in the key) and of
    /// this set, so a reload starts with an empty cache. It only answers authorization:
    /// quota and consent are checked after it on every call.
    cache: RwLock<HashMap<String, Result<Vec<Obligation>, String>>>,
    /// The obligations of the permits that carry an `@obligations` annotation.
    obligations: HashMap<PolicyId, Vec<Obligation>>,
    /// Each subject's principal entity, built once (keyed by the whole subject: tenant,
    /// actor, roles, scopes). Distinct from the decision cache: a hit here still has
    /// every decision computed by the engine. Per set, so a reload starts empty.
    subjects: ExactCache<Subject, Arc<SubjectEntities>>,
    /// Each tool's resource entity, built once (keyed by tool id and owner).
    tools: ExactCache<ToolKey, Arc<ToolEntity>>,
}

/// The annotation of a permit that binds what it allows with obligations: a JSON
/// array, e.g. `@obligations("[{\"kind\": \"redact\", \"pointer\": \"/ssn\"}]")`.
pub const OBLIGATIONS_ANNOTATION: &str = "obligations";

/// Cached decisions per policy set; past this the cache is cleared and refills.
const CACHE_CAPACITY: usize = 100_000;

/// Cached subject (and, separately, tool) entities per policy set; past this the cache
/// is cleared and refills.
const ENTITY_CACHE_CAPACITY: usize = 10_000;

/// An unambiguous key: every part is length-prefixed, so no choice of role or scope
/// strings can make two different requests share a key.
fn cache_key(req: &AuthzRequest<'_>) -> String {
    use std::fmt::Write;
    let s = req.subject;
    let mut key = String::with_capacity(160);
    let mut part = |p: &str| {
        let _ = write!(key, "{}:{p}", p.len());
    };
    part(s.tenant.as_str());
    part(s.actor.as_str());
    part(req.tool.as_str());
    part(req.action.as_str());
    match req.tool_tenant {
        Some(t) => part(t.as_str()),
        None => part("*global*"),
    }
    part(&s.roles.len().to_string());
    for r in &s.roles {
        part(r);
    }
    part(&req.tool_scopes.len().to_string());
    for sc in req.tool_scopes {
        part(sc);
    }
    part(&s.scopes.len().to_string());
    for sc in &s.scopes {
        part(sc);
    }
    key
}

/// A bounded map whose keys are compared exactly (by the caller's `matches`), bucketed
/// by a hash of the key, so a lookup borrows the request instead of building a key.
struct ExactCache<K, V> {
    state: RandomState,
    inner: RwLock<Buckets<K, V>>,
}

struct Buckets<K, V> {
    map: HashMap<u64, Vec<(K, V)>>,
    len: usize,
}

impl<K, V: Clone> ExactCache<K, V> {
    fn new() -> Self {
        Self {
            state: RandomState::new(),
            inner: RwLock::new(Buckets {
                map: HashMap::new(),
                len: 0,
            }),
        }
    }

    fn hash(&self, key: impl std::hash::Hash) -> u64 {
        self.state.hash_one(key)
    }

    fn get(&self, hash: u64, matches: impl Fn(&K) -> bool) -> Option<V> {
        let inner = self.inner.read().ok()?;
        let bucket = inner.map.get(&hash)?;
        bucket
            .iter()
            .find(|(k, _)| matches(k))
            .map(|(_, v)| v.clone())
    }

    /// The cached value, or `build`'s (then cached). A poisoned lock only loses caching.
    fn get_or_build<E>(
        &self,
        hash: u64,
        matches: impl Fn(&K) -> bool,
        build: impl FnOnce() -> Result<(K, V), E>,
    ) -> Result<V, E> {
        if let Some(v) = self.get(hash, &matches) {
            return Ok(v);
        }
        let (key, value) = build()?;
        if let Ok(mut inner) = self.inner.write() {
            if inner.len >= ENTITY_CACHE_CAPACITY {
                inner.map.clear();
                inner.len = 0;
            }
            let bucket = inner.map.entry(hash).or_default();
            if !bucket.iter().any(|(k, _)| matches(k)) {
                bucket.push((key, value.clone()));
                inner.len += 1;
            }
        }
        Ok(value)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.read().map_or(0, |i| i.len)
    }
}

/// A subject's principal entity, alone in an `Entities` whose transitive closure is
/// computed: a decision clones it (reference counts) and adds the tool entity.
struct SubjectEntities {
    principal: EntityUid,
    entities: Entities,
}

/// What a tool entity is built from: the tool id and its owner (`None`: global).
type ToolKey = (ToolId, Option<TenantId>);

/// A tool's resource entity.
struct ToolEntity {
    resource: EntityUid,
    entity: Entity,
}

/// Policies of one principal scope, by the resource their scope constraint names.
#[derive(Default)]
struct ResourceSlices {
    /// `resource == / in Soul::Tool::"<id>"`, by tool id.
    tools: HashMap<String, PolicySet>,
    /// `resource in Soul::Package::"<group.pkg>"`, by package.
    packages: HashMap<String, PolicySet>,
    /// `resource in Soul::Group::"<group>"`, by group.
    groups: HashMap<String, PolicySet>,
    /// Any other resource constraint (none, `is`, other types).
    any: Option<PolicySet>,
}

impl ResourceSlices {
    fn add(&mut self, key: ResourceKey, p: Policy) -> Result<(), SoulError> {
        let set = match key {
            ResourceKey::Tool(id) => self.tools.entry(id).or_default(),
            ResourceKey::Package(id) => self.packages.entry(id).or_default(),
            ResourceKey::Group(id) => self.groups.entry(id).or_default(),
            ResourceKey::Any => self.any.get_or_insert_with(PolicySet::new),
        };
        set.add(p).map_err(|e| invalid(e.to_string()))
    }

    fn collect<'a>(&'a self, r: &ToolParts<'_>, out: &mut Vec<&'a PolicySet>) {
        out.extend(self.tools.get(r.tool));
        out.extend(self.packages.get(r.package));
        out.extend(self.groups.get(r.group));
        out.extend(self.any.as_ref());
    }
}

/// Policies of one tenant (or of none), by principal.
#[derive(Default)]
struct PrincipalSlices {
    /// Policies whose principal constraint names no single actor of the tenant.
    shared: ResourceSlices,
    /// `principal == Soul::Actor::"<tenant>/<actor>"`, by actor (the part after the
    /// tenant's `/`): they can only apply to that one principal.
    actors: HashMap<String, ResourceSlices>,
}

impl PrincipalSlices {
    fn collect<'a>(&'a self, actor: &str, r: &ToolParts<'_>, out: &mut Vec<&'a PolicySet>) {
        self.shared.collect(r, out);
        if let Some(slices) = self.actors.get(actor) {
            slices.collect(r, out);
        }
    }
}

/// The slice key of a resource constraint.
enum ResourceKey {
    Tool(String),
    Package(String),
    Group(String),
    Any,
}

/// A tool id and the package and group entities it belongs to: `g.p.name` is in
/// `Soul::Package::"g.p"` and `Soul::Group::"g"`.
struct ToolParts<'a> {
    tool: &'a str,
    package: &'a str,
    group: &'a str,
}

fn tool_parts(tool: &str) -> ToolParts<'_> {
    let (group, rest) = tool.split_once('.').unwrap_or((tool, ""));
    let package = match rest.split_once('.') {
        Some((p, _)) => tool.get(..group.len() + 1 + p.len()).unwrap_or(tool),
        None => tool,
    };
    ToolParts {
        tool,
        package,
        group,
    }
}

struct Types {
    actor: EntityTypeName,
    tenant: EntityTypeName,
    role: EntityTypeName,
    tool: EntityTypeName,
    package: EntityTypeName,
    group: EntityTypeName,
}

fn uid(t: &EntityTypeName, id: &str) -> EntityUid {
    EntityUid::from_type_name_and_id(t.clone(), EntityId::new(id))
}

/// The principal scope of a policy: the tenant its principal constraint confines it to,
/// if any, and the actor (within that tenant) when it names exactly one
/// (`principal == Soul::Actor::"<tenant>/<actor>"`).
fn principal_scope(c: &PrincipalConstraint, types: &Types) -> (Option<String>, Option<String>) {
    let tenant_of = |u: &EntityUid| -> Option<String> {
        let id = u.id().unescaped();
        if u.type_name() == &types.tenant {
            Some(id.to_owned())
        } else if u.type_name() == &types.actor {
            id.split_once('/').map(|(t, _)| t.to_owned())
        } else {
            None
        }
    };
    match c {
        PrincipalConstraint::Eq(u) if u.type_name() == &types.actor => {
            match u.id().unescaped().split_once('/') {
                Some((t, a)) => (Some(t.to_owned()), Some(a.to_owned())),
                None => (None, None),
            }
        }
        PrincipalConstraint::In(u) | PrincipalConstraint::Eq(u) => (tenant_of(u), None),
        PrincipalConstraint::IsIn(_, u) => (tenant_of(u), None),
        _ => (None, None),
    }
}

/// The slice key of a resource constraint.
fn resource_key(c: &ResourceConstraint, types: &Types) -> ResourceKey {
    let key_of = |u: &EntityUid| -> ResourceKey {
        let id = u.id().unescaped().to_owned();
        if u.type_name() == &types.tool {
            ResourceKey::Tool(id)
        } else if u.type_name() == &types.package {
            ResourceKey::Package(id)
        } else if u.type_name() == &types.group {
            ResourceKey::Group(id)
        } else {
            ResourceKey::Any
        }
    };
    match c {
        ResourceConstraint::In(u) | ResourceConstraint::Eq(u) => key_of(u),
        ResourceConstraint::IsIn(_, u) => key_of(u),
        _ => ResourceKey::Any,
    }
}

impl CedarPolicySet {
    /// Parses, validates and indexes `sources` (`(name, cedar text)` pairs). Every
    /// problem names its source; templates are refused (only static policies).
    pub fn compile(sources: &[(String, String)]) -> Result<Self, SoulError> {
        let (schema, _warnings) =
            Schema::from_cedarschema_str(SCHEMA).map_err(|e| invalid(format!("schema: {e}")))?;
        let types = Types {
            actor: type_name("Soul::Actor")?,
            tenant: type_name("Soul::Tenant")?,
            role: type_name("Soul::Role")?,
            tool: type_name("Soul::Tool")?,
            package: type_name("Soul::Package")?,
            group: type_name("Soul::Group")?,
        };
        let action_type = type_name("Soul::Action")?;
        let actions = crate::Action::ALL
            .into_iter()
            .map(|a| (a, uid(&action_type, a.as_str())))
            .collect();
        let mut all = PolicySet::new();
        let mut obligations = HashMap::new();
        let mut hasher = Sha256::new();
        let mut policies: Vec<Policy> = Vec::new();
        for (name, text) in sources {
            hasher.update(name.as_bytes());
            hasher.update([0]);
            hasher.update(text.as_bytes());
            hasher.update([0]);
            let set = PolicySet::from_str(text).map_err(|e| invalid(format!("{name}: {e}")))?;
            if set.templates().next().is_some() {
                return Err(invalid(format!("{name}: templates are not supported")));
            }
            for (i, p) in set.policies().enumerate() {
                let id = PolicyId::new(format!("{name}#{i}"));
                if let Some(text) = p.annotation(OBLIGATIONS_ANNOTATION) {
                    if p.effect() == Effect::Forbid {
                        return Err(invalid(format!(
                            "{id}: @{OBLIGATIONS_ANNOTATION} binds what a permit allows; a forbid allows nothing"
                        )));
                    }
                    let list: Vec<Obligation> = serde_json::from_str(text).map_err(|e| {
                        invalid(format!(
                            "{id}: @{OBLIGATIONS_ANNOTATION} must be a JSON array of obligations: {e}"
                        ))
                    })?;
                    if let Some(why) = list.iter().find_map(Obligation::pointer_problem) {
                        return Err(invalid(format!(
                            "{id}: @{OBLIGATIONS_ANNOTATION}: a pointer {why}"
                        )));
                    }
                    obligations.insert(id.clone(), list);
                }
                let p = p.new_id(id);
                all.add(p.clone())
                    .map_err(|e| invalid(format!("{name}: {e}")))?;
                policies.push(p);
            }
        }
        let result = Validator::new(schema).validate(&all, ValidationMode::Strict);
        if !result.validation_passed() {
            let problems: Vec<String> = result
                .validation_errors()
                .map(|e| format!("{}: {e}", e.policy_id()))
                .collect();
            return Err(invalid(problems.join("; ")));
        }
        let mut tenants: HashMap<String, PrincipalSlices> = HashMap::new();
        let mut global = PrincipalSlices::default();
        for p in policies.iter() {
            let (tenant, actor) = principal_scope(&p.principal_constraint(), &types);
            let key = resource_key(&p.resource_constraint(), &types);
            let by_principal = match tenant {
                Some(t) => tenants.entry(t).or_default(),
                None => &mut global,
            };
            let by_resource = match actor {
                Some(a) => by_principal.actors.entry(a).or_default(),
                None => &mut by_principal.shared,
            };
            by_resource.add(key, p.clone())?;
        }
        Ok(Self {
            tenants,
            global,
            hash: format!("sha256:{}", hex::encode(hasher.finalize())),
            count: policies.len(),
            engine: CedarEngine::new(),
            types,
            actions,
            cache: RwLock::new(HashMap::new()),
            obligations,
            subjects: ExactCache::new(),
            tools: ExactCache::new(),
        })
    }

    /// Content hash of the sources (recorded in evidence as the policy hash).
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// How many policies are loaded.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no policy is loaded (then everything is denied).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The subject's principal entity (built on first use, then cached).
    fn subject_entities(&self, s: &Subject) -> Result<Arc<SubjectEntities>, String> {
        let hash = self
            .subjects
            .hash((s.tenant.as_str(), s.actor.as_str(), &s.roles, &s.scopes));
        self.subjects
            .get_or_build(hash, |k| k == s, || self.build_subject(s))
    }

    fn build_subject(&self, s: &Subject) -> Result<(Subject, Arc<SubjectEntities>), String> {
        let t = &self.types;
        let principal = uid(&t.actor, &format!("{}/{}", s.tenant, s.actor));
        let mut parents: HashSet<EntityUid> = s.roles.iter().map(|r| uid(&t.role, r)).collect();
        parents.insert(uid(&t.tenant, s.tenant.as_str()));
        let actor = Entity::new(
            principal.clone(),
            HashMap::from([
                (
                    "tenant".to_owned(),
                    RestrictedExpression::new_string(s.tenant.to_string()),
                ),
                (
                    "actor".to_owned(),
                    RestrictedExpression::new_string(s.actor.to_string()),
                ),
                (
                    "scopes".to_owned(),
                    RestrictedExpression::new_set(
                        s.scopes
                            .iter()
                            .map(|x| RestrictedExpression::new_string(x.clone())),
                    ),
                ),
            ]),
            parents,
        )
        .map_err(|e| e.to_string())?;
        let entities = Entities::empty()
            .add_entities([actor], None)
            .map_err(|e| e.to_string())?;
        Ok((
            s.clone(),
            Arc::new(SubjectEntities {
                principal,
                entities,
            }),
        ))
    }

    /// The tool's resource entity (built on first use, then cached).
    fn tool_entity(&self, req: &AuthzRequest<'_>) -> Result<Arc<ToolEntity>, String> {
        let owner = req.tool_tenant;
        let hash = self
            .tools
            .hash((req.tool.as_str(), owner.map(TenantId::as_str)));
        self.tools.get_or_build(
            hash,
            |(tool, o)| tool == req.tool && o.as_ref() == owner,
            || self.build_tool(req.tool, owner),
        )
    }

    fn build_tool(
        &self,
        tool: &ToolId,
        owner: Option<&TenantId>,
    ) -> Result<(ToolKey, Arc<ToolEntity>), String> {
        let t = &self.types;
        let resource = uid(&t.tool, tool.as_str());
        let parts = tool_parts(tool.as_str());
        let entity = Entity::new(
            resource.clone(),
            HashMap::from([
                (
                    "id".to_owned(),
                    RestrictedExpression::new_string(tool.to_string()),
                ),
                (
                    "tenant".to_owned(),
                    RestrictedExpression::new_string(
                        owner.map(|t| t.to_string()).unwrap_or_default(),
                    ),
                ),
                (
                    "global".to_owned(),
                    RestrictedExpression::new_bool(owner.is_none()),
                ),
            ]),
            HashSet::from([uid(&t.package, parts.package), uid(&t.group, parts.group)]),
        )
        .map_err(|e| e.to_string())?;
        Ok((
            (tool.clone(), owner.cloned()),
            Arc::new(ToolEntity { resource, entity }),
        ))
    }

    /// The decision for one request: `Ok` with the obligations of the permits that
    /// decided to allow, else the reason to deny (for audit notes only; callers
    /// answer with a stable code). Served from the exact decision cache when this
    /// set has already answered the same request.
    pub fn evaluate(&self, req: &AuthzRequest<'_>) -> Result<Vec<Obligation>, String> {
        let key = cache_key(req);
        if let Ok(cache) = self.cache.read()
            && let Some(hit) = cache.get(&key)
        {
            return hit.clone();
        }
        let decision = self.evaluate_uncached(req);
        if let Ok(mut cache) = self.cache.write() {
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
            cache.insert(key, decision.clone());
        }
        decision
    }

    /// The decision computed by the Cedar engine, bypassing the decision cache (the
    /// subject and tool entities it is computed over are built once and reused).
    pub fn evaluate_uncached(&self, req: &AuthzRequest<'_>) -> Result<Vec<Obligation>, String> {
        let action = self
            .actions
            .get(&req.action)
            .ok_or_else(|| format!("unknown action {:?}", req.action.as_str()))?;
        let parts = tool_parts(req.tool.as_str());
        let actor = req.subject.actor.as_str();
        let mut applicable: Vec<&PolicySet> = Vec::with_capacity(8);
        if let Some(slices) = self.tenants.get(req.subject.tenant.as_str()) {
            slices.collect(actor, &parts, &mut applicable);
        }
        self.global.collect(actor, &parts, &mut applicable);
        if applicable.is_empty() {
            return Err("no policy applies".to_owned());
        }
        let subject = self.subject_entities(req.subject)?;
        let tool = self.tool_entity(req)?;
        // The subject's store already holds its closure; adding the tool only computes
        // the tool's (far cheaper than building both entities into a new store).
        let entities = subject
            .entities
            .clone()
            .add_entities([tool.entity.clone()], None)
            .map_err(|e| e.to_string())?;
        let request = Request::new(
            subject.principal.clone(),
            action.clone(),
            tool.resource.clone(),
            Context::from_pairs([(
                "tool_scopes".to_owned(),
                RestrictedExpression::new_set(
                    req.tool_scopes
                        .iter()
                        .map(|sc| RestrictedExpression::new_string(sc.clone())),
                ),
            )])
            .map_err(|e| e.to_string())?,
            None,
        )
        .map_err(|e| e.to_string())?;
        let mut permitted = false;
        let mut obligations: Vec<Obligation> = Vec::new();
        for set in applicable {
            let response = self.engine.is_authorized(&request, set, &entities);
            let diagnostics = response.diagnostics();
            if let Some(e) = diagnostics.errors().next() {
                return Err(format!("evaluation error (deny): {e}"));
            }
            match response.decision() {
                CedarDecision::Allow => {
                    permitted = true;
                    // Every permit that held binds the output with its obligations.
                    for id in diagnostics.reason() {
                        for ob in self.obligations.get(id).into_iter().flatten() {
                            if !obligations.contains(ob) {
                                obligations.push(ob.clone());
                            }
                        }
                    }
                }
                CedarDecision::Deny => {
                    if let Some(id) = diagnostics.reason().next() {
                        return Err(format!("forbidden by {id}"));
                    }
                }
            }
        }
        if permitted {
            Ok(obligations)
        } else {
            Err("no permit holds".to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use soulbase_types::{ActorId, Subject, TenantId, ToolId};

    use super::*;

    fn set(text: &str) -> CedarPolicySet {
        CedarPolicySet::compile(&[("t.cedar".to_owned(), text.to_owned())]).unwrap()
    }

    fn subject(tenant: &str, actor: &str, roles: &[&str]) -> Subject {
        let mut s = Subject::new(TenantId::new(tenant).unwrap(), ActorId::new(actor).unwrap());
        for r in roles {
            s = s.with_role(*r);
        }
        s
    }

    fn computed(
        set: &CedarPolicySet,
        who: &Subject,
        tool: &str,
        owner: Option<&str>,
    ) -> Result<(), String> {
        let tool = ToolId::new(tool).unwrap();
        let owner = owner.map(|o| TenantId::new(o).unwrap());
        set.evaluate_uncached(&AuthzRequest {
            subject: who,
            tool: &tool,
            tool_tenant: owner.as_ref(),
            action: crate::Action::Invoke,
            tool_scopes: &[],
        })
        .map(drop)
    }

    #[test]
    fn tool_parts_name_the_package_and_group() {
        let p = tool_parts("fs.files.read");
        assert_eq!(
            (p.tool, p.package, p.group),
            ("fs.files.read", "fs.files", "fs")
        );
        let p = tool_parts("a.b.c.d");
        assert_eq!((p.package, p.group), ("a.b", "a"));
    }

    #[test]
    fn policies_are_sliced_by_tenant_actor_and_resource() {
        let s = set(r#"
            permit(principal in Soul::Tenant::"acme", action, resource == Soul::Tool::"fs.files.read");
            permit(principal in Soul::Tenant::"acme", action, resource in Soul::Package::"fs.files");
            forbid(principal == Soul::Actor::"acme/mallory", action, resource);
            forbid(principal == Soul::Actor::"acme/a/b", action, resource in Soul::Group::"fs");
            permit(principal in Soul::Role::"admin", action, resource);
            "#);
        let acme = &s.tenants["acme"];
        assert_eq!(acme.shared.tools.len(), 1);
        assert_eq!(acme.shared.packages.len(), 1);
        assert!(acme.actors["mallory"].any.is_some());
        assert_eq!(acme.actors["a/b"].groups.len(), 1);
        assert!(s.global.shared.any.is_some());

        let alice = subject("acme", "alice", &[]);
        assert!(computed(&s, &alice, "fs.files.read", None).is_ok());
        let mallory = subject("acme", "mallory", &[]);
        assert!(
            computed(&s, &mallory, "fs.files.read", None)
                .unwrap_err()
                .starts_with("forbidden")
        );
        // An actor id containing `/` keys exactly the part after the tenant.
        let ab = subject("acme", "a/b", &[]);
        assert!(computed(&s, &ab, "fs.files.read", None).is_err());
        assert!(computed(&s, &subject("acme", "a", &[]), "fs.files.read", None).is_ok());
        assert!(computed(&s, &subject("beta", "alice", &[]), "fs.files.read", None).is_err());
        assert!(computed(&s, &subject("beta", "x", &["admin"]), "fs.files.read", None).is_ok());
    }

    #[test]
    fn an_erroring_forbid_in_an_actor_slice_still_denies() {
        let s = set(r#"
            permit(principal, action, resource);
            forbid(principal == Soul::Actor::"acme/alice", action, resource)
              when { 9223372036854775807 + 1 > 0 };
            "#);
        assert!(
            computed(&s, &subject("acme", "alice", &[]), "a.b.c", None)
                .unwrap_err()
                .contains("evaluation error")
        );
        assert!(computed(&s, &subject("acme", "bob", &[]), "a.b.c", None).is_ok());
    }

    #[test]
    fn entities_are_built_once_per_exact_subject_and_tool() {
        let s = set(r#"
            permit(principal in Soul::Role::"admin", action, resource) when { resource.global };
            permit(principal, action, resource) when { principal.scopes.contains("x") };
            "#);
        let admin = subject("acme", "alice", &["admin"]);
        for _ in 0..3 {
            assert!(computed(&s, &admin, "a.b.c", None).is_ok());
        }
        assert_eq!(s.subjects.len(), 1);
        assert_eq!(s.tools.len(), 1);

        // Same tenant and actor without the role: another entity, another answer.
        let plain = subject("acme", "alice", &[]);
        assert!(computed(&s, &plain, "a.b.c", None).is_err());
        // With a scope: another entity again.
        let scoped = subject("acme", "alice", &[]).with_scope("x");
        assert!(computed(&s, &scoped, "a.b.c", None).is_ok());
        assert_eq!(s.subjects.len(), 3);

        // Same tool id owned by a tenant: another tool entity (`global` is false).
        assert!(computed(&s, &admin, "a.b.c", Some("acme")).is_err());
        assert_eq!(s.tools.len(), 2);
        // The earlier entries still answer as before.
        assert!(computed(&s, &admin, "a.b.c", None).is_ok());
        assert!(computed(&s, &plain, "a.b.c", None).is_err());
    }

    #[test]
    fn the_entity_caches_are_bounded() {
        let s = set("permit(principal, action, resource);");
        for i in 0..ENTITY_CACHE_CAPACITY + 5 {
            let who = subject("acme", &format!("a{i}"), &[]);
            assert!(computed(&s, &who, "a.b.c", None).is_ok());
        }
        assert!(s.subjects.len() <= ENTITY_CACHE_CAPACITY);
        assert!(s.subjects.len() >= 1);
    }

    #[test]
    fn no_entity_is_built_when_no_policy_applies() {
        let s = set(r#"permit(principal in Soul::Tenant::"acme", action, resource);"#);
        assert_eq!(
            computed(&s, &subject("beta", "bob", &[]), "a.b.c", None).unwrap_err(),
            "no policy applies"
        );
        assert_eq!(s.subjects.len(), 0);
        assert_eq!(s.tools.len(), 0);
    }
}
