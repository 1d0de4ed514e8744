//! Password hashing and verification with argon2id (version 0x13, `p = 1`), PHC strings.
//!
//! Pure computation: no I/O, no HTTP, no sockets, no storage. Hashing and verifying are
//! deliberately CPU- and memory-heavy (`m` KiB of RAM and `t` passes per call), so every call
//! here is made only from the worker's thread pool, never on the event loop.
//!
//! Passwords are never logged, and [`Passwords`]' `Debug` shows only the cost parameters.

use std::fmt;

use std::cell::RefCell;

use argon2::password_hash::PasswordHash;
use argon2::{Algorithm, Argon2, Block, Params, Version};
use base64::engine::general_purpose::STANDARD_NO_PAD as B64;
use base64::Engine;

use super::tokens::random_bytes;
use super::AuthError;

#[cfg(test)]
/// A password the tests try against the dummy.
const DUMMY_PASSWORD: &str = "forkd-dummy-password-for-timing-equalisation";

/// An argon2id hasher/verifier with fixed cost parameters, plus a dummy hash with the same
/// parameters so that a login for an unknown e-mail costs as much as one for a known e-mail.
#[derive(Clone)]
pub struct Passwords {
    argon2: Argon2<'static>,
    memory_kib: u32,
    iterations: u32,
    dummy: String,
}

impl fmt::Debug for Passwords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Passwords").field("memory_kib", &self.memory_kib).field("iterations", &self.iterations).finish()
    }
}

impl Passwords {
    /// An argon2id hasher with `m = memory_kib`, `t = iterations`, `p = 1`.
    ///
    /// Fails with [`AuthError::Hash`] if argon2 rejects the parameters (e.g.
    /// `memory_kib < 8` or `iterations == 0`).
    ///
    /// The dummy is a PHC string with these parameters, a random salt and a
    /// random output: verifying against it costs exactly one full hash, like a
    /// real verify, and no password matches it (that would take a preimage of
    /// a random value). It is made without hashing, so this is instant: a
    /// worker starts serving without first spending a whole hash of CPU and
    /// memory (on a saturated machine that start-up hash, run at idle
    /// priority, delayed a replacement worker by seconds).
    pub fn new(memory_kib: u32, iterations: u32) -> Result<Passwords, AuthError> {
        let params = Params::new(memory_kib, iterations, 1, None)
            .map_err(|e| AuthError::Hash(format!("argon2 parameters m={memory_kib} t={iterations} p=1: {e}")))?;
        let argon2 = Argon2::new(Algorithm::Argon2id, Version::V0x13, params);
        let dummy = format!(
            "$argon2id$v=19$m={memory_kib},t={iterations},p=1${}${}",
            B64.encode(random_bytes::<16>()),
            B64.encode(random_bytes::<32>())
        );
        Ok(Passwords { argon2, memory_kib, iterations, dummy })
    }

    /// Hash `password` into a PHC string (`$argon2id$v=19$m=…,t=…,p=1$salt$hash`) with a
    /// random 16-byte salt from `OsRng`.
    pub fn hash(&self, password: &str) -> Result<String, AuthError> {
        let salt = random_bytes::<16>();
        let mut out = [0u8; 32];
        with_memory(&self.argon2, password.as_bytes(), &salt, &mut out)
            .map_err(|e| AuthError::Hash(format!("argon2 hash: {e}")))?;
        Ok(format!(
            "$argon2id$v=19$m={},t={},p=1${}${}",
            self.memory_kib,
            self.iterations,
            B64.encode(salt),
            B64.encode(out)
        ))
    }

    /// Whether `password` matches the stored PHC string `phc`.
    ///
    /// The cost parameters are taken from `phc` itself (so hashes made with older settings still
    /// verify). Returns `false` for a wrong password and also for anything that is not a
    /// well-formed argon2id PHC string.
    pub fn verify(&self, password: &str, phc: &str) -> bool {
        let Ok(parsed) = PasswordHash::new(phc) else {
            return false;
        };
        if parsed.algorithm != Algorithm::Argon2id.ident() {
            return false;
        }
        let (Ok(params), Some(salt), Some(expected)) = (Params::try_from(&parsed), parsed.salt, parsed.hash) else {
            return false;
        };
        let Ok(version) = Version::try_from(parsed.version.unwrap_or(0x13)) else { return false };
        let mut salt_buf = [0u8; 64];
        let Ok(salt) = salt.decode_b64(&mut salt_buf) else { return false };
        let expected = expected.as_bytes();
        let own = params == *self.argon2.params() && version == Version::V0x13;
        let argon2 = if own { self.argon2.clone() } else { Argon2::new(Algorithm::Argon2id, version, params) };
        let mut out = vec![0u8; expected.len()];
        with_memory(&argon2, password.as_bytes(), salt, &mut out).is_ok()
            && super::tokens::constant_time_eq(&out, expected)
    }

    /// Spend the same time as a real `verify` against nothing (unknown e-mail): verifies against the dummy hash and returns false.
    pub fn verify_dummy(&self, password: &str) -> bool {
        let matched = self.verify(password, &self.dummy);
        std::hint::black_box(matched);
        false
    }
}

thread_local! {
    /// This thread's argon2 working memory, kept between hashes: one
    /// allocation per thread (~19 MiB at the defaults) instead of a fresh
    /// mapping per hash, which the allocator either retained per arena
    /// (hundreds of MiB after a login storm) or unmapped each time (stalling
    /// the event-loop thread on the process's memory-map lock).
    static BLOCKS: RefCell<Vec<Block>> = const { RefCell::new(Vec::new()) };
}

/// Give this thread's argon2 working memory back (the CPU lane calls it when
/// its queue is empty: a busy lane reuses the buffer, an idle one holds none).
pub fn release_memory() {
    BLOCKS.with(|cell| *cell.borrow_mut() = Vec::new());
}

/// Run argon2 into `out` with this thread's reusable block buffer.
fn with_memory(argon2: &Argon2<'_>, pwd: &[u8], salt: &[u8], out: &mut [u8]) -> argon2::Result<()> {
    BLOCKS.with(|cell| {
        let mut blocks = cell.borrow_mut();
        let need = argon2.params().block_count();
        if blocks.len() != need {
            blocks.clear();
            blocks.shrink_to(need);
            blocks.resize(need, Block::new());
        }
        argon2.hash_password_into_with_memory(pwd, salt, out, &mut blocks[..])
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Small parameters so the tests are fast: argon2's minimum memory (8 KiB per lane) is
    /// below this; one pass.
    fn small() -> Passwords {
        Passwords::new(64, 1).expect("small params are valid")
    }

    #[test]
    fn hash_and_verify() {
        let p = small();
        let phc = p.hash("correct horse battery staple").expect("hash");
        assert!(phc.starts_with("$argon2id$v=19$m=64,t=1,p=1$"), "{phc}");
        assert!(p.verify("correct horse battery staple", &phc));
        assert!(!p.verify("correct horse battery stapl", &phc));
        assert!(!p.verify("", &phc));
    }

    #[test]
    fn salts_differ() {
        let p = small();
        let a = p.hash("same password").expect("hash");
        let b = p.hash("same password").expect("hash");
        assert_ne!(a, b);
        assert!(p.verify("same password", &a) && p.verify("same password", &b));
        // 16 bytes of salt is 22 characters of unpadded standard base64.
        let salt = a.split('$').nth(4).unwrap_or_default();
        assert_eq!(salt.len(), 22, "{a}");
    }

    #[test]
    fn verify_uses_the_hash_params() {
        let old = Passwords::new(32, 2).expect("params");
        let phc = old.hash("pw").expect("hash");
        assert!(small().verify("pw", &phc));
    }

    #[test]
    fn malformed_phc_is_false() {
        let p = small();
        let phc = p.hash("pw").expect("hash");
        for bad in [
            "",
            "not a hash",
            "$argon2id$",
            "$argon2id$v=19$m=64,t=1,p=1$",
            "$argon2id$v=19$m=64,t=1,p=1$c2FsdHNhbHQ$",
            "$argon2id$v=19$m=0,t=1,p=1$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaA",
            "$2b$12$abcdefghijklmnopqrstuuABCDEFGHIJKLMNOPQRSTUVWXYZ01234",
            &phc[..phc.len() - 5],
            &phc.replace("argon2id", "argon2i"),
            &phc.replace("argon2id", "argon2d"),
            &phc.replace("argon2id", "scrypt"),
        ] {
            assert!(!p.verify("pw", bad), "{bad:?}");
        }
    }

    #[test]
    fn dummy_is_false() {
        let p = small();
        assert!(!p.verify_dummy("pw"));
        assert!(!p.verify_dummy(DUMMY_PASSWORD), "even the dummy's own password");
        assert!(p.dummy.starts_with("$argon2id$v=19$m=64,t=1,p=1$"));
        // A well-formed PHC string with the configured parameters and a full-size output,
        // so verifying against it runs the whole hash (the timing test measures that too).
        let parsed = PasswordHash::new(&p.dummy).expect("the dummy parses");
        let params = Params::try_from(&parsed).expect("params");
        assert_eq!((params.m_cost(), params.t_cost(), params.p_cost()), (64, 1, 1));
        assert_eq!(parsed.hash.map(|h| h.len()), Some(32));
        assert_ne!(small().dummy, p.dummy, "each set gets its own random dummy");
    }

    #[test]
    fn bad_params() {
        assert!(matches!(Passwords::new(4, 1), Err(AuthError::Hash(_))));
        assert!(matches!(Passwords::new(64, 0), Err(AuthError::Hash(_))));
    }

    #[test]
    fn debug_shows_no_hash() {
        let p = small();
        let debug = format!("{p:?}");
        assert_eq!(debug, "Passwords { memory_kib: 64, iterations: 1 }");
    }

    /// The least CPU time this thread spent in `f` over `runs` calls. CPU
    /// time, not wall time: on a loaded machine a call that waits for a core
    /// looked slow and failed the comparison, though the work was the same.
    fn best_of<F: FnMut()>(runs: usize, mut f: F) -> Duration {
        let cpu = || {
            nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
                .map(Duration::from)
                .expect("thread CPU clock")
        };
        (0..runs)
            .map(|_| {
                let start = cpu();
                f();
                cpu().saturating_sub(start)
            })
            .min()
            .unwrap_or_default()
    }

    /// The real defaults (19456 KiB, t = 2): verify and verify_dummy take comparable time.
    #[test]
    fn default_params_timing() {
        let p = Passwords::new(19456, 2).expect("default params");
        let phc = p.hash("hunter2hunter2").expect("hash");
        assert!(phc.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"));

        let hash = best_of(3, || {
            std::hint::black_box(p.hash("hunter2hunter2").ok());
        });
        let verify = best_of(3, || assert!(p.verify("hunter2hunter2", &phc)));
        let wrong = best_of(3, || assert!(!p.verify("wrong password", &phc)));
        let dummy = best_of(3, || assert!(!p.verify_dummy("hunter2hunter2")));
        eprintln!("argon2id m=19456 t=2 p=1: hash {hash:?}, verify {verify:?}, wrong {wrong:?}, dummy {dummy:?}");

        let ratio =
            |a: Duration, b: Duration| a.as_secs_f64().max(b.as_secs_f64()) / a.as_secs_f64().min(b.as_secs_f64());
        assert!(ratio(verify, dummy) < 2.0, "verify {verify:?} vs dummy {dummy:?}");
        assert!(ratio(wrong, dummy) < 2.0, "wrong {wrong:?} vs dummy {dummy:?}");
    }
}
