//! The worker's poll tokens, typed.
//!
//! Owns the one mapping between what a readiness event or a timer is for
//! (a listener, the pool's waker, the signal pipe, the bus, the UDP socket,
//! the HTTP/3 inbox, a client connection, an upstream connection) and the
//! `mio::Token` the poll carries. Nothing else does arithmetic on tokens. It must not touch a
//! socket or know what the connections are.

use mio::Token;

/// What a readiness event (or a timer entry) is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tok {
    /// The slot's plain listening socket.
    Listener,
    /// The slot's TLS listening socket.
    TlsListener,
    /// The pool's waker (completions are ready).
    Waker,
    /// The signal pipe.
    Signals,
    /// This worker's end of the bus.
    Bus,
    /// The slot's UDP socket (HTTP/3).
    Udp,
    /// The HTTP/3 inbox (hand-over messages between a slot's workers).
    Inbox,
    /// A client connection: its index in the connection slab.
    Client(usize),
    /// An upstream connection: its index in the upstream slab.
    Upstream(usize),
}

/// Tokens at or above this (and below the fixed ones) are upstream connections.
const UP_BASE: usize = 1 << 40;
const LISTENER: usize = usize::MAX - 1;
const WAKER: usize = usize::MAX - 2;
const SIGNALS: usize = usize::MAX - 3;
const BUS: usize = usize::MAX - 4;
const TLS_LISTENER: usize = usize::MAX - 5;
const UDP: usize = usize::MAX - 6;
const INBOX: usize = usize::MAX - 7;

impl From<Tok> for Token {
    fn from(t: Tok) -> Token {
        Token(match t {
            Tok::Listener => LISTENER,
            Tok::TlsListener => TLS_LISTENER,
            Tok::Waker => WAKER,
            Tok::Signals => SIGNALS,
            Tok::Bus => BUS,
            Tok::Udp => UDP,
            Tok::Inbox => INBOX,
            Tok::Client(i) => i,
            Tok::Upstream(i) => UP_BASE + i,
        })
    }
}

impl From<Token> for Tok {
    fn from(t: Token) -> Tok {
        match t.0 {
            LISTENER => Tok::Listener,
            TLS_LISTENER => Tok::TlsListener,
            WAKER => Tok::Waker,
            SIGNALS => Tok::Signals,
            BUS => Tok::Bus,
            UDP => Tok::Udp,
            INBOX => Tok::Inbox,
            i if i >= UP_BASE => Tok::Upstream(i - UP_BASE),
            i => Tok::Client(i),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_token_comes_back_as_itself() {
        let all = [
            Tok::Listener,
            Tok::TlsListener,
            Tok::Waker,
            Tok::Signals,
            Tok::Bus,
            Tok::Udp,
            Tok::Inbox,
            Tok::Client(0),
            Tok::Client(12_345),
            Tok::Upstream(0),
            Tok::Upstream(7),
        ];
        for t in all {
            assert_eq!(Tok::from(Token::from(t)), t, "{t:?}");
        }
        // Clients and upstreams never share a token.
        assert_ne!(Token::from(Tok::Client(3)), Token::from(Tok::Upstream(3)));
    }
}
