// The ledger page in a real browser: Debian's chromium, driven by playwright-core, against a
// `tokensaver serve` that has just gated a scripted session in front of the built-in provider
// (`tokensaver mock-provider`). Nothing leaves 127.0.0.1.
//
//   bash tests/page/install.sh && node --test tests/page/
//
// TOKENSAVER_BIN overrides the binary (default target/debug/tokensaver). SCREENSHOTS=DIR also
// saves the README's screenshots of the real page into DIR.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import { mkdtempSync, writeFileSync, rmSync, mkdirSync, openSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import net from "node:net";
import crypto from "node:crypto";

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, "..", "..");
const BIN = process.env.TOKENSAVER_BIN || join(ROOT, "target", "debug", "tokensaver");
const require = createRequire(join(HERE, ".node", "node_modules", "x.js"));
const { chromium } = require("playwright-core");

const CHROMIUM_ARGS = [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
];
const PROVIDER_CREDENTIAL = "sk-page-tests-provider";
// Planted in every prompt of the session: no page response may ever contain it.
const MARKER = "zebracorn" + crypto.randomBytes(4).toString("hex");
const VERDICTS = ["SERVE", "ALLOW", "DOWNGRADE", "CHALLENGE", "BLOCK"];

const procs = [];
let tmp, ctx, gate;
const seen = []; // every page response: [url, body]

function freePort() {
  return new Promise((ok, fail) => {
    const s = net.createServer();
    s.on("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

async function waitPort(port, proc, log) {
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) throw new Error(`exited before :${port} opened; see ${log}`);
    const open = await new Promise((ok) => {
      const c = net.connect(port, "127.0.0.1", () => { c.destroy(); ok(true); });
      c.on("error", () => ok(false));
    });
    if (open) return;
    await sleep(50);
  }
  throw new Error(`:${port} did not open; see ${log}`);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function cli(...args) {
  return execFileSync(BIN, args, { encoding: "utf8" });
}

/** `tokensaver key new`: the key and its config lines (default scoring weights). */
function newKey(id) {
  const out = cli("key", "new", "--id", id, "--profile", "none");
  return { key: out.match(/(tsk_\S+)/)[1], lines: out.split("config lines:\n")[1] };
}

function start(args, log, env = {}) {
  const fd = openSync(log, "w");
  const p = spawn(BIN, args, { stdio: ["ignore", fd, fd], env: { ...process.env, ...env } });
  procs.push(p);
  return p;
}

async function startGate() {
  tmp = mkdtempSync(join(tmpdir(), "tokensaver-page-"));
  const [mock, proxy, api, admin] = [await freePort(), await freePort(), await freePort(), await freePort()];
  const alpha = newKey("alpha");
  const beta = newKey("beta");
  const owner = cli("key", "owner");
  const ownerSecret = owner.match(/\): (\S+)/)[1];
  const ownerLine = owner.split("[[keys]] table:\n")[1];
  const adminOut = cli("key", "admin");
  const adminKey = adminOut.match(/(tsa_\S+)/)[1];
  const adminLines = adminOut.split("config lines:\n")[1];
  const prices = ["gpt-4o", "gpt-4o-mini"].map((m) => `[prices."${m}"]
input = 2_500_000
cache_write = 2_500_000
cache_read = 1_250_000
output = 10_000_000
max_output = 16_384
`).join("\n");
  writeFileSync(join(tmp, "tokensaver.toml"), `[listen]
proxy = "127.0.0.1:${proxy}"
api = "127.0.0.1:${api}"
admin = "127.0.0.1:${admin}"

[data]
dir = "${join(tmp, "data")}"
economics = "${join(ROOT, "corpus", "economics")}"

[upstreams.openai]
base_url = "http://127.0.0.1:${mock}"
credential_env = "PAGE_TESTS_PROVIDER_KEY"

[upstreams.anthropic]
base_url = "http://127.0.0.1:${mock}"
credential_env = "PAGE_TESTS_PROVIDER_KEY"

${adminLines}
${prices}
${alpha.lines}human = false
budget = { ceiling_micro_usd = 1_000_000, period = "day" }
${ownerLine}
${beta.lines}human = true
budget = { ceiling_micro_usd = 50_000_000, period = "month" }
`);
  const m = start(["mock-provider", "--listen", `127.0.0.1:${mock}`, "--expected-credential", PROVIDER_CREDENTIAL], join(tmp, "mock.log"));
  await waitPort(mock, m, join(tmp, "mock.log"));
  const s = start(["serve", "--config", join(tmp, "tokensaver.toml")], join(tmp, "serve.log"),
    { PAGE_TESTS_PROVIDER_KEY: PROVIDER_CREDENTIAL, RUST_LOG: "error" });
  for (const port of [proxy, api, admin]) await waitPort(port, s, join(tmp, "serve.log"));
  return {
    proxy: `http://127.0.0.1:${proxy}`, api: `http://127.0.0.1:${api}`, admin: `http://127.0.0.1:${admin}`,
    keys: { alpha: alpha.key, beta: beta.key }, ownerSecret, adminKey,
  };
}

/** A chat request as an agent sends it (no tokensaver header). */
async function chat(key, body) {
  const r = await fetch(`${gate.proxy}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  await r.arrayBuffer();
  return { status: r.status, verdict: r.headers.get("x-tokensaver-verdict"), hold: r.headers.get("x-tokensaver-hold") };
}

const small = (text, extra = {}) => ({
  model: "gpt-4o", temperature: 0, max_tokens: 200,
  messages: [{ role: "user", content: `${text} ${MARKER}` }], ...extra,
});

/** An agent's long session: scores into the CHALLENGE band when unattended. */
function agentBody() {
  const messages = [{ role: "system", content: `You are a coding agent ${MARKER}.` }];
  for (let i = 0; i < 40; i++) {
    messages.push({ role: i % 2 ? "assistant" : "user", content: `step ${i} ${MARKER}: ${"x".repeat(700)}` });
  }
  const tools = Array.from({ length: 24 }, (_, i) => ({
    type: "function",
    function: { name: `tool_${i}`, description: "does a thing", parameters: { type: "object", properties: {} } },
  }));
  return { model: "gpt-4o", messages, tools };
}

async function ledger(keyId) {
  const r = await fetch(`${gate.api}/ledger`, { headers: { authorization: `Bearer ${gate.keys[keyId]}` } });
  assert.equal(r.status, 200);
  return r.json();
}

async function stats() {
  const r = await fetch(`${gate.api}/stats`);
  assert.equal(r.status, 200);
  return (await r.json()).fleet;
}

/** A fresh page that fails the test on any console error, and keeps every page response. */
async function newPage() {
  const page = await ctx.newPage();
  const errors = [];
  page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("response", async (resp) => {
    if (!new URL(resp.url()).pathname.startsWith("/page")) return;
    try { seen.push([resp.url(), await resp.text()]); } catch { /* a redirect has no body */ }
  });
  return { page, errors };
}

async function signIn(page, base, key) {
  await page.goto(`${base}/page/`);
  if (await page.locator("#panel").count()) return; // this listener's session cookie is set
  await page.fill("#key", key);
  await Promise.all([page.waitForURL(`${base}/page/`), page.click("#login button[type=submit]")]);
  try {
    await page.waitForSelector("#panel", { timeout: 10_000 });
  } catch (e) {
    throw new Error(`not signed in: ${(await page.textContent("body")).slice(0, 400)}`);
  }
}

/** Every figure cell of the page: { "key|figure": value }. */
async function figures(page) {
  return page.$$eval("[data-figure]", (els) => Object.fromEntries(els
    .filter((e) => e.dataset.key || e.dataset.scope)
    .map((e) => [`${e.dataset.key || e.dataset.scope}|${e.dataset.figure}`, Number(e.dataset.value)])));
}

function assertFiguresMatch(f, who, totals) {
  assert.equal(f[`${who}|requests`], totals.requests, `${who} requests`);
  for (const v of VERDICTS) assert.equal(f[`${who}|${v}`], totals.by_verdict[v] ?? 0, `${who} ${v}`);
  for (const t of ["tokens_not_bought", "worst_case_tokens_avoided", "findings_tokens_estimated", "spend_nano", "cache_saving",
                   "cache_saving_lifetimes", "cache_saving_routing", "cache_rebuilds", "cache_rebuild",
                   "cache_premium_1h"]) {
    assert.equal(f[`${who}|${t}`], totals[t], `${who} ${t}`);
  }
}

before(async () => {
  gate = await startGate();
  const userDataDir = join(tmp, "chromium-profile");
  mkdirSync(userDataDir);
  ctx = await chromium.launchPersistentContext(userDataDir, {
    executablePath: "/usr/bin/chromium", headless: true, args: CHROMIUM_ARGS,
    viewport: { width: 1280, height: 900 },
  });

  // The scripted session. alpha: an unattended agent with a $1 daily budget and an owner.
  const a = gate.keys.alpha;
  const first = await chat(a, small("What is a cost gate?"));
  assert.ok(["ALLOW", "DOWNGRADE"].includes(first.verdict), JSON.stringify(first));
  await sleep(300); // the usage is recorded after the answer is relayed
  const verdicts = [first.verdict];
  for (let i = 0; i < 4; i++) verdicts.push((await chat(a, small("What is a cost gate?"))).verdict);
  // The repeat is answered from the store; the 4th identical request of an unattended key is
  // a runaway loop.
  assert.deepEqual(verdicts.slice(1), ["SERVE", "SERVE", "BLOCK", "BLOCK"], verdicts.join());
  // A sampled request cannot be served from the store: its loop is blocked at its worst case.
  const sampled = [];
  for (let i = 0; i < 4; i++) sampled.push((await chat(a, small("Name three rules.", { temperature: 0.7 }))).verdict);
  assert.equal(sampled[3], "BLOCK", sampled.join());
  // beta: a person at the terminal.
  await chat(gate.keys.beta, small("Summarise the ledger."));
  await chat(gate.keys.beta, small("List the tiers.", { max_tokens: 64 }));
});

after(async () => {
  await ctx?.close();
  for (const p of procs.reverse()) {
    if (p.exitCode === null) {
      p.kill("SIGTERM");
      await Promise.race([new Promise((r) => p.once("exit", r)), sleep(5000)]);
      if (p.exitCode === null) p.kill("SIGKILL");
    }
  }
  if (tmp && !process.env.KEEP_TMP) rmSync(tmp, { recursive: true, force: true });
});

test("the admin view loads without console errors and shows what /ledger and /stats report", { timeout: 120_000 }, async () => {
  const { page, errors } = await newPage();
  await signIn(page, gate.admin, gate.adminKey);
  for (const section of ["#budgets", "#savings", "#verdicts svg.chart", "#holds", "#sessions", "#decisions", "#economics"]) {
    assert.ok(await page.isVisible(section), section);
  }
  const f = await figures(page);
  assertFiguresMatch(f, "alpha", (await ledger("alpha")).total);
  assertFiguresMatch(f, "beta", (await ledger("beta")).total);
  const fleet = await stats();
  assertFiguresMatch(f, "*", fleet);
  // The three tiers, each apart: the cards show the fleet's totals.
  for (const t of ["tokens_not_bought", "worst_case_tokens_avoided", "findings_tokens_estimated"]) {
    assert.equal(f[`total|${t}`], fleet[t], t);
  }
  assert.ok(fleet.tokens_not_bought > 0 && fleet.worst_case_tokens_avoided > 0);
  // The plot's bars add up to the verdicts the ledger counted.
  const bars = await page.$$eval("#verdicts rect.bar", (rs) => rs.map((r) => [r.dataset.verdict, r.dataset.reason, Number(r.dataset.count)]));
  const plotted = Object.fromEntries(VERDICTS.map((v) => [v, 0]));
  for (const [v, , n] of bars) plotted[v] += n;
  assert.deepEqual(plotted, Object.fromEntries(VERDICTS.map((v) => [v, fleet.by_verdict[v] ?? 0])));
  assert.ok(bars.some(([v, r]) => v === "BLOCK" && r === "runaway_loop_unattended"), JSON.stringify(bars));
  // Latest decisions: verdict, rule, findings, and a receipt that verifies.
  const rows = await page.$$eval("tr.decision", (trs) => trs.map((t) => t.dataset.verdict));
  assert.equal(rows.length, fleet.requests);
  const verify = page.locator("tr.decision[data-verdict=BLOCK] a.verify").first();
  await Promise.all([page.waitForURL(/\/page\/receipt\//), verify.click()]);
  assert.match(await page.textContent("#verified"), /Signature valid/);
  assert.match(await page.textContent("#receipt"), /runaway_loop_unattended/);
  if (process.env.SCREENSHOTS) {
    mkdirSync(process.env.SCREENSHOTS, { recursive: true });
    await page.screenshot({ path: join(process.env.SCREENSHOTS, "ledger-page-receipt.png"), fullPage: true });
  }
  // The economics verdict, labelled as a simulation when it is one.
  await page.goto(`${gate.admin}/page/`);
  const statement = await page.textContent("#economics blockquote");
  assert.ok(statement.length > 0);
  if (statement.startsWith("In a simulation")) assert.ok(await page.isVisible("#simulation"));
  if (process.env.SCREENSHOTS) {
    mkdirSync(process.env.SCREENSHOTS, { recursive: true });
    await page.screenshot({ path: join(process.env.SCREENSHOTS, "ledger-page-admin.png"), fullPage: true });
  }
  assert.deepEqual(errors, []);
  await page.close();
});

test("approving a hold from the page releases the agent's retry", { timeout: 120_000 }, async () => {
  const body = agentBody();
  const held = await chat(gate.keys.alpha, body);
  assert.equal(held.status, 409, JSON.stringify(held));
  assert.equal(held.verdict, "CHALLENGE");
  // A re-send while the hold is pending is held again.
  assert.equal((await chat(gate.keys.alpha, body)).status, 409);

  const { page, errors } = await newPage();
  await signIn(page, gate.admin, gate.adminKey);
  const row = page.locator(`tr.hold[data-hold="${held.hold}"]`);
  assert.equal(await row.count(), 1);
  assert.match(await row.locator(".countdown").textContent(), /^in \d+m \d\ds$/);
  if (process.env.SCREENSHOTS) {
    await page.locator("#holds").screenshot({ path: join(process.env.SCREENSHOTS, "ledger-page-hold.png") });
  }
  await Promise.all([page.waitForURL(/done=approved/), row.locator("button.approve-btn").click()]);
  assert.match(await page.textContent("#notice"), /Approved/);
  assert.equal(await page.locator(`tr.hold[data-hold="${held.hold}"] button.approve-btn`).count(), 0);

  // The agent's retry, still without any header, now passes once.
  const retry = await chat(gate.keys.alpha, body);
  assert.equal(retry.status, 200, JSON.stringify(retry));
  assert.ok(["ALLOW", "DOWNGRADE"].includes(retry.verdict), retry.verdict);
  assert.equal((await chat(gate.keys.alpha, body)).status, 409, "once only");

  // The page is live: the panel picks the new decisions up without a reload.
  const before = Number(await page.getAttribute("#panel [data-figure='requests'][data-key='*']", "data-value"));
  await chat(gate.keys.beta, small("One more, live."));
  await page.waitForFunction(
    (n) => Number(document.querySelector("#panel [data-figure='requests'][data-key='*']").dataset.value) > n,
    before, { timeout: 15_000 },
  );
  assert.ok(Number(await page.evaluate(() => document.body.dataset.refreshed || 0)) >= 1);
  assert.deepEqual(errors, []);
  await page.close();
});

test("a key's view shows only that key's figures, on the API listener", { timeout: 120_000 }, async () => {
  const { page, errors } = await newPage();
  await signIn(page, gate.api, gate.keys.alpha);
  const f = await figures(page);
  const alpha = (await ledger("alpha")).total;
  assertFiguresMatch(f, "alpha", alpha);
  for (const t of ["tokens_not_bought", "worst_case_tokens_avoided", "findings_tokens_estimated"]) {
    assert.equal(f[`total|${t}`], alpha[t], t);
  }
  const keysShown = new Set(Object.keys(f).map((k) => k.split("|")[0]));
  assert.deepEqual([...keysShown].sort(), ["alpha", "total"]);
  const text = await page.textContent("body");
  assert.ok(!text.includes("beta"), "another key's id is on the page");
  const html = await page.content();
  assert.ok(!html.includes("beta"));
  const rows = await page.$$eval("tr.decision td:nth-child(2)", (tds) => tds.map((t) => t.textContent));
  assert.ok(rows.length > 0 && rows.every((k) => k === "alpha"), rows.join());
  assert.equal(await page.locator("#economics").count(), 0, "the fleet's evidence is the admin's");
  if (process.env.SCREENSHOTS) {
    await page.screenshot({ path: join(process.env.SCREENSHOTS, "ledger-page-key.png"), fullPage: true });
  }
  assert.deepEqual(errors, []);
  await page.close();
  // Signing out ends the session; the admin key does not sign in on the API listener (a page
  // of its own: its 401 is expected).
  const other = await ctx.newPage();
  await other.goto(`${gate.api}/page/`);
  await Promise.all([other.waitForURL(`${gate.api}/page/`), other.click(".signout button")]);
  await other.waitForSelector("#key");
  await other.fill("#key", gate.adminKey);
  await other.click("#login button[type=submit]");
  await other.waitForSelector("#login .error");
  assert.match(await other.textContent("#login .error"), /admin listener only/);
  await other.close();
});

test("no page response carries any request content", { timeout: 60_000 }, async () => {
  // Every page a signed-in admin can reach, besides what the tests above loaded.
  const { page } = await newPage();
  await signIn(page, gate.admin, gate.adminKey);
  for (const q of ["?range=1h", "?range=30d", "?verdict=BLOCK", "?verdict=CHALLENGE"]) {
    await page.goto(`${gate.admin}/page/${q}`);
  }
  const receipts = await page.$$eval("a.verify", (as) => as.map((a) => a.href));
  for (const href of receipts) await page.goto(href);
  await page.close();
  assert.ok(seen.length > 10, `${seen.length} responses`);
  for (const [url, body] of seen) assert.ok(!body.includes(MARKER), `${url} carries request content`);
});
