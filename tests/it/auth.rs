//! Authentication (CONTRACT §5 auth): login, the access token and its verifier (hostile
//! tokens forged with the known secret), /auth/me, refresh rotation and family revocation,
//! the cookie + CSRF double submit, logout, equal timing for unknown e-mail and wrong
//! password, the signing secret across workers and in production, and an event loop that
//! keeps answering while passwords hash.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::*;

const PW: &str = "user-password-1";

fn id_of(v: &Value) -> i64 {
    v["id"].as_i64().unwrap_or_else(|| panic!("no integer id in {v}"))
}

/// Asserts a 401 with `message` and a `WWW-Authenticate: Bearer…` header.
fn expect_401(s: &Server, r: &Response, message: &str, what: &str) {
    let v = s.expect_err(r, 401, "UNAUTHORIZED", what);
    ensure_eq!(s, v["message"].as_str(), Some(message), "{what}: 401 message in {r:?}");
    let wa = r.header("www-authenticate").unwrap_or("");
    ensure!(
        s,
        wa == "Bearer" || wa.starts_with("Bearer "),
        "{what}: expected `WWW-Authenticate: Bearer`, got {wa:?} in {r:?}"
    );
}

fn me_with_auth(s: &Server, authorization: &str) -> Response {
    s.call("GET", "/api/v1/auth/me", &[("Authorization", authorization)], b"")
}

fn post_json(s: &Server, path: &str, body: &Value, headers: &[(&str, &str)]) -> Response {
    s.api_h("POST", path, None, Some(body), headers)
}

/// Checks a login/refresh success body; returns (access, refresh).
fn check_token_data(s: &Server, d: &Value, what: &str) -> (String, String) {
    ensure_eq!(s, d["tokenType"].as_str(), Some("Bearer"), "{what}: tokenType in {d}");
    ensure_eq!(s, d["expiresIn"].as_i64(), Some(900), "{what}: expiresIn in {d}");
    let a = d["accessToken"].as_str().filter(|t| !t.is_empty());
    let r = d["refreshToken"].as_str().filter(|t| !t.is_empty());
    ensure!(s, a.is_some() && r.is_some(), "{what}: accessToken and refreshToken in {d}");
    (a.unwrap().to_string(), r.unwrap().to_string())
}

fn check_login_cookies(s: &Server, cookies: &[String], what: &str) -> (SetCookie, SetCookie) {
    let rt = find_cookie(cookies, "refresh_token");
    let csrf = find_cookie(cookies, "csrf_token");
    ensure!(s, rt.is_some() && csrf.is_some(), "{what}: Set-Cookie refresh_token and csrf_token, got {cookies:?}");
    let (rt, csrf) = (rt.unwrap(), csrf.unwrap());
    ensure!(s, !rt.value.is_empty() && !csrf.value.is_empty(), "{what}: cookie values must not be empty: {cookies:?}");
    ensure!(s, rt.has("httponly") && rt.has("secure"), "{what}: refresh_token must be HttpOnly; Secure: {rt:?}");
    ensure_eq!(
        s,
        rt.attr("samesite").map(str::to_ascii_lowercase).as_deref(),
        Some("strict"),
        "{what}: refresh_token SameSite"
    );
    ensure_eq!(s, rt.attr("path"), Some("/api/v1/auth"), "{what}: refresh_token Path");
    ensure_eq!(s, rt.attr("max-age"), Some("604800"), "{what}: refresh_token Max-Age");
    ensure!(
        s,
        csrf.has("secure") && !csrf.has("httponly"),
        "{what}: csrf_token must be Secure and readable by scripts (no HttpOnly): {csrf:?}"
    );
    ensure_eq!(
        s,
        csrf.attr("samesite").map(str::to_ascii_lowercase).as_deref(),
        Some("strict"),
        "{what}: csrf_token SameSite"
    );
    ensure_eq!(s, csrf.attr("path"), Some("/"), "{what}: csrf_token Path");
    (rt, csrf)
}

// ---------------------------------------------------------------------------------------
// Login
// ---------------------------------------------------------------------------------------

protocols!(login_returns_tokens_and_sets_refresh_and_csrf_cookies);
fn login_returns_tokens_and_sets_refresh_and_csrf_cookies(p: Proto) {
    let s = Server::start_api().on(p);
    let email = unique_email("login");
    s.signup("Login", &email, PW, None);
    let r = post_json(&s, "/api/v1/auth/login", &json!({"email": email, "password": PW}), &[]);
    let d = s.expect_data(&r, 200, "login");
    let (access, _) = check_token_data(&s, &d, "login");
    check_login_cookies(&s, &set_cookies(&r), "login");
    ensure!(s, !leaks_secret(&r.body_str(), PW), "login response leaks a password/hash: {r:?}");
    let me = s.api("GET", "/api/v1/auth/me", Some(&access), None);
    let u = s.expect_data(&me, 200, "GET /auth/me with the new token");
    ensure_eq!(s, u["email"].as_str(), Some(email.as_str()), "/auth/me is the logged-in user");
    ensure!(s, user_shape_problems(&u).is_empty(), "/auth/me user shape {:?}", user_shape_problems(&u));
}

protocols!(access_token_is_hs256_with_the_contract_claims);
fn access_token_is_hs256_with_the_contract_claims(p: Proto) {
    let s = Server::start_api().on(p);
    let email = unique_email("claims");
    let u = s.signup("Claims", &email, PW, None);
    let before = now_unix();
    let (t1, _, _) = s.login(&email, PW);
    let (t2, _, _) = s.login(&email, PW);
    let after = now_unix();
    let (h, c, sig) = jwt_parts(&t1);
    ensure_eq!(s, h["alg"].as_str(), Some("HS256"), "token header {h}");
    let input = t1.rsplit_once('.').unwrap().0;
    ensure_eq!(
        s,
        sig,
        hmac("HS256", TEST_JWT_SECRET.as_bytes(), input.as_bytes()),
        "signature = HMAC-SHA256(configured jwt_secret)"
    );
    ensure_eq!(
        s,
        (c["userId"].as_i64(), c["role"].as_str(), c["iss"].as_str()),
        (Some(id_of(&u)), Some("user"), Some("forkd")),
        "claims {c}"
    );
    let aud_ok = c["aud"] == "forkd-api" || c["aud"].as_array().is_some_and(|a| a.iter().any(|x| x == "forkd-api"));
    ensure!(s, aud_ok, "aud must be forkd-api: {c}");
    let iat = c["iat"].as_i64().unwrap_or(0);
    ensure!(s, iat >= before - 2 && iat <= after + 2, "iat {iat} must be now ({before}..{after})");
    ensure_eq!(s, c["exp"].as_i64(), Some(iat + 900), "exp = iat + 900 in {c}");
    ensure!(s, c["jti"].as_str().is_some_and(|j| !j.is_empty()), "jti must be a non-empty string: {c}");
    let (_, c2, _) = jwt_parts(&t2);
    ensure!(s, c2["jti"] != c["jti"], "two logins must give two jti: {c} / {c2}");
}

protocols!(wrong_password_and_unknown_email_are_the_same_401);
fn wrong_password_and_unknown_email_are_the_same_401(p: Proto) {
    let s = Server::start_api().on(p);
    let email = unique_email("known");
    s.signup("Known", &email, PW, None);
    let a = post_json(&s, "/api/v1/auth/login", &json!({"email": email, "password": "wrong-password-1"}), &[]);
    let b = post_json(&s, "/api/v1/auth/login", &json!({"email": unique_email("nobody"), "password": PW}), &[]);
    for (r, what) in [(&a, "wrong password"), (&b, "unknown e-mail")] {
        let v = s.expect_err(r, 401, "UNAUTHORIZED", what);
        ensure_eq!(s, v["message"].as_str(), Some("invalid credentials"), "{what}: message");
        ensure!(s, r.header("set-cookie").is_none(), "{what}: no cookie on a failed login: {r:?}");
    }
    let strip = |r: &Response| {
        let mut v: Value = r.json();
        v.as_object_mut().unwrap().remove("stack");
        v
    };
    ensure_eq!(s, strip(&a), strip(&b), "wrong password and unknown e-mail must answer identically");
}

protocols!(login_with_missing_fields_is_422);
fn login_with_missing_fields_is_422(p: Proto) {
    let s = Server::start_api().on(p);
    let r = post_json(&s, "/api/v1/auth/login", &json!({}), &[]);
    s.expect_invalid(&r, &["email", "password"], "login {}");
    let r = post_json(&s, "/api/v1/auth/login", &json!({"email": "a@x.io"}), &[]);
    s.expect_invalid(&r, &["password"], "login without password");
    let r = post_json(&s, "/api/v1/auth/login", &json!({"password": PW}), &[]);
    s.expect_invalid(&r, &["email"], "login without email");
    let r = post_json(&s, "/api/v1/auth/login", &json!({"email": 1, "password": ["x"]}), &[]);
    s.expect_invalid(&r, &["email", "password"], "login with wrong types");
}

protocols!(login_timing_is_the_same_for_unknown_email_and_wrong_password);
fn login_timing_is_the_same_for_unknown_email_and_wrong_password(p: Proto) {
    // The REAL default argon2 parameters (19456 KiB, 2 iterations).
    let s = Server::builder().no_rate_limit().jwt_secret(TEST_JWT_SECRET).start().on(p);
    let emails: Vec<String> = (0..7).map(|_| unique_email("timed")).collect();
    for e in &emails {
        s.signup("Timed", e, PW, None);
    }
    let attempt = |email: &str, pw: &str| -> Duration {
        let body = serde_json::to_vec(&json!({"email": email, "password": pw})).unwrap();
        let t0 = Instant::now();
        let r = s.call_t("POST", "/api/v1/auth/login", &[("Content-Type", "application/json")], &body, SLOW_IO_TIMEOUT);
        let dt = t0.elapsed();
        s.expect_err(&r, 401, "UNAUTHORIZED", &format!("timed login {email}"));
        dt
    };
    attempt(&unique_email("warmup"), PW); // warm-up, not measured
    let (mut wrong, mut unknown) = (Vec::new(), Vec::new());
    for e in &emails {
        // Each wrong-password attempt on its own account (stays under login_max_failures).
        wrong.push(attempt(e, "wrong-password-1"));
        unknown.push(attempt(&unique_email("ghost"), PW));
    }
    // The fastest of 7 interleaved attempts is each path's own cost: a shared machine only
    // ever adds time (the medians, printed too, swing by 3x under a parallel build). Without
    // the dummy hash an unknown e-mail answers in about 1 ms against ~40 ms: ratio ~40.
    wrong.sort();
    unknown.sort();
    let (fw, fu) = (wrong[0], unknown[0]);
    let (mw, mu) = (wrong[wrong.len() / 2], unknown[unknown.len() / 2]);
    let ratio = fw.as_secs_f64().max(fu.as_secs_f64()) / fw.as_secs_f64().min(fu.as_secs_f64()).max(1e-6);
    eprintln!(
        "login timing: fastest wrong password {fw:?}, fastest unknown e-mail {fu:?}, ratio {ratio:.2} \
         (medians {mw:?} and {mu:?}; wrong {wrong:?}, unknown {unknown:?})"
    );
    ensure!(
        s,
        ratio <= 2.0,
        "the fastest login times must be within a factor of 2: wrong password {fw:?} ({wrong:?}) vs unknown e-mail {fu:?} ({unknown:?}), ratio {ratio:.2}"
    );
}

// ---------------------------------------------------------------------------------------
// Bearer tokens
// ---------------------------------------------------------------------------------------

protocols!(protected_routes_without_a_token_are_401_token_required);
fn protected_routes_without_a_token_are_401_token_required(p: Proto) {
    let s = Server::start_api().on(p);
    for (m, p) in [
        ("GET", "/api/v1/users"),
        ("GET", "/api/v1/auth/me"),
        ("GET", "/api/v1/users/1"),
        ("DELETE", "/api/v1/users/1"),
    ] {
        let r = s.call(m, p, &[], b"");
        expect_401(&s, &r, "token required", &format!("{m} {p} without Authorization"));
    }
    let r = me_with_auth(&s, "Bearer not-a-jwt");
    expect_401(&s, &r, "invalid token", "Bearer not-a-jwt");
}

protocols!(hostile_tokens_are_all_401_invalid_token);
fn hostile_tokens_are_all_401_invalid_token(p: Proto) {
    let s = Server::start_api().on(p);
    let (u, token) = s.user("Target");
    let uid = id_of(&u);
    let secret = TEST_JWT_SECRET.as_bytes();
    let parts: Vec<&str> = token.split('.').collect();
    let (_, claims, _) = jwt_parts(&token);
    let hs256 = json!({"alg": "HS256", "typ": "JWT"});
    let now = now_unix();
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = good_claims(uid, "user");
        f(&mut c);
        c
    };

    let mut cases: Vec<(&str, String)> = Vec::new();
    let mut sig: Vec<u8> = parts[2].bytes().collect();
    sig[0] = if sig[0] == b'A' { b'B' } else { b'A' };
    cases.push(("tampered signature", format!("{}.{}.{}", parts[0], parts[1], String::from_utf8(sig).unwrap())));
    let mut admin_claims = claims.clone();
    admin_claims["role"] = json!("admin");
    cases.push((
        "role changed to admin, old signature",
        format!("{}.{}.{}", parts[0], b64url(admin_claims.to_string().as_bytes()), parts[2]),
    ));
    cases.push((
        "alg none, empty signature",
        jwt_sign(&json!({"alg": "none", "typ": "JWT"}), &good_claims(uid, "user"), "", b""),
    ));
    cases.push((
        "alg none, admin, empty signature",
        jwt_sign(&json!({"alg": "none"}), &good_claims(uid, "admin"), "", b""),
    ));
    cases.push((
        "alg NONE, empty signature",
        jwt_sign(&json!({"alg": "NONE", "typ": "JWT"}), &good_claims(uid, "user"), "", b""),
    ));
    cases.push((
        "alg none, original signature",
        format!("{}.{}.{}", b64url(br#"{"alg":"none","typ":"JWT"}"#), parts[1], parts[2]),
    ));
    cases.push((
        "HS512 with the right secret",
        jwt_sign(&json!({"alg": "HS512", "typ": "JWT"}), &good_claims(uid, "user"), "HS512", secret),
    ));
    cases.push((
        "HS384 with the right secret",
        jwt_sign(&json!({"alg": "HS384", "typ": "JWT"}), &good_claims(uid, "user"), "HS384", secret),
    ));
    cases.push((
        "RS256 header, HMAC signature",
        jwt_sign(&json!({"alg": "RS256", "typ": "JWT"}), &good_claims(uid, "user"), "HS256", secret),
    ));
    cases.push((
        "RS256 header, empty signature",
        jwt_sign(&json!({"alg": "RS256", "typ": "JWT"}), &good_claims(uid, "user"), "", b""),
    ));
    cases.push((
        "HS256 with another secret",
        jwt_sign(&hs256, &good_claims(uid, "user"), "HS256", b"another-secret-another-secret-another-secret!"),
    ));
    cases.push((
        "expired one second ago",
        jwt_sign(
            &hs256,
            &with(&|c| {
                c["iat"] = json!(now - 901);
                c["exp"] = json!(now - 1);
            }),
            "HS256",
            secret,
        ),
    ));
    cases.push(("wrong iss", jwt_sign(&hs256, &with(&|c| c["iss"] = json!("evil")), "HS256", secret)));
    cases.push(("wrong aud", jwt_sign(&hs256, &with(&|c| c["aud"] = json!("other-api")), "HS256", secret)));
    cases.push((
        "missing exp",
        jwt_sign(
            &hs256,
            &with(&|c| {
                c.as_object_mut().unwrap().remove("exp");
            }),
            "HS256",
            secret,
        ),
    ));
    cases.push((
        "missing iss",
        jwt_sign(
            &hs256,
            &with(&|c| {
                c.as_object_mut().unwrap().remove("iss");
            }),
            "HS256",
            secret,
        ),
    ));
    cases.push((
        "missing aud",
        jwt_sign(
            &hs256,
            &with(&|c| {
                c.as_object_mut().unwrap().remove("aud");
            }),
            "HS256",
            secret,
        ),
    ));
    cases
        .push(("string exp", jwt_sign(&hs256, &with(&|c| c["exp"] = json!((now + 900).to_string())), "HS256", secret)));
    cases.push(("two parts", format!("{}.{}", parts[0], parts[1])));
    cases.push(("four parts", format!("{token}.{}", parts[2])));
    cases.push(("garbage", "!!!.###.$$$".to_string()));

    let mut failures = Vec::new();
    let mut check = |what: &str, authz: &str| {
        let r = me_with_auth(&s, authz);
        let ok = r.status == 401
            && serde_json::from_slice::<Value>(&r.body)
                .is_ok_and(|v| v["code"] == "UNAUTHORIZED" && v["message"] == "invalid token")
            && r.header("www-authenticate").is_some_and(|w| w.starts_with("Bearer"));
        if !ok {
            failures.push(format!("{what}: Authorization: {authz}\n  → {r:?}"));
        }
    };
    for (what, t) in &cases {
        check(what, &format!("Bearer {t}"));
    }
    check("`Bearer` with no token", "Bearer");
    if p == Proto::H1 {
        // HTTP/2 refuses a field value that ends in a space (RFC 9113 §8.2.1) before any route.
        check("`Bearer` with an empty token", "Bearer ");
    }
    check("`Basic xyz`", "Basic xyz");
    ensure!(s, failures.is_empty(), "expected 401 {{code UNAUTHORIZED, message \"invalid token\"}} + WWW-Authenticate: Bearer for each; these differ:\n{}", failures.join("\n"));

    // Control: the same forging helper with everything right is accepted.
    let good = jwt_sign(&hs256, &good_claims(uid, "user"), "HS256", secret);
    let r = me_with_auth(&s, &format!("Bearer {good}"));
    let d = s.expect_data(&r, 200, "control: a correctly forged HS256 token");
    ensure_eq!(s, d["id"].as_i64(), Some(uid), "control token's user");
    let r = me_with_auth(&s, &format!("Bearer {token}"));
    s.expect_data(&r, 200, "control: the issued token still works");
}

protocols!(correctly_forged_hs256_token_with_the_right_secret_is_accepted);
fn correctly_forged_hs256_token_with_the_right_secret_is_accepted(p: Proto) {
    let s = Server::start_api().on(p);
    let (u, _) = s.user("Forged");
    let t = jwt_sign(
        &json!({"alg": "HS256", "typ": "JWT"}),
        &good_claims(id_of(&u), "user"),
        "HS256",
        TEST_JWT_SECRET.as_bytes(),
    );
    let r = me_with_auth(&s, &format!("Bearer {t}"));
    let d = s.expect_data(&r, 200, "GET /auth/me with a forged-but-correct token");
    ensure_eq!(s, d["email"], u["email"], "the token's user");
    let r = s.api("GET", "/api/v1/users", Some(&t), None);
    s.expect_data(&r, 200, "GET /api/v1/users with a forged-but-correct token");
}

protocols!(tokens_with_a_crit_header_or_a_future_nbf_are_401);
/// Regression: a `crit` header parameter (RFC 7515 §4.1.11: extensions the verifier must
/// understand; we understand none) and an `nbf` in the future were ignored. Both are
/// `invalid token`, correctly signed or not, and so is an `nbf` that is not a number.
fn tokens_with_a_crit_header_or_a_future_nbf_are_401(p: Proto) {
    let s = Server::start_api().on(p);
    let (u, _) = s.user("Crit Nbf");
    let id = id_of(&u);
    let sign = |header: Value, claims: Value| jwt_sign(&header, &claims, "HS256", TEST_JWT_SECRET.as_bytes());
    let hs = json!({"alg": "HS256", "typ": "JWT"});
    let mut refused = Vec::new();
    for crit in [json!(["exp"]), json!(["x-ext"]), json!([]), json!("x"), json!(null)] {
        let header = json!({"alg": "HS256", "typ": "JWT", "crit": crit, "x-ext": 1});
        refused.push((format!("crit: {crit}"), sign(header, good_claims(id, "user"))));
    }
    for nbf in [json!(now_unix() + 60), json!(now_unix() + 5), json!("0")] {
        let mut claims = good_claims(id, "user");
        claims["nbf"] = nbf.clone();
        refused.push((format!("nbf: {nbf}"), sign(hs.clone(), claims)));
    }
    for (what, t) in &refused {
        let r = me_with_auth(&s, &format!("Bearer {t}"));
        expect_401(&s, &r, "invalid token", &format!("GET /auth/me with {what}"));
    }
    // Controls: an nbf now or in the past is fine.
    for nbf in [now_unix() - 60, now_unix()] {
        let mut claims = good_claims(id, "user");
        claims["nbf"] = json!(nbf);
        let r = me_with_auth(&s, &format!("Bearer {}", sign(hs.clone(), claims)));
        s.expect_data(&r, 200, &format!("GET /auth/me with nbf = now - {}", now_unix() - nbf));
    }
}

protocols!(a_token_accepted_before_is_refused_once_it_expires);
fn a_token_accepted_before_is_refused_once_it_expires(p: Proto) {
    // The worker remembers tokens it verified; expiry must still be checked on every use.
    let s = Server::start_api().on(p);
    let (u, _) = s.user("Expiring");
    let mut claims = good_claims(id_of(&u), "user");
    let exp = now_unix() + 2;
    claims["exp"] = json!(exp);
    let t = jwt_sign(&json!({"alg": "HS256", "typ": "JWT"}), &claims, "HS256", TEST_JWT_SECRET.as_bytes());
    for i in 0..3 {
        let r = me_with_auth(&s, &format!("Bearer {t}"));
        if now_unix() < exp {
            s.expect_data(&r, 200, &format!("GET /auth/me #{i} before exp"));
        }
    }
    let refused = eventually(Duration::from_secs(6), || {
        now_unix() > exp && me_with_auth(&s, &format!("Bearer {t}")).status == 401
    });
    let r = me_with_auth(&s, &format!("Bearer {t}"));
    ensure!(s, refused, "a token past its exp ({exp}) must be refused even after it was accepted: {r:?}");
    expect_401(&s, &r, "invalid token", "an expired token used before");
}

protocols!(me_returns_the_current_user);
fn me_returns_the_current_user(p: Proto) {
    let s = Server::start_api().on(p);
    let (u, token) = s.user("Myself");
    let (admin_user, admin) = s.admin();
    let d = s.expect_data(&s.api("GET", "/api/v1/auth/me", Some(&token), None), 200, "/auth/me as a user");
    ensure_eq!(s, d, u, "/auth/me is the user");
    let d = s.expect_data(&s.api("GET", "/api/v1/auth/me", Some(&admin), None), 200, "/auth/me as an admin");
    ensure_eq!(
        s,
        (d["id"].as_i64(), d["role"].as_str()),
        (admin_user["id"].as_i64(), Some("admin")),
        "/auth/me is the admin"
    );
}

// ---------------------------------------------------------------------------------------
// Refresh, CSRF, logout
// ---------------------------------------------------------------------------------------

protocols!(refresh_rotates_and_replaying_a_spent_token_revokes_the_family);
fn refresh_rotates_and_replaying_a_spent_token_revokes_the_family(p: Proto) {
    let s = Server::start_api().on(p);
    let email = unique_email("rot");
    s.signup("Rotator", &email, PW, None);
    let (_, r1, _) = s.login(&email, PW);
    let r = post_json(&s, "/api/v1/auth/refresh", &json!({"refreshToken": r1}), &[]);
    let d = s.expect_data(&r, 200, "refresh with r1");
    let (a2, r2) = check_token_data(&s, &d, "refresh");
    ensure!(s, r2 != r1, "refresh must issue a NEW refresh token (got the same)");
    check_login_cookies(&s, &set_cookies(&r), "refresh");
    s.expect_data(&s.api("GET", "/api/v1/auth/me", Some(&a2), None), 200, "the refreshed access token works");

    let r = post_json(&s, "/api/v1/auth/refresh", &json!({"refreshToken": r1}), &[]);
    expect_401(&s, &r, "invalid token", "replay of the spent r1");
    let r = post_json(&s, "/api/v1/auth/refresh", &json!({"refreshToken": r2}), &[]);
    expect_401(&s, &r, "invalid token", "r2 after its family was revoked by the replay");

    // Another login starts a new, independent family.
    let (_, r3, _) = s.login(&email, PW);
    let r = post_json(&s, "/api/v1/auth/refresh", &json!({"refreshToken": r3}), &[]);
    s.expect_data(&r, 200, "a new family after revocation");
    let r = post_json(&s, "/api/v1/auth/refresh", &json!({"refreshToken": "not-a-token"}), &[]);
    expect_401(&s, &r, "invalid token", "refresh with garbage");
}

protocols!(refresh_from_the_cookie_needs_the_matching_csrf_header);
fn refresh_from_the_cookie_needs_the_matching_csrf_header(p: Proto) {
    let s = Server::start_api().on(p);
    let email = unique_email("csrf");
    s.signup("Csrf", &email, PW, None);
    let (_, _, cookies) = s.login(&email, PW);
    let (rt, csrf) = check_login_cookies(&s, &cookies, "login");
    let both = format!("refresh_token={}; csrf_token={}", rt.value, csrf.value);
    let refresh = |headers: &[(&str, &str)]| s.call("POST", "/api/v1/auth/refresh", headers, b"");
    let r = refresh(&[("Cookie", &both)]);
    s.expect_err(&r, 403, "FORBIDDEN", "cookie refresh without X-CSRF-Token");
    let r = refresh(&[("Cookie", &both), ("X-CSRF-Token", "wrong-value")]);
    s.expect_err(&r, 403, "FORBIDDEN", "cookie refresh with a wrong X-CSRF-Token");
    let only_rt = format!("refresh_token={}", rt.value);
    let r = refresh(&[("Cookie", &only_rt), ("X-CSRF-Token", &csrf.value)]);
    s.expect_err(&r, 403, "FORBIDDEN", "cookie refresh with the header but no csrf_token cookie");
    let r = refresh(&[("Cookie", &both), ("X-CSRF-Token", &csrf.value)]);
    let d = s.expect_data(&r, 200, "cookie refresh with the matching X-CSRF-Token (the 403s must not spend it)");
    let (_, new_rt) = check_token_data(&s, &d, "cookie refresh");
    ensure!(s, new_rt != rt.value, "a NEW refresh token after a cookie refresh");
    let (rt2, _) = check_login_cookies(&s, &set_cookies(&r), "cookie refresh");
    ensure!(s, rt2.value != rt.value, "a NEW refresh_token cookie after a cookie refresh");
}

protocols!(logout_revokes_the_refresh_token_and_clears_both_cookies);
fn logout_revokes_the_refresh_token_and_clears_both_cookies(p: Proto) {
    let s = Server::start_api().on(p);
    let email = unique_email("bye");
    s.signup("Bye", &email, PW, None);
    let (_, r1, _) = s.login(&email, PW);
    let r = post_json(&s, "/api/v1/auth/logout", &json!({"refreshToken": r1}), &[]);
    ensure!(s, r.status == 204 && r.body.is_empty(), "logout: expected 204 without a body, got {r:?}");
    let cookies = set_cookies(&r);
    for (name, path) in [("refresh_token", "/api/v1/auth"), ("csrf_token", "/")] {
        let c = find_cookie(&cookies, name);
        ensure!(s, c.is_some(), "logout must clear {name}: Set-Cookie {cookies:?}");
        let c = c.unwrap();
        ensure_eq!(
            s,
            (c.attr("max-age"), c.attr("path")),
            (Some("0"), Some(path)),
            "logout clears {name} with Max-Age=0 on its Path: {c:?}"
        );
    }
    let r = post_json(&s, "/api/v1/auth/refresh", &json!({"refreshToken": r1}), &[]);
    expect_401(&s, &r, "invalid token", "refresh with a logged-out token");
}

// ---------------------------------------------------------------------------------------
// The signing secret: shared by workers; production needs a real one
// ---------------------------------------------------------------------------------------

protocols!(generated_secret_is_shared_by_both_workers);
fn generated_secret_is_shared_by_both_workers(p: Proto) {
    let s = Server::builder().workers(2).fast_argon2().no_rate_limit().start().on(p);
    let workers = s.wait_workers(2, Duration::from_secs(10));
    let email = unique_email("shared");
    s.signup("Shared", &email, PW, None);
    let (t, _, _) = s.login(&email, PW);
    let mut pids = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    for i in 0..20 {
        let r = s.api("GET", "/api/v1/auth/me", Some(&t), None);
        if r.status != 200 {
            failures.push(format!("request {i}: {r:?}"));
        }
        pids.insert(s.served_by(&r));
    }
    ensure!(
        s,
        failures.is_empty(),
        "a token from login must work on every worker (workers {workers:?}); failures:\n{}",
        failures.join("\n")
    );
    ensure!(s, pids.len() == 2, "the token should have been tried on both workers; it was on {pids:?} of {workers:?}");
}

fn prod_config(dir: &tempfile::TempDir, auth_lines: &str) -> std::path::PathBuf {
    let text = render_config(
        &format!("127.0.0.1:{}", free_port()),
        &dir.path().join("data"),
        &format!("environment = \"production\"\n\n[auth]\n{auth_lines}\n\n[debug]\nroutes = false\n"),
    );
    let p = dir.path().join("forkd.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn production_without_a_secret_fails_check_config_with_exit_2() {
    let d = tempfile::Builder::new().prefix("forkd-prod-").tempdir().unwrap();
    let cfg = prod_config(&d, "");
    let out = run_forkd(d.path(), &["check-config", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(out.code(), Some(2), "production without jwt_secret: {out:?}");
    assert!(out.stderr.contains("jwt_secret"), "the message must name auth.jwt_secret: {out:?}");
}

protocols!(production_with_a_40_byte_secret_file_starts_and_login_works);
fn production_with_a_40_byte_secret_file_starts_and_login_works(p: Proto) {
    let keep = tempfile::Builder::new().prefix("forkd-secret-").tempdir().unwrap();
    let secret = "prod#secret!forty-bytes*0123456789abcdef";
    assert_eq!(secret.len(), 40);
    let file = keep.path().join("jwt.secret");
    std::fs::write(&file, secret).unwrap();
    let s = Server::builder()
        .top("environment = \"production\"")
        .set("debug", "routes = false")
        .fast_argon2()
        .no_rate_limit()
        .set("auth", &format!("jwt_secret_file = \"{}\"", file.display()))
        .start()
        .on(p);
    let email = unique_email("prod");
    s.create_user(&email, "Prod Admin", "admin", "prod-password-1");
    let (t, _, _) = s.login(&email, "prod-password-1");
    let d = s.expect_data(&s.api("GET", "/api/v1/auth/me", Some(&t), None), 200, "/auth/me in production");
    ensure_eq!(s, d["role"].as_str(), Some("admin"), "the CLI-created admin");
    let input = t.rsplit_once('.').unwrap().0;
    ensure_eq!(
        s,
        jwt_parts(&t).2,
        hmac("HS256", secret.as_bytes(), input.as_bytes()),
        "tokens are signed with the secret file's bytes"
    );
    let r = s.api("GET", "/api/v1/users/999999", Some(&t), None);
    let v = s.expect_err(&r, 404, "NOT_FOUND", "404 in production");
    ensure!(s, v.get("stack").is_none(), "no `stack` in production errors: {v}");
}

#[test]
fn production_with_a_10_byte_secret_file_refuses_to_start() {
    let d = tempfile::Builder::new().prefix("forkd-prod-").tempdir().unwrap();
    let file = d.path().join("short.secret");
    std::fs::write(&file, "short#!-10").unwrap();
    let cfg = prod_config(&d, &format!("jwt_secret_file = \"{}\"", file.display()));
    let out = run_forkd(d.path(), &["serve", "--config", cfg.to_str().unwrap()], &[]);
    assert_ne!(out.code(), Some(0), "a 10-byte secret must be refused: {out:?}");
    assert!(out.status.code().is_some(), "must exit, not die by a signal: {out:?}");
    assert!(out.stderr.to_lowercase().contains("secret"), "the refusal must say why (the secret): {out:?}");
}

// ---------------------------------------------------------------------------------------
// Password hashing stays off the event loop
// ---------------------------------------------------------------------------------------

#[test]
fn health_answers_within_50ms_while_20_logins_hash_with_real_argon2() {
    // The REAL default argon2 parameters (19456 KiB, 2 iterations), one worker.
    let s = Server::builder().no_rate_limit().jwt_secret(TEST_JWT_SECRET).start();
    let email = unique_email("busy");
    s.signup("Busy", &email, PW, None);
    let n = 20;
    let done = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(n + 1));
    let addr = s.addr();
    let body = serde_json::to_vec(&json!({"email": email, "password": PW})).unwrap();
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (done, barrier, body) = (done.clone(), barrier.clone(), body.clone());
            thread::spawn(move || {
                let mut c = Conn::open(addr);
                c.set_timeout(SLOW_IO_TIMEOUT);
                barrier.wait();
                let r = c
                    .try_write(&request("POST", "/api/v1/auth/login", &[("Content-Type", "application/json")], &body))
                    .and_then(|_| c.try_read_response(false));
                done.fetch_add(1, Ordering::SeqCst);
                r.map(|r| r.status).map_err(|e| e.to_string())
            })
        })
        .collect();
    let mut c = s.conn();
    c.get("/health"); // connection established before the burst
    barrier.wait();
    thread::sleep(Duration::from_millis(20)); // let the logins reach the worker
    let mut samples = Vec::new();
    for _ in 0..30 {
        let in_flight = done.load(Ordering::SeqCst) < n;
        let t0 = Instant::now();
        let r = c.get("/health");
        let dt = t0.elapsed();
        ensure!(s, r.status == 200, "GET /health during the logins: {r:?}");
        samples.push((dt, in_flight));
        thread::sleep(Duration::from_millis(5));
    }
    let results: Vec<Result<u16, String>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let overlapped = samples.iter().filter(|(_, f)| *f).count();
    let mut times: Vec<Duration> = samples.iter().map(|(d, _)| *d).collect();
    times.sort();
    let p50 = times[times.len() / 2];
    let p99 = times[((times.len() as f64) * 0.99).ceil() as usize - 1];
    eprintln!("health during 20 real-argon2 logins: p50 {p50:?}, p99 {p99:?}, max {:?}, {overlapped}/30 samples while logins were in flight", times.last().unwrap());
    ensure!(s, results.iter().all(|r| matches!(r, Ok(200))), "all 20 logins must succeed: {results:?}");
    ensure!(
        s,
        overlapped >= 20,
        "the test needs /health samples while logins hash; only {overlapped}/30 overlapped (logins too fast?)"
    );
    let slow: Vec<&(Duration, bool)> = samples.iter().filter(|(d, _)| *d >= Duration::from_millis(50)).collect();
    ensure!(
        s,
        slow.is_empty(),
        "every GET /health must answer in < 50 ms while logins hash; slow: {slow:?}; p99 {p99:?}"
    );
}
