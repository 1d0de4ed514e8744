//! The plan's rules, without a database.

use super::*;
use crate::resources::{Field, Kind, Registry, Resource};

fn registry(list: Vec<Resource>) -> Registry {
    Registry { declared: list.iter().map(|r| r.name.clone()).collect(), list }
}

/// `articles` (top level) with a title, a unique slug, a score and a state; `comments` under it.
fn articles() -> Resource {
    let mut res = crate::resources::builtin::posts();
    res.name = "articles".into();
    res.parent = None;
    let mut title = Field::new("title", Kind::String);
    (title.required, title.min, title.max, title.sort) = (true, Some(1.0), Some(200.0), true);
    let mut slug = Field::new("slug", Kind::String);
    slug.unique = true;
    let mut score = Field::new("score", Kind::Integer);
    (score.min, score.max, score.filter) = (Some(0.0), Some(10.0), true);
    let mut state = Field::new("state", Kind::Enum);
    state.values = vec!["draft".into(), "published".into()];
    res.fields = vec![title, slug, score, state];
    res
}

fn comments() -> Resource {
    let mut res = crate::resources::builtin::posts();
    res.name = "comments".into();
    res.parent = Some("articles".into());
    res.fields = vec![Field::new("text", Kind::Text)];
    res
}

fn lines(plan: &Plan) -> Vec<String> {
    plan.steps.iter().map(ToString::to_string).collect()
}

fn changed(f: impl FnOnce(&mut Resource)) -> (Plan, Work) {
    let mut r = articles();
    f(&mut r);
    diff(&[articles()], &registry(vec![r]))
}

#[test]
fn the_same_declarations_need_nothing() {
    let (plan, work) = diff(&[articles(), comments()], &registry(vec![articles(), comments()]));
    assert!(plan.is_empty(), "{:?}", lines(&plan));
    assert_eq!(work, Work::default());
}

#[test]
fn a_new_resource_is_created_after_its_parent_and_recorded() {
    let (plan, work) = diff(&[], &registry(vec![comments(), articles()]));
    assert_eq!(
        lines(&plan),
        ["resources.comments: new resource (table created)", "resources.articles: new resource (table created)"]
    );
    assert!(plan.destructive().next().is_none());
    let created: Vec<&str> = work
        .ops
        .iter()
        .map(|op| match op {
            Op::CreateTable(r) => r.name.as_str(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(created, ["articles", "comments"]);
    assert_eq!(work.record.len(), 2);
}

#[test]
fn the_baseline_is_the_built_in_posts() {
    let (plan, _) = diff(&baseline().expect("baseline"), &registry(vec![crate::resources::builtin::posts()]));
    assert!(plan.is_empty(), "{:?}", lines(&plan));
}

#[test]
fn a_removed_resource_is_destructive_and_dropped_children_first() {
    let (plan, work) = diff(&[articles(), comments()], &registry(vec![]));
    assert_eq!(
        lines(&plan),
        [
            "resources.comments: removed (destructive: the table is dropped with its records)",
            "resources.articles: removed (destructive: the table is dropped with its records)"
        ]
    );
    assert_eq!(work.ops, [Op::DropTable("comments".into()), Op::DropTable("articles".into())]);
    assert_eq!(work.forget, ["comments", "articles"]);
}

#[test]
fn a_removed_field_is_destructive_and_its_indexes_go_first() {
    let (plan, work) = changed(|r| r.fields.retain(|f| f.name != "title"));
    assert_eq!(
        lines(&plan),
        ["resources.articles.fields.title: removed (destructive: the column is dropped with its values)"]
    );
    assert!(matches!(&work.ops[0], Op::DropIndex(i) if i.name == "articles_title_idx"), "{:?}", work.ops);
    assert_eq!(work.ops[1], Op::DropColumn("articles".into(), "title".into()));
    assert_eq!(work.ops.len(), 2);
}

#[test]
fn a_retyped_field_is_rebuilt() {
    let (plan, work) = changed(|r| r.fields[0].kind = Kind::Integer);
    assert_eq!(
        lines(&plan),
        ["resources.articles.fields.title: retyped string → integer (destructive: the column is rebuilt, its values dropped)"]
    );
    let kinds: Vec<&str> = work
        .ops
        .iter()
        .map(|op| match op {
            Op::DropIndex(_) => "drop index",
            Op::DropColumn(..) => "drop column",
            Op::AddColumn(..) => "add column",
            Op::CreateIndex(..) => "create index",
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(kinds, ["drop index", "drop column", "add column", "create index"]);
}

#[test]
fn string_to_text_is_a_relaxation() {
    let (plan, work) = changed(|r| r.fields[0].kind = Kind::Text);
    assert_eq!(lines(&plan), ["resources.articles.fields.title: retyped string → text (recorded)"]);
    assert!(work.ops.is_empty());
    assert_eq!(work.record.len(), 1);
}

#[test]
fn new_fields_optional_defaulted_or_required() {
    let (plan, work) = changed(|r| {
        r.fields.push(Field::new("note", Kind::Text));
        let mut views = Field::new("views", Kind::Integer);
        (views.required, views.default) = (true, Some(serde_json::json!(0)));
        r.fields.push(views);
    });
    assert_eq!(
        lines(&plan),
        [
            "resources.articles.fields.note: new field (column added)",
            "resources.articles.fields.views: new required field (column added, existing records get the default)"
        ]
    );
    assert!(work
        .ops
        .iter()
        .any(|op| matches!(op, Op::Fill(t, f, Cell::Int(0)) if t == "articles" && f.name == "views")));
    let (plan, _) = changed(|r| {
        let mut f = Field::new("lead", Kind::String);
        f.required = true;
        r.fields.push(f);
    });
    assert_eq!(
        lines(&plan),
        ["resources.articles.fields.lead: new required field without a default (destructive: existing records have no value for it)"]
    );
}

#[test]
fn limits_relaxed_or_narrowed() {
    let (plan, _) = changed(|r| (r.fields[0].max, r.fields[2].min) = (Some(300.0), None));
    assert_eq!(
        lines(&plan),
        [
            "resources.articles.fields.title: max 200 → 300 (relaxed, recorded)",
            "resources.articles.fields.score: min 0 → none (relaxed, recorded)"
        ]
    );
    let (plan, _) = changed(|r| r.fields[0].max = Some(100.0));
    assert_eq!(
        lines(&plan),
        ["resources.articles.fields.title: max 200 → 100 (destructive: existing values may lie outside it)"]
    );
    let (plan, _) = changed(|r| r.fields[2].max = None);
    assert!(plan.destructive().next().is_none());
    let (plan, _) = changed(|r| r.fields[1].min = Some(3.0));
    assert_eq!(plan.destructive().count(), 1, "a minimum where there was none narrows");
}

#[test]
fn enum_values_added_or_removed() {
    let (plan, _) = changed(|r| r.fields[3].values.push("archived".into()));
    assert_eq!(lines(&plan), ["resources.articles.fields.state: values added: archived (recorded)"]);
    let (plan, _) = changed(|r| r.fields[3].values = vec!["draft".into()]);
    assert_eq!(
        lines(&plan),
        ["resources.articles.fields.state: values removed: published (destructive: records may still hold them)"]
    );
}

#[test]
fn unique_added_is_destructive_and_removed_is_not() {
    let (plan, work) = changed(|r| r.fields[0].unique = true);
    assert_eq!(
        lines(&plan),
        ["resources.articles.fields.title: now unique (destructive: fails while records share a value)"]
    );
    assert!(matches!(&work.ops[..], [Op::CreateIndex(_, i)] if i.name == "articles_title_key" && i.unique));
    let (plan, work) = changed(|r| r.fields[1].unique = false);
    assert_eq!(lines(&plan), ["resources.articles.fields.slug: no longer unique (index dropped)"]);
    assert!(matches!(&work.ops[..], [Op::DropIndex(i)] if i.name == "articles_slug_key"));
}

#[test]
fn sort_and_filter_make_indexes_and_search_is_recorded() {
    let (plan, work) = changed(|r| (r.fields[3].sort, r.fields[0].search) = (true, true));
    assert_eq!(
        lines(&plan),
        [
            "resources.articles.fields.title: search false → true (recorded)",
            "resources.articles.fields.state: sort false → true (index created)"
        ]
    );
    assert!(
        matches!(&work.ops[..], [Op::CreateIndex(_, i)] if i.name == "articles_state_idx" && i.columns == "\"state\", id")
    );
    let (_, work) = changed(|r| r.fields[0].sort = false);
    assert!(matches!(&work.ops[..], [Op::DropIndex(i)] if i.name == "articles_title_idx"));
}

#[test]
fn rules_and_required_to_optional_are_recorded() {
    let (plan, work) = changed(|r| {
        r.read = crate::resources::Read::Owner;
        r.events = true;
        r.fields[0].required = false;
    });
    assert_eq!(
        lines(&plan),
        [
            "resources.articles: read signed_in → owner (recorded)",
            "resources.articles: events false → true (recorded)",
            "resources.articles.fields.title: now optional (recorded)"
        ]
    );
    assert!(work.ops.is_empty() && work.record.len() == 1);
    let (plan, _) = changed(|r| r.fields[1].required = true);
    assert_eq!(plan.destructive().count(), 1);
}

#[test]
fn a_parent_change_rebuilds_the_table_and_its_children() {
    let mut moved = articles();
    moved.parent = Some("users".into());
    let (plan, work) = diff(&[articles(), comments()], &registry(vec![moved, comments()]));
    assert_eq!(
        lines(&plan),
        [
            "resources.articles: parent (top level) → users (destructive: the table is rebuilt, its records dropped)",
            "resources.comments: rebuilt with its parent articles (destructive: the table is rebuilt, its records dropped)"
        ]
    );
    let names: Vec<String> = work
        .ops
        .iter()
        .map(|op| match op {
            Op::DropTable(t) => format!("drop {t}"),
            Op::CreateTable(r) => format!("create {}", r.name),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(names, ["drop comments", "drop articles", "create articles", "create comments"]);
}

#[test]
fn a_ref_target_change_is_destructive() {
    let mut with_ref = articles();
    let mut author = Field::new("author", Kind::Ref);
    author.refers = Some("users".into());
    with_ref.fields.push(author);
    let mut other = with_ref.clone();
    other.fields[4].refers = Some("articles".into());
    let (plan, _) = diff(&[with_ref], &registry(vec![other]));
    assert_eq!(
        lines(&plan),
        ["resources.articles.fields.author: ref target users → articles (destructive: the column is rebuilt, its values dropped)"]
    );
}

#[test]
fn settle_marks_refused_and_held() {
    let (mut plan, _) = changed(|r| {
        r.fields.retain(|f| f.name != "score");
        r.fields.push(Field::new("note", Kind::Text));
    });
    plan.settle(true);
    let states: Vec<State> = plan.steps.iter().map(|s| s.state).collect();
    assert_eq!(states, [State::Refused, State::Held]);
    assert_eq!(plan.refused().count(), 1);
    plan.settle(false);
    assert!(plan.steps.iter().all(|s| s.state == State::Applied));
}

#[test]
fn a_declaration_round_trips_through_its_record() {
    let r = articles();
    assert_eq!(decode("articles", &encode(&r)).expect("decodes"), r);
    assert!(decode("x", "{").is_err());
}
