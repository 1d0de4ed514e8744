//! The record validator: a JSON object against a resource's fields, into the cells the store
//! writes (one per field, in declaration order). Every problem is one `errors` entry of a 422
//! (`VALIDATION_ERROR`): an unknown key, a server-managed key, `__proto__`/`constructor`/
//! `prototype`, a wrong type, a limit, an enum value, a required field missing or null. Each
//! value goes through `resources::value::check`, the one check of a value against a field.
//!
//! A new record ([`create`]) and a replacement ([`replace`]) take every field: an absent one
//! becomes its default, else null (a required one is an error); an explicit `null` for a field
//! with a default is that default (such a field never holds null). A patch ([`patch`]) takes only
//! the fields given; [`merge`] lays it onto the current record inside the store's transaction.
//! [`transitions`] is the state-machine check of a change (409), also run there.
//!
//! Nothing here does I/O or knows who is asking.

use serde_json::{Map, Value};

use crate::error::{Error, FieldError};
use crate::resources::value::{check, Cell};
use crate::resources::{Kind, Resource};

/// Keys the server manages: a body that names one is refused.
const MANAGED: &[&str] = &["id", "ownerId", "parentId", "userId", "createdAt", "updatedAt"];

/// Keys a JavaScript object treats specially: refused by name.
const PROTO: &[&str] = &["__proto__", "constructor", "prototype"];

/// A patch: for each field in declaration order, its new value or `None` (unchanged).
pub type Patch = Vec<Option<Cell>>;

/// The cells of a new record, or 422 naming every problem. A state-machine enum field must
/// start in a state no transition leads into (or its default).
pub fn create(res: &Resource, map: Map<String, Value>) -> Result<Vec<Cell>, Error> {
    let mut errors = unknown_keys(res, &map);
    let cells = every_field(res, &map, &mut errors);
    for (f, cell) in res.fields.iter().zip(&cells) {
        if let (Kind::Enum, Cell::Text(state)) = (f.kind, cell) {
            if !f.may_start_in(state) {
                errors.push(FieldError::new(&f.name, format!("a new record cannot start in {state}")));
            }
        }
    }
    finish(errors).map(|()| cells)
}

/// The cells replacing a record (PUT), or 422 naming every problem.
pub fn replace(res: &Resource, map: Map<String, Value>) -> Result<Vec<Cell>, Error> {
    let mut errors = unknown_keys(res, &map);
    let cells = every_field(res, &map, &mut errors);
    finish(errors).map(|()| cells)
}

/// The fields a PATCH changes, or 422 naming every problem.
pub fn patch(res: &Resource, map: Map<String, Value>) -> Result<Patch, Error> {
    let mut errors = unknown_keys(res, &map);
    let cells = res
        .fields
        .iter()
        .map(|f| {
            let v = map.get(&f.name)?;
            let v = if v.is_null() { f.default.as_ref().unwrap_or(v) } else { v };
            check(f, v).map_err(|m| errors.push(FieldError::new(&f.name, m))).ok()
        })
        .collect();
    finish(errors).map(|()| cells)
}

/// `patch` laid onto `current`: every field, in declaration order.
pub fn merge(current: &[Cell], patch: Patch) -> Vec<Cell> {
    current.iter().zip(patch).map(|(old, new)| new.unwrap_or_else(|| old.clone())).collect()
}

/// A change from `before` to `after` checked against the resource's state machines: a field
/// with transitions may keep its state or move to one listed for it, else 409 naming the field
/// and the states it may move to. From null a field may move to any state a new record may
/// start in.
pub fn transitions(res: &Resource, before: &[Cell], after: &[Cell]) -> Result<(), Error> {
    let mut errors = Vec::new();
    for ((f, old), new) in res.fields.iter().zip(before).zip(after) {
        if f.kind != Kind::Enum || f.transitions.is_empty() || old == new {
            continue;
        }
        let (Some(from), Some(to)) = (old.as_str(), new.as_str()) else {
            if let Some(to) = new.as_str().filter(|s| !f.may_start_in(s)) {
                errors.push(FieldError::new(&f.name, format!("cannot change from null to {to}")));
            }
            continue;
        };
        let next = f.next_states(from).unwrap_or_default();
        if !next.iter().any(|s| s == to) {
            let allowed = if next.is_empty() { "none".to_string() } else { next.join(", ") };
            errors.push(FieldError::new(&f.name, format!("cannot change from {from} to {to}; allowed: {allowed}")));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::ConflictFields(errors))
    }
}

/// A problem for each key that is not a field.
fn unknown_keys(res: &Resource, map: &Map<String, Value>) -> Vec<FieldError> {
    map.keys()
        .filter(|k| res.field(k).is_none())
        .map(|k| {
            let why = if MANAGED.contains(&k.as_str()) {
                "is set by the server"
            } else if PROTO.contains(&k.as_str()) {
                "is not allowed"
            } else {
                "unknown field"
            };
            FieldError::new(k.as_str(), why)
        })
        .collect()
}

/// Every field's cell: its value checked, else its default, else null (required: an error).
fn every_field(res: &Resource, map: &Map<String, Value>, errors: &mut Vec<FieldError>) -> Vec<Cell> {
    res.fields
        .iter()
        .map(|f| {
            // A field with a default never holds null: an explicit null stands for the default.
            let given = map.get(&f.name).filter(|v| !(v.is_null() && f.default.is_some())).or(f.default.as_ref());
            let checked = match given {
                Some(v) => check(f, v),
                None if f.required => Err("is required".to_string()),
                None => Ok(Cell::Null),
            };
            checked.unwrap_or_else(|m| {
                errors.push(FieldError::new(&f.name, m));
                Cell::Null
            })
        })
        .collect()
}

fn finish(errors: Vec<FieldError>) -> Result<(), Error> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::Validation(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{builtin, Field};
    use serde_json::json;

    fn object(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    fn fields_of(e: Error) -> Vec<String> {
        match e {
            Error::Validation(errors) | Error::ConflictFields(errors) => errors.into_iter().map(|e| e.field).collect(),
            other => panic!("expected field errors, got {other:?}"),
        }
    }

    fn with_status() -> Resource {
        let mut res = builtin::posts();
        let mut status = Field::new("status", Kind::Enum);
        status.values = vec!["draft".into(), "published".into(), "archived".into()];
        status.default = Some(json!("draft"));
        status.transitions =
            vec![("draft".into(), vec!["published".into()]), ("published".into(), vec!["archived".into()])];
        res.fields.push(status);
        res
    }

    #[test]
    fn a_new_record_takes_defaults_and_names_every_problem() {
        let posts = builtin::posts();
        let cells = create(&posts, object(json!({"title": "Hi"}))).expect("valid");
        assert_eq!(cells, [Cell::Text("Hi".into()), Cell::Text(String::new())]);
        let bad = json!({"body": 5, "userId": 1, "__proto__": {}, "extra": true, "id": 3});
        let mut got = fields_of(create(&posts, object(bad)).expect_err("invalid"));
        got.sort();
        assert_eq!(got, ["__proto__", "body", "extra", "id", "title", "userId"]);
        assert_eq!(fields_of(create(&posts, object(json!({"title": null}))).expect_err("null")), ["title"]);
    }

    #[test]
    fn a_replacement_resets_absent_optional_fields_and_a_patch_keeps_them() {
        let posts = builtin::posts();
        let current = [Cell::Text("Old".into()), Cell::Text("text".into())];
        let put = replace(&posts, object(json!({"title": "New"}))).expect("valid");
        assert_eq!(put, [Cell::Text("New".into()), Cell::Text(String::new())]);
        let p = patch(&posts, object(json!({"title": "New"}))).expect("valid");
        assert_eq!(merge(&current, p), [Cell::Text("New".into()), Cell::Text("text".into())]);
        assert_eq!(fields_of(patch(&posts, object(json!({"title": ""}))).expect_err("empty")), ["title"]);
        assert!(patch(&posts, object(json!({}))).is_ok_and(|p| p.iter().all(Option::is_none)));
    }

    #[test]
    fn state_machines_refuse_unlisted_changes_and_late_starts() {
        let res = with_status();
        let st = |s: &str| [Cell::Text("t".into()), Cell::Text(String::new()), Cell::Text(s.into())];
        assert!(transitions(&res, &st("draft"), &st("published")).is_ok());
        assert!(transitions(&res, &st("draft"), &st("draft")).is_ok(), "unchanged is fine");
        let Err(Error::ConflictFields(errors)) = transitions(&res, &st("draft"), &st("archived")) else {
            panic!("expected 409")
        };
        assert_eq!(errors[0].field, "status");
        assert_eq!(errors[0].message, "cannot change from draft to archived; allowed: published");
        let Err(Error::ConflictFields(errors)) = transitions(&res, &st("archived"), &st("draft")) else {
            panic!("expected 409")
        };
        assert!(errors[0].message.ends_with("allowed: none"), "{}", errors[0].message);
        let late = create(&res, object(json!({"title": "t", "status": "published"}))).expect_err("late start");
        assert_eq!(fields_of(late), ["status"]);
        assert!(create(&res, object(json!({"title": "t"}))).is_ok_and(|c| c[2] == Cell::Text("draft".into())));
    }
}
