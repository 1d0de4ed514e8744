//! Response compression (`[compression]`): large bodies sent in zstd, br or gzip to a client
//! that accepts it, with `Vary: Accept-Encoding` whether compressed or not and an `ETag` per
//! coding, the same on every protocol; small bodies, token responses, errors, downloads,
//! event streams and a server with compression off sent as they are.

use std::io::Read;

use serde_json::json;

use crate::util::*;

fn gunzip(s: &Server, body: &[u8], what: &str) -> Vec<u8> {
    decode(s, "gzip", body, what)
}

/// `body` decoded from `coding` (`br`, `zstd` or `gzip`), the test failing when it does not decode.
fn decode(s: &Server, coding: &str, body: &[u8], what: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let ok = match coding {
        "gzip" => flate2::read::GzDecoder::new(body).read_to_end(&mut out).map(drop),
        "br" => brotli::Decompressor::new(body, 4096).read_to_end(&mut out).map(drop),
        "zstd" => zstd::stream::read::Decoder::new(body).and_then(|mut d| d.read_to_end(&mut out)).map(drop),
        other => panic!("no such coding in the test: {other}"),
    };
    ensure!(s, ok.is_ok(), "{what}: the body is not {coding}: {ok:?}");
    out
}

const EVERY: &[(&str, &str)] = &[("Accept-Encoding", "gzip, br, zstd")];
/// What Chrome, Edge and Firefox send.
const BROWSER: &[(&str, &str)] = &[("Accept-Encoding", "gzip, deflate, br, zstd")];

fn varies(r: &Response) -> bool {
    r.header_all("vary").iter().any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("accept-encoding")))
}

const GZIP: &[(&str, &str)] = &[("Accept-Encoding", "gzip, deflate, br;q=0.5")];

protocols!(the_openapi_document_is_gzipped_for_a_client_that_accepts_it);
fn the_openapi_document_is_gzipped_for_a_client_that_accepts_it(p: Proto) {
    let s = Server::start("").on(p);
    let plain = s.get("/api/openapi.json");
    ensure!(s, plain.status == 200, "GET /api/openapi.json: {plain:?}");
    ensure_eq!(s, plain.header("content-encoding"), None, "no Accept-Encoding: identity");
    ensure!(s, varies(&plain), "identity, but the representation varies: Vary in {:?}", plain.headers);

    let gz = s.call("GET", "/api/openapi.json", GZIP, b"");
    ensure!(s, gz.status == 200, "GET with gzip: {gz:?}");
    ensure_eq!(s, gz.header("content-encoding"), Some("gzip"), "Content-Encoding");
    ensure!(s, varies(&gz), "Vary: Accept-Encoding in {:?}", gz.headers);
    ensure!(s, gz.body.len() * 5 < plain.body.len(), "{} compressed vs {} bytes", gz.body.len(), plain.body.len());
    ensure!(s, gunzip(&s, &gz.body, "openapi.json") == plain.body, "gzip decodes to the identity body");
    let length = gz.body.len().to_string();
    if let Some(l) = gz.header("content-length") {
        ensure_eq!(s, l, length.as_str(), "Content-Length is the compressed length");
    }
    ensure!(s, s.call("GET", "/api/openapi.json", GZIP, b"").body == gz.body, "compressed once: the same bytes");

    // HEAD: the head GET would get.
    let h = s.session().request("HEAD", "/api/openapi.json", GZIP, b"");
    ensure!(s, h.status == 200 && h.body.is_empty(), "HEAD: {h:?}");
    ensure_eq!(s, h.header("content-encoding"), Some("gzip"), "HEAD Content-Encoding");
    ensure_eq!(s, h.header("content-length"), Some(length.as_str()), "HEAD Content-Length");

    // Nothing acceptable, identity refused too: identity anyway (as nginx), never a 406.
    let refused = s.call("GET", "/api/openapi.json", &[("Accept-Encoding", "identity;q=0, gzip;q=0")], b"");
    ensure!(s, refused.status == 200, "identity;q=0, gzip;q=0: {refused:?}");
    ensure_eq!(s, refused.header("content-encoding"), None, "identity;q=0, gzip;q=0");
    ensure!(s, refused.body == plain.body, "the identity body");

    // The rendered reference and an embedded stylesheet too (both fixed for the process).
    let docs = s.call("GET", "/api/docs", GZIP, b"");
    ensure_eq!(s, docs.header("content-encoding"), Some("gzip"), "/api/docs");
    let html = String::from_utf8(gunzip(&s, &docs.body, "/api/docs")).unwrap_or_default();
    let css = html.split("<link rel=\"stylesheet\" href=\"").nth(1).and_then(|t| t.split('"').next());
    let css = css.unwrap_or_default().to_owned();
    let c = s.call("GET", &css, GZIP, b"");
    ensure!(s, c.status == 200, "GET {css}: {c:?}");
    ensure_eq!(s, c.header("content-encoding"), Some("gzip"), "{css}");
    ensure!(s, gunzip(&s, &c.body, &css) == s.get(&css).body, "{css} decodes to the file");

    // A small body is never touched: no coding, no Vary.
    let health = s.call("GET", "/health", GZIP, b"");
    ensure!(s, health.status == 200, "/health: {health:?}");
    ensure_eq!(s, health.header("content-encoding"), None, "/health");
    ensure!(s, !varies(&health), "/health never varies: {:?}", health.headers);
}

protocols!(token_responses_are_never_compressed);
fn token_responses_are_never_compressed(p: Proto) {
    // Every body counts as large here: only the BREACH rule keeps login's as it is.
    let s = Server::api_builder().set("compression", "min_bytes = 0").start().on(p);
    let (_, token) = s.admin();
    let email = unique_email("gz");
    s.create_user(&email, "Zed", "user", "user-password-1");

    let body = serde_json::to_vec(&json!({"email": email, "password": "user-password-1"})).unwrap_or_default();
    let login = s.call_t(
        "POST",
        "/api/v1/auth/login",
        &[("Content-Type", "application/json"), EVERY[0]],
        &body,
        SLOW_IO_TIMEOUT,
    );
    let d = s.expect_data(&login, 200, "login with Accept-Encoding: gzip, br, zstd");
    ensure!(s, d["accessToken"].is_string(), "a token in the plain body: {d}");
    ensure_eq!(s, login.header("content-encoding"), None, "login");
    ensure!(s, !varies(&login), "login never varies: {:?}", login.headers);
    let refresh = d["refreshToken"].as_str().unwrap_or_default().to_owned();
    let again = s.api_h("POST", "/api/auth/refresh", None, Some(&json!({"refreshToken": refresh})), EVERY);
    s.expect_data(&again, 200, "refresh");
    ensure_eq!(s, again.header("content-encoding"), None, "refresh");

    // Meanwhile a response made on the pool is compressed in its job ...
    let users = s.api_h("GET", "/api/v1/users", Some(&token), None, GZIP);
    ensure!(s, users.status == 200, "GET /api/v1/users: {users:?}");
    ensure_eq!(s, users.header("content-encoding"), Some("gzip"), "the users page");
    let list: serde_json::Value = serde_json::from_slice(&gunzip(&s, &users.body, "users")).unwrap_or_default();
    ensure!(s, list["data"]["total"].as_i64() >= Some(2), "the page decodes: {list}");

    // ... and a fixed body with an ETag gets the coding's own, which revalidates.
    let config = s.call("GET", "/api/config", GZIP, b"");
    let plain = s.get("/api/config");
    ensure_eq!(s, config.header("content-encoding"), Some("gzip"), "/api/config");
    let (tag, plain_tag) = (config.header("etag").unwrap_or_default(), plain.header("etag").unwrap_or_default());
    ensure!(s, tag.ends_with("-gzip\"") && tag != plain_tag, "ETag per coding: {tag} vs {plain_tag}");
    let fresh = s.call("GET", "/api/config", &[("Accept-Encoding", "gzip"), ("If-None-Match", tag)], b"");
    ensure!(s, fresh.status == 304, "If-None-Match with the gzip ETag: {fresh:?}");
}

#[test]
fn compression_off_sends_every_body_as_it_is() {
    let s = Server::builder().set("compression", "enabled = false").start();
    let r = s.call("GET", "/api/openapi.json", GZIP, b"");
    ensure!(s, r.status == 200, "{r:?}");
    ensure_eq!(s, r.header("content-encoding"), None, "enabled = false");
    ensure!(s, !varies(&r), "nothing varies: {:?}", r.headers);
    ensure!(s, serde_json::from_slice::<serde_json::Value>(&r.body).is_ok(), "plain JSON");
}

protocols!(each_coding_decodes_to_the_identity_body_with_an_etag_of_its_own);
fn each_coding_decodes_to_the_identity_body_with_an_etag_of_its_own(p: Proto) {
    let s = Server::start("").on(p);
    for path in ["/api/openapi.json", "/api/docs"] {
        let plain = s.get(path);
        ensure!(s, plain.status == 200, "GET {path}: {plain:?}");
        let plain_tag = plain.header("etag").unwrap_or_default().to_owned();
        ensure!(s, plain_tag.starts_with('"') && plain_tag.len() > 2, "{path}: a strong ETag, got {plain_tag:?}");
        for coding in ["br", "zstd", "gzip"] {
            let what = format!("GET {path} with Accept-Encoding: {coding}");
            let r = s.call("GET", path, &[("Accept-Encoding", coding)], b"");
            ensure!(s, r.status == 200, "{what}: {r:?}");
            ensure_eq!(s, r.header("content-encoding"), Some(coding), "{what}: Content-Encoding");
            ensure!(s, varies(&r), "{what}: Vary in {:?}", r.headers);
            ensure!(s, r.body.len() * 5 < plain.body.len(), "{what}: {} of {} bytes", r.body.len(), plain.body.len());
            ensure!(s, decode(&s, coding, &r.body, &what) == plain.body, "{what}: decodes to the identity body");
            let tag = r.header("etag").unwrap_or_default();
            let want = format!("{}-{coding}\"", plain_tag.trim_end_matches('"'));
            ensure_eq!(s, tag, want.as_str(), "{what}: the coding's own ETag");
            let fresh = s.call("GET", path, &[("Accept-Encoding", coding), ("If-None-Match", tag)], b"");
            ensure!(s, fresh.status == 304 && fresh.body.is_empty(), "{what}, If-None-Match {tag}: {fresh:?}");
            // The 304 names the representation the 200 would have sent: the coding's.
            ensure_eq!(s, fresh.header("etag"), Some(want.as_str()), "{what}: the 304's ETag");
            ensure!(s, varies(&fresh), "{what}: the 304 varies: {:?}", fresh.headers);
            // The same cache entry revalidated by a client that now takes identity.
            let plain_304 = s.call("GET", path, &[("If-None-Match", tag)], b"");
            ensure!(s, plain_304.status == 304, "{path}: identity request, coded tag: {plain_304:?}");
            ensure_eq!(s, plain_304.header("etag"), Some(plain_tag.as_str()), "{path}: identity 304's ETag");
        }
        let fresh = s.call("GET", path, &[("If-None-Match", &plain_tag)], b"");
        ensure!(s, fresh.status == 304, "{path}, If-None-Match with the identity ETag: {fresh:?}");
        // A browser gets the smallest form of a body compressed once: br.
        let r = s.call("GET", path, BROWSER, b"");
        ensure_eq!(s, r.header("content-encoding"), Some("br"), "{path} for a browser");
    }

    // `identity;q=0` with a coding acceptable: that coding; with none: identity, never a 406.
    let plain = s.get("/api/openapi.json");
    let r = s.call("GET", "/api/openapi.json", &[("Accept-Encoding", "identity;q=0, zstd")], b"");
    ensure_eq!(s, r.header("content-encoding"), Some("zstd"), "identity;q=0, zstd");
    for refused in ["identity;q=0", "identity;q=0, br;q=0, zstd;q=0, gzip;q=0", "*;q=0", "deflate, compress"] {
        let r = s.call("GET", "/api/openapi.json", &[("Accept-Encoding", refused)], b"");
        ensure!(s, r.status == 200 && r.body == plain.body, "{refused}: the identity body, got {r:?}");
        ensure_eq!(s, r.header("content-encoding"), None, "{refused}");
        ensure!(s, varies(&r), "{refused}: still varies");
    }
    // `*` covers what is not listed; a listed q=0 is refused.
    let r = s.call("GET", "/api/openapi.json", &[("Accept-Encoding", "br;q=0, *;q=0.5")], b"");
    ensure_eq!(s, r.header("content-encoding"), Some("zstd"), "br;q=0, *;q=0.5");
}

protocols!(bodies_made_per_request_are_compressed_in_zstd_first_on_the_pool);
fn bodies_made_per_request_are_compressed_in_zstd_first_on_the_pool(p: Proto) {
    let s = Server::api_builder().set("compression", "min_bytes = 0").start().on(p);
    let (admin, token) = s.admin();
    let plain = s.api_h("GET", "/api/v1/users", Some(&token), None, &[]);
    ensure!(s, plain.status == 200, "GET /api/v1/users: {plain:?}");
    for (accept, coding) in [("gzip, deflate, br, zstd", "zstd"), ("gzip, deflate, br", "gzip"), ("br", "br")] {
        let what = format!("the users page with Accept-Encoding: {accept}");
        let r = s.api_h("GET", "/api/v1/users", Some(&token), None, &[("Accept-Encoding", accept)]);
        ensure!(s, r.status == 200, "{what}: {r:?}");
        ensure_eq!(s, r.header("content-encoding"), Some(coding), "{what}");
        ensure!(s, varies(&r), "{what}: Vary");
        let page: serde_json::Value = serde_json::from_slice(&decode(&s, coding, &r.body, &what)).unwrap_or_default();
        ensure!(s, page["data"]["total"].as_i64() >= Some(1), "{what} decodes: {page}");
    }
    // A user answered from the loop's memo (the second GET) is compressed too: on the pool.
    let path = format!("/api/v1/users/{}", admin["id"]);
    let plain = s.api_h("GET", &path, Some(&token), None, &[]);
    ensure!(s, plain.status == 200, "GET {path}: {plain:?}");
    for round in ["first", "second (memo)"] {
        let r = s.api_h("GET", &path, Some(&token), None, &[("Accept-Encoding", "zstd")]);
        ensure!(s, r.status == 200, "{round} GET {path}: {r:?}");
        ensure_eq!(s, r.header("content-encoding"), Some("zstd"), "{round} GET {path}");
        ensure!(s, decode(&s, "zstd", &r.body, &path) == plain.body, "{round} GET {path}: the identity body");
        let tag = r.header("etag").unwrap_or_default();
        ensure!(s, tag.ends_with("-zstd\""), "{round} GET {path}: ETag {tag}");
    }

    // Errors, whatever their size, are sent as they are.
    let missing = s.api_h("GET", "/api/v1/users/987654", Some(&token), None, EVERY);
    ensure!(s, missing.status == 404, "GET a missing user: {missing:?}");
    ensure_eq!(s, missing.header("content-encoding"), None, "a 404");
    ensure!(s, !varies(&missing), "a 404 never varies: {:?}", missing.headers);
    let unauthorized = s.call("GET", "/api/v1/users", EVERY, b"");
    ensure!(s, unauthorized.status == 401, "no token: {unauthorized:?}");
    ensure_eq!(s, unauthorized.header("content-encoding"), None, "a 401");

    // An event stream is never compressed: its events go out as they come.
    let mut events = s.sse_connected(EVERY);
    ensure_eq!(s, events.head.header("content-encoding"), None, "the event stream");
    events.shutdown();
}

protocols!(downloads_with_or_without_range_are_never_compressed);
fn downloads_with_or_without_range_are_never_compressed(p: Proto) {
    let tmp = tempfile::Builder::new().prefix("forkd-brz-").tempdir().expect("tempdir");
    let text = "a line of text that compresses well\n".repeat(2000);
    std::fs::write(tmp.path().join("notes.txt"), &text).expect("write");
    let s = Server::builder()
        .set("download", &format!("dir = \"{}\"", tmp.path().display()))
        .set("compression", "min_bytes = 0")
        .start()
        .on(p);
    let whole = s.call("GET", "/download/notes.txt", EVERY, b"");
    ensure!(s, whole.status == 200 && whole.body == text.as_bytes(), "the whole file as it is: {whole:?}");
    ensure_eq!(s, whole.header("content-encoding"), None, "a download");
    let part = s.call("GET", "/download/notes.txt", &[EVERY[0], ("Range", "bytes=0-99")], b"");
    ensure!(s, part.status == 206 && part.body == text.as_bytes()[..100], "the range as it is: {part:?}");
    ensure_eq!(s, part.header("content-encoding"), None, "a range");
}

/// The nice value in a /proc `stat` line (its 19th field).
fn nice_in(stat: &str) -> Option<i64> {
    let close = stat.rfind(')')?;
    // Fields from the third (state) on: nice is the 17th of those.
    stat[close + 1..].split_whitespace().nth(16)?.parse().ok()
}

/// Per-response compression runs on a lane below the event loop's priority, so a core busy
/// compressing goes back to a waking loop at once; the pool (database work, file reads)
/// stays at the loop's priority.
#[test]
fn compression_runs_below_the_event_loop_and_the_pool_beside_it() {
    let s = Server::builder().workers(1).start();
    let workers = s.workers();
    ensure!(s, workers.len() == 1, "one worker: {workers:?}");
    let stat = |path: &std::path::Path| std::fs::read_to_string(path.join("stat")).unwrap_or_default();
    let task_dir = std::path::PathBuf::from(format!("/proc/{}/task", workers[0]));
    let threads: Vec<String> = std::fs::read_dir(&task_dir)
        .map(|tasks| tasks.flatten().map(|t| stat(&t.path())).collect())
        .unwrap_or_default();
    let nice_of = |prefix: &str| -> Vec<Option<i64>> {
        threads.iter().filter(|st| st.contains(&format!("({prefix}-"))).map(|st| nice_in(st)).collect()
    };
    let (lane, pool) = (nice_of("compress"), nice_of("pool"));
    ensure!(s, !lane.is_empty() && lane.iter().all(|n| *n == Some(10)), "compression lane at nice 10: {lane:?}");
    ensure!(s, !pool.is_empty() && pool.iter().all(|n| *n == Some(0)), "pool at nice 0: {pool:?}");
    let main = nice_in(&stat(&task_dir.join(workers[0].to_string())));
    ensure!(s, main == Some(0), "the event loop at nice 0: {main:?}");
}
