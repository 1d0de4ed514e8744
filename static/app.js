"use strict";
(() => {
const $ = id => document.getElementById(id);
const parse = s => { try { return JSON.parse(s); } catch { return null; } };
const time = v => { const d = new Date(v); return isNaN(d) ? "" : d.toLocaleTimeString(); };
const status = (id, text, kind) => { const e = $(id); e.textContent = text; e.className = "st " + (kind || ""); };
const el = (tag, text) => { const e = document.createElement(tag); e.textContent = text; return e; };
const push = (list, li, newestFirst) => {
  const ul = $(list);
  if (newestFirst) { ul.prepend(li); while (ul.children.length > 50) ul.lastChild.remove(); }
  else { ul.append(li); while (ul.children.length > 100) ul.firstChild.remove(); ul.scrollTop = ul.scrollHeight; }
};

// Errors: one visible box; a 429 says how long to wait.
const fail = msg => { $("err-text").textContent = msg; $("err").hidden = false; };
const clearErr = () => { $("err").hidden = true; };
$("err-x").addEventListener("click", clearErr);
const wait = r => {
  for (const h of ["Retry-After", "RateLimit-Reset"]) { const n = parseInt(r.headers.get(h) || "", 10); if (n >= 0) return n; }
  return 1;
};
const limited = n => "Too many requests — try again in " + n + " s";
async function api(path, body) {
  try {
    const r = await fetch(path, { method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    return { status: r.status, wait: r.status === 429 ? wait(r) : 0, json: r.status === 204 ? null : parse(await r.text()) };
  } catch { return { status: 0, wait: 0, json: null }; }
}
function why(what, r) {
  if (r.status === 0) return what + " failed: the server cannot be reached (offline?).";
  if (r.status === 429) return limited(r.wait);
  const j = r.json || {};
  let m = j.message || "HTTP " + r.status;
  if (Array.isArray(j.errors) && j.errors.length) m += " (" + j.errors.map(e => e.field + " " + e.message).join("; ") + ")";
  return what + " failed: " + m;
}

// Notifications: /api/events read with fetch, so a 429 is told from offline;
// "Last-Event-ID: 0" on the first connect replays the latest ones.
let lastId = 0, feedTry = 0, feedRetry = 3000;
const feedLater = (text, ms) => { status("feed-st", text, "warn"); setTimeout(feed, ms); };
const backoff = () => Math.min(60000, feedRetry * 2 ** feedTry++);
async function feed() {
  status("feed-st", "connecting");
  let r;
  // Signed in: the stream is the user's (changes of records only they may read reach it).
  const sent = token, auth = sent && Date.now() < expAt ? { Authorization: "Bearer " + sent } : {};
  try { r = await fetch("/api/events", { headers: { Accept: "text/event-stream", "Last-Event-ID": String(lastId), ...auth }, cache: "no-store" }); }
  catch { return feedLater("offline, retrying", backoff()); }
  if (r.status === 429) { const n = wait(r); return feedLater("rate limited, retry in " + n + " s", n * 1000 + 250); }
  if (r.status !== 200 || !r.body) return feedLater((r.status >= 500 ? "unavailable" : "offline") + ", retrying", backoff());
  feedTry = 0; status("feed-st", "live", "on");
  let buf = "";
  try {
    const rd = r.body.pipeThrough(new TextDecoderStream()).getReader();
    for (;;) {
      const { value, done } = await rd.read();
      if (done) break;
      if (token !== sent) { rd.cancel(); return feed(); } // signed in or out: reopen as the new caller
      buf += value.replace(/\r\n?/g, "\n");
      for (let i; (i = buf.indexOf("\n\n")) >= 0; buf = buf.slice(i + 2)) event(buf.slice(0, i));
    }
  } catch {}
  feedLater("offline, retrying", backoff());
}
function event(block) {
  let type = "message", id = "";
  const data = [];
  for (const line of block.split("\n")) {
    const c = line.indexOf(":");
    if (c === 0) continue;
    const k = c < 0 ? line : line.slice(0, c), v = c < 0 ? "" : line.slice(c + 1).replace(/^ /, "");
    if (k === "event") type = v; else if (k === "data") data.push(v); else if (k === "id") id = v;
    else if (k === "retry" && /^\d+$/.test(v)) feedRetry = Math.max(1000, +v);
  }
  if (type !== "notification" || !/^\d+$/.test(id) || +id <= lastId) return;
  lastId = +id;
  const n = parse(data.join("\n"));
  if (!n || typeof n !== "object") return;
  const li = el("li", "");
  li.append(el("b", String(n.title ?? "")), el("small", time(n.createdAt)));
  if (n.body) li.append(el("p", String(n.body)));
  $("feed-empty").hidden = true;
  push("feed", li, true);
}

// Account: sign in, sign up (then signed in at once), sign out.
let token = null, refresh = null, expAt = 0, me = null;
const claims = t => {
  try { return parse(new TextDecoder().decode(Uint8Array.from(atob(t.split(".")[1].replace(/-/g, "+").replace(/_/g, "/")), c => c.charCodeAt(0)))); }
  catch { return null; }
};
// The session for the page's other scripts (records.js): the token and role, or null.
const session = detail => document.dispatchEvent(new CustomEvent("forkd:session", { detail }));
const keep = d => {
  token = d.accessToken; refresh = d.refreshToken || null; expAt = Date.now() + d.expiresIn * 1e3;
  const c = claims(token) || {};
  me = { id: c.userId, name: c.name };
  session({ token, role: c.role, userId: c.userId });
};
const busy = (form, on) => { for (const b of $(form).querySelectorAll("button")) b.disabled = on; };
function show(form) {
  $("login").hidden = form !== "login"; $("signup").hidden = form !== "signup"; $("me").hidden = form !== "me";
  $("auth-title").textContent = form === "signup" ? "Create an account" : form === "me" ? "Account" : "Sign in";
}
async function login(email, password) {
  const r = await api("/api/v1/auth/login", { email, password });
  const d = r.json && r.json.data;
  if (r.status === 200 && d && d.accessToken) {
    keep(d); clearErr();
    $("password").value = ""; $("su-password").value = "";
    $("me-name").textContent = me.name || email; $("who").textContent = me.name || email;
    show("me"); status("auth-st", "signed in", "on"); chat();
    return true;
  }
  fail(r.status === 401 ? "Sign-in failed: wrong e-mail or password." : why("Sign-in", r));
  status("auth-st", r.status === 429 ? "rate limited" : "signed out", r.status === 429 ? "warn" : "");
  return false;
}
$("to-signup").addEventListener("click", () => { show("signup"); $("su-name").focus(); });
$("to-login").addEventListener("click", () => { show("login"); $("email").focus(); });
$("login").addEventListener("submit", async e => {
  e.preventDefault(); busy("login", true); status("auth-st", "signing in…");
  await login($("email").value.trim(), $("password").value);
  busy("login", false);
});
$("signup").addEventListener("submit", async e => {
  e.preventDefault(); busy("signup", true); status("auth-st", "creating account…");
  const body = { name: $("su-name").value.trim(), email: $("su-email").value.trim(), password: $("su-password").value };
  const r = await api("/api/v1/users", body);
  if (r.status === 201) {
    status("auth-st", "signing in…");
    if (!await login(body.email, body.password)) { $("email").value = body.email; show("login"); fail("Account created: sign in."); }
  } else {
    fail(r.status === 409 ? "Sign-up failed: that e-mail already has an account; sign in instead." : why("Sign-up", r));
    status("auth-st", "signed out");
  }
  busy("signup", false);
});
function out(msg) {
  token = refresh = me = null; clearTimeout(wsTimer); session(null);
  const w = ws;
  if (w) { if (w.readyState === WebSocket.OPEN) w.close(1000); else w.onopen = () => w.close(1000); }
  show("login"); $("who").textContent = ""; status("auth-st", "signed out"); status("chat-st", "sign in to chat");
  if (msg) fail(msg);
}
$("logout").addEventListener("click", async () => {
  const r = refresh ? await api("/api/v1/auth/logout", { refreshToken: refresh }) : { status: 204 };
  out(r.status === 204 ? null : why("Sign-out", r));
});

// Chat: /ws?token=… (WebSocket), room "lobby"; renews a stale token first.
let ws = null, wsTry = 0, wsTimer = 0, lastTyping = 0, typingTimer = 0;
const chatLater = (text, ms) => { status("chat-st", text, "warn"); wsTimer = setTimeout(chat, ms); };
const retry = () => chatLater("offline, retrying", Math.min(30000, 1000 * 2 ** wsTry++));
const who = m => typeof m.name === "string" && m.name ? m.name : "user " + m.from;
async function chat() {
  clearTimeout(wsTimer);
  if (!token || ws) return;
  if (Date.now() > expAt - 30000) {
    const rt = refresh, r = await api("/api/v1/auth/refresh", { refreshToken: rt });
    if (rt !== refresh || ws) return;
    const d = r.json && r.json.data;
    if (r.status === 200 && d && d.accessToken) keep(d);
    else if (r.status === 429) return chatLater("rate limited, retry in " + r.wait + " s", r.wait * 1000 + 250);
    else return r.status === 401 ? out("Your session has expired: sign in again.") : retry();
  }
  let up = false;
  const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws?token=" + encodeURIComponent(token);
  try { ws = new WebSocket(url); } catch { return retry(); }
  status("chat-st", "connecting");
  ws.onopen = () => { up = true; wsTry = 0; status("chat-st", "online", "on"); $("send").disabled = false; ws.send(JSON.stringify({ type: "join", roomId: "lobby" })); };
  ws.onmessage = e => {
    const m = parse(e.data);
    if (!m || m.roomId !== undefined && m.roomId !== "lobby") return;
    if (m.type === "chat") {
      const li = el("li", "");
      li.append(el("b", who(m)), String(m.content ?? ""), " ", el("small", time(m.timestamp)));
      push("msgs", li); $("typing").textContent = "";
    } else if (m.type === "typing") {
      $("typing").textContent = who(m) + " is typing…";
      clearTimeout(typingTimer); typingTimer = setTimeout(() => { $("typing").textContent = ""; }, 3000);
    } else if (m.type === "error") fail("Chat: " + String(m.message ?? "error"));
  };
  ws.onerror = () => {};
  ws.onclose = () => {
    ws = null; $("send").disabled = true;
    if (!up) expAt = 0;
    if (token) retry(); else status("chat-st", "sign in to chat");
  };
}
const send = o => { if (ws && ws.readyState === WebSocket.OPEN) { ws.send(JSON.stringify(o)); return true; } return false; };
$("say").addEventListener("submit", e => {
  e.preventDefault();
  const t = $("text"), content = t.value.trim();
  if (content && send({ type: "chat", roomId: "lobby", content })) t.value = "";
});
$("text").addEventListener("input", () => {
  const now = Date.now();
  if (now - lastTyping > 2000 && send({ type: "typing", roomId: "lobby" })) lastTyping = now;
});
feed();
})();
