//! Posts (CONTRACT §5): `/api/v1/users/{id}/posts` (list newest first, create by the owner)
//! and `/api/v1/posts/{id}` (read by anyone with a bearer, writes by the owner or an admin).

use serde_json::{json, Value};

use crate::util::*;

fn id_of(v: &Value) -> i64 {
    v["id"].as_i64().unwrap_or_else(|| panic!("no integer id in {v}"))
}

fn create_post(s: &Server, token: &str, user_id: i64, title: &str, body: &str) -> Value {
    let r = s.api(
        "POST",
        &format!("/api/v1/users/{user_id}/posts"),
        Some(token),
        Some(&json!({"title": title, "body": body})),
    );
    s.expect_data(&r, 201, &format!("create post {title:?}"))
}

fn post_count(s: &Server, token: &str, user_id: i64) -> i64 {
    let r = s.api("GET", &format!("/api/v1/users/{user_id}/posts"), Some(token), None);
    s.expect_data(&r, 200, "list posts")["total"].as_i64().unwrap_or_else(|| panic!("no total in {r:?}"))
}

protocols!(owner_creates_a_post_201_with_location_and_fields);
fn owner_creates_a_post_201_with_location_and_fields(p: Proto) {
    let s = Server::start_api().on(p);
    let (u, token) = s.user("Writer");
    let uid = id_of(&u);
    let r = s.api(
        "POST",
        &format!("/api/v1/users/{uid}/posts"),
        Some(&token),
        Some(&json!({"title": "Hello", "body": "First post"})),
    );
    let p = s.expect_data(&r, 201, "create post");
    let pid = id_of(&p);
    let loc = format!("/api/v1/posts/{pid}");
    ensure_eq!(s, r.header("location"), Some(loc.as_str()), "Location of a new post in {r:?}");
    ensure_eq!(
        s,
        (p["userId"].as_i64(), p["title"].as_str(), p["body"].as_str()),
        (Some(uid), Some("Hello"), Some("First post")),
        "post fields: {p}"
    );
    for k in ["createdAt", "updatedAt"] {
        ensure!(s, p[k].as_str().is_some_and(is_rfc3339_utc), "post {k} must be RFC 3339 UTC: {p}");
    }
    let g = s.expect_data(&s.api("GET", &loc, Some(&token), None), 200, "GET the new post");
    ensure_eq!(s, g, p, "GET {loc} returns the post as created");
    let (_, reader) = s.user("Reader");
    let g = s.expect_data(&s.api("GET", &loc, Some(&reader), None), 200, "GET a post as another user");
    ensure_eq!(s, id_of(&g), pid, "any bearer may read a post");
}

protocols!(only_the_owner_may_post_and_a_token_of_no_account_is_401);
fn only_the_owner_may_post_and_a_token_of_no_account_is_401(p: Proto) {
    let s = Server::start_api().on(p);
    let (owner, owner_token) = s.user("Owner");
    let (_, other) = s.user("Intruder");
    let uid = id_of(&owner);
    let r = s.api(
        "POST",
        &format!("/api/v1/users/{uid}/posts"),
        Some(&other),
        Some(&json!({"title": "Not mine", "body": ""})),
    );
    s.expect_err(&r, 403, "FORBIDDEN", "POST a post for someone else");
    ensure_eq!(s, post_count(&s, &owner_token, uid), 0, "the refused post is not stored");
    // Unknown user. Its "owner" is a correctly signed token for an id that does not exist
    // (forged with the known secret), or the token of a user who has since been deleted: a
    // token stands for an account, and neither has one (401, as for any void token).
    let ghost = jwt_sign(
        &json!({"alg": "HS256", "typ": "JWT"}),
        &good_claims(999_999, "user"),
        "HS256",
        TEST_JWT_SECRET.as_bytes(),
    );
    let r = s.api("POST", "/api/v1/users/999999/posts", Some(&ghost), Some(&json!({"title": "Ghost", "body": ""})));
    s.expect_err(&r, 401, "UNAUTHORIZED", "POST a post for an unknown user (as that id)");
    let (gone, gone_token) = s.user("Gone");
    let gone_id = id_of(&gone);
    let r = s.api("DELETE", &format!("/api/v1/users/{gone_id}"), Some(&gone_token), None);
    ensure_eq!(s, r.status, 204, "DELETE self: {r:?}");
    let r = s.api(
        "POST",
        &format!("/api/v1/users/{gone_id}/posts"),
        Some(&gone_token),
        Some(&json!({"title": "Ghost", "body": ""})),
    );
    s.expect_err(&r, 401, "UNAUTHORIZED", "POST a post for a deleted user (with its still-unexpired token)");
    // Another caller posting for an unknown id: the contract does not order the owner
    // check and the existence check, so 403 (not the owner) or 404 (no such user).
    let r =
        s.api("POST", "/api/v1/users/999999/posts", Some(&owner_token), Some(&json!({"title": "Ghost", "body": ""})));
    ensure!(
        s,
        r.status == 403 || r.status == 404,
        "POST a post for an unknown user as someone else: 403 or 404, got {r:?}"
    );
    let r = s.api("GET", "/api/v1/users/999999/posts", Some(&owner_token), None);
    s.expect_err(&r, 404, "NOT_FOUND", "GET posts of an unknown user");
    let r = s.api("GET", "/api/v1/users/abc/posts", Some(&owner_token), None);
    s.expect_err(&r, 404, "NOT_FOUND", "GET posts of a non-numeric user id");
}

protocols!(post_validation_boundaries);
fn post_validation_boundaries(p: Proto) {
    let s = Server::start_api().on(p);
    let (u, token) = s.user("Validator");
    let uid = id_of(&u);
    let path = format!("/api/v1/users/{uid}/posts");
    let bad: Vec<(Value, &[&str], &str)> = vec![
        (json!({"title": "", "body": "x"}), &["title"], "empty title"),
        (json!({"title": "t".repeat(201), "body": "x"}), &["title"], "201-character title"),
        (json!({"body": "x"}), &["title"], "missing title"),
        (json!({"title": 5, "body": "x"}), &["title"], "numeric title"),
        (json!({"title": "ok", "body": "b".repeat(10_001)}), &["body"], "10 001-character body"),
        (json!({"title": "ok", "body": 7}), &["body"], "numeric body"),
        (json!({"title": "ok", "body": "x", "userId": 1}), &["userId"], "unknown key userId"),
        (json!({"title": "ok", "body": "x", "__proto__": {"admin": true}}), &["__proto__"], "unknown key __proto__"),
        (json!({"title": "", "body": "b".repeat(10_001)}), &["title", "body"], "both bad"),
    ];
    for (b, fields, what) in &bad {
        let r = s.api("POST", &path, Some(&token), Some(b));
        s.expect_invalid(&r, fields, what);
    }
    ensure_eq!(s, post_count(&s, &token, uid), 0, "no invalid post stored");
    let good = [
        ("t".repeat(200), "x".to_string(), "200-character title"),
        ("x".to_string(), String::new(), "empty body"),
        ("ok".to_string(), "b".repeat(10_000), "10 000-character body"),
        ("é".repeat(200), "ü".repeat(1000), "multi-byte title of 200 characters"),
    ];
    for (title, body, what) in &good {
        let p = create_post(&s, &token, uid, title, body);
        ensure_eq!(
            s,
            (p["title"].as_str(), p["body"].as_str()),
            (Some(title.as_str()), Some(body.as_str())),
            "{what} stored as sent"
        );
    }
    ensure_eq!(s, post_count(&s, &token, uid), good.len() as i64, "every valid post stored");
    let r = s.call(
        "POST",
        &path,
        &[("Authorization", &format!("Bearer {token}")), ("Content-Type", "text/plain")],
        b"{\"title\":\"t\",\"body\":\"\"}",
    );
    s.expect_err(&r, 415, "UNSUPPORTED_MEDIA_TYPE", "post as text/plain");
}

protocols!(user_posts_are_paginated_newest_first);
fn user_posts_are_paginated_newest_first(p: Proto) {
    let s = Server::start_api().on(p);
    let (u, token) = s.user("Blogger");
    let (other, other_token) = s.user("Neighbour");
    let uid = id_of(&u);
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(id_of(&create_post(&s, &token, uid, &format!("post {i}"), "")));
    }
    create_post(&s, &other_token, id_of(&other), "not in the list", "");
    let newest_first: Vec<i64> = ids.iter().rev().copied().collect();
    let r = s.api("GET", &format!("/api/v1/users/{uid}/posts"), Some(&other_token), None);
    let d = s.expect_data(&r, 200, "list posts");
    let got: Vec<i64> = d["items"].as_array().unwrap().iter().map(id_of).collect();
    ensure_eq!(s, got, newest_first, "posts newest first, only this user's");
    ensure_eq!(
        s,
        (d["total"].as_i64(), d["page"].as_i64(), d["totalPages"].as_i64()),
        (Some(5), Some(1), Some(1)),
        "pagination fields: {d}"
    );
    ensure!(
        s,
        d["items"].as_array().unwrap().iter().all(|p| p["userId"].as_i64() == Some(uid)),
        "userId of listed posts: {d}"
    );
    let r = s.api("GET", &format!("/api/v1/users/{uid}/posts?limit=2&page=2"), Some(&token), None);
    let d = s.expect_data(&r, 200, "list posts page 2 of 3");
    let got: Vec<i64> = d["items"].as_array().unwrap().iter().map(id_of).collect();
    ensure_eq!(s, got, newest_first[2..4].to_vec(), "page 2 with limit 2");
    ensure_eq!(
        s,
        (d["total"].as_i64(), d["pageSize"].as_i64(), d["totalPages"].as_i64()),
        (Some(5), Some(2), Some(3)),
        "pagination: {d}"
    );
    let r = s.api("GET", &format!("/api/v1/users/{uid}/posts?limit=2&page=4"), Some(&token), None);
    let d = s.expect_data(&r, 200, "past the last page");
    ensure_eq!(s, d["items"].as_array().map(Vec::len), Some(0), "page 4 of 3 is empty: {d}");
    for q in ["page=0", "limit=0", "limit=101", "page=x"] {
        let r = s.api("GET", &format!("/api/v1/users/{uid}/posts?{q}"), Some(&token), None);
        s.expect_err(&r, 400, "BAD_REQUEST", &format!("posts list ?{q}"));
    }
}

protocols!(post_writes_by_owner_or_admin_others_403);
fn post_writes_by_owner_or_admin_others_403(p: Proto) {
    let s = Server::start_api().on(p);
    let (u, token) = s.user("Author");
    let (_, other) = s.user("Vandal");
    let (_, admin) = s.admin();
    let p = create_post(&s, &token, id_of(&u), "Original", "text");
    let path = format!("/api/v1/posts/{}", id_of(&p));

    let r = s.api("PATCH", &path, Some(&other), Some(&json!({"title": "Defaced"})));
    s.expect_err(&r, 403, "FORBIDDEN", "PATCH someone else's post");
    let r = s.api("DELETE", &path, Some(&other), None);
    s.expect_err(&r, 403, "FORBIDDEN", "DELETE someone else's post");
    let g = s.expect_data(&s.api("GET", &path, Some(&other), None), 200, "GET after refused writes");
    ensure_eq!(s, g, p, "refused writes change nothing");

    let r = s.api("PATCH", &path, Some(&token), Some(&json!({"title": "Edited"})));
    let d = s.expect_data(&r, 200, "PATCH own post");
    ensure_eq!(s, (d["title"].as_str(), d["body"].as_str()), (Some("Edited"), Some("text")), "PATCH title only");
    let r = s.api("PATCH", &path, Some(&token), Some(&json!({"title": ""})));
    s.expect_invalid(&r, &["title"], "PATCH empty title");
    let r = s.api("PATCH", &path, Some(&admin), Some(&json!({"body": "moderated"})));
    let d = s.expect_data(&r, 200, "PATCH by an admin");
    ensure_eq!(
        s,
        (d["title"].as_str(), d["body"].as_str()),
        (Some("Edited"), Some("moderated")),
        "admin PATCH body only"
    );

    let auth = format!("Bearer {token}");
    s.expect_bodyless("DELETE", &path, &[("Authorization", &auth)], 204, "DELETE own post");
    let r = s.api("GET", &path, Some(&token), None);
    s.expect_err(&r, 404, "NOT_FOUND", "GET a deleted post");

    let p2 = create_post(&s, &token, id_of(&u), "Second", "");
    let path2 = format!("/api/v1/posts/{}", id_of(&p2));
    let admin_auth = format!("Bearer {admin}");
    s.expect_bodyless("DELETE", &path2, &[("Authorization", &admin_auth)], 204, "admin DELETE a post");
    let r = s.api("GET", &path2, Some(&token), None);
    s.expect_err(&r, 404, "NOT_FOUND", "GET a post deleted by an admin");
}

protocols!(unknown_post_is_404_and_posts_need_a_bearer);
fn unknown_post_is_404_and_posts_need_a_bearer(p: Proto) {
    let s = Server::start_api().on(p);
    let (u, token) = s.user("Someone");
    let p = create_post(&s, &token, id_of(&u), "t", "b");
    for path in ["/api/v1/posts/999999", "/api/v1/posts/abc"] {
        let r = s.api("GET", path, Some(&token), None);
        s.expect_err(&r, 404, "NOT_FOUND", &format!("GET {path}"));
    }
    let r = s.api("PATCH", "/api/v1/posts/999999", Some(&token), Some(&json!({"title": "x"})));
    s.expect_err(&r, 404, "NOT_FOUND", "PATCH an unknown post");
    let r = s.api("DELETE", "/api/v1/posts/999999", Some(&token), None);
    s.expect_err(&r, 404, "NOT_FOUND", "DELETE an unknown post");
    let uid = id_of(&u);
    let cases = [
        ("GET", format!("/api/v1/users/{uid}/posts"), None),
        ("POST", format!("/api/v1/users/{uid}/posts"), Some(json!({"title": "t", "body": ""}))),
        ("GET", format!("/api/v1/posts/{}", id_of(&p)), None),
        ("PATCH", format!("/api/v1/posts/{}", id_of(&p)), Some(json!({"title": "t"}))),
        ("DELETE", format!("/api/v1/posts/{}", id_of(&p)), None),
    ];
    for (m, path, body) in &cases {
        let r = s.api(m, path, None, body.as_ref());
        let v = s.expect_err(&r, 401, "UNAUTHORIZED", &format!("{m} {path} without a bearer"));
        ensure_eq!(s, v["message"].as_str(), Some("token required"), "{m} {path}: 401 message");
    }
    ensure_eq!(s, post_count(&s, &token, uid), 1, "nothing changed without a bearer");
}
