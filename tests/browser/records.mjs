// Drives headless Chromium through the front page's records view, as an admin would: sign
// in, pick a declared resource, create a record from the form the page builds out of the
// API's schema, edit it (PATCH with If-Match), and page back to the table.
//
// Run by tests/it/browser.rs, which starts forkd (with declared resources) and Chromium
// and passes:
//   --cdp=ws://127.0.0.1:PORT/devtools/browser/ID   the running Chromium (DevTools protocol)
//   --url=http://127.0.0.1:PORT                     the server
//   --email=… --password=…                          an admin's credentials
// It prints one JSON object on stdout: what each step saw and every console error, page
// error, CSP violation and failed request. The Rust test asserts on it; this script only
// fails (exit 1, `error` set) when a step cannot complete in time. Progress goes to stderr.
import { chromium } from "playwright-core";

const arg = name => {
  const hit = process.argv.find(a => a.startsWith(`--${name}=`));
  return hit ? hit.slice(name.length + 3) : "";
};
const CDP = arg("cdp"), URL = arg("url"), EMAIL = arg("email"), PASSWORD = arg("password");
const STEP_MS = 15_000;
const out = { steps: {}, main: { console: [], pageErrors: [], csp: [], failed: [] }, error: null };
const say = (...a) => console.error(`[records.mjs ${new Date().toISOString()}]`, ...a);
let done = false;

function finish(code) {
  if (done) return;
  done = true;
  process.stdout.write(JSON.stringify(out) + "\n", () => process.exit(code));
}

setTimeout(() => {
  out.error = out.error || "timed out after 55 s";
  finish(1);
}, 55_000).unref();

const until = (page, fn, arg) => page.waitForFunction(fn, arg, { timeout: STEP_MS, polling: 50 });

const browser = await chromium.connectOverCDP(CDP, { timeout: STEP_MS });
try {
  const s = out.main;
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  await ctx.exposeBinding("__forkdCsp", (_, v) => s.csp.push(v));
  await ctx.addInitScript(() => {
    document.addEventListener("securitypolicyviolation", e => {
      window.__forkdCsp(`${e.violatedDirective} blocked ${e.blockedURI} (${e.sourceFile}:${e.lineNumber})`);
    }, true);
  });
  const page = await ctx.newPage();
  page.on("console", m => { if (m.type() === "error") s.console.push(m.text()); });
  page.on("pageerror", e => s.pageErrors.push(e.message));
  // The page ends its own event stream to open it again as the user who signed in or out.
  const ownAbort = r => r.url().endsWith("/api/events") && r.failure()?.errorText === "net::ERR_ABORTED";
  page.on("requestfailed", r => { if (!ownAbort(r)) s.failed.push(`${r.method()} ${r.url()} ${r.failure()?.errorText}`); });
  page.on("response", r => { if (r.status() >= 400) s.failed.push(`${r.request().method()} ${r.url()} → ${r.status()}`); });

  // 1. Signed out, the records view is hidden.
  await page.goto(URL + "/", { timeout: STEP_MS });
  out.steps.hiddenSignedOut = await page.locator("#records").isHidden();

  // 2. An admin signs in: the view shows the declared resources.
  await page.fill("#email", EMAIL);
  await page.fill("#password", PASSWORD);
  await page.click("#login button[type=submit]");
  await until(page, () => !document.getElementById("records").hidden);
  await until(page, () => document.querySelectorAll("#rec-res option").length > 0);
  out.steps.resources = await page.$$eval("#rec-res option", os => os.map(o => o.value));
  say("records view open", JSON.stringify(out.steps.resources));

  // 3. Pick articles: an empty table with its columns.
  await page.selectOption("#rec-res", "articles");
  await until(page, () => document.getElementById("rec-head").textContent.includes("title"));
  out.steps.columns = await page.$$eval("#rec-head th", ths => ths.map(t => t.textContent).filter(Boolean));

  // 4. Create one from the form built out of the schema.
  await page.click("#rec-new");
  await until(page, () => !document.getElementById("rec-form").hidden);
  out.steps.createForm = await page.$$eval("#rec-fields [data-key]", is => is.map(i => ({
    key: i.dataset.key, tag: i.tagName.toLowerCase(), type: i.type, required: i.required,
    maxLength: i.maxLength, options: i.tagName === "SELECT" ? [...i.options].map(o => o.value) : null,
  })));
  await page.fill("#rec-f-title", "Written in the browser");
  await page.fill("#rec-f-slug", "written-in-the-browser");
  await page.fill("#rec-f-rating", "4");
  await page.click("#rec-save");
  await until(page, () => document.getElementById("rec-st").textContent.startsWith("created #"));
  await until(page, () => document.getElementById("rec-body").textContent.includes("Written in the browser"));
  out.steps.created = await page.textContent("#rec-st");
  out.steps.pageLine = await page.textContent("#rec-page");
  say("created", out.steps.created);

  // 5. Edit it: the form holds its values; change the title and the state.
  await page.click("#rec-body button[data-id]");
  await until(page, () => document.getElementById("rec-f-title")?.value === "Written in the browser");
  out.steps.editTitle = await page.textContent("#rec-form-title");
  out.steps.editStates = await page.$$eval("#rec-f-status option", os => os.map(o => o.value));
  await page.fill("#rec-f-title", "Edited in the browser");
  await page.selectOption("#rec-f-status", "published");
  await page.click("#rec-save");
  await until(page, () => document.getElementById("rec-st").textContent.startsWith("saved #"));
  await until(page, () => document.getElementById("rec-body").textContent.includes("Edited in the browser"));
  out.steps.saved = await page.textContent("#rec-st");
  out.steps.row = await page.$$eval("#rec-body tr", trs => trs.map(tr => [...tr.cells].map(c => c.textContent)));
  out.steps.errorBoxHidden = await page.locator("#err").isHidden();

  // 6. Signing out hides the view again.
  await page.click("#logout");
  await until(page, () => document.getElementById("records").hidden);
  out.steps.hiddenAfterSignOut = true;
  finish(0);
} catch (e) {
  out.error = String(e && e.stack || e);
  finish(1);
}
