"use strict";
// The records view: an admin browses, creates, edits and deletes the records of every
// declared resource. The resources, their paths and their fields come from the API's own
// description (/api/openapi.json); the session (token, role) from app.js's "forkd:session".
(() => {
const $ = id => document.getElementById(id);
const el = (tag, text) => { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; return e; };
const fail = msg => { $("err-text").textContent = msg; $("err").hidden = false; };
const note = text => { $("rec-st").textContent = text; };
const LIMIT = 20;
let token = null, resources = null, cur = null, page = 1, editing = null, etag = null;

async function call(method, path, body, extra) {
  const headers = Object.assign({ Accept: "application/json", Authorization: "Bearer " + token }, extra || {});
  if (body !== undefined) headers["Content-Type"] = "application/json";
  try {
    const r = await fetch(path, { method, headers, cache: "no-store", body: body === undefined ? undefined : JSON.stringify(body) });
    let json = null;
    if (r.status !== 204) { try { json = JSON.parse(await r.text()); } catch {} }
    return { status: r.status, json, etag: r.headers.get("ETag") };
  } catch { return { status: 0, json: null, etag: null }; }
}
function why(what, r) {
  if (r.status === 0) return what + " failed: the server cannot be reached (offline?).";
  if (r.status === 401) return what + " failed: your session has expired; sign in again.";
  const j = r.json || {};
  let m = j.message || "HTTP " + r.status;
  if (Array.isArray(j.errors) && j.errors.length) m += " (" + j.errors.map(e => e.field + " " + e.message).join("; ") + ")";
  return what + " failed: " + m;
}

// Each declared resource: its list, create and record paths under /api/v1 and its schemas.
async function load() {
  if (resources) return true;
  let doc;
  try { doc = await (await fetch("/api/openapi.json")).json(); } catch { return false; }
  const schemas = doc.components.schemas, ops = {};
  for (const [path, item] of Object.entries(doc.paths)) {
    if (path.startsWith("/api/v1/")) for (const op of Object.values(item)) if (op.operationId) ops[op.operationId] = path;
  }
  resources = Object.keys(ops).filter(id => id.endsWith(".list")).map(id => {
    const name = id.slice(0, -".list".length);
    return { name, list: ops[id], create: ops[name + ".create"], item: ops[name + ".get"],
      input: schemas[name + "Input"], patch: schemas[name + "Patch"] };
  }).filter(r => r.create && r.item && r.input && r.patch);
  return true;
}
const itemPath = id => cur.item.replace("{id}", encodeURIComponent(id));

async function open() {
  if (!await load()) return fail("Records: the API description cannot be read.");
  $("rec-res").replaceChildren(...resources.map(r => { const o = el("option", r.name); o.value = r.name; return o; }));
  $("records").hidden = false;
  if (resources.length) choose(resources[0].name); else note("no resources declared");
}
function choose(name) {
  cur = resources.find(r => r.name === name); page = 1; closeForm(); list();
}

const show = v => v === null || v === undefined ? "" : typeof v === "object" ? JSON.stringify(v) : String(v);
async function list() {
  const r = await call("GET", cur.list + "?page=" + page + "&limit=" + LIMIT);
  if (r.status !== 200 || !r.json) return fail(why("Loading " + cur.name, r));
  const d = r.json.data, cols = ["id", ...Object.keys(cur.patch.properties), "updatedAt"];
  const head = el("tr");
  for (const c of cols) head.append(el("th", c));
  head.append(el("th"));
  $("rec-head").replaceChildren(head);
  $("rec-body").replaceChildren(...d.items.map(rec => {
    const tr = el("tr");
    for (const c of cols) { const td = el("td", show(rec[c])); td.title = show(rec[c]); tr.append(td); }
    const b = el("button", "Edit"); b.type = "button"; b.className = "link"; b.dataset.id = rec.id;
    const td = el("td"); td.append(b); tr.append(td);
    return tr;
  }));
  const pages = Math.max(1, d.totalPages);
  $("rec-page").textContent = "page " + d.page + " of " + pages + " · " + d.total + " record" + (d.total === 1 ? "" : "s");
  $("rec-prev").disabled = d.page <= 1; $("rec-next").disabled = d.page >= pages;
}

// A form from the schema: a select for enums and booleans, numbers, e-mail, URL, a text
// area for text fields, a line for the rest; limits as attributes.
function build(schema, rec) {
  const box = $("rec-fields"), need = cur.input.required || [];
  box.replaceChildren();
  if (!rec && cur.create.includes("{id}")) {
    const parent = cur.create.split("/").slice(-3, -2)[0];
    const i = el("input"); i.id = "rec-parent"; i.type = "number"; i.min = "1"; i.required = true;
    const l = el("label", parent + " id *"); l.htmlFor = i.id;
    box.append(el("div")); box.lastChild.append(l, i);
  }
  for (const [k, s] of Object.entries(schema.properties)) {
    const types = [].concat(s.type), t = types.find(x => x !== "null"), nullable = types.includes("null");
    let i;
    if (s.enum || t === "boolean") {
      i = el("select");
      if (nullable || !rec) { const o = el("option", rec ? "(none)" : "(default)"); o.value = ""; i.append(o); }
      for (const v of s.enum || [true, false]) if (v !== null) { const o = el("option", String(v)); o.value = String(v); i.append(o); }
    } else if (/^Text/.test(s.description || "")) {
      i = el("textarea");
    } else {
      i = el("input");
      i.type = t === "integer" || t === "number" ? "number" : s.format === "email" ? "email" : s.format === "uri" ? "url" : "text";
      if (t === "number") i.step = "any";
      if (s.format === "date-time") i.placeholder = "2026-01-31T12:00:00Z";
    }
    if (s.minimum !== undefined) i.min = String(s.minimum);
    if (s.maximum !== undefined) i.max = String(s.maximum);
    if (s.minLength !== undefined) i.minLength = s.minLength;
    if (s.maxLength !== undefined) i.maxLength = s.maxLength;
    i.id = "rec-f-" + k; i.dataset.key = k; i.dataset.type = t;
    i.required = need.includes(k);
    i.value = rec ? show(rec[k]) : "";
    const l = el("label", k + (i.required ? " *" : "")); l.htmlFor = i.id;
    const cell = el("div"); cell.append(l, i); box.append(cell);
  }
}
// The form's values: on create the fields filled in (the rest take their defaults), on
// edit the fields that changed (an emptied one becomes null).
function values(rec) {
  const out = {};
  for (const i of $("rec-fields").querySelectorAll("[data-key]")) {
    const k = i.dataset.key, t = i.dataset.type, raw = i.value;
    const v = raw === "" ? null : t === "integer" || t === "number" ? Number(raw) : t === "boolean" ? raw === "true" : raw;
    if (rec ? v !== rec[k] : v !== null) out[k] = v;
  }
  return out;
}

function closeForm() {
  editing = etag = null; $("rec-form").hidden = true;
  const d = $("rec-delete"); d.dataset.armed = ""; d.textContent = "Delete";
}
function newRecord() {
  closeForm(); build(cur.input, null);
  $("rec-form-title").textContent = "New record of " + cur.name; $("rec-delete").hidden = true; $("rec-form").hidden = false;
  const first = $("rec-fields").querySelector("input,select,textarea");
  if (first) first.focus();
}
async function edit(id) {
  const r = await call("GET", itemPath(id));
  if (r.status !== 200 || !r.json) return fail(why("Loading record " + id, r));
  closeForm(); editing = r.json.data; etag = r.etag; build(cur.patch, editing);
  $("rec-form-title").textContent = cur.name + " #" + id; $("rec-delete").hidden = false; $("rec-form").hidden = false;
}

$("rec-res").addEventListener("change", e => choose(e.target.value));
$("rec-prev").addEventListener("click", () => { if (page > 1) { page--; list(); } });
$("rec-next").addEventListener("click", () => { page++; list(); });
$("rec-new").addEventListener("click", () => { if (cur) newRecord(); });
$("rec-cancel").addEventListener("click", closeForm);
$("rec-body").addEventListener("click", e => { const id = e.target.dataset && e.target.dataset.id; if (id) edit(id); });
$("rec-form").addEventListener("submit", async e => {
  e.preventDefault();
  const rec = editing, ifMatch = etag ? { "If-Match": etag } : {};
  let path = cur.create;
  if (!rec && path.includes("{id}")) path = path.replace("{id}", encodeURIComponent($("rec-parent").value));
  const r = rec ? await call("PATCH", itemPath(rec.id), values(rec), ifMatch) : await call("POST", path, values(null));
  if (r.status === 200 || r.status === 201) {
    closeForm(); note((rec ? "saved #" : "created #") + r.json.data.id); list();
  } else if (r.status === 412) {
    fail("The record changed meanwhile: it is shown again as it is now."); edit(rec.id);
  } else fail(why("Saving", r));
});
$("rec-delete").addEventListener("click", async () => {
  const b = $("rec-delete");
  if (b.dataset.armed !== "1") { b.dataset.armed = "1"; b.textContent = "Really delete?"; return; }
  const id = editing.id, r = await call("DELETE", itemPath(id), undefined, etag ? { "If-Match": etag } : {});
  if (r.status === 204) { closeForm(); note("deleted #" + id); list(); } else fail(why("Deleting", r));
});

// Shown to admins only; hidden again on sign-out.
document.addEventListener("forkd:session", e => {
  const s = e.detail;
  token = s ? s.token : null;
  if (s && s.role === "admin") { if ($("records").hidden) open(); }
  else { $("records").hidden = true; closeForm(); }
});
})();
