//! The usage texts of the command line: the overview (`forkd --help`) and one page per
//! subcommand (`forkd <command> --help`, `forkd help <command>`), printed on stdout with
//! exit 0. It owns the texts and the decision "was help asked for"; it must not run,
//! load or touch anything (help works with no configuration, no database, no network).

/// `forkd --help`: every command in one screen.
pub(super) const USAGE: &str = "usage:
  forkd [serve] [--config FILE]      run the service (foreground)
  forkd check-config [--config FILE] validate the configuration
  forkd print-config [--config FILE] print the effective configuration (file, FORKD_* variables,
                                     defaults) as TOML forkd reads back; the secret is not shown
  forkd gen-secret                   print a fresh 256-bit secret (base64)
  forkd user create --email E --name N [--age A] [--role user|admin] --password-stdin [--config FILE]
                                     create a user in the database (works while the service runs)
  forkd migrate [--config FILE] [--apply]
                                     show the schema changes the declared resources need;
                                     --apply makes them, destructive ones included
  forkd --version                    print the version

`forkd <command> --help` shows a command's options.";

/// The `--config` option, the same for every command that reads the configuration.
macro_rules! config_option {
    () => {
        "  --config FILE, -c FILE   the configuration file; without it $FORKD_CONFIG, else the
                           built-in defaults. FORKD_* variables override the file's keys."
    };
}

const SERVE: &str = concat!(
    "usage: forkd [serve] [--config FILE]

Run the service in the foreground: a supervisor and its workers. It logs to
stderr; SIGTERM or SIGINT drains and stops it, SIGHUP re-reads the
configuration. A problem a restart cannot fix (a refused configuration, an
unusable data_dir or database file, an address in use or not allowed) exits 2
with one line saying what to do.

",
    config_option!()
);

const CHECK_CONFIG: &str = concat!(
    "usage: forkd check-config [--config FILE]

Validate the configuration (file and FORKD_* variables), the TLS files it
names and the schema changes the declared resources need. Exit 0 with a
summary, or exit 2 with one line per problem on stderr.

",
    config_option!()
);

const PRINT_CONFIG: &str = concat!(
    "usage: forkd print-config [--config FILE]

Print the configuration in effect as TOML that forkd reads back: the file, the
FORKD_* variables (marked `# from FORKD_...`) and the defaults for the rest.
The signing secret is never shown. An invalid configuration prints nothing and
exits 2 with the same lines as check-config.

",
    config_option!()
);

const GEN_SECRET: &str = "usage: forkd gen-secret

Print a fresh 256-bit signing secret, base64, from the operating system's
random source. Production needs one:

  forkd gen-secret > /etc/forkd/jwt_secret
  # then auth.jwt_secret_file = \"/etc/forkd/jwt_secret\" (or FORKD_AUTH__JWT_SECRET_FILE)";

const MIGRATE: &str = concat!(
    "usage: forkd migrate [--config FILE] [--apply]

Show the schema changes the declared resources need, one line each, marked
additive or destructive. Nothing changes without --apply.

  --apply                  make every change, destructive ones included
",
    config_option!()
);

/// `forkd user --help`.
pub(super) const USER: &str = "usage:
  forkd user create --email E --name N [--age A] [--role user|admin] --password-stdin [--config FILE]

Create a user directly in the database (to bootstrap an admin); works while the
service runs. The password is read from standard input, less one trailing
newline. Prints the new user as a JSON object; a duplicate e-mail exits 1, bad
arguments exit 2.

  --email E          the e-mail address (unique)
  --name N           the display name
  --age A            optional, 0 to 150
  --role R           user (default) or admin
  --password-stdin   read the password from standard input (required)
  --config FILE      the configuration (its data_dir holds the database)";

/// The usage page of `command`; `None` for a name that is not a command.
pub(super) fn page(command: &str) -> Option<&'static str> {
    Some(match command {
        "serve" => SERVE,
        "check-config" => CHECK_CONFIG,
        "print-config" => PRINT_CONFIG,
        "gen-secret" => GEN_SECRET,
        "migrate" => MIGRATE,
        "user" => USER,
        _ => return None,
    })
}

/// Whether `-h` or `--help` is among `args`.
pub(super) fn asked(args: &[String]) -> bool {
    args.iter().any(|a| a == "-h" || a == "--help")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_of_the_overview_has_a_page_that_starts_with_its_usage() {
        for command in ["serve", "check-config", "print-config", "gen-secret", "migrate", "user"] {
            let text = page(command).unwrap_or_else(|| panic!("no page for {command}"));
            let first = text.lines().find(|l| l.contains("forkd")).unwrap_or_default();
            assert!(first.contains(command) && text.starts_with("usage:"), "{command}: {text}");
        }
        assert_eq!(page("nope"), None);
    }

    #[test]
    fn help_is_asked_by_either_flag_anywhere() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(asked(&args(&["--config", "f.toml", "--help"])));
        assert!(asked(&args(&["-h"])));
        assert!(!asked(&args(&["--config", "help.toml"])));
    }
}
