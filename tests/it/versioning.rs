//! API versioning (CONTRACT §5): `/api/…` is `/api/v1/…`; the version may come from
//! `?version=1` or `Accept: application/vnd.forkd+json; version=1`; any other → 400;
//! `/api/v2/…` does not exist.

use serde_json::json;

use crate::util::*;

const PW: &str = "user-password-1";

protocols!(unversioned_api_paths_behave_as_v1);
fn unversioned_api_paths_behave_as_v1(p: Proto) {
    let s = Server::start_api().on(p);
    let email = unique_email("unver");
    let r = s.api("POST", "/api/users", None, Some(&json!({"name": "Unversioned", "email": email, "password": PW})));
    let u = s.expect_data(&r, 201, "POST /api/users (sign-up)");
    ensure_eq!(s, u["role"].as_str(), Some("user"), "sign-up via /api/users: {u}");
    let id = u["id"].as_i64().unwrap();
    let (t, _, _) = s.login_at("/api/auth/login", &email, PW);
    let a = s.expect_data(&s.api("GET", &format!("/api/users/{id}"), Some(&t), None), 200, "GET /api/users/{id}");
    let b = s.expect_data(&s.api("GET", &format!("/api/v1/users/{id}"), Some(&t), None), 200, "GET /api/v1/users/{id}");
    ensure_eq!(s, a, b, "/api/users/{id} and /api/v1/users/{id} are the same resource");
    let d = s.expect_data(&s.api("GET", "/api/users", Some(&t), None), 200, "GET /api/users");
    ensure!(s, d["items"].is_array() && d["total"].as_i64() == Some(1), "GET /api/users is the paginated list: {d}");
    let me = s.expect_data(&s.api("GET", "/api/auth/me", Some(&t), None), 200, "GET /api/auth/me");
    ensure_eq!(s, me["id"].as_i64(), Some(id), "/api/auth/me");
    let r = s.api("POST", &format!("/api/users/{id}/posts"), Some(&t), Some(&json!({"title": "t", "body": ""})));
    s.expect_data(&r, 201, "POST /api/users/{id}/posts");
    let r = s.api("GET", "/api/users?limit=1&sort=-id", Some(&t), None);
    s.expect_data(&r, 200, "GET /api/users with query parameters");
    let r = s.api("GET", "/api/users", None, None);
    s.expect_err(&r, 401, "UNAUTHORIZED", "GET /api/users without a token");
}

protocols!(version_query_parameter_1_is_accepted_and_others_are_400);
fn version_query_parameter_1_is_accepted_and_others_are_400(p: Proto) {
    let s = Server::start_api().on(p);
    let (_, admin) = s.admin();
    let d = s.expect_data(&s.api("GET", "/api/users?version=1", Some(&admin), None), 200, "GET /api/users?version=1");
    ensure!(s, d["items"].is_array(), "paginated list: {d}");
    let d = s.expect_data(&s.api("GET", "/api/users?version=1&limit=5", Some(&admin), None), 200, "?version=1&limit=5");
    ensure_eq!(s, d["pageSize"].as_i64(), Some(5), "other parameters still apply next to version=1");
    let email = unique_email("v1q");
    let r = s.api("POST", "/api/users?version=1", None, Some(&json!({"name": "V1", "email": email, "password": PW})));
    s.expect_data(&r, 201, "POST /api/users?version=1");
    let before = s.user_total(&admin, "");
    for v in ["2", "0", "abc", "1.1"] {
        let r = s.api("GET", &format!("/api/users?version={v}"), Some(&admin), None);
        s.expect_err(&r, 400, "BAD_REQUEST", &format!("GET /api/users?version={v}"));
    }
    let r = s.api(
        "POST",
        "/api/users?version=2",
        None,
        Some(&json!({"name": "V2", "email": unique_email("v2q"), "password": PW})),
    );
    s.expect_err(&r, 400, "BAD_REQUEST", "POST /api/users?version=2");
    ensure_eq!(s, s.user_total(&admin, ""), before, "an unsupported version stores nothing");
}

protocols!(accept_header_version_1_is_accepted_and_2_is_400);
fn accept_header_version_1_is_accepted_and_2_is_400(p: Proto) {
    let s = Server::start_api().on(p);
    let (_, admin) = s.admin();
    let auth = format!("Bearer {admin}");
    let r = s.call(
        "GET",
        "/api/users",
        &[("Authorization", &auth), ("Accept", "application/vnd.forkd+json; version=1")],
        b"",
    );
    let d = s.expect_data(&r, 200, "Accept: application/vnd.forkd+json; version=1");
    ensure!(s, d["items"].is_array(), "paginated list: {d}");
    let r = s.call(
        "GET",
        "/api/users",
        &[("Authorization", &auth), ("Accept", "application/vnd.forkd+json; version=2")],
        b"",
    );
    s.expect_err(&r, 400, "BAD_REQUEST", "Accept: application/vnd.forkd+json; version=2");
    let r = s.call("GET", "/api/users", &[("Authorization", &auth), ("Accept", "application/json")], b"");
    s.expect_data(&r, 200, "Accept: application/json (default version 1)");
}

protocols!(v2_paths_do_not_exist);
fn v2_paths_do_not_exist(p: Proto) {
    let s = Server::start_api().on(p);
    let (_, admin) = s.admin();
    let r = s.api("GET", "/api/v2/users", Some(&admin), None);
    s.expect_err(&r, 404, "NOT_FOUND", "GET /api/v2/users");
    let r =
        s.api("POST", "/api/v2/users", None, Some(&json!({"name": "V2", "email": unique_email("v2"), "password": PW})));
    s.expect_err(&r, 404, "NOT_FOUND", "POST /api/v2/users");
    let r = s.api("POST", "/api/v2/auth/login", None, Some(&json!({"email": "a@x.io", "password": PW})));
    s.expect_err(&r, 404, "NOT_FOUND", "POST /api/v2/auth/login");
}
