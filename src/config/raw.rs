//! The configuration file as written: [`RawConfig`] mirrors the TOML of CONTRACT §2 key for key,
//! with the contract's defaults, plus a `[debug]` section of our own. Every option is defined
//! here exactly once, with its doc and its default; the default, serialized, is also the
//! authority on which keys exist and what type each has (see `check_keys`), and the doc is also
//! the comment `forkd print-config` and `forkd.example.toml` show for the key (see [`Doc`]).
//! An unknown key or section is reported with the closest known name (`suggest.rs`).
//!
//! This file must not validate values or resolve types (that is `validate.rs`), and must not
//! read files or the environment.

use serde::{Deserialize, Serialize};
use toml::{Table, Value};

/// One key of the file as [`Documented::DOCS`] lists it, in declaration order: its name, its doc
/// comment (one string, a line break after each doc line), the keys of the section it opens
/// (empty for a plain key), and, for an optional key whose default `""` means "unset", an example
/// value (`print-config` then writes the key commented out with it).
#[derive(Debug)]
pub struct Doc {
    /// The key as written in the file.
    pub name: &'static str,
    /// The doc comment: each line followed by `\n`, each starting with the space after `///`.
    pub doc: &'static str,
    /// A section's own keys; empty for a plain key.
    pub fields: &'static [Doc],
    /// An example value for an optional key whose default `""` means "not set".
    pub example: Option<&'static str>,
}

/// The keys a value type has as a section: a section's `DOCS`, none for a plain value.
pub trait Documented {
    /// The keys, in declaration order.
    const DOCS: &'static [Doc] = &[];
}

impl Documented for String {}
impl Documented for i64 {}
impl Documented for bool {}
impl Documented for Vec<String> {}

/// `Some(example)` when one is given, else `None`.
macro_rules! example {
    () => {
        None
    };
    ($e:literal) => {
        Some($e)
    };
}

/// Defines one section: the struct with its documented fields, its `Default`, and its [`Doc`]
/// list. Integers are `i64` (TOML's own integer) so that a negative or huge value reaches
/// validation and is reported there with its key, rather than failing deserialization.
///
/// A key is `name: type = default,`. An optional setting (a path, a URL) has the default `""`
/// ("not set") and an example: `name: String = ""; example "/some/path",`; `print-config` and
/// `forkd.example.toml` show it commented out with that example until it is set.
macro_rules! section {
    (
        $(#[doc = $doc:literal])*
        $name:ident {
            $($(#[doc = $fdoc:literal])* $field:ident: $ty:ty = $default:expr $(; example $example:literal)?,)*
        }
    ) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct $name {
            $($(#[doc = $fdoc])* pub $field: $ty,)*
        }

        impl Default for $name {
            fn default() -> Self {
                Self { $($field: $default.into(),)* }
            }
        }

        impl Documented for $name {
            const DOCS: &'static [Doc] = &[$(Doc {
                name: stringify!($field),
                doc: concat!($($fdoc, "\n",)*),
                fields: <$ty as Documented>::DOCS,
                example: example!($($example)?),
            },)*];
        }
    };
}

section! {
    /// The whole file: the top-level keys, then one field per `[section]`.
    RawConfig {
        /// `"development"` or `"production"`; production refuses `[debug] routes` and requires
        /// a signing secret.
        environment: String = "development",
        /// Listening address `ip:port` (TCP, HTTP/1.1).
        listen: String = "127.0.0.1:8080",
        /// `true`: every connection on `listen` starts with a PROXY protocol header (v1 or v2,
        /// as HAProxy `send-proxy` and nginx stream `proxy_protocol on` write it) naming the
        /// client; needs `proxy.trusted`, and only peers in it may connect.
        proxy_protocol: bool = false,
        /// Worker processes; 0 = one per CPU.
        workers: i64 = 0,
        /// This service's own origin (CORS, CSRF origin check), e.g. `https://api.example.com`.
        public_origin: String = "http://127.0.0.1:8080",
        /// Directory of the SQLite database.
        data_dir: String = "./data",
        /// Graceful drain limit in milliseconds, then connections are force-closed.
        shutdown_timeout_ms: i64 = 30_000,
        /// Log line format: `"text"` or `"json"`.
        log_format: String = "text",
        /// `true`: the CSP goes out as `Content-Security-Policy-Report-Only`.
        csp_report_only: bool = false,
        /// The file the supervisor writes its pid to (atomically) at start and removes on a
        /// clean exit; empty = none. A binary upgrade's new supervisor rewrites it.
        pid_file: String = ""; example "/run/forkd/forkd.pid",
        /// Request size and time limits.
        limits: Limits = Limits::default(),
        /// The SQLite database.
        db: Db = Db::default(),
        /// The per-worker thread pool.
        io: Io = Io::default(),
        /// Tokens and password hashing.
        auth: Auth = Auth::default(),
        /// Per-address request limits shared by all workers.
        rate_limit: RateLimit = RateLimit::default(),
        /// Cross-origin allow-list.
        cors: Cors = Cors::default(),
        /// Hosts `/redirect?url=` may send clients to.
        redirect: Redirect = Redirect::default(),
        /// Server-sent events.
        sse: Sse = Sse::default(),
        /// The file download directory.
        download: Download = Download::default(),
        /// The services behind `/api/homepage` (base URLs; none set: built-in demo upstreams).
        upstreams: Upstreams = Upstreams::default(),
        /// The streaming chat endpoint behind `/api/chat`.
        chat: Chat = Chat::default(),
        /// WebSocket options.
        websocket: WebSocket = WebSocket::default(),
        /// Worker health checks.
        supervisor: Supervisor = Supervisor::default(),
        /// HTTPS: a second listener speaking HTTP/1.1 (and HTTP/2 by ALPN) over TLS.
        tls: Tls = Tls::default(),
        /// HTTP/2: over TLS (ALPN `h2`) and by prior knowledge (h2c) on the plain listener.
        http2: Http2 = Http2::default(),
        /// HTTP/3 over QUIC (UDP) beside the TLS listener, with its certificate.
        http3: Http3 = Http3::default(),
        /// Response compression (zstd, br, gzip), negotiated by `Accept-Encoding`.
        compression: Compression = Compression::default(),
        /// The proxies and load balancers in front of forkd whose word on the client is believed.
        proxy: Proxy = Proxy::default(),
        /// Several hosts as one service; empty = this host alone (SQLite and shared memory).
        cluster: Cluster = Cluster::default(),
        /// Test-only switches; refused in production.
        debug: Debug = Debug::default(),
    }
}

section! {
    /// `[limits]`
    Limits {
        /// Largest JSON request body in bytes (larger → 413).
        json_body_bytes: i64 = 10_240,
        /// Largest request head in bytes (larger → 431).
        max_header_bytes: i64 = 16_384,
        /// The whole head must arrive within this many ms of its first byte, else 408 and close.
        header_timeout_ms: i64 = 10_000,
        /// The whole body must arrive within this many ms of the end of the head, else 408 and close.
        body_timeout_ms: i64 = 30_000,
        /// Idle keep-alive connections are closed after this many ms.
        keepalive_timeout_ms: i64 = 5_000,
        /// Open connections per worker.
        max_connections: i64 = 10_000,
    }
}

section! {
    /// `[db]`
    Db {
        /// Database file name, under `data_dir`.
        file: String = "forkd.db",
        /// Connections per worker.
        pool_size: i64 = 10,
    }
}

section! {
    /// `[io]`
    Io {
        /// Per-worker thread pool size for CPU-heavy or blocking work.
        threads: i64 = 4,
    }
}

section! {
    /// `[auth]`
    Auth {
        /// HS256 signing secret, at least 32 bytes; or set `jwt_secret_file`. Production refuses
        /// to start without one; development generates one.
        jwt_secret: String = ""; example "<44 characters from forkd gen-secret>",
        /// File holding the signing secret (alternative to `jwt_secret`).
        jwt_secret_file: String = ""; example "/etc/forkd/jwt_secret",
        /// Token issuer (`iss`).
        issuer: String = "forkd",
        /// Token audience (`aud`).
        audience: String = "forkd-api",
        /// Access token lifetime in seconds.
        access_ttl_secs: i64 = 900,
        /// Refresh token lifetime in seconds.
        refresh_ttl_secs: i64 = 604_800,
        /// argon2id memory cost in KiB.
        argon2_memory_kib: i64 = 19_456,
        /// argon2id iterations.
        argon2_iterations: i64 = 2,
        /// Mark cookies `Secure`.
        cookie_secure: bool = true,
    }
}

section! {
    /// `[rate_limit]`
    RateLimit {
        /// Rate limiting on or off.
        enabled: bool = true,
        /// Requests per client address per window, across all workers.
        max: i64 = 100,
        /// Window length in seconds.
        window_secs: i64 = 900,
        /// Failed logins per (address, e-mail) per window before 429.
        login_max_failures: i64 = 5,
    }
}

section! {
    /// `[cors]`
    Cors {
        /// Allowed origins, exact (`https://app.example.com`).
        origins: Vec<String> = Vec::new(),
    }
}

section! {
    /// `[redirect]`
    Redirect {
        /// Host names `/redirect?url=` may point to.
        allowed_hosts: Vec<String> = Vec::new(),
    }
}

section! {
    /// `[sse]`
    Sse {
        /// Heartbeat interval in ms.
        heartbeat_ms: i64 = 30_000,
        /// Reconnect delay sent to clients as `retry:`, in ms.
        retry_ms: i64 = 3_000,
        /// Most notifications replayed after `Last-Event-ID`.
        replay_limit: i64 = 1_000,
    }
}

section! {
    /// `[download]`
    Download {
        /// Directory served by `/download/{name}`.
        dir: String = "./data/files",
    }
}

section! {
    /// `[upstreams]`: base URLs; empty = the built-in demo upstream.
    Upstreams {
        /// Users service base URL; not set: the built-in demo.
        users: String = ""; example "http://users.internal:9000",
        /// Orders service base URL; not set: the built-in demo.
        orders: String = ""; example "http://orders.internal:9000",
        /// Recommendations service base URL; not set: the built-in demo.
        recommendations: String = ""; example "http://recommendations.internal:9000",
        /// Per-call timeout in ms.
        timeout_ms: i64 = 3_000,
        /// Cache lifetime of upstream answers in seconds.
        cache_ttl_secs: i64 = 300,
        /// Entries in each worker's upstream cache.
        cache_entries: i64 = 1_000,
    }
}

section! {
    /// `[chat]`
    Chat {
        /// OpenAI-compatible streaming chat endpoint URL; not set: the built-in echo.
        upstream: String = ""; example "http://127.0.0.1:11434/v1/chat/completions",
        /// Model name sent upstream.
        model: String = ""; example "llama3.2",
        /// Delay between echoed chunks in ms.
        echo_delay_ms: i64 = 20,
    }
}

section! {
    /// `[websocket]`
    WebSocket {
        /// Enable `/ws/echo` (conformance testing).
        echo: bool = false,
        /// Largest message in bytes (larger → close 1009).
        max_message_bytes: i64 = 65_536,
        /// Rooms one connection may be in (a join beyond → an error message).
        max_rooms_per_connection: i64 = 64,
    }
}

section! {
    /// `[supervisor]`
    Supervisor {
        /// A worker over this resident memory (MiB) is replaced.
        worker_max_rss_mb: i64 = 500,
        /// How often worker memory is read, in ms.
        memory_check_ms: i64 = 5_000,
        /// A worker whose event loop is stuck this long (ms) is killed.
        worker_timeout_ms: i64 = 30_000,
    }
}

section! {
    /// `[tls]`: HTTPS on a second listener; empty `listen` = no TLS listener.
    Tls {
        /// Listening address `ip:port` for HTTPS (TLS 1.3 and 1.2, ALPN `h2` and `http/1.1`);
        /// not set: no TLS listener. With it, `public_origin` must be the https origin.
        listen: String = ""; example "0.0.0.0:443",
        /// PEM certificate chain, leaf first; read at start and again on HUP.
        cert_file: String = ""; example "/etc/forkd/tls/cert.pem",
        /// PEM private key of that certificate (PKCS#8, SEC1 or PKCS#1); read at start and
        /// again on HUP.
        key_file: String = ""; example "/etc/forkd/tls/key.pem",
        /// `true`: the plain listener answers every request but `/health`, `/metrics` and
        /// `/.well-known/acme-challenge/` with a 308 to the same path on https.
        redirect_http: bool = false,
        /// `true`: every connection on `tls.listen` starts with a PROXY protocol header (before
        /// its ClientHello); needs `proxy.trusted`, and only peers in it may connect.
        proxy_protocol: bool = false,
        /// Automatic certificates (ACME, RFC 8555): with `directory` set, forkd obtains and
        /// renews the certificate itself and `cert_file`/`key_file` stay unset.
        acme: Acme = Acme::default(),
    }
}

section! {
    /// `[tls.acme]`: the certificate of the TLS listener from an ACME CA (Let's Encrypt).
    Acme {
        /// The CA's directory URL (https); not set: no automatic certificate.
        directory: String = ""; example "https://acme-v02.api.letsencrypt.org/directory",
        /// Contact address of the ACME account (`mailto:`); may stay empty.
        email: String = "",
        /// The DNS names the certificate is for (at least one; no wildcards).
        domains: Vec<String> = Vec::new(),
        /// PEM file of the roots the CA's HTTPS certificate must chain to (a private or test
        /// CA); not set: the system's roots.
        ca_file: String = ""; example "/etc/forkd/acme-ca.pem",
        /// How the CA checks control of each name: `"tls-alpn-01"` (on `tls.listen`, port 443)
        /// or `"http-01"` (on `listen`, port 80).
        challenge: String = "tls-alpn-01",
    }
}

section! {
    /// `[http2]`: HTTP/2 and the settings the server announces in its SETTINGS frame.
    Http2 {
        /// `true`: HTTP/2 over TLS (ALPN `h2`) and with prior knowledge (h2c) on `listen`;
        /// `false`: ALPN offers only `http/1.1` and every connection speaks HTTP/1.1.
        enabled: bool = true,
        /// SETTINGS_MAX_CONCURRENT_STREAMS: streams a client may have open at once (1 to
        /// 1000); more are refused with REFUSED_STREAM.
        max_concurrent_streams: i64 = 128,
        /// SETTINGS_INITIAL_WINDOW_SIZE: each stream's receive window in bytes (0 to
        /// 2147483647).
        initial_window_size: i64 = 65_535,
        /// SETTINGS_MAX_FRAME_SIZE: the largest frame payload the server accepts, in bytes
        /// (16384 to 16777215).
        max_frame_size: i64 = 16_384,
    }
}

section! {
    /// `[http3]`: HTTP/3 over QUIC on UDP, with the certificate of `[tls]`.
    Http3 {
        /// `true`: HTTP/3 on UDP `listen` (needs `tls.listen` and its certificate).
        enabled: bool = false,
        /// UDP address `ip:port`; not set: the address and port of `tls.listen`.
        listen: String = ""; example "0.0.0.0:443",
        /// `ma=` of the `Alt-Svc: h3` header on responses over TCP, in seconds.
        alt_svc_max_age: i64 = 86_400,
        /// `true`: resumed clients may send 0-RTT early data; only GET, HEAD and OPTIONS are
        /// served from it, anything else is answered 425 Too Early.
        early_data: bool = true,
    }
}

section! {
    /// `[compression]`: large JSON, HTML, CSS and JavaScript bodies sent compressed (zstd, br
    /// or gzip) to clients that accept it (`Vary: Accept-Encoding`). Token responses (the auth
    /// routes, any `Set-Cookie`), event streams, downloads and WebSocket are never compressed.
    Compression {
        /// `false`: every response is sent as it is (identity).
        enabled: bool = true,
        /// Bodies shorter than this many bytes are sent as they are (0 to 67108864).
        min_bytes: i64 = 1024,
        /// Effort for bodies compressed per response, on the pool (1 fastest to 9 smallest):
        /// gzip's and zstd's level, brotli's quality less one (at most 4: higher costs far more
        /// time for little). Bodies fixed for the configuration's life are compressed once at
        /// the best (gzip 9, brotli 11, zstd 19).
        level: i64 = 6,
    }
}

section! {
    /// `[proxy]`: the real client behind an HTTP proxy or load balancer.
    Proxy {
        /// Networks (`10.0.0.0/8`, `::1/128`, or one address) of the proxies in front of forkd.
        /// Only from a peer in them, the client is read from `Forwarded` or `X-Forwarded-For`
        /// (the rightmost address not in them) and the scheme from `X-Forwarded-Proto`; from
        /// any other peer those headers are ignored. Empty: every peer is the client.
        trusted: Vec<String> = Vec::new(),
    }
}

section! {
    /// `[cluster]`: several hosts with the same settings behind a load balancer act as one
    /// service; empty = this host alone.
    Cluster {
        /// PostgreSQL URL (`postgres://user:password@host:5432/db`): the store lives there
        /// instead of the SQLite file, shared by every host; not set: SQLite under `data_dir`.
        /// `?sslmode=require` (or `verify-full`): TLS, the server's certificate checked against
        /// the system's roots or `&sslrootcert=/path/ca.pem`. Its password is never printed.
        database_url: String = ""; example "postgres://forkd@db.internal:5432/forkd",
        /// Redis URL (`redis://[user:password@]host:6379/0`): rate limits, login failures,
        /// notifications and WebSocket rooms are shared with every host that names the same
        /// Redis (hosts must also share `auth.jwt_secret`). `rediss://` for TLS (the certificate
        /// checked against the system's roots or `?ssl_ca_certs=/path/ca.pem`). Restart to change.
        redis_url: String = ""; example "redis://cache.internal:6379/0",
    }
}

section! {
    /// `[debug]`: test-only switches (not in the contract).
    Debug {
        /// Enable the test-only routes `/_debug/*`; refused in production.
        routes: bool = false,
    }
}

/// The defaults as a TOML table: the set of keys that exist, and the type of each.
pub(super) fn default_table() -> Table {
    match Value::try_from(RawConfig::default()) {
        Ok(Value::Table(table)) => table,
        _ => Table::new(), // unreachable: plain structs of scalars always serialize
    }
}

/// Reports every key of `table` that `defaults` lacks (`unknown key lisen; did you mean
/// \`listen\`?`, `unknown key x in section [limits]`, `unknown section [limts]`) or whose value has
/// the wrong type, and removes it, so the rest can still be deserialized and validated and every
/// problem is reported in one run.
pub(super) fn check_keys(table: &mut Table, defaults: &Table, errors: &mut Vec<String>) {
    check_table(table, defaults, defaults, "", errors);
}

/// [`check_keys`] for the table at dotted `section` (`""`: the top level); `root` is the whole
/// default table, for "it belongs in section [x]".
fn check_table(table: &mut Table, defaults: &Table, root: &Table, section: &str, errors: &mut Vec<String>) {
    table.retain(|key, value| {
        let path = if section.is_empty() { key.to_string() } else { format!("{section}.{key}") };
        let Some(default) = defaults.get(key) else {
            errors.push(unknown(key, value, defaults, root, section));
            return false;
        };
        if let (Value::Table(defaults), Value::Table(table)) = (default, &mut *value) {
            check_table(table, defaults, root, &path, errors);
            return true;
        }
        let ok = match (default, &*value) {
            (Value::Float(_), Value::Integer(_)) => true,
            (Value::Array(_), Value::Array(items)) => items.iter().all(Value::is_str),
            (default, value) => default.same_type(value),
        };
        if !ok {
            errors.push(format!("{path} = {}: must be {}", show(value), expected(default)));
        }
        ok
    });
}

/// The problem line for `key`, unknown in the table `defaults` at dotted `section`: a section
/// when its value is a table, with the closest known name of its kind when there is one.
fn unknown(key: &str, value: &Value, defaults: &Table, root: &Table, section: &str) -> String {
    let shown = key.escape_debug(); // a quoted key may hold a line break
    let is_section = |v: &Value| match v {
        Value::Table(_) => true,
        Value::Array(items) => !items.is_empty() && items.iter().all(Value::is_table),
        _ => false,
    };
    let named = |want: bool| defaults.iter().filter(move |(_, v)| is_section(v) == want).map(|(k, _)| k.as_str());
    if is_section(value) {
        let path = if section.is_empty() { shown.to_string() } else { format!("{section}.{shown}") };
        let mut line = format!("unknown section [{path}]");
        if let Some(close) = super::suggest::closest(key, named(true)) {
            let close = if section.is_empty() { close.to_string() } else { format!("{section}.{close}") };
            line.push_str(&format!("; did you mean `[{close}]`?"));
        }
        return line;
    }
    let mut line = match section {
        "" => format!("unknown key {shown}"),
        _ => format!("unknown key {shown} in section [{section}]"),
    };
    if let Some(close) = super::suggest::closest(key, named(false)) {
        line.push_str(&format!("; did you mean `{close}`?"));
    } else if let Some(home) = home_of(key, root) {
        line.push_str(&match home {
            "" => " (it is a top-level key: put it before the first [section])".to_string(),
            home => format!(" (it belongs in section [{home}])"),
        });
    }
    line
}

/// The section that has a plain key named `key` (`""`: the top level), if one does.
fn home_of<'a>(key: &str, root: &'a Table) -> Option<&'a str> {
    if root.get(key).is_some_and(|v| !v.is_table()) {
        return Some("");
    }
    root.iter()
        .find(|(_, v)| v.as_table().is_some_and(|t| t.get(key).is_some_and(|v| !v.is_table())))
        .map(|(k, _)| k.as_str())
}

/// What a key whose default is `default` accepts, for messages. Arrays are arrays of strings.
pub(super) fn expected(default: &Value) -> &'static str {
    match default {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a number",
        Value::Boolean(_) => "true or false",
        Value::Array(_) => "an array of strings",
        Value::Datetime(_) => "a date-time",
        Value::Table(_) => "a table",
    }
}

/// A value as it would be written in TOML, on one line, for messages.
pub(super) fn show(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Table(_) => "a table".to_string(),
        other => other.to_string().replace('\n', " "),
    }
}
