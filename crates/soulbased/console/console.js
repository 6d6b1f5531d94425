// The Soulbase operator console: a page of the HTTP API's own calls, under the
// caller's credentials. It holds no logic of its own: every list, detail and
// action is an API request (`/api/...`) that the server authorizes like any
// other, so the console can show or do nothing the API would not.
//
// Credentials (an API key, or the development identity headers) live in this
// tab's sessionStorage only. Every value from the server is put in the page as
// text (never as markup).

const CREDS = "soulbase.console.credentials";

/** The signed-in credentials, or null. */
function credentials() {
  try {
    return JSON.parse(sessionStorage.getItem(CREDS));
  } catch {
    return null;
  }
}

/** The request headers that carry the credentials. */
function authHeaders(c) {
  if (!c) return {};
  if (c.kind === "key") return { authorization: `Bearer ${c.key}` };
  return { "x-soulbase-tenant": c.tenant, "x-soulbase-actor": c.actor };
}

/** An API error: the HTTP status and the server's error envelope. */
class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || `HTTP_${status}`;
    this.fields = e.fields || {};
  }
}

/** Calls the API as the signed-in caller; JSON in, JSON out. */
async function api(method, path, body) {
  const headers = { accept: "application/json", ...authHeaders(credentials()) };
  const init = { method, headers };
  if (body !== undefined) {
    headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  const text = await res.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  if (!res.ok) throw new ApiError(res.status, json);
  return json;
}

/** Builds an element: attributes (`on*` are listeners), then children (text or nodes). */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v === true) node.setAttribute(k, "");
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function show(...nodes) {
  const main = document.getElementById("main");
  main.replaceChildren(...nodes);
  main.focus();
}

function alertBox(e) {
  const code = e instanceof ApiError ? `${e.code}: ` : "";
  return el("div", { class: "alert", role: "alert" }, code, e.message || String(e));
}

function when(ms) {
  return ms ? new Date(ms).toISOString().replace("T", " ").replace("Z", "") : "";
}

function statusCell(status) {
  return el("span", { class: `status-${status || "open"}` }, status || "open");
}

/** The stage a refusal's code comes from. */
function stageOf(code) {
  const domain = String(code || "").split(".")[0];
  return (
    {
      SCHEMA: "schema",
      AUTH: "authentication / authorization",
      POLICY: "authorization (policy)",
      SKILL: "authorization (skill imports)",
      SUBSCRIPTION: "terms",
      TOOL: "registry / execution",
      QUOTA: "quota",
      CONSENT: "consent",
      SANDBOX: "sandbox guard",
      PROVIDER: "execution",
      EVIDENCE: "evidence",
      IDEMPOTENCY: "idempotency",
    }[domain] || "—"
  );
}

// ---------------------------------------------------------------- sign-in

function loginView(error) {
  const key = el("input", { id: "api-key", name: "key", type: "password", autocomplete: "off", required: true });
  const keyForm = el(
    "form",
    {
      class: "login",
      "aria-labelledby": "login-key",
      onsubmit: (ev) => {
        ev.preventDefault();
        signIn({ kind: "key", key: key.value.trim() });
      },
    },
    el("h2", { id: "login-key" }, "Sign in with an API key"),
    el("label", { for: "api-key" }, "API key (sbk_…)", key),
    el("button", { class: "primary", type: "submit" }, "Sign in"),
  );
  const tenant = el("input", { id: "dev-tenant", name: "tenant", value: "dev" });
  const actor = el("input", { id: "dev-actor", name: "actor", value: "dev" });
  const devForm = el(
    "form",
    {
      class: "login",
      "aria-labelledby": "login-dev",
      onsubmit: (ev) => {
        ev.preventDefault();
        signIn({ kind: "dev", tenant: tenant.value.trim(), actor: actor.value.trim() });
      },
    },
    el("h3", { id: "login-dev" }, "Development server (identity headers)"),
    el("label", { for: "dev-tenant" }, "Tenant", tenant),
    el("label", { for: "dev-actor" }, "Actor", actor),
    el("button", { type: "submit" }, "Continue"),
  );
  show(error ? alertBox(error) : "", keyForm, devForm);
  key.focus();
}

async function signIn(c) {
  sessionStorage.setItem(CREDS, JSON.stringify(c));
  try {
    // The tools list is the one every caller may read: it proves the credentials.
    await api("GET", "/api/tools");
  } catch (e) {
    sessionStorage.removeItem(CREDS);
    loginView(e);
    return;
  }
  location.hash = "#/tools";
  route();
}

// ---------------------------------------------------------------- tools

const TOOL_FILTERS = ["state", "owner", "group", "side_effect", "safety_class"];

/** Global tools the caller's tenant paused for itself: the API's tool list
 *  leaves them out, the tenant's access view names them. */
async function pausedForTenant(listed) {
  let access;
  try {
    access = await api("GET", "/api/access");
  } catch {
    return [];
  }
  const seen = new Set(listed.map((t) => t.id));
  return Object.entries(access.overrides || {})
    .filter(([id, state]) => state === "paused" && !seen.has(id))
    .map(([id]) => ({ id, state: "paused", owner: "global", description: "Paused for your tenant.", tags: [], side_effect: "—", safety_class: "—", pausedHere: true }));
}

async function toolsView() {
  let list;
  try {
    list = await api("GET", "/api/tools");
  } catch (e) {
    return show(el("h2", {}, "Tools"), alertBox(e));
  }
  let tools = list.tools.concat(await pausedForTenant(list.tools));
  // Tools in other states that you may administer (your tenant's own, mostly).
  for (const state of ["paused", "deprecated"]) {
    try {
      const more = (await api("GET", `/api/tools?state=${state}`)).tools;
      tools = tools.concat(more.filter((t) => !tools.some((k) => k.id === t.id)));
    } catch {
      // Not an administrator of any: nothing more to show.
    }
  }
  tools = tools.map((t) => ({ ...t, group: t.id.split(".")[0], owner: t.owner || "global" }));
  const tag = el("select", { id: "tool-tag" }, el("option", { value: "" }, "any"), [...new Set(tools.flatMap((t) => t.tags))].sort().map((v) => el("option", { value: v }, v)));
  const search = el("input", { id: "tool-search", type: "search", placeholder: "id, description or tag" });
  const selects = Object.fromEntries(
    TOOL_FILTERS.map((f) => {
      const values = [...new Set(tools.map((t) => t[f]))].sort();
      return [f, el("select", { id: `tool-${f}` }, el("option", { value: "" }, "any"), values.map((v) => el("option", { value: v }, v)))];
    }),
  );
  const tbody = el("tbody");
  const count = el("p", { class: "note", "aria-live": "polite" });
  const render = () => {
    const q = search.value.trim().toLowerCase();
    const rows = tools.filter(
      (t) =>
        (!q || t.id.toLowerCase().includes(q) || t.description.toLowerCase().includes(q) || t.tags.some((g) => g.toLowerCase().includes(q))) &&
        TOOL_FILTERS.every((f) => !selects[f].value || t[f] === selects[f].value) &&
        (!tag.value || t.tags.includes(tag.value)),
    );
    tbody.replaceChildren(
      ...rows.map((t) =>
        el(
          "tr",
          { "data-tool": t.id },
          el("td", {}, el("a", { href: `#/tools/${encodeURIComponent(t.id)}` }, t.id)),
          el("td", {}, t.state),
          el("td", { class: "wide" }, t.side_effect),
          el("td", { class: "wide" }, t.safety_class),
          el("td", { class: "wide" }, t.tags.join(", ")),
        ),
      ),
    );
    count.textContent = `${rows.length} of ${tools.length} tools`;
  };
  search.addEventListener("input", render);
  Object.values(selects).concat([tag]).forEach((s) => s.addEventListener("change", render));
  render();
  show(
    el("h2", {}, "Tools"),
    el(
      "form",
      { class: "filters", role: "search", onsubmit: (ev) => ev.preventDefault() },
      el("label", { for: "tool-search" }, "Search", search),
      el("label", { for: "tool-state" }, "State", selects.state),
      el("label", { for: "tool-owner" }, "Owner (tenant)", selects.owner),
      el("label", { for: "tool-group" }, "Group", selects.group),
      el("label", { for: "tool-tag" }, "Tag", tag),
      el("label", { for: "tool-side_effect" }, "Side effect", selects.side_effect),
      el("label", { for: "tool-safety_class" }, "Safety class", selects.safety_class),
    ),
    count,
    el(
      "div",
      { class: "table-wrap" },
      el(
        "table",
        { id: "tools" },
        el("caption", { class: "note" }, "The tools your credentials may list"),
        el(
          "thead",
          {},
          el("tr", {}, el("th", { scope: "col" }, "Tool"), el("th", { scope: "col" }, "State"), el("th", { scope: "col", class: "wide" }, "Side effect"), el("th", { scope: "col", class: "wide" }, "Safety"), el("th", { scope: "col", class: "wide" }, "Tags")),
        ),
        tbody,
      ),
    ),
  );
}

async function toolView(id) {
  let tool;
  try {
    const list = await api("GET", "/api/tools");
    tool = list.tools.find((t) => t.id === id) || (await pausedForTenant(list.tools)).find((t) => t.id === id);
    // Your own tool in another state: the operator's view of that state.
    for (const state of ["paused", "deprecated"]) {
      if (tool) break;
      tool = (await api("GET", `/api/tools?state=${state}`)).tools.find((t) => t.id === id);
    }
  } catch (e) {
    return show(el("h2", {}, id), alertBox(e));
  }
  if (!tool) return show(el("h2", {}, id), el("div", { class: "alert", role: "alert" }, "TOOL.NOT_FOUND: no such tool among yours"));
  const status = el("div", { "aria-live": "polite" });
  // A global tool's state for the caller's tenant (`PUT /api/access/overrides/{id}`:
  // action `enable` or `disable` on the tool); the change is audited.
  const change = async (state, label) => {
    if (!confirm(`${label} ${id} for your tenant?`)) return;
    try {
      await api("PUT", `/api/access/overrides/${encodeURIComponent(id)}`, { state });
      await toolView(id);
    } catch (e) {
      status.replaceChildren(alertBox(e));
    }
  };
  // Your tenant's own tool, in the registry (`PUT /api/tools/{id}/state`:
  // action `enable`, `disable` or `deprecate` on it); the change is audited.
  const changeOwn = async (change, label) => {
    if (!confirm(`${label} ${id}? Every call of your tenant sees the change.`)) return;
    try {
      await api("PUT", `/api/tools/${encodeURIComponent(id)}/state`, { change });
      await toolView(id);
    } catch (e) {
      status.replaceChildren(alertBox(e));
    }
  };
  const actions =
    tool.owner === "global"
      ? el(
          "div",
          { class: "actions" },
          tool.state === "paused" ? el("button", { type: "button", id: "enable", onclick: () => change("enabled", "Enable") }, "Enable") : "",
          tool.state === "enabled" ? el("button", { type: "button", id: "disable", class: "danger", onclick: () => change("paused", "Disable") }, "Disable") : "",
        )
      : el(
          "div",
          { class: "actions" },
          // The registry's transitions: paused ⇄ enabled, either → deprecated (for good).
          tool.state === "paused" ? el("button", { type: "button", id: "enable", onclick: () => changeOwn("enable", "Enable") }, "Enable") : "",
          tool.state === "enabled" ? el("button", { type: "button", id: "pause", class: "danger", onclick: () => changeOwn("pause", "Pause") }, "Pause") : "",
          tool.state !== "deprecated" ? el("button", { type: "button", id: "deprecate", onclick: () => changeOwn("deprecate", "Deprecate (for good)") }, "Deprecate") : "",
        );
  if (tool.pausedHere) {
    return show(
      el("p", {}, el("a", { href: "#/tools" }, "← Tools")),
      el("h2", {}, el("code", {}, tool.id)),
      el("dl", { class: "fields" }, el("dt", {}, "State"), el("dd", {}, "paused (for your tenant)")),
      actions,
      status,
    );
  }
  show(
    el("p", {}, el("a", { href: "#/tools" }, "← Tools")),
    el("h2", {}, tool.display_name, " ", el("code", {}, tool.id)),
    el("p", {}, tool.description),
    el(
      "dl",
      { class: "fields" },
      [
        ["State", tool.state],
        ["Version", tool.version],
        ["Owner", tool.owner],
        ["Side effect", tool.side_effect],
        ["Safety class", tool.safety_class],
        ["Consent required", tool.consent_required ? "yes" : "no"],
        ["Tags", tool.tags.join(", ")],
        ["Manifest digest", el("code", {}, tool.digest)],
      ].map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]),
    ),
    actions,
    status,
    tool.deprecations.length ? [el("h3", {}, "Deprecations"), el("pre", {}, JSON.stringify(tool.deprecations, null, 2))] : "",
    el("h3", {}, "Input schema"),
    el("pre", {}, JSON.stringify(tool.input_schema, null, 2)),
    el("h3", {}, "Output schema"),
    el("pre", {}, JSON.stringify(tool.output_schema, null, 2)),
    el("p", {}, el("a", { href: `#/evidence?tool=${encodeURIComponent(id)}` }, "Evidence of this tool's calls")),
  );
}

// ---------------------------------------------------------------- skills

/** Inline Markdown (`code`, **strong**, *em*) as nodes; everything else as text. */
function inline(text) {
  const out = [];
  const re = /(`[^`]+`|\*\*[^*]+\*\*|\*[^*\s][^*]*\*)/g;
  let last = 0;
  for (const m of text.matchAll(re)) {
    if (m.index > last) out.push(text.slice(last, m.index));
    const t = m[0];
    if (t.startsWith("`")) out.push(el("code", {}, t.slice(1, -1)));
    else if (t.startsWith("**")) out.push(el("strong", {}, t.slice(2, -2)));
    else out.push(el("em", {}, t.slice(1, -1)));
    last = m.index + t.length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

/** SKILL.md rendered as a small safe subset of Markdown — front matter, headings,
 *  fenced code, lists and paragraphs — built as DOM nodes (never markup). */
function markdown(source) {
  const lines = source.replace(/\r\n/g, "\n").split("\n");
  const out = [];
  let i = 0;
  if (lines[0] === "---") {
    const end = lines.indexOf("---", 1);
    if (end > 0) {
      out.push(el("pre", { class: "front-matter" }, lines.slice(1, end).join("\n")));
      i = end + 1;
    }
  }
  let para = [];
  let list = null;
  const flush = () => {
    if (para.length) out.push(el("p", {}, inline(para.join(" "))));
    para = [];
    if (list) out.push(list);
    list = null;
  };
  for (; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^```/);
    if (fence) {
      flush();
      const body = [];
      for (i++; i < lines.length && !lines[i].startsWith("```"); i++) body.push(lines[i]);
      out.push(el("pre", {}, el("code", {}, body.join("\n"))));
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    const item = line.match(/^\s*(?:[-*]|\d+\.)\s+(.*)$/);
    if (heading) {
      flush();
      out.push(el(`h${Math.min(6, heading[1].length + 2)}`, { class: "md" }, inline(heading[2])));
    } else if (item) {
      if (para.length) {
        out.push(el("p", {}, inline(para.join(" "))));
        para = [];
      }
      list = list || el(/^\s*\d/.test(line) ? "ol" : "ul");
      list.append(el("li", {}, inline(item[1])));
    } else if (!line.trim()) {
      flush();
    } else {
      if (list) {
        out.push(list);
        list = null;
      }
      para.push(line.trim());
    }
  }
  flush();
  return el("div", { class: "markdown", id: "skill-md" }, out);
}

/** The skills graph: each skill a row, each import an arrow from the importing
 *  skill to its provider, labelled with the tools it takes. */
function skillsGraph(skills) {
  const names = skills.map((s) => s.name);
  const edges = skills.flatMap((s) => s.imports.map((i) => ({ from: s.name, to: i.from, tools: i.tools })));
  if (!edges.length) return el("p", { class: "note", id: "skills-graph" }, "No skill imports another's tools.");
  const row = 28;
  const width = 560;
  const y = (n) => Math.max(0, names.indexOf(n)) * row + 18;
  return svg(
    "svg",
    { id: "skills-graph", viewBox: `0 0 ${width} ${names.length * row + 10}`, role: "img", "aria-label": `skill imports: ${edges.map((e) => `${e.from} imports ${e.tools.join(", ")} from ${e.to}`).join("; ")}` },
    svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" }, svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#0b5cad" }))),
    names.map((n) => svg("text", { x: 0, y: y(n) + 4, "font-size": 12 }, n.slice(0, 28))),
    edges.map((e, i) => {
      const x = 200 + (i % 8) * 40;
      return [
        svg("path", { d: `M 180 ${y(e.from)} C ${x} ${y(e.from)}, ${x} ${y(e.to)}, 180 ${y(e.to)}`, fill: "none", stroke: "#0b5cad", "marker-end": "url(#arrow)" }),
        svg("text", { x: x + 6, y: (y(e.from) + y(e.to)) / 2, "font-size": 10 }, e.tools.join(", ").slice(0, 40)),
      ];
    }),
  );
}

async function skillsView() {
  let list;
  let administered = [];
  try {
    list = await api("GET", "/api/skills");
  } catch (e) {
    return show(el("h2", {}, "Skills"), alertBox(e));
  }
  try {
    // The skills you may enable or disable (the operator's view), disabled ones included.
    administered = (await api("GET", "/api/skills?all=true")).skills;
  } catch {
    administered = [];
  }
  const skills = list.skills.concat(administered.filter((a) => !list.skills.some((s) => s.name === a.name)));
  const mayAdminister = (name) => administered.some((a) => a.name === name);
  const status = el("div", { "aria-live": "polite" });
  const toggle = async (s) => {
    const verb = s.enabled ? "Disable" : "Enable";
    if (!confirm(`${verb} the skill ${s.name}? Its tools ${s.enabled ? "leave" : "return to"} every tenant's lists.`)) return;
    try {
      await api("PATCH", `/api/skills/${encodeURIComponent(s.name)}`, { enabled: !s.enabled });
      await skillsView();
    } catch (e) {
      status.replaceChildren(alertBox(e));
    }
  };
  show(
    el("h2", {}, "Skills"),
    status,
    el(
      "div",
      { class: "table-wrap" },
      el(
        "table",
        { id: "skills" },
        el("caption", { class: "note" }, "The skills that show to you, and those you may enable or disable"),
        el("thead", {}, el("tr", {}, ["Skill", "Kind", "Enabled", "Tools", "Exports", "Imports", ""].map((h) => el("th", { scope: "col" }, h)))),
        el(
          "tbody",
          {},
          skills.map((s) =>
            el(
              "tr",
              { "data-skill": s.name },
              el("td", {}, s.enabled ? el("a", { href: `#/skills/${encodeURIComponent(s.name)}` }, s.title || s.name) : s.title || s.name),
              el("td", {}, s.kind),
              el("td", {}, s.enabled ? "yes" : "no"),
              el("td", {}, s.tools.length),
              el("td", {}, s.exports.join(", ")),
              el("td", {}, s.imports.map((i) => `${i.from}: ${i.tools.join(", ")}`).join("; ")),
              el("td", {}, mayAdminister(s.name) ? el("button", { type: "button", "data-toggle": s.name, class: s.enabled ? "danger" : undefined, onclick: () => toggle(s) }, s.enabled ? "Disable" : "Enable") : ""),
            ),
          ),
        ),
      ),
    ),
    el("h3", {}, "Imports between skills"),
    skillsGraph(skills),
  );
}
async function skillView(name) {
  let info;
  try {
    info = await api("GET", `/api/skills/${encodeURIComponent(name)}`);
  } catch (e) {
    return show(el("p", {}, el("a", { href: "#/skills" }, "← Skills")), el("h2", {}, name), alertBox(e));
  }
  const listed = (await api("GET", "/api/skills").catch(() => ({ skills: [] }))).skills.find((s) => s.name === name);
  show(
    el("p", {}, el("a", { href: "#/skills" }, "← Skills")),
    el("h2", {}, info.name),
    el("p", {}, info.description),
    el("h3", {}, "Tools it binds"),
    info.tools.length
      ? el("ul", { id: "skill-tools" }, info.tools.map((t) => el("li", {}, el("a", { href: `#/tools/${encodeURIComponent(t)}` }, t))))
      : el("p", { class: "note" }, "None: instructions only."),
    listed && listed.exports.length ? [el("h3", {}, "Exports"), el("ul", { id: "skill-exports" }, listed.exports.map((t) => el("li", {}, el("code", {}, t))))] : "",
    listed && listed.imports.length
      ? [el("h3", {}, "Imports"), el("ul", { id: "skill-imports" }, listed.imports.map((i) => el("li", {}, el("a", { href: `#/skills/${encodeURIComponent(i.from)}` }, i.from), `: ${i.tools.join(", ")}`)))]
      : "",
    info.resources && info.resources.length ? [el("h3", {}, "Files"), el("ul", {}, info.resources.map((r) => el("li", {}, el("code", {}, r))))] : "",
    el("h3", {}, "SKILL.md"),
    markdown(info.content || ""),
  );
}

// ---------------------------------------------------------------- evidence

function evidenceQuery() {
  const q = location.hash.split("?")[1] || "";
  return new URLSearchParams(q);
}

async function evidenceView() {
  const params = evidenceQuery();
  const tool = el("input", { id: "ev-tool", name: "tool", value: params.get("tool") || "" });
  const status = el(
    "select",
    { id: "ev-status", name: "status" },
    ["", "ok", "error", "timeout", "cancelled", "aborted", "denied"].map((s) => el("option", { value: s, selected: s === (params.get("status") || "") }, s === "denied" ? "denied (refused before it ran)" : s || "any")),
  );
  const actor = el("input", { id: "ev-actor", name: "actor", value: params.get("actor") || "" });
  // Another tenant's evidence: the operator's (global tenant, read_evidence on
  // soulbase.server.evidence); anyone else gets the API's refusal.
  const tenant = el("input", { id: "ev-tenant", name: "tenant", placeholder: "yours", value: params.get("tenant") || "" });
  const code = el("input", { id: "ev-code", name: "code", placeholder: "e.g. POLICY.DENY_TOOL", value: params.get("code") || "" });
  // Began at or after / before, in the browser's local time (the API takes Unix ms).
  const from = el("input", { id: "ev-from", name: "from", type: "datetime-local", step: 1 });
  const to = el("input", { id: "ev-to", name: "to", type: "datetime-local", step: 1 });
  const callId = el("input", { id: "ev-call", name: "call_id", placeholder: "call_… or conv_…" });
  const tbody = el("tbody");
  const more = el("div", { class: "actions" });
  const problem = el("div");
  const load = async (after) => {
    const q = new URLSearchParams();
    const denied = status.value === "denied";
    if (tenant.value.trim()) q.set("tenant", tenant.value.trim());
    if (tool.value.trim()) q.set("tool", tool.value.trim());
    if (status.value && !denied) q.set("status", status.value);
    if (actor.value.trim()) q.set("actor", actor.value.trim());
    if (code.value.trim()) q.set("code", code.value.trim());
    for (const [name, input] of [["from", from], ["to", to]]) {
      const ms = input.value ? new Date(input.value).getTime() : NaN;
      if (Number.isFinite(ms)) q.set(name, String(ms));
    }
    q.set("limit", "50");
    if (after) q.set("after", after);
    let page;
    try {
      page = await api("GET", `${denied ? "/api/denials" : "/api/evidence"}?${q}`);
    } catch (e) {
      problem.replaceChildren(alertBox(e));
      return;
    }
    problem.replaceChildren();
    // A denial is shown as a call that never ran: status "denied", its code.
    const calls = denied
      ? page.denials.map((d) => ({ call_id: d.call_id, tool_id: d.tool, actor: d.actor, status: "denied", error_code: d.code, began_at: d.at }))
      : page.calls;
    const rows = calls.map((c) =>
      el(
        "tr",
        { "data-call": c.call_id },
        el("td", {}, el("a", { href: `#/evidence/${encodeURIComponent(c.call_id)}${tenant.value.trim() ? `?tenant=${encodeURIComponent(tenant.value.trim())}` : ""}` }, el("code", {}, c.call_id))),
        el("td", {}, c.tool_id),
        el("td", { class: "wide" }, c.actor),
        el("td", {}, statusCell(c.status)),
        el("td", {}, c.error_code || ""),
        el("td", { class: "wide" }, when(c.began_at)),
        el("td", { class: "wide" }, c.duration_us !== undefined ? `${(c.duration_us / 1000).toFixed(2)} ms` : ""),
      ),
    );
    if (after) tbody.append(...rows);
    else tbody.replaceChildren(...rows);
    more.replaceChildren(page.next ? el("button", { type: "button", id: "more", onclick: () => load(page.next) }, "More") : el("span", { class: "note" }, "No more calls"));
  };
  show(
    el("h2", {}, "Evidence"),
    el(
      "form",
      {
        class: "filters",
        onsubmit: (ev) => {
          ev.preventDefault();
          if (callId.value.trim()) {
            location.hash = `#/evidence/${encodeURIComponent(callId.value.trim())}${tenant.value.trim() ? `?tenant=${encodeURIComponent(tenant.value.trim())}` : ""}`;
            return;
          }
          load(null);
        },
      },
      el("label", { for: "ev-tenant" }, "Tenant", tenant),
      el("label", { for: "ev-tool" }, "Tool", tool),
      el("label", { for: "ev-status" }, "Status", status),
      el("label", { for: "ev-actor" }, "Actor", actor),
      el("label", { for: "ev-code" }, "Error code", code),
      el("label", { for: "ev-from" }, "Began from", from),
      el("label", { for: "ev-to" }, "Began before", to),
      el("label", { for: "ev-call" }, "Or open a call id", callId),
      el("button", { type: "submit", class: "primary" }, "Show"),
    ),
    problem,
    el(
      "div",
      { class: "table-wrap" },
      el(
        "table",
        { id: "calls" },
        el("caption", { class: "note" }, "Calls of your tenant whose evidence you may read, newest first (denied: refused before they ran)"),
        el(
          "thead",
          {},
          el("tr", {}, ["Call", "Tool", "Actor", "Status", "Code", "Began (UTC)", "Duration"].map((h, i) => el("th", { scope: "col", class: [2, 5, 6].includes(i) ? "wide" : undefined }, h))),
        ),
        tbody,
      ),
    ),
    more,
  );
  await load(null);
}

function recordItem(r) {
  const p = r.payload;
  const fields = [["At (UTC)", when(r.at)], ["Actor", r.actor]];
  let title = p.event;
  if (p.event === "begin") {
    title = `Begin: ${p.tool_id} ${p.tool_version}`;
    if (p.surface) fields.push(["Surface", p.surface]);
    fields.push(["Profile hash", el("code", {}, p.profile_hash)], ["Policy hash", el("code", {}, p.policy_hash)], ["Config hash", el("code", {}, p.config_hash)], ["Manifest digest", el("code", {}, p.manifest_digest)], ["Arguments digest", el("code", {}, p.args_digest)]);
    if (p.consent) fields.push(["Consent token", el("code", {}, p.consent.token_id || p.consent.token_digest)]);
    if (p.conversation) fields.push(["Conversation", el("a", { href: `#/evidence/${encodeURIComponent(p.conversation.id)}` }, `${p.conversation.id} turn ${p.conversation.iteration}`)]);
  } else if (p.event === "end") {
    title = `End: ${p.status}`;
    fields.push(["Status", statusCell(p.status)]);
    if (p.error_code) fields.push(["Code", p.error_code], ["Stage", stageOf(p.error_code)]);
    if (p.output_digest) fields.push(["Output digest", el("code", {}, p.output_digest)]);
    fields.push(["Duration", `${(p.duration_us / 1000).toFixed(2)} ms`], ["Usage", JSON.stringify(p.usage)]);
    if (p.client_requests) fields.push(["Client requests", p.client_requests.map((c) => `${c.kind}: ${c.outcome}`).join("; ")]);
  } else if (p.event === "denied") {
    title = `Refused: ${p.code}`;
    fields.push(["Tool", p.tool], ["Code", p.code], ["Deciding stage", stageOf(p.code)]);
  } else if (p.event === "conversation" && p.step === "start") {
    title = `Conversation started: ${p.model}`;
    fields.push(["Messages", `${p.messages} (${p.messages_digest})`], ["Iteration bound", p.max_iterations], ["Tools offered", p.tools_offered]);
  } else if (p.event === "conversation" && p.step === "turn") {
    title = `Turn ${p.iteration}`;
    fields.push(["Response digest", el("code", {}, p.response_digest)]);
    if (p.tokens) fields.push(["Tokens", JSON.stringify(p.tokens)]);
    for (const c of p.tool_calls || []) {
      fields.push([
        c.tool,
        c.call_id ? el("a", { href: `#/evidence/${encodeURIComponent(c.call_id)}` }, c.call_id) : c.code || "answered in place",
      ]);
    }
  } else if (p.event === "conversation" && p.step === "end") {
    title = `Conversation ended: ${p.reason}`;
    fields.push(["Turns", p.iterations], ["Tool calls", p.tool_calls], ["Tokens", p.tokens]);
    if (p.error_code) fields.push(["Code", p.error_code]);
  }
  return el("li", { class: `ev-${p.event}` }, el("h3", {}, title), el("dl", { class: "fields" }, fields.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])));
}

async function callView(id) {
  let body;
  const tenant = evidenceQuery().get("tenant");
  try {
    body = await api("GET", `/api/evidence/${encodeURIComponent(id)}${tenant ? `?tenant=${encodeURIComponent(tenant)}` : ""}`);
  } catch (e) {
    return show(el("p", {}, el("a", { href: "#/evidence" }, "← Evidence")), el("h2", {}, id), alertBox(e));
  }
  const summary = body.replay ? body.replay : body.conversation;
  // A conversation's steps in their order (records of one millisecond may come
  // in any order): the start, each turn by number, the end.
  const rank = (r) => {
    const p = r.payload;
    if (p.event !== "conversation") return 0;
    return p.step === "start" ? 0 : p.step === "turn" ? p.iteration : Number.MAX_SAFE_INTEGER;
  };
  const records = body.conversation ? [...body.records].sort((a, b) => rank(a) - rank(b)) : body.records;
  show(
    el("p", {}, el("a", { href: "#/evidence" }, "← Evidence")),
    el("h2", {}, el("code", {}, body.call_id)),
    el("h3", {}, "Timeline"),
    el("ol", { class: "timeline", id: "timeline" }, records.map(recordItem)),
    el("h3", {}, body.replay ? "Replay" : "Conversation"),
    el("pre", { id: "replay" }, JSON.stringify(summary, null, 2)),
  );
}

// ---------------------------------------------------------------- overview

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  for (const c of children.flat(Infinity)) if (c) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

/** A horizontal bar chart of `[label, value]` pairs, as an image with a text
 *  alternative (the same figures are in the table beside it). */
function bars(title, pairs) {
  const width = 360;
  const row = 22;
  const max = Math.max(1, ...pairs.map(([, v]) => v));
  return svg(
    "svg",
    { viewBox: `0 0 ${width} ${Math.max(1, pairs.length) * row + 4}`, role: "img", "aria-label": `${title}: ${pairs.map(([k, v]) => `${k} ${v}`).join(", ") || "none"}` },
    pairs.map(([k, v], i) => [
      svg("rect", { x: 150, y: i * row + 4, width: Math.max(1, (v / max) * (width - 200)), height: row - 8, fill: "#0b5cad" }),
      svg("text", { x: 0, y: i * row + 16, "font-size": 11 }, String(k).slice(0, 24)),
      svg("text", { x: 156 + (v / max) * (width - 200), y: i * row + 16, "font-size": 11 }, v),
    ]),
  );
}

/** A line of the last samples of calls per second. */
function sparkline(samples) {
  const width = 360;
  const height = 80;
  const max = Math.max(0.1, ...samples.map((s) => s.v));
  const points = samples.map((s, i) => `${(i / Math.max(1, samples.length - 1)) * width},${height - (s.v / max) * (height - 6) - 3}`).join(" ");
  return svg(
    "svg",
    { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": `calls per second, last ${samples.length} samples, latest ${samples.length ? samples[samples.length - 1].v.toFixed(2) : 0}` },
    svg("line", { x1: 0, y1: height - 1, x2: width, y2: height - 1, stroke: "#d0d7de" }),
    samples.length > 1
      ? svg("polyline", { points, fill: "none", stroke: "#0b5cad", "stroke-width": 2 })
      : svg("circle", { cx: width, cy: points.split(",")[1] || height - 3, r: 3, fill: "#0b5cad" }),
  );
}

const overviewState = { samples: [], timer: null };

async function overviewView() {
  const body = el("div", { id: "overview", "aria-live": "polite" });
  show(
    el("h2", {}, "Overview"),
    el("p", { class: "note" }, "Your tenant's calls in the last five minutes, from the evidence; refreshed every 5 seconds."),
    body,
  );
  const refresh = async () => {
    let o;
    try {
      o = await api("GET", "/api/overview?window_s=300");
    } catch (e) {
      body.replaceChildren(alertBox(e));
      return;
    }
    overviewState.samples.push({ at: o.at, v: o.calls_per_second });
    overviewState.samples = overviewState.samples.slice(-60);
    const failed = Object.entries(o.by_status).filter(([k]) => k !== "ok" && k !== "open").reduce((n, [, v]) => n + v, 0);
    body.replaceChildren(
      el(
        "dl",
        { class: "fields", id: "counters" },
        [
          ["Calls", String(o.calls)],
          ["Calls per second", o.calls_per_second.toFixed(2)],
          ["Failed", String(failed)],
          ["Denied", String(o.denials)],
          ["Updated (UTC)", when(o.at)],
        ].map(([k, v]) => [el("dt", {}, k), el("dd", { "data-counter": k }, v)]),
      ),
      o.truncated ? el("p", { class: "note" }, "More calls began than were read: the figures are of the newest 10,000.") : "",
      el("h3", {}, "Calls per second"),
      sparkline(overviewState.samples),
      el("h3", {}, "By status"),
      bars("calls by status", Object.entries(o.by_status)),
      el("h3", {}, "Failures by code"),
      bars("failures by code", Object.entries(o.by_code)),
      el("h3", {}, "Denials by code"),
      bars("denials by code", Object.entries(o.denials_by_code)),
      el("h3", {}, "Latency by surface"),
      el(
        "div",
        { class: "table-wrap" },
        el(
          "table",
          { id: "surfaces" },
          el("caption", { class: "note" }, "Execution time of ended calls by the surface they came through, microseconds"),
          el("thead", {}, el("tr", {}, ["Surface", "Calls", "Failed", "p50 µs", "p99 µs"].map((h) => el("th", { scope: "col" }, h)))),
          el("tbody", {}, o.surfaces.map((t) => el("tr", { "data-surface": t.surface }, el("td", {}, t.surface), el("td", {}, t.calls), el("td", {}, t.failed), el("td", {}, t.p50_us), el("td", {}, t.p99_us)))),
        ),
      ),
      el("h3", {}, "Latency by tool"),
      el(
        "div",
        { class: "table-wrap" },
        el(
          "table",
          { id: "latency" },
          el("caption", { class: "note" }, "Execution time of ended calls, microseconds"),
          el("thead", {}, el("tr", {}, ["Tool", "Calls", "Failed", "p50 µs", "p99 µs"].map((h) => el("th", { scope: "col" }, h)))),
          el("tbody", {}, o.tools.map((t) => el("tr", { "data-tool": t.tool }, el("td", {}, t.tool), el("td", {}, t.calls), el("td", {}, t.failed), el("td", {}, t.p50_us), el("td", {}, t.p99_us)))),
        ),
      ),
      bars("p99 by tool, microseconds", o.tools.map((t) => [t.tool, t.p99_us])),
      o.evidence
        ? [
            el("h3", {}, "Evidence queue (this process)"),
            el(
              "dl",
              { class: "fields" },
              [
                ["Not yet in the store", o.evidence.depth],
                ["Written", o.evidence.written],
                ["Quarantined", o.evidence.quarantined],
                ["Spool bytes", o.evidence.spool_bytes],
                ["Drain lag (ms)", o.evidence.drain_lag_ms],
              ].map(([k, v]) => [el("dt", {}, k), el("dd", {}, String(v))]),
            ),
          ]
        : "",
    );
  };
  await refresh();
  overviewState.timer = setInterval(refresh, 5000);
}

// ---------------------------------------------------------------- quarantine

/** The quarantine page; `done`, the answer of a retry just made, is shown above
 *  the list read again after it. */
async function quarantineView(done) {
  let q;
  try {
    q = await api("GET", "/api/quarantine");
  } catch (e) {
    return show(el("h2", {}, "Quarantine"), alertBox(e));
  }
  const status = el("div", { id: "retry-status", "aria-live": "polite" });
  if (done) {
    status.append(
      el(
        "p",
        { id: "retry-result", role: "status" },
        `The database took ${done.stored} record(s); ${done.still_refused} refused again, ${done.unreadable} unreadable; ${done.remaining} line(s) stay.`,
      ),
    );
  }
  // `POST /api/quarantine/retry`: the server's own drainer offers the records
  // again (operators only: the global tenant, action `update` on
  // soulbase.server.quarantine); a refusal is shown as the API answered it.
  const button = el("button", { type: "button", id: "retry", class: "primary" }, "Retry");
  button.addEventListener("click", async () => {
    if (!confirm("Offer every quarantined record to the database again? What it takes leaves the quarantine; what it still refuses stays.")) return;
    button.disabled = true;
    status.replaceChildren(el("p", { class: "note" }, "Offering them again…"));
    try {
      const answer = await api("POST", "/api/quarantine/retry");
      await quarantineView(answer);
    } catch (e) {
      status.replaceChildren(alertBox(e));
      button.disabled = false;
    }
  });
  show(
    el("h2", {}, "Quarantine"),
    el("p", { class: "note" }, "Evidence records the database refused for good, kept durable in the spool's quarantine file."),
    status,
    q.records.length
      ? el(
          "div",
          { class: "table-wrap" },
          el(
            "table",
            { id: "quarantine" },
            el("caption", { class: "note" }, "Quarantined records you may see, in file order"),
            el("thead", {}, el("tr", {}, ["Line", "Kind", "Call", "Tenant", "Why"].map((h) => el("th", { scope: "col" }, h)))),
            el(
              "tbody",
              {},
              q.records.map((r) =>
                el(
                  "tr",
                  { "data-line": r.line },
                  el("td", {}, r.line),
                  el("td", {}, r.kind || "—"),
                  el("td", {}, r.call_id ? el("a", { href: `#/evidence/${encodeURIComponent(r.call_id)}` }, el("code", {}, r.call_id)) : "—"),
                  el("td", {}, r.tenant || "—"),
                  el("td", {}, r.unreadable ? `unreadable: ${r.unreadable}` : r.refused),
                ),
              ),
            ),
          ),
        )
      : el("p", { id: "quarantine-empty" }, "Nothing is quarantined."),
    el("h3", {}, "Retry"),
    el("p", {}, `Once the cause is fixed: ${q.retry}.`),
    q.records.length ? el("div", { class: "actions" }, button) : "",
  );
}

// ---------------------------------------------------------------- consent

const CONSENT_STATUSES = ["pending", "approved", "declined", "expired"];

/** A request's decision as text. */
function decisionText(r) {
  if (r.status === "approved") return `approved by ${r.decided_by} (scope ${r.scope}), token ${r.token_id || "without id"} expires ${when(r.token_expires_at)} UTC`;
  if (r.status === "declined") return `declined by ${r.decided_by}${r.reason ? `: ${r.reason}` : ""}`;
  if (r.status === "expired") return "expired: not decided in time";
  return `pending until ${when(r.expires_at)} UTC`;
}

/** One request, as its requester or an approver reads it. */
function requestFields(r) {
  return el(
    "dl",
    { class: "fields", id: "consent-request" },
    [
      ["Request", el("code", {}, r.id)],
      ["Status", el("span", { class: `status-${r.status}` }, r.status)],
      ["Actor", r.actor],
      ["Tool", r.tool],
      ["Arguments digest", el("code", {}, r.args_digest)],
      ["Refused call", el("a", { href: `#/evidence/${encodeURIComponent(r.call_id)}` }, el("code", {}, r.call_id))],
      ["Requested (UTC)", when(r.requested_at)],
      ["Decision", decisionText(r)],
      r.token ? ["Your token (send as x-soulbase-consent)", el("code", { id: "consent-token" }, r.token)] : null,
    ]
      .filter(Boolean)
      .map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]),
  );
}

/** The approve or decline form for request `r`, under the list. */
function decisionForm(r, approve, done) {
  const legend = `${approve ? "Approve" : "Decline"} ${r.actor}'s request for ${r.tool}`;
  const status = el("div", { "aria-live": "polite" });
  const inputs = approve
    ? [
        el(
          "fieldset",
          {},
          el("legend", {}, "Scope"),
          el("label", { for: "scope-call" }, el("input", { type: "radio", id: "scope-call", name: "scope", value: "call", checked: true }), " This call's arguments only"),
          el("label", { for: "scope-tool" }, el("input", { type: "radio", id: "scope-tool", name: "scope", value: "tool" }), " Any arguments"),
        ),
        el("label", { for: "consent-ttl" }, "Token lifetime (ms, empty: the server's default)", el("input", { id: "consent-ttl", name: "ttl_ms", type: "number", min: 1, step: 1, inputmode: "numeric" })),
      ]
    : [el("label", { for: "consent-reason" }, "Reason (shown to the requester)", el("textarea", { id: "consent-reason", name: "reason", rows: 3, cols: 60, maxlength: 500 }))];
  const form = el(
    "form",
    {
      class: "filters",
      id: "consent-decision",
      "aria-labelledby": "consent-decision-title",
      onsubmit: async (ev) => {
        ev.preventDefault();
        const data = new FormData(form);
        let body;
        if (approve) {
          body = { scope: data.get("scope") || "call" };
          const ttl = String(data.get("ttl_ms") || "").trim();
          if (ttl) body.ttl_ms = Number(ttl);
        } else {
          const reason = String(data.get("reason") || "").trim();
          body = reason ? { reason } : {};
        }
        const what = approve ? `Approve ${r.actor}'s request for ${r.tool} (scope ${body.scope})?` : `Decline ${r.actor}'s request for ${r.tool}?`;
        if (!confirm(what)) return;
        try {
          const decided = await api("POST", `/api/consent/requests/${encodeURIComponent(r.id)}/${approve ? "approve" : "decline"}`, body);
          done(decided);
        } catch (e) {
          status.replaceChildren(alertBox(e));
        }
      },
    },
    el("h3", { id: "consent-decision-title" }, legend),
    inputs,
    el("button", { type: "submit", class: approve ? "primary" : "danger" }, approve ? "Approve" : "Decline"),
    el("button", { type: "button", onclick: () => form.remove() }, "Cancel"),
    status,
  );
  return form;
}

async function consentView() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const wanted = CONSENT_STATUSES.includes(params.get("status")) ? params.get("status") : params.get("status") === "all" ? "" : "pending";
  const result = el("div", { id: "consent-result", role: "status", "aria-live": "polite" });
  const panel = el("div", { id: "consent-panel" });
  const follow = el("input", { id: "consent-follow", name: "id", placeholder: "creq_…", autocomplete: "off", required: true });
  const followForm = el(
    "form",
    {
      class: "filters",
      "aria-labelledby": "consent-follow-title",
      onsubmit: async (ev) => {
        ev.preventDefault();
        try {
          const r = await api("GET", `/api/consent/requests/${encodeURIComponent(follow.value.trim())}`);
          result.replaceChildren(requestFields(r));
        } catch (e) {
          result.replaceChildren(alertBox(e));
        }
      },
    },
    el("h3", { id: "consent-follow-title" }, "Follow a request"),
    el("label", { for: "consent-follow" }, "Request id (from a refusal's consent_request)", follow),
    el("button", { type: "submit" }, "Show"),
  );
  const status = el(
    "select",
    { id: "consent-status", onchange: () => (location.hash = `#/consent?status=${status.value || "all"}`) },
    CONSENT_STATUSES.map((v) => el("option", { value: v, selected: v === wanted }, v)),
    el("option", { value: "", selected: wanted === "" }, "any"),
  );
  let list = null;
  let refusal = null;
  try {
    list = await api("GET", `/api/consent/requests${wanted ? `?status=${wanted}` : ""}`);
  } catch (e) {
    refusal = e;
  }
  const rows = (list ? list.requests : []).map((r) => {
    const open = (approve) => {
      panel.replaceChildren(
        decisionForm(r, approve, (decided) => {
          panel.replaceChildren();
          result.replaceChildren(el("p", { id: "consent-outcome" }, `${decided.id}: ${decisionText(decided)}`));
          const table = row.closest("table");
          row.remove();
          if (table && !table.querySelector("tbody tr")) table.closest(".table-wrap").replaceWith(el("p", { id: "consent-empty" }, `No ${wanted || ""} requests left.`));
        }),
      );
      panel.querySelector("input, textarea").focus();
    };
    const pending = r.status === "pending";
    const row = el(
      "tr",
      { "data-request": r.id },
      el("td", {}, when(r.requested_at)),
      el("td", {}, r.actor),
      el("td", {}, r.tool),
      el("td", { class: "wide" }, el("code", {}, r.args_digest)),
      el("td", {}, el("a", { href: `#/evidence/${encodeURIComponent(r.call_id)}` }, el("code", {}, r.call_id))),
      el("td", {}, pending ? "pending" : decisionText(r)),
      el(
        "td",
        {},
        pending
          ? [
              el("button", { type: "button", class: "primary", "aria-label": `Approve ${r.actor}'s request for ${r.tool}`, onclick: () => open(true) }, "Approve…"),
              " ",
              el("button", { type: "button", "aria-label": `Decline ${r.actor}'s request for ${r.tool}`, onclick: () => open(false) }, "Decline…"),
            ]
          : "",
      ),
    );
    return row;
  });
  show(
    el("h2", {}, "Consent"),
    el("p", { class: "note" }, "Calls refused for want of consent leave a request here. Approving issues a token for the requester, who fetches it by the request id; every decision is audited."),
    el("form", { class: "filters", onsubmit: (ev) => ev.preventDefault() }, el("label", { for: "consent-status" }, "Status", status)),
    refusal
      ? refusal.status === 403
        ? el("p", { class: "note", id: "consent-not-approver" }, "You may not decide consent requests (action consent_issue on soulbase.server.consent); you can follow your own below.")
        : alertBox(refusal)
      : rows.length
        ? el(
            "div",
            { class: "table-wrap" },
            el(
              "table",
              { id: "consent-requests" },
              el("caption", { class: "note" }, "Your tenant's consent requests, newest first"),
              el("thead", {}, el("tr", {}, ["Requested (UTC)", "Actor", "Tool", "Arguments digest", "Refused call", "Status", "Decide"].map((h, i) => el("th", { scope: "col", class: i === 3 ? "wide" : undefined }, h)))),
              el("tbody", {}, rows),
            ),
          )
        : el("p", { id: "consent-empty" }, `No ${wanted || ""} requests.`),
    panel,
    result,
    followForm,
  );
}

// ---------------------------------------------------------------- simulator

/** The preflight's stages, in the order the pipeline runs them, and the code
 *  domains each refuses with. */
const STAGES = [
  ["resolve", ["TOOL"]],
  ["schema", ["SCHEMA"]],
  ["authorization", ["AUTH", "POLICY", "SKILL"]],
  ["terms", ["SUBSCRIPTION"]],
  ["quota", ["QUOTA"]],
  ["consent", ["CONSENT"]],
  ["sandbox guard", ["SANDBOX", "PROVIDER"]],
];

async function simulatorView() {
  let list;
  try {
    list = await api("GET", "/api/tools");
  } catch (e) {
    return show(el("h2", {}, "Policy simulator"), alertBox(e));
  }
  // Any tool id (one you may not list is simulated too), your tools suggested.
  const tool = el("input", { id: "sim-tool", name: "tool", list: "sim-tools", required: true, autocomplete: "off" });
  const suggestions = el("datalist", { id: "sim-tools" }, list.tools.map((t) => el("option", { value: t.id })));
  const args = el("textarea", { id: "sim-args", name: "args", rows: 6, cols: 60, spellcheck: "false" }, "{}");
  // Whom to ask about: yourself when empty; someone else needs action preflight
  // on soulbase.server.simulator (another tenant: the global tenant only).
  const asActor = el("input", { id: "sim-actor", name: "actor", autocomplete: "off", placeholder: "you" });
  const asTenant = el("input", { id: "sim-tenant", name: "tenant", autocomplete: "off", placeholder: "your tenant" });
  const asRoles = el("input", { id: "sim-roles", name: "roles", autocomplete: "off", placeholder: "comma-separated" });
  const asScopes = el("input", { id: "sim-scopes", name: "scopes", autocomplete: "off", placeholder: "comma-separated" });
  const out = el("div", { id: "verdict", "aria-live": "polite" });
  const run = async () => {
    let body;
    try {
      body = JSON.parse(args.value || "{}");
    } catch (e) {
      out.replaceChildren(el("div", { class: "alert", role: "alert" }, `The arguments are not JSON: ${e.message}`));
      return;
    }
    const who = new URLSearchParams();
    for (const [name, input] of [["actor", asActor], ["tenant", asTenant], ["roles", asRoles], ["scopes", asScopes]]) {
      if (input.value.trim()) who.set(name, input.value.trim());
    }
    let report = null;
    let refusal = null;
    try {
      report = await api("POST", `/api/tools/${encodeURIComponent(tool.value.trim())}/preflight${who.size ? `?${who}` : ""}`, body);
    } catch (e) {
      refusal = e;
    }
    // Refused before any stage: you may not ask about that actor.
    if (refusal && ["actor", "tenant", "roles", "scopes", "query"].includes(refusal.fields.field)) {
      out.replaceChildren(el("h3", {}, `Not simulated: ${refusal.code}`), el("p", {}, refusal.message));
      return;
    }
    const domain = refusal ? String(refusal.code).split(".")[0] : null;
    const failed = refusal ? STAGES.findIndex(([, domains]) => domains.includes(domain)) : -1;
    const rows = STAGES.map(([name], i) => {
      let verdict;
      if (!refusal || (failed >= 0 && i < failed)) verdict = el("span", { class: "status-ok" }, "passed");
      else if (i === failed) verdict = el("span", { class: "status-denied" }, `refused: ${refusal.code}`);
      else verdict = el("span", { class: "note" }, "not reached");
      return el("tr", { "data-stage": name }, el("th", { scope: "row" }, name), el("td", {}, verdict));
    });
    out.replaceChildren(
      el("h3", {}, refusal ? `Refused: ${refusal.code}` : "Allowed"),
      refusal ? el("p", {}, refusal.message) : "",
      el("div", { class: "table-wrap" }, el("table", { id: "stages" }, el("caption", { class: "note" }, "Each stage of the preflight, in order"), el("tbody", {}, rows))),
      refusal && Object.keys(refusal.fields).length ? el("pre", {}, JSON.stringify(refusal.fields, null, 2)) : "",
      report
        ? el(
            "dl",
            { class: "fields" },
            [
              ["Version", report.version],
              ["Policy hash", el("code", {}, report.policy_hash)],
              ["Profile hash", el("code", {}, report.profile_hash)],
              ["Consent required", report.consent_required ? "yes" : "no"],
              ["Budget", JSON.stringify(report.budget)],
              ["Obligations", JSON.stringify(report.obligations || [])],
            ].map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]),
          )
        : "",
    );
  };
  show(
    el("h2", {}, "Policy simulator"),
    el("p", { class: "note" }, "May you — or the actor you name — call this tool with these arguments? Every preflight check runs; nothing is executed, consumed or recorded."),
    el(
      "form",
      {
        class: "filters",
        onsubmit: (ev) => {
          ev.preventDefault();
          run();
        },
      },
      el("label", { for: "sim-tool" }, "Tool", tool),
      suggestions,
      el("label", { for: "sim-args" }, "Arguments (JSON)", args),
      el(
        "fieldset",
        {},
        el("legend", {}, "As (optional)"),
        el("label", { for: "sim-actor" }, "Actor", asActor),
        el("label", { for: "sim-tenant" }, "Tenant", asTenant),
        el("label", { for: "sim-roles" }, "Roles", asRoles),
        el("label", { for: "sim-scopes" }, "Scopes", asScopes),
      ),
      el("button", { type: "submit", class: "primary" }, "Simulate"),
    ),
    out,
  );
}

// ---------------------------------------------------------------- routing

function route() {
  clearInterval(overviewState.timer);
  overviewState.timer = null;
  const c = credentials();
  document.getElementById("nav").hidden = !c;
  if (!c) return loginView();
  document.getElementById("who").textContent = c.kind === "key" ? `API key ${c.key.split("_")[1] || ""}` : `${c.tenant} / ${c.actor}`;
  const hash = location.hash.split("?")[0] || "#/tools";
  for (const a of document.querySelectorAll("nav a")) {
    if (hash.startsWith(a.getAttribute("href"))) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const [, page, id] = hash.split("/").map(decodeURIComponent);
  if (page === "tools" && id) return toolView(id);
  if (page === "skills" && id) return skillView(id);
  if (page === "skills") return skillsView();
  if (page === "evidence" && id) return callView(id);
  if (page === "evidence") return evidenceView();
  if (page === "simulator") return simulatorView();
  if (page === "overview") return overviewView();
  if (page === "quarantine") return quarantineView();
  if (page === "consent") return consentView();
  return toolsView();
}

document.getElementById("logout").addEventListener("click", () => {
  sessionStorage.removeItem(CREDS);
  location.hash = "#/";
  route();
});
window.addEventListener("hashchange", route);
route();
