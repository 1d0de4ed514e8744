//! Declared resources (`[[resources]]`): every rule of the engine from the outside, over
//! HTTP/1.1 and h2c, on a configuration declaring `articles` (public read, a state machine, a
//! unique slug, every field type, sort/filter/search fields), `notes` (owner read), `comments`
//! (nested under articles, owner read, a `ref` to notes), `steps` (nested under notes),
//! `replies` (nested under articles, created by the article's owner) and `tags` (admin only). A few of the
//! rules run again on PostgreSQL (skipped without `TEST_DATABASE_URL`).

use serde_json::{json, Value};

use crate::util::*;

const RESOURCES: &str = r#"
[[resources]]
name = "articles"
read = "public"
create = "signed_in"
update = "owner"
delete = "owner"

[resources.fields.title]
type = "string"
required = true
min = 1
max = 100
sort = true
search = true

[resources.fields.slug]
type = "string"
required = true
unique = true
filter = true

[resources.fields.status]
type = "enum"
values = ["draft", "published", "archived"]
default = "draft"
transitions = { draft = ["published"], published = ["archived"] }
filter = true

[resources.fields.views]
type = "integer"
min = 0
default = 0
sort = true
filter = true

[resources.fields.rating]
type = "number"
min = 0
max = 5
filter = true

[resources.fields.featured]
type = "boolean"
filter = true

[resources.fields.publishedAt]
type = "datetime"
filter = true
sort = true

[resources.fields.contact]
type = "email"

[resources.fields.link]
type = "url"

[[resources]]
name = "notes"
read = "owner"

[resources.fields.body]
type = "text"
required = true
max = 500

[[resources]]
name = "comments"
parent = "articles"
read = "owner"

[resources.fields.text]
type = "text"
required = true
max = 500

[resources.fields.note]
type = "ref"
ref = "notes"

[[resources]]
name = "steps"
parent = "notes"
read = "signed_in"

[resources.fields.text]
type = "string"
required = true

[[resources]]
name = "replies"
parent = "articles"
create = "owner"

[resources.fields.text]
type = "string"
required = true

[[resources]]
name = "tags"
read = "admin"
create = "admin"
update = "admin"
delete = "admin"

[resources.fields.label]
type = "string"
required = true
"#;

/// The TOML of the API test server with the resources above.
fn config() -> String {
    format!("{}\n{RESOURCES}", Server::api_builder().to_extra_toml())
}

fn start(p: Proto) -> Server {
    Server::start(&config()).on(p)
}

fn id_of(v: &Value) -> i64 {
    v["id"].as_i64().unwrap_or_else(|| panic!("no integer id in {v}"))
}

/// A new article by `token` with `slug` and the extra fields of `more`; asserts 201.
fn article(s: &Server, token: &str, slug: &str, more: Value) -> Value {
    let mut body = json!({"title": format!("About {slug}"), "slug": slug});
    if let (Some(b), Some(m)) = (body.as_object_mut(), more.as_object()) {
        b.extend(m.clone());
    }
    let r = s.api("POST", "/api/v1/articles", Some(token), Some(&body));
    s.expect_data(&r, 201, &format!("create article {body}"))
}

/// `data` of `GET path` (asserts 200).
fn list(s: &Server, token: Option<&str>, path: &str) -> Value {
    s.expect_data(&s.api("GET", path, token, None), 200, &format!("GET {path}"))
}

fn ids(d: &Value) -> Vec<i64> {
    d["items"].as_array().unwrap_or_else(|| panic!("no items in {d}")).iter().map(id_of).collect()
}

fn total(s: &Server, token: Option<&str>, path: &str) -> i64 {
    list(s, token, path)["total"].as_i64().unwrap_or_else(|| panic!("no total for {path}"))
}

protocols!(paths_of_a_resource_and_405_with_allow);
fn paths_of_a_resource_and_405_with_allow(p: Proto) {
    let s = start(p);
    let (_, token) = s.user("Paths");
    let a = article(&s, &token, "paths", json!({}));
    let id = id_of(&a);
    ensure_eq!(s, ids(&list(&s, None, "/api/v1/articles")), vec![id], "GET /api/v1/articles");
    ensure_eq!(s, ids(&list(&s, None, "/api/articles?version=1")), vec![id], "GET /api/articles (unversioned)");
    let r = s.api("GET", "/api/articles?version=2", None, None);
    s.expect_err(&r, 400, "BAD_REQUEST", "an unsupported version of a declared resource");
    let g = list(&s, None, &format!("/api/v1/articles/{id}"));
    ensure_eq!(s, g, a, "GET /api/v1/articles/{id}");
    let r = s.api("POST", &format!("/api/v1/articles/{id}/comments"), Some(&token), Some(&json!({"text": "hi"})));
    let c = s.expect_data(&r, 201, "POST a comment under the article");
    ensure_eq!(s, (c["parentId"].as_i64(), c["ownerId"].as_i64()), (Some(id), a["ownerId"].as_i64()), "comment {c}");
    ensure_eq!(s, ids(&list(&s, Some(&token), &format!("/api/v1/articles/{id}/comments"))), vec![id_of(&c)], "nested");
    ensure_eq!(s, ids(&list(&s, Some(&token), "/api/v1/comments")), vec![id_of(&c)], "every readable comment");
    let cases = [
        ("DELETE", "/api/v1/articles".to_string(), "GET, POST, HEAD"),
        ("POST", format!("/api/v1/articles/{id}"), "GET, PUT, PATCH, DELETE, HEAD"),
        ("POST", "/api/v1/comments".to_string(), "GET, HEAD"),
        ("PUT", format!("/api/v1/articles/{id}/comments"), "GET, POST, HEAD"),
    ];
    for (m, path, allow) in &cases {
        let r = s.api(m, path, Some(&token), Some(&json!({})));
        s.expect_err(&r, 405, "METHOD_NOT_ALLOWED", &format!("{m} {path}"));
        ensure_eq!(s, r.header("allow"), Some(*allow), "{m} {path}: Allow");
    }
    for path in ["/api/v1/articles/abc", "/api/v1/articles/0", "/api/v1/nothing", "/api/v1/articles/1/nothing"] {
        s.expect_err(&s.api("GET", path, Some(&token), None), 404, "NOT_FOUND", path);
    }
}

protocols!(each_type_refuses_a_bad_value_naming_the_field);
fn each_type_refuses_a_bad_value_naming_the_field(p: Proto) {
    let s = start(p);
    let (_, token) = s.user("Types");
    let base = |k: &str, v: Value| {
        let mut b = json!({"title": "t", "slug": "s"});
        b[k] = v;
        b
    };
    let bad = [
        ("title", json!("a\nb")),
        ("title", json!("")),
        ("title", json!("t".repeat(101))),
        ("title", json!(5)),
        ("status", json!("deleted")),
        ("views", json!(1.5)),
        ("views", json!("1")),
        ("views", json!(-1)),
        ("rating", json!("4")),
        ("rating", json!(5.5)),
        ("featured", json!(1)),
        ("featured", json!("true")),
        ("publishedAt", json!("2026-02-30T00:00:00Z")),
        ("publishedAt", json!("yesterday")),
        ("contact", json!("nobody")),
        ("link", json!("ftp://example.com/x")),
        ("link", json!(format!("https://example.com/{}", "a".repeat(2048)))),
    ];
    for (field, v) in &bad {
        let r = s.api("POST", "/api/v1/articles", Some(&token), Some(&base(field, v.clone())));
        s.expect_invalid(&r, &[field], &format!("{field} = {v}"));
    }
    let every = json!({"title": "", "slug": 1, "status": 2, "views": 0.5, "rating": -1, "featured": null,
        "publishedAt": 3, "contact": "x@", "link": "nope"});
    let r = s.api("POST", "/api/v1/articles", Some(&token), Some(&every));
    let v = s.expect_invalid(
        &r,
        &["title", "slug", "status", "views", "rating", "publishedAt", "contact", "link"],
        "every field bad at once",
    );
    ensure!(s, !error_fields(&v).contains(&"featured".to_string()), "null for an optional field is fine: {v}");
    ensure_eq!(s, total(&s, None, "/api/v1/articles"), 0, "nothing stored");
    let good = json!({"title": "ok", "slug": "ok", "views": 7.0, "rating": 4.5, "featured": true,
        "publishedAt": "2026-03-01T01:30:00.5+02:00", "contact": "a@example.com", "link": "https://example.com/a?b=1"});
    let r = s.api("POST", "/api/v1/articles", Some(&token), Some(&good));
    let a = s.expect_data(&r, 201, "every type with a good value");
    ensure_eq!(
        s,
        (a["views"].clone(), a["rating"].clone(), a["featured"].clone(), a["publishedAt"].clone()),
        (json!(7), json!(4.5), json!(true), json!("2026-02-28T23:30:00.500Z")),
        "stored values (datetime in UTC): {a}"
    );
}

protocols!(required_null_unknown_managed_and_prototype_keys_are_422);
fn required_null_unknown_managed_and_prototype_keys_are_422(p: Proto) {
    let s = start(p);
    let (_, token) = s.user("Keys");
    let cases: Vec<(Value, &[&str], &str)> = vec![
        (json!({"slug": "s"}), &["title"], "required field missing"),
        (json!({"title": null, "slug": "s"}), &["title"], "null for a required field"),
        (json!({"title": "t", "slug": "s", "colour": "red"}), &["colour"], "unknown key"),
        (json!({"title": "t", "slug": "s", "__proto__": {"admin": true}}), &["__proto__"], "__proto__"),
        (json!({"title": "t", "slug": "s", "constructor": {}}), &["constructor"], "constructor"),
        (json!({"title": "t", "slug": "s", "prototype": {}}), &["prototype"], "prototype"),
        (
            json!({"title": "t", "slug": "s", "id": 1, "ownerId": 1, "createdAt": "x", "updatedAt": "x", "parentId": 1}),
            &["id", "ownerId", "createdAt", "updatedAt", "parentId"],
            "server-managed keys",
        ),
    ];
    for (b, fields, what) in &cases {
        let r = s.api("POST", "/api/v1/articles", Some(&token), Some(b));
        s.expect_invalid(&r, fields, what);
    }
    ensure_eq!(s, total(&s, None, "/api/v1/articles"), 0, "nothing stored");
    let r = s.api("POST", "/api/v1/articles", Some(&token), Some(&json!([1, 2])));
    s.expect_invalid(&r, &["body"], "a body that is not an object");
    let r = s.call(
        "POST",
        "/api/v1/articles",
        &[("Authorization", &format!("Bearer {token}")), ("Content-Type", "application/json")],
        b"{\"title\":",
    );
    s.expect_err(&r, 400, "BAD_REQUEST", "malformed JSON");
}

protocols!(post_is_201_with_location_owner_and_defaults);
fn post_is_201_with_location_owner_and_defaults(p: Proto) {
    let s = start(p);
    let (u, token) = s.user("Creator");
    let r = s.api("POST", "/api/v1/articles", Some(&token), Some(&json!({"title": "First", "slug": "first"})));
    let a = s.expect_data(&r, 201, "create an article");
    let loc = format!("/api/v1/articles/{}", id_of(&a));
    ensure_eq!(s, r.header("location"), Some(loc.as_str()), "Location of {r:?}");
    ensure_eq!(s, a["ownerId"].as_i64(), u["id"].as_i64(), "ownerId is the caller: {a}");
    ensure_eq!(
        s,
        (a["status"].clone(), a["views"].clone(), a["rating"].clone(), a["link"].clone()),
        (json!("draft"), json!(0), Value::Null, Value::Null),
        "defaults, else null: {a}"
    );
    ensure!(s, a.get("parentId").is_none(), "a top-level record has no parentId: {a}");
    for k in ["createdAt", "updatedAt"] {
        ensure!(s, a[k].as_str().is_some_and(is_rfc3339_utc), "{k} must be RFC 3339 UTC: {a}");
    }
    ensure_eq!(s, list(&s, None, &loc), a, "GET {loc}");
}

protocols!(put_replaces_every_field);
fn put_replaces_every_field(p: Proto) {
    let s = start(p);
    let (_, token) = s.user("Replacer");
    let a = article(&s, &token, "put", json!({"views": 9, "rating": 3, "link": "https://x.io/"}));
    let path = format!("/api/v1/articles/{}", id_of(&a));
    let r = s.api("PUT", &path, Some(&token), Some(&json!({"title": "New", "slug": "put"})));
    let d = s.expect_data(&r, 200, "PUT");
    ensure_eq!(
        s,
        (d["title"].clone(), d["views"].clone(), d["rating"].clone(), d["link"].clone(), d["status"].clone()),
        (json!("New"), json!(0), Value::Null, Value::Null, json!("draft")),
        "absent optional fields become their default or null: {d}"
    );
    ensure_eq!(s, (d["id"].clone(), d["createdAt"].clone()), (a["id"].clone(), a["createdAt"].clone()), "same record");
    let r = s.api("PUT", &path, Some(&token), Some(&json!({"title": "No slug"})));
    s.expect_invalid(&r, &["slug"], "PUT without a required field");
    ensure_eq!(s, list(&s, None, &path), d, "a refused PUT changes nothing");
}

protocols!(patch_changes_only_the_fields_given);
fn patch_changes_only_the_fields_given(p: Proto) {
    let s = start(p);
    let (_, token) = s.user("Patcher");
    let a = article(&s, &token, "patch", json!({"views": 9, "rating": 3}));
    let path = format!("/api/v1/articles/{}", id_of(&a));
    let d = s.expect_data(&s.api("PATCH", &path, Some(&token), Some(&json!({"rating": null}))), 200, "PATCH");
    ensure_eq!(
        s,
        (d["title"].clone(), d["views"].clone(), d["rating"].clone()),
        (a["title"].clone(), json!(9), Value::Null),
        "only rating changed: {d}"
    );
    let r = s.api("PATCH", &path, Some(&token), Some(&json!({"title": null, "views": -1, "bogus": 1})));
    s.expect_invalid(&r, &["title", "views", "bogus"], "bad PATCH");
    ensure_eq!(s, list(&s, None, &path), d, "a refused PATCH changes nothing");
}

protocols!(etag_304_and_if_match_412);
fn etag_304_and_if_match_412(p: Proto) {
    let s = start(p);
    let (_, token) = s.user("Tagger");
    let a = article(&s, &token, "etag", json!({}));
    let path = format!("/api/v1/articles/{}", id_of(&a));
    let r = s.api("GET", &path, None, None);
    let tag = r.header("etag").unwrap_or_else(|| panic!("no ETag on {r:?}")).to_string();
    ensure!(s, tag.starts_with('"') && !tag.starts_with("W/"), "a strong ETag: {tag}");
    s.expect_bodyless("GET", &path, &[("If-None-Match", &tag)], 304, "If-None-Match with the current tag");
    let r = s.api_h("PATCH", &path, Some(&token), Some(&json!({"views": 1})), &[("If-Match", &tag)]);
    let d = s.expect_data(&r, 200, "PATCH with the current tag");
    let fresh = r.header("etag").map(str::to_string);
    ensure!(s, fresh.as_deref().is_some_and(|t| t != tag), "a changed record has a new ETag: {r:?}");
    let r = s.api_h("PATCH", &path, Some(&token), Some(&json!({"views": 2})), &[("If-Match", &tag)]);
    s.expect_err(&r, 412, "PRECONDITION_FAILED", "PATCH with a stale tag");
    let r = s.api_h("PUT", &path, Some(&token), Some(&json!({"title": "x", "slug": "etag"})), &[("If-Match", &tag)]);
    s.expect_err(&r, 412, "PRECONDITION_FAILED", "PUT with a stale tag");
    let r = s.api_h("DELETE", &path, Some(&token), None, &[("If-Match", &tag)]);
    s.expect_err(&r, 412, "PRECONDITION_FAILED", "DELETE with a stale tag");
    ensure_eq!(s, list(&s, None, &path), d, "stale writes change nothing");
    let r = s.api("GET", &path, None, None);
    ensure_eq!(s, r.header("etag").map(str::to_string), fresh, "GET shows the tag PATCH returned");
}

protocols!(delete_is_204_cascades_to_children_and_ids_are_never_reused);
fn delete_is_204_cascades_to_children_and_ids_are_never_reused(p: Proto) {
    let s = start(p);
    let (_, token) = s.user("Deleter");
    let first = article(&s, &token, "one", json!({}));
    let a = article(&s, &token, "two", json!({}));
    let id = id_of(&a);
    let r = s.api("POST", &format!("/api/v1/articles/{id}/comments"), Some(&token), Some(&json!({"text": "bye"})));
    let c = s.expect_data(&r, 201, "comment");
    let auth = format!("Bearer {token}");
    s.expect_bodyless("DELETE", &format!("/api/v1/articles/{id}"), &[("Authorization", &auth)], 204, "DELETE");
    let r = s.api("GET", &format!("/api/v1/articles/{id}"), None, None);
    s.expect_err(&r, 404, "NOT_FOUND", "GET a deleted article");
    let r = s.api("GET", &format!("/api/v1/comments/{}", id_of(&c)), Some(&token), None);
    s.expect_err(&r, 404, "NOT_FOUND", "its comment went with it");
    ensure_eq!(s, total(&s, Some(&token), "/api/v1/comments"), 0, "no comment left");
    let r = s.api("DELETE", &format!("/api/v1/articles/{id}"), Some(&token), None);
    s.expect_err(&r, 404, "NOT_FOUND", "DELETE twice");
    let b = article(&s, &token, "three", json!({}));
    ensure!(s, id_of(&b) > id && id > id_of(&first), "ids never reused: {} after {id}", id_of(&b));
}

protocols!(lists_page_sort_filter_and_search);
fn lists_page_sort_filter_and_search(p: Proto) {
    let s = start(p);
    let (_, token) = s.user("Lister");
    let mut all = Vec::new();
    for i in 0..7 {
        let more = json!({"views": i % 3, "rating": i as f64 / 2.0, "featured": i % 2 == 0,
            "publishedAt": format!("2026-01-0{}T12:00:00Z", i + 1), "title": format!("Story {i} {}", ["red", "Blue"][i % 2])});
        all.push(id_of(&article(&s, &token, &format!("s{i}"), more)));
    }
    let d = list(&s, None, "/api/v1/articles?limit=3&page=2");
    ensure_eq!(s, ids(&d), all[3..6].to_vec(), "page 2 of 3, default order id");
    ensure_eq!(
        s,
        (d["total"].as_i64(), d["page"].as_i64(), d["pageSize"].as_i64(), d["totalPages"].as_i64()),
        (Some(7), Some(2), Some(3), Some(3)),
        "envelope B: {d}"
    );
    ensure_eq!(s, ids(&list(&s, None, "/api/v1/articles?sort=-id&limit=2")), vec![all[6], all[5]], "sort=-id");
    let by_date = ids(&list(&s, None, "/api/v1/articles?sort=-publishedAt"));
    ensure_eq!(s, by_date, all.iter().rev().copied().collect::<Vec<_>>(), "sort=-publishedAt");
    // Ties on views broken by id, the same over every page size.
    let mut expected = all.clone();
    expected.sort_by_key(|id| (all.iter().position(|x| x == id).unwrap_or(0) % 3, *id));
    for limit in [1, 2, 3, 7] {
        let mut got = Vec::new();
        for page in 1..=7 {
            got.extend(ids(&list(&s, None, &format!("/api/v1/articles?sort=views&limit={limit}&page={page}"))));
        }
        ensure_eq!(s, got, expected, "sort=views, pages of {limit}: stable and complete");
    }
    let q = |query: &str| ids(&list(&s, None, &format!("/api/v1/articles?{query}")));
    ensure_eq!(s, q("featured=true"), vec![all[0], all[2], all[4], all[6]], "boolean filter");
    ensure_eq!(s, q("views=1"), vec![all[1], all[4]], "integer filter");
    ensure_eq!(s, q("slug=s3"), vec![all[3]], "string filter");
    ensure_eq!(s, q("rating.gte=1.5&rating.lte=2.5"), all[3..6].to_vec(), "number range");
    ensure_eq!(s, q("publishedAt.gte=2026-01-06T00:00:00Z"), all[5..].to_vec(), "datetime range");
    ensure_eq!(s, q("views.lte=0&featured=false"), vec![all[3]], "filters combine");
    ensure_eq!(s, q("q=blue"), vec![all[1], all[3], all[5]], "q is a case-insensitive contains");
    ensure_eq!(s, q("q=story%205"), vec![all[5]], "q percent-decoded");
    ensure_eq!(s, q("status=draft&limit=100").len(), 7, "enum filter");
    let bad = [
        ("page=0", "page"),
        ("limit=101", "limit"),
        ("sort=link", "sort"),
        ("sort=nope", "sort"),
        ("title=x", "title"),
        ("featured=yes", "featured"),
        ("views=one", "views"),
        ("slug.gte=a", "slug.gte"),
        ("publishedAt.lte=soon", "publishedAt.lte"),
        ("colour=red", "colour"),
    ];
    for (query, param) in bad {
        let r = s.api("GET", &format!("/api/v1/articles?{query}"), None, None);
        let v = s.expect_err(&r, 400, "BAD_REQUEST", &format!("?{query}"));
        ensure_eq!(s, error_fields(&v), vec![param.to_string()], "?{query} names the parameter");
    }
    let r = s.api("GET", "/api/v1/notes?q=x", Some(&token), None);
    s.expect_err(&r, 400, "BAD_REQUEST", "q on a resource without search fields");
}

protocols!(owner_read_is_404_for_others_and_lists_only_ones_own);
fn owner_read_is_404_for_others_and_lists_only_ones_own(p: Proto) {
    let s = start(p);
    let (_, alice) = s.user("Alice");
    let (_, bob) = s.user("Bob");
    let (_, admin) = s.admin();
    let note = |token: &str, body: &str| {
        let r = s.api("POST", "/api/v1/notes", Some(token), Some(&json!({"body": body})));
        id_of(&s.expect_data(&r, 201, "a note"))
    };
    let a1 = note(&alice, "a1");
    let a2 = note(&alice, "a2");
    let b1 = note(&bob, "b1");
    for (m, body) in [("GET", None), ("PATCH", Some(json!({"body": "x"}))), ("DELETE", None)] {
        let r = s.api(m, &format!("/api/v1/notes/{a1}"), Some(&bob), body.as_ref());
        s.expect_err(&r, 404, "NOT_FOUND", &format!("{m} another's note: 404, not 403"));
    }
    ensure_eq!(s, ids(&list(&s, Some(&alice), "/api/v1/notes")), vec![a1, a2], "Alice's list");
    ensure_eq!(s, ids(&list(&s, Some(&bob), "/api/v1/notes")), vec![b1], "Bob's list");
    ensure_eq!(s, ids(&list(&s, Some(&admin), "/api/v1/notes")), vec![a1, a2, b1], "an admin sees all");
    let g = list(&s, Some(&admin), &format!("/api/v1/notes/{a1}"));
    ensure_eq!(s, g["body"].as_str(), Some("a1"), "an admin reads any note");
    let r = s.api("GET", "/api/v1/notes", None, None);
    let v = s.expect_err(&r, 401, "UNAUTHORIZED", "an owner read needs a token");
    ensure_eq!(s, v["message"].as_str(), Some("token required"), "401 message");
}

protocols!(public_read_needs_no_token_but_a_bad_one_is_401);
fn public_read_needs_no_token_but_a_bad_one_is_401(p: Proto) {
    let s = start(p);
    let (_, token) = s.user("Public");
    let a = article(&s, &token, "public", json!({}));
    let path = format!("/api/v1/articles/{}", id_of(&a));
    ensure_eq!(s, list(&s, None, &path), a, "GET one without a token");
    ensure_eq!(s, total(&s, None, "/api/v1/articles"), 1, "list without a token");
    let r = s.api("GET", &path, Some("not.a.token"), None);
    s.expect_err(&r, 401, "UNAUTHORIZED", "a bad token on a public read");
    for (m, path, body) in [
        ("POST", "/api/v1/articles".to_string(), Some(json!({"title": "t", "slug": "anon"}))),
        ("PATCH", path.clone(), Some(json!({"views": 1}))),
        ("DELETE", path.clone(), None),
    ] {
        let r = s.api(m, &path, None, body.as_ref());
        let v = s.expect_err(&r, 401, "UNAUTHORIZED", &format!("{m} {path} without a token"));
        ensure_eq!(s, v["message"].as_str(), Some("token required"), "{m}: 401 message");
    }
}

protocols!(create_update_and_delete_rules_refuse_with_403);
fn create_update_and_delete_rules_refuse_with_403(p: Proto) {
    let s = start(p);
    let (_, owner) = s.user("Owner");
    let (_, other) = s.user("Other");
    let (_, admin) = s.admin();
    let a = article(&s, &owner, "rules", json!({}));
    let path = format!("/api/v1/articles/{}", id_of(&a));
    let r = s.api("PATCH", &path, Some(&other), Some(&json!({"views": 5})));
    s.expect_err(&r, 403, "FORBIDDEN", "PATCH another's article");
    let r = s.api("PUT", &path, Some(&other), Some(&json!({"title": "x", "slug": "rules"})));
    s.expect_err(&r, 403, "FORBIDDEN", "PUT another's article");
    let r = s.api("DELETE", &path, Some(&other), None);
    s.expect_err(&r, 403, "FORBIDDEN", "DELETE another's article");
    ensure_eq!(s, list(&s, None, &path), a, "refused writes change nothing");
    let d = s.expect_data(&s.api("PATCH", &path, Some(&admin), Some(&json!({"views": 5}))), 200, "admin PATCH");
    ensure_eq!(s, d["views"].as_i64(), Some(5), "an admin may change any record");
    // Admin-only resource: create, list 403; get 404 (it may not be read).
    let r = s.api("POST", "/api/v1/tags", Some(&other), Some(&json!({"label": "x"})));
    s.expect_err(&r, 403, "FORBIDDEN", "a non-admin creates a tag");
    let r = s.api("POST", "/api/v1/tags", Some(&admin), Some(&json!({"label": "news"})));
    let t = s.expect_data(&r, 201, "an admin creates a tag");
    let r = s.api("GET", "/api/v1/tags", Some(&other), None);
    s.expect_err(&r, 403, "FORBIDDEN", "a non-admin lists tags");
    let tag = format!("/api/v1/tags/{}", id_of(&t));
    s.expect_err(&s.api("GET", &tag, Some(&other), None), 404, "NOT_FOUND", "a non-admin reads a tag");
    s.expect_err(&s.api("DELETE", &tag, Some(&other), None), 404, "NOT_FOUND", "a non-admin deletes a tag");
    ensure_eq!(s, total(&s, Some(&admin), "/api/v1/tags"), 1, "the tag is still there");
}

protocols!(nested_routes_are_404_for_a_missing_or_unreadable_parent);
fn nested_routes_are_404_for_a_missing_or_unreadable_parent(p: Proto) {
    let s = start(p);
    let (_, token) = s.user("Nester");
    for (m, body) in [("GET", None), ("POST", Some(json!({"text": "x"})))] {
        let r = s.api(m, "/api/v1/articles/999999/comments", Some(&token), body.as_ref());
        s.expect_err(&r, 404, "NOT_FOUND", &format!("{m} under a missing article"));
        let r = s.api(m, "/api/v1/articles/abc/comments", Some(&token), body.as_ref());
        s.expect_err(&r, 404, "NOT_FOUND", &format!("{m} under a non-numeric id"));
    }
    ensure_eq!(s, total(&s, Some(&token), "/api/v1/comments"), 0, "nothing stored");
    // A parent the caller may not read (another's owner-read note) is as missing.
    let (_, other) = s.user("Other");
    let r = s.api("POST", "/api/v1/notes", Some(&token), Some(&json!({"body": "mine"})));
    let note = id_of(&s.expect_data(&r, 201, "a note"));
    let steps = format!("/api/v1/notes/{note}/steps");
    for (m, body) in [("GET", None), ("POST", Some(json!({"text": "x"})))] {
        let r = s.api(m, &steps, Some(&other), body.as_ref());
        s.expect_err(&r, 404, "NOT_FOUND", &format!("{m} under another's note"));
    }
    let r = s.api("POST", &steps, Some(&token), Some(&json!({"text": "first"})));
    let step = s.expect_data(&r, 201, "a step under one's own note");
    ensure_eq!(s, ids(&list(&s, Some(&token), &steps)), vec![id_of(&step)], "the note's steps");
    // `create = "owner"` under a readable parent: only its owner (or an admin).
    let a = article(&s, &token, "replied", json!({}));
    let replies = format!("/api/v1/articles/{}/replies", id_of(&a));
    let r = s.api("POST", &replies, Some(&other), Some(&json!({"text": "me too"})));
    s.expect_err(&r, 403, "FORBIDDEN", "a reply by someone who does not own the article");
    let r = s.api("POST", &replies, Some(&token), Some(&json!({"text": "thanks"})));
    s.expect_data(&r, 201, "a reply by the article's owner");
    let (_, admin) = s.admin();
    let r = s.api("POST", &replies, Some(&admin), Some(&json!({"text": "moderated"})));
    s.expect_data(&r, 201, "a reply by an admin");
    ensure_eq!(s, total(&s, Some(&token), &replies), 2, "two replies stored");
}

protocols!(a_ref_to_a_missing_or_unreadable_record_is_422);
fn a_ref_to_a_missing_or_unreadable_record_is_422(p: Proto) {
    let s = start(p);
    let (_, alice) = s.user("Alice");
    let (_, bob) = s.user("Bob");
    let a = article(&s, &alice, "refs", json!({}));
    let mine = s.api("POST", "/api/v1/notes", Some(&bob), Some(&json!({"body": "mine"})));
    let mine = id_of(&s.expect_data(&mine, 201, "Bob's note"));
    let theirs = s.api("POST", "/api/v1/notes", Some(&alice), Some(&json!({"body": "theirs"})));
    let theirs = id_of(&s.expect_data(&theirs, 201, "Alice's note"));
    let path = format!("/api/v1/articles/{}/comments", id_of(&a));
    for (note, what) in [(json!(999_999), "a missing note"), (json!(theirs), "another's note"), (json!("1"), "text")] {
        let r = s.api("POST", &path, Some(&bob), Some(&json!({"text": "x", "note": note})));
        s.expect_invalid(&r, &["note"], &format!("a ref to {what}"));
    }
    ensure_eq!(s, total(&s, Some(&bob), "/api/v1/comments"), 0, "nothing stored");
    let r = s.api("POST", &path, Some(&bob), Some(&json!({"text": "x", "note": mine})));
    let c = s.expect_data(&r, 201, "a ref to one's own note");
    ensure_eq!(s, c["note"].as_i64(), Some(mine), "ref stored: {c}");
    let r = s.api("PATCH", &format!("/api/v1/comments/{}", id_of(&c)), Some(&bob), Some(&json!({"note": theirs})));
    s.expect_invalid(&r, &["note"], "PATCH a ref to another's note");
}

protocols!(a_duplicate_unique_value_is_409_naming_the_field);
fn a_duplicate_unique_value_is_409_naming_the_field(p: Proto) {
    let s = start(p);
    let (_, token) = s.user("Unique");
    article(&s, &token, "same", json!({}));
    let b = article(&s, &token, "other", json!({}));
    let r = s.api("POST", "/api/v1/articles", Some(&token), Some(&json!({"title": "t", "slug": "same"})));
    let v = s.expect_err(&r, 409, "CONFLICT", "a duplicate slug");
    ensure_eq!(s, error_fields(&v), vec!["slug".to_string()], "409 names the field");
    let r = s.api("PATCH", &format!("/api/v1/articles/{}", id_of(&b)), Some(&token), Some(&json!({"slug": "same"})));
    let v = s.expect_err(&r, 409, "CONFLICT", "PATCH to a duplicate slug");
    ensure_eq!(s, error_fields(&v), vec!["slug".to_string()], "409 names the field");
    ensure_eq!(s, total(&s, None, "/api/v1/articles"), 2, "nothing stored");
}

protocols!(a_state_change_not_listed_is_409_naming_the_allowed_states);
fn a_state_change_not_listed_is_409_naming_the_allowed_states(p: Proto) {
    let s = start(p);
    let (_, token) = s.user("States");
    let r = s.api(
        "POST",
        "/api/v1/articles",
        Some(&token),
        Some(&json!({"title": "t", "slug": "x", "status": "published"})),
    );
    s.expect_invalid(&r, &["status"], "a new record cannot start in a state a transition leads into");
    let a = article(&s, &token, "machine", json!({}));
    let path = format!("/api/v1/articles/{}", id_of(&a));
    let r = s.api("PATCH", &path, Some(&token), Some(&json!({"status": "archived"})));
    let v = s.expect_err(&r, 409, "CONFLICT", "draft → archived");
    ensure_eq!(s, error_fields(&v), vec!["status".to_string()], "409 names the field");
    let msg = v["errors"][0]["message"].as_str().unwrap_or("");
    ensure!(s, msg.contains("draft") && msg.contains("archived") && msg.contains("published"), "message: {msg}");
    let d = s.expect_data(&s.api("PATCH", &path, Some(&token), Some(&json!({"status": "draft"}))), 200, "unchanged");
    ensure_eq!(s, d["status"].as_str(), Some("draft"), "keeping the state is fine");
    let d =
        s.expect_data(&s.api("PATCH", &path, Some(&token), Some(&json!({"status": "published"}))), 200, "→ published");
    ensure_eq!(s, d["status"].as_str(), Some("published"), "a listed change");
    let r = s.api("PUT", &path, Some(&token), Some(&json!({"title": "t", "slug": "machine"})));
    s.expect_err(&r, 409, "CONFLICT", "PUT resets status to its default draft: published → draft is not listed");
    let d =
        s.expect_data(&s.api("PATCH", &path, Some(&token), Some(&json!({"status": "archived"}))), 200, "→ archived");
    ensure_eq!(s, d["status"].as_str(), Some("archived"), "a listed change");
}

protocols!(every_write_is_a_change_event_on_the_stream);
fn every_write_is_a_change_event_on_the_stream(p: Proto) {
    let s = start(p);
    let (_, token) = s.user("Streamer");
    let path = "/api/events?resources=articles";
    let opened = s.session().into_sse(path, &[]);
    let mut st = opened.unwrap_or_else(|r| panic!("GET {path}: {r:?}\nlog:\n{}", s.log_tail()));
    st.expect_preamble().unwrap_or_else(|e| panic!("preamble: {e}\nlog:\n{}", s.log_tail()));
    let mut next = |what: &str| {
        let ev = st.next_non_heartbeat(IO_TIMEOUT).unwrap_or_else(|e| panic!("{what}: {e}\nlog:\n{}", s.log_tail()));
        ensure_eq!(s, ev.event(), Some("change"), "{what}: {ev:?}");
        ev.data_json()
    };
    let a = article(&s, &token, "streamed", json!({}));
    let id = id_of(&a);
    let d = next("create");
    ensure_eq!(
        s,
        (d["resource"].clone(), d["action"].clone(), d["id"].clone()),
        (json!("articles"), json!("create"), json!(id)),
        "{d}"
    );
    ensure_eq!(s, d["record"], a, "the created record");
    let path = format!("/api/v1/articles/{id}");
    let u = s.expect_data(&s.api("PATCH", &path, Some(&token), Some(&json!({"views": 3}))), 200, "PATCH");
    let d = next("update");
    ensure_eq!(s, (d["action"].clone(), d["record"].clone()), (json!("update"), u), "{d}");
    let r = s.api("PATCH", &path, Some(&token), Some(&json!({"status": "archived"})));
    s.expect_err(&r, 409, "CONFLICT", "a refused change");
    s.expect_bodyless("DELETE", &path, &[("Authorization", &format!("Bearer {token}"))], 204, "DELETE");
    let d = next("delete after a refused change (which sent nothing)");
    ensure_eq!(
        s,
        (d["action"].clone(), d["id"].clone(), d["record"].clone()),
        (json!("delete"), json!(id), Value::Null),
        "{d}"
    );
}

/// The rules that touch SQL most (unique, ref, cascade, filters, owner lists), on PostgreSQL.
#[test]
fn the_engine_on_postgresql() {
    let Some(base) = crate::cluster::test_server() else { return };
    let url = crate::cluster::fresh_database(&base, "resources");
    let toml = format!(
        "{}\n{RESOURCES}",
        Server::api_builder().set("cluster", &format!("database_url = \"{url}\"")).to_extra_toml()
    );
    let s = Server::start(&toml);
    let (_, alice) = s.user("Alice");
    let (_, bob) = s.user("Bob");
    let a = article(&s, &alice, "pg", json!({"views": 2, "featured": true, "publishedAt": "2026-01-01T00:00:00Z"}));
    let b = article(&s, &alice, "pg2", json!({"views": 1, "featured": false}));
    let r = s.api("POST", "/api/v1/articles", Some(&bob), Some(&json!({"title": "t", "slug": "pg"})));
    let v = s.expect_err(&r, 409, "CONFLICT", "duplicate slug on PostgreSQL");
    ensure_eq!(s, error_fields(&v), vec!["slug".to_string()], "409 names the field");
    let q = |query: &str| ids(&list(&s, None, &format!("/api/v1/articles?{query}")));
    ensure_eq!(s, q("sort=views"), vec![id_of(&b), id_of(&a)], "sort");
    ensure_eq!(s, q("featured=true&views.gte=2&q=PG"), vec![id_of(&a)], "filters and q");
    let theirs = s.api("POST", "/api/v1/notes", Some(&alice), Some(&json!({"body": "theirs"})));
    let theirs = id_of(&s.expect_data(&theirs, 201, "Alice's note"));
    let path = format!("/api/v1/articles/{}/comments", id_of(&a));
    let r = s.api("POST", &path, Some(&bob), Some(&json!({"text": "x", "note": theirs})));
    s.expect_invalid(&r, &["note"], "a ref to another's note");
    let r = s.api("POST", &path, Some(&bob), Some(&json!({"text": "x"})));
    let c = s.expect_data(&r, 201, "a comment");
    ensure_eq!(s, total(&s, Some(&alice), "/api/v1/comments"), 0, "owner read: Alice sees none of Bob's");
    let r = s.api("GET", &format!("/api/v1/comments/{}", id_of(&c)), Some(&alice), None);
    s.expect_err(&r, 404, "NOT_FOUND", "another's comment");
    let auth = format!("Bearer {alice}");
    let del = format!("/api/v1/articles/{}", id_of(&a));
    s.expect_bodyless("DELETE", &del, &[("Authorization", &auth)], 204, "DELETE");
    ensure_eq!(s, total(&s, Some(&bob), "/api/v1/comments"), 0, "the comment went with its article");
    let n = article(&s, &alice, "pg3", json!({}));
    ensure!(s, id_of(&n) > id_of(&b), "ids never reused");
}

protocols!(a_record_read_again_is_never_stale_after_a_write_or_a_cascade);
/// A record read twice is answered the second time from the worker's memo (one worker): a
/// change, a delete, its parent's delete and its owner's delete must each be seen at once,
/// and another user still gets 404 for an owner-only record the memo holds.
fn a_record_read_again_is_never_stale_after_a_write_or_a_cascade(p: Proto) {
    let s = Server::start(&format!("{}\n{RESOURCES}", Server::api_builder().workers(1).to_extra_toml())).on(p);
    let (_, token) = s.user("Reader");
    let (_, other) = s.user("Other");
    let get = |path: &str, t: &str| s.api("GET", path, Some(t), None);
    let a = article(&s, &token, "memo", json!({}));
    let path = format!("/api/v1/articles/{}", id_of(&a));
    for _ in 0..3 {
        s.expect_data(&get(&path, &token), 200, "GET the article");
    }
    s.expect_data(&s.api("PATCH", &path, Some(&token), Some(&json!({"title": "Changed"}))), 200, "PATCH");
    let d = s.expect_data(&get(&path, &token), 200, "GET after PATCH");
    ensure_eq!(s, d["title"], json!("Changed"), "the change is seen at once: {d}");
    // A note (owner read) held in the memo: its owner reads it, another user never does.
    let r = s.api("POST", "/api/v1/notes", Some(&token), Some(&json!({"body": "mine"})));
    let note = format!("/api/v1/notes/{}", id_of(&s.expect_data(&r, 201, "note")));
    for _ in 0..3 {
        s.expect_data(&get(&note, &token), 200, "GET own note");
        s.expect_err(&get(&note, &other), 404, "NOT_FOUND", "another's note, memo or not");
    }
    // A step under the note, read until held; the note's delete takes it.
    let r = s.api("POST", &format!("{note}/steps"), Some(&token), Some(&json!({"text": "one"})));
    let step = format!("/api/v1/steps/{}", id_of(&s.expect_data(&r, 201, "step")));
    for _ in 0..3 {
        s.expect_data(&get(&step, &token), 200, "GET the step");
    }
    s.expect_bodyless("DELETE", &note, &[("Authorization", &format!("Bearer {token}"))], 204, "DELETE the note");
    s.expect_err(&get(&step, &token), 404, "NOT_FOUND", "the step went with its note");
    // The article's owner deleted: the article (held) goes with them.
    let me = s.expect_data(&s.api("GET", "/api/v1/auth/me", Some(&token), None), 200, "me");
    let (_, admin) = s.admin();
    let r = s.api("DELETE", &format!("/api/v1/users/{}", id_of(&me)), Some(&admin), None);
    ensure_eq!(s, r.status, 204, "DELETE the user: {r:?}");
    s.expect_err(&get(&path, &other), 404, "NOT_FOUND", "the article went with its owner");
}
