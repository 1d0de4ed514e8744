//! Configuration in two stages (CONTRACT §2): the TOML file, with `FORKD_*` environment
//! overrides applied on top, is read as a [`RawConfig`] that mirrors the file
//! (`raw.rs`, `env.rs`), then checked and resolved into a [`Config`] of ready-to-use types
//! (`validate.rs`). Every problem is collected, one line each, into [`ConfigErrors`]; the caller
//! prints them and exits with code 2. [`print()`] writes a configuration back as commented TOML
//! (`print.rs`, `forkd print-config`).
//!
//! This module must not read the process environment (the caller passes the pairs), must do
//! no I/O beyond reading the one config file, and depends on no other forkd module. It runs
//! once, in the supervisor, before any fork.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::{Table, Value};

mod cidr;
mod cluster;
mod env;
mod print;
pub mod raw;
mod suggest;
mod validate;

pub use cidr::Cidr;
pub use cluster::{without_password, Cluster, DatabaseUrl};
pub use raw::RawConfig;

/// The validated, resolved configuration. `Default` is the contract's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Development or production.
    pub environment: Environment,
    /// The address to listen on.
    pub listen: SocketAddr,
    /// Connections on `listen` start with a PROXY protocol header (`proxy_protocol`).
    pub proxy_protocol: bool,
    /// Worker processes (0 in the file is resolved to the number of CPUs).
    pub workers: usize,
    /// This service's own origin, lower-cased, e.g. `http://127.0.0.1:8080`.
    pub public_origin: String,
    /// Directory of the SQLite database.
    pub data_dir: PathBuf,
    /// Graceful drain limit.
    pub shutdown_timeout: Duration,
    /// Log line format.
    pub log_format: LogFormat,
    /// Send the CSP as `Content-Security-Policy-Report-Only`.
    pub csp_report_only: bool,
    /// Where the supervisor keeps its pid (`pid_file`); `None`: nowhere.
    pub pid_file: Option<PathBuf>,
    /// `[limits]`
    pub limits: Limits,
    /// `[db]`
    pub db: Db,
    /// `[io]`
    pub io: Io,
    /// `[auth]`
    pub auth: Auth,
    /// `[rate_limit]`
    pub rate_limit: RateLimit,
    /// `[cors]`
    pub cors: Cors,
    /// `[redirect]`
    pub redirect: Redirect,
    /// `[sse]`
    pub sse: Sse,
    /// `[download]`
    pub download: Download,
    /// `[upstreams]`
    pub upstreams: Upstreams,
    /// `[chat]`
    pub chat: Chat,
    /// `[websocket]`
    pub websocket: WebSocket,
    /// `[supervisor]`
    pub supervisor: Supervisor,
    /// `[tls]`
    pub tls: Tls,
    /// `[http2]`
    pub http2: Http2,
    /// `[http3]`
    pub http3: Http3,
    /// `[compression]`
    pub compression: Compression,
    /// `[proxy]`
    pub proxy: Proxy,
    /// `[cluster]`
    pub cluster: Cluster,
    /// `[debug]`
    pub debug: Debug,
    /// `[[resources]]`: the declared resources (with the built-in ones).
    pub resources: crate::resources::Registry,
}

/// `environment`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Environment {
    /// Error responses carry `stack`; a signing secret is generated when none is configured.
    Development,
    /// No debug output; a signing secret is required.
    Production,
}

/// `log_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `[limits]`
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Largest JSON request body (larger → 413).
    pub json_body_bytes: usize,
    /// Largest request head (larger → 431).
    pub max_header_bytes: usize,
    /// Time allowed for the whole head from its first byte (then 408 and close).
    pub header_timeout: Duration,
    /// Time allowed for the whole body from the end of the head (then 408 and close).
    pub body_timeout: Duration,
    /// Idle keep-alive connections are closed after this.
    pub keepalive_timeout: Duration,
    /// Open connections per worker.
    pub max_connections: usize,
}

/// `[db]`
#[derive(Debug, Clone, PartialEq)]
pub struct Db {
    /// The database file: `db.file` resolved against `data_dir`.
    pub path: PathBuf,
    /// Connections per worker (a worker opens at most `io.threads` of them).
    pub pool_size: usize,
}

/// `[io]`
#[derive(Debug, Clone, PartialEq)]
pub struct Io {
    /// Per-worker thread pool size.
    pub threads: usize,
}

/// `[auth]`
#[derive(Debug, Clone, PartialEq)]
pub struct Auth {
    /// Where the HS256 signing secret comes from.
    pub secret: JwtSecret,
    /// Token issuer (`iss`).
    pub issuer: String,
    /// Token audience (`aud`).
    pub audience: String,
    /// Access token lifetime.
    pub access_ttl: Duration,
    /// Refresh token lifetime.
    pub refresh_ttl: Duration,
    /// argon2id memory cost in KiB.
    pub argon2_memory_kib: u32,
    /// argon2id iterations.
    pub argon2_iterations: u32,
    /// Mark cookies `Secure`.
    pub cookie_secure: bool,
}

/// The refusal of a production configuration with no signing secret; it names the command
/// that makes one.
pub const SECRET_REQUIRED: &str = "auth.jwt_secret or auth.jwt_secret_file is required in production: \
     make one with `forkd gen-secret > /etc/forkd/jwt_secret` and set auth.jwt_secret_file \
     (FORKD_AUTH__JWT_SECRET_FILE) to that file";

/// The source of the signing secret: `auth.jwt_secret`, `auth.jwt_secret_file`, or neither.
/// Its `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub enum JwtSecret {
    /// `auth.jwt_secret`, at least 32 bytes.
    Inline(String),
    /// `auth.jwt_secret_file`; the caller reads it.
    File(PathBuf),
    /// Neither is set (development only): the caller generates one at start.
    Generate,
}

impl fmt::Debug for JwtSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Inline(_) => f.write_str("Inline(<redacted>)"),
            Self::File(path) => f.debug_tuple("File").field(path).finish(),
            Self::Generate => f.write_str("Generate"),
        }
    }
}

/// `[rate_limit]`
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimit {
    /// Rate limiting on or off.
    pub enabled: bool,
    /// Requests per client address per window, across all workers.
    pub max: u64,
    /// Window length.
    pub window: Duration,
    /// Failed logins per (address, e-mail) per window before 429.
    pub login_max_failures: u64,
}

/// `[cors]`
#[derive(Debug, Clone, PartialEq)]
pub struct Cors {
    /// Allowed origins, lower-cased, compared exactly.
    pub origins: Vec<String>,
}

/// `[redirect]`
#[derive(Debug, Clone, PartialEq)]
pub struct Redirect {
    /// Host names `/redirect?url=` may point to, lower-cased.
    pub allowed_hosts: Vec<String>,
}

/// `[sse]`
#[derive(Debug, Clone, PartialEq)]
pub struct Sse {
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Reconnect delay sent as `retry:`.
    pub retry: Duration,
    /// Most notifications replayed after `Last-Event-ID`.
    pub replay_limit: usize,
}

/// `[download]`
#[derive(Debug, Clone, PartialEq)]
pub struct Download {
    /// Directory served by `/download/{name}`.
    pub dir: PathBuf,
}

/// `[upstreams]`
#[derive(Debug, Clone, PartialEq)]
pub struct Upstreams {
    /// Users service base URL without trailing `/`; `None` = built-in demo.
    pub users: Option<String>,
    /// Orders service base URL without trailing `/`; `None` = built-in demo.
    pub orders: Option<String>,
    /// Recommendations service base URL without trailing `/`; `None` = built-in demo.
    pub recommendations: Option<String>,
    /// Per-call timeout.
    pub timeout: Duration,
    /// Cache lifetime of upstream answers.
    pub cache_ttl: Duration,
    /// Entries in each worker's upstream cache.
    pub cache_entries: usize,
}

/// `[chat]`
#[derive(Debug, Clone, PartialEq)]
pub struct Chat {
    /// OpenAI-compatible streaming endpoint URL; `None` = built-in echo.
    pub upstream: Option<String>,
    /// Model name sent upstream.
    pub model: String,
    /// Delay between echoed chunks.
    pub echo_delay: Duration,
}

/// `[websocket]`
#[derive(Debug, Clone, PartialEq)]
pub struct WebSocket {
    /// `/ws/echo` enabled.
    pub echo: bool,
    /// Largest message (larger → close 1009).
    pub max_message_bytes: usize,
    /// Rooms one connection may be in; a join beyond it is answered with an
    /// error message and the connection stays.
    pub max_rooms_per_connection: usize,
}

/// `[supervisor]`
#[derive(Debug, Clone, PartialEq)]
pub struct Supervisor {
    /// A worker over this resident memory (MiB) is replaced.
    pub worker_max_rss_mb: u64,
    /// How often worker memory is read.
    pub memory_check: Duration,
    /// A worker whose loop is stuck this long is killed.
    pub worker_timeout: Duration,
}

/// `[tls]`: validated as far as the file goes; the certificate and key files are read and
/// checked by `crate::tls` (start-up, `check-config`, HUP).
#[derive(Debug, Clone, PartialEq)]
pub struct Tls {
    /// The HTTPS listening address; `None`: no TLS listener.
    pub listen: Option<SocketAddr>,
    /// The PEM certificate chain (set whenever `listen` is).
    pub cert_file: PathBuf,
    /// The PEM private key (set whenever `listen` is).
    pub key_file: PathBuf,
    /// The plain listener answers 308 to https (except `/health`, `/metrics` and the ACME
    /// HTTP-01 path).
    pub redirect_http: bool,
    /// Connections on `listen` start with a PROXY protocol header (`tls.proxy_protocol`).
    pub proxy_protocol: bool,
    /// Automatic certificates: set exactly when `tls.acme.directory` is (then `cert_file` and
    /// `key_file` are empty).
    pub acme: Option<Acme>,
}

/// `[tls.acme]`: resolved; read by `crate::acme`.
#[derive(Debug, Clone, PartialEq)]
pub struct Acme {
    /// The CA's directory URL (https).
    pub directory: String,
    /// The account's contact address; `None`: no contact.
    pub email: Option<String>,
    /// The certificate's DNS names, lower case, at least one.
    pub domains: Vec<String>,
    /// The roots the CA's HTTPS certificate must chain to; `None`: the system's.
    pub ca_file: Option<PathBuf>,
    /// The challenge type answered.
    pub challenge: AcmeChallenge,
}

/// The ACME challenge type forkd answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcmeChallenge {
    /// TLS-ALPN-01 (RFC 8737) on the TLS listener.
    TlsAlpn01,
    /// HTTP-01 on the plain listener.
    Http01,
}

impl AcmeChallenge {
    /// The challenge's `type` in ACME messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::TlsAlpn01 => "tls-alpn-01",
            Self::Http01 => "http-01",
        }
    }
}

/// `[http2]`: resolved; the three numbers are announced in the server's SETTINGS frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Http2 {
    /// HTTP/2 is served (ALPN `h2`, h2c prior knowledge); `false`: HTTP/1.1 only.
    pub enabled: bool,
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub max_concurrent_streams: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub initial_window_size: u32,
    /// SETTINGS_MAX_FRAME_SIZE.
    pub max_frame_size: u32,
}

/// `[http3]`: resolved; `listen` is set exactly when HTTP/3 is enabled.
#[derive(Debug, Clone, PartialEq)]
pub struct Http3 {
    /// The UDP address HTTP/3 is served on: `http3.listen`, or `tls.listen` when that is empty;
    /// `None`: HTTP/3 is off.
    pub listen: Option<SocketAddr>,
    /// `ma=` of the `Alt-Svc` header, in seconds.
    pub alt_svc_max_age: u64,
    /// 0-RTT early data accepted (safe methods served from it, others 425).
    pub early_data: bool,
}

impl Http3 {
    /// Whether HTTP/3 is on.
    pub fn enabled(&self) -> bool {
        self.listen.is_some()
    }
}

/// `[compression]`: resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Compression {
    /// Responses may be compressed at all.
    pub enabled: bool,
    /// Bodies shorter than this are never compressed.
    pub min_bytes: usize,
    /// Effort (1 to 9) for bodies compressed per response (`compress::Effort::Level`).
    pub level: u32,
}

/// `[proxy]`: the proxies whose `Forwarded`, `X-Forwarded-For` and `X-Forwarded-Proto` are
/// believed (`crate::http::client` decides the client from them).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Proxy {
    /// The trusted networks; empty: no peer is a proxy, the headers are never read.
    pub trusted: Vec<Cidr>,
}

/// `[debug]`: test-only switches, never on in production.
#[derive(Debug, Clone, PartialEq)]
pub struct Debug {
    /// The `/_debug/*` routes are enabled.
    pub routes: bool,
}

impl Config {
    /// Whether `environment = "development"`.
    pub fn is_development(&self) -> bool {
        self.environment == Environment::Development
    }
}

impl Default for Config {
    fn default() -> Self {
        let mut config = validate::resolve(&RawConfig::default(), &env::Sources::new()).0;
        config.resources = crate::resources::parse::registry(None, &mut Vec::new());
        config
    }
}

/// Every problem found in a configuration, one human-readable line each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors {
    /// The problems, in the order found; never empty.
    pub problems: Vec<String>,
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.problems.join("\n"))
    }
}

impl std::error::Error for ConfigErrors {}

/// The config file to read: `--config` (`cli`), else a non-empty `FORKD_CONFIG` in `env`,
/// else `None` (built-in defaults).
pub fn config_path(cli: Option<&Path>, env: &[(String, String)]) -> Option<PathBuf> {
    cli.map(Path::to_path_buf).or_else(|| {
        let (_, value) = env.iter().rev().find(|(name, _)| name == env::CONFIG_VAR)?;
        (!value.is_empty()).then(|| PathBuf::from(value))
    })
}

/// Where the running configuration came from, kept to read it again on `SIGHUP`.
#[derive(Debug, Clone, Default)]
pub struct Source {
    /// The config file (`--config` or `FORKD_CONFIG`); `None`: built-in defaults.
    pub path: Option<PathBuf>,
    /// The `FORKD_*` variables at start (a running service's environment does not change).
    pub env: Vec<(String, String)>,
}

impl Source {
    /// Read and validate the configuration again.
    pub fn load(&self) -> Result<Config, ConfigErrors> {
        load(self.path.as_deref(), &self.env)
    }
}

/// Reads the config file at `path` (`None`: built-in defaults), applies the `FORKD_*`
/// overrides in `env` (typically `std::env::vars().collect()`), and validates the result.
/// `FORKD_CONFIG` is skipped here; resolve it with [`config_path`].
pub fn load(path: Option<&Path>, env: &[(String, String)]) -> Result<Config, ConfigErrors> {
    from_table(read(path)?, env)
}

/// The config file at `path` parsed (`None`: an empty table, all defaults).
fn read(path: Option<&Path>) -> Result<Table, ConfigErrors> {
    let Some(path) = path else { return Ok(Table::new()) };
    let text =
        std::fs::read_to_string(path).map_err(|e| one(format!("{}: cannot read config file: {e}", path.display())))?;
    parse(&path.display().to_string(), &text)
}

/// [`load`] on the text of a config file (`name` appears in syntax errors): parses it,
/// applies the `FORKD_*` overrides in `env` and validates. Reads no file and no environment.
pub fn from_toml(name: &str, text: &str, env: &[(String, String)]) -> Result<Config, ConfigErrors> {
    parse(name, text).and_then(|table| from_table(table, env))
}

/// `text` parsed as TOML; a syntax error is one line: `name:line:column: message`.
fn parse(name: &str, text: &str) -> Result<Table, ConfigErrors> {
    text.parse().map_err(|e: toml::de::Error| {
        let before = e.span().and_then(|span| text.get(..span.start)).unwrap_or("");
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
        // One line: the message may quote a key holding control characters.
        let mut message = String::new();
        for c in e.message().trim().chars() {
            match c {
                '\n' => message.push_str("; "),
                c if c.is_control() => message.extend(c.escape_debug()),
                c => message.push(c),
            }
        }
        one(format!("{name}:{line}:{column}: invalid TOML: {message}"))
    })
}

/// The file's table with the environment applied, checked, deserialized and resolved.
fn from_table(table: Table, env: &[(String, String)]) -> Result<Config, ConfigErrors> {
    resolve_table(table, env).map(|(config, _, _, _)| config)
}

/// [`from_table`], also returning the raw values and which variables set which keys.
/// The `[[resources]]` array is taken out first and read by `crate::resources::parse`; it is
/// returned as written (for `print-config`).
fn resolve_table(
    mut table: Table,
    env: &[(String, String)],
) -> Result<(Config, RawConfig, env::Sources, Option<Value>), ConfigErrors> {
    let defaults = raw::default_table();
    let mut problems = Vec::new();
    let declared = table.remove("resources");
    let sources = env::apply(&mut table, &defaults, env, &mut problems);
    raw::check_keys(&mut table, &defaults, &mut problems);
    let resources = crate::resources::parse::registry(declared.as_ref(), &mut problems);
    match Value::Table(table).try_into::<RawConfig>() {
        Ok(raw) => {
            let (mut config, found) = validate::resolve(&raw, &sources);
            config.resources = resources;
            problems.extend(found);
            if problems.is_empty() {
                return Ok((config, raw, sources, declared));
            }
        }
        Err(e) => problems.push(format!("config: {}", e.message().replace('\n', "; "))),
    }
    Err(ConfigErrors { problems })
}

/// The effective configuration (`forkd print-config`): the file at `path` (`None`: built-in
/// defaults) with the `FORKD_*` overrides in `env`, validated like [`load`], written as TOML
/// that [`load`] reads back to the same values. Every key is there with its doc comment; the
/// signing secret is never written (a set `auth.jwt_secret` is a comment saying so).
pub fn print(path: Option<&Path>, env: &[(String, String)]) -> Result<String, ConfigErrors> {
    let (_, raw, sources, declared) = resolve_table(read(path)?, env)?;
    Ok(print::render(&raw, declared.as_ref(), &print::Origin { file: path, sources: &sources }))
}

/// [`print()`] on the text of a config file named `file`. Reads no file and no environment.
pub fn print_toml(file: &Path, text: &str, env: &[(String, String)]) -> Result<String, ConfigErrors> {
    let (_, raw, sources, declared) = resolve_table(parse(&file.display().to_string(), text)?, env)?;
    Ok(print::render(&raw, declared.as_ref(), &print::Origin { file: Some(file), sources: &sources }))
}

fn one(problem: String) -> ConfigErrors {
    ConfigErrors { problems: vec![problem] }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CONTRACT §2, verbatim.
    const CONTRACT: &str = r#"
environment = "development"      # or "production"
listen = "127.0.0.1:8080"        # TCP, HTTP/1.1 (and h2c prior knowledge once HTTP/2 lands)
workers = 0                      # 0 = one per CPU
public_origin = "http://127.0.0.1:8080"   # this service's own origin (CORS, CSRF origin check)
data_dir = "./data"              # SQLite database lives here
shutdown_timeout_ms = 30000      # graceful drain limit, then force-close
log_format = "text"              # or "json"
csp_report_only = false          # true: the CSP goes out as Content-Security-Policy-Report-Only

[limits]
json_body_bytes = 10240          # 10 kB (seed 8)
max_header_bytes = 16384         # larger -> 431
header_timeout_ms = 10000        # whole head within this from its first byte, else 408 and close
body_timeout_ms = 30000          # whole body within this from the end of the head, else 408 and close
keepalive_timeout_ms = 5000
max_connections = 10000          # per worker

[db]
file = "forkd.db"                # under data_dir
pool_size = 10

[io]
threads = 4                      # per-worker thread pool for CPU-heavy / blocking work

[auth]
jwt_secret = ""                  # >= 32 bytes; or jwt_secret_file; production refuses to start without one
jwt_secret_file = ""
issuer = "forkd"
audience = "forkd-api"
access_ttl_secs = 900            # 15 minutes
refresh_ttl_secs = 604800        # 7 days
argon2_memory_kib = 19456        # argon2id, OWASP baseline (equivalent of bcrypt cost 12)
argon2_iterations = 2
cookie_secure = true

[rate_limit]
enabled = true
max = 100                        # per client address per window, across ALL workers
window_secs = 900
login_max_failures = 5           # per (address, email) per window; further attempts → 429 until it ends

[cors]
origins = []                     # allow-list, exact origins

[redirect]
allowed_hosts = []

[sse]
heartbeat_ms = 30000
retry_ms = 3000
replay_limit = 1000

[download]
dir = "./data/files"

[upstreams]                      # /api/homepage; empty = built-in demo upstreams
users = ""
orders = ""
recommendations = ""
timeout_ms = 3000
cache_ttl_secs = 300
cache_entries = 1000

[chat]
upstream = ""                    # OpenAI-compatible streaming chat endpoint; empty = built-in echo
model = ""
echo_delay_ms = 20

[websocket]
echo = false                     # enables /ws/echo (conformance testing)
max_message_bytes = 65536
max_rooms_per_connection = 64    # a join beyond it → {"type":"error"}; the connection stays

[supervisor]
worker_max_rss_mb = 500
memory_check_ms = 5000
worker_timeout_ms = 30000        # a worker whose event loop is stuck this long is killed

[http2]
enabled = true                   # h2 over TLS (ALPN) and h2c prior knowledge on `listen`
max_concurrent_streams = 128
initial_window_size = 65535
max_frame_size = 16384
"#;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn load_str(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
        let env: Vec<_> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        from_toml("test.toml", text, &env)
    }

    fn problems(text: &str, env: &[(&str, &str)]) -> Vec<String> {
        match load_str(text, env) {
            Ok(config) => panic!("expected problems, got {config:?}"),
            Err(e) => e.problems,
        }
    }

    #[test]
    fn defaults_are_the_contract() {
        let contract: RawConfig = toml::from_str(CONTRACT).expect("contract parses");
        assert_eq!(contract, RawConfig::default());
        let config = Config::default();
        assert_eq!(load(None, &[]), Ok(config.clone()));
        assert_eq!(load_str(CONTRACT, &[]), Ok(config.clone()));
        assert!(config.is_development());
        assert_eq!(config.listen, "127.0.0.1:8080".parse().expect("literal"));
        assert!(config.workers >= 1);
        assert_eq!(config.public_origin, "http://127.0.0.1:8080");
        assert_eq!(config.shutdown_timeout, Duration::from_secs(30));
        assert_eq!(config.log_format, LogFormat::Text);
        let limits = Limits {
            json_body_bytes: 10240,
            max_header_bytes: 16384,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(5),
            max_connections: 10000,
        };
        assert_eq!(config.limits, limits);
        assert_eq!(config.db.path, Path::new("./data/forkd.db"));
        assert_eq!((config.db.pool_size, config.io.threads), (10, 4));
        assert_eq!(config.auth.secret, JwtSecret::Generate);
        assert_eq!((config.auth.issuer.as_str(), config.auth.audience.as_str()), ("forkd", "forkd-api"));
        assert_eq!(config.auth.access_ttl, Duration::from_secs(900));
        assert_eq!(config.auth.refresh_ttl, Duration::from_secs(604_800));
        assert_eq!((config.auth.argon2_memory_kib, config.auth.argon2_iterations), (19456, 2));
        assert!(config.auth.cookie_secure && config.rate_limit.enabled);
        assert_eq!((config.rate_limit.max, config.rate_limit.login_max_failures), (100, 5));
        assert_eq!(config.rate_limit.window, Duration::from_secs(900));
        assert!(config.cors.origins.is_empty() && config.redirect.allowed_hosts.is_empty());
        let sse = Sse { heartbeat: Duration::from_secs(30), retry: Duration::from_secs(3), replay_limit: 1000 };
        assert_eq!(config.sse, sse);
        assert_eq!(config.download.dir, Path::new("./data/files"));
        let upstreams = Upstreams {
            users: None,
            orders: None,
            recommendations: None,
            timeout: Duration::from_secs(3),
            cache_ttl: Duration::from_secs(300),
            cache_entries: 1000,
        };
        assert_eq!(config.upstreams, upstreams);
        assert_eq!((config.chat.upstream.as_deref(), config.chat.model.as_str()), (None, ""));
        assert_eq!(config.chat.echo_delay, Duration::from_millis(20));
        assert_eq!((config.websocket.echo, config.websocket.max_message_bytes), (false, 65536));
        assert_eq!(config.websocket.max_rooms_per_connection, 64);
        let supervisor = Supervisor {
            worker_max_rss_mb: 500,
            memory_check: Duration::from_secs(5),
            worker_timeout: Duration::from_secs(30),
        };
        assert_eq!(config.supervisor, supervisor);
        assert!(!config.debug.routes && !config.csp_report_only);
        assert_eq!(config.pid_file, None);
    }

    #[test]
    fn pid_file_from_the_file_or_the_environment() {
        let config = load_str("pid_file = \"/run/forkd/forkd.pid\"\n", &[]).expect("valid");
        assert_eq!(config.pid_file.as_deref(), Some(Path::new("/run/forkd/forkd.pid")));
        let config = load_str("pid_file = \"a.pid\"\n", &[("FORKD_PID_FILE", "run/b.pid")]).expect("valid");
        assert_eq!(config.pid_file.as_deref(), Some(Path::new("run/b.pid")));
        assert_eq!(load_str("pid_file = \"a.pid\"\n", &[("FORKD_PID_FILE", "")]).map(|c| c.pid_file), Ok(None));
        for bad in ["/run/forkd/", "/run/..", ".", "a\\u0000b"] {
            let found = problems(&format!("pid_file = \"{bad}\"\n"), &[]);
            assert_eq!(found.len(), 1, "{bad}: {found:?}");
            assert!(found[0].starts_with("pid_file = ") && found[0].contains("the path of a file"), "{found:?}");
        }
        let found = problems("", &[("FORKD_PID_FILE", "/tmp/")]);
        assert!(found[0].ends_with("(from FORKD_PID_FILE)"), "{found:?}");
        assert_eq!(problems("pid_file = 1\n", &[]).len(), 1);
    }

    #[test]
    fn acme_replaces_the_certificate_files() {
        let base = "public_origin = \"https://a.example\"\n[tls]\nlisten = \"0.0.0.0:8443\"\n";
        let on = format!(
            "{base}[tls.acme]\ndirectory = \"https://ca.example/dir\"\nemail = \"ops@a.example\"\n\
             domains = [\"A.example\", \"www.a.example.\", \"a.example\"]\nca_file = \"ca.pem\"\n"
        );
        let acme = load_str(&on, &[]).expect("valid").tls.acme.expect("acme on");
        assert_eq!(acme.directory, "https://ca.example/dir");
        assert_eq!(acme.email.as_deref(), Some("ops@a.example"));
        assert_eq!(acme.domains, ["a.example", "www.a.example"]);
        assert_eq!(acme.ca_file.as_deref(), Some(Path::new("ca.pem")));
        assert_eq!(acme.challenge, AcmeChallenge::TlsAlpn01);
        // The inline form is the same TOML; a variable sets a list.
        let inline = format!("{base}acme = {{ directory = \"https://ca.example/dir\", domains = [\"a.example\"], challenge = \"http-01\" }}\n");
        let acme = load_str(&inline, &[]).expect("valid").tls.acme.expect("acme on");
        assert_eq!((acme.email, acme.challenge), (None, AcmeChallenge::Http01));
        let env = [("FORKD_TLS__ACME__DOMAINS", "b.example,c.example")];
        let acme = load_str(&inline, &env).expect("valid").tls.acme.expect("acme on");
        assert_eq!(acme.domains, ["b.example", "c.example"]);
        assert_eq!(Config::default().tls.acme, None);
    }

    #[test]
    fn bad_acme_values_are_one_line_each() {
        let base = "public_origin = \"https://a.example\"\n[tls]\nlisten = \"0.0.0.0:8443\"\n";
        let cases: &[(&str, &str)] = &[
            (
                "directory = \"http://ca.example/dir\"\ndomains = [\"a.example\"]\n",
                r#"tls.acme.directory = "http://ca.example/dir": must be an https:// URL"#,
            ),
            ("directory = \"https://ca.example/dir\"\n", "tls.acme.domains is empty: name at least one DNS name"),
            (
                "directory = \"https://ca.example/dir\"\ndomains = [\"*.a.example\"]\n",
                r#"tls.acme.domains[0] = "*.a.example": must be a DNS name without a wildcard"#,
            ),
            (
                "directory = \"https://ca.example/dir\"\ndomains = [\"a.example\", \"a b\"]\n",
                r#"tls.acme.domains[1] = "a b": must be a DNS name"#,
            ),
            (
                "directory = \"https://ca.example/dir\"\ndomains = [\"10.0.0.1\"]\n",
                r#"tls.acme.domains[0] = "10.0.0.1": must be a DNS name"#,
            ),
            (
                "directory = \"https://ca.example/dir\"\ndomains = [\"a.example\"]\nemail = \"ops\"\n",
                r#"tls.acme.email = "ops": must be empty or an address"#,
            ),
            (
                "directory = \"https://ca.example/dir\"\ndomains = [\"a.example\"]\nchallenge = \"dns-01\"\n",
                r#"tls.acme.challenge = "dns-01": must be one of tls-alpn-01, http-01"#,
            ),
            (
                "directory = \"https://ca.example/dir\"\ndomains = [\"a.example\"]\nport = 1\n",
                "unknown key port in section [tls.acme]",
            ),
        ];
        for (acme, want) in cases {
            let found = problems(&format!("{base}[tls.acme]\n{acme}"), &[]);
            assert_eq!(found.len(), 1, "{acme}: {found:?}");
            assert!(found[0].starts_with(want), "{acme}: {found:?}");
        }
        let both = format!("{base}cert_file = \"c.pem\"\n[tls.acme]\ndirectory = \"https://ca.example/d\"\ndomains = [\"a.example\"]\n");
        assert_eq!(
            problems(&both, &[]),
            ["tls.cert_file and tls.acme.directory are both set: with ACME the certificate is kept under data_dir/acme; remove tls.cert_file"]
        );
        let no_directory = "[tls.acme]\ndomains = [\"a.example\"]\n";
        assert_eq!(
            problems(no_directory, &[]),
            ["tls.acme is configured but tls.acme.directory is empty: set the CA's directory URL"]
        );
        let no_listener = "[tls.acme]\ndirectory = \"https://ca.example/d\"\ndomains = [\"a.example\"]\n";
        assert_eq!(
            problems(no_listener, &[]),
            ["tls.acme.directory is set but tls.listen is not: ACME needs the TLS listener"]
        );
    }

    #[test]
    fn tls_section() {
        let config = Config::default();
        assert_eq!(config.tls.listen, None);
        assert!(!config.tls.redirect_http);
        let on = "public_origin = \"https://a.example\"\n[tls]\nlisten = \"0.0.0.0:8443\"\n\
                  cert_file = \"c.pem\"\nkey_file = \"k.pem\"\nredirect_http = true\n";
        let config = load_str(on, &[]).expect("valid");
        assert_eq!(config.tls.listen, Some("0.0.0.0:8443".parse().expect("literal")));
        assert_eq!(
            (config.tls.cert_file.as_path(), config.tls.key_file.as_path()),
            (Path::new("c.pem"), Path::new("k.pem"))
        );
        assert!(config.tls.redirect_http);
        let env = [("FORKD_TLS__LISTEN", "127.0.0.1:9443"), ("FORKD_TLS__REDIRECT_HTTP", "false")];
        let config = load_str(on, &env).expect("valid");
        assert_eq!(config.tls.listen, Some("127.0.0.1:9443".parse().expect("literal")));
        assert!(!config.tls.redirect_http);
        assert_eq!(
            problems("[tls]\nlisten = \"0.0.0.0:443\"\n", &[]),
            [
                "tls.cert_file is required when tls.listen is set (or set tls.acme.directory)",
                "tls.key_file is required when tls.listen is set (or set tls.acme.directory)",
                r#"public_origin = "http://127.0.0.1:8080": must be the https origin when tls.listen is set (https://a.example)"#,
            ]
        );
        assert_eq!(
            problems("public_origin = \"https://a.example\"\n[tls]\nlisten = \"localhost:443\"\ncert_file = \"c\"\nkey_file = \"k\"\n", &[]),
            [r#"tls.listen = "localhost:443": must be empty or an address ip:port (0.0.0.0:443)"#]
        );
        assert_eq!(
            problems(
                "listen = \"127.0.0.1:8443\"\npublic_origin = \"https://a.example\"\n[tls]\nlisten = \"127.0.0.1:8443\"\ncert_file = \"c\"\nkey_file = \"k\"\n",
                &[]
            ),
            [r#"tls.listen = "127.0.0.1:8443": must be an address other than `listen`"#]
        );
        assert_eq!(problems("[tls]\nredirect_http = true\n", &[]), ["tls.redirect_http = true needs tls.listen"]);
        assert_eq!(problems("[tls]\nredirect_http = 1\n", &[]), ["tls.redirect_http = 1: must be true or false"]);
        // Files without a listener are left alone (nothing reads them).
        assert!(load_str("[tls]\ncert_file = \"c.pem\"\n", &[]).is_ok());
    }

    #[test]
    fn http2_section() {
        let config = Config::default();
        let defaults =
            Http2 { enabled: true, max_concurrent_streams: 128, initial_window_size: 65_535, max_frame_size: 16_384 };
        assert_eq!(config.http2, defaults);
        let text = "[http2]\nenabled = false\nmax_concurrent_streams = 7\ninitial_window_size = 100000\n\
                    max_frame_size = 32768\n";
        let config = load_str(text, &[]).expect("valid");
        let set =
            Http2 { enabled: false, max_concurrent_streams: 7, initial_window_size: 100_000, max_frame_size: 32_768 };
        assert_eq!(config.http2, set);
        let env = [("FORKD_HTTP2__ENABLED", "false"), ("FORKD_HTTP2__MAX_FRAME_SIZE", "65536")];
        let config = load_str("", &env).expect("valid");
        assert_eq!(config.http2, Http2 { enabled: false, max_frame_size: 65_536, ..defaults });
        assert_eq!(
            problems("[http2]\nmax_concurrent_streams = 0\ninitial_window_size = 2147483648\n", &[]),
            [
                "http2.max_concurrent_streams = 0: must be between 1 and 1000",
                "http2.initial_window_size = 2147483648: must be between 0 and 2147483647",
            ]
        );
        assert_eq!(
            problems("", &[("FORKD_HTTP2__MAX_FRAME_SIZE", "16383")]),
            ["http2.max_frame_size = 16383: must be between 16384 and 16777215 (from FORKD_HTTP2__MAX_FRAME_SIZE)"]
        );
    }

    #[test]
    fn compression_section() {
        let config = load_str("", &[]).expect("valid");
        assert_eq!(config.compression, Compression { enabled: true, min_bytes: 1024, level: 6 });
        let config = load_str("[compression]\nenabled = false\nmin_bytes = 0\nlevel = 9\n", &[]).expect("valid");
        assert_eq!(config.compression, Compression { enabled: false, min_bytes: 0, level: 9 });
        assert_eq!(
            problems("[compression]\nmin_bytes = -1\nlevel = 10\n", &[]),
            [
                "compression.min_bytes = -1: must be between 0 and 67108864",
                "compression.level = 10: must be between 1 and 9",
            ]
        );
    }

    #[test]
    fn http3_section() {
        let config = Config::default();
        assert_eq!(config.http3, Http3 { listen: None, alt_svc_max_age: 86_400, early_data: true });
        assert!(!config.http3.enabled());
        let tls = "public_origin = \"https://a.example\"\n[tls]\nlisten = \"0.0.0.0:8443\"\n\
                   cert_file = \"c.pem\"\nkey_file = \"k.pem\"\n";
        // On, with no address of its own: the TLS listener's address and port (UDP).
        let config = load_str(&format!("{tls}[http3]\nenabled = true\n"), &[]).expect("valid");
        assert_eq!(config.http3.listen, Some("0.0.0.0:8443".parse().expect("literal")));
        let text = format!(
            "{tls}[http3]\nenabled = true\nlisten = \"127.0.0.1:9443\"\nalt_svc_max_age = 60\nearly_data = false\n"
        );
        let config = load_str(&text, &[]).expect("valid");
        assert_eq!(
            config.http3,
            Http3 { listen: Some("127.0.0.1:9443".parse().expect("literal")), alt_svc_max_age: 60, early_data: false }
        );
        let config = load_str(tls, &[("FORKD_HTTP3__ENABLED", "true")]).expect("valid");
        assert!(config.http3.enabled());
        // Off: no address even when one is written.
        let config = load_str(&format!("{tls}[http3]\nlisten = \"127.0.0.1:9443\"\n"), &[]).expect("valid");
        assert_eq!(config.http3.listen, None);
        assert_eq!(
            problems("[http3]\nenabled = true\n", &[]),
            ["http3.enabled = true needs [tls] (tls.listen, tls.cert_file, tls.key_file)"]
        );
        assert_eq!(
            problems(&format!("{tls}[http3]\nenabled = true\nlisten = \"localhost:443\"\nalt_svc_max_age = -1\n"), &[]),
            [
                r#"http3.listen = "localhost:443": must be empty or an address ip:port (0.0.0.0:443)"#,
                "http3.alt_svc_max_age = -1: must be between 0 and 315360000",
            ]
        );
    }

    #[test]
    fn cluster_section() {
        assert_eq!(Config::default().cluster, Cluster::default());
        let config = load_str("[cluster]\ndatabase_url = \"postgres://forkd:pw@db:5432/forkd\"\n", &[]).expect("valid");
        let url = config.cluster.database_url.expect("set");
        assert_eq!(
            (url.expose(), url.to_string().as_str()),
            ("postgres://forkd:pw@db:5432/forkd", "postgres://forkd@db:5432/forkd")
        );
        let from_env = load_str("", &[("FORKD_CLUSTER__DATABASE_URL", "postgresql://u@127.0.0.1/x")]).expect("valid");
        assert!(from_env.cluster.database_url.is_some());
        assert_eq!(
            problems("[cluster]\ndatabase_url = \"mysql://u:hunter2@db/x\"\n", &[]),
            [
                r#"cluster.database_url = "mysql://u@db/x": must be empty or a postgres:// URL (postgres://user@host:5432/db)"#
            ]
        );
        let redis = load_str("[cluster]\nredis_url = \"redis://:hunter2@cache:6380/2\"\n", &[]).expect("valid");
        let target = redis.cluster.redis_url.expect("set");
        assert_eq!(
            (target.host.as_str(), target.port, target.db, target.password.as_deref()),
            ("cache", 6380, 2, Some("hunter2"))
        );
        assert_eq!(format!("{target:?}"), "redis://:***@cache:6380/2");
        assert_eq!(
            problems("", &[("FORKD_CLUSTER__REDIS_URL", "tcp://:hunter2@h:1")]),
            [
                r#"cluster.redis_url = "tcp://@h:1": must be empty or a redis:// or rediss:// URL (redis://host:6379/0): it must start with redis:// or rediss:// (TLS) (from FORKD_CLUSTER__REDIS_URL)"#
            ]
        );
    }

    #[test]
    fn proxy_section() {
        assert!(Config::default().proxy.trusted.is_empty(), "nothing is trusted by default");
        let config = load_str("[proxy]\ntrusted = [\"10.0.0.0/8\", \"127.0.0.1\", \"::1/128\"]\n", &[]).expect("valid");
        let shown: Vec<String> = config.proxy.trusted.iter().map(Cidr::to_string).collect();
        assert_eq!(shown, ["10.0.0.0/8", "127.0.0.1/32", "::1/128"]);
        let config = load_str("", &[("FORKD_PROXY__TRUSTED", "192.168.0.0/16, fd00::/8")]).expect("valid");
        assert_eq!(config.proxy.trusted.len(), 2);
        assert_eq!(
            problems("[proxy]\ntrusted = [\"10.0.0.0/8\", \"10.0.0.0/33\", \"lb.internal\"]\n", &[]),
            [
                r#"proxy.trusted[1] = "10.0.0.0/33": must be an address or a network addr/prefix (10.0.0.0/8, ::1/128)"#,
                r#"proxy.trusted[2] = "lb.internal": must be an address or a network addr/prefix (10.0.0.0/8, ::1/128)"#,
            ]
        );
        assert_eq!(
            problems("[proxy]\ntrusted = \"10.0.0.0/8\"\n", &[]),
            [r#"proxy.trusted = "10.0.0.0/8": must be an array of strings"#]
        );
    }

    #[test]
    fn proxy_protocol_needs_trusted_balancers() {
        let config = Config::default();
        assert!(!config.proxy_protocol && !config.tls.proxy_protocol, "off by default");
        let trusted = "[proxy]\ntrusted = [\"10.0.0.0/8\"]\n";
        let config = load_str(&format!("proxy_protocol = true\n{trusted}"), &[]).expect("valid");
        assert!(config.proxy_protocol && !config.tls.proxy_protocol);
        assert_eq!(
            problems("proxy_protocol = true\n", &[]),
            ["proxy_protocol = true needs proxy.trusted: the balancers allowed to send the header"]
        );
        let tls = "public_origin = \"https://a.example\"\n[tls]\nlisten = \"127.0.0.1:8443\"\n\
                   cert_file = \"c.pem\"\nkey_file = \"k.pem\"\nproxy_protocol = true\n";
        let config = load_str(&format!("{tls}{trusted}"), &[]).expect("valid");
        assert!(config.tls.proxy_protocol && !config.proxy_protocol);
        assert_eq!(
            problems(tls, &[]),
            ["tls.proxy_protocol = true needs proxy.trusted: the balancers allowed to send the header"]
        );
        assert_eq!(
            problems(&format!("[tls]\nproxy_protocol = true\n{trusted}"), &[]),
            ["tls.proxy_protocol = true needs tls.listen"]
        );
    }

    #[test]
    fn file_overrides_defaults() {
        let config = load_str(
            r#"
            environment = "production"
            workers = 3
            log_format = "json"
            [limits]
            max_header_bytes = 8192
            [auth]
            jwt_secret_file = "/run/secrets/jwt"
            [cors]
            origins = ["https://App.example:8443"]
            [upstreams]
            users = "http://users.internal:9000/v1/"
            "#,
            &[],
        )
        .expect("valid");
        assert!(!config.is_development());
        assert_eq!((config.workers, config.log_format), (3, LogFormat::Json));
        assert_eq!(config.limits.max_header_bytes, 8192);
        assert_eq!(config.limits.json_body_bytes, 10240, "untouched keys keep their default");
        assert_eq!(config.auth.secret, JwtSecret::File("/run/secrets/jwt".into()));
        assert_eq!(config.cors.origins, ["https://app.example:8443"]);
        assert_eq!(config.upstreams.users.as_deref(), Some("http://users.internal:9000/v1"));
    }

    #[test]
    fn environment_overrides_file() {
        let config = load_str(
            "workers = 2\n[rate_limit]\nmax = 5\n",
            &[
                ("FORKD_CONFIG", "/nonexistent/forkd.toml"),
                ("FORKD_RATE_LIMIT__MAX", "1000"),
                ("FORKD_WEBSOCKET__ECHO", "true"),
                ("FORKD_LISTEN", "0.0.0.0:80"),
                ("FORKD_AUTH__JWT_SECRET", SECRET),
                ("FORKD_REDIRECT__ALLOWED_HOSTS", "a.example,B.example"),
                ("FORKD_CORS__ORIGINS", r#"["https://a.example"]"#),
                ("HOME", "/root"),
            ],
        )
        .expect("valid");
        assert_eq!(config.workers, 2);
        assert_eq!(config.rate_limit.max, 1000);
        assert!(config.websocket.echo);
        assert_eq!(config.listen, "0.0.0.0:80".parse().expect("literal"));
        assert_eq!(config.auth.secret, JwtSecret::Inline(SECRET.into()));
        assert_eq!(config.redirect.allowed_hosts, ["a.example", "b.example"]);
        assert_eq!(config.cors.origins, ["https://a.example"]);
        assert!(!format!("{config:?}").contains(SECRET), "Debug must not show the secret");
    }

    #[test]
    fn config_path_prefers_the_command_line() {
        let env = [("FORKD_CONFIG".to_string(), "/etc/forkd.toml".to_string())];
        let cli = Path::new("/tmp/cli.toml");
        assert_eq!(config_path(Some(cli), &env), Some(cli.to_path_buf()));
        assert_eq!(config_path(None, &env), Some(PathBuf::from("/etc/forkd.toml")));
        assert_eq!(config_path(None, &[("FORKD_CONFIG".into(), String::new())]), None);
        assert_eq!(config_path(None, &[]), None);
    }

    #[test]
    fn every_unknown_key_is_reported() {
        let found = problems(
            "lisen = \"x\"\nworkers = 1\n[limits]\nmax_heder_bytes = 1\n[nope]\na = 1\n",
            &[("FORKD_RATE_LIMIT__FOO", "1")],
        );
        assert_eq!(
            found,
            [
                "unknown key foo in section [rate_limit] (from FORKD_RATE_LIMIT__FOO)",
                "unknown key lisen; did you mean `listen`?",
                "unknown key max_heder_bytes in section [limits]; did you mean `max_header_bytes`?",
                "unknown section [nope]",
            ]
        );
    }

    #[test]
    fn unknown_sections_and_keys_get_a_suggestion_when_one_is_close() {
        let found = problems(
            "wrkers = 2\nmax_header_bytes = 1\n[limts]\nx = 1\n[typo]\n[limits]\nworkers = 3\nkeepalive = 1\n\
             [[cors]]\n[websocket.rooms]\n",
            &[],
        );
        assert_eq!(
            found,
            [
                "unknown key wrkers; did you mean `workers`?",
                "unknown key max_header_bytes (it belongs in section [limits])",
                "unknown section [limts]; did you mean `[limits]`?",
                "unknown section [typo]",
                "unknown key workers in section [limits] (it is a top-level key: put it before the first [section])",
                "unknown key keepalive in section [limits]",
                "cors = [{}]: must be a table",
                "unknown section [websocket.rooms]",
            ]
        );
    }

    #[test]
    fn unknown_variables_get_a_suggestion_when_one_is_close() {
        let found = problems(
            "",
            &[
                ("FORKD_RATE_LIMIT_MAX", "1"),
                ("FORKD_RATE_LIMT__MAX", "1"),
                ("FORKD_LIMITS__MAX_HEDER_BYTES", "1"),
                ("FORKD_LISEN", "x"),
                ("FORKD_MAX_HEADER_BYTES", "1"),
                ("FORKD_LIMITS__WORKERS", "1"),
                ("FORKD_NOTHING_LIKE_IT", "1"),
                ("FORKD_WORKERS__X", "1"),
            ],
        );
        assert_eq!(
            found,
            [
                "unknown key rate_limit_max (from FORKD_RATE_LIMIT_MAX); did you mean `FORKD_RATE_LIMIT__MAX`?",
                "unknown section [rate_limt] (from FORKD_RATE_LIMT__MAX); did you mean `FORKD_RATE_LIMIT__MAX`?",
                "unknown key max_heder_bytes in section [limits] (from FORKD_LIMITS__MAX_HEDER_BYTES); \
                 did you mean `FORKD_LIMITS__MAX_HEADER_BYTES`?",
                "unknown key lisen (from FORKD_LISEN); did you mean `FORKD_LISTEN`?",
                "unknown key max_header_bytes (from FORKD_MAX_HEADER_BYTES); \
                 did you mean `FORKD_LIMITS__MAX_HEADER_BYTES`?",
                "unknown key workers in section [limits] (from FORKD_LIMITS__WORKERS); did you mean `FORKD_WORKERS`?",
                "unknown key nothing_like_it (from FORKD_NOTHING_LIKE_IT)",
                "unknown section [workers] (from FORKD_WORKERS__X)",
            ]
        );
    }

    #[test]
    fn unknown_keys_with_control_characters_stay_on_one_line() {
        // Found while writing the fuzz seeds: a quoted key (or a variable's name) with a line
        // break split its problem over two lines.
        let found = problems("\"a\\nb\" = 1\n[limits]\n\"x\\r\" = 2\n", &[("FORKD_A\rB", "1")]);
        assert_eq!(
            found,
            [r"unknown key a\rb (from FORKD_A\rB)", r"unknown key a\nb", r"unknown key x\r in section [limits]"]
        );
    }

    #[test]
    fn toml_errors_quoting_keys_with_control_characters_stay_on_one_line() {
        // Found by the `config` fuzz target: toml quotes a duplicate key as it is.
        let found = problems("[limits]\n\"x\\r\" = 1\n\"x\\r\" = 1\n", &[]);
        assert_eq!(found, [r"test.toml:3:1: invalid TOML: duplicate key `x\r` in table `limits`"]);
    }

    #[test]
    fn every_bad_value_is_reported() {
        let found = problems(
            r#"
            environment = "staging"
            listen = "localhost:80"
            workers = -1
            public_origin = "https://a.example/"
            log_format = "xml"
            csp_report_only = "yes"
            [limits]
            max_header_bytes = 512
            [auth]
            jwt_secret = "short"
            issuer = ""
            [cors]
            origins = ["*", "https://ok.example", "https://a.example:99999"]
            [redirect]
            allowed_hosts = ["https://b.example", "c.example"]
            [upstreams]
            orders = "ftp://orders"
            [supervisor]
            worker_max_rss_mb = 0
            "#,
            &[("FORKD_SSE__HEARTBEAT_MS", "5"), ("FORKD_IO__THREADS", "many")],
        );
        let origin = "must be an origin: http or https, host and optional port, no path \
                      (https://a.example)";
        assert_eq!(
            found,
            [
                r#"FORKD_IO__THREADS="many": io.threads must be an integer"#.to_string(),
                r#"csp_report_only = "yes": must be true or false"#.into(),
                r#"environment = "staging": must be one of development, production"#.into(),
                r#"listen = "localhost:80": must be an address ip:port (127.0.0.1:8080)"#.into(),
                "workers = -1: must be between 0 and 1024".into(),
                "auth.jwt_secret = <5 bytes>: must be at least 32 bytes".into(),
                format!(r#"public_origin = "https://a.example/": {origin}"#),
                r#"log_format = "xml": must be one of text, json"#.into(),
                "limits.max_header_bytes = 512: must be between 1024 and 1048576".into(),
                r#"auth.issuer = "": must be non-empty"#.into(),
                format!(r#"cors.origins[0] = "*": {origin}"#),
                format!(r#"cors.origins[2] = "https://a.example:99999": {origin}"#),
                r#"redirect.allowed_hosts[0] = "https://b.example": must be a bare host name (a.example: no scheme, port or path)"#.into(),
                "sse.heartbeat_ms = 5: must be between 100 and 315360000000 (from FORKD_SSE__HEARTBEAT_MS)".into(),
                r#"upstreams.orders = "ftp://orders": must be empty or an http:// or https:// URL"#.into(),
                "supervisor.worker_max_rss_mb = 0: must be between 1 and 1048576".into(),
            ]
        );
    }

    #[test]
    fn secrets_are_exclusive() {
        let env = [("FORKD_AUTH__JWT_SECRET", SECRET), ("FORKD_AUTH__JWT_SECRET_FILE", "/s")];
        let found = problems("", &env);
        assert_eq!(found, ["auth.jwt_secret and auth.jwt_secret_file are both set: use only one"]);
    }

    #[test]
    fn production_rules() {
        let found = problems("environment = \"production\"\n[debug]\nroutes = true\n", &[]);
        assert_eq!(found, [SECRET_REQUIRED, "debug.routes = true is not allowed in production",]);
        let env = [("FORKD_ENVIRONMENT", "production"), ("FORKD_AUTH__JWT_SECRET", SECRET)];
        assert!(load_str("", &env).is_ok());
        let dev = load_str("[debug]\nroutes = true\n", &[]).expect("allowed in development");
        assert!(dev.debug.routes);
    }

    #[test]
    fn syntax_error_is_one_line_with_position() {
        let found = problems("workers = 1\n[limits]\nmax_header_bytes = = 3\n", &[]);
        assert_eq!(found.len(), 1);
        assert!(found[0].starts_with("test.toml:3:"), "{found:?}");
        assert!(!found[0].contains('\n'), "{found:?}");
        assert_eq!(ConfigErrors { problems: found.clone() }.to_string(), found[0]);
    }

    #[test]
    fn reads_the_file_or_says_why_not() {
        let path = std::env::temp_dir().join(format!("forkd-config-{}.toml", std::process::id()));
        std::fs::write(&path, "workers = 7\n").expect("write temp file");
        let loaded = load(Some(&path), &[]);
        let _ = std::fs::remove_file(&path);
        assert_eq!(loaded.map(|c| c.workers), Ok(7));
        let missing = load(Some(Path::new("/nonexistent/forkd.toml")), &[]).expect_err("missing");
        assert_eq!(missing.problems.len(), 1);
        assert!(missing.problems[0].starts_with("/nonexistent/forkd.toml: cannot read config file: "), "{missing}");
    }
}
