//! Records of declared resources (`crate::resources`): the store API the resource handlers
//! call, over SQLite and PostgreSQL alike. One table per resource, named after it, with
//! `id`, `owner_id`, `parent_id` (nested only), one typed column per field (named after the
//! field, always quoted), `created_at`, `updated_at`.
//!
//! Every value is a placeholder; identifiers come only from validated declarations and are
//! quoted. Writes run in one transaction with their checks (refs, the guard the caller
//! passes, the change event), so nothing half-done is ever stored.

use crate::resources::record::Action;
use crate::resources::value::Cell;
use crate::resources::{Registry, Resource, SortKey};

use super::StoreError;

/// Who is asking, for `ref` checks (a ref must name a record the caller may read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Viewer {
    /// The caller's user id.
    pub user_id: i64,
    /// The caller is an admin (reads everything).
    pub admin: bool,
}

/// A filter's comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `?f=v`
    Eq,
    /// `?f.gte=v`
    Gte,
    /// `?f.lte=v`
    Lte,
}

/// One filter of a list: field `field` (index into the resource's fields) compared to `value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Filter {
    /// Index into `Resource::fields`.
    pub field: usize,
    /// The comparison.
    pub op: Op,
    /// The value, in stored form.
    pub value: Cell,
}

/// A list request, already validated against the resource.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ListQuery {
    /// Only records owned by this user (an `owner` read rule for a non-admin).
    pub owner: Option<i64>,
    /// Only children of this parent record (a nested list).
    pub parent: Option<i64>,
    /// Exact and range filters, all of which must hold.
    pub filters: Vec<Filter>,
    /// `?q=`: case-insensitive "contains" over the `search` fields (any of them).
    pub q: Option<String>,
    /// The order (ties are always broken by `id`, in the last key's direction, appended by
    /// the store).
    pub sort: Vec<SortKey>,
    /// Page number from 1.
    pub page: u32,
    /// Page size 1..=100.
    pub limit: u32,
}

/// A write refused by the caller's guard, a `ref` that names no readable record, or a parent
/// record that is gone.
#[derive(Debug)]
pub enum Refused<E> {
    /// The guard said no; its reason.
    Guard(E),
    /// A `ref` field names no record the viewer may read; the field's name.
    Ref(&'static str),
    /// The parent record (nested create) does not exist.
    Parent,
}

/// The result of a guarded write: the store's own error outside, the refusal inside.
pub type Guarded<T, E> = Result<Result<T, Refused<E>>, StoreError>;

/// A stored change event (the same id sequence as notifications).
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    /// The event id.
    pub id: i64,
    /// The resource's name.
    pub resource: String,
    /// What happened.
    pub action: Action,
    /// The record's id.
    pub record_id: i64,
    /// The record's owner (who may read it under an `owner` rule).
    pub owner_id: i64,
    /// The event's data (`resources::record::change_json`).
    pub data: Vec<u8>,
}

/// The declarations the store serves: every record call takes the registry (for `ref` checks
/// and cascades) and the resource (static: the configuration lives for the process).
pub type Res = &'static Resource;

/// What the record calls need besides their arguments.
#[derive(Clone, Copy)]
pub struct Scope {
    /// Every declared resource.
    pub registry: &'static Registry,
    /// The one this call is about.
    pub res: Res,
}

pub(crate) mod sql;
pub(crate) mod sqlite;

/// How a `ref` field's value is checked: the table holding the record, and whether it must
/// be the viewer's own; `None`: the viewer may read no record of it.
pub(crate) fn ref_check<'r>(registry: &'r Registry, target: &'r str, viewer: Viewer) -> Option<(&'r str, Option<i64>)> {
    if target == "users" {
        return Some(("users", None));
    }
    let to = registry.get(target)?;
    match to.read {
        crate::resources::Read::Public | crate::resources::Read::SignedIn => Some((&to.name, None)),
        _ if viewer.admin => Some((&to.name, None)),
        crate::resources::Read::Owner => Some((&to.name, Some(viewer.user_id))),
        crate::resources::Read::Admin => None,
    }
}

/// The `ref` fields of `res` with a value, with what checks them: (field, id, table, owner).
pub(crate) fn refs<'a>(
    scope: Scope,
    viewer: Viewer,
    cells: &'a [Cell],
) -> impl Iterator<Item = (&'static str, i64, Option<(&'static str, Option<i64>)>)> + 'a {
    scope.res.fields.iter().zip(cells).filter_map(move |(f, c)| match (f.kind, c, f.refers.as_deref()) {
        (crate::resources::Kind::Ref, Cell::Int(id), Some(target)) => {
            Some((f.name.as_str(), *id, ref_check(scope.registry, target, viewer)))
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests;

/// For tests elsewhere in the store: the built-in `posts` and a post of `user` (its own
/// parent), as the posts routes create one.
#[cfg(test)]
pub(crate) mod testing {
    use super::{Scope, Viewer};
    use crate::resources::record::Record;
    use crate::resources::value::Cell;
    use crate::resources::Registry;
    use crate::store::{Store, StoreError};

    /// The built-in `posts`, in a registry of its own.
    pub(crate) fn posts() -> Scope {
        let registry: &'static Registry =
            Box::leak(Box::new(Registry { list: crate::resources::builtin::resources(), declared: Vec::new() }));
        Scope { registry, res: &registry.list[0] }
    }

    /// A post by `user` titled `title`; `Err` when the store refuses it (no such user).
    pub(crate) fn add_post(store: &Store, user: i64, title: &str) -> Result<Record, StoreError> {
        let viewer = Viewer { user_id: user, admin: false };
        let cells = vec![Cell::Text(title.into()), Cell::Text(String::new())];
        match store.record_create(posts(), viewer, user, Some(user), cells)? {
            Ok((rec, _)) => Ok(rec),
            Err(refused) => Err(StoreError::Sql(format!("{refused:?}"))),
        }
    }
}
