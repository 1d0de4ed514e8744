// Drives headless Chromium through forkd's front page (`GET /`), as a person would.
//
// Run by tests/it/browser.rs, which starts two forkd servers and Chromium itself
// and passes:
//   --cdp=ws://127.0.0.1:PORT/devtools/browser/ID   the running Chromium (DevTools protocol)
//   --url=http://127.0.0.1:PORT                     a server without rate limiting
//   --limited=http://127.0.0.1:PORT                 a server with a small rate limit
//   --admin-token=TOKEN                             an admin's access token on --url
// (https URLs for the HTTP/2 run: the same flow, over TLS).
// It prints one JSON object on stdout: what each step saw, every console error,
// page error, CSP violation and failed request, and the layout measured at
// 1280 and 375 px, and the protocol of every request of pages A and B (the page's
// `performance.getEntries()` `nextHopProtocol`, and the DevTools network events for
// what resource timing does not list: the open event stream, the WebSocket's handshake).
// The Rust test asserts on it; this script only fails (exit 1,
// `error` set) when a step cannot complete in time. Progress goes to stderr.
import { chromium } from "playwright-core";

const arg = name => {
  const hit = process.argv.find(a => a.startsWith(`--${name}=`));
  return hit ? hit.slice(name.length + 3) : "";
};
const CDP = arg("cdp"), URL = arg("url"), LIMITED = arg("limited"), ADMIN = arg("admin-token");
const STEP_MS = 15_000;
const out = { steps: {}, layout: {}, main: sink(), limited: sink(), protocols: { A: net(), B: net() }, error: null };
const say = (...a) => console.error(`[front.mjs ${new Date().toISOString()}]`, ...a);
let done = false;

function sink() {
  return { console: [], pageErrors: [], csp: [], failed: [] };
}

// What a page's requests went over: `responses` from DevTools (`Network.responseReceived`:
// path, protocol, status, type), `websockets` (the handshake Chromium made and the answer it
// got), and, read from the page, `navigation` and `resources` (`nextHopProtocol`).
function net() {
  return { responses: [], websockets: [], navigation: null, resources: [] };
}

// A new page of `ctx` whose network events are recorded into `n` from its first request.
async function newPage(ctx, n) {
  const page = await ctx.newPage();
  const cdp = await ctx.newCDPSession(page);
  const ws = new Map();
  const path = u => { try { return new globalThis.URL(u).pathname; } catch { return u; } };
  cdp.on("Network.responseReceived", e => n.responses.push({
    path: path(e.response.url), origin: (() => { try { return new globalThis.URL(e.response.url).origin; } catch { return ""; } })(),
    protocol: e.response.protocol ?? null, status: e.response.status, type: e.type,
  }));
  cdp.on("Network.webSocketCreated", e => ws.set(e.requestId, { path: path(e.url), request: null, status: null, headers: null }));
  cdp.on("Network.webSocketWillSendHandshakeRequest", e => {
    const w = ws.get(e.requestId);
    if (w) w.request = e.request?.headers ?? null;
  });
  cdp.on("Network.webSocketHandshakeResponseReceived", e => {
    const w = ws.get(e.requestId);
    if (!w) return;
    w.status = e.response?.status ?? null;
    w.headers = e.response?.headers ?? null;
    w.headersText = e.response?.headersText ?? null;
    n.websockets.push(w);
  });
  await cdp.send("Network.enable");
  return page;
}

// The page's own resource timing: the document's and every finished request's protocol.
async function timing(page, n) {
  const t = await page.evaluate(() => ({
    navigation: performance.getEntriesByType("navigation")[0]?.nextHopProtocol ?? null,
    resources: performance.getEntries().filter(e => e.entryType === "resource")
      .map(e => ({ url: e.name, type: e.initiatorType, protocol: e.nextHopProtocol })),
  }));
  n.navigation = t.navigation;
  n.resources = t.resources.map(r => {
    const u = new globalThis.URL(r.url); // (`URL` is the --url argument here)
    return { path: u.pathname, origin: u.origin, type: r.type, protocol: r.protocol };
  });
}

function finish(code) {
  if (done) return;
  done = true;
  process.stdout.write(JSON.stringify(out) + "\n", () => process.exit(code));
}

// The whole run is bounded, whatever hangs.
setTimeout(() => {
  out.error = out.error || "timed out after 55 s";
  finish(1);
}, 55_000).unref();

async function api(base, method, path, body, token) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (token) headers.Authorization = `Bearer ${token}`;
  const r = await fetch(base + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json };
}

async function notify(title, body) {
  const r = await api(URL, "POST", "/api/v1/notifications", { title, body }, ADMIN);
  if (r.status !== 201) throw new Error(`POST /api/v1/notifications → ${r.status} ${JSON.stringify(r.json)}`);
}

// A browser context whose pages report into `s`: console errors, uncaught
// exceptions, CSP violations (a listener installed before any page script,
// reporting through a binding the page's CSP cannot block), failed requests
// and responses of 400 and above.
async function context(s, name, viewport) {
  const ctx = await browser.newContext({ viewport });
  await ctx.exposeBinding("__forkdCsp", (_, v) => s.csp.push(`${name}: ${v}`));
  await ctx.addInitScript(() => {
    document.addEventListener("securitypolicyviolation", e => {
      window.__forkdCsp(`${e.violatedDirective} blocked ${e.blockedURI} (${e.sourceFile}:${e.lineNumber})`);
    }, true);
  });
  ctx.on("page", p => watch(p, s, name));
  return ctx;
}

let closing = false;
function watch(page, s, name) {
  page.on("console", m => { if (m.type() === "error") s.console.push(`${name}: ${m.text()}`); });
  page.on("pageerror", e => s.pageErrors.push(`${name}: ${e.message}`));
  // The page itself ends its event stream to open it again as the user who just signed in
  // or out (the stream's audience is fixed when it opens): that abort is not a failure.
  const ownAbort = r => r.url().endsWith("/api/events") && r.failure()?.errorText === "net::ERR_ABORTED";
  page.on("requestfailed", r => { if (!closing && !ownAbort(r)) s.failed.push(`${name}: ${r.method()} ${r.url()} ${r.failure()?.errorText}`); });
  page.on("response", r => { if (r.status() >= 400) s.failed.push(`${name}: ${r.request().method()} ${r.url()} → ${r.status()}`); });
}

const text = (page, sel) => page.locator(sel).first().innerText({ timeout: STEP_MS });
const until = (page, fn, arg) => page.waitForFunction(fn, arg, { timeout: STEP_MS, polling: 50 });

// Where the three cards are, against <main>.
function measure() {
  const main = document.querySelector("main").getBoundingClientRect();
  const cards = [...document.querySelectorAll("main > section")].map(s => {
    const r = s.getBoundingClientRect();
    return { left: Math.round(r.left), right: Math.round(r.right), top: Math.round(r.top), width: Math.round(r.width) };
  });
  return {
    columns: getComputedStyle(document.querySelector("main")).gridTemplateColumns.split(" ").length,
    mainLeft: Math.round(main.left), mainRight: Math.round(main.right), mainWidth: Math.round(main.width),
    rows: new Set(cards.map(c => c.top)).size, cards,
    scrollWidth: document.scrollingElement.scrollWidth, viewport: innerWidth,
  };
}

const browser = await chromium.connectOverCDP(CDP, { timeout: STEP_MS });
try {
  const stamp = Date.now();
  // 1. A notification from before the page opened is shown on load.
  await notify("Before the page opened", "replayed on load");
  const a = await newPage(await context(out.main, "A", { width: 1280, height: 800 }), out.protocols.A);
  await a.goto(URL + "/", { timeout: STEP_MS });
  await until(a, () => document.getElementById("feed-st").textContent === "live");
  await until(a, () => document.getElementById("feed").textContent.includes("Before the page opened"));
  out.steps.replayedOnLoad = true;
  out.steps.emptyNoteHidden = await a.locator("#feed-empty").isHidden();
  out.layout.wide = await a.evaluate(measure);
  // The page's own files: what was fetched under /static/ (the `Link: rel=preload`
  // fetch is the one the tag uses, so each file once), and the stylesheet applied.
  out.steps.staticFetches = await a.evaluate(() => performance.getEntriesByType("resource")
    .map(e => new URL(e.name).pathname).filter(p => p.startsWith("/static/")));
  out.steps.bodyBackground = await a.evaluate(() => getComputedStyle(document.body).backgroundColor);
  say("page A loaded", JSON.stringify(out.layout.wide));

  // 2. Sign up from the page; it signs in at once.
  await a.click("#to-signup");
  await a.fill("#su-name", "Alice Browser");
  await a.fill("#su-email", `alice-${stamp}@example.com`);
  await a.fill("#su-password", "alice-password-1");
  await a.click("#signup button[type=submit]");
  await until(a, () => !document.getElementById("me").hidden);
  out.steps.signUpName = await text(a, "#me-name");
  await until(a, () => document.getElementById("chat-st").textContent === "online");
  out.steps.signUpChatOnline = true;
  say("signed up on A");

  // 3. A notification posted by an admin arrives live, newest first.
  await notify("Live from the admin", `sent at ${stamp}`);
  await until(a, () => document.querySelector("#feed li")?.textContent.includes("Live from the admin"));
  out.steps.liveNotification = await text(a, "#feed li");

  // 4. Sign in on a second page (its own context, a phone-sized window).
  const bobEmail = `bob-${stamp}@example.com`;
  const r = await api(URL, "POST", "/api/v1/users", { name: "Bob Browser", email: bobEmail, password: "bob-password-1" });
  if (r.status !== 201) throw new Error(`sign-up of Bob → ${r.status}`);
  const b = await newPage(await context(out.main, "B", { width: 375, height: 740 }), out.protocols.B);
  await b.goto(URL + "/", { timeout: STEP_MS });
  await until(b, () => document.getElementById("feed-st").textContent === "live");
  await until(b, () => document.querySelectorAll("#feed li").length >= 2);
  out.steps.replayedOnLoadB = await b.locator("#feed li").count();
  await b.fill("#email", bobEmail);
  await b.fill("#password", "bob-password-1");
  await b.click("#login button[type=submit]");
  await until(b, () => document.getElementById("chat-st").textContent === "online");
  out.steps.signInName = await text(b, "#me-name");
  out.layout.narrow = await b.evaluate(measure);
  say("signed in on B", JSON.stringify(out.layout.narrow));

  // 5. Chat between the two pages, with names (resent until B's join has landed).
  let seen = false;
  for (let i = 0; i < 5 && !seen; i++) {
    await a.fill("#text", `hello from Alice ${i}`);
    await a.press("#text", "Enter");
    seen = await until(b, () => [...document.querySelectorAll("#msgs li")].some(li => li.textContent.includes("hello from Alice")))
      .then(() => true, () => false);
  }
  out.steps.chatBSawA = await b.locator("#msgs li", { hasText: "hello from Alice" }).first().locator("b").innerText({ timeout: STEP_MS });
  await b.locator("#text").pressSequentially("hi A", { delay: 20 });
  await until(a, () => document.getElementById("typing").textContent.includes("is typing"));
  out.steps.typingOnA = await text(a, "#typing");
  await b.fill("#text", "hi Alice");
  await b.press("#text", "Enter");
  await until(a, () => [...document.querySelectorAll("#msgs li")].some(li => li.textContent.includes("hi Alice")));
  out.steps.chatASawB = await a.locator("#msgs li", { hasText: "hi Alice" }).first().locator("b").innerText({ timeout: STEP_MS });
  out.steps.errorBoxHiddenOnMain = (await a.locator("#err").isHidden()) && (await b.locator("#err").isHidden());
  await timing(a, out.protocols.A);
  await timing(b, out.protocols.B);

  // 6. Sign out.
  await a.click("#logout");
  await until(a, () => !document.getElementById("login").hidden && document.getElementById("chat-st").textContent === "sign in to chat");
  out.steps.signedOut = await text(a, "#auth-st");

  // 6b. The front page's link to the API reference: a page with no script, its stylesheet
  // applied under the CSP, every in-page link landing on an element (violations and failed
  // requests land in this context's sink like the front page's).
  await Promise.all([a.waitForURL(u => u.pathname === "/api/docs", { timeout: STEP_MS }), a.click("#about a[href='/api/docs']")]);
  out.steps.apiDocs = await a.evaluate(() => ({
    title: document.title,
    operations: document.querySelectorAll("section.op").length,
    scripts: document.scripts.length,
    maxWidth: getComputedStyle(document.body).maxWidth,
    dangling: [...document.querySelectorAll("a[href^='#']")]
      .map(l => l.getAttribute("href").slice(1)).filter(id => !document.getElementById(id)).length,
  }));
  say("main flow done");

  // 7. Errors, on the rate-limited server (its own sink: these requests fail on purpose).
  const c = await (await context(out.limited, "C", { width: 1280, height: 800 })).newPage();
  await c.goto(LIMITED + "/", { timeout: STEP_MS });
  await until(c, () => document.getElementById("feed-st").textContent === "live");
  await c.fill("#email", "nobody@example.com");
  await c.fill("#password", "wrong-password");
  await c.click("#login button[type=submit]");
  await until(c, () => !document.getElementById("err").hidden);
  out.steps.wrongPassword = await errorBox(c);
  // The chat's token renewal refused with 429 (this server's access tokens live 20 s, so
  // the page renews before connecting): the sign-in takes the window's last request.
  const carol = `carol-${stamp}@example.com`;
  // Windows are aligned to the clock: one that ends during the steps below would give the
  // next page a fresh allowance. Start them with 20 s of the window left at least.
  {
    const r = await fetch(LIMITED + "/api/config");
    await r.arrayBuffer();
    const reset = parseInt(r.headers.get("RateLimit-Reset") ?? "60", 10);
    if (reset < 20) await new Promise((done) => setTimeout(done, (reset + 0.5) * 1000));
  }
  const su = await api(LIMITED, "POST", "/api/v1/users", { name: "Carol", email: carol, password: "carol-password-1" });
  if (su.status !== 201) throw new Error(`sign-up of Carol → ${su.status}`);
  let left = -1;
  for (let i = 0; i < 100 && left !== 1; i++) {
    const r = await fetch(LIMITED + "/api/config");
    await r.arrayBuffer();
    left = parseInt(r.headers.get("RateLimit-Remaining") ?? "-1", 10);
    if (r.status === 429 || left < 1) throw new Error(`could not leave exactly one request: ${r.status}, ${left} left`);
  }
  await c.fill("#email", carol);
  await c.fill("#password", "carol-password-1");
  await c.click("#login button[type=submit]");
  await until(c, () => document.getElementById("chat-st").textContent.startsWith("rate limited"));
  out.steps.chatRateLimited = { status: await text(c, "#chat-st"), name: await text(c, "#me-name") };
  // A page opened now: its event stream is refused with 429, and says so; so is a sign-in.
  const d = await c.context().newPage();
  await d.goto(LIMITED + "/", { timeout: STEP_MS });
  await until(d, () => document.getElementById("feed-st").textContent !== "connecting");
  out.steps.feedRateLimited = await text(d, "#feed-st");
  await d.fill("#email", carol);
  await d.fill("#password", "carol-password-1");
  await d.click("#login button[type=submit]");
  await until(d, () => document.getElementById("err-text").textContent.startsWith("Too many requests"));
  out.steps.rateLimitedBanner = await errorBox(d);
  // Control: the CSP listener does see a violation when there is one.
  await c.evaluate(() => {
    const img = document.createElement("img");
    img.src = "https://example.invalid/x.png";
    document.body.append(img);
  });
  for (let i = 0; i < 100 && out.limited.csp.length === 0; i++) await new Promise(r => setTimeout(r, 20));
  out.steps.cspControl = out.limited.csp.length;
  closing = true;
} catch (e) {
  out.error = String(e && e.stack || e);
  say("failed:", out.error);
}
closing = true;
await browser.close().catch(() => {});
finish(out.error ? 1 : 0);

// The error box as the user sees it: its text, and whether it is shown in red.
async function errorBox(page) {
  const box = page.locator("#err");
  const bb = await box.boundingBox();
  const bg = await box.evaluate(e => getComputedStyle(e).backgroundColor);
  return { text: await text(page, "#err-text"), visible: await box.isVisible(), height: bb ? Math.round(bb.height) : 0, background: bg };
}
