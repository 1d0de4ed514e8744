//! The key of one request and its response, whatever the protocol: everything above the
//! codecs (pool jobs, upstream calls, event streams, rooms, back pressure) is keyed by it.
//! The protocol is the variant: code that must reach the exchange's connection matches on it.

/// The exchange a job belongs to: a connection (slab index and generation) and, on HTTP/2 and
/// HTTP/3, a stream. Completions, upstream calls and streams are keyed by it, never by the
/// connection alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExchangeId {
    /// The one exchange at a time of an HTTP/1.1 connection.
    H1 {
        /// The connection's slab index.
        conn: usize,
        /// The connection's generation when the exchange started.
        gen: u32,
    },
    /// One stream of an HTTP/2 connection.
    H2 {
        /// The connection's slab index.
        conn: usize,
        /// The HTTP/2 stream id.
        stream: u32,
        /// The connection's generation when the exchange started.
        gen: u32,
    },
    /// One request stream of an HTTP/3 session.
    H3 {
        /// The session's index (its QUIC connection handle).
        conn: usize,
        /// The QUIC stream id.
        stream: u64,
        /// The session's generation when the exchange started.
        gen: u32,
    },
}
