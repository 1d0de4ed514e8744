//! HTTP/3 (RFC 9114) over QUIC (RFC 9000): placeholder doc, replaced below.

pub mod conn;
pub mod error;
pub mod frame;
pub mod head;
pub mod keys;
pub mod qpack;
pub mod server;
pub mod setup;
pub mod varint;

pub use error::{Code, H3Error};

#[cfg(test)]
mod tests;
