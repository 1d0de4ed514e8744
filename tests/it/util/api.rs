//! The REST API seen by a client: builder options for API tests, requests with a token,
//! users, logins and notifications, the public user shape, JWT forging (HMAC over sha2)
//! and `Set-Cookie` parsing. Requests go over the server's `Proto`. The helpers assert only
//! what the API promises (status, envelope, fields), never a protocol's framing.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use base64::Engine as _;
use serde_json::{json, Value};

use super::http3::h3_exchange;
use super::*;

/// 48 known characters: configured as `[auth] jwt_secret` where a test forges tokens.
pub const TEST_JWT_SECRET: &str = "forkd-it-secret-0123456789abcdefghijklmnopqrstuv";

/// Bound for one request whose handler hashes a password with the REAL argon2 parameters
/// (the test binary is a debug build, where argon2 is slow).
pub const SLOW_IO_TIMEOUT: Duration = Duration::from_secs(60);

pub(super) static UNIQUE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A fresh e-mail address `prefix-N@x.io` (unique within this test process).
pub fn unique_email(prefix: &str) -> String {
    format!("{prefix}-{}@x.io", UNIQUE.fetch_add(1, Ordering::Relaxed))
}

impl ServerBuilder {
    /// argon2id at 1 MiB / 1 iteration: fast password hashing for tests that do not time it.
    pub fn fast_argon2(self) -> Self {
        self.set("auth", "argon2_memory_kib = 1024\nargon2_iterations = 1")
    }

    /// Rate limiting off, so suites that send many `/api` requests are not throttled.
    pub fn no_rate_limit(self) -> Self {
        self.set("rate_limit", "enabled = false")
    }

    /// `[auth] jwt_secret = "<secret>"`.
    pub fn jwt_secret(self, secret: &str) -> Self {
        self.set("auth", &format!("jwt_secret = \"{secret}\""))
    }

    /// The database directory (kept by the caller, e.g. to restart on the same data).
    pub fn data_dir(self, p: &Path) -> Self {
        self.top(&format!("data_dir = \"{}\"", p.display()))
    }
}

impl Server {
    /// The defaults for API tests: 1 worker, fast argon2, no rate limit, the known secret.
    pub fn api_builder() -> ServerBuilder {
        Server::builder().fast_argon2().no_rate_limit().jwt_secret(TEST_JWT_SECRET)
    }

    pub fn start_api() -> Server {
        Self::api_builder().start()
    }

    /// The config file the server was started with.
    pub fn config_path(&self) -> PathBuf {
        self.dir().join("forkd.toml")
    }

    /// One request on a fresh connection (read timeout `timeout`).
    pub fn call_t(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Response {
        if self.proto != Proto::H1 {
            return self
                .session()
                .try_request(method, path, headers, body, timeout)
                .unwrap_or_else(|e| panic!("{e}\n--- server log (tail) ---\n{}", self.log_tail()));
        }
        let mut c = self.conn();
        c.set_timeout(timeout);
        c.send(&request(method, path, headers, body));
        if method == "HEAD" {
            c.read_head_response()
        } else {
            c.read_response()
        }
    }

    /// One request on a fresh connection, in this server's protocol, without panicking:
    /// `Err` when no whole response came within `timeout` (or the stream was reset).
    pub fn try_call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<Response, String> {
        match self.proto {
            Proto::H1 => {
                let s = TcpStream::connect_timeout(&self.addr, IO_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
                let mut c = Conn::from_stream(s, None);
                c.set_timeout(timeout);
                c.try_write(&request(method, path, headers, body)).map_err(|e| format!("write: {e}"))?;
                c.try_read_response(method == "HEAD").map_err(|e| e.to_string())
            }
            Proto::H2c => h2_exchange(&mut self.h2c(), method, path, headers, body, timeout),
            Proto::H3 => h3_exchange(&mut self.try_h3(timeout)?, method, path, headers, body, timeout),
        }
    }

    /// One request on a fresh connection.
    pub fn call(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        self.call_t(method, path, headers, body, IO_TIMEOUT)
    }

    /// A JSON request: `Authorization: Bearer <token>` when given, the body serialized with
    /// `Content-Type: application/json` when given, then `extra` headers.
    pub fn api_h(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
        extra: &[(&str, &str)],
    ) -> Response {
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut h: Vec<(&str, &str)> = Vec::new();
        if let Some(a) = &auth {
            h.push(("Authorization", a));
        }
        if body.is_some() {
            h.push(("Content-Type", "application/json"));
        }
        h.extend_from_slice(extra);
        let b = body.map(|v| serde_json::to_vec(v).unwrap()).unwrap_or_default();
        self.call(method, path, &h, &b)
    }

    pub fn api(&self, method: &str, path: &str, token: Option<&str>, body: Option<&Value>) -> Response {
        self.api_h(method, path, token, body, &[])
    }

    /// Sends one request on a fresh keep-alive connection, asserts `status` and no body
    /// (no byte of one: a `GET /health` on the same connection must parse cleanly next).
    pub fn expect_bodyless(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        status: u16,
        what: &str,
    ) -> Response {
        if self.proto != Proto::H1 {
            // The stream ends with no DATA; the connection carries on.
            let mut c = self.session();
            let r = c
                .try_request(method, path, headers, b"", IO_TIMEOUT)
                .unwrap_or_else(|e| panic!("{what}: {e}\n{}", self.log_tail()));
            ensure!(self, r.status == status, "{what}: expected status {status}, got {}:\n{r:?}", r.status);
            ensure!(
                self,
                r.body.is_empty() && r.header("content-length").is_none_or(|v| v == "0"),
                "{what}: a {status} must have no body: {r:?}"
            );
            let h = c.try_request("GET", "/health", &[], b"", IO_TIMEOUT);
            ensure!(
                self,
                matches!(&h, Ok(h) if h.status == 200),
                "{what}: the connection is unusable after the {status}: {h:?}"
            );
            return r;
        }
        let mut c = self.conn();
        c.send(&request(method, path, headers, b""));
        let r = c.read_response();
        ensure!(self, r.status == status, "{what}: expected status {status}, got {}:\n{r:?}", r.status);
        ensure!(
            self,
            r.body.is_empty() && r.header("content-length").is_none_or(|v| v == "0"),
            "{what}: a {status} must have no body: {r:?}"
        );
        ensure!(self, r.header("transfer-encoding").is_none(), "{what}: a {status} must not be chunked: {r:?}");
        if !r.closes() {
            let stray = c.poll_readable(Duration::from_millis(100));
            ensure!(
                self,
                !stray || c.pending().is_empty(),
                "{what}: bytes after the {status}: {:?}",
                String::from_utf8_lossy(c.pending())
            );
            c.send(&request("GET", "/health", &[], b""));
            let h = c.try_read_response(false);
            ensure!(
                self,
                matches!(&h, Ok(h) if h.status == 200),
                "{what}: the connection is unusable after the {status}: {h:?}"
            );
        }
        r
    }

    /// Asserts a success envelope `{"code": status, "message": "OK"|"Created", "data"}` with
    /// `Content-Type: application/json`; returns `data`.
    pub fn expect_data(&self, r: &Response, status: u16, what: &str) -> Value {
        ensure!(self, r.status == status, "{what}: expected status {status}, got {}:\n{r:?}", r.status);
        ensure_eq!(
            self,
            media_type(r.header("content-type")).as_deref(),
            Some("application/json"),
            "{what}: Content-Type of {r:?}"
        );
        let v: Value = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("{what}: body is not JSON ({e}): {r:?}\n{}", self.log_tail()));
        ensure_eq!(self, v["code"].as_u64(), Some(status as u64), "{what}: envelope `code` in {r:?}");
        let msg = if status == 201 { "Created" } else { "OK" };
        ensure_eq!(self, v["message"].as_str(), Some(msg), "{what}: envelope `message` in {r:?}");
        ensure!(self, v.get("data").is_some(), "{what}: no `data` in {r:?}");
        v["data"].clone()
    }

    /// Asserts an error: status, JSON content type, `{"code": code, "message": <string>}`;
    /// returns the body.
    pub fn expect_err(&self, r: &Response, status: u16, code: &str, what: &str) -> Value {
        ensure!(self, r.status == status, "{what}: expected status {status} {code}, got {}:\n{r:?}", r.status);
        ensure_eq!(
            self,
            media_type(r.header("content-type")).as_deref(),
            Some("application/json"),
            "{what}: error Content-Type of {r:?}"
        );
        let v: Value = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("{what}: error body is not JSON ({e}): {r:?}\n{}", self.log_tail()));
        ensure_eq!(self, v["code"].as_str(), Some(code), "{what}: error `code` in {r:?}");
        ensure!(self, v["message"].is_string(), "{what}: error without a string `message`: {r:?}");
        v
    }

    /// Asserts a 422 VALIDATION_ERROR whose `errors` name (at least) every one of `fields`.
    pub fn expect_invalid(&self, r: &Response, fields: &[&str], what: &str) -> Value {
        let v = self.expect_err(r, 422, "VALIDATION_ERROR", what);
        let got = error_fields(&v);
        for f in fields {
            ensure!(self, got.iter().any(|g| g == f), "{what}: `errors` must name field {f:?}; named {got:?} in {r:?}");
        }
        v
    }

    /// `forkd user create … --password-stdin --config <this server's config>`.
    pub fn user_create_cli(&self, args: &[&str], stdin: &[u8]) -> CliOutput {
        let cfg = self.config_path();
        let mut a: Vec<&str> = vec!["user", "create"];
        a.extend_from_slice(args);
        a.push("--config");
        a.push(cfg.to_str().unwrap());
        run_forkd_input(self.dir(), &a, &[], stdin)
    }

    /// Creates a user with the CLI (exit 0 required); returns the JSON object it printed.
    pub fn create_user(&self, email: &str, name: &str, role: &str, password: &str) -> Value {
        let out = self.user_create_cli(
            &["--email", email, "--name", name, "--role", role, "--password-stdin"],
            format!("{password}\n").as_bytes(),
        );
        ensure!(self, out.code() == Some(0), "`forkd user create --email {email}` must exit 0: {out:?}");
        let v: Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("`forkd user create` must print the user as one JSON object ({e}): {out:?}"));
        ensure!(self, v["id"].is_i64() && v["email"].is_string(), "`user create` printed no user: {v}");
        v
    }

    /// Logs in; asserts 200. Returns (access token, refresh token, Set-Cookie values).
    pub fn login(&self, email: &str, password: &str) -> (String, String, Vec<String>) {
        self.login_at("/api/v1/auth/login", email, password)
    }

    pub fn login_at(&self, path: &str, email: &str, password: &str) -> (String, String, Vec<String>) {
        let body = serde_json::to_vec(&json!({"email": email, "password": password})).unwrap();
        let r = self.call_t("POST", path, &[("Content-Type", "application/json")], &body, SLOW_IO_TIMEOUT);
        let d = self.expect_data(&r, 200, &format!("POST {path} as {email}"));
        let access = d["accessToken"].as_str().unwrap_or_else(|| panic!("no accessToken in {r:?}")).to_string();
        let refresh = d["refreshToken"].as_str().unwrap_or_else(|| panic!("no refreshToken in {r:?}")).to_string();
        let cookies = r.header_all("set-cookie").into_iter().map(str::to_string).collect();
        (access, refresh, cookies)
    }

    /// A fresh admin (CLI) and its access token.
    pub fn admin(&self) -> (Value, String) {
        let email = unique_email("admin");
        let u = self.create_user(&email, "Admin", "admin", "admin-password-1");
        let (t, _, _) = self.login(&email, "admin-password-1");
        (u, t)
    }

    /// Signs up `{name, email, password}` (+`age` when given); asserts 201; returns the user.
    pub fn signup(&self, name: &str, email: &str, password: &str, age: Option<i64>) -> Value {
        let mut b = json!({"name": name, "email": email, "password": password});
        if let Some(a) = age {
            b["age"] = json!(a);
        }
        let body = serde_json::to_vec(&b).unwrap();
        let r = self.call_t("POST", "/api/v1/users", &[("Content-Type", "application/json")], &body, SLOW_IO_TIMEOUT);
        self.expect_data(&r, 201, &format!("sign-up {b}"))
    }

    /// A fresh user (sign-up) and its access token: (user, token, password).
    pub fn user(&self, name: &str) -> (Value, String) {
        let email = unique_email(&name.to_ascii_lowercase().replace(' ', "-"));
        let u = self.signup(name, &email, "user-password-1", None);
        let (t, _, _) = self.login(&email, "user-password-1");
        (u, t)
    }

    /// `total` of `GET /api/v1/users?<query>` (asserts 200).
    pub fn user_total(&self, token: &str, query: &str) -> i64 {
        let path = if query.is_empty() { "/api/v1/users".to_string() } else { format!("/api/v1/users?{query}") };
        let r = self.api("GET", &path, Some(token), None);
        let d = self.expect_data(&r, 200, &format!("GET {path}"));
        d["total"].as_i64().unwrap_or_else(|| panic!("no integer total in {r:?}"))
    }

    /// Every user, paging with `limit=100`.
    pub fn all_users(&self, token: &str) -> Vec<Value> {
        let mut out = Vec::new();
        for page in 1..1000 {
            let r = self.api("GET", &format!("/api/v1/users?limit=100&page={page}"), Some(token), None);
            let d = self.expect_data(&r, 200, "GET /api/v1/users (all pages)");
            let items = d["items"].as_array().cloned().unwrap_or_default();
            if items.is_empty() {
                break;
            }
            out.extend(items);
        }
        out
    }
}

/// The `field` names of an error body's `errors`.
pub fn error_fields(v: &Value) -> Vec<String> {
    v["errors"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["field"].as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Checks the public shape of a user object (CONTRACT §5): the seven fields with their
/// types and never anything that looks like a password or a hash. Returns a list of
/// problems (empty when fine).
pub fn user_shape_problems(u: &Value) -> Vec<String> {
    let mut p = Vec::new();
    let Some(o) = u.as_object() else { return vec![format!("not an object: {u}")] };
    if !u["id"].is_i64() {
        p.push(format!("id is not an integer: {}", u["id"]));
    }
    if !u["name"].is_string() {
        p.push(format!("name is not a string: {}", u["name"]));
    }
    if !u["email"].is_string() {
        p.push(format!("email is not a string: {}", u["email"]));
    }
    if !(o.contains_key("age") && (u["age"].is_null() || u["age"].is_i64())) {
        p.push(format!("age must be present, an integer or null: {:?}", o.get("age")));
    }
    if !matches!(u["role"].as_str(), Some("user") | Some("admin")) {
        p.push(format!("role must be user|admin: {}", u["role"]));
    }
    for k in ["createdAt", "updatedAt"] {
        if !u[k].as_str().map(is_rfc3339_utc).unwrap_or(false) {
            p.push(format!("{k} is not RFC 3339 UTC: {}", u[k]));
        }
    }
    for k in o.keys() {
        let l = k.to_ascii_lowercase();
        if l.contains("pass") || l.contains("hash") || l.contains("salt") {
            p.push(format!("secret-looking key {k:?}"));
        }
    }
    p
}

/// True when `text` carries something that looks like a password or a password hash.
pub fn leaks_secret(text: &str, password: &str) -> bool {
    let l = text.to_ascii_lowercase();
    l.contains("password")
        || l.contains("passwordhash")
        || l.contains("$argon2")
        || l.contains("hash")
        || text.contains(password)
}

// ---- JWT forging (HMAC over sha2, no extra crate) ----

/// HMAC (RFC 2104) with SHA-256 / SHA-384 / SHA-512, selected by JWS alg name.
pub fn hmac(alg: &str, key: &[u8], msg: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    fn h<D: Digest>(parts: &[&[u8]]) -> Vec<u8> {
        let mut d = D::new();
        for p in parts {
            d.update(p);
        }
        d.finalize().to_vec()
    }
    type HashFn = fn(&[&[u8]]) -> Vec<u8>;
    let (block, hash): (usize, HashFn) = match alg {
        "HS256" => (64, h::<sha2::Sha256>),
        "HS384" => (128, h::<sha2::Sha384>),
        "HS512" => (128, h::<sha2::Sha512>),
        _ => panic!("hmac: unsupported alg {alg}"),
    };
    let mut k = if key.len() > block { hash(&[key]) } else { key.to_vec() };
    k.resize(block, 0);
    let ipad: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
    let opad: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
    let inner = hash(&[&ipad, msg]);
    hash(&[&opad, &inner])
}

pub fn b64url(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// `b64(header).b64(claims).b64(HMAC-<sig_alg>(secret, signing input))`; `sig_alg` "" for
/// an empty signature.
pub fn jwt_sign(header: &Value, claims: &Value, sig_alg: &str, secret: &[u8]) -> String {
    let input = format!("{}.{}", b64url(header.to_string().as_bytes()), b64url(claims.to_string().as_bytes()));
    let sig = if sig_alg.is_empty() { String::new() } else { b64url(&hmac(sig_alg, secret, input.as_bytes())) };
    format!("{input}.{sig}")
}

/// Splits a JWT: (header, claims, signature bytes). Panics when it is not one.
pub fn jwt_parts(token: &str) -> (Value, Value, Vec<u8>) {
    let p: Vec<&str> = token.split('.').collect();
    assert_eq!(p.len(), 3, "not a JWT (three dot-separated parts): {token:?}");
    let dec = |s: &str| base64_decode(s).unwrap_or_else(|| panic!("JWT part is not base64url: {s:?} in {token:?}"));
    let header = serde_json::from_slice(&dec(p[0])).unwrap_or_else(|e| panic!("JWT header not JSON ({e}): {token}"));
    let claims = serde_json::from_slice(&dec(p[1])).unwrap_or_else(|e| panic!("JWT claims not JSON ({e}): {token}"));
    (header, claims, dec(p[2]))
}

/// Claims the service would issue for `user_id`/`role`, valid for 15 minutes from now.
pub fn good_claims(user_id: i64, role: &str) -> Value {
    let now = now_unix();
    json!({"userId": user_id, "role": role, "iss": "forkd", "aud": "forkd-api", "iat": now, "exp": now + 900,
           "jti": format!("forged-{}", UNIQUE.fetch_add(1, Ordering::Relaxed)), "gen": 0, "iatMs": now * 1000})
}

// ---- Set-Cookie ----

#[derive(Debug, Clone)]
pub struct SetCookie {
    pub name: String,
    pub value: String,
    /// Attribute names lower-cased, values as sent ("" for flags).
    pub attrs: Vec<(String, String)>,
}

impl SetCookie {
    pub fn parse(s: &str) -> SetCookie {
        let mut parts = s.split(';');
        let (name, value) = parts.next().unwrap_or("").split_once('=').unwrap_or((s, ""));
        let attrs = parts
            .map(|a| {
                let (k, v) = a.split_once('=').unwrap_or((a, ""));
                (k.trim().to_ascii_lowercase(), v.trim().to_string())
            })
            .filter(|(k, _)| !k.is_empty())
            .collect();
        SetCookie { name: name.trim().to_string(), value: value.trim().to_string(), attrs }
    }

    pub fn attr(&self, name: &str) -> Option<&str> {
        let n = name.to_ascii_lowercase();
        self.attrs.iter().find(|(k, _)| *k == n).map(|(_, v)| v.as_str())
    }

    pub fn has(&self, name: &str) -> bool {
        self.attr(name).is_some()
    }
}

/// The `Set-Cookie` of `name` among `headers` (the last one when several).
pub fn find_cookie(headers: &[String], name: &str) -> Option<SetCookie> {
    headers.iter().map(|h| SetCookie::parse(h)).rfind(|c| c.name == name)
}

pub fn set_cookies(r: &Response) -> Vec<String> {
    r.header_all("set-cookie").into_iter().map(str::to_string).collect()
}

mod selftest_api {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn harness_hmac_matches_rfc4231_and_long_keys() {
        let m = b"what do ya want for nothing?";
        assert_eq!(hex(&hmac("HS256", b"Jefe", m)), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
        assert_eq!(
            hex(&hmac("HS384", b"Jefe", m)),
            "af45d2e376484031617f78d2b58a6b1b9c7ef464f5a01b47e42ec3736322445e8e2240ca5e69e2c78b3239ecfab21649"
        );
        assert_eq!(
            hex(&hmac("HS512", b"Jefe", m)),
            "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737"
        );
        let k = [b'k'; 200];
        assert_eq!(hex(&hmac("HS256", &k, b"msg")), "e2adadca233bc31c6e6126c865132c3e945f9dedd44797a1e5acc3c037bc21fc");
        assert_eq!(
            hex(&hmac("HS512", &k, b"msg")),
            "b5245971beb52a5a986812c4666a05c735bf5bb7aba32eae2192adad605df4112d6c285d1c46cf81ccb7ab8c2c3b7b3c6793216909b5add05223ed21f24cdb1e"
        );
    }

    #[test]
    fn harness_jwt_cookie_and_time_helpers() {
        let h = json!({"alg":"HS256","typ":"JWT"});
        let t = jwt_sign(&h, &json!({"sub":"1"}), "HS256", b"s");
        let (hh, cc, sig) = jwt_parts(&t);
        assert_eq!((hh, cc, sig.len()), (h, json!({"sub":"1"}), 32));
        assert!(jwt_sign(&json!({"alg":"none"}), &json!({}), "", b"").ends_with('.'));
        let c = SetCookie::parse(
            "refresh_token=abc=; Path=/api/v1/auth; HttpOnly; secure; SameSite=Strict; Max-Age=604800",
        );
        assert_eq!((c.name.as_str(), c.value.as_str()), ("refresh_token", "abc="));
        assert_eq!(c.attr("path"), Some("/api/v1/auth"));
        assert!(c.has("httponly") && c.has("Secure") && !c.has("domain"));
        assert_eq!(c.attr("max-age"), Some("604800"));
        assert!(is_rfc3339_utc("2024-05-01T10:11:12Z"));
        assert!(is_rfc3339_utc("2024-05-01T10:11:12.123456Z"));
        assert!(is_rfc3339_utc("2024-05-01T10:11:12+00:00"));
        assert!(!is_rfc3339_utc("2024-05-01 10:11:12"));
        assert!(!is_rfc3339_utc("2024-05-01T10:11:12+02:00"));
        assert!(!is_rfc3339_utc("1714558272"));
        assert_eq!(urlencode("a b%_'\\"), "a%20b%25_%27%5C");
    }
}
