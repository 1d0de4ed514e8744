//! quinn-proto's configuration for a worker: the endpoint (connection IDs of its slot, the
//! shared stateless-reset key), the server (the `[tls]` certificate over TLS 1.3 with ALPN
//! `h3`, the shared Retry-token key, transport limits), built once per worker after fork.
//!
//! 0-RTT: rustls accepts early data only on stateful resumption (a session store, not
//! tickets; RFC 8446 §8 anti-replay through single-use sessions), so with `early_data` on the
//! caller passes the session store and tickets are off; with it off, sessions resume from
//! tickets sealed under the shared key ([`QuicKeys::ticket_secret`]) on any worker. The store
//! is [`early_data_store`]: the shared-memory one the supervisor made before fork
//! (`crate::shm::sessions`, single-use `take` across workers), so a session resumes with 0-RTT
//! on whichever worker the client's packets reach. This module must not touch sockets.

use std::sync::Arc;
use std::time::Duration;

use quinn_proto::crypto::rustls::QuicServerConfig;
use quinn_proto::{EndpointConfig, IdleTimeout, ServerConfig, TransportConfig, VarInt};
use rustls::server::StoresServerSessions;
use rustls::sign::CertifiedKey;

use super::keys::QuicKeys;
use crate::tls::{SharedTicketer, TlsError};

/// The ALPN token of HTTP/3.
pub const ALPN: &[u8] = b"h3";

/// Transport and HTTP/3 limits of a server.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Concurrent request streams a client may open (like HTTP/2's `MAX_CONCURRENT_STREAMS`).
    pub max_streams: u32,
    /// Largest field section accepted (`SETTINGS_MAX_FIELD_SECTION_SIZE`, `limits.max_header_bytes`).
    pub max_field_section: usize,
    /// A connection with no packet for this long is gone (QUIC idle timeout).
    pub idle_timeout: Duration,
    /// Receive window of one stream (request bodies).
    pub stream_window: u32,
    /// Receive window of the connection.
    pub conn_window: u32,
    /// Bytes of sent-but-unacknowledged data one connection may hold (bounds its memory).
    pub send_window: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_streams: 128,
            max_field_section: 16_384,
            idle_timeout: Duration::from_secs(30),
            stream_window: 256 * 1024,
            conn_window: 1024 * 1024,
            send_window: 2 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// The limits `config` sets: the field-section limit is `limits.max_header_bytes`; the rest
    /// are the defaults above.
    pub fn from_config(config: &crate::config::Config) -> Limits {
        Limits { max_field_section: config.limits.max_header_bytes, ..Limits::default() }
    }
}

/// The endpoint configuration of worker slot `slot`: its connection IDs, the shared reset key.
pub fn endpoint_config(keys: &QuicKeys, slot: u16) -> Arc<EndpointConfig> {
    worker_endpoint_config(keys, slot, 0)
}

/// [`endpoint_config`] for the worker of slot `slot` whose CIDs carry `generation`.
pub fn worker_endpoint_config(keys: &QuicKeys, slot: u16, generation: u8) -> Arc<EndpointConfig> {
    let mut config = EndpointConfig::new(keys.reset_key());
    let cids = keys.worker_cids(slot, generation);
    config.cid_generator(move || Box::new(cids.clone()));
    Arc::new(config)
}

/// The session store to pass to [`server_config`] as `early`: `None` when `early_data` is
/// off; else the store shared by every worker (made by the supervisor before fork), or, in
/// a process without one, a per-process cache (0-RTT then only on the worker that issued
/// the session).
pub fn early_data_store(early_data: bool) -> Option<Arc<dyn StoresServerSessions>> {
    if !early_data {
        return None;
    }
    Some(match crate::shm::sessions::shared() {
        Some(shared) => Arc::new(crate::shm::sessions::SessionStore(shared)),
        None => rustls::server::ServerSessionMemoryCache::new(256),
    })
}

/// The server configuration: `key` (the `[tls]` pair), TLS 1.3 only, ALPN `h3`, the shared
/// Retry-token key, `limits`. `early` is the session store that enables 0-RTT (see the
/// module doc); `None`: no 0-RTT, shared tickets.
pub fn server_config(
    key: Arc<CertifiedKey>,
    keys: &QuicKeys,
    limits: &Limits,
    early: Option<Arc<dyn StoresServerSessions>>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(crate::tls::provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(key)));
    tls.alpn_protocols = vec![ALPN.to_vec()];
    match early {
        Some(store) => {
            tls.session_storage = store;
            tls.max_early_data_size = u32::MAX; // QUIC allows only 0 or this (RFC 9001 §4.6.1)
        }
        None => {
            tls.ticketer = Arc::new(SharedTicketer::new(keys.ticket_secret()));
            tls.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
            tls.max_early_data_size = 0;
        }
    }
    let crypto = QuicServerConfig::try_from(tls).map_err(|e| TlsError::Config(e.to_string()))?;
    let mut config = ServerConfig::with_crypto(Arc::new(crypto));
    config.token_key(keys.token_key());
    config.retry_token_lifetime(Duration::from_secs(15));
    config.migration(true);
    config.transport_config(Arc::new(transport(limits)));
    Ok(Arc::new(config))
}

/// The transport parameters and windows.
pub fn transport(limits: &Limits) -> TransportConfig {
    let mut t = TransportConfig::default();
    t.max_concurrent_bidi_streams(VarInt::from_u32(limits.max_streams));
    // The client's control and QPACK streams, and a few reserved (grease) ones.
    t.max_concurrent_uni_streams(VarInt::from_u32(8));
    t.max_idle_timeout(IdleTimeout::try_from(limits.idle_timeout).ok());
    t.stream_receive_window(VarInt::from_u32(limits.stream_window));
    t.receive_window(VarInt::from_u32(limits.conn_window));
    t.send_window(limits.send_window);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn early_data_uses_the_store_made_before_fork() {
        assert!(early_data_store(false).is_none());
        crate::shm::sessions::install(crate::shm::sessions::SharedSessions::create(8, 1).expect("map"));
        let store = early_data_store(true).expect("a store");
        assert!(format!("{store:?}").starts_with("SessionStore(SharedSessions("), "{store:?}");
        assert!(early_data_store(false).is_none());
    }

    #[test]
    fn limits_follow_the_configuration() {
        let mut config = crate::config::Config::default();
        config.limits.max_header_bytes = 8192;
        let limits = Limits::from_config(&config);
        assert_eq!((limits.max_field_section, limits.max_streams), (8192, 128));
        let t = transport(&limits);
        assert!(format!("{t:?}").contains("max_concurrent_bidi_streams: 128"), "{t:?}");
    }
}
