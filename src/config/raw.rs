//! The configuration file as written: [`RawConfig`] mirrors the TOML of CONTRACT §2 key for key,
//! with the contract's defaults, plus a `[debug]` section of our own. Every option is defined
//! here exactly once, with its doc and its default; the default, serialized, is also the
//! authority on which keys exist and what type each has (see `check_keys`).
//!
//! This file must not validate values or resolve types (that is `validate.rs`), and must not
//! read files or the environment.

use serde::{Deserialize, Serialize};
use toml::{Table, Value};

/// Defines one section: the struct with its documented fields and its `Default`.
/// Integers are `i64` (TOML's own integer) so that a negative or huge value reaches
/// validation and is reported there with its key, rather than failing deserialization.
macro_rules! section {
    ($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident: $ty:ty = $default:expr,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct $name {
            $($(#[$fdoc])* pub $field: $ty,)*
        }

        impl Default for $name {
            fn default() -> Self {
                Self { $($field: $default.into(),)* }
            }
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
        pid_file: String = "",
        /// `[limits]`: request size and time limits.
        limits: Limits = Limits::default(),
        /// `[db]`: the SQLite database.
        db: Db = Db::default(),
        /// `[io]`: the per-worker thread pool.
        io: Io = Io::default(),
        /// `[auth]`: tokens and password hashing.
        auth: Auth = Auth::default(),
        /// `[rate_limit]`: per-address request limits shared by all workers.
        rate_limit: RateLimit = RateLimit::default(),
        /// `[cors]`: cross-origin allow-list.
        cors: Cors = Cors::default(),
        /// `[redirect]`: hosts `/redirect?url=` may send clients to.
        redirect: Redirect = Redirect::default(),
        /// `[sse]`: server-sent events.
        sse: Sse = Sse::default(),
        /// `[download]`: the file download directory.
        download: Download = Download::default(),
        /// `[upstreams]`: the services behind `/api/homepage`.
        upstreams: Upstreams = Upstreams::default(),
        /// `[chat]`: the streaming chat endpoint behind `/api/chat`.
        chat: Chat = Chat::default(),
        /// `[websocket]`: WebSocket options.
        websocket: WebSocket = WebSocket::default(),
        /// `[supervisor]`: worker health checks.
        supervisor: Supervisor = Supervisor::default(),
        /// `[debug]`: test-only switches (not in the contract); refused in production.
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
        jwt_secret: String = "",
        /// File holding the signing secret (alternative to `jwt_secret`).
        jwt_secret_file: String = "",
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
        /// Users service base URL.
        users: String = "",
        /// Orders service base URL.
        orders: String = "",
        /// Recommendations service base URL.
        recommendations: String = "",
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
        /// OpenAI-compatible streaming chat endpoint URL; empty = the built-in echo.
        upstream: String = "",
        /// Model name sent upstream.
        model: String = "",
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
    /// `[debug]` (not in the contract)
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

/// Reports every key of `table` that `defaults` lacks (`unknown key a.b`) or whose value has
/// the wrong type, by its dotted path, and removes it, so the rest can still be
/// deserialized and validated and every problem is reported in one run.
pub(super) fn check_keys(table: &mut Table, defaults: &Table, prefix: &str, errors: &mut Vec<String>) {
    table.retain(|key, value| {
        let path = if prefix.is_empty() { key.to_string() } else { format!("{prefix}.{key}") };
        let Some(default) = defaults.get(key) else {
            errors.push(format!("unknown key {}", path.escape_debug())); // a quoted key may hold a newline
            return false;
        };
        if let (Value::Table(defaults), Value::Table(table)) = (default, &mut *value) {
            check_keys(table, defaults, &path, errors);
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
