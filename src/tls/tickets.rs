//! Session tickets every worker can open: the ticket keys derive from one secret the
//! supervisor makes before it forks (and hands to its successor on a binary upgrade), so a
//! ticket issued by one worker resumes on any other. rustls' own `Ticketer` makes random keys
//! per process: with two workers a client resumed only when it landed on the same one.
//!
//! Keys rotate: time is cut into periods of [`PERIOD`]; period `n`'s key is
//! HKDF-SHA256(secret, "forkd tls ticket key" ‖ n). A ticket is sealed with the current
//! period's key and opens during that period and the next one, so a ticket lives between one
//! and two periods and a key stolen from memory opens no ticket older than that.
//!
//! Ticket layout: period (8 bytes, big-endian) ‖ nonce (12 random bytes) ‖ ChaCha20-Poly1305
//! ciphertext and tag, the period bytes authenticated as associated data.

use std::time::{SystemTime, UNIX_EPOCH};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};

/// Length of the shared secret.
pub const SECRET_LEN: usize = 32;
/// How long one ticket key issues tickets, in seconds.
pub const PERIOD: u64 = 6 * 3600;
/// Bytes a ticket adds to the session it carries.
const OVERHEAD: usize = 8 + NONCE_LEN + 16;

/// The [`rustls::server::ProducesTickets`] of every worker: keys derived from a shared secret.
pub struct SharedTicketer {
    prk: hkdf::Prk,
    rng: SystemRandom,
}

impl std::fmt::Debug for SharedTicketer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedTicketer(<secret>)")
    }
}

/// The key length HKDF expands to (ChaCha20's 32 bytes).
struct KeyLen;

impl hkdf::KeyType for KeyLen {
    fn len(&self) -> usize {
        CHACHA20_POLY1305.key_len()
    }
}

impl SharedTicketer {
    /// Ticket keys derived from `secret`.
    pub fn new(secret: [u8; SECRET_LEN]) -> SharedTicketer {
        SharedTicketer {
            prk: hkdf::Salt::new(hkdf::HKDF_SHA256, b"forkd tls tickets").extract(&secret),
            rng: SystemRandom::new(),
        }
    }

    /// Period `period`'s key.
    fn key(&self, period: u64) -> Option<LessSafeKey> {
        let number = period.to_be_bytes();
        let info = [b"forkd tls ticket key".as_slice(), &number];
        let okm = self.prk.expand(&info, KeyLen).ok()?;
        let mut bytes = [0u8; 32];
        okm.fill(&mut bytes).ok()?;
        UnboundKey::new(&CHACHA20_POLY1305, &bytes).ok().map(LessSafeKey::new)
    }

    /// `plain` sealed with the key of the period `now` (Unix seconds) falls in.
    fn seal(&self, now: u64, plain: &[u8]) -> Option<Vec<u8>> {
        let period = now / PERIOD;
        let key = self.key(period)?;
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut ticket = Vec::with_capacity(plain.len() + OVERHEAD);
        ticket.extend_from_slice(&period.to_be_bytes());
        ticket.extend_from_slice(&nonce);
        ticket.extend_from_slice(plain);
        let aad = period.to_be_bytes();
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut ticket[8 + NONCE_LEN..],
            )
            .ok()?;
        ticket.extend_from_slice(tag.as_ref());
        Some(ticket)
    }

    /// The session in `ticket`, if it was sealed by this secret in the period of `now` or the
    /// one before, and is intact. `ticket` comes from the client: anything may be in it.
    fn open(&self, now: u64, ticket: &[u8]) -> Option<Vec<u8>> {
        if ticket.len() < OVERHEAD {
            return None;
        }
        let (head, rest) = ticket.split_at(8);
        let period = u64::from_be_bytes(head.try_into().ok()?);
        let current = now / PERIOD;
        if period != current && period.checked_add(1) != Some(current) {
            return None;
        }
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = sealed.to_vec();
        let plain = self.key(period)?.open_in_place(nonce, Aad::from(period.to_be_bytes()), &mut buf).ok()?;
        let len = plain.len();
        buf.truncate(len);
        Some(buf)
    }
}

/// Seconds since the Unix epoch (the wall clock all workers share).
fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl rustls::server::ProducesTickets for SharedTicketer {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        PERIOD as u32
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.seal(unix_now(), plain)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.open(unix_now(), cipher)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_800_000_000;

    #[test]
    fn another_ticketer_with_the_same_secret_opens_the_ticket() {
        let (a, b) = (SharedTicketer::new([1; SECRET_LEN]), SharedTicketer::new([1; SECRET_LEN]));
        let ticket = a.seal(T0, b"session state").expect("sealed");
        assert_eq!(b.open(T0, &ticket).as_deref(), Some(&b"session state"[..]));
        assert_ne!(a.seal(T0, b"session state"), Some(ticket.clone()), "a fresh nonce each time");
        let other = SharedTicketer::new([2; SECRET_LEN]);
        assert_eq!(other.open(T0, &ticket), None);
    }

    #[test]
    fn keys_rotate_and_the_previous_period_still_opens() {
        let t = SharedTicketer::new([3; SECRET_LEN]);
        let start = T0 - T0 % PERIOD;
        let ticket = t.seal(start + PERIOD - 1, b"s").expect("sealed");
        assert!(t.open(start + PERIOD - 1, &ticket).is_some());
        assert!(t.open(start + 2 * PERIOD - 1, &ticket).is_some(), "the next period accepts it");
        assert_eq!(t.open(start + 2 * PERIOD, &ticket), None, "two periods on, it is gone");
        assert_eq!(t.open(start - 1, &ticket), None, "not before it was made");
        let next = t.seal(start + PERIOD, b"s").expect("sealed");
        assert_ne!(next[..8], ticket[..8], "a new period, a new key");
    }

    #[test]
    fn tampered_or_short_tickets_are_refused() {
        let t = SharedTicketer::new([4; SECRET_LEN]);
        let ticket = t.seal(T0, b"session").expect("sealed");
        for i in 0..ticket.len() {
            let mut bad = ticket.clone();
            bad[i] ^= 1;
            assert_eq!(t.open(T0, &bad), None, "byte {i}");
        }
        for len in 0..OVERHEAD {
            assert_eq!(t.open(T0, &ticket[..len]), None);
        }
        assert_eq!(t.open(T0, &[0xff; 64]), None);
    }
}
