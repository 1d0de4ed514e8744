//! Who may do what with a declared resource's records: the `read`, `create`, `update` and
//! `delete` rules, answered in one place for every route and transport.
//!
//! - `public` read needs no token (a token that is sent is still checked: a bad one is 401);
//!   every other rule needs a bearer token (401 `token required`).
//! - `owner` read: a caller sees only their own records (an admin sees all); another's record
//!   is 404, never 403, and lists hold only one's own.
//! - `admin` read: a non-admin's get is 404 (as for any record they may not read) and their
//!   list is 403 (a list exists for everyone; only its content is the admins').
//! - A write the rule refuses is 403, or 404 when the caller may not read the record either.
//!
//! The rules are pure functions of the caller and the record; the handlers call them before
//! the pool (what needs no record) and inside the store's transaction (what does).

use crate::app::session::{self, Caller};
use crate::app::App;
use crate::error::Error;
use crate::http::request::Request;
use crate::resources::record::Record;
use crate::resources::{Create, Read, Resource, Write};
use crate::store::records::{ListQuery, Viewer};

/// The caller of a read: `None` for an anonymous read of a `public` resource.
pub fn reader(app: &App, req: &Request<'_>, res: &Resource) -> Result<Option<Caller>, Error> {
    match res.read {
        Read::Public => session::optional(app, req),
        Read::SignedIn | Read::Owner | Read::Admin => session::require(app, req).map(Some),
    }
}

/// Whether `caller` may read `rec` of `res`.
pub fn may_read(res: &Resource, caller: Option<&Caller>, rec: &Record) -> bool {
    may_read_owned(res, caller, rec.owner_id)
}

/// Whether `caller` may read a record of `res` owned by `owner` (the rule the event
/// streams ask too).
pub fn may_read_owned(res: &Resource, caller: Option<&Caller>, owner: i64) -> bool {
    res.read.allows(caller.map(viewer).as_ref(), owner)
}

/// Narrow a list of `res` to what `caller` may read: 403 for a non-admin on an `admin` read,
/// only their own records on an `owner` read.
pub fn narrow(res: &Resource, caller: Option<&Caller>, q: &mut ListQuery) -> Result<(), Error> {
    match (res.read, caller) {
        (Read::Admin, Some(c)) if !c.admin => Err(Error::Forbidden("only an admin may list these records")),
        (Read::Owner, Some(c)) if !c.admin => {
            q.owner = Some(c.user_id);
            Ok(())
        }
        _ => Ok(()),
    }
}

/// What may be decided about a create before any record is read: `admin` needs an admin;
/// `owner` under a user needs that user (or an admin).
pub fn may_create(res: &Resource, caller: &Caller, parent_id: Option<i64>) -> Result<(), Error> {
    let under_user = res.parent.as_deref() == Some("users");
    match res.create {
        Create::Admin if !caller.admin => Err(Error::Forbidden("only an admin may create these records")),
        Create::Owner if under_user && !caller.admin && parent_id != Some(caller.user_id) => {
            Err(Error::Forbidden("only the owner may create records here"))
        }
        _ => Ok(()),
    }
}

/// A create under `parent`, a record of another resource: `owner` needs its owner (or an
/// admin).
pub fn may_create_under(res: &Resource, caller: &Caller, parent: &Record) -> Result<(), Error> {
    if res.create == Create::Owner && !caller.admin && parent.owner_id != caller.user_id {
        return Err(Error::Forbidden("only the owner of the parent record may create records here"));
    }
    Ok(())
}

/// A change (`rule`: the resource's `update` or `delete`) of `rec`: 404 when the caller may
/// not read it, 403 when the rule refuses.
pub fn may_write(res: &Resource, rule: Write, caller: &Caller, rec: &Record) -> Result<(), Error> {
    if !may_read(res, Some(caller), rec) {
        return Err(Error::NotFound);
    }
    let allowed = caller.admin || (rule == Write::Owner && caller.user_id == rec.owner_id);
    if !allowed {
        return Err(Error::Forbidden("not allowed to change this record"));
    }
    Ok(())
}

/// The store's view of `caller`, for `ref` checks.
pub fn viewer(caller: &Caller) -> Viewer {
    Viewer { user_id: caller.user_id, admin: caller.admin }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin;

    const ME: Caller = Caller { user_id: 7, admin: false, gen: 0, read_ms: 0 };
    const ADMIN: Caller = Caller { user_id: 1, admin: true, gen: 0, read_ms: 0 };

    fn record(owner_id: i64) -> Record {
        Record {
            id: 1,
            owner_id,
            parent_id: Some(owner_id),
            cells: Vec::new(),
            created_at: String::new(),
            updated_at: String::new(),
        }
    }

    #[test]
    fn owner_reads_hide_others_records_and_lists() {
        let mut res = builtin::posts();
        res.read = Read::Owner;
        assert!(may_read(&res, Some(&ME), &record(7)));
        assert!(!may_read(&res, Some(&ME), &record(8)));
        assert!(may_read(&res, Some(&ADMIN), &record(8)));
        assert!(!may_read(&res, None, &record(7)));
        let mut q = ListQuery::default();
        narrow(&res, Some(&ME), &mut q).expect("a list");
        assert_eq!(q.owner, Some(7));
        let mut q = ListQuery::default();
        narrow(&res, Some(&ADMIN), &mut q).expect("a list");
        assert_eq!(q.owner, None);
        assert!(matches!(may_write(&res, Write::Owner, &ME, &record(8)), Err(Error::NotFound)));
    }

    #[test]
    fn writes_need_the_owner_or_an_admin() {
        let mut res = builtin::posts();
        assert!(may_write(&res, Write::Owner, &ME, &record(7)).is_ok());
        assert!(matches!(may_write(&res, Write::Owner, &ME, &record(8)), Err(Error::Forbidden(_))));
        assert!(may_write(&res, Write::Owner, &ADMIN, &record(8)).is_ok());
        assert!(matches!(may_write(&res, Write::Admin, &ME, &record(7)), Err(Error::Forbidden(_))));
        assert!(may_create(&res, &ME, Some(7)).is_ok());
        assert!(matches!(may_create(&res, &ME, Some(8)), Err(Error::Forbidden(_))));
        assert!(may_create(&res, &ADMIN, Some(8)).is_ok());
        res.create = Create::Admin;
        assert!(matches!(may_create(&res, &ME, Some(7)), Err(Error::Forbidden(_))));
        res.read = Read::Admin;
        assert!(matches!(narrow(&res, Some(&ME), &mut ListQuery::default()), Err(Error::Forbidden(_))));
    }
}
