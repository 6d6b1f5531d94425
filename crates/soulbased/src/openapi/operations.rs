//! Each route's operation: what it is, what it reads, and every status it
//! answers with the schema of each body — beside [`ROUTES`], keyed like the
//! router's own table (`http_api::endpoint`) by method and path.
//!
//! Every operation also answers 408 and 413 (the body limits are on every
//! route), and every authenticated one 401, 500 and 502 (the auth role
//! unreachable).
//!
//! [`ROUTES`]: crate::http_api::ROUTES

use serde_json::{Map, Value, json};
use soulbase_edge::SKILL_HEADER;
use soulbase_edge::meta::{
    CALL_ID_HEADER, CONSENT_HEADER, IDEMPOTENCY_KEY_HEADER, TRACEPARENT_HEADER,
};

use super::{Spec, described, errors};
use crate::access_api::{AllowListBody, OverrideBody};
use crate::audit_api::AuditQuery;
use crate::bodies::{
    AuditList, EvidenceBody, ModelTools, Prompt, ReloadReport, RevokedConsent, SkillList,
    SkillView, Status, ToolList, ToolView,
};
use crate::consent_api::{ApproveBody, ConsentRequestList, DeclineBody, RequestsQuery};
use crate::evidence_api::{DenialListQuery, EvidenceListQuery};
use crate::http_api::{
    ConsentBody, EvidenceReadQuery, ListQuery, PreflightAs, Route, SkillPatch, SkillsQuery,
};
use crate::model_api::{PromptQuery, ToolsQuery};
use crate::overview_api::{Overview, OverviewQuery};
use crate::quarantine_api::{QuarantineList, QuarantineRetry};
use crate::tool_state_api::ToolStateBody;

/// One operation of the document, being described.
pub(crate) struct Op {
    fields: Map<String, Value>,
    parameters: Vec<Value>,
    responses: Map<String, Value>,
}

/// A reference to a shared parameter.
fn shared(name: &str) -> Value {
    json!({"$ref": format!("#/components/parameters/{name}")})
}

impl Op {
    /// Operation `id` under `tag`, summed up by `summary`; authenticated, and
    /// answering the body limits' 408 and 413.
    fn new(id: &str, tag: &str, summary: &str) -> Op {
        let mut fields = Map::new();
        fields.insert("operationId".into(), id.into());
        fields.insert("summary".into(), summary.into());
        fields.insert("tags".into(), json!([tag]));
        Op {
            fields,
            parameters: Vec::new(),
            responses: Map::new(),
        }
        .fails(&[408, 413])
    }

    /// An authenticated operation: it also answers 401, 500 and 502.
    fn authenticated(id: &str, tag: &str, summary: &str) -> Op {
        Op::new(id, tag, summary).fails(&[401, 500, 502])
    }

    /// An operation anyone may call: no credential is read.
    fn public(id: &str, summary: &str) -> Op {
        let mut op = Op::new(id, "operations", summary);
        op.fields.insert("security".into(), json!([]));
        op
    }

    /// Listed under `tag` too.
    fn also(mut self, tag: &str) -> Op {
        if let Some(Value::Array(tags)) = self.fields.get_mut("tags") {
            tags.push(tag.into());
        }
        self
    }

    fn describe(mut self, text: &str) -> Op {
        self.fields.insert("description".into(), text.into());
        self
    }

    fn params(mut self, params: impl IntoIterator<Item = Value>) -> Op {
        self.parameters.extend(params);
        self
    }

    /// The `x-soulbase-skill` binding header.
    fn skill_bound(self) -> Op {
        self.params([shared("Skill")])
    }

    /// Its JSON body, `schema`, with an example.
    fn body(mut self, required: bool, schema: Value, example: Value) -> Op {
        self.fields.insert(
            "requestBody".into(),
            json!({
                "required": required,
                "content": {"application/json": {"schema": schema, "example": example}},
            }),
        );
        self
    }

    /// Answers `status` with `schema` as `content_type`.
    fn answers(mut self, status: u16, description: &str, content_type: &str, schema: Value) -> Op {
        self.responses.insert(
            status.to_string(),
            json!({
                "description": description,
                "content": {content_type: {"schema": schema}},
            }),
        );
        self
    }

    /// Answers `status` with a JSON body of `schema`.
    fn json(self, status: u16, description: &str, schema: Value) -> Op {
        self.answers(status, description, "application/json", schema)
    }

    /// Answers each of `statuses` with its shared error response.
    fn fails(mut self, statuses: &[u16]) -> Op {
        for &status in statuses {
            if let Some(r) = errors::failure(status) {
                self.responses.insert(status.to_string(), r);
            }
        }
        self
    }

    /// The operation object.
    pub(crate) fn into_json(mut self) -> Value {
        if !self.parameters.is_empty() {
            self.fields
                .insert("parameters".into(), Value::Array(self.parameters));
        }
        self.fields
            .insert("responses".into(), Value::Object(self.responses));
        Value::Object(self.fields)
    }
}

/// The parameters several operations share (`#/components/parameters/…`),
/// named by the headers `soulbase_edge` reads.
pub(crate) fn shared_parameters() -> Map<String, Value> {
    let none = "An empty value, or one that is not visible ASCII, is read as none.";
    let header = |name: &str, description: String, schema: Value| json!({"name": name, "in": "header", "required": false, "description": description, "schema": schema});
    let mut out = Map::new();
    out.insert(
        "Skill".into(),
        header(
            SKILL_HEADER,
            format!("Acts on behalf of skill NAME (its imports are checked); honoured only for a subject holding scope `skill:NAME` or `skills:*` (or with `server.dev_insecure`), else `AUTH.FORBIDDEN`; not a skill name: `SCHEMA.VALIDATION_FAILED`. {none}"),
            json!({"type": "string", "pattern": "^[a-z0-9_-]{0,64}$"}),
        ),
    );
    out.insert(
        "IdempotencyKey".into(),
        header(
            IDEMPOTENCY_KEY_HEADER,
            format!("A keyed call runs at most once per (tenant, tool, key): a retry answers the stored result (`replayed: true`); the same key with other arguments is `IDEMPOTENCY.CONFLICT`. At most 255 bytes of printable text; a tool idempotent by key refuses a call without one (`SCHEMA.VALIDATION_FAILED`, `fields.field`: `idempotency_key`). {none}"),
            json!({"type": "string", "maxLength": 255}),
        ),
    );
    out.insert(
        "Consent".into(),
        header(
            CONSENT_HEADER,
            format!("A consent token (`POST /api/consent`) for a tool that needs consent. {none}"),
            json!({"type": "string"}),
        ),
    );
    let mut trace = header(
        TRACEPARENT_HEADER,
        format!(
            "W3C trace context; recorded in the evidence. Malformed: `SCHEMA.VALIDATION_FAILED` (`fields.field`: `traceparent`). {none}"
        ),
        json!({"type": "string", "pattern": "^([0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2})?$"}),
    );
    trace["example"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into();
    out.insert("Traceparent".into(), trace);
    out.insert(
        "CallId".into(),
        header(
            CALL_ID_HEADER,
            format!("The call's id, chosen by the caller (e.g. a model's `tool_call.id`); minted when absent. Malformed: `SCHEMA.VALIDATION_FAILED` (`fields.field`: `call_id`). {none}"),
            json!({"type": "string", "pattern": "^([A-Za-z0-9][A-Za-z0-9_.:-]{0,127})?$"}),
        ),
    );
    out.insert(
        "ToolId".into(),
        json!({
            "name": "id",
            "in": "path",
            "required": true,
            "description": "The tool id (dotted, e.g. `soulbase.builtin.echo`).",
            "schema": {"type": "string"},
            "example": "soulbase.builtin.echo",
        }),
    );
    out.insert(
        "SkillName".into(),
        json!({
            "name": "name",
            "in": "path",
            "required": true,
            "description": "The skill name.",
            "schema": {"type": "string"},
            "example": "greet",
        }),
    );
    out
}

/// The headers an invoke and a preflight read besides the binding.
fn call_options() -> [Value; 5] {
    [
        shared("IdempotencyKey"),
        shared("Consent"),
        shared("Traceparent"),
        shared("Skill"),
        shared("CallId"),
    ]
}

/// The operation of `route`; `None` for a route this table does not describe
/// (a test holds every route of the table to have one).
pub(crate) fn operation(route: &Route, spec: &mut Spec) -> Option<Op> {
    Some(match (route.method.as_str(), route.path) {
        ("GET", "/api/tools") => Op::authenticated("listTools", "tools", "The caller's governed tool list")
            .describe("The tools the caller may see (through the `x-soulbase-skill` binding, if any). A `state` other than `enabled` gives the operator's view: the tools of that state the caller may administer.")
            .params(spec.query::<ListQuery>())
            .skill_bound()
            .json(200, "The list.", spec.response::<ToolList<'_>>())
            .fails(&[400, 403, 404]),
        ("POST", "/api/tools/{id}/preflight") => Op::authenticated("preflightTool", "tools", "Dry-run a call")
            .describe("Runs every check of an invocation (resolve, input schema, authorization, terms, quota, consent) without executing or consuming anything. By default it asks about the caller. The policy simulator asks about someone else: `actor` (with optional `tenant`, `roles`, `scopes`) needs action `preflight` on `soulbase.server.simulator`; another tenant's actor only from a caller of the `global` tenant (else `AUTH.FORBIDDEN` naming `tenant`).")
            .params([shared("ToolId")])
            .params(spec.query::<PreflightAs>())
            .params(call_options())
            .body(false, described::arguments(spec), json!({"hello": "world"}))
            .json(200, "The call would run.", described::preflight_report(spec))
            .fails(&[400, 402, 403, 404, 429, 503]),
        ("PUT", "/api/tools/{id}/state") => Op::authenticated("setToolState", "tools", "Enable, pause or deprecate a tool")
            .describe("A tool of the caller's tenant (`owner: tenant`, the default) or a global tool (`owner: global`). Needs the change's action on the tool: `enable`, `disable` (to pause) or `deprecate`. Applied through the registry (announced to every replica) and written to the audit log naming the caller; the answer is the tool as the caller now sees it. A tenant pausing a global tool for itself only is `PUT /api/access/overrides/{id}`.")
            .params([shared("ToolId")])
            .body(true, spec.request::<ToolStateBody>(), json!({"change": "pause"}))
            .json(200, "The tool after the change.", spec.response::<ToolView<'_>>())
            .fails(&[400, 403, 404, 409, 503]),
        ("POST", "/api/tools/{id}/invoke") => {
            let mut op = Op::new("invokeTool", "tools", "Invoke a tool through the governed path")
                .describe("Answers the whole normalized `CallResult` with the HTTP status of its code; only an unauthenticated caller and a body refused by the limits get the error envelope. A deprecated tool's answer carries `Deprecation` and `Sunset` headers.")
                .params([shared("ToolId")])
                .params(call_options())
                .body(false, described::arguments(spec), json!({"hello": "world"}))
                .json(200, "`status: ok`: the tool ran and returned `output`.", described::call_result(spec));
            if let Some(ok) = op.responses.get_mut("200") {
                ok["headers"] = json!({
                    "Deprecation": {"description": "RFC 9745: the tool is deprecated since this date (`@` Unix seconds), when its deprecation names one.", "schema": {"type": "string"}},
                    "Sunset": {"description": "RFC 8594: the day the tool goes away, when announced.", "schema": {"type": "string"}},
                });
            }
            for (status, response) in errors::invoke_failures(spec) {
                op.responses.insert(status.to_string(), response);
            }
            op
        }
        ("GET", "/api/skills") => Op::authenticated("listSkills", "skills", "The skills that show to the caller")
            .describe("Enabled skills with at least one tool in the caller's governed list, or of instructions only, in name order. With `all=true`: every loaded skill the caller may administer (action `enable`), enabled or not.")
            .params(spec.query::<SkillsQuery>())
            .skill_bound()
            .json(200, "The skills.", spec.response::<SkillList<'_>>())
            .fails(&[400, 403, 404]),
        ("GET", "/api/skills/{name}") => Op::authenticated("getSkill", "skills", "A skill's usage document (phase 2)")
            .also("model")
            .describe("A skill that shows to the caller, with its SKILL.md verbatim; `TOOL.NOT_FOUND` otherwise.")
            .params([shared("SkillName")])
            .skill_bound()
            .json(200, "The skill.", spec.response::<soulbase_skills::SkillInfo>())
            .fails(&[400, 403, 404]),
        ("PATCH", "/api/skills/{name}") => Op::authenticated("patchSkill", "skills", "Enable or disable a skill")
            .describe("Action `enable` / `disable` on each of the skill's tools (`skills.NAME.instructions` for a skill of instructions only). A disabled skill leaves every view from the next request on; the choice survives reloads.")
            .params([shared("SkillName")])
            .body(true, spec.request::<SkillPatch>(), json!({"enabled": false}))
            .json(200, "The skill as it is now.", spec.response::<SkillView<'_>>())
            .fails(&[400, 403, 404, 409]),
        ("GET", "/api/model/tools") => Op::authenticated("modelTools", "model", "The caller's tools as model tool definitions")
            .describe("The governed tool list as OpenAI, strict OpenAI, Anthropic or MCP definitions, the provider-safe names used, export warnings, and the skills that show (phase 1 of skill use).")
            .params(spec.query::<ToolsQuery>())
            .skill_bound()
            .json(200, "The definitions.", spec.response::<ModelTools>())
            .fails(&[400, 403, 404]),
        ("POST", "/api/model/tool_calls") => Op::authenticated("modelToolCalls", "model", "Run an assistant turn's tool calls")
            .describe("Each call goes through the governed path (origin `llm`, the call's id as its call id when well formed); a refused or failed call is answered in its answer, never as the status of this response.")
            .skill_bound()
            .body(
                true,
                described::tool_calls(spec),
                json!({"tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "soulbase_builtin_echo", "arguments": "{\"x\": 1}"}}]}),
            )
            .json(200, "The answers, one per call, in order.", described::tool_call_answers(spec))
            .fails(&[400, 403, 404]),
        ("GET", "/api/model/prompt") => Op::authenticated("modelPrompt", "model", "The system-prompt sections")
            .describe("Available Tools, Skills, and Tool Calling Guidelines when `max_iterations` is given.")
            .params(spec.query::<PromptQuery>())
            .skill_bound()
            .json(200, "The sections.", spec.response::<Prompt>())
            .fails(&[400, 403, 404]),
        ("POST", "/v1/chat/completions") => Op::authenticated("chatCompletions", "model", "A governed agent conversation (OpenAI chat completions)")
            .describe("The conversation is sent to the configured upstream model (`model.upstream`) with the caller's governed tools and the prompt sections; each tool call the model makes runs through the governed path and its answer is appended, until the model answers, `max_iterations` (default `model.max_iterations`, at most `model.max_iterations_cap`) turns were made, or the token budget (`model.max_tokens`) is spent. The answer is the model's last response, with a `soulbase` object: the conversation's id (its evidence), the iterations, the tool calls made and why the conversation ended. With `stream: true` the answer is server-sent events in the OpenAI chunk format (role, content, finish with the `soulbase` summary, `[DONE]`), each tool call announced by an SSE comment line as it finishes; an error after the stream began is a `data: {\"error\": …}` event.")
            .skill_bound()
            .body(true, described::chat_request(spec), json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Echo hello."}]}))
            .json(200, "The model's last response and the conversation's summary; with `stream: true`, server-sent events.", described::chat_completion(spec))
            .also_answers_stream()
            .fails(&[400, 403, 404, 504]),
        ("POST", "/api/reload") => Op::authenticated("reload", "operations", "Re-read the configuration and the skills directory")
            .describe("Action `reload` on `soulbase.server.config`. An invalid configuration is `CONFIG.INVALID` and the previous one stays.")
            .json(200, "Reloaded (or unchanged).", spec.response::<ReloadReport>())
            .fails(&[400, 403, 404]),
        ("GET", "/api/config/schema") => Op::public("configSchema", "The JSON Schema of config.yaml")
            .describe("Derived from the configuration model (the same document as `docs/config.schema.json`); holds no configuration values.")
            .json(200, "The schema.", described::config_schema()),
        ("GET", "/api/openapi.json") => Op::public("openapi", "This document")
            .describe("The OpenAPI document of the HTTP API, as committed in `docs/openapi.json`.")
            .json(200, "The document.", described::openapi_document()),
        ("GET", "/api/overview") => Op::authenticated("getOverview", "evidence", "What the caller's tenant's calls did lately")
            .describe("Over the last `window_s` seconds (default 300), from the evidence store: calls that began, per second, by status (`open` while running), failed calls by stable code, each surface's and each tool's p50/p99 execution time, and the calls refused before they ran by code (`denials`, `denials_by_code`) — only calls of tools whose evidence the caller may read, at most 10,000 calls (`truncated` says when more began). A caller of the `global` tenant also gets the process's evidence queue (`evidence`: records not yet in the store, written, quarantined, spool bytes, drain lag). The console's overview page polls it.")
            .params(spec.query::<OverviewQuery>())
            .json(200, "The figures.", spec.response::<Overview>())
            .fails(&[400, 503]),
        ("GET", "/api/quarantine") => Op::authenticated("listQuarantine", "evidence", "Evidence records the database refused for good")
            .describe("The spool's quarantine file (`docs/evidence.md`): each line's reason, and the record's envelope id, kind, call and tenant when it can be read. Needs action `read_evidence` on `soulbase.server.quarantine`. A caller sees only its own tenant's records; a caller of the `global` tenant sees every one, unreadable lines included. An operator offers them to the database again with `POST /api/quarantine/retry` (or, with the server stopped, `soulbase evidence quarantine retry`; `retry` says so).")
            .json(200, "The records, in file order.", spec.response::<QuarantineList>())
            .fails(&[403, 503]),
        ("POST", "/api/quarantine/retry") => Op::authenticated("retryQuarantine", "evidence", "Offer the quarantined evidence records to the database again")
            .also("operations")
            .describe("The running server's drainer offers every record of its spool's quarantine file to the store it drains into (the database, or the remote evidence role), between two batches: what the store takes leaves the file, what it still refuses stays with the reason it gives now, lines that cannot be read stay. The file is rewritten atomically once the store took what leaves it, so no record is ever lost (one may be offered twice: the store skips it). The whole file, every tenant's records: only a caller of the `global` tenant with action `update` on `soulbase.server.quarantine` may (another tenant is `AUTH.FORBIDDEN`, `fields.field`: `tenant`). Audited (`evidence.quarantine_retry`) when the file changed. `EVIDENCE.UNAVAILABLE` while the store is unavailable (the file stays as it was) and in a process without an evidence spool.")
            .json(200, "What the retry did.", spec.response::<QuarantineRetry>())
            .fails(&[403, 503]),
        ("GET", "/api/evidence") => Op::authenticated("listEvidence", "evidence", "The caller's tenant's calls")
            .describe("The calls of the caller's tenant, newest first, one page at a time: each call's Begin joined with its End (`status`, `error_code`, `duration_us` absent while it runs). Only calls of tools whose evidence the caller may read (action `read_evidence` on the tool) are listed; the others are left out of the page, so a page may hold fewer than `limit` calls while `next` still leads on. `actor` and `code` narrow it to one actor's calls and to calls that ended with one stable error code. Calls refused before they began (denials) have no Begin and are listed by `/api/denials`. `tenant` lists another tenant's calls: only for a caller of the `global` tenant with `read_evidence` on `soulbase.server.evidence` (all of them, no per-tool check; anyone else naming another tenant is `AUTH.FORBIDDEN`, `fields.field`: `tenant`). A bad query value is `SCHEMA.VALIDATION_FAILED` naming it in `fields.field`.")
            .params(spec.query::<EvidenceListQuery>())
            .json(200, "A page of calls, newest first; pass `next` as `after` for the next one.", spec.response::<soulbase_observe::CallPage>())
            .fails(&[400, 403, 503]),
        ("GET", "/api/denials") => Op::authenticated("listDenials", "evidence", "The caller's tenant's refused calls")
            .describe("The calls of the caller's tenant refused before they ran (their Denial records: tool as requested, actor, origin, code, when), newest first, one page at a time, filtered by tool, actor, stable error code and time. Only denials of tools whose evidence the caller may read (action `read_evidence` on the tool) are listed; a denial naming no tool id at all is listed for callers who may read the audit log (`read_evidence` on `soulbase.server.audit`). Read one whole at `/api/evidence/{call_id}`. `tenant` as for `/api/evidence`. A bad query value is `SCHEMA.VALIDATION_FAILED` naming it in `fields.field`.")
            .params(spec.query::<DenialListQuery>())
            .json(200, "A page of denials, newest first; pass `next` as `after` for the next one.", spec.response::<soulbase_observe::DenialPage>())
            .fails(&[400, 403, 503]),
        ("GET", "/api/evidence/{call_id}") => Op::authenticated("readEvidence", "evidence", "A call's evidence and replay summary")
            .describe("The records of one call of the caller's tenant (another tenant's call answers 404 exactly like an unknown one); needs action `read_evidence` on the call's tool. Given an agent-loop conversation's id (`conv_…`, answered as `soulbase.conversation_id`), the conversation's records and its replay; needs `read_evidence` on `soulbase.server.conversations`. `tenant` reads another tenant's call: only for a caller of the `global` tenant with `read_evidence` on `soulbase.server.evidence` (then no per-tool check; anyone else naming another tenant is `AUTH.FORBIDDEN`, `fields.field`: `tenant`).")
            .params(spec.query::<EvidenceReadQuery>())
            .params([json!({
                "name": "call_id",
                "in": "path",
                "required": true,
                "description": "The call id (`CallResult.call_id`). Malformed: `SCHEMA.VALIDATION_FAILED` (`fields.field`: `call_id`).",
                "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"},
            })])
            .json(200, "The records, oldest first, and what replay rebuilds from them.", spec.response::<EvidenceBody>())
            .fails(&[400, 403, 404, 503]),
        ("GET", "/api/audit") => Op::authenticated("listAudit", "audit", "The audit of changes")
            .describe("Registry, skill-state, skill-set and configuration changes that took effect, newest first: who made each (`actor`, `actor_tenant`; `system` for a file watcher or SIGHUP), the tenant whose view changed, the target, and hashes of the thing before and after. Needs action `read_evidence` on `soulbase.server.audit`. A caller sees only its own tenant's records (naming another `tenant` is `AUTH.FORBIDDEN`); a caller of the `global` tenant sees every tenant's, the global ones (configuration, skills, global tools) included. A bad query value is `SCHEMA.VALIDATION_FAILED` naming it in `fields.field`.")
            .params(spec.query::<AuditQuery>())
            .json(200, "The records, newest first.", spec.response::<AuditList>())
            .fails(&[400, 403, 404, 503]),
        ("POST", "/api/consent") => Op::authenticated("issueConsent", "consent", "Issue a consent token")
            .describe("Needs action `consent_issue` on the tool. The token lets `actor` (default: the caller) of the caller's tenant call the tool, optionally only with exactly `args`, until it expires: `ttl_ms` (default `auth.consent.default_ttl_ms`), capped by `auth.consent.max_ttl_ms` and the manifest's `consent.ttl_ms`. Send it as the `x-soulbase-consent` header.")
            .body(true, spec.request::<ConsentBody>(), json!({"tool": "skills.memo.memo", "actor": "alice", "ttl_ms": 600_000}))
            .json(201, "The token and what it grants.", spec.response::<soulbase_edge::IssuedView>())
            .fails(&[400, 403, 404]),
        ("POST", "/api/consent/{id}/revoke") => Op::authenticated("revokeConsent", "consent", "Revoke a consent token")
            .describe("Needs action `consent_issue` on `soulbase.server.consent`. Every replica sharing the evidence database refuses the token from its next call on (`CONSENT.REQUIRED`).")
            .params([json!({
                "name": "id",
                "in": "path",
                "required": true,
                "description": "The token id (`IssuedView.id`). Malformed: `SCHEMA.VALIDATION_FAILED` (`fields.field`: `id`).",
                "schema": {"type": "string", "pattern": "^[A-Za-z0-9-]{1,64}$"},
            })])
            .json(200, "Revoked.", spec.response::<RevokedConsent>())
            .fails(&[400, 403, 503]),
        ("GET", "/api/consent/requests") => Op::authenticated("listConsentRequests", "consent", "The caller's tenant's consent requests")
            .describe("A call refused `CONSENT.REQUIRED` (on any surface) opens a consent request — one pending request per tenant, actor, tool and arguments digest, reused by retries — named in the refusal's `fields.consent_request`. This lists the caller's tenant's requests, newest first (`status=pending` for those awaiting a decision; a pending request not decided within 24 hours reads `expired`), never with their tokens. Needs action `consent_issue` on `soulbase.server.consent`. A bad query value is `SCHEMA.VALIDATION_FAILED` naming it in `fields.field`.")
            .params(spec.query::<RequestsQuery>())
            .json(200, "The requests, newest first.", spec.response::<ConsentRequestList>())
            .fails(&[400, 403, 503]),
        ("GET", "/api/consent/requests/{id}") => Op::authenticated("getConsentRequest", "consent", "One consent request")
            .describe("Its requester (the refused caller: same tenant and actor) sees it with the token once approved — send it as `x-soulbase-consent`; an approver of the tenant (`consent_issue` on `soulbase.server.consent`) sees it without the token. Anyone else, another tenant included, is answered `CONSENT.REQUEST_NOT_FOUND` as for a request that does not exist.")
            .params([consent_request_id()])
            .json(200, "The request.", spec.response::<soulbase_edge::ConsentRequestView>())
            .fails(&[400, 404, 503]),
        ("POST", "/api/consent/requests/{id}/approve") => Op::authenticated("approveConsentRequest", "consent", "Approve a consent request")
            .describe("Issues a token for the requester through the same path as `POST /api/consent` (needs `consent_issue` on the tool, as well as on `soulbase.server.consent`): `scope` `call` (default) binds it to the refused call's arguments digest, `tool` lets any arguments pass; `ttl_ms` as for issuing, capped by `auth.consent.max_ttl_ms` and the manifest's `consent.ttl_ms`. The token is kept for the requester (`GET /api/consent/requests/{id}`); the decision is audited (`consent.approve`, naming the approver). A request no longer pending is `CONSENT.REQUEST_DECIDED` (`fields.status`).")
            .params([consent_request_id()])
            .body(false, spec.request::<ApproveBody>(), json!({"scope": "call", "ttl_ms": 600_000}))
            .json(200, "The request, approved.", spec.response::<soulbase_edge::ConsentRequestView>())
            .fails(&[400, 403, 404, 409, 503]),
        ("POST", "/api/consent/requests/{id}/decline") => Op::authenticated("declineConsentRequest", "consent", "Decline a consent request")
            .describe("Needs `consent_issue` on `soulbase.server.consent`. The requester reads the decision and the `reason`; the decision is audited (`consent.decline`, naming the approver). A request no longer pending is `CONSENT.REQUEST_DECIDED` (`fields.status`).")
            .params([consent_request_id()])
            .body(false, spec.request::<DeclineBody>(), json!({"reason": "not during the freeze"}))
            .json(200, "The request, declined.", spec.response::<soulbase_edge::ConsentRequestView>())
            .fails(&[400, 403, 404, 409, 503]),
        ("GET", "/api/access") => Op::authenticated("getAccess", "access", "The caller's tenant's view of the global tools")
            .describe("The allow-list and states of global tools stored for the caller's tenant through this API, and what the configuration (`tenants[]`) decides on top (both allow-lists must admit a tool; configured states win).")
            .json(200, "The view.", spec.response::<soulbase_tools::registry::access::AccessView>())
            .fails(&[400]),
        ("PUT", "/api/access/allow-list") => Op::authenticated("setAllowList", "access", "Replace the caller's tenant's allow-list")
            .describe("The only global tools the tenant sees from the next request on (`null`: every one); its own tools are not affected. Needs action `update` on `soulbase.server.access`. Persisted with the registry: replicas sharing the database follow. The global tenant has no allow-list (`REGISTRY.CONFLICT`).")
            .body(true, spec.request::<AllowListBody>(), json!({"tools": ["soulbase.builtin.echo"]}))
            .json(200, "The tenant's view after the change.", spec.response::<soulbase_tools::registry::access::AccessView>())
            .fails(&[400, 403, 409, 503]),
        ("PUT", "/api/access/overrides/{id}") => Op::authenticated("setTenantOverride", "access", "Set or clear the caller's tenant's state of a global tool")
            .describe("`enabled` needs action `enable` on the tool, `paused` needs `disable`, `null` (back to the tool's own state) needs both. A paused or deprecated tool stays so. A tool the tenant cannot see is `TOOL.NOT_FOUND`.")
            .params([shared("ToolId")])
            .body(true, spec.request::<OverrideBody>(), json!({"state": "paused"}))
            .json(200, "The tenant's view after the change.", spec.response::<soulbase_tools::registry::access::AccessView>())
            .fails(&[400, 403, 404, 409, 503]),
        ("GET", "/healthz") => Op::public("healthz", "Liveness")
            .json(200, "The process is up: `{\"status\": \"ok\"}`.", spec.response::<Status>()),
        ("GET", "/readyz") => Op::public("readyz", "Readiness")
            .json(200, "Ready: `{\"status\": \"ready\"}`.", spec.response::<Status>())
            .json(503, "Starting or draining: `{\"status\": \"not ready\"}`.", spec.response::<Status>()),
        ("GET", "/metrics") => Op::public("metrics", "Prometheus metrics")
            .answers(200, "The Prometheus text format (0.0.4).", "text/plain", json!({"type": "string"})),
        _ => return None,
    })
}

/// The `{id}` of a consent request route.
fn consent_request_id() -> Value {
    json!({
        "name": "id",
        "in": "path",
        "required": true,
        "description": "The request id (`creq_…`, as the refusal's `fields.consent_request` named it). Malformed: `SCHEMA.VALIDATION_FAILED` (`fields.field`: `id`).",
        "schema": {"type": "string", "pattern": "^creq_[0-9a-f]{32}$"},
    })
}

impl Op {
    /// A 200 that may also be a server-sent event stream (`stream: true`).
    fn also_answers_stream(mut self) -> Op {
        if let Some(content) = self
            .responses
            .get_mut("200")
            .and_then(|r| r.get_mut("content"))
            .and_then(Value::as_object_mut)
        {
            content.insert(
                "text/event-stream".into(),
                json!({"schema": {"type": "string", "description": "OpenAI `chat.completion.chunk` events, then `data: [DONE]`."}}),
            );
        }
        self
    }
}
