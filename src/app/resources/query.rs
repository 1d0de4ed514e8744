//! The query of a list request against a resource: `page` (≥ 1), `limit` (1–100, default
//! 20), `sort` (a comma list of `sort` fields and `id`, `createdAt`, `updatedAt`, each
//! optionally `-`), `?<field>=v` on `filter` fields, `?<field>.gte=` / `.lte=` on integer,
//! number and datetime filter fields, `q` over the `search` fields (only where there are any)
//! and `version`. Anything else, or any parameter given twice, is 400 with `errors` naming it.
//!
//! A filter value is read as its field's type from the query string (`true`/`false` for a
//! boolean, digits for an integer, text for the rest) and then checked by the one value check
//! (`resources::value::check`), so a filter takes exactly what a body would.

use serde_json::Value;

use crate::app::validate::decode_query;
use crate::error::{Error, FieldError};
use crate::http::request::query_pairs;
use crate::resources::value::check;
use crate::resources::{parse, Field, Kind, Resource};
use crate::store::records::{Filter, ListQuery, Op};

/// The highest page number.
const MAX_PAGE: u32 = 1_000_000;

/// `query` (raw, as in the request line) as a list query of `res`, or 400 naming every bad
/// parameter. Owner and parent are left for the caller.
pub fn parse(res: &Resource, query: &str) -> Result<ListQuery, Error> {
    let mut q = ListQuery { page: 1, limit: 20, sort: res.default_sort.clone(), ..ListQuery::default() };
    let mut errors = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for (key, raw) in query_pairs(query) {
        if seen.contains(&key) {
            errors.push(FieldError::new(key, "is given more than once"));
            continue;
        }
        seen.push(key);
        let Some(value) = decode_query(raw) else {
            errors.push(FieldError::new(key, "is not valid percent-encoded UTF-8"));
            continue;
        };
        if let Err(message) = one(res, &mut q, key, &value) {
            errors.push(FieldError::new(key, message));
        }
    }
    if errors.is_empty() {
        Ok(q)
    } else {
        Err(Error::BadParams(errors))
    }
}

/// Apply parameter `key` = `value` to `q`.
fn one(res: &Resource, q: &mut ListQuery, key: &str, value: &str) -> Result<(), String> {
    let number = |min: u32, max: u32| {
        value
            .parse::<u32>()
            .ok()
            .filter(|n| (min..=max).contains(n))
            .ok_or(format!("must be an integer from {min} to {max}"))
    };
    match key {
        "page" => q.page = number(1, MAX_PAGE)?,
        "limit" => q.limit = number(1, 100)?,
        "sort" => q.sort = parse::sort_keys(res, value)?,
        "version" => {}
        "q" if res.fields.iter().any(|f| f.search) => q.q = Some(value.to_string()),
        _ => {
            let (name, op) = match (key.strip_suffix(".gte"), key.strip_suffix(".lte")) {
                (Some(name), _) => (name, Op::Gte),
                (_, Some(name)) => (name, Op::Lte),
                _ => (key, Op::Eq),
            };
            let found = res.fields.iter().position(|f| f.name == name && f.filter);
            let Some(index) = found.filter(|&i| op == Op::Eq || res.fields[i].kind.has_range_filter()) else {
                return Err("unknown parameter".into());
            };
            let field = &res.fields[index];
            let value = check(field, &typed(field, value)?)?;
            q.filters.push(Filter { field: index, op, value });
        }
    }
    Ok(())
}

/// A query-string value as the JSON value of `field`'s type.
fn typed(field: &Field, s: &str) -> Result<Value, String> {
    Ok(match field.kind {
        Kind::Integer | Kind::Ref => Value::from(s.parse::<i64>().map_err(|_| "must be an integer")?),
        Kind::Number => {
            let n = s.parse::<f64>().ok().and_then(serde_json::Number::from_f64).ok_or("must be a number")?;
            Value::Number(n)
        }
        Kind::Boolean => match s {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => return Err("must be true or false".into()),
        },
        Kind::String | Kind::Text | Kind::Enum | Kind::Datetime | Kind::Email | Kind::Url => {
            Value::String(s.to_string())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::value::Cell;
    use crate::resources::SortKey;

    fn res() -> Resource {
        let mut res = crate::resources::builtin::posts();
        res.fields[0].search = true;
        res.fields[0].sort = true;
        let mut n = Field::new("rating", Kind::Number);
        n.filter = true;
        let mut b = Field::new("done", Kind::Boolean);
        b.filter = true;
        let mut d = Field::new("due", Kind::Datetime);
        d.filter = true;
        res.fields.extend([n, b, d]);
        res
    }

    fn bad(query: &str) -> Vec<String> {
        match parse(&res(), query) {
            Err(Error::BadParams(errors)) => errors.into_iter().map(|e| e.field).collect(),
            other => panic!("{query}: expected 400, got {other:?}"),
        }
    }

    #[test]
    fn defaults_and_every_parameter_kind() {
        let q = parse(&res(), "").expect("empty");
        assert_eq!((q.page, q.limit, q.sort.clone()), (1, 20, vec![SortKey { key: "id".into(), desc: true }]));
        let q = parse(&res(), "page=2&limit=5&sort=-title,id&q=a%20b&done=true&rating.gte=1.5&due.lte=2026-01-01T00:00:00%2B01:00&version=1")
            .expect("valid");
        assert_eq!((q.page, q.limit, q.q.as_deref()), (2, 5, Some("a b")));
        assert_eq!(q.sort[0], SortKey { key: "title".into(), desc: true });
        assert_eq!(
            q.filters,
            [
                Filter { field: 3, op: Op::Eq, value: Cell::Bool(true) },
                Filter { field: 2, op: Op::Gte, value: Cell::Num(1.5) },
                Filter { field: 4, op: Op::Lte, value: Cell::Text("2025-12-31T23:00:00.000Z".into()) },
            ]
        );
    }

    #[test]
    fn every_bad_parameter_is_named() {
        assert_eq!(bad("page=0&limit=101&sort=body"), ["page", "limit", "sort"]);
        assert_eq!(bad("done=yes&rating=x&due=yesterday"), ["done", "rating", "due"]);
        assert_eq!(bad("title=x&done.gte=true&pageSize=1"), ["title", "done.gte", "pageSize"]);
        assert_eq!(bad("page=1&page=2"), ["page"]);
        assert_eq!(bad("q=%zz"), ["q"]);
        // No search field: `q` is unknown.
        assert!(matches!(parse(&crate::resources::builtin::posts(), "q=x"), Err(Error::BadParams(_))));
    }
}
