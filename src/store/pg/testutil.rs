//! A fresh, empty PostgreSQL database per test, on the server `TEST_DATABASE_URL`
//! names (`bin/pg-test-server` starts one); without it the caller skips.

use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::config::DatabaseUrl;

/// What a test prints when it cannot run.
pub(crate) const SKIP: &str = "skipped: TEST_DATABASE_URL not set (bin/pg-test-server starts one)";

/// A new database named after `tag`, this process and a counter, created on the test server;
/// `None` (after printing [`SKIP`]) when no server is configured.
pub(crate) fn fresh_database(tag: &str) -> Option<DatabaseUrl> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let Some(base) = std::env::var("TEST_DATABASE_URL").ok().filter(|v| !v.is_empty()) else {
        eprintln!("{SKIP}");
        return None;
    };
    let name = format!("forkd_u_{tag}_{}_{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let config = tokio_postgres::Config::from_str(&base).expect("TEST_DATABASE_URL parses");
        let (client, conn) = config.connect(tokio_postgres::NoTls).await.expect("connect to the test server");
        let driver = tokio::spawn(conn);
        client.batch_execute(&format!("CREATE DATABASE {name}")).await.expect("create database");
        drop(client);
        let _ = driver.await;
    });
    Some(with_database(&base, &name).parse().expect("valid url"))
}

/// `url` with its database (the path) replaced by `name`.
pub(crate) fn with_database(url: &str, name: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, format!("?{q}")),
        None => (rest, String::new()),
    };
    let authority = rest.split('/').next().unwrap_or(rest);
    format!("{scheme}://{authority}/{name}{query}")
}

#[test]
fn database_replaced_in_urls() {
    assert_eq!(with_database("postgres://u@h:1/postgres", "x"), "postgres://u@h:1/x");
    assert_eq!(with_database("postgres://u@h:1", "x"), "postgres://u@h:1/x");
    assert_eq!(with_database("postgres://u@h:1/db?a=b", "x"), "postgres://u@h:1/x?a=b");
}
