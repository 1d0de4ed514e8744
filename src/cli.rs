//! The command line (CONTRACT §1): `serve`, `check-config`, `gen-secret`,
//! `--version`. Parses arguments, loads the configuration and hands over to
//! the supervisor. The only place besides `main` that prints to stdout/stderr
//! directly (before logging exists).

use std::path::PathBuf;

use crate::config;

const USAGE: &str = "usage:
  forkd [serve] [--config FILE]      run the service (foreground)
  forkd check-config [--config FILE] validate the configuration
  forkd gen-secret                   print a fresh 256-bit secret (base64)
  forkd --version                    print the version";

/// Exit code for a bad command line or configuration.
pub const EXIT_USAGE: i32 = 2;

/// Run the command in `args` (without the program name); returns the exit code.
pub fn run(args: &[String]) -> i32 {
    let (cmd, rest) = match args.first().map(String::as_str) {
        None => ("serve", &args[..0]),
        Some(a) if a.starts_with('-') && a != "-V" && a != "--version" && a != "-h" && a != "--help" => ("serve", args),
        Some(a) => (a, &args[1..]),
    };
    match cmd {
        "-V" | "--version" | "version" => {
            println!("forkd {}", env!("CARGO_PKG_VERSION"));
            0
        }
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            0
        }
        "gen-secret" => gen_secret(),
        "serve" => match load(rest) {
            Ok(cfg) => serve(cfg),
            Err(code) => code,
        },
        "check-config" => match load(rest) {
            Ok(cfg) => {
                println!("configuration ok: {} worker(s) on {}", cfg.workers, cfg.listen);
                0
            }
            Err(code) => code,
        },
        "user" => {
            eprintln!("forkd: `user create` arrives with the data store; not available in this build");
            EXIT_USAGE
        }
        other => {
            eprintln!("forkd: unknown command `{other}`\n{USAGE}");
            EXIT_USAGE
        }
    }
}

fn load(args: &[String]) -> Result<config::Config, i32> {
    let mut path: Option<PathBuf> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
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
    config::load(path.as_deref(), &env).map_err(|errors| {
        for line in errors.problems {
            eprintln!("forkd: config: {line}");
        }
        EXIT_USAGE
    })
}

fn serve(cfg: config::Config) -> i32 {
    crate::logging::init(cfg.log_format);
    if let Err(e) = std::fs::create_dir_all(&cfg.data_dir) {
        log::error!("cannot create data_dir {}: {e}", cfg.data_dir.display());
        return 1;
    }
    crate::supervisor::run(cfg)
}

fn gen_secret() -> i32 {
    use base64::Engine;
    use rand::RngCore;
    let mut key = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut key);
    println!("{}", base64::engine::general_purpose::STANDARD.encode(key));
    0
}
