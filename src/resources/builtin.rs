//! The resources every forkd serves without a declaration: `posts`, a user's posts, as
//! CONTRACT §5 describes them (`title` 1–200 characters, `body` up to 10 000, newest first,
//! created by the user they belong to, changed or deleted by their owner or an admin). A
//! `[[resources]]` named `posts` in the configuration replaces it.

use super::{Create, Field, Kind, Read, Resource, SortKey, Write};

/// The built-in declarations, in order.
pub fn resources() -> Vec<Resource> {
    vec![posts()]
}

/// `posts`: nested under `users`, readable by any signed-in user, no change events.
pub fn posts() -> Resource {
    let mut title = Field::new("title", Kind::String);
    (title.required, title.min, title.max) = (true, Some(1.0), Some(200.0));
    let mut body = Field::new("body", Kind::Text);
    (body.max, body.default) = (Some(10_000.0), Some(serde_json::Value::String(String::new())));
    Resource {
        name: "posts".into(),
        parent: Some("users".into()),
        read: Read::SignedIn,
        create: Create::Owner,
        update: Write::Owner,
        delete: Write::Owner,
        events: false,
        default_sort: vec![SortKey { key: "id".into(), desc: true }],
        fields: vec![title, body],
    }
}

#[cfg(test)]
mod tests {
    /// The declaration schema migration 4 records for the built-in posts (a migration is never
    /// edited, so this text is fixed): it must still read back as today's built-in `posts`.
    #[test]
    fn the_posts_declaration_migration_4_records_is_the_built_in_one() {
        let recorded: super::Resource =
            serde_json::from_str(crate::store::migrations::POSTS_DECLARATION).expect("recorded declaration parses");
        assert_eq!(recorded, super::posts());
    }
}
