//! The routes of the declared resources, added to the router from the registry at start:
//! for each resource, its collection (`/<name>`), its records (`/<name>/{id}`) and, when
//! nested, its collection under a parent record (`/<parent>/{id}/<name>`), under every API
//! base. Each pattern is [`Mount`]ed: the side table [`Mounts`] tells a handler, by the
//! pattern's index in the router, which resource and which place it answers for, so the
//! router keeps plain function pointers and a request allocates nothing to find them.
//!
//! This file only builds tables; it must not look at requests.

use crate::app::router::Router;
use crate::app::Handler;
use crate::http::request::Method;
use crate::resources::{Registry, Resource};

use super::handlers;

/// Where in a resource's paths a route sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// `/<name>`: every record the caller may read; `POST` for a top-level resource.
    Collection,
    /// `/<name>/{id}`: one record.
    Record,
    /// `/<parent>/{id}/<name>`: the records under one parent record.
    Children,
}

/// What a resource route answers for.
#[derive(Clone, Copy, Debug)]
pub struct Mount {
    /// The resource.
    pub res: &'static Resource,
    /// The place of the path.
    pub place: Place,
}

/// The mounts by router pattern index (`None`: a built-in route).
#[derive(Default)]
pub struct Mounts(Vec<Option<Mount>>);

impl Mounts {
    /// The mount of pattern `index`.
    pub fn get(&self, index: usize) -> Option<Mount> {
        self.0.get(index).copied().flatten()
    }
}

/// Add every resource of `registry` under `base` (`/api/v1`, `/api`).
pub fn add(router: &mut Router<Handler>, registry: &Registry, base: &str) {
    // Leaked once per pattern at start: the router holds static patterns.
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    for res in &registry.list {
        let collection = leak(format!("{base}/{}", res.name));
        router.add(Method::Get, collection, handlers::list);
        if !res.nested() {
            router.add(Method::Post, collection, handlers::create);
        }
        let record = leak(format!("{base}/{}/{{id}}", res.name));
        router
            .add(Method::Get, record, handlers::get)
            .add(Method::Put, record, handlers::replace)
            .add(Method::Patch, record, handlers::patch)
            .add(Method::Delete, record, handlers::delete);
        if let Some(parent) = &res.parent {
            let children = leak(format!("{base}/{parent}/{{id}}/{}", res.name));
            router.add(Method::Get, children, handlers::list).add(Method::Post, children, handlers::create);
        }
    }
}

/// The side table for `router`: each pattern [`add`] made, read back as its resource and
/// place (`/api/v1/<name>`, `/api/<name>/{id}`, `/api/v1/<parent>/{id}/<name>`).
pub fn mounts<H>(router: &Router<H>, registry: &'static Registry) -> Mounts {
    Mounts(router.patterns().map(|p| mount(registry, p)).collect())
}

/// The mount of one pattern, `None` for a built-in route.
fn mount(registry: &'static Registry, pattern: &str) -> Option<Mount> {
    let rest = pattern.strip_prefix("/api/v1/").or_else(|| pattern.strip_prefix("/api/"))?;
    let mut segs = rest.split('/');
    let (a, b, c, more) = (segs.next()?, segs.next(), segs.next(), segs.next());
    let (name, place) = match (b, c, more) {
        (None, _, _) => (a, Place::Collection),
        (Some("{id}"), None, _) => (a, Place::Record),
        (Some("{id}"), Some(name), None) => (name, Place::Children),
        _ => return None,
    };
    let res = registry.get(name)?;
    (place != Place::Children || res.parent.as_deref() == Some(a)).then_some(Mount { res, place })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::router::Match;

    fn registry() -> &'static Registry {
        let text = r#"
            [[resources]]
            name = "articles"
            [resources.fields.title]
            type = "string"
            [[resources]]
            name = "comments"
            parent = "articles"
            [resources.fields.text]
            type = "text"
        "#;
        let table: toml::Table = text.parse().expect("toml");
        let mut errors = Vec::new();
        let reg = crate::resources::parse::registry(table.get("resources"), &mut errors);
        assert_eq!(errors, Vec::<String>::new());
        Box::leak(Box::new(reg))
    }

    #[test]
    fn every_path_of_a_resource_is_mounted_with_its_methods() {
        let reg = registry();
        let mut router: Router<Handler> = Router::default();
        router.add(Method::Get, "/api/v1/users/{id}", handlers::get);
        add(&mut router, reg, "/api/v1");
        add(&mut router, reg, "/api");
        let mounts = mounts(&router, reg);
        assert!(mounts.get(0).is_none(), "a built-in route is no resource's");
        let found = |m: Method, path: &str| match router.find(m, path) {
            Match::Found(_, _, i) => mounts.get(i).map(|m| (m.res.name.as_str(), m.place)),
            _ => None,
        };
        assert_eq!(found(Method::Get, "/api/v1/articles"), Some(("articles", Place::Collection)));
        assert_eq!(found(Method::Post, "/api/articles"), Some(("articles", Place::Collection)));
        assert_eq!(found(Method::Put, "/api/v1/articles/3"), Some(("articles", Place::Record)));
        assert_eq!(found(Method::Post, "/api/v1/articles/3/comments"), Some(("comments", Place::Children)));
        assert_eq!(found(Method::Get, "/api/v1/comments"), Some(("comments", Place::Collection)));
        assert_eq!(found(Method::Get, "/api/v1/users/3/posts"), Some(("posts", Place::Children)));
        // A nested resource is created under its parent only.
        assert!(matches!(router.find(Method::Post, "/api/v1/comments"), Match::MethodNotAllowed("GET, HEAD", _)));
        assert!(matches!(
            router.find(Method::Post, "/api/v1/posts/1"),
            Match::MethodNotAllowed("GET, PUT, PATCH, DELETE, HEAD", _)
        ));
    }
}
