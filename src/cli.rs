//! The command line: `serve`, `check-config`, `print-config`, `gen-secret`, `user create`,
//! `migrate`, `--version`, and `--help` for each (`help`). Parses arguments, loads the
//! configuration, checks the data directory and hands over to the supervisor. The only place
//! besides `main` that prints to stdout/stderr directly (before logging exists).

use std::path::PathBuf;

use crate::config;

mod help;

use help::USAGE;

/// Exit code for a bad command line or configuration.
pub const EXIT_USAGE: i32 = 2;

/// Run the command in `args` (without the program name); returns the exit code.
pub fn run(args: &[String]) -> i32 {
    let (cmd, rest) = match args.first().map(String::as_str) {
        None => ("serve", &args[..0]),
        Some(a) if a.starts_with('-') && a != "-V" && a != "--version" && a != "-h" && a != "--help" => ("serve", args),
        Some(a) => (a, &args[1..]),
    };
    if let Some(page) = help::page(cmd).filter(|_| help::asked(rest)) {
        println!("{page}");
        return 0;
    }
    match cmd {
        "-V" | "--version" | "version" => {
            println!("forkd {}", env!("CARGO_PKG_VERSION"));
            0
        }
        "-h" | "--help" | "help" => {
            println!("{}", rest.first().and_then(|c| help::page(c)).unwrap_or(USAGE));
            0
        }
        "gen-secret" => gen_secret(),
        "serve" => match source(rest, |_, _| false).and_then(|src| report(src.load()).map(|cfg| (cfg, src))) {
            Ok((cfg, src)) => serve(cfg, src),
            Err(code) => code,
        },
        "check-config" => match load(rest) {
            Ok(cfg) => check_tls(&cfg).map_or_else(
                |code| code,
                |()| {
                    if let Err(code) = check_schema(&cfg) {
                        return code;
                    }
                    match cfg.tls.listen {
                        Some(tls) => {
                            println!("configuration ok: {} worker(s) on {} and {tls} (TLS)", cfg.workers, cfg.listen)
                        }
                        None => println!("configuration ok: {} worker(s) on {}", cfg.workers, cfg.listen),
                    }
                    0
                },
            ),
            Err(code) => code,
        },
        "print-config" => match source(rest, |_, _| false) {
            Ok(src) => match config::print(src.path.as_deref(), &src.env) {
                Ok(text) => {
                    print!("{text}");
                    0
                }
                Err(errors) => report(Err(errors)).map_or_else(|code| code, |_| 0),
            },
            Err(code) => code,
        },
        "user" => user(rest),
        "migrate" => migrate(rest),
        other => {
            eprintln!("forkd: unknown command `{other}`\n{USAGE}");
            EXIT_USAGE
        }
    }
}

/// The files TLS needs, read and checked: with a TLS listener its certificate and key
/// (against each other), or with `[tls.acme]` the roots of `ca_file`; with TLS to PostgreSQL or Redis the roots (`sslrootcert`,
/// `ssl_ca_certs`, or the system's). Unreadable, not PEM, not a pair, no certificate: exit 2,
/// like a bad configuration, one line each.
fn check_tls(cfg: &config::Config) -> Result<(), i32> {
    let mut problems = Vec::new();
    if let Some(acme) = &cfg.tls.acme {
        if let Some(ca_file) = &acme.ca_file {
            if let Err(e) = crate::tls::client::config(Some(&ca_file.to_string_lossy())) {
                problems.push(format!("tls.acme.ca_file: {e}"));
            }
        }
    } else if cfg.tls.listen.is_some() {
        if let Err(e) = crate::tls::load(&cfg.tls.cert_file, &cfg.tls.key_file) {
            problems.push(e.to_string());
        }
    }
    if let Some(url) = cfg.cluster.database_url.as_ref().filter(|u| u.tls()) {
        if let Err(e) = crate::tls::client::config(url.root_cert()) {
            problems.push(format!("cluster.database_url: the roots for sslmode=require: {e}"));
        }
    }
    if let Some(target) = cfg.cluster.redis_url.as_ref().filter(|t| t.tls) {
        if let Err(e) = crate::tls::client::config(target.ca_file.as_deref()) {
            problems.push(format!("cluster.redis_url: the roots for rediss://: {e}"));
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    for line in problems {
        eprintln!("forkd: config: {line}");
    }
    Err(EXIT_USAGE)
}

fn load(args: &[String]) -> Result<config::Config, i32> {
    load_with(args, |_, _| false)
}

/// Load the configuration; `extra(flag, iterator)` may consume command-specific flags.
fn load_with(
    args: &[String],
    extra: impl FnMut(&str, &mut std::slice::Iter<'_, String>) -> bool,
) -> Result<config::Config, i32> {
    source(args, extra).and_then(|src| report(src.load()))
}

/// Print configuration problems, one line each; exit code 2.
fn report(loaded: Result<config::Config, config::ConfigErrors>) -> Result<config::Config, i32> {
    loaded.map_err(|errors| {
        for line in errors.problems {
            eprintln!("forkd: config: {line}");
        }
        EXIT_USAGE
    })
}

/// Where the configuration comes from: `--config`, `FORKD_CONFIG`, the `FORKD_*` overrides.
fn source(
    args: &[String],
    mut extra: impl FnMut(&str, &mut std::slice::Iter<'_, String>) -> bool,
) -> Result<config::Source, i32> {
    let mut path: Option<PathBuf> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if extra(a, &mut it) {
            continue;
        }
        match a.as_str() {
            "--config" | "-c" => match it.next() {
                Some(p) => path = Some(PathBuf::from(p)),
                None => {
                    eprintln!("forkd: --config needs a file\n{USAGE}");
                    return Err(EXIT_USAGE);
                }
            },
            s if s.starts_with("--config=") => path = Some(PathBuf::from(&s["--config=".len()..])),
            other => {
                eprintln!("forkd: unexpected argument `{other}`\n{USAGE}");
                return Err(EXIT_USAGE);
            }
        }
    }
    let env: Vec<(String, String)> = std::env::vars().filter(|(k, _)| k.starts_with("FORKD_")).collect();
    let path = config::config_path(path.as_deref(), &env);
    Ok(config::Source { path, env })
}

fn serve(cfg: config::Config, source: config::Source) -> i32 {
    crate::logging::init(cfg.log_format);
    // A directory or database file it cannot write is the operator's to fix: exit 2,
    // which the systemd unit does not restart.
    if let Err(e) = crate::store::files::check(&cfg) {
        log::error!("{e}");
        return EXIT_USAGE;
    }
    crate::supervisor::run(cfg, source)
}

/// `check-config`: the schema changes the declared resources need that only `forkd migrate
/// --apply` makes, one line each (exit 2). A database that cannot be reached is a warning.
fn check_schema(cfg: &config::Config) -> Result<(), i32> {
    use crate::store::{schema::Mode, Store, Target};
    match Store::migrate_resources(Target::of(cfg), &cfg.resources, Mode::Plan) {
        Ok(plan) => {
            let lines: Vec<&str> = plan.destructive().map(|s| s.line.as_str()).collect();
            if lines.is_empty() {
                return Ok(());
            }
            for line in lines {
                eprintln!("forkd: schema: {line}");
            }
            eprintln!("forkd: schema: these changes wait for `forkd migrate --apply`");
            Err(EXIT_USAGE)
        }
        Err(e) => {
            eprintln!("forkd: warning: the database was not checked for schema changes: {e}");
            Ok(())
        }
    }
}

/// `forkd migrate [--config FILE] [--apply]`: print the schema changes the declared resources
/// need (one line each), or, with `--apply`, make them all and say what was done.
fn migrate(args: &[String]) -> i32 {
    use crate::store::{schema::Mode, Store, Target};
    let mut apply = false;
    let cfg = match load_with(args, |flag, _| {
        if flag == "--apply" {
            apply = true;
            return true;
        }
        false
    }) {
        Ok(cfg) => cfg,
        Err(code) => return code,
    };
    let target = Target::of(&cfg);
    if let Err(e) = Store::migrate(target) {
        eprintln!("forkd: database {target}: {e}");
        return 1;
    }
    let mode = if apply { Mode::All } else { Mode::Plan };
    match Store::migrate_resources(target, &cfg.resources, mode) {
        Ok(plan) if plan.is_empty() => {
            println!("schema: nothing to do; the tables match the declared resources");
            0
        }
        Ok(plan) => {
            for step in &plan.steps {
                let kind = if step.destructive { "destructive" } else { "additive" };
                let done = if plan.applied { "applied" } else { "pending" };
                println!("{done} ({kind}): {}", step.line);
            }
            if !plan.applied {
                println!("run `forkd migrate --apply` to make these changes");
            }
            0
        }
        Err(e) => {
            eprintln!("forkd: database {target}: declared resources: {e}");
            1
        }
    }
}

fn gen_secret() -> i32 {
    use base64::Engine;
    use rand::RngCore;
    let mut key = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut key);
    println!("{}", base64::engine::general_purpose::STANDARD.encode(key));
    0
}

/// `forkd user ...`: `create`, or the usage (`help`, like `--help`: exit 0; anything else:
/// exit 2).
fn user(args: &[String]) -> i32 {
    match args.first().map(String::as_str) {
        Some("create") => user_create(&args[1..]),
        Some("help") => {
            println!("{}", help::USER);
            0
        }
        None => {
            eprintln!("forkd: user: a subcommand is needed\n{}", help::USER);
            EXIT_USAGE
        }
        Some(other) => {
            eprintln!("forkd: user: unknown subcommand `{other}`\n{}", help::USER);
            EXIT_USAGE
        }
    }
}

/// `forkd user create`: validate like the API, hash, insert, print the user.
fn user_create(args: &[String]) -> i32 {
    use crate::app::validate;
    use crate::store::{NewUser, Role, Store};
    let (mut email, mut name, mut age, mut role, mut stdin) = (None, None, None, None, false);
    let mut bad: Vec<String> = Vec::new();
    let cfg = load_with(args, |flag, it| {
        let mut value = |slot: &mut Option<String>| {
            *slot = it.next().cloned();
            if slot.is_none() {
                bad.push(format!("{flag} needs a value"));
            }
            true
        };
        match flag {
            "--email" => value(&mut email),
            "--name" => value(&mut name),
            "--age" => value(&mut age),
            "--role" => value(&mut role),
            "--password-stdin" => {
                stdin = true;
                true
            }
            _ => false,
        }
    });
    let cfg = match cfg {
        Ok(c) => c,
        Err(code) => return code,
    };
    if !stdin {
        bad.push("--password-stdin is required (the password is read from standard input)".into());
    }
    let (email, name) = (email.unwrap_or_default(), name.unwrap_or_default());
    for (field, check) in [("email", validate::email(&email)), ("name", validate::name(&name))] {
        if let Err(m) = check {
            bad.push(format!("{field} {m}"));
        }
    }
    let age = match age.map(|a| a.parse::<i64>()) {
        None => None,
        Some(Ok(a)) if (0..=150).contains(&a) => Some(a),
        Some(_) => {
            bad.push("age must be an integer from 0 to 150".into());
            None
        }
    };
    let role = match role.as_deref().map(Role::parse) {
        None => Role::User,
        Some(Some(r)) => r,
        Some(None) => {
            bad.push("role must be user or admin".into());
            Role::User
        }
    };
    let mut password = String::new();
    if stdin && std::io::stdin().read_line(&mut password).is_err() {
        bad.push("cannot read the password from standard input".into());
    }
    let password = password.strip_suffix('\n').map(|p| p.strip_suffix('\r').unwrap_or(p)).unwrap_or(&password);
    if let Err(m) = validate::password(password) {
        bad.push(format!("password {m}"));
    }
    if !bad.is_empty() {
        for b in bad {
            eprintln!("forkd: user create: {b}");
        }
        return EXIT_USAGE;
    }
    let result = (|| -> Result<String, String> {
        crate::store::files::check(&cfg).map_err(|e| e.to_string())?;
        // With `[cluster] database_url` the user goes to PostgreSQL, where every host sees it.
        Store::migrate(&cfg).map_err(|e| e.to_string())?;
        let store = Store::open(&cfg, 1).map_err(|e| e.to_string())?;
        let hasher = crate::auth::password::Passwords::new(cfg.auth.argon2_memory_kib, cfg.auth.argon2_iterations)
            .map_err(|e| e.to_string())?;
        let password_hash = hasher.hash(password).map_err(|e| e.to_string())?;
        let user = store
            .create_user(&NewUser { name: &name, email: &email, password_hash: &password_hash, age, role })
            .map_err(|e| match e {
                crate::store::StoreError::Duplicate(_) => format!("a user with e-mail {email} already exists"),
                other => other.to_string(),
            })?;
        store.close();
        serde_json::to_string(&user).map_err(|e| e.to_string())
    })();
    match result {
        Ok(json) => {
            println!("{json}");
            0
        }
        Err(e) => {
            eprintln!("forkd: user create: {e}");
            1
        }
    }
}
