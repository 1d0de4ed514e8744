//! The front page (`GET /`) in a real browser: headless Chromium driven over the DevTools
//! protocol by `tests/browser/front.mjs` (playwright-core). Sign-up, sign-in, the latest
//! notifications on load and a live one posted by an admin, chat between two pages with the
//! senders' names, the error box (a wrong password, 429 with its wait), a rate-limited event
//! stream told from an offline one, the layout at 1280 and 375 px, and no console error, no
//! CSP violation and no failing request of the page's own. Three times: over HTTP/1.1 in
//! clear text, over https on `tls.listen`, where the document, the API calls and the event
//! stream must go over HTTP/2 (the page's `nextHopProtocol`, the DevTools network events),
//! and over HTTP/3 (QUIC forced for the origin), where they must say `h3`; Chromium trusts the test certificate by its key (`--ignore-certificate-errors-spki-list`),
//! Node's own requests by the test CA (`NODE_EXTRA_CA_CERTS`).
//!
//! Needs `/usr/bin/chromium`, `node` and `tests/browser/node_modules`
//! (`bin/install-test-deps` installs them); without them the test says why and passes,
//! so `cargo test` works on a machine without a browser. This test starts Chromium itself (a
//! fresh profile in a temp dir) and the script, and kills both by PID when done or after 60 s.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use crate::util::*;

const CHROMIUM: &str = "/usr/bin/chromium";
/// The flags every run uses (no network of its own, no first-run UI); the HTTP/1.1 and
/// HTTP/2 runs add `--disable-quic`.
const FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
];
/// The script's whole run.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(60);

/// A process this test started, stopped by its PID when dropped: SIGTERM, then SIGKILL
/// after `grace`.
struct Owned {
    child: Child,
    grace: Duration,
}

impl Owned {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits up to `timeout` for the process to exit by itself.
    fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = kill(Pid::from_raw(self.pid()), Signal::SIGTERM);
        let grace = self.grace;
        if self.wait(grace).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Why the test cannot run here, if it cannot.
fn missing(root: &Path) -> Option<String> {
    if !Path::new(CHROMIUM).exists() {
        return Some(format!("no chromium found at {CHROMIUM} (run bin/install-test-deps)"));
    }
    let node = Command::new("node").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if !node.map(|s| s.success()).unwrap_or(false) {
        return Some("no `node` on PATH (Node.js 20 or later)".into());
    }
    if !root.join("tests/browser/node_modules/playwright-core/package.json").exists() {
        return Some("no node_modules in tests/browser, run bin/install-test-deps".into());
    }
    None
}

/// Starts Chromium with a fresh profile in `profile` and returns it with its DevTools
/// WebSocket URL (read from the `DevToolsActivePort` file it writes once it listens).
fn start_chromium(profile: &Path, log: &Path, extra: &[String]) -> (Owned, String) {
    let stderr = fs::File::create(log).expect("chromium log");
    let child = Command::new(CHROMIUM)
        .args(FLAGS)
        .args(extra)
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--remote-debugging-address=127.0.0.1")
        .arg("--remote-debugging-port=0")
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn chromium");
    let mut chromium = Owned { child, grace: Duration::from_secs(5) };
    let port_file = profile.join("DevToolsActivePort");
    let url = eventually_some(Duration::from_secs(30), || {
        if let Ok(Some(st)) = chromium.child.try_wait() {
            panic!("chromium exited with {st} before listening:\n{}", fs::read_to_string(log).unwrap_or_default());
        }
        let text = fs::read_to_string(&port_file).ok()?;
        let mut lines = text.lines();
        let (port, path) = (lines.next()?.trim().parse::<u16>().ok()?, lines.next()?.trim().to_string());
        path.starts_with("/devtools/browser/").then(|| format!("ws://127.0.0.1:{port}{path}"))
    });
    let url = url.unwrap_or_else(|| {
        let _ = chromium.child.kill();
        panic!(
            "chromium did not write {} within 30 s:\n{}",
            port_file.display(),
            fs::read_to_string(log).unwrap_or_default()
        )
    });
    (chromium, url)
}

/// Runs `tests/browser/<script>` (bounded by [`SCRIPT_TIMEOUT`]); returns its JSON report and
/// its stderr.
fn run_script(root: &Path, dir: &Path, script: &str, args: &[String], env: &[(String, String)]) -> (Value, String) {
    let err_path = dir.join(format!("{script}.stderr"));
    let child = Command::new("node")
        .arg(root.join("tests/browser").join(script))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(root.join("tests/browser"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(fs::File::create(&err_path).expect("script log"))
        .spawn()
        .expect("spawn node");
    let mut script = Owned { child, grace: Duration::from_secs(2) };
    let mut stdout = script.child.stdout.take().expect("piped stdout");
    // Read on a thread, so a large report cannot fill the pipe and stall the script.
    let reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let status = script.wait(SCRIPT_TIMEOUT);
    drop(script); // killed by PID if it is still running
    let text = reader.join().unwrap_or_default();
    let log = fs::read_to_string(&err_path).unwrap_or_default();
    assert!(status.is_some(), "the browser script did not finish within {SCRIPT_TIMEOUT:?}; its log:\n{log}");
    let report: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!("the browser script printed no JSON report ({e}), exit {status:?}:\n{text}\nits log:\n{log}")
    });
    (report, log)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().map(|x| x.as_str().unwrap_or_default().to_string()).collect()).unwrap_or_default()
}

/// What the main server is reached over.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// HTTP/1.1 in clear text.
    H1,
    /// HTTP/2 over TLS (ALPN), QUIC off.
    H2,
    /// HTTP/3: Chromium forced onto QUIC for the main server's origin.
    H3,
}

#[test]
fn front_page_in_a_real_browser() {
    front_page(Mode::H1);
}

/// The same flow over https: the page, its API calls, its event stream and its chat go to
/// `tls.listen`, where Chromium negotiates HTTP/2 by ALPN. The page's
/// `performance.getEntries()` and the DevTools network events must say `h2` for the
/// document, the API calls and the event stream; the WebSocket is whatever Chromium chose
/// (RFC 8441 over the h2 connection, or a separate HTTP/1.1 upgrade), and is reported.
#[test]
fn front_page_in_a_real_browser_over_h2() {
    front_page(Mode::H2);
}

/// The same flow with HTTP/3 on the main server and Chromium told to speak QUIC to its
/// origin from the first request (`--origin-to-force-quic-on`, no Alt-Svc round first):
/// the document, the API calls and the event stream (its live notification) must say `h3`.
/// The WebSocket goes over TCP (Chromium has no WebSocket over HTTP/3) and is reported.
/// The rate-limited server stays on HTTP/2. Chromium's net log is written to the temp dir
/// and its QUIC errors, if any, are shown when the test fails.
#[test]
fn front_page_in_a_real_browser_over_h3() {
    front_page(Mode::H3);
}

/// A server for the browser: the plain one (the origin is `http://{listen}`), or one with a
/// TLS listener on a free port whose `https://127.0.0.1:PORT` is the origin the page uses.
/// Returns the server and the base URL the browser loads.
fn browser_server(b: ServerBuilder, tls: Option<&(PathBuf, PathBuf)>, h3: bool) -> (Server, String) {
    match tls {
        None => {
            let s = b.top("public_origin = \"http://{listen}\"").start();
            let url = format!("http://{}", s.addr());
            (s, url)
        }
        Some((cert, key)) => {
            let port = free_port();
            let b = if h3 { b.set("http3", "enabled = true") } else { b };
            let s = b
                .top(&format!("public_origin = \"https://127.0.0.1:{port}\""))
                .set("tls", &tls_section(port, cert, key))
                .start();
            (s, format!("https://127.0.0.1:{port}"))
        }
    }
}

/// The base64 SHA-256 of the server key's SubjectPublicKeyInfo: what
/// `--ignore-certificate-errors-spki-list` takes, so that Chromium accepts this one test
/// certificate (and no other certificate error).
fn spki_hash(key_pem: &str) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    let key = rcgen::KeyPair::from_pem(key_pem).expect("test key");
    base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(key.public_key_der()))
}

fn front_page(mode: Mode) {
    let tls = mode != Mode::H1;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if let Some(why) = missing(&root) {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = tempfile::Builder::new().prefix("forkd-browser-").tempdir().expect("tempdir");
    // Over TLS: a test CA and a certificate for 127.0.0.1; Node's own requests (the admin's
    // notifications, the rate-limit set-up) trust the CA, Chromium this certificate's key.
    let pki = tls.then(crate::tls::Pki::new);
    let files = pki.as_ref().map(|p| p.write(tmp.path()));
    let ca_path = tmp.path().join("ca.pem");
    let mut extra_flags = Vec::new();
    let mut env = Vec::new();
    if let Some(p) = &pki {
        fs::write(&ca_path, &p.ca_pem).expect("write CA");
        extra_flags.push(format!("--ignore-certificate-errors-spki-list={}", spki_hash(&p.key_pem)));
        env.push(("NODE_EXTRA_CA_CERTS".to_string(), ca_path.display().to_string()));
    }
    // Two workers, so that the chat and the notifications cross the bus. The browser sends
    // the server's own address as `Origin`: that is the public origin.
    let (s, url) = browser_server(Server::api_builder().workers(2), files.as_ref(), mode == Mode::H3);
    let (_limited, limited_url) = browser_server(
        Server::builder()
            .fast_argon2()
            .set("rate_limit", "max = 10\nwindow_secs = 60")
            .set("auth", "access_ttl_secs = 20"),
        files.as_ref(),
        false,
    );
    let (_, admin) = s.admin();
    let net_log = tmp.path().join("netlog.json");
    if mode == Mode::H3 {
        let origin = url.trim_start_matches("https://");
        extra_flags.push(format!("--origin-to-force-quic-on={origin}"));
        extra_flags.push(format!("--log-net-log={}", net_log.display()));
    } else {
        extra_flags.push("--disable-quic".into());
    }

    let profile = tmp.path().join("profile");
    fs::create_dir(&profile).expect("profile dir");
    let (chromium, cdp) = start_chromium(&profile, &tmp.path().join("chromium.log"), &extra_flags);
    let args = [
        format!("--cdp={cdp}"),
        format!("--url={url}"),
        format!("--limited={limited_url}"),
        format!("--admin-token={admin}"),
    ];
    let (r, log) = run_script(&root, tmp.path(), "front.mjs", &args, &env);
    drop(chromium);
    let quic = if mode == Mode::H3 { quic_errors(&net_log) } else { String::new() };
    let show = format!("report: {r:#}\nscript log:\n{log}\nserver log:\n{}{quic}", s.log_tail());
    assert!(r["error"].is_null(), "the browser script failed: {}\n{show}", r["error"]);
    let step = |k: &str| r["steps"][k].clone();

    // The script and the stylesheet come from their hashed /static/ names, each fetched once
    // (the preload from the `Link` fields is the fetch the tag uses), and the style applies.
    let mut fetched: Vec<String> = strings(&step("staticFetches"));
    fetched.sort();
    let hashed = |p: &str, stem: &str, ext: &str| {
        p.strip_prefix(stem)
            .and_then(|h| h.strip_suffix(ext))
            .is_some_and(|h| h.len() == 8 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    let once = |stem: &str, ext: &str| fetched.iter().filter(|p| hashed(p, stem, ext)).count() == 1;
    assert!(
        fetched.len() == 3
            && once("/static/app.", ".css")
            && once("/static/app.", ".js")
            && once("/static/records.", ".js"),
        "/static/app.<hash>.css and .js and records.<hash>.js, each fetched once: {fetched:?}\n{show}"
    );
    assert_eq!(step("bodyBackground"), "rgb(245, 246, 248)", "the stylesheet applies\n{show}");

    // Sign-up (signed in at once), sign-in, sign-out.
    assert_eq!(step("signUpName"), "Alice Browser", "sign-up from the page, then signed in\n{show}");
    assert_eq!(step("signUpChatOnline"), true, "the chat connects after sign-up\n{show}");
    assert_eq!(step("signInName"), "Bob Browser", "sign-in from the page\n{show}");
    assert_eq!(step("signedOut"), "signed out", "sign-out\n{show}");
    // The API reference, reached from the front page's link: styled, no script, whole.
    let docs = step("apiDocs");
    assert!(docs["title"].as_str().is_some_and(|t| t.ends_with("API reference")), "/api/docs title\n{show}");
    assert!(docs["operations"].as_u64() > Some(50), "/api/docs lists the operations\n{show}");
    assert_eq!((docs["scripts"].as_u64(), docs["dangling"].as_u64()), (Some(0), Some(0)), "{docs}\n{show}");
    assert_eq!(docs["maxWidth"], "1152px", "docs.css applies under the CSP\n{show}");
    // Notifications: the latest on load, and one posted by an admin while the page is open.
    assert_eq!(step("replayedOnLoad"), true, "a notification from before the page opened\n{show}");
    assert_eq!(step("emptyNoteHidden"), true, "`No notifications yet` hidden once there is one\n{show}");
    assert!(step("replayedOnLoadB").as_i64() >= Some(2), "both notifications on the second page's load\n{show}");
    assert!(
        step("liveNotification").as_str().is_some_and(|t| t.contains("Live from the admin")),
        "the admin's notification arrives live, newest first\n{show}"
    );
    // Chat between the two pages, with names.
    assert_eq!(step("chatBSawA"), "Alice Browser", "B sees Alice's message under her name\n{show}");
    assert_eq!(step("chatASawB"), "Bob Browser", "A sees Bob's message under his name\n{show}");
    assert_eq!(step("typingOnA"), "Bob Browser is typing…", "typing, with the name\n{show}");
    assert_eq!(step("errorBoxHiddenOnMain"), true, "no error box in the main flow\n{show}");

    // Errors are shown in a visible box; 429 says how long to wait.
    let wrong = step("wrongPassword");
    assert_eq!(wrong["text"], "Sign-in failed: wrong e-mail or password.", "{show}");
    assert_eq!(wrong["visible"], true, "{show}");
    assert!(wrong["height"].as_i64() >= Some(20), "the error box has a size\n{show}");
    assert_eq!(wrong["background"], "rgb(253, 236, 236)", "the error box is red\n{show}");
    let limited_text = step("rateLimitedBanner")["text"].as_str().unwrap_or_default().to_string();
    let wait = limited_text.strip_prefix("Too many requests — try again in ").and_then(|t| t.strip_suffix(" s"));
    assert!(
        wait.and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| (1..=60).contains(&n)),
        "429: `Too many requests — try again in N s` with N from Retry-After: {limited_text:?}\n{show}"
    );
    let chat = step("chatRateLimited");
    assert_eq!(chat["name"], "Carol", "signed in with the window's last request\n{show}");
    let n = chat["status"].as_str().and_then(|t| t.strip_prefix("rate limited, retry in ")?.strip_suffix(" s"));
    assert!(
        n.and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n <= 60),
        "a chat whose token renewal gets 429 says `rate limited` (not `offline`): {chat}\n{show}"
    );
    let feed = step("feedRateLimited").as_str().unwrap_or_default().to_string();
    let n = feed.strip_prefix("rate limited, retry in ").and_then(|t| t.strip_suffix(" s"));
    assert!(
        n.and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n <= 60),
        "a rate-limited event stream says so (not `offline`): {feed:?}\n{show}"
    );

    // Layout: at 1280 px the three cards share one row and fill it; at 375 px they stack.
    let wide = &r["layout"]["wide"];
    assert_eq!(
        (wide["columns"].as_i64(), wide["rows"].as_i64()),
        (Some(3), Some(1)),
        "1280 px: 3 columns, 1 row\n{show}"
    );
    let right = wide["cards"].as_array().and_then(|c| c.iter().filter_map(|c| c["right"].as_i64()).max());
    assert_eq!(right, wide["mainRight"].as_i64(), "1280 px: no empty column at the right\n{show}");
    assert!(wide["mainWidth"].as_i64() >= Some(1200), "1280 px: the page uses the width\n{show}");
    let narrow = &r["layout"]["narrow"];
    assert_eq!((narrow["columns"].as_i64(), narrow["rows"].as_i64()), (Some(1), Some(3)), "375 px: stacked\n{show}");
    assert!(narrow["scrollWidth"].as_i64() <= Some(375), "375 px: no horizontal scrolling\n{show}");
    for c in narrow["cards"].as_array().into_iter().flatten() {
        assert_eq!(c["width"], narrow["mainWidth"], "375 px: each card as wide as the page\n{show}");
    }

    // Nothing went wrong in the browser on the main server.
    for k in ["console", "pageErrors", "csp", "failed"] {
        assert!(strings(&r["main"][k]).is_empty(), "main flow: {k} must be empty\n{show}");
    }
    assert!(!s.logs().contains("/csp-report"), "no CSP report reached the server\n{show}");

    // What the main flow's requests went over: HTTP/2 over TLS, HTTP/1.1 in clear text. The
    // page's own resource timing for the document and every finished request (static files,
    // API calls), and the DevTools network events for the event stream (still open, so not
    // in resource timing) and every other response of the page's origin.
    let want = match mode {
        Mode::H1 => "http/1.1",
        Mode::H2 => "h2",
        Mode::H3 => "h3",
    };
    for page in ["A", "B"] {
        let p = &r["protocols"][page];
        assert_eq!(p["navigation"], want, "page {page}: the document's nextHopProtocol\n{show}");
        let own = |k: &str| -> Vec<Value> {
            p[k].as_array().into_iter().flatten().filter(|e| e["origin"] == url.as_str()).cloned().collect()
        };
        let path_is = |e: &Value, f: &dyn Fn(&str) -> bool| e["path"].as_str().is_some_and(f);
        let timed = own("resources");
        assert!(
            timed.iter().any(|e| path_is(e, &|x| x.starts_with("/api/v1/"))),
            "page {page}: an API call among the resource timing entries\n{show}"
        );
        for e in &timed {
            assert_eq!(e["protocol"], want, "page {page}: nextHopProtocol of {e}\n{show}");
        }
        let seen = own("responses");
        assert!(seen.iter().any(|e| path_is(e, &|x| x == "/")), "page {page}: the document's response\n{show}");
        assert!(
            seen.iter().any(|e| path_is(e, &|x| x == "/api/events") && e["status"] == 200),
            "page {page}: the event stream's response\n{show}"
        );
        for e in &seen {
            assert_eq!(e["protocol"], want, "page {page}: the protocol of the response {e}\n{show}");
        }
        // The chat's WebSocket: over HTTP/1.1 an upgrade (101); over h2 Chromium may open it
        // on the HTTP/2 connection (RFC 8441 extended CONNECT, answered 200) or on a
        // connection of its own (101). Either way it connected (the chat steps above).
        let ws: Vec<&Value> = p["websockets"].as_array().into_iter().flatten().collect();
        assert!(!ws.is_empty(), "page {page}: the chat's WebSocket handshake\n{show}");
        for w in &ws {
            let how = match w["status"].as_i64() {
                Some(101) => "HTTP/1.1 Upgrade (101)",
                Some(200) => "HTTP/2 extended CONNECT (200)",
                _ => panic!("page {page}: an unexpected WebSocket handshake {w}\n{show}"),
            };
            eprintln!("page {page} ({want}): WebSocket {} by {how}", w["path"]);
            if !tls {
                assert_eq!(w["status"], 101, "page {page}: over HTTP/1.1 the WebSocket is an upgrade\n{show}");
            }
        }
    }
    // The failures of the error steps are the intended ones, and the CSP listener works: the
    // control (an image from another origin, added on purpose) is the only violation.
    assert!(strings(&r["limited"]["pageErrors"]).is_empty(), "error steps: no uncaught exception\n{show}");
    let csp = strings(&r["limited"]["csp"]);
    assert!(csp.len() == 1 && csp[0].contains("img-src"), "error steps: only the control's violation: {csp:?}\n{show}");
    for f in strings(&r["limited"]["failed"]) {
        let control = f.contains("https://example.invalid/x.png");
        assert!(
            f.ends_with("→ 401") || f.ends_with("→ 429") || control,
            "error steps: an unexpected failed request {f:?}\n{show}"
        );
    }
}

/// Declared resources for the records view: a top-level one with a unique field, an enum with
/// transitions and limits, and one nested under it.
const RECORDS: &str = r#"
[[resources]]
name = "articles"
read = "public"
[resources.fields.title]
type = "string"
required = true
min = 1
max = 120
[resources.fields.slug]
type = "string"
required = true
unique = true
max = 80
[resources.fields.status]
type = "enum"
values = ["draft", "published", "archived"]
default = "draft"
transitions = { draft = ["published"], published = ["archived"] }
[resources.fields.rating]
type = "integer"
min = 0
max = 5
[resources.fields.body]
type = "text"
max = 5000

[[resources]]
name = "comments"
parent = "articles"
[resources.fields.text]
type = "text"
required = true
"#;

/// The records view of the front page (HTTP/1.1): an admin signs in, sees the declared
/// resources, creates a record of `articles` from the form the page builds out of
/// `/api/openapi.json`, edits it, and the API has what the page wrote; signed out, the view
/// is hidden. No console error, no CSP violation, no failed request.
#[test]
fn records_view_in_a_real_browser() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if let Some(why) = missing(&root) {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = tempfile::Builder::new().prefix("forkd-records-").tempdir().expect("tempdir");
    let s = Server::api_builder().top("public_origin = \"http://{listen}\"").top(RECORDS).start();
    let (admin, token) = s.admin();
    let email = admin["email"].as_str().unwrap_or_default().to_string();
    let profile = tmp.path().join("profile");
    fs::create_dir(&profile).expect("profile dir");
    let (chromium, cdp) = start_chromium(&profile, &tmp.path().join("chromium.log"), &["--disable-quic".to_string()]);
    let args = [
        format!("--cdp={cdp}"),
        format!("--url=http://{}", s.addr()),
        format!("--email={email}"),
        "--password=admin-password-1".to_string(),
    ];
    let (r, log) = run_script(&root, tmp.path(), "records.mjs", &args, &[]);
    drop(chromium);
    let show = format!("report: {r:#}\nscript log:\n{log}\nserver log:\n{}", s.log_tail());
    assert!(r["error"].is_null(), "the browser script failed: {}\n{show}", r["error"]);
    let step = |k: &str| r["steps"][k].clone();

    assert_eq!(step("hiddenSignedOut"), true, "no records view before signing in\n{show}");
    let names = strings(&step("resources"));
    for name in ["posts", "articles", "comments"] {
        assert!(names.iter().any(|n| n == name), "{name} among the resources: {names:?}\n{show}");
    }
    // The table: `id`, every field, `updatedAt`.
    let mut columns = strings(&step("columns"));
    assert_eq!(
        (columns.first().map(String::as_str), columns.last().map(String::as_str)),
        (Some("id"), Some("updatedAt")),
        "{show}"
    );
    columns.sort();
    assert_eq!(columns, ["body", "id", "rating", "slug", "status", "title", "updatedAt"], "{show}");
    // The form follows the schema: the required title with its limit, a text area for the
    // text field, the enum as a select offering only the state a record starts in.
    let form = step("createForm");
    let field = |k: &str| form.as_array().into_iter().flatten().find(|f| f["key"] == k).cloned().unwrap_or_default();
    assert_eq!(
        (field("title")["required"].as_bool(), field("title")["maxLength"].as_i64()),
        (Some(true), Some(120)),
        "{show}"
    );
    assert_eq!(field("body")["tag"], "textarea", "{show}");
    assert_eq!(field("rating")["type"], "number", "{show}");
    assert_eq!(strings(&field("status")["options"]), ["", "draft"], "create offers the start state only\n{show}");
    assert!(step("created").as_str().is_some_and(|t| t.starts_with("created #")), "{show}");
    assert_eq!(step("pageLine"), "page 1 of 1 · 1 record", "{show}");
    assert_eq!(strings(&step("editStates")), ["", "draft", "published", "archived"], "{show}");
    assert!(step("saved").as_str().is_some_and(|t| t.starts_with("saved #")), "{show}");
    assert_eq!(step("errorBoxHidden"), true, "{show}");
    assert_eq!(step("hiddenAfterSignOut"), true, "{show}");

    // What the page wrote is what the API holds.
    let list = s.api("GET", "/api/v1/articles", Some(&token), None);
    assert_eq!(list.status, 200, "{list:?}");
    let items = list.json()["data"]["items"].clone();
    assert_eq!(items.as_array().map(Vec::len), Some(1), "{items}");
    let rec = &items[0];
    assert_eq!(
        (&rec["title"], &rec["slug"], &rec["status"], &rec["rating"]),
        (
            &serde_json::json!("Edited in the browser"),
            &serde_json::json!("written-in-the-browser"),
            &serde_json::json!("published"),
            &serde_json::json!(4)
        ),
        "{rec}"
    );
    assert_eq!(rec["ownerId"], admin["id"], "{rec}");

    for k in ["console", "pageErrors", "csp", "failed"] {
        assert!(strings(&r["main"][k]).is_empty(), "records view: {k} must be empty\n{show}");
    }
    assert!(!s.logs().contains("/csp-report"), "no CSP report reached the server\n{show}");
}

/// The QUIC failures in Chromium's net log (`--log-net-log`): the events whose type names
/// QUIC and whose parameters carry an error, as a block for a failure message.
fn quic_errors(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    // Chromium may be killed before it closes the JSON array: cut at the last event.
    let json: Value = serde_json::from_str(&text)
        .or_else(|_| serde_json::from_str(&format!("{}]}}", text.trim_end().trim_end_matches(','))))
        .unwrap_or(Value::Null);
    let names: Vec<(u64, String)> = json["constants"]["logEventTypes"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((v.as_u64()?, k.clone())))
        .collect();
    let name = |t: u64| names.iter().find(|(n, _)| *n == t).map(|(_, k)| k.as_str()).unwrap_or("?");
    let mut out = String::new();
    for e in json["events"].as_array().into_iter().flatten() {
        let ty = name(e["type"].as_u64().unwrap_or(u64::MAX));
        let p = &e["params"];
        let failed = ["net_error", "quic_error", "error", "details"].iter().any(|k| !p[k].is_null());
        if ty.contains("QUIC") && failed {
            out.push_str(&format!("{ty} {p}\n"));
        }
    }
    format!("\nChromium's QUIC errors ({}):\n{out}", path.display())
}
