//! The command line (`--help` of every subcommand included) and configuration validation.

use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::util::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("forkd-cli-").tempdir().unwrap()
}

/// Writes `forkd.toml` (the harness defaults plus `extra`, debug routes off) into `dir`.
fn write_config(dir: &tempfile::TempDir, extra: &str) -> PathBuf {
    let extra =
        if extra.contains("[debug]") { extra.to_string() } else { format!("{extra}\n[debug]\nroutes = false\n") };
    let text = render_config(&format!("127.0.0.1:{}", free_port()), &dir.path().join("data"), &extra);
    let p = dir.path().join("forkd.toml");
    fs::write(&p, text).unwrap();
    p
}

/// Writes `text` verbatim as the config file.
fn write_raw_config(dir: &tempfile::TempDir, text: &str) -> PathBuf {
    let p = dir.path().join("forkd.toml");
    fs::write(&p, text).unwrap();
    p
}

fn check_config(dir: &tempfile::TempDir, cfg: &Path, env: &[(&str, &str)]) -> CliOutput {
    run_forkd(dir.path(), &["check-config", "--config", cfg.to_str().unwrap()], env)
}

fn nonempty_lines(s: &str) -> Vec<&str> {
    s.lines().filter(|l| !l.trim().is_empty()).collect()
}

#[test]
fn version_prints_name_and_semver() {
    let d = tmp();
    let out = run_forkd(d.path(), &["--version"], &[]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert_eq!(out.stdout.trim(), format!("forkd {}", env!("CARGO_PKG_VERSION")), "{out:?}");
}

#[test]
fn gen_secret_prints_fresh_256_bit_base64() {
    let d = tmp();
    let a = run_forkd(d.path(), &["gen-secret"], &[]);
    let b = run_forkd(d.path(), &["gen-secret"], &[]);
    for out in [&a, &b] {
        assert_eq!(out.code(), Some(0), "{out:?}");
        let s = out.stdout.trim();
        let bytes = base64_decode(s).unwrap_or_else(|| panic!("not base64: {s:?}"));
        assert_eq!(bytes.len(), 32, "gen-secret must print 32 bytes, decoded {} from {s:?}", bytes.len());
    }
    assert_ne!(a.stdout.trim(), b.stdout.trim(), "two gen-secret calls printed the same secret");
}

#[test]
fn check_config_accepts_a_good_file() {
    let d = tmp();
    let cfg = write_config(&d, "workers = 2\nlog_format = \"json\"\n\n[limits]\nmax_header_bytes = 2048\nkeepalive_timeout_ms = 300\n\n[supervisor]\nworker_max_rss_mb = 64");
    let out = check_config(&d, &cfg, &[]);
    assert_eq!(out.code(), Some(0), "a valid config:\n{}\n{out:?}", fs::read_to_string(&cfg).unwrap());
}

#[test]
fn check_config_names_an_unknown_key() {
    let d = tmp();
    let cfg = write_config(&d, "[limits]\nmax_heder_bytes = 2048");
    let out = check_config(&d, &cfg, &[]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(
        out.stderr.lines().any(|l| l.contains("max_heder_bytes") && l.contains("limits")),
        "stderr must name the unknown key limits.max_heder_bytes: {out:?}"
    );
}

#[test]
fn check_config_prints_one_line_per_problem() {
    let d = tmp();
    let cfg = write_config(&d, "[limits]\nmax_heder_bytes = 2048\n\n[io]\nthredas = 4");
    let out = check_config(&d, &cfg, &[]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    let lines = nonempty_lines(&out.stderr);
    assert_eq!(lines.len(), 2, "two problems must give exactly two lines on stderr, got {lines:#?}");
    assert!(lines.iter().any(|l| l.contains("max_heder_bytes")), "no line names max_heder_bytes: {lines:#?}");
    assert!(lines.iter().any(|l| l.contains("thredas")), "no line names thredas: {lines:#?}");
}

#[test]
fn check_config_reads_the_roots_for_tls_to_postgres_and_redis() {
    let d = tmp();
    let ca = crate::tls::Pki::new().ca_pem;
    fs::write(d.path().join("ca.pem"), ca).unwrap();
    fs::write(d.path().join("empty.pem"), "not PEM\n").unwrap();
    let dir = d.path().display();
    let cluster = |pg_roots: &str, redis_roots: &str| {
        format!(
            "[cluster]\ndatabase_url = \"postgres://forkd@db.internal/forkd?sslmode=verify-full&sslrootcert={dir}/{pg_roots}\"\n\
             redis_url = \"rediss://cache.internal:6380/0?ssl_ca_certs={dir}/{redis_roots}\""
        )
    };
    let good = write_config(&d, &cluster("ca.pem", "ca.pem"));
    let out = check_config(&d, &good, &[]);
    assert_eq!(out.code(), Some(0), "readable roots (nothing is connected to): {out:?}");
    let bad = write_config(&d, &cluster("missing.pem", "empty.pem"));
    let out = check_config(&d, &bad, &[]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    let lines = nonempty_lines(&out.stderr);
    assert_eq!(lines.len(), 2, "one line per unusable roots file: {lines:#?}");
    assert!(lines[0].contains("cluster.database_url") && lines[0].contains("missing.pem"), "{lines:#?}");
    assert!(lines[1].contains("cluster.redis_url") && lines[1].contains("no certificate"), "{lines:#?}");
}

#[test]
fn check_config_refuses_negative_workers() {
    let d = tmp();
    let cfg = write_config(&d, "workers = -1");
    let out = check_config(&d, &cfg, &[]);
    assert_eq!(out.code(), Some(2), "workers = -1: {out:?}");
    assert!(out.stderr.contains("workers"), "stderr should name `workers`: {out:?}");
}

#[test]
fn check_config_refuses_out_of_range_http2_settings() {
    let d = tmp();
    let cfg = write_config(
        &d,
        "[http2]\nmax_concurrent_streams = 0\ninitial_window_size = 2147483648\nmax_frame_size = 16383",
    );
    let out = check_config(&d, &cfg, &[]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    let lines = nonempty_lines(&out.stderr);
    for key in
        ["http2.max_concurrent_streams = 0", "http2.initial_window_size = 2147483648", "http2.max_frame_size = 16383"]
    {
        assert!(lines.iter().any(|l| l.contains(key)), "no line names {key}: {lines:#?}");
    }
    let cfg = write_config(&d, "[http2]\nmax_frame_size = 16777216");
    let out = check_config(&d, &cfg, &[]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("http2.max_frame_size = 16777216"), "{out:?}");
    let cfg = write_config(&d, "[http2]\nenabled = false\nmax_concurrent_streams = 1000\nmax_frame_size = 16777215");
    let out = check_config(&d, &cfg, &[]);
    assert_eq!(out.code(), Some(0), "the bounds are allowed: {out:?}");
}

#[test]
fn check_config_refuses_a_bad_listen_address() {
    let d = tmp();
    let cfg = write_config(&d, "listen = \"nope\"");
    let out = check_config(&d, &cfg, &[]);
    assert_eq!(out.code(), Some(2), "listen = \"nope\": {out:?}");
    assert!(out.stderr.contains("listen"), "stderr should name `listen`: {out:?}");
}

#[test]
fn check_config_refuses_a_bad_env_override() {
    let d = tmp();
    let cfg = write_config(&d, "");
    let good = check_config(&d, &cfg, &[]);
    assert_eq!(good.code(), Some(0), "the base config must be valid: {good:?}");
    let out = check_config(&d, &cfg, &[("FORKD_LIMITS__MAX_HEADER_BYTES", "abc")]);
    assert_eq!(out.code(), Some(2), "FORKD_LIMITS__MAX_HEADER_BYTES=abc: {out:?}");
    assert!(
        out.stderr.to_ascii_lowercase().contains("max_header_bytes"),
        "stderr should name the overridden key: {out:?}"
    );
}

#[test]
fn env_override_is_applied() {
    // A valid override of a bad file value makes it valid: the environment wins.
    let d = tmp();
    let cfg = write_config(&d, "[limits]\nmax_header_bytes = \"lots\"");
    let bad = check_config(&d, &cfg, &[]);
    assert_eq!(bad.code(), Some(2), "max_header_bytes = \"lots\" must be refused: {bad:?}");
    let out = check_config(&d, &cfg, &[("FORKD_LIMITS__MAX_HEADER_BYTES", "4096")]);
    assert_eq!(out.code(), Some(0), "FORKD_LIMITS__MAX_HEADER_BYTES=4096 over a bad file value: {out:?}");
}

#[test]
fn check_config_refuses_debug_routes_in_production() {
    let d = tmp();
    let base = |routes: bool| {
        format!(
            "environment = \"production\"\n\n[auth]\njwt_secret = \"{}\"\n\n[debug]\nroutes = {routes}\n",
            "p".repeat(48)
        )
    };
    let cfg = write_config(&d, &base(false));
    let control = check_config(&d, &cfg, &[]);
    assert_eq!(
        control.code(),
        Some(0),
        "control: production with a secret and debug routes off should be valid: {control:?}"
    );
    let cfg = write_config(&d, &base(true));
    let out = check_config(&d, &cfg, &[]);
    assert_eq!(out.code(), Some(2), "production with [debug] routes = true: {out:?}");
    assert!(out.stderr.to_ascii_lowercase().contains("debug"), "stderr should say it is the debug routes: {out:?}");
}

#[test]
fn check_config_refuses_a_malformed_toml_file() {
    let d = tmp();
    let cfg = write_raw_config(&d, "listen = \"127.0.0.1:1\"\n[limits\nmax_header_bytes = 1\n");
    let out = check_config(&d, &cfg, &[]);
    assert_eq!(out.code(), Some(2), "{out:?}");
}

#[test]
fn serve_with_a_bad_config_exits_2_without_listening() {
    let d = tmp();
    let port = free_port();
    let text = format!(
        "listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\nworkers = 1\n\n[limits]\nmax_heder_bytes = 1\n",
        d.path().join("data").display()
    );
    let cfg = write_raw_config(&d, &text);
    // `run_forkd` bounds the run at 15 s; a serving process would hit that and fail.
    let t = Instant::now();
    let out = run_forkd(d.path(), &["serve", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(out.code(), Some(2), "serve with an unknown key: {out:?}");
    assert!(t.elapsed() < Duration::from_secs(10));
    let conn = TcpStream::connect_timeout(&format!("127.0.0.1:{port}").parse().unwrap(), Duration::from_secs(1));
    assert!(conn.is_err(), "something listens on the port after a refused start");
}

#[test]
fn serve_with_a_bad_env_override_exits_2() {
    let d = tmp();
    let cfg = write_config(&d, "");
    let out = run_forkd(d.path(), &["serve", "--config", cfg.to_str().unwrap()], &[("FORKD_WORKERS", "many")]);
    assert_eq!(out.code(), Some(2), "serve with FORKD_WORKERS=many: {out:?}");
}

#[test]
fn config_file_from_forkd_config_env() {
    let d = tmp();
    let cfg = write_config(&d, "[limits]\nmax_heder_bytes = 1");
    let out = run_forkd(d.path(), &["check-config"], &[("FORKD_CONFIG", cfg.to_str().unwrap())]);
    assert_eq!(out.code(), Some(2), "check-config must read $FORKD_CONFIG (which has an unknown key): {out:?}");
}

// ---------------------------------------------------------------------------------------
// check-config: unknown sections, keys and variables, with "did you mean"
// ---------------------------------------------------------------------------------------

/// The `forkd: config: ` lines of stderr, without that prefix.
fn problems(out: &CliOutput) -> Vec<String> {
    out.stderr.lines().filter_map(|l| l.strip_prefix("forkd: config: ")).map(str::to_string).collect()
}

#[test]
fn check_config_names_an_unknown_section_as_a_section() {
    let d = tmp();
    let cfg = write_config(&d, "[typo]\nx = 1\n\n[limts]\nmax_header_bytes = 2048");
    let out = check_config(&d, &cfg, &[]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert_eq!(
        problems(&out),
        ["unknown section [typo]", "unknown section [limts]; did you mean `[limits]`?"],
        "{out:?}"
    );
}

#[test]
fn check_config_names_key_and_section_and_suggests_the_close_key() {
    let d = tmp();
    let cfg = write_config(&d, "lisen = \"127.0.0.1:1\"\n\n[limits]\nmax_heder_bytes = 2048\nfrobnicate = 1");
    let out = check_config(&d, &cfg, &[]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert_eq!(
        problems(&out),
        [
            "unknown key lisen; did you mean `listen`?",
            "unknown key max_heder_bytes in section [limits]; did you mean `max_header_bytes`?",
            "unknown key frobnicate in section [limits]",
        ],
        "{out:?}"
    );
}

#[test]
fn check_config_suggests_the_close_variable() {
    let d = tmp();
    let cfg = write_config(&d, "");
    let env = [("FORKD_RATE_LIMIT_MAX", "10"), ("FORKD_LIMITS__MAX_HEDER_BYTES", "2048"), ("FORKD_ZZZ", "1")];
    let out = check_config(&d, &cfg, &env);
    assert_eq!(out.code(), Some(2), "{out:?}");
    let mut found = problems(&out);
    found.sort(); // the environment's order is the OS's
    assert_eq!(
        found,
        [
            "unknown key max_heder_bytes in section [limits] (from FORKD_LIMITS__MAX_HEDER_BYTES); \
             did you mean `FORKD_LIMITS__MAX_HEADER_BYTES`?",
            "unknown key rate_limit_max (from FORKD_RATE_LIMIT_MAX); did you mean `FORKD_RATE_LIMIT__MAX`?",
            "unknown key zzz (from FORKD_ZZZ)",
        ],
        "{out:?}"
    );
}

// ---------------------------------------------------------------------------------------
// print-config and forkd.example.toml
// ---------------------------------------------------------------------------------------

fn example_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("forkd.example.toml")
}

/// The output without its header (the `#` lines before the first blank line): the keys.
fn body(text: &str) -> &str {
    text.split_once("\n\n").map_or("", |(_, rest)| rest)
}

fn parse(text: &str) -> toml::Table {
    text.parse().unwrap_or_else(|e| panic!("print-config output is not TOML: {e}\n{text}"))
}

#[test]
fn print_config_with_no_config_is_the_example_file() {
    let d = tmp();
    let out = run_forkd(d.path(), &["print-config"], &[]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let example = fs::read_to_string(example_path()).unwrap();
    assert!(out.stdout == example, "print-config with no config must print forkd.example.toml exactly:\n{out:?}");
}

#[test]
fn print_config_of_the_example_equals_print_config_of_nothing() {
    let d = tmp();
    let nothing = run_forkd(d.path(), &["print-config"], &[]);
    let example = run_forkd(d.path(), &["print-config", "--config", example_path().to_str().unwrap()], &[]);
    assert_eq!((nothing.code(), example.code()), (Some(0), Some(0)), "{nothing:?}\n{example:?}");
    assert!(!body(&nothing.stdout).is_empty(), "{nothing:?}");
    assert_eq!(body(&example.stdout), body(&nothing.stdout), "the example file must give the defaults");
    assert!(example.stdout.starts_with("# forkd configuration in effect"), "{example:?}");
    assert!(example.stdout.contains("forkd.example.toml"), "the header names the file: {example:?}");
}

#[test]
fn print_config_shows_file_and_variables_reads_back_and_hides_the_secret() {
    let d = tmp();
    let secret = "s3cr3t-".repeat(8);
    let cfg = write_config(
        &d,
        "workers = 3\n\n[limits]\nmax_header_bytes = 4096\n\n[cors]\norigins = [\"https://a.example\"]",
    );
    let env = [("FORKD_RATE_LIMIT__MAX", "7"), ("FORKD_AUTH__JWT_SECRET", secret.as_str())];
    let out = run_forkd(d.path(), &["print-config", "--config", cfg.to_str().unwrap()], &env);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(!out.stdout.contains(&secret) && !out.stderr.contains(&secret), "the secret was printed: {out:?}");
    for line in [
        "workers = 3",
        "max_header_bytes = 4096",
        "origins = [\"https://a.example\"]",
        "max = 7  # from FORKD_RATE_LIMIT__MAX",
        "# jwt_secret = (set, from FORKD_AUTH__JWT_SECRET; not shown)",
    ] {
        assert!(out.stdout.lines().any(|l| l == line), "no line {line:?} in\n{out:?}");
    }
    // forkd reads it back: the same values, the secret aside.
    let printed = d.path().join("printed.toml");
    fs::write(&printed, &out.stdout).unwrap();
    let check = check_config(&d, &printed, &[]);
    assert_eq!(check.code(), Some(0), "print-config's output must validate: {check:?}");
    let again = run_forkd(d.path(), &["print-config", "--config", printed.to_str().unwrap()], &[]);
    assert_eq!(again.code(), Some(0), "{again:?}");
    assert_eq!(parse(&again.stdout), parse(&out.stdout));
    let table = parse(&out.stdout);
    assert_eq!(table["rate_limit"]["max"].as_integer(), Some(7));
    assert!(table["auth"].get("jwt_secret").is_none(), "the secret is a comment, not a key");
}

#[test]
fn print_config_refuses_an_invalid_config_like_check_config() {
    let d = tmp();
    let cfg = write_config(&d, "workers = -1\n\n[limits]\nmax_heder_bytes = 1");
    let out = run_forkd(d.path(), &["print-config", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert_eq!(out.stdout, "", "nothing printed for an invalid config: {out:?}");
    let check = check_config(&d, &cfg, &[]);
    assert_eq!(out.stderr, check.stderr, "the same problems as check-config");
    let bad = run_forkd(d.path(), &["print-config", "--nope"], &[]);
    assert_eq!(bad.code(), Some(2), "{bad:?}");
}

#[test]
fn help_lists_print_config() {
    let d = tmp();
    let out = run_forkd(d.path(), &["--help"], &[]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(out.stdout.contains("forkd print-config [--config FILE]"), "{out:?}");
}

#[test]
fn user_help_prints_the_usage_and_exits_zero() {
    let d = tmp();
    for args in [&["user", "--help"][..], &["user", "-h"], &["user", "create", "--help"], &["user", "create", "-h"]] {
        let out = run_forkd(d.path(), args, &[]);
        assert_eq!(out.code(), Some(0), "forkd {args:?}: {out:?}");
        assert!(
            out.stdout.contains("forkd user create --email E --name N"),
            "forkd {args:?} prints the usage: {out:?}"
        );
        assert!(out.stdout.contains("--password-stdin"), "forkd {args:?}: {out:?}");
    }
    // `create --help` reads no password and touches no database.
    assert!(!d.path().join("data").exists(), "--help must not create the database");
}

#[test]
fn every_subcommand_takes_help_prints_its_usage_on_stdout_and_exits_zero() {
    let d = tmp();
    let commands = [
        ("serve", "forkd [serve] [--config FILE]"),
        ("check-config", "forkd check-config [--config FILE]"),
        ("print-config", "forkd print-config [--config FILE]"),
        ("gen-secret", "forkd gen-secret"),
        ("migrate", "forkd migrate [--config FILE] [--apply]"),
        ("user", "forkd user create --email E"),
    ];
    for (command, usage) in commands {
        for args in
            [&[command, "--help"][..], &[command, "-h"], &["help", command], &[command, "--config", "x.toml", "-h"]]
        {
            let out = run_forkd(d.path(), args, &[]);
            assert_eq!(out.code(), Some(0), "forkd {args:?}: {out:?}");
            assert!(out.stdout.starts_with("usage:") && out.stdout.contains(usage), "forkd {args:?}: {out:?}");
            assert_eq!(out.stderr, "", "forkd {args:?} writes nothing on stderr: {out:?}");
        }
    }
    // Options before the help flag select `serve` as they do without it.
    let out = run_forkd(d.path(), &["--config", "x.toml", "--help"], &[]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(out.stdout.contains("forkd [serve]") && out.stdout.contains("exits 2"), "{out:?}");
    // Help reads no configuration, creates no data directory and listens nowhere.
    assert!(!d.path().join("data").exists(), "--help must not create ./data");
    let overview = run_forkd(d.path(), &["--help"], &[]);
    assert!(overview.stdout.contains("forkd <command> --help"), "the overview points at the pages: {overview:?}");
}

#[test]
fn production_without_a_secret_names_forkd_gen_secret() {
    let d = tmp();
    let cfg = write_config(&d, "environment = \"production\"");
    for command in ["check-config", "serve"] {
        let out = run_forkd(d.path(), &[command, "--config", cfg.to_str().unwrap()], &[]);
        assert_eq!(out.code(), Some(2), "forkd {command} in production without a secret: {out:?}");
        let line = out.stderr.lines().find(|l| l.contains("jwt_secret_file is required in production"));
        let line = line.unwrap_or_else(|| panic!("forkd {command}: no line says the secret is required: {out:?}"));
        assert!(line.contains("`forkd gen-secret"), "the line names the command that makes one: {line}");
        assert!(line.contains("FORKD_AUTH__JWT_SECRET_FILE"), "and where to point at it: {line}");
    }
}

#[test]
fn user_without_or_with_an_unknown_subcommand_exits_two_with_the_usage() {
    let d = tmp();
    for (args, says) in [(&["user"][..], "subcommand is needed"), (&["user", "delete"], "unknown subcommand `delete`")]
    {
        let out = run_forkd(d.path(), args, &[]);
        assert_eq!(out.code(), Some(2), "forkd {args:?}: {out:?}");
        assert!(out.stderr.contains(says), "forkd {args:?} must say {says:?}: {out:?}");
        assert!(out.stderr.contains("forkd user create"), "forkd {args:?} prints the usage: {out:?}");
    }
}

#[test]
fn check_config_validates_pid_file() {
    let d = tmp();
    let cfg = write_config(&d, "pid_file = \"/run/forkd/\"");
    let out = check_config(&d, &cfg, &[]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("pid_file = \"/run/forkd/\""), "names the key and value: {out:?}");
    let cfg = write_config(&d, "pid_file = \"/run/forkd/forkd.pid\"");
    assert_eq!(check_config(&d, &cfg, &[]).code(), Some(0));
    let out = check_config(&d, &cfg, &[("FORKD_PID_FILE", ".")]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("FORKD_PID_FILE"), "{out:?}");
}
