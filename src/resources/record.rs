//! A record of a declared resource as the store returns it, and its JSON: the record a client
//! sees, the strong ETag of that representation, and the data of its change event.
//!
//! A record shows `id`, `ownerId`, `parentId` (nested resources), `userId` (children of
//! `users`: the user they belong to, as the built-in posts always showed it), its fields in
//! declaration order, then `createdAt` and `updatedAt`. Nothing here knows about SQL or HTTP.

use std::io::Write as _;

use super::value::Cell;
use super::Resource;

/// One stored record.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Row id; never given twice.
    pub id: i64,
    /// The user who created it (for a child of `users`, that user).
    pub owner_id: i64,
    /// The parent record's id (nested resources only).
    pub parent_id: Option<i64>,
    /// The fields' values, in declaration order (one per field of the resource).
    pub cells: Vec<Cell>,
    /// Creation time, RFC 3339 UTC with milliseconds.
    pub created_at: String,
    /// Last change, same format.
    pub updated_at: String,
}

/// What happened to a record, in a change event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// POST.
    Create,
    /// PUT or PATCH.
    Update,
    /// DELETE.
    Delete,
}

impl Action {
    /// `"create"`, `"update"`, `"delete"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Update => "update",
            Action::Delete => "delete",
        }
    }
}

impl Record {
    /// The record as compact JSON, appended to `out`.
    pub fn write_json(&self, res: &Resource, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"id\":");
        int(out, self.id);
        out.extend_from_slice(b",\"ownerId\":");
        int(out, self.owner_id);
        if let Some(p) = self.parent_id {
            out.extend_from_slice(b",\"parentId\":");
            int(out, p);
            if res.parent.as_deref() == Some("users") {
                out.extend_from_slice(b",\"userId\":");
                int(out, p);
            }
        }
        for (f, cell) in res.fields.iter().zip(&self.cells) {
            out.push(b',');
            let _ = serde_json::to_writer(&mut *out, &f.name);
            out.push(b':');
            match cell {
                Cell::Null => out.extend_from_slice(b"null"),
                Cell::Int(n) => int(out, *n),
                Cell::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
                Cell::Num(n) => {
                    let _ = serde_json::to_writer(&mut *out, &serde_json::Number::from_f64(*n));
                }
                Cell::Text(s) => {
                    let _ = serde_json::to_writer(&mut *out, s);
                }
            }
        }
        out.extend_from_slice(b",\"createdAt\":");
        let _ = serde_json::to_writer(&mut *out, &self.created_at);
        out.extend_from_slice(b",\"updatedAt\":");
        let _ = serde_json::to_writer(&mut *out, &self.updated_at);
        out.push(b'}');
    }

    /// The record as JSON bytes.
    pub fn to_json(&self, res: &Resource) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        self.write_json(res, &mut out);
        out
    }

    /// The envelope `{"code":status,"data":record,"message":"OK"|"Created"}`, written once.
    pub fn envelope(&self, res: &Resource, status: u16) -> Vec<u8> {
        let mut out = Vec::with_capacity(160);
        out.extend_from_slice(b"{\"code\":");
        int(&mut out, i64::from(status));
        out.extend_from_slice(b",\"data\":");
        self.write_json(res, &mut out);
        out.extend_from_slice(if status == 201 { b",\"message\":\"Created\"}" } else { b",\"message\":\"OK\"}" });
        out
    }

    /// The strong ETag of the record's JSON (FNV-1a, quoted hex).
    pub fn etag(&self, res: &Resource) -> String {
        let h = self
            .to_json(res)
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3));
        format!("\"{h:016x}\"")
    }
}

/// The data of a change event: `{"resource","action","id","record"}` (`record` null on delete).
pub fn change_json(res: &Resource, action: Action, id: i64, record: Option<&Record>) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    out.extend_from_slice(b"{\"resource\":");
    let _ = serde_json::to_writer(&mut out, &res.name);
    let _ = write!(out, ",\"action\":\"{}\",\"id\":{id},\"record\":", action.as_str());
    match record {
        Some(r) => r.write_json(res, &mut out),
        None => out.extend_from_slice(b"null"),
    }
    out.push(b'}');
    out
}

/// `n` in decimal.
fn int(out: &mut Vec<u8>, n: i64) {
    let _ = write!(out, "{n}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_post_shows_user_id_and_its_fields_in_order() {
        let res = super::super::builtin::posts();
        let rec = Record {
            id: 7,
            owner_id: 3,
            parent_id: Some(3),
            cells: vec![Cell::Text("Hi \"there\"".into()), Cell::Text(String::new())],
            created_at: "2026-01-01T00:00:00.000Z".into(),
            updated_at: "2026-01-01T00:00:00.000Z".into(),
        };
        let v: serde_json::Value = serde_json::from_slice(&rec.to_json(&res)).expect("json");
        assert_eq!(
            v,
            serde_json::json!({"id": 7, "ownerId": 3, "parentId": 3, "userId": 3, "title": "Hi \"there\"", "body": "",
                "createdAt": "2026-01-01T00:00:00.000Z", "updatedAt": "2026-01-01T00:00:00.000Z"})
        );
        let env: serde_json::Value = serde_json::from_slice(&rec.envelope(&res, 201)).expect("json");
        assert_eq!(env["message"], "Created");
        let change: serde_json::Value =
            serde_json::from_slice(&change_json(&res, Action::Delete, 7, None)).expect("json");
        assert_eq!(change, serde_json::json!({"resource": "posts", "action": "delete", "id": 7, "record": null}));
        assert_eq!(rec.etag(&res), rec.etag(&res));
    }
}
