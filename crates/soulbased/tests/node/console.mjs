// The operator console driven by a real browser: Playwright (playwright-core,
// from the npm registry through .ci/node-tools) on Debian's Chromium
// (.ci/browser). Prints one JSON line per finding for the Rust test
// (crates/soulbased/tests/console.rs) to judge, and saves a screenshot of each
// page into SHOTS.
//
// Usage: node console.mjs URL API_KEY DENIED_CALL OTHER_TENANT_CALL SHOTS CONVERSATION CONSENT_REQUEST OPS_KEY
//    or: node console.mjs --timing URL API_KEY ROUNDS (each view's load time,
//        from navigation to its data shown, ROUNDS times)
// (SOULBASE_NODE_MODULES: the node_modules holding playwright-core;
// SOULBASE_CHROMIUM: the browser).

import { createRequire } from "node:module";
import { join } from "node:path";

const require = createRequire(join(process.env.SOULBASE_NODE_MODULES, "..", "package.json"));
const { chromium } = require("playwright-core");

const executablePath = process.env.SOULBASE_CHROMIUM;

function emit(line) {
  console.log(JSON.stringify(line));
}

const browser = await chromium.launch({
  executablePath,
  args: ["--no-sandbox", "--disable-dev-shm-usage"],
});
try {
  if (process.argv[2] === "--timing") await timing(...process.argv.slice(3));
  else await scenario(...process.argv.slice(2));
} finally {
  await browser.close();
}

/** Each view's load, from navigation to its data on screen, `rounds` times. */
async function timing(url, apiKey, rounds) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  await page.goto(`${url}/ui`);
  await page.getByLabel("API key (sbk_…)").fill(apiKey);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("#tools tbody tr").first().waitFor();
  const views = {
    tools: ["#/tools", "#tools tbody tr"],
    evidence: ["#/evidence", "#calls tbody tr"],
    call: [null, "#timeline li"],
  };
  const ms = { tools: [], evidence: [], call: [] };
  let call = null;
  for (let i = 0; i < Number(rounds); i++) {
    for (const [name, [hash, ready]] of Object.entries(views)) {
      const target = hash || `#/evidence/${encodeURIComponent(call)}`;
      await page.goto("about:blank");
      const t0 = Date.now();
      await page.goto(`${url}/ui${target}`);
      await page.locator(ready).first().waitFor();
      ms[name].push(Date.now() - t0);
      if (name === "evidence") call = await page.locator("#calls tbody tr").first().getAttribute("data-call");
    }
  }
  emit({ label: "timing", ms, rows: await page.locator("#timeline li").count() });
}

async function scenario(url, apiKey, deniedCall, otherCall, shots, conversation, consentRequest, opsKey) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const problems = [];
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() === "error") problems.push(`console: ${m.text()}`);
  });

  // Sign in with an API key; the tools list shows.
  let t0 = Date.now();
  await page.goto(`${url}/ui`);
  await page.getByLabel("API key (sbk_…)").fill(apiKey);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("#tools tbody tr").first().waitFor();
  emit({ label: "tools", ms: Date.now() - t0, tools: await page.locator("#tools tbody tr").evaluateAll((rows) => rows.map((r) => r.dataset.tool)) });
  await page.screenshot({ path: `${shots}/tools.png`, fullPage: true });

  // The search narrows the list.
  await page.getByLabel("Search").fill("echo");
  emit({ label: "search", tools: await page.locator("#tools tbody tr").evaluateAll((rows) => rows.map((r) => r.dataset.tool)) });
  await page.getByLabel("Search").fill("");

  // The evidence explorer: the tenant's calls that ended in error.
  t0 = Date.now();
  await page.getByRole("link", { name: "Evidence" }).click();
  await page.getByLabel("Status").selectOption("error");
  await page.getByRole("button", { name: "Show" }).click();
  await page.locator("#calls tbody tr").first().waitFor();
  emit({
    label: "errors",
    ms: Date.now() - t0,
    calls: await page.locator("#calls tbody tr").evaluateAll((rows) => rows.map((r) => [...r.cells].map((c) => c.textContent))),
  });
  await page.screenshot({ path: `${shots}/evidence.png`, fullPage: true });

  // A time window that ends before the calls began shows none of them.
  await page.getByLabel("Began before").fill("2001-01-01T00:00:00");
  await page.getByRole("button", { name: "Show" }).click();
  await page.locator("#calls tbody tr").first().waitFor({ state: "detached" });
  emit({ label: "before-2001", rows: await page.locator("#calls tbody tr").count() });
  await page.getByLabel("Began before").fill("");

  // Calls refused before they ran, by error code; then by an actor who made none.
  await page.getByLabel("Status").selectOption("denied");
  await page.getByLabel("Error code").fill("POLICY.DENY_TOOL");
  await page.getByRole("button", { name: "Show" }).click();
  await page.locator("#calls tbody tr").first().waitFor();
  emit({
    label: "denials",
    calls: await page.locator("#calls tbody tr").evaluateAll((rows) => rows.map((r) => [...r.cells].map((c) => c.textContent))),
  });
  await page.screenshot({ path: `${shots}/evidence-denials.png`, fullPage: true });
  await page.getByLabel("Actor").fill("nobody");
  await page.getByRole("button", { name: "Show" }).click();
  await page.locator("#calls tbody tr").first().waitFor({ state: "detached" });
  emit({ label: "denials-nobody", rows: await page.locator("#calls tbody tr").count() });
  await page.getByLabel("Actor").fill("");
  await page.getByLabel("Error code").fill("");
  await page.getByLabel("Status").selectOption("");

  // A refused call, opened by its id: its code and the stage that decided.
  await page.getByLabel("Or open a call id").fill(deniedCall);
  await page.getByRole("button", { name: "Show" }).click();
  await page.locator("#timeline li").first().waitFor();
  emit({ label: "refused", text: await page.locator("#timeline").innerText() });
  await page.screenshot({ path: `${shots}/refused.png`, fullPage: true });

  // An agent conversation, turn by turn (a fresh load: the previous page has a
  // timeline too).
  await page.goto("about:blank");
  await page.goto(`${url}/ui#/evidence/${encodeURIComponent(conversation)}`);
  await page.locator("#timeline li").first().waitFor();
  emit({ label: "conversation", text: await page.locator("#timeline").innerText() });
  await page.screenshot({ path: `${shots}/conversation.png`, fullPage: true });

  // Another tenant's call is not there for this caller.
  await page.goto("about:blank");
  await page.goto(`${url}/ui#/evidence/${encodeURIComponent(otherCall)}`);
  await page.getByRole("alert").waitFor();
  emit({ label: "other-tenant", text: await page.getByRole("alert").innerText() });

  // At phone width the page does not overflow sideways.
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(`${url}/ui#/tools`);
  await page.locator("#tools tbody tr").first().waitFor();
  emit({ label: "phone", scroll_width: await page.evaluate(() => document.documentElement.scrollWidth) });
  await page.screenshot({ path: `${shots}/tools-phone.png`, fullPage: true });
  await page.setViewportSize({ width: 1280, height: 800 });

  // The quarantine: what the database refused, this tenant's only.
  await page.goto(`${url}/ui#/quarantine`);
  await page.locator("#quarantine tbody tr").first().waitFor();
  emit({ label: "quarantine", text: await page.locator("main").innerText() });
  await page.screenshot({ path: `${shots}/quarantine.png`, fullPage: true });
  // Retrying is the operator's: this tenant's caller is refused, and sees why.
  page.once("dialog", (d) => d.accept());
  await page.getByRole("button", { name: "Retry" }).click();
  await page.locator("#retry-status [role=alert]").waitFor();
  emit({
    label: "retry-refused",
    text: await page.locator("#retry-status").innerText(),
    rows: await page.locator("#quarantine tbody tr").count(),
  });

  // Consent: a pending request listed with who asked for what, approved from
  // the page for that call's arguments, confirming the dialog.
  await page.goto(`${url}/ui#/consent`);
  const request = page.locator(`#consent-requests tr[data-request="${consentRequest}"]`);
  await request.waitFor();
  const listed = await request.innerText();
  await page.screenshot({ path: `${shots}/consent.png`, fullPage: true });
  await request.getByRole("button", { name: /^Approve/ }).click();
  await page.getByLabel("This call's arguments only").check();
  await page.getByLabel(/Token lifetime/).fill("600000");
  let consentConfirm = null;
  page.once("dialog", (d) => {
    consentConfirm = d.message();
    d.accept();
  });
  await page.locator("#consent-decision").getByRole("button", { name: "Approve" }).click();
  await page.locator("#consent-outcome").waitFor();
  emit({
    label: "consent",
    listed,
    confirm: consentConfirm,
    outcome: await page.locator("#consent-outcome").innerText(),
    left: await page.locator(`#consent-requests tr[data-request="${consentRequest}"]`).count(),
  });
  await page.screenshot({ path: `${shots}/consent-approved.png`, fullPage: true });

  // A skill: its SKILL.md rendered (front matter apart, heading, emphasis, list).
  await page.goto(`${url}/ui#/skills`);
  await page.locator("#skills tbody tr").first().waitFor();
  const skills = await page.locator("#skills tbody tr").evaluateAll((rows) => rows.map((r) => r.dataset.skill));
  await page.locator('#skills a[href="#/skills/guide"]').click();
  await page.locator("#skill-md").waitFor();
  emit({
    label: "skill",
    skills,
    heading: await page.locator("#skill-md h3").first().innerText(),
    strong: await page.locator("#skill-md strong").first().innerText(),
    items: await page.locator("#skill-md li").allInnerTexts(),
    code: await page.locator("#skill-md code").first().innerText(),
  });
  await page.screenshot({ path: `${shots}/skill.png`, fullPage: true });

  // Disable the skill from the skills page and enable it again, confirming.
  const toggle = async () => {
    const shown = page.locator('#skills tr[data-skill="guide"] td:nth-child(3)');
    const was = await shown.innerText();
    page.once("dialog", (d) => d.accept());
    await page.locator('button[data-toggle="guide"]').click();
    await page.locator('#skills tr[data-skill="guide"] td:nth-child(3)', { hasText: was === "yes" ? "no" : "yes" }).waitFor();
    return page.locator('#skills tr[data-skill="guide"] td:nth-child(3)').innerText();
  };
  await page.goto("about:blank");
  await page.goto(`${url}/ui#/skills`);
  await page.locator('button[data-toggle="guide"]').waitFor();
  const graph = await page.locator("#skills-graph").textContent();
  const off = await toggle();
  await page.screenshot({ path: `${shots}/skills.png`, fullPage: true });
  const on = await toggle();
  emit({ label: "skill-toggle", off, on, graph });

  // The policy simulator: an allowed call, then a denied one.
  const stages = () =>
    page.locator("#stages tr").evaluateAll((rows) => rows.map((r) => [r.dataset.stage, r.cells[1].textContent]));
  await page.goto(`${url}/ui#/simulator`);
  await page.getByLabel("Tool").fill("soulbase.builtin.echo");
  await page.getByLabel("Arguments (JSON)").fill('{"hello": "simulated"}');
  await page.getByRole("button", { name: "Simulate" }).click();
  await page.getByRole("heading", { name: "Allowed" }).waitFor();
  emit({ label: "sim-allowed", stages: await stages(), text: await page.locator("#verdict").innerText() });
  await page.screenshot({ path: `${shots}/simulator-allowed.png`, fullPage: true });
  await page.getByLabel("Tool").fill("soulbase.builtin.sleep");
  await page.getByLabel("Arguments (JSON)").fill('{"ms": 1}');
  await page.getByRole("button", { name: "Simulate" }).click();
  await page.getByRole("heading", { name: /^Refused:/ }).waitFor();
  emit({ label: "sim-denied", stages: await stages(), heading: await page.locator("#verdict h3").innerText() });
  await page.screenshot({ path: `${shots}/simulator-denied.png`, fullPage: true });
  // As another actor of the tenant; then as another tenant's, which only the
  // global tenant may ask about.
  await page.getByLabel("Tool").fill("soulbase.builtin.echo");
  await page.getByLabel("Arguments (JSON)").fill("{}");
  await page.getByLabel("Actor").fill("ivy");
  await page.getByRole("button", { name: "Simulate" }).click();
  await page.getByRole("heading", { name: "Allowed" }).waitFor();
  emit({ label: "sim-as", stages: await stages() });
  await page.screenshot({ path: `${shots}/simulator-as.png`, fullPage: true });
  await page.getByLabel("Tenant").fill("beta");
  await page.getByRole("button", { name: "Simulate" }).click();
  await page.getByRole("heading", { name: /^Not simulated:/ }).waitFor();
  emit({ label: "sim-other-tenant", text: await page.locator("#verdict").innerText() });

  // The overview's counters move after a burst of calls (made through the API
  // with the same key, from the page).
  const counter = async (name) => Number(await page.locator(`[data-counter="${name}"]`).innerText());
  await page.goto(`${url}/ui#/overview`);
  await page.locator("#counters").waitFor();
  const before = await counter("Calls");
  await page.screenshot({ path: `${shots}/overview.png`, fullPage: true });
  const statuses = await page.evaluate(async (key) => {
    const out = [];
    for (let i = 0; i < 20; i++) {
      const r = await fetch("/api/tools/soulbase.builtin.echo/invoke", {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: JSON.stringify({ burst: i }),
      });
      out.push(r.status);
    }
    return out;
  }, apiKey);
  await page.goto("about:blank");
  await page.goto(`${url}/ui#/overview`);
  await page.locator("#counters").waitFor();
  emit({
    label: "overview",
    before,
    after: await counter("Calls"),
    statuses,
    latency: await page.locator("#latency tbody tr").evaluateAll((rows) => rows.map((r) => r.dataset.tool)),
    surfaces: await page.locator("#surfaces tbody tr").evaluateAll((rows) => rows.map((r) => r.dataset.surface)),
    denied: await counter("Denied"),
    charts: await page.locator("svg[role=img]").count(),
  });

  // Disable a tool, confirming the dialog.
  await page.goto(`${url}/ui#/tools/${encodeURIComponent("soulbase.builtin.echo")}`);
  page.once("dialog", (d) => {
    emit({ label: "confirm", message: d.message() });
    d.accept();
  });
  await page.getByRole("button", { name: "Disable" }).click();
  await page.getByRole("button", { name: "Enable" }).waitFor();
  emit({ label: "disabled", text: await page.locator("dl.fields").innerText() });
  await page.screenshot({ path: `${shots}/tool-disabled.png`, fullPage: true });

  // The operator signs in, sees every tenant's quarantined records, and retries
  // them, confirming: the answer shows, and the list is read again.
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.getByLabel("API key (sbk_…)").waitFor();
  await page.goto("about:blank");
  await page.goto(`${url}/ui`);
  await page.getByLabel("API key (sbk_…)").fill(opsKey);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("button", { name: "Sign out" }).waitFor();
  // A fresh load (the signed-in credentials stay in the tab): the tools view
  // the sign-in opened may still be loading.
  await page.goto("about:blank");
  await page.goto(`${url}/ui#/quarantine`);
  await page.locator("#quarantine tbody tr").first().waitFor();
  const listedBefore = await page.locator("#quarantine tbody tr").count();
  page.once("dialog", (d) => {
    emit({ label: "retry-confirm", message: d.message() });
    d.accept();
  });
  await page.getByRole("button", { name: "Retry" }).click();
  await page.locator("#retry-result").waitFor();
  emit({
    label: "retried",
    before: listedBefore,
    result: await page.locator("#retry-result").innerText(),
    rows: await page.locator("#quarantine tbody tr").count(),
    empty: await page.locator("#quarantine-empty").count(),
  });
  await page.screenshot({ path: `${shots}/quarantine-retried.png`, fullPage: true });

  // The operator reads a tenant's evidence by naming it: acme's refused call
  // among its denials, then opened with its deciding stage.
  await page.goto("about:blank");
  await page.goto(`${url}/ui#/evidence`);
  await page.getByLabel("Tenant").fill("acme");
  await page.getByLabel("Status").selectOption("denied");
  await page.getByRole("button", { name: "Show" }).click();
  const row = page.locator(`#calls tbody tr[data-call="${deniedCall}"]`);
  await row.waitFor();
  await row.getByRole("link").click();
  await page.locator("#timeline li").first().waitFor();
  emit({ label: "operator-call", text: await page.locator("#timeline").innerText() });
  await page.screenshot({ path: `${shots}/operator-evidence.png`, fullPage: true });

  emit({ label: "problems", problems });
}
