//! The database step of start and reload: the numbered migrations, then the declared
//! resources' tables (`store::schema`), before any worker is forked with the configuration.
//! Additive changes apply; a destructive one is refused with one log line per change, and the
//! caller decides what that means (start: exit 2; `SIGHUP`: the running configuration stays).
//! Nothing here forks or signals.

use crate::config::Config;
use crate::store::{Store, Target};

/// Why the database is not ready for a configuration.
pub(super) enum Failure {
    /// The database failed (or could not be reached).
    Database(String),
    /// This many destructive changes need `forkd migrate --apply` (already logged).
    Refused(usize),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Database(e) => f.write_str(e),
            Failure::Refused(n) => write!(
                f,
                "{n} destructive schema change(s) refused; `forkd migrate --config FILE` lists them, \
                 `--apply` makes them"
            ),
        }
    }
}

/// Bring the database to `config`'s schema; `context` prefixes the log lines (`"SIGHUP"`).
pub(super) fn migrate(config: &Config, context: &str) -> Result<(), Failure> {
    let target = Target::of(config);
    let database = |e| Failure::Database(format!("database {target}: {e}"));
    Store::migrate(target).map_err(database)?;
    let plan = Store::migrate_resources(target, &config.resources, false).map_err(database)?;
    let refused: Vec<_> = plan.refused().collect();
    for step in &refused {
        log::error!("{context}: schema change refused: {step}");
    }
    match refused.len() {
        0 => Ok(()),
        n => Err(Failure::Refused(n)),
    }
}
