//! Schema changes of declared resources: an additive change applies at start and on SIGHUP;
//! a destructive one stops the start (exit 2, naming resource and field), keeps the running
//! configuration on SIGHUP, fails `check-config`, and is listed by `forkd migrate` until
//! `forkd migrate --apply` makes it. On PostgreSQL, two hosts applying at once agree.

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::util::*;

/// `articles` with a title and a sorted view count.
const WITH_VIEWS: &str = r#"
[[resources]]
name = "articles"
[resources.fields.title]
type = "string"
required = true
[resources.fields.views]
type = "integer"
sort = true
"#;

/// The same without `views`: a destructive change.
const WITHOUT_VIEWS: &str = r#"
[[resources]]
name = "articles"
[resources.fields.title]
type = "string"
required = true
"#;

/// `WITH_VIEWS` plus an optional `note`: an additive change.
const WITH_NOTE: &str = r#"
[[resources]]
name = "articles"
[resources.fields.title]
type = "string"
required = true
[resources.fields.views]
type = "integer"
sort = true
[resources.fields.note]
type = "text"
"#;

const VIEWS_REMOVED: &str =
    "resources.articles.fields.views: removed (destructive: the column and its values are dropped)";
/// What `forkd migrate` says when the tables match the declarations.
const NOTHING: &str = "schema: nothing to do; the tables match the declared resources";

/// A config file in `dir` for a free port, its data in `data`, plus `extra`.
fn config(dir: &Path, data: &Path, name: &str, extra: &str) -> String {
    let path = dir.join(name);
    let listen = format!("127.0.0.1:{}", free_port());
    std::fs::write(&path, render_config(&listen, data, extra)).expect("write config");
    path.to_str().expect("utf-8").to_string()
}

/// A server on `data` with `extra` (data_dir set in the top part of the config).
fn serve(data: &Path, extra: &str) -> Server {
    Server::start(&format!("data_dir = \"{}\"\n{extra}", data.display()))
}

#[test]
fn a_removed_field_stops_the_start_until_forkd_migrate_applies_it() {
    let d = tempfile::tempdir().expect("tempdir");
    let data = d.path().join("data");
    let s = serve(&data, WITH_VIEWS);
    s.wait_log_line(START_TIMEOUT, |l| l.contains("schema: resources.articles: new resource (table created)"));
    drop(s);

    let without = config(d.path(), &data, "without.toml", WITHOUT_VIEWS);
    let out = run_forkd(d.path(), &["serve", "--config", &without], &[]);
    assert_eq!(out.code(), Some(2), "a destructive change refuses the start: {out:?}");
    assert!(out.stderr.lines().any(|l| l.contains(VIEWS_REMOVED)), "the line names resource and field: {out:?}");
    assert!(out.stderr.contains("forkd migrate"), "and says what to run: {out:?}");

    let check = run_forkd(d.path(), &["check-config", "--config", &without], &[]);
    assert_eq!(check.code(), Some(2), "{check:?}");
    assert!(check.stderr.lines().any(|l| l == format!("forkd: schema: {VIEWS_REMOVED}")), "{check:?}");

    let plan = run_forkd(d.path(), &["migrate", "--config", &without], &[]);
    assert_eq!(plan.code(), Some(0), "{plan:?}");
    assert!(plan.stdout.lines().any(|l| l == format!("pending (destructive): {VIEWS_REMOVED}")), "{plan:?}");

    let applied = run_forkd(d.path(), &["migrate", "--config", &without, "--apply"], &[]);
    assert_eq!(applied.code(), Some(0), "{applied:?}");
    assert!(
        applied.stdout.lines().any(|l| l == format!("applied (destructive): {VIEWS_REMOVED}")),
        "says what it dropped: {applied:?}"
    );
    let again = run_forkd(d.path(), &["migrate", "--config", &without], &[]);
    assert_eq!(again.stdout.trim(), NOTHING, "{again:?}");
    let check = run_forkd(d.path(), &["check-config", "--config", &without], &[]);
    assert_eq!(check.code(), Some(0), "{check:?}");

    let s = serve(&data, WITHOUT_VIEWS);
    s.assert_healthy();
    assert!(!s.logs().contains("destructive"), "{}", s.log_tail());
}

#[test]
fn an_additive_change_applies_at_start() {
    let d = tempfile::tempdir().expect("tempdir");
    let data = d.path().join("data");
    drop(serve(&data, WITH_VIEWS));
    let with_note = config(d.path(), &data, "note.toml", WITH_NOTE);
    let check = run_forkd(d.path(), &["check-config", "--config", &with_note], &[]);
    assert_eq!(check.code(), Some(0), "an additive change is no problem: {check:?}");
    let plan = run_forkd(d.path(), &["migrate", "--config", &with_note], &[]);
    let line = "pending (additive): resources.articles.fields.note: new field (column added)";
    assert!(plan.stdout.lines().any(|l| l == line), "{plan:?}");
    let s = serve(&data, WITH_NOTE);
    s.wait_log_line(START_TIMEOUT, |l| l.contains("schema: resources.articles.fields.note: new field"));
    drop(s);
    let plan = run_forkd(d.path(), &["migrate", "--config", &with_note], &[]);
    assert_eq!((plan.code(), plan.stdout.trim()), (Some(0), NOTHING), "{plan:?}");
}

#[test]
fn sighup_with_a_destructive_change_keeps_the_running_configuration() {
    let d = tempfile::tempdir().expect("tempdir");
    let data = d.path().join("data");
    let s = serve(&data, WITH_VIEWS);
    let before = s.wait_workers(1, START_TIMEOUT);
    let text = s.config_text.clone();
    assert!(text.contains(WITH_VIEWS.trim_start()), "{text}");
    std::fs::write(s.config_path(), text.replace(WITH_VIEWS.trim_start(), WITHOUT_VIEWS.trim_start()))
        .expect("write config");
    s.signal(Signal::SIGHUP);
    let line = s.wait_log_line(Duration::from_secs(10), |l| l.contains("SIGHUP: reload refused"));
    assert!(line.contains(VIEWS_REMOVED), "{line}");
    s.assert_healthy();
    assert_eq!(s.workers(), before, "no worker was replaced");
    assert!(!s.logs().contains("configuration reloaded"), "{}", s.log_tail());

    // An additive change reloads.
    std::fs::write(s.config_path(), text.replace(WITH_VIEWS.trim_start(), WITH_NOTE.trim_start()))
        .expect("write config");
    s.signal(Signal::SIGHUP);
    s.wait_log_line(Duration::from_secs(10), |l| l.contains("schema: resources.articles.fields.note: new field"));
    s.wait_log_line(Duration::from_secs(10), |l| l.contains("SIGHUP: configuration reloaded"));
    assert!(eventually(Duration::from_secs(10), || s.workers() != before), "the worker is replaced");
    s.assert_healthy();
}

#[test]
fn two_hosts_on_postgresql_apply_once_and_agree() {
    let Some(base) = crate::cluster::test_server() else { return };
    let url = crate::cluster::fresh_database(&base, "migrate");
    let d = tempfile::tempdir().expect("tempdir");
    let data = d.path().join("data");
    let cluster = format!("[cluster]\ndatabase_url = \"{url}\"\n");
    let a = config(d.path(), &data, "a.toml", &format!("{cluster}{WITH_VIEWS}"));
    let b = config(d.path(), &data, "b.toml", &format!("{cluster}{WITH_VIEWS}"));
    let (out_a, out_b) = std::thread::scope(|sc| {
        let ha = sc.spawn(|| run_forkd(d.path(), &["migrate", "--config", &a, "--apply"], &[]));
        let hb = sc.spawn(|| run_forkd(d.path(), &["migrate", "--config", &b, "--apply"], &[]));
        (ha.join().expect("a"), hb.join().expect("b"))
    });
    assert_eq!((out_a.code(), out_b.code()), (Some(0), Some(0)), "{out_a:?}\n{out_b:?}");
    let created = "applied (additive): resources.articles: new resource (table created)";
    let firsts = [&out_a, &out_b].iter().filter(|o| o.stdout.contains(created)).count();
    assert_eq!(firsts, 1, "one host created the table, the other found it recorded:\n{out_a:?}\n{out_b:?}");
    for cfg in [&a, &b] {
        let plan = run_forkd(d.path(), &["migrate", "--config", cfg], &[]);
        assert_eq!(plan.stdout.trim(), NOTHING, "{plan:?}");
    }
    // A host still on an older declaration is caught.
    let older = config(d.path(), &data, "older.toml", &format!("{cluster}{WITHOUT_VIEWS}"));
    let check = run_forkd(d.path(), &["check-config", "--config", &older], &[]);
    assert_eq!(check.code(), Some(2), "{check:?}");
    assert!(check.stderr.contains(VIEWS_REMOVED), "{check:?}");
    let out = run_forkd(d.path(), &["serve", "--config", &older], &[]);
    assert_eq!(out.code(), Some(2), "{out:?}");
}
