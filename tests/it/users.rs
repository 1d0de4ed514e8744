//! Users resource (CONTRACT §3 envelopes, §5 users): sign-up and its validation, the
//! hostile-input cases (prototype-pollution keys, SQL metacharacters, bad bodies), the
//! list with its filters / sort / pagination, GET with ETag, PUT, PATCH with If-Match,
//! role changes, and DELETE.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::util::*;

const PW: &str = "user-password-1";

fn signup_body(name: &str, email: &str) -> Value {
    json!({"name": name, "email": email, "password": PW})
}

fn id_of(u: &Value) -> i64 {
    u["id"].as_i64().unwrap_or_else(|| panic!("user without an integer id: {u}"))
}

fn names(items: &Value) -> Vec<String> {
    items.as_array().unwrap().iter().map(|u| u["name"].as_str().unwrap_or("").to_string()).collect()
}

/// `GET /api/v1/users?<query>` → data (asserts 200).
fn list(s: &Server, token: &str, query: &str) -> Value {
    let r = s.api("GET", &format!("/api/v1/users?{query}"), Some(token), None);
    let d = s.expect_data(&r, 200, &format!("GET /api/v1/users?{query}"));
    ensure!(s, d["items"].is_array(), "GET /api/v1/users?{query}: data.items must be an array: {d}");
    d
}

/// Comparable key of an RFC 3339 UTC timestamp: (seconds part, fraction padded to 9 digits).
fn ts_key(s: &str) -> (String, String) {
    let frac: String = s.get(20..).unwrap_or("").chars().take_while(char::is_ascii_digit).collect();
    (s[..19].to_string(), format!("{frac:0<9}"))
}

// ---------------------------------------------------------------------------------------
// Sign-up
// ---------------------------------------------------------------------------------------

protocols!(signup_returns_201_location_and_the_user_without_any_secret);
fn signup_returns_201_location_and_the_user_without_any_secret(p: Proto) {
    let s = Server::start_api().on(p);
    let email = unique_email("ann");
    let r =
        s.api("POST", "/api/v1/users", None, Some(&json!({"name": "Ann", "email": email, "password": PW, "age": 33})));
    let u = s.expect_data(&r, 201, "sign-up");
    let id = id_of(&u);
    let loc = format!("/api/v1/users/{id}");
    ensure_eq!(s, r.header("location"), Some(loc.as_str()), "sign-up Location in {r:?}");
    ensure!(s, user_shape_problems(&u).is_empty(), "sign-up user shape: {:?} in {u}", user_shape_problems(&u));
    ensure_eq!(
        s,
        (u["name"].as_str(), u["email"].as_str(), u["age"].as_i64(), u["role"].as_str()),
        (Some("Ann"), Some(email.as_str()), Some(33), Some("user")),
        "sign-up echoes the user"
    );
    ensure!(s, !leaks_secret(&r.body_str(), PW), "sign-up response leaks a password or hash: {r:?}");

    let u2 = s.signup("Bo", &unique_email("bo"), PW, None);
    ensure!(s, u2["age"].is_null() && u2.as_object().unwrap().contains_key("age"), "age omitted → null: {u2}");

    let (_, admin) = s.admin();
    let g = s.api("GET", &loc, Some(&admin), None);
    let gu = s.expect_data(&g, 200, "GET the new user");
    ensure_eq!(s, gu, u, "GET {loc} returns the user as created");
    ensure!(s, !leaks_secret(&g.body_str(), PW), "GET user leaks a secret: {g:?}");
    let l = s.api("GET", "/api/v1/users?limit=100", Some(&admin), None);
    let d = s.expect_data(&l, 200, "list users");
    ensure!(s, !leaks_secret(&l.body_str(), PW), "list leaks a secret: {l:?}");
    for it in d["items"].as_array().unwrap() {
        ensure!(s, user_shape_problems(it).is_empty(), "list item shape {:?}: {it}", user_shape_problems(it));
    }
    let me = s.api("GET", "/api/v1/auth/me", Some(&admin), None);
    ensure!(
        s,
        me.status == 200 && !leaks_secret(&me.body_str(), "admin-password-1"),
        "/auth/me leaks a secret: {me:?}"
    );
}

protocols!(signup_validation_lists_every_bad_field_at_once_and_stores_nothing);
fn signup_validation_lists_every_bad_field_at_once_and_stores_nothing(p: Proto) {
    let s = Server::start_api().on(p);
    let (_, admin) = s.admin();
    let before = s.user_total(&admin, "");
    let r = s.api(
        "POST",
        "/api/v1/users",
        None,
        Some(&json!({"name": "", "email": "nope", "age": 151, "password": "short"})),
    );
    let v = s.expect_invalid(&r, &["name", "email", "age", "password"], "four bad fields");
    for e in v["errors"].as_array().unwrap() {
        ensure!(s, e["field"].is_string() && e["message"].is_string(), "each error is {{field, message}}: {e}");
    }
    let r = s.api("POST", "/api/v1/users", None, Some(&json!({})));
    s.expect_invalid(&r, &["name", "email", "password"], "empty object: every required field missing");
    let r = s.api("POST", "/api/v1/users", None, Some(&json!({"name": 5, "email": ["a@x.io"], "password": true})));
    s.expect_invalid(&r, &["name", "email", "password"], "wrong JSON types");
    ensure_eq!(s, s.user_total(&admin, ""), before, "a 422 must store nothing");
}

protocols!(signup_field_boundaries);
fn signup_field_boundaries(p: Proto) {
    let s = Server::start_api().on(p);
    let (_, admin) = s.admin();
    let before = s.user_total(&admin, "");
    let long_local = "a".repeat(64);
    let email_of_len = |n: usize| {
        // 64 + "@" + labels: total n (valid labels ≤ 63).
        let domain_len = n - 65;
        let last = domain_len - (63 + 1 + 63 + 1) - 4;
        format!("{long_local}@{}.{}.{}.com", "b".repeat(63), "c".repeat(63), "d".repeat(last))
    };
    let e254 = email_of_len(254);
    let e255 = email_of_len(255);
    assert_eq!((e254.len(), e255.len()), (254, 255));

    let bad: Vec<(&str, Value, &str)> = vec![
        ("name", json!(""), "empty name"),
        ("name", json!("n".repeat(101)), "101-character name"),
        ("name", json!("é".repeat(101)), "101-character (202-byte) name"),
        ("name", json!(42), "numeric name"),
        ("email", json!("nope"), "no @"),
        ("email", json!("a@"), "no domain"),
        ("email", json!("@x.io"), "no local part"),
        ("email", json!("a b@x.io"), "space in the address"),
        ("email", json!(e255), "255-character address"),
        ("age", json!(-1), "age -1"),
        ("age", json!(151), "age 151"),
        ("age", json!(1.5), "age 1.5"),
        ("age", json!("20"), "age \"20\""),
        ("password", json!("1234567"), "7-character password"),
        ("password", json!("p".repeat(129)), "129-character password"),
        ("password", json!(12345678), "numeric password"),
    ];
    for (field, value, what) in &bad {
        let mut b = signup_body("Valid", &unique_email("bad"));
        b[*field] = value.clone();
        let r = s.api("POST", "/api/v1/users", None, Some(&b));
        let v = s.expect_invalid(&r, &[field], what);
        let named = error_fields(&v);
        ensure!(s, named.iter().all(|f| f == field), "{what}: only {field:?} is bad, errors named {named:?}");
    }
    ensure_eq!(s, s.user_total(&admin, ""), before, "no bad sign-up may be stored");

    let good: Vec<(&str, Value, &str)> = vec![
        ("name", json!("n".repeat(100)), "100-character name"),
        ("name", json!("é".repeat(100)), "100-character (200-byte) name"),
        ("name", json!("x"), "1-character name"),
        ("email", json!(e254), "254-character address"),
        ("age", json!(0), "age 0"),
        ("age", json!(150), "age 150"),
        ("password", json!("12345678"), "8-character password"),
        ("password", json!("p".repeat(128)), "128-character password"),
    ];
    for (field, value, what) in &good {
        let mut b = signup_body("Valid", &unique_email("good"));
        b[*field] = value.clone();
        let r = s.api("POST", "/api/v1/users", None, Some(&b));
        let u = s.expect_data(&r, 201, what);
        if *field != "password" {
            ensure_eq!(s, &u[*field], value, "{what}: echoed value");
        }
    }
    ensure_eq!(s, s.user_total(&admin, ""), before + good.len() as i64, "every good sign-up stored once");
}

protocols!(age_written_as_a_whole_float_is_that_integer);
/// Found by Schemathesis: `30.0` is an integer to JSON Schema (and to any
/// JavaScript client), so the documented `age` accepts it as 30; `30.5` stays 422.
fn age_written_as_a_whole_float_is_that_integer(p: Proto) {
    let s = Server::start_api().on(p);
    let mut b = signup_body("Floaty", &unique_email("float"));
    b["age"] = json!(30.0);
    let r = s.api("POST", "/api/v1/users", None, Some(&b));
    let u = s.expect_data(&r, 201, "age 30.0");
    ensure_eq!(s, u["age"].as_i64(), Some(30), "age stored as the integer 30: {u}");
    let mut b = signup_body("Floaty", &unique_email("float"));
    b["age"] = json!(30.5);
    let r = s.api("POST", "/api/v1/users", None, Some(&b));
    s.expect_invalid(&r, &["age"], "age 30.5");
}

protocols!(unknown_keys_including_prototype_pollution_names_are_422_and_store_nothing);
fn unknown_keys_including_prototype_pollution_names_are_422_and_store_nothing(p: Proto) {
    let s = Server::start_api().on(p);
    let (_, admin) = s.admin();
    let before = s.user_total(&admin, "");
    let mut emails = Vec::new();
    for key in ["__proto__", "constructor", "prototype", "isAdmin"] {
        let email = unique_email("proto");
        let mut b = signup_body("Mallory", &email);
        b[key] = json!({"role": "admin", "isAdmin": true});
        let r = s.api("POST", "/api/v1/users", None, Some(&b));
        s.expect_invalid(&r, &[key], &format!("unknown key {key:?}"));
        emails.push(email);
    }
    // All at once, as raw text (serde_json keeps `__proto__` as a plain key anyway).
    let email = unique_email("proto");
    let raw = format!(
        r#"{{"name":"Mallory","email":"{email}","password":"{PW}","__proto__":{{"role":"admin"}},"constructor":{{"prototype":{{"role":"admin"}}}},"prototype":1,"isAdmin":true}}"#
    );
    let r = s.call("POST", "/api/v1/users", &[("Content-Type", "application/json")], raw.as_bytes());
    s.expect_invalid(&r, &["__proto__", "constructor", "prototype", "isAdmin"], "four unknown keys at once");
    emails.push(email);
    ensure_eq!(s, s.user_total(&admin, ""), before, "nothing stored after the 422s");
    for e in &emails {
        let r = s.api("POST", "/api/v1/auth/login", None, Some(&json!({"email": e, "password": PW})));
        s.expect_err(&r, 401, "UNAUTHORIZED", &format!("login as the refused {e}"));
    }
}

protocols!(role_admin_at_signup_needs_an_admin_bearer);
fn role_admin_at_signup_needs_an_admin_bearer(p: Proto) {
    let s = Server::start_api().on(p);
    let (_, admin) = s.admin();
    let (_, user_token) = s.user("Plain User");
    let before = s.user_total(&admin, "");
    let mut b = signup_body("Wannabe", &unique_email("wannabe"));
    b["role"] = json!("admin");
    let r = s.api("POST", "/api/v1/users", None, Some(&b));
    s.expect_err(&r, 403, "FORBIDDEN", "role admin without a bearer");
    let r = s.api("POST", "/api/v1/users", Some(&user_token), Some(&b));
    s.expect_err(&r, 403, "FORBIDDEN", "role admin with a user's bearer");
    ensure_eq!(s, s.user_total(&admin, ""), before, "refused sign-ups store nothing");
    let r = s.api("POST", "/api/v1/users", Some(&admin), Some(&b));
    let u = s.expect_data(&r, 201, "role admin with an admin's bearer");
    ensure_eq!(s, u["role"].as_str(), Some("admin"), "created as admin: {u}");
    let (t, _, _) = s.login(b["email"].as_str().unwrap(), PW);
    let (_, claims, _) = jwt_parts(&t);
    ensure_eq!(s, claims["role"].as_str(), Some("admin"), "the new admin's token role");
}

protocols!(duplicate_email_in_any_letter_case_is_409);
fn duplicate_email_in_any_letter_case_is_409(p: Proto) {
    let s = Server::start_api().on(p);
    let (_, admin) = s.admin();
    let email = unique_email("dup");
    s.signup("First", &email, PW, None);
    let before = s.user_total(&admin, "");
    for (e, what) in [
        (email.clone(), "same e-mail"),
        (email.to_uppercase(), "upper-case e-mail"),
        (format!("Dup{}", &email[3..]), "mixed case"),
    ] {
        let r = s.api("POST", "/api/v1/users", None, Some(&signup_body("Second", &e)));
        s.expect_err(&r, 409, "CONFLICT", what);
    }
    ensure_eq!(s, s.user_total(&admin, ""), before, "no duplicate stored");
}

// ---------------------------------------------------------------------------------------
// Hostile bodies
// ---------------------------------------------------------------------------------------

protocols!(malformed_json_is_400);
fn malformed_json_is_400(p: Proto) {
    let s = Server::start_api().on(p);
    for body in [&b"{\"name\":"[..], b"{name: \"x\"}", b"{\"a\":1,}", b"{\"name\":\"x\"} trailing", b"nul"] {
        let r = s.call("POST", "/api/v1/users", &[("Content-Type", "application/json")], body);
        s.expect_err(&r, 400, "BAD_REQUEST", &format!("malformed JSON {:?}", String::from_utf8_lossy(body)));
    }
}

protocols!(json_that_is_not_an_object_is_422);
fn json_that_is_not_an_object_is_422(p: Proto) {
    let s = Server::start_api().on(p);
    for body in ["[]", "\"x\"", "42", "[{\"name\":\"a\"}]"] {
        let r = s.call("POST", "/api/v1/users", &[("Content-Type", "application/json")], body.as_bytes());
        s.expect_err(&r, 422, "VALIDATION_ERROR", &format!("JSON {body} is not an object"));
    }
}

protocols!(body_that_is_not_application_json_is_415);
fn body_that_is_not_application_json_is_415(p: Proto) {
    let s = Server::start_api().on(p);
    let body = serde_json::to_vec(&signup_body("Tex", &unique_email("tex"))).unwrap();
    for ct in ["text/plain", "application/x-www-form-urlencoded", "application/jsonx"] {
        let r = s.call("POST", "/api/v1/users", &[("Content-Type", ct)], &body);
        let e = s.expect_err(&r, 415, "UNSUPPORTED_MEDIA_TYPE", &format!("Content-Type: {ct}"));
        // The message names the media type wanted.
        assert_eq!(e["message"], "Content-Type must be application/json", "Content-Type: {ct}: {r:?}");
    }
    let r = s.call("POST", "/api/v1/users", &[], &body);
    let e = s.expect_err(&r, 415, "UNSUPPORTED_MEDIA_TYPE", "no Content-Type");
    assert_eq!(e["message"], "Content-Type must be application/json", "no Content-Type: {r:?}");
    let r = s.call("POST", "/api/v1/users", &[("Content-Type", "application/json; charset=utf-8")], &body);
    s.expect_data(&r, 201, "Content-Type: application/json; charset=utf-8 is JSON");
}

protocols!(body_one_byte_over_json_body_bytes_is_413_and_at_the_limit_is_accepted);
fn body_one_byte_over_json_body_bytes_is_413_and_at_the_limit_is_accepted(p: Proto) {
    let s = Server::start_api().on(p);
    let pad = |email: &str, n: usize| {
        let mut b = serde_json::to_vec(&signup_body("Big", email)).unwrap();
        assert!(b.len() <= n);
        b.resize(n, b' '); // trailing JSON whitespace
        b
    };
    let r = s.call("POST", "/api/v1/users", &[("Content-Type", "application/json")], &pad(&unique_email("big"), 10241));
    s.expect_err(&r, 413, "PAYLOAD_TOO_LARGE", "10241-byte JSON body (limit 10240)");
    let r = s.call("POST", "/api/v1/users", &[("Content-Type", "application/json")], &pad(&unique_email("big"), 10240));
    s.expect_data(&r, 201, "10240-byte JSON body (exactly the limit)");
    s.assert_healthy();
}

protocols!(invalid_utf8_inside_a_json_string_is_400);
fn invalid_utf8_inside_a_json_string_is_400(p: Proto) {
    let s = Server::start_api().on(p);
    let mut body = b"{\"name\":\"bad \xff\xfe here\",\"email\":\"".to_vec();
    body.extend_from_slice(unique_email("utf").as_bytes());
    body.extend_from_slice(b"\",\"password\":\"user-password-1\"}");
    let r = s.call("POST", "/api/v1/users", &[("Content-Type", "application/json")], &body);
    s.expect_err(&r, 400, "BAD_REQUEST", "invalid UTF-8 in a JSON string");
    // An overlong encoding of '/' and a lone surrogate escape are not valid text either.
    let body = b"{\"name\":\"\xc0\xaf\",\"email\":\"o@x.io\",\"password\":\"user-password-1\"}";
    let r = s.call("POST", "/api/v1/users", &[("Content-Type", "application/json")], body);
    s.expect_err(&r, 400, "BAD_REQUEST", "overlong UTF-8 in a JSON string");
    s.assert_healthy();
}

protocols!(ten_thousand_deep_nested_arrays_are_400_and_the_worker_survives);
fn ten_thousand_deep_nested_arrays_are_400_and_the_worker_survives(p: Proto) {
    let s = Server::api_builder().set("limits", "json_body_bytes = 65536").start().on(p);
    let pid = s.debug_pid();
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let r = s.call("POST", "/api/v1/users", &[("Content-Type", "application/json")], deep.as_bytes());
    s.expect_err(&r, 400, "BAD_REQUEST", "10 000-deep nested arrays");
    let inner = format!(r#"{{"name":{deep},"email":"n@x.io","password":"user-password-1"}}"#);
    let r = s.call("POST", "/api/v1/users", &[("Content-Type", "application/json")], inner.as_bytes());
    s.expect_err(&r, 400, "BAD_REQUEST", "10 000-deep nested arrays as a field");
    let objs = format!("{}{}", "{\"a\":".repeat(5_000), "}".repeat(5_000));
    let r = s.call("POST", "/api/v1/users", &[("Content-Type", "application/json")], objs.as_bytes());
    s.expect_err(&r, 400, "BAD_REQUEST", "5 000-deep nested objects");
    ensure_eq!(s, s.debug_pid(), pid, "the worker must survive deep nesting (same pid)");
    s.signup("After", &unique_email("after"), PW, None);
}

protocols!(sql_metacharacters_are_data_in_bodies_and_query_parameters);
fn sql_metacharacters_are_data_in_bodies_and_query_parameters(p: Proto) {
    let s = Server::start_api().on(p);
    let (_, admin) = s.admin();
    let hostile_names = [
        "'; DROP TABLE users; --",
        "\" OR 1=1 --",
        "100% sure",
        "snake_case",
        "back\\slash",
        "Robert'); DELETE FROM users;--",
    ];
    let mut ids = Vec::new();
    for n in hostile_names {
        let u = s.signup(n, &unique_email("sqlname"), PW, None);
        ensure_eq!(s, u["name"].as_str(), Some(n), "name stored literally");
        ids.push(id_of(&u));
    }
    let locals = ["o'neil", "pct%sign", "under_score", "x'or'1'='1", "semi-;--"];
    let mut hostile_emails = Vec::new();
    for l in locals {
        let email = format!("{l}-{}@x.io", ids.len());
        let r = s.api("POST", "/api/v1/users", None, Some(&signup_body("Plain", &email)));
        if l.contains(';') {
            // `;` is not allowed unquoted in a local part: refusing it is fine, a 500 is not.
            ensure!(s, r.status == 201 || r.status == 422, "e-mail {email:?}: 201 or 422, got {r:?}");
            continue;
        }
        let u = s.expect_data(&r, 201, &format!("sign-up with e-mail {email:?}"));
        ensure_eq!(
            s,
            u["email"].as_str().map(str::to_ascii_lowercase),
            Some(email.to_ascii_lowercase()),
            "e-mail stored literally"
        );
        ids.push(id_of(&u));
        hostile_emails.push(email);
    }
    for id in &ids {
        let r = s.api("GET", &format!("/api/v1/users/{id}"), Some(&admin), None);
        s.expect_data(&r, 200, "GET a hostile-named user");
    }
    let total = s.user_total(&admin, "");
    // `q` is a literal substring, case-insensitive; `%`, `_` and `\` are not wildcards.
    let q_cases: [(&str, &[&str]); 7] = [
        ("'; DROP TABLE users; --", &["'; DROP TABLE users; --"]),
        ("\" OR 1=1 --", &["\" OR 1=1 --"]),
        ("%", &["100% sure"]),
        ("_", &["snake_case"]),
        ("\\", &["back\\slash"]),
        ("' OR '1'='1", &[]),
        ("'", &["'; DROP TABLE users; --", "Robert'); DELETE FROM users;--"]),
    ];
    for (q, want) in q_cases {
        let d = list(&s, &admin, &format!("q={}&limit=100", urlencode(q)));
        let got: BTreeSet<String> = names(&d["items"]).into_iter().collect();
        let want: BTreeSet<String> = want.iter().map(|x| x.to_string()).collect();
        ensure_eq!(s, got, want, "q={q:?} must match the literal substring only");
    }
    for (param, v) in [
        ("role", "' OR 1=1 --"),
        ("role", "user'--"),
        ("sort", "name; DROP TABLE users"),
        ("sort", "name--"),
        ("sort", "(SELECT 1)"),
        ("sort", "name desc"),
        ("page", "1 OR 1=1"),
        ("limit", "10; DROP TABLE users"),
    ] {
        let r = s.api("GET", &format!("/api/v1/users?{param}={}", urlencode(v)), Some(&admin), None);
        s.expect_err(&r, 400, "BAD_REQUEST", &format!("{param}={v:?}"));
    }
    ensure_eq!(s, s.user_total(&admin, ""), total, "the users table is intact");
    for e in &hostile_emails {
        s.login(e, PW);
    }
}

// ---------------------------------------------------------------------------------------
// List
// ---------------------------------------------------------------------------------------

protocols!(list_filters_by_role_and_by_name_substring_case_insensitively);
fn list_filters_by_role_and_by_name_substring_case_insensitively(p: Proto) {
    let s = Server::start_api().on(p);
    let (_, admin) = s.admin();
    for n in ["Alice Smith", "ALICIA Keys", "Bob", "Malice"] {
        s.signup(n, &unique_email("f"), PW, None);
    }
    for q in ["ali", "ALI", "aLi"] {
        let d = list(&s, &admin, &format!("q={q}"));
        let got: BTreeSet<String> = names(&d["items"]).into_iter().collect();
        let want: BTreeSet<String> = ["Alice Smith", "ALICIA Keys", "Malice"].iter().map(|x| x.to_string()).collect();
        ensure_eq!(s, got, want, "q={q}: names containing it, any case");
        ensure_eq!(s, d["total"].as_i64(), Some(3), "q={q}: total");
    }
    let d = list(&s, &admin, "role=admin");
    ensure_eq!(s, d["total"].as_i64(), Some(1), "role=admin total: {d}");
    ensure!(s, d["items"].as_array().unwrap().iter().all(|u| u["role"] == "admin"), "role=admin items: {d}");
    let d = list(&s, &admin, "role=user");
    ensure_eq!(s, d["total"].as_i64(), Some(4), "role=user total: {d}");
    ensure!(s, d["items"].as_array().unwrap().iter().all(|u| u["role"] == "user"), "role=user items: {d}");
    let d = list(&s, &admin, "role=user&q=bob");
    ensure_eq!(s, names(&d["items"]), vec!["Bob".to_string()], "role=user&q=bob");
    let d = list(&s, &admin, "role=admin&q=bob");
    ensure_eq!(s, d["total"].as_i64(), Some(0), "role=admin&q=bob");
}

protocols!(list_sorts_by_each_field_and_descending_with_a_minus);
fn list_sorts_by_each_field_and_descending_with_a_minus(p: Proto) {
    let s = Server::start_api().on(p);
    let (_, admin) = s.admin();
    let mut created = Vec::new();
    for (n, age) in [("Carol", 30), ("Alice", 25), ("Bob", 30), ("Dave", 20)] {
        let u = s.signup(n, &unique_email(&n.to_ascii_lowercase()), PW, Some(age));
        created.push(id_of(&u));
    }
    let order = |sort: &str| -> Vec<String> {
        names(&list(&s, &admin, &format!("role=user&sort={}", urlencode(sort)))["items"])
    };
    let v = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    ensure_eq!(s, order("name"), v(&["Alice", "Bob", "Carol", "Dave"]), "sort=name");
    ensure_eq!(s, order("-name"), v(&["Dave", "Carol", "Bob", "Alice"]), "sort=-name");
    ensure_eq!(s, order("email"), v(&["Alice", "Bob", "Carol", "Dave"]), "sort=email");
    ensure_eq!(s, order("-email"), v(&["Dave", "Carol", "Bob", "Alice"]), "sort=-email");
    ensure_eq!(s, order("-age,name"), v(&["Bob", "Carol", "Alice", "Dave"]), "sort=-age,name");
    ensure_eq!(s, order("age,-name"), v(&["Dave", "Alice", "Carol", "Bob"]), "sort=age,-name");
    ensure_eq!(s, order("id"), v(&["Carol", "Alice", "Bob", "Dave"]), "sort=id (creation order)");
    ensure_eq!(s, order("-id"), v(&["Dave", "Bob", "Alice", "Carol"]), "sort=-id");
    let d = list(&s, &admin, "role=user&sort=age");
    let ages: Vec<i64> = d["items"].as_array().unwrap().iter().map(|u| u["age"].as_i64().unwrap()).collect();
    ensure_eq!(s, ages, vec![20, 25, 30, 30], "sort=age ages");
    for (sort, desc) in [("createdAt", false), ("-createdAt", true)] {
        let d = list(&s, &admin, &format!("role=user&sort={sort}"));
        let ts: Vec<(String, String)> =
            d["items"].as_array().unwrap().iter().map(|u| ts_key(u["createdAt"].as_str().unwrap())).collect();
        let mut sorted = ts.clone();
        sorted.sort();
        if desc {
            sorted.reverse();
        }
        ensure_eq!(s, ts, sorted, "sort={sort}: createdAt order");
    }
}

protocols!(list_paginates_with_total_and_total_pages_at_the_edges);
fn list_paginates_with_total_and_total_pages_at_the_edges(p: Proto) {
    let s = Server::start_api().on(p);
    let (_, admin) = s.admin();
    let d = list(&s, &admin, "q=zz-no-such-name");
    ensure_eq!(
        s,
        (d["items"].as_array().map(Vec::len), d["total"].as_i64(), d["totalPages"].as_i64(), d["page"].as_i64()),
        (Some(0), Some(0), Some(0), Some(1)),
        "no match: {d}"
    );
    for i in 0..21 {
        s.signup(&format!("Member {i:02}"), &unique_email("member"), PW, Some(20 + i));
    }
    let d = list(&s, &admin, "role=user");
    ensure_eq!(
        s,
        (
            d["items"].as_array().map(Vec::len),
            d["total"].as_i64(),
            d["page"].as_i64(),
            d["pageSize"].as_i64(),
            d["totalPages"].as_i64()
        ),
        (Some(20), Some(21), Some(1), Some(20), Some(2)),
        "21 users, defaults (page 1, limit 20): {d}"
    );
    let p1: BTreeSet<i64> = d["items"].as_array().unwrap().iter().map(id_of).collect();
    let d2 = list(&s, &admin, "role=user&page=2");
    ensure_eq!(
        s,
        (d2["items"].as_array().map(Vec::len), d2["page"].as_i64(), d2["totalPages"].as_i64()),
        (Some(1), Some(2), Some(2)),
        "page 2: {d2}"
    );
    let p2: BTreeSet<i64> = d2["items"].as_array().unwrap().iter().map(id_of).collect();
    ensure!(
        s,
        p1.is_disjoint(&p2) && p1.len() + p2.len() == 21,
        "pages 1 and 2 must partition the 21 users: {p1:?} {p2:?}"
    );
    let d3 = list(&s, &admin, "role=user&page=3");
    ensure_eq!(
        s,
        (d3["items"].as_array().map(Vec::len), d3["total"].as_i64(), d3["page"].as_i64(), d3["totalPages"].as_i64()),
        (Some(0), Some(21), Some(3), Some(2)),
        "page past the end: {d3}"
    );
    let d = list(&s, &admin, "role=user&limit=5&page=5");
    ensure_eq!(
        s,
        (d["items"].as_array().map(Vec::len), d["totalPages"].as_i64(), d["pageSize"].as_i64()),
        (Some(1), Some(5), Some(5)),
        "limit=5&page=5: {d}"
    );
    let d = list(&s, &admin, "role=user&limit=100");
    ensure_eq!(
        s,
        (d["items"].as_array().map(Vec::len), d["totalPages"].as_i64()),
        (Some(21), Some(1)),
        "limit=100: {d}"
    );
    let d = list(&s, &admin, "role=user&limit=1");
    ensure_eq!(s, (d["items"].as_array().map(Vec::len), d["totalPages"].as_i64()), (Some(1), Some(21)), "limit=1: {d}");
    let d = list(&s, &admin, "role=user&limit=7");
    ensure_eq!(s, d["totalPages"].as_i64(), Some(3), "21 users / 7 per page");
}

protocols!(list_rejects_bad_query_parameters_with_400_and_errors);
fn list_rejects_bad_query_parameters_with_400_and_errors(p: Proto) {
    let s = Server::start_api().on(p);
    let (_, admin) = s.admin();
    for (param, v) in [
        ("sort", "password"),
        ("sort", "passwordHash"),
        ("sort", "nope"),
        ("sort", "name,bogus"),
        ("sort", "-"),
        ("page", "0"),
        ("page", "-1"),
        ("page", "abc"),
        ("page", "1.5"),
        ("limit", "0"),
        ("limit", "101"),
        ("limit", "abc"),
        ("role", "root"),
        ("role", ""),
    ] {
        let what = format!("GET /api/v1/users?{param}={v}");
        let r = s.api("GET", &format!("/api/v1/users?{param}={}", urlencode(v)), Some(&admin), None);
        let body = s.expect_err(&r, 400, "BAD_REQUEST", &what);
        let fields = error_fields(&body);
        ensure!(s, fields.iter().any(|f| f == param), "{what}: `errors` must name {param:?}, got {body}");
    }
    for q in ["limit=1", "limit=100", "page=1", "sort=-createdAt,name", "role=admin", "role=user"] {
        list(&s, &admin, q);
    }
}

// ---------------------------------------------------------------------------------------
// One user: GET / ETag, PUT, PATCH, DELETE
// ---------------------------------------------------------------------------------------

protocols!(get_user_has_a_strong_etag_and_if_none_match_gives_304);
fn get_user_has_a_strong_etag_and_if_none_match_gives_304(p: Proto) {
    let s = Server::start_api().on(p);
    let (u, token) = s.user("Etta");
    let path = format!("/api/v1/users/{}", id_of(&u));
    let r = s.api("GET", &path, Some(&token), None);
    s.expect_data(&r, 200, "GET user");
    let etag = r.header("etag").unwrap_or_else(|| panic!("GET user without ETag: {r:?}\n{}", s.log_tail())).to_string();
    ensure!(s, etag.len() >= 3 && etag.starts_with('"') && etag.ends_with('"'), "strong quoted ETag, got {etag:?}");
    let r2 = s.api("GET", &path, Some(&token), None);
    ensure_eq!(s, r2.header("etag"), Some(etag.as_str()), "same resource, same ETag");
    let auth = format!("Bearer {token}");
    let r = s.expect_bodyless(
        "GET",
        &path,
        &[("Authorization", &auth), ("If-None-Match", &etag)],
        304,
        "If-None-Match: current ETag",
    );
    ensure_eq!(s, r.header("etag"), Some(etag.as_str()), "a 304 repeats the ETag");
    let r = s.call("GET", &path, &[("Authorization", &auth), ("If-None-Match", "\"something-else\"")], b"");
    s.expect_data(&r, 200, "If-None-Match: another ETag");
    let r = s.call("GET", &path, &[("Authorization", &auth), ("If-None-Match", &format!("\"x\", {etag}"))], b"");
    ensure_eq!(s, r.status, 304, "If-None-Match list containing the ETag: {r:?}");
    // A change makes a new ETag; the old one no longer matches.
    let r = s.api("PATCH", &path, Some(&token), Some(&json!({"name": "Etta Changed"})));
    s.expect_data(&r, 200, "PATCH name");
    let r = s.call("GET", &path, &[("Authorization", &auth), ("If-None-Match", &etag)], b"");
    let d = s.expect_data(&r, 200, "If-None-Match: the old ETag after a change");
    ensure_eq!(s, d["name"].as_str(), Some("Etta Changed"), "the changed user");
    ensure!(s, r.header("etag").is_some_and(|e| e != etag), "new ETag after a change: {r:?}");
}

protocols!(unknown_or_non_numeric_user_id_is_404);
fn unknown_or_non_numeric_user_id_is_404(p: Proto) {
    let s = Server::start_api().on(p);
    let (_, token) = s.user("Finder");
    for p in ["/api/v1/users/999999", "/api/v1/users/abc", "/api/v1/users/0", "/api/v1/users/1abc"] {
        let r = s.api("GET", p, Some(&token), None);
        let v = s.expect_err(&r, 404, "NOT_FOUND", &format!("GET {p}"));
        ensure_eq!(s, v["message"].as_str(), Some("resource not found"), "404 message for {p}");
    }
    let (_, admin) = s.admin();
    let r =
        s.api("PUT", "/api/v1/users/999999", Some(&admin), Some(&json!({"name": "N", "email": "n@x.io", "age": 1})));
    s.expect_err(&r, 404, "NOT_FOUND", "PUT unknown id as admin");
    let r = s.api("PATCH", "/api/v1/users/999999", Some(&admin), Some(&json!({"age": 1})));
    s.expect_err(&r, 404, "NOT_FOUND", "PATCH unknown id as admin");
    let r = s.api("DELETE", "/api/v1/users/999999", Some(&admin), None);
    s.expect_err(&r, 404, "NOT_FOUND", "DELETE unknown id as admin");
}

protocols!(put_replaces_name_email_age_for_self_and_admin);
fn put_replaces_name_email_age_for_self_and_admin(p: Proto) {
    let s = Server::start_api().on(p);
    let (u, token) = s.user("Put Self");
    let (_, admin) = s.admin();
    let path = format!("/api/v1/users/{}", id_of(&u));
    let new_email = unique_email("put-new");
    let r = s.api("PUT", &path, Some(&token), Some(&json!({"name": "Put Renamed", "email": new_email, "age": 44})));
    let d = s.expect_data(&r, 200, "PUT self");
    ensure_eq!(
        s,
        (d["id"].as_i64(), d["name"].as_str(), d["email"].as_str(), d["age"].as_i64(), d["role"].as_str()),
        (Some(id_of(&u)), Some("Put Renamed"), Some(new_email.as_str()), Some(44), Some("user")),
        "PUT result"
    );
    ensure!(s, user_shape_problems(&d).is_empty(), "PUT result shape {:?}", user_shape_problems(&d));
    ensure!(
        s,
        ts_key(d["updatedAt"].as_str().unwrap()) >= ts_key(u["updatedAt"].as_str().unwrap()),
        "updatedAt moves forward: {u} → {d}"
    );
    let g = s.expect_data(&s.api("GET", &path, Some(&token), None), 200, "GET after PUT");
    ensure_eq!(s, g["name"].as_str(), Some("Put Renamed"), "PUT stored");
    s.login(&new_email, PW);

    let r = s.api("PUT", &path, Some(&token), Some(&json!({"email": new_email, "age": 44})));
    s.expect_invalid(&r, &["name"], "PUT without name");
    let r = s.api("PUT", &path, Some(&token), Some(&json!({"name": "", "email": "bad", "age": 200})));
    s.expect_invalid(&r, &["name", "email", "age"], "PUT with three bad fields");
    let r =
        s.api("PUT", &path, Some(&token), Some(&json!({"name": "X", "email": new_email, "age": 1, "isAdmin": true})));
    s.expect_invalid(&r, &["isAdmin"], "PUT with an unknown key");
    let g = s.expect_data(&s.api("GET", &path, Some(&token), None), 200, "GET after refused PUTs");
    ensure_eq!(
        s,
        (g["name"].as_str(), g["age"].as_i64()),
        (Some("Put Renamed"), Some(44)),
        "refused PUTs change nothing"
    );

    let r = s.api("PUT", &path, Some(&admin), Some(&json!({"name": "By Admin", "email": new_email, "age": 45})));
    let d = s.expect_data(&r, 200, "PUT by an admin");
    ensure_eq!(s, (d["name"].as_str(), d["age"].as_i64()), (Some("By Admin"), Some(45)), "admin PUT result");
}

protocols!(patch_changes_a_subset_and_honours_if_match);
fn patch_changes_a_subset_and_honours_if_match(p: Proto) {
    let s = Server::start_api().on(p);
    let (u, token) = s.user("Pat");
    let (other, _) = s.user("Other Pat");
    let path = format!("/api/v1/users/{}", id_of(&u));
    let r = s.api("PATCH", &path, Some(&token), Some(&json!({"age": 41})));
    let d = s.expect_data(&r, 200, "PATCH age");
    ensure_eq!(
        s,
        (d["name"].as_str(), d["email"].as_str(), d["age"].as_i64()),
        (u["name"].as_str(), u["email"].as_str(), Some(41)),
        "PATCH changes only age"
    );

    let etag = s.api("GET", &path, Some(&token), None).header("etag").map(str::to_string).expect("ETag");
    let r = s.api_h("PATCH", &path, Some(&token), Some(&json!({"name": "Pat Two"})), &[("If-Match", &etag)]);
    let d = s.expect_data(&r, 200, "PATCH with If-Match: current ETag");
    ensure_eq!(s, d["name"].as_str(), Some("Pat Two"), "conditional PATCH applied");
    let r = s.api_h("PATCH", &path, Some(&token), Some(&json!({"name": "Lost Update"})), &[("If-Match", &etag)]);
    s.expect_err(&r, 412, "PRECONDITION_FAILED", "PATCH with a stale If-Match");
    let r = s.api_h(
        "PATCH",
        &path,
        Some(&token),
        Some(&json!({"name": "Lost Update"})),
        &[("If-Match", "\"not-the-etag\"")],
    );
    s.expect_err(&r, 412, "PRECONDITION_FAILED", "PATCH with another If-Match");
    let g = s.expect_data(&s.api("GET", &path, Some(&token), None), 200, "GET after 412s");
    ensure_eq!(s, g["name"].as_str(), Some("Pat Two"), "a 412 changes nothing");

    let r = s.api("PATCH", &path, Some(&token), Some(&json!({"age": 151})));
    s.expect_invalid(&r, &["age"], "PATCH age 151");
    let r = s.api("PATCH", &path, Some(&token), Some(&json!({"name": ""})));
    s.expect_invalid(&r, &["name"], "PATCH empty name");
    let r = s.api("PATCH", &path, Some(&token), Some(&json!({"isAdmin": true})));
    s.expect_invalid(&r, &["isAdmin"], "PATCH unknown key");
    let r =
        s.api("PATCH", &path, Some(&token), Some(&json!({"email": other["email"].as_str().unwrap().to_uppercase()})));
    s.expect_err(&r, 409, "CONFLICT", "PATCH to another user's e-mail (other case)");
}

protocols!(role_in_put_or_patch_needs_an_admin);
fn role_in_put_or_patch_needs_an_admin(p: Proto) {
    let s = Server::start_api().on(p);
    let (u, token) = s.user("Climber");
    let (_, admin) = s.admin();
    let path = format!("/api/v1/users/{}", id_of(&u));
    let r = s.api("PATCH", &path, Some(&token), Some(&json!({"role": "admin"})));
    s.expect_err(&r, 403, "FORBIDDEN", "PATCH own role by a user");
    let r = s.api(
        "PUT",
        &path,
        Some(&token),
        Some(&json!({"name": "Climber", "email": u["email"], "age": 30, "role": "admin"})),
    );
    s.expect_err(&r, 403, "FORBIDDEN", "PUT own role by a user");
    let g = s.expect_data(&s.api("GET", &path, Some(&token), None), 200, "GET after refused role change");
    ensure_eq!(s, (g["role"].as_str(), g["age"].as_i64()), (Some("user"), None), "refused role changes change nothing");
    let r = s.api("PATCH", &path, Some(&admin), Some(&json!({"role": "admin"})));
    let d = s.expect_data(&r, 200, "PATCH role by an admin");
    ensure_eq!(s, d["role"].as_str(), Some("admin"), "role set by an admin");
    let r = s.api(
        "PUT",
        &path,
        Some(&admin),
        Some(&json!({"name": "Climber", "email": u["email"], "age": 30, "role": "user"})),
    );
    let d = s.expect_data(&r, 200, "PUT with role by an admin");
    ensure_eq!(s, d["role"].as_str(), Some("user"), "role reset by an admin");
    let r = s.api("PATCH", &path, Some(&admin), Some(&json!({"role": "root"})));
    s.expect_invalid(&r, &["role"], "PATCH role root by an admin");
}

protocols!(another_users_put_patch_delete_are_403);
fn another_users_put_patch_delete_are_403(p: Proto) {
    let s = Server::start_api().on(p);
    let (victim, _) = s.user("Victim");
    let (_, mallory) = s.user("Mallory");
    let path = format!("/api/v1/users/{}", id_of(&victim));
    let r =
        s.api("PUT", &path, Some(&mallory), Some(&json!({"name": "Owned", "email": unique_email("owned"), "age": 1})));
    s.expect_err(&r, 403, "FORBIDDEN", "PUT another user");
    let r = s.api("PATCH", &path, Some(&mallory), Some(&json!({"name": "Owned"})));
    s.expect_err(&r, 403, "FORBIDDEN", "PATCH another user");
    let r = s.api("DELETE", &path, Some(&mallory), None);
    s.expect_err(&r, 403, "FORBIDDEN", "DELETE another user");
    let g = s.expect_data(&s.api("GET", &path, Some(&mallory), None), 200, "GET the victim");
    ensure_eq!(s, g, victim, "the victim is unchanged");
}

protocols!(delete_user_is_204_then_404_and_their_posts_are_gone);
fn delete_user_is_204_then_404_and_their_posts_are_gone(p: Proto) {
    let s = Server::start_api().on(p);
    let (u, token) = s.user("Leaver");
    let (_, admin) = s.admin();
    let id = id_of(&u);
    let r =
        s.api("POST", &format!("/api/v1/users/{id}/posts"), Some(&token), Some(&json!({"title": "bye", "body": "b"})));
    let post = s.expect_data(&r, 201, "create a post before deleting");
    let post_path = format!("/api/v1/posts/{}", post["id"]);
    let auth = format!("Bearer {token}");
    s.expect_bodyless("DELETE", &format!("/api/v1/users/{id}"), &[("Authorization", &auth)], 204, "DELETE self");
    let r = s.api("GET", &format!("/api/v1/users/{id}"), Some(&admin), None);
    s.expect_err(&r, 404, "NOT_FOUND", "GET a deleted user");
    let r = s.api("GET", &post_path, Some(&admin), None);
    s.expect_err(&r, 404, "NOT_FOUND", "GET a deleted user's post");
    let r = s.api("DELETE", &format!("/api/v1/users/{id}"), Some(&admin), None);
    s.expect_err(&r, 404, "NOT_FOUND", "DELETE a deleted user");
    let r = s.api("POST", "/api/v1/auth/login", None, Some(&json!({"email": u["email"], "password": PW})));
    s.expect_err(&r, 401, "UNAUTHORIZED", "login as a deleted user");
    // An admin may delete someone else.
    let (v, _) = s.user("Removed");
    let admin_auth = format!("Bearer {admin}");
    s.expect_bodyless(
        "DELETE",
        &format!("/api/v1/users/{}", id_of(&v)),
        &[("Authorization", &admin_auth)],
        204,
        "admin DELETE",
    );
    let r = s.api("GET", &format!("/api/v1/users/{}", id_of(&v)), Some(&admin), None);
    s.expect_err(&r, 404, "NOT_FOUND", "GET a user deleted by an admin");
}

/// Two keep-alive connections held by different workers (of a 2-worker server).
fn conns_on_two_workers(s: &Server) -> (Conn, Conn) {
    let first = s.conn();
    let mut first = first;
    let pid = first.get("/_debug/pid").json()["pid"].as_i64();
    for _ in 0..200 {
        let mut other = s.conn();
        if other.get("/_debug/pid").json()["pid"].as_i64() != pid {
            return (first, other);
        }
    }
    panic!("200 connections all went to worker {pid:?}\n{}", s.log_tail());
}

/// `method path` with the bearer (and a JSON body) on `c`.
fn on(c: &mut Conn, method: &str, path: &str, token: &str, body: Option<&Value>) -> Response {
    let auth = format!("Bearer {token}");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut headers = vec![("Authorization", auth.as_str())];
    if !body.is_empty() {
        headers.push(("Content-Type", "application/json"));
    }
    c.send(&request(method, path, &headers, body.as_bytes()));
    c.read_response()
}

/// A worker answers a user it read before from memory (no pool job): a change or a delete
/// made through ANOTHER worker must show at once, on the next request, not after some
/// expiry. Without the shared change counters the second worker answers the old user.
#[test]
fn a_user_changed_or_deleted_through_one_worker_is_seen_at_once_by_another() {
    let s = Server::api_builder().workers(2).start();
    let (u, token) = s.user("Memo");
    let path = format!("/api/v1/users/{}", id_of(&u));
    let (mut writer, mut reader) = conns_on_two_workers(&s);
    // The reader's worker renders the user, then answers it again (from its memo).
    for round in 0..3 {
        let r = on(&mut reader, "GET", &path, &token, None);
        assert_eq!(r.status, 200, "GET {round}: {r:?}");
        assert_eq!(r.json()["data"]["name"], "Memo");
    }
    let tag = on(&mut reader, "GET", &path, &token, None).header("etag").map(str::to_owned).expect("etag");
    for (i, name) in ["Memo Two", "Memo Three"].iter().enumerate() {
        let r = on(&mut writer, "PATCH", &path, &token, Some(&json!({ "name": name })));
        assert_eq!(r.status, 200, "PATCH {i}: {r:?}");
        let r = on(&mut reader, "GET", &path, &token, None);
        assert_eq!(r.json()["data"]["name"], *name, "the other worker sees change {i} at once: {r:?}");
        assert_ne!(r.header("etag"), Some(tag.as_str()), "and its new ETag");
        // Read again: now from its memo, still the change.
        let r = on(&mut reader, "GET", &path, &token, None);
        assert_eq!(r.json()["data"]["name"], *name);
    }
    // A memoised answer honours If-None-Match like a rendered one.
    let current = on(&mut reader, "GET", &path, &token, None).header("etag").map(str::to_owned).expect("etag");
    let auth = format!("Bearer {token}");
    reader.send(&request("GET", &path, &[("Authorization", &auth), ("If-None-Match", &current)], b""));
    let r = reader.read_response();
    assert_eq!((r.status, r.header("etag")), (304, Some(current.as_str())), "{r:?}");
    let (_, admin) = s.admin();
    let r = on(&mut writer, "DELETE", &path, &admin, None);
    assert_eq!(r.status, 204, "{r:?}");
    let r = on(&mut reader, "GET", &path, &admin, None);
    assert_eq!(r.status, 404, "the other worker sees the delete at once: {r:?}");
}
