//! HTTP/3 error codes (RFC 9114 §8.1, RFC 9204 §6) and the one error type of this layer.
//!
//! Every failure found in a peer's bytes becomes an [`H3Error`] that says whether it ends the
//! stream or the whole connection and with which code; the mapping from "what went wrong" to
//! the wire lives here and nowhere else. This file must not touch quinn or any connection.

use std::fmt;

/// An HTTP/3 (or QPACK) application error code, as sent in `RESET_STREAM`, `STOP_SENDING` and
/// `CONNECTION_CLOSE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum Code {
    /// No error: graceful close.
    NoError = 0x100,
    /// A protocol error with no more specific code.
    GeneralProtocolError = 0x101,
    /// An internal error.
    InternalError = 0x102,
    /// A stream the peer may not create (a push stream, a second control stream).
    StreamCreationError = 0x103,
    /// A critical stream (control, QPACK) was closed.
    ClosedCriticalStream = 0x104,
    /// A frame not allowed where it arrived.
    FrameUnexpected = 0x105,
    /// A malformed frame.
    FrameError = 0x106,
    /// The peer generates excessive load (a field section far beyond the limit).
    ExcessiveLoad = 0x107,
    /// A stream or push ID used wrongly.
    IdError = 0x108,
    /// Malformed or forbidden SETTINGS.
    SettingsError = 0x109,
    /// The control stream did not start with SETTINGS.
    MissingSettings = 0x10a,
    /// The request was not processed (sent on streams past a GOAWAY).
    RequestRejected = 0x10b,
    /// The request or response was cancelled.
    RequestCancelled = 0x10c,
    /// The stream ended before the request was complete.
    RequestIncomplete = 0x10d,
    /// A malformed message (bad pseudo-headers, forbidden fields, bad content-length).
    MessageError = 0x10e,
    /// CONNECT failed.
    ConnectError = 0x10f,
    /// Retry over HTTP/1.1.
    VersionFallback = 0x110,
    /// A field section that cannot be decoded (RFC 9204 §6).
    QpackDecompressionFailed = 0x200,
    /// A bad instruction on the peer's QPACK encoder stream.
    QpackEncoderStreamError = 0x201,
    /// A bad instruction on the peer's QPACK decoder stream.
    QpackDecoderStreamError = 0x202,
}

impl Code {
    /// The code's value on the wire.
    pub fn value(self) -> u64 {
        self as u64
    }
}

/// A failure caused by the peer: it ends one stream or the whole connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum H3Error {
    /// Close the connection with `code` (and `GOAWAY` first when the close is graceful).
    Connection {
        /// The code sent in `CONNECTION_CLOSE`.
        code: Code,
        /// What went wrong, for the log (never peer bytes).
        why: &'static str,
    },
    /// Reset this stream with `code` (and stop reading it); the connection lives on.
    Stream {
        /// The code sent in `RESET_STREAM` / `STOP_SENDING`.
        code: Code,
        /// What went wrong, for the log.
        why: &'static str,
    },
}

impl H3Error {
    /// A connection error.
    pub const fn conn(code: Code, why: &'static str) -> H3Error {
        H3Error::Connection { code, why }
    }

    /// A stream error.
    pub const fn stream(code: Code, why: &'static str) -> H3Error {
        H3Error::Stream { code, why }
    }

    /// The code sent to the peer.
    pub fn code(&self) -> Code {
        match *self {
            H3Error::Connection { code, .. } | H3Error::Stream { code, .. } => code,
        }
    }

    /// Whether the whole connection ends.
    pub fn is_connection(&self) -> bool {
        matches!(self, H3Error::Connection { .. })
    }
}

impl fmt::Display for H3Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            H3Error::Connection { code, why } => {
                write!(f, "HTTP/3 connection error {code:?} (0x{:x}): {why}", code.value())
            }
            H3Error::Stream { code, why } => write!(f, "HTTP/3 stream error {code:?} (0x{:x}): {why}", code.value()),
        }
    }
}

impl std::error::Error for H3Error {}
