//! The key of one request and its response, whatever the protocol: everything above the
//! codecs (pool jobs, upstream calls, event streams, rooms, back pressure) is keyed by it.

/// The exchange a job belongs to: a connection (slab index and generation)
/// and, on HTTP/2, a stream. Completions, upstream calls and streams are keyed
/// by it, never by the connection alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExchangeId {
    /// The connection's slab index.
    pub conn: usize,
    /// The HTTP/2 stream id; 0 for the one exchange at a time of HTTP/1.1.
    pub stream: u32,
    /// The connection's generation when the exchange started.
    pub generation: u32,
}

impl ExchangeId {
    /// The exchange in progress on HTTP/1.1 connection `conn`.
    pub fn h1(conn: usize, generation: u32) -> ExchangeId {
        ExchangeId { conn, stream: 0, generation }
    }
}
