//! RFC 9218 (Extensible Prioritization Scheme for HTTP): the `priority`
//! request header and the order in which ready streams get DATA.
//!
//! This module owns two socket-free pieces:
//! - [`Priority::parse`] / [`Priority::from_fields`]: the `priority` field, a
//!   Structured Field Dictionary (RFC 8941 §3.2) with `u` (urgency, an
//!   Integer 0..=7, default 3) and `i` (incremental, a Boolean, default
//!   false). The parser is strict and bounded: a field longer than
//!   [`MAX_FIELD`] or one that is not a valid dictionary is ignored as a
//!   whole (RFC 8941 §4.2: parse failure), unknown keys are ignored, and a
//!   `u` or `i` of the wrong type or out of range falls back to its default
//!   (RFC 9218 §4.1, §4.2). It never panics and never allocates per member.
//! - [`Scheduler`]: given the streams that have DATA ready, whom to offer the
//!   next turn: lowest urgency first; within one urgency, non-incremental
//!   streams one at a time in stream-id order (each to completion, or until
//!   it blocks, before the next), then incremental ones round-robin. Less
//!   urgent streams get nothing while a more urgent one can still send.
//!
//! PRIORITY_UPDATE frames (RFC 9218 §7, type 0x10) are not handled: the `h2`
//! crate (0.4) drops frames of unknown types before the application sees
//! them and has no hook for them, so only the request header counts.
//!
//! The caller (the worker's HTTP/2 session) decides what "sending" means;
//! here a stream is only an id and a [`Priority`], and an offer's outcome is
//! a [`Sent`].

use super::StreamId;

/// The longest `priority` field (all its lines together) that is parsed;
/// a longer one is ignored (defaults).
pub const MAX_FIELD: usize = 1024;

/// The highest (least urgent) urgency.
pub const MAX_URGENCY: u8 = 7;

/// A stream's priority parameters (RFC 9218 §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Priority {
    /// `u`: 0 (most urgent) ..= 7.
    pub urgency: u8,
    /// `i`: the response is useful piece by piece, so it may share the
    /// connection with others of its urgency.
    pub incremental: bool,
}

impl Default for Priority {
    /// `u=3`, not incremental (RFC 9218 §4.1, §4.2).
    fn default() -> Priority {
        Priority { urgency: 3, incremental: false }
    }
}

impl Priority {
    /// The priority in one `priority` field value; defaults where it says
    /// nothing valid.
    pub fn parse(value: &[u8]) -> Priority {
        Priority::from_fields(std::iter::once(value))
    }

    /// The priority in the `priority` field lines of a request, combined as
    /// one comma-separated list (RFC 9110 §5.3), in the order received.
    pub fn from_fields<'a>(lines: impl IntoIterator<Item = &'a [u8]>) -> Priority {
        let mut lines = lines.into_iter().peekable();
        if lines.peek().is_none() {
            // Most requests have none: no buffer to clear.
            return Priority::default();
        }
        let mut joined = [0u8; MAX_FIELD];
        let mut len = 0;
        for (n, line) in lines.enumerate() {
            let sep: &[u8] = if n == 0 { b"" } else { b", " };
            if len + sep.len() + line.len() > MAX_FIELD {
                return Priority::default();
            }
            joined[len..len + sep.len()].copy_from_slice(sep);
            len += sep.len();
            joined[len..len + line.len()].copy_from_slice(line);
            len += line.len();
        }
        let mut p = Priority::default();
        let ok = parse_dictionary(&joined[..len], |key, value| match (key, value) {
            (b"u", Value::Integer(u)) if (0..=i64::from(MAX_URGENCY)).contains(&u) => p.urgency = u as u8,
            // Present but invalid: the default again (a later member overrides an earlier one).
            (b"u", _) => p.urgency = Priority::default().urgency,
            (b"i", Value::Boolean(b)) => p.incremental = b,
            (b"i", _) => p.incremental = Priority::default().incremental,
            _ => {}
        });
        if ok {
            p
        } else {
            Priority::default()
        }
    }
}

/// A dictionary member's value, as far as priorities care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    Integer(i64),
    Boolean(bool),
    /// Any other valid item (decimal, string, token, byte sequence) or an
    /// inner list.
    Other,
}

/// A cursor over a field value.
struct Input<'a> {
    s: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }
    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.at += 1;
            true
        } else {
            false
        }
    }
    fn skip_sp(&mut self) {
        while self.eat(b' ') {}
    }
    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.at += 1;
        }
    }
}

/// Parse `s` as a Structured Field Dictionary (RFC 8941 §4.2.2), calling
/// `member` with each member's key and value in order (a repeated key is
/// reported again; the later one wins). Returns `false` on a parse failure
/// (then the members reported so far must be discarded).
fn parse_dictionary(s: &[u8], mut member: impl FnMut(&[u8], Value)) -> bool {
    let mut inp = Input { s, at: 0 };
    inp.skip_sp();
    if inp.peek().is_none() {
        return true;
    }
    loop {
        let Some(key) = parse_key(&mut inp) else { return false };
        let value = if inp.eat(b'=') {
            let Some(v) = parse_item_or_inner_list(&mut inp) else { return false };
            v
        } else {
            // A bare key is Boolean true, with parameters.
            if !parse_parameters(&mut inp) {
                return false;
            }
            Value::Boolean(true)
        };
        member(key, value);
        inp.skip_ows();
        match inp.peek() {
            None => return true,
            Some(b',') => inp.at += 1,
            Some(_) => return false,
        }
        inp.skip_ows();
        // A trailing comma is a failure.
        if inp.peek().is_none() {
            return false;
        }
    }
}

/// `key = ( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" )`.
fn parse_key<'a>(inp: &mut Input<'a>) -> Option<&'a [u8]> {
    let start = inp.at;
    match inp.peek() {
        Some(b'a'..=b'z' | b'*') => inp.at += 1,
        _ => return None,
    }
    while matches!(inp.peek(), Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*')) {
        inp.at += 1;
    }
    Some(&inp.s[start..inp.at])
}

fn parse_item_or_inner_list(inp: &mut Input<'_>) -> Option<Value> {
    if inp.eat(b'(') {
        loop {
            inp.skip_sp();
            if inp.eat(b')') {
                return parse_parameters(inp).then_some(Value::Other);
            }
            parse_bare_item(inp)?;
            if !parse_parameters(inp) {
                return None;
            }
            // Items are separated by at least one space, or the list ends.
            if !matches!(inp.peek(), Some(b' ' | b')')) {
                return None;
            }
        }
    }
    let v = parse_bare_item(inp)?;
    parse_parameters(inp).then_some(v)
}

/// `*( ";" *SP key [ "=" bare-item ] )`; false on a failure.
fn parse_parameters(inp: &mut Input<'_>) -> bool {
    while inp.eat(b';') {
        inp.skip_sp();
        if parse_key(inp).is_none() {
            return false;
        }
        if inp.eat(b'=') && parse_bare_item(inp).is_none() {
            return false;
        }
    }
    true
}

fn parse_bare_item(inp: &mut Input<'_>) -> Option<Value> {
    match inp.peek()? {
        b'-' | b'0'..=b'9' => parse_number(inp),
        b'"' => parse_string(inp),
        b'*' | b'A'..=b'Z' | b'a'..=b'z' => {
            inp.at += 1;
            // tchar / ":" / "/"
            while matches!(
                inp.peek(),
                Some(
                    b'!'
                    | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
                    | b':'
                    | b'/'
                    | b'0'..=b'9'
                    | b'A'..=b'Z'
                    | b'a'..=b'z',
                )
            ) {
                inp.at += 1;
            }
            Some(Value::Other)
        }
        b':' => {
            inp.at += 1;
            while matches!(inp.peek(), Some(b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'+' | b'/' | b'=')) {
                inp.at += 1;
            }
            inp.eat(b':').then_some(Value::Other)
        }
        b'?' => {
            inp.at += 1;
            let b = match inp.peek()? {
                b'0' => false,
                b'1' => true,
                _ => return None,
            };
            inp.at += 1;
            Some(Value::Boolean(b))
        }
        _ => None,
    }
}

/// An Integer (at most 15 digits) or a Decimal (at most 12 integer and 1 to
/// 3 fractional digits), RFC 8941 §4.2.4.
fn parse_number(inp: &mut Input<'_>) -> Option<Value> {
    let negative = inp.eat(b'-');
    let mut int: i64 = 0;
    let mut digits = 0;
    while let Some(c @ b'0'..=b'9') = inp.peek() {
        digits += 1;
        if digits > 15 {
            return None;
        }
        int = int * 10 + i64::from(c - b'0');
        inp.at += 1;
    }
    if digits == 0 {
        return None;
    }
    if !inp.eat(b'.') {
        return Some(Value::Integer(if negative { -int } else { int }));
    }
    if digits > 12 {
        return None;
    }
    let mut fraction = 0;
    while matches!(inp.peek(), Some(b'0'..=b'9')) {
        fraction += 1;
        inp.at += 1;
    }
    (1..=3).contains(&fraction).then_some(Value::Other)
}

/// A String: printable ASCII between quotes, `\"` and `\\` escaped.
fn parse_string(inp: &mut Input<'_>) -> Option<Value> {
    inp.at += 1;
    loop {
        match inp.peek()? {
            b'"' => {
                inp.at += 1;
                return Some(Value::Other);
            }
            b'\\' => {
                inp.at += 1;
                if !matches!(inp.peek()?, b'"' | b'\\') {
                    return None;
                }
                inp.at += 1;
            }
            0x20..=0x7e => inp.at += 1,
            _ => return None,
        }
    }
}

/// What offering a stream its turn did (the caller sent DATA as the
/// stream's flow control allowed, up to its per-turn quantum).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// Nothing: no window (or no room in the connection's output).
    Nothing,
    /// Some bytes, then the window ran out; more are waiting.
    Short,
    /// Everything it had (its producer is empty, or its body ended).
    All,
    /// A whole quantum, and it has more it could send now: it holds the
    /// turn, so less urgent streams wait.
    Quantum,
    /// What it had (perhaps nothing), and more is on its way from the
    /// server itself (a disk read in flight), not from the peer: it holds
    /// the turn like [`Sent::Quantum`], so a less urgent stream does not
    /// take the window in the moment the read takes.
    Pending,
}

/// What a [`Scheduler::pass`] leaves for the caller's flow control.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// The most urgent stream that wanted to send but could not (it got
    /// [`Sent::Nothing`] or [`Sent::Short`]): it alone should keep asking for
    /// window, so that window the peer opens goes to it first.
    pub keeper: Option<StreamId>,
    /// Ready streams that did not send (not offered, or blocked behind the
    /// keeper): they should give back any window they asked for.
    pub release: Vec<StreamId>,
}

/// The order in which ready streams get DATA, by RFC 9218 priority.
///
/// It remembers, per urgency, the incremental stream served last, so
/// incremental streams take turns across passes.
#[derive(Debug, Default)]
pub struct Scheduler {
    /// Per urgency: the id of the incremental stream that sent last.
    last_incremental: [u32; MAX_URGENCY as usize + 1],
    /// Scratch for one pass's order.
    order: Vec<(StreamId, Priority)>,
}

impl Scheduler {
    /// A scheduler with no history.
    pub fn new() -> Scheduler {
        Scheduler::default()
    }

    /// Offer turns to `ready` (streams with DATA waiting, any order):
    /// `offer(stream)` sends what it may and says how it went. Streams are
    /// offered lowest urgency first; within an urgency, non-incremental
    /// streams by ascending id, then incremental ones starting after the one
    /// served last. A stream that sends a whole quantum holds the turn:
    /// nothing less urgent is offered, and if it is non-incremental nothing
    /// else of its urgency either. A stream that is blocked or has sent all
    /// it had does not hold the turn.
    pub fn pass(&mut self, ready: &[(StreamId, Priority)], mut offer: impl FnMut(StreamId) -> Sent) -> Pass {
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        order.extend(ready.iter().map(|&(id, p)| (id, Priority { urgency: p.urgency.min(MAX_URGENCY), ..p })));
        let last = self.last_incremental;
        order.sort_unstable_by_key(|&(id, p)| {
            let after_last = p.incremental && id.0 <= last[usize::from(p.urgency)];
            (p.urgency, p.incremental, after_last, id.0)
        });
        let mut pass = Pass::default();
        // The urgency a stream holds the turn at, and whether a non-incremental one does.
        let mut held: Option<(u8, bool)> = None;
        for &(id, p) in &order {
            let wait = match held {
                Some((u, exclusive)) => p.urgency > u || (exclusive && p.urgency == u),
                None => false,
            };
            if wait {
                pass.release.push(id);
                continue;
            }
            let sent = offer(id);
            if p.incremental && sent != Sent::Nothing {
                self.last_incremental[usize::from(p.urgency)] = id.0;
            }
            match sent {
                Sent::Nothing | Sent::Short if pass.keeper.is_none() => pass.keeper = Some(id),
                Sent::Nothing => pass.release.push(id),
                Sent::Short | Sent::All => {}
                Sent::Quantum | Sent::Pending => {
                    if held.is_none() {
                        held = Some((p.urgency, !p.incremental));
                    }
                }
            }
        }
        self.order = order;
        pass
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(u: u8, i: bool) -> Priority {
        Priority { urgency: u, incremental: i }
    }

    #[test]
    fn valid_fields_parse() {
        assert_eq!(Priority::parse(b"u=5"), p(5, false));
        assert_eq!(Priority::parse(b"u=0, i"), p(0, true));
        assert_eq!(Priority::parse(b"i, u=7"), p(7, true));
        assert_eq!(Priority::parse(b"i=?1"), p(3, true));
        assert_eq!(Priority::parse(b"u=1, i=?0"), p(1, false));
        assert_eq!(Priority::parse(b"  u=2 ,\ti  "), p(2, true));
        // Parameters, unknown keys of every type, inner lists.
        assert_eq!(
            Priority::parse(b"x=1.5, u=4;a=1;b, y=\"s\\\"q\", z=:aGk=:, t=tok/en:x, l=(1 \"a\" b);p, *k, i"),
            p(4, true)
        );
        // The later member wins.
        assert_eq!(Priority::parse(b"u=1, u=6"), p(6, false));
        // Lines combine in order.
        assert_eq!(Priority::from_fields([&b"u=2"[..], b"i"]), p(2, true));
        assert_eq!(Priority::from_fields([&b"u=2"[..], b"u=5"]), p(5, false));
    }

    #[test]
    fn absent_or_invalid_members_are_defaults() {
        assert_eq!(Priority::parse(b""), Priority::default());
        assert_eq!(Priority::default(), p(3, false));
        assert_eq!(Priority::from_fields(std::iter::empty()), p(3, false));
        // Out of range or the wrong type: that member only.
        assert_eq!(Priority::parse(b"u=8, i"), p(3, true));
        assert_eq!(Priority::parse(b"u=-1, i"), p(3, true));
        assert_eq!(Priority::parse(b"u=1.0, i"), p(3, true));
        assert_eq!(Priority::parse(b"u=\"1\", i"), p(3, true));
        assert_eq!(Priority::parse(b"u, i"), p(3, true));
        assert_eq!(Priority::parse(b"u=1, i=1"), p(1, false));
        assert_eq!(Priority::parse(b"u=1, i=?1, i=tok"), p(1, false));
        assert_eq!(Priority::parse(b"u=2, u=99"), p(3, false));
        assert_eq!(Priority::parse(b"U=1"), p(3, false));
    }

    #[test]
    fn hostile_fields_are_ignored_whole_without_panicking() {
        for bad in [
            &b"u=1,"[..],
            b"u=1,,i",
            b",u=1",
            b"u=1 i",
            b"u=1;",
            b"u=1;U=2",
            b"u=",
            b"u=1\x00",
            b"u=\"unterminated",
            b"u=1, x=\"\\n\"",
            b"u=1, x=\"\xff\"",
            b"u=1, x=:abc",
            b"u=1, x=?2",
            b"u=1, x=1.",
            b"u=1, x=1.2345",
            b"u=1, x=1234567890123.5",
            b"u=1, x=1234567890123456",
            b"u=1, x=(1 2",
            b"u=1, x=(1(2))",
            b"u=1, x=(12\"a\")",
            b"u=1, x=-",
            b"u=1, x=@",
            b"\xc3\xa9=1, u=1",
            b"u=1\t, i",
        ] {
            let got = Priority::parse(bad);
            // A tab before the comma is OWS and valid; everything else fails as a whole.
            if bad == b"u=1\t, i" {
                assert_eq!(got, p(1, true));
            } else {
                assert_eq!(got, Priority::default(), "{:?}", String::from_utf8_lossy(bad));
            }
        }
        // Oversized: ignored whole, however valid.
        let mut big = b"u=1, i".to_vec();
        big.extend_from_slice(&b", x=1".repeat(300));
        assert!(big.len() > MAX_FIELD);
        assert_eq!(Priority::parse(&big), Priority::default());
        let line = vec![b'u'; 600];
        assert_eq!(Priority::from_fields([&b"u=1"[..], &line, &line]), Priority::default());
        // Garbage of every byte, deterministic pseudo-random: no panic, urgency in range.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            let len = (x % 40) as usize;
            let s: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    b"u=i0123456789?;,( )\"\\:.-*aZ\t\xff"[(x % 29) as usize]
                })
                .collect();
            assert!(Priority::parse(&s).urgency <= MAX_URGENCY);
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        }
    }

    /// One pass where every offered stream reports `outcome(id)`; returns the offers in order.
    fn offers(s: &mut Scheduler, ready: &[(u32, Priority)], outcome: impl Fn(u32) -> Sent) -> (Vec<u32>, Pass) {
        let ready: Vec<(StreamId, Priority)> = ready.iter().map(|&(id, p)| (StreamId(id), p)).collect();
        let mut seen = Vec::new();
        let pass = s.pass(&ready, |id| {
            seen.push(id.0);
            outcome(id.0)
        });
        (seen, pass)
    }

    #[test]
    fn the_most_urgent_stream_that_can_send_holds_the_turn() {
        let mut s = Scheduler::new();
        let ready = [(1, p(5, false)), (3, p(0, false)), (5, p(3, false))];
        // u=0 sends a quantum: nobody else is offered.
        let (seen, pass) = offers(&mut s, &ready, |_| Sent::Quantum);
        assert_eq!(seen, [3]);
        assert_eq!(pass, Pass { keeper: None, release: vec![StreamId(5), StreamId(1)] });
        // u=0 is blocked: the next urgency goes, and u=0 keeps its claim on the window.
        let (seen, pass) = offers(&mut s, &ready, |id| if id == 3 { Sent::Nothing } else { Sent::Quantum });
        assert_eq!(seen, [3, 5]);
        assert_eq!(pass, Pass { keeper: Some(StreamId(3)), release: vec![StreamId(1)] });
        // u=0 ran out of window mid-quantum: it stays the keeper, the others go on.
        let (seen, pass) = offers(&mut s, &ready, |id| if id == 3 { Sent::Short } else { Sent::All });
        assert_eq!(seen, [3, 5, 1]);
        assert_eq!(pass.keeper, Some(StreamId(3)));
        // Waiting for its own producer (a disk read), u=0 holds the turn.
        let (seen, pass) = offers(&mut s, &ready, |id| if id == 3 { Sent::Pending } else { Sent::Quantum });
        assert_eq!(seen, [3]);
        assert_eq!(pass, Pass { keeper: None, release: vec![StreamId(5), StreamId(1)] });
        // Everything blocked: only the most urgent keeps asking.
        let (seen, pass) = offers(&mut s, &ready, |_| Sent::Nothing);
        assert_eq!(seen, [3, 5, 1]);
        assert_eq!(pass, Pass { keeper: Some(StreamId(3)), release: vec![StreamId(5), StreamId(1)] });
    }

    #[test]
    fn non_incremental_streams_go_one_at_a_time_in_id_order() {
        let mut s = Scheduler::new();
        let ready = [(7, p(3, false)), (5, p(3, false)), (9, p(3, true))];
        let (seen, _) = offers(&mut s, &ready, |_| Sent::Quantum);
        assert_eq!(seen, [5]);
        // Stream 5 drained its producer: 7 may send in the same pass, and holds the turn.
        let (seen, pass) = offers(&mut s, &ready, |id| if id == 5 { Sent::All } else { Sent::Quantum });
        assert_eq!(seen, [5, 7]);
        assert_eq!(pass.release, [StreamId(9)]);
        // Both blocked: the incremental one gets the window.
        let (seen, _) = offers(&mut s, &ready, |id| if id == 9 { Sent::Quantum } else { Sent::Nothing });
        assert_eq!(seen, [5, 7, 9]);
    }

    #[test]
    fn incremental_streams_of_one_urgency_take_turns() {
        let mut s = Scheduler::new();
        let ready = [(1, p(3, true)), (3, p(3, true)), (5, p(3, true)), (7, p(4, true))];
        // All of one urgency are offered once per pass (less urgent ones wait) …
        let (seen, _) = offers(&mut s, &ready, |_| Sent::Quantum);
        assert_eq!(seen, [1, 3, 5]);
        // … starting after the one served last (5: wrapping round to 1), and one
        // that can go on holds the turn against less urgent ones.
        let (seen, pass) = offers(&mut s, &ready, |id| if id == 1 { Sent::Quantum } else { Sent::Nothing });
        assert_eq!(seen, [1, 3, 5]);
        assert_eq!(pass, Pass { keeper: Some(StreamId(3)), release: vec![StreamId(5), StreamId(7)] });
        let (seen, _) = offers(&mut s, &ready, |_| Sent::Quantum);
        assert_eq!(seen, [3, 5, 1]);
        // A new stream of the urgency joins in id order after the last served (1).
        let ready = [(1, p(3, true)), (3, p(3, true)), (5, p(3, true)), (11, p(3, true))];
        let (seen, _) = offers(&mut s, &ready, |id| if id == 3 { Sent::Quantum } else { Sent::Nothing });
        assert_eq!(seen, [3, 5, 11, 1]);
        let (seen, _) = offers(&mut s, &ready, |_| Sent::Quantum);
        assert_eq!(seen, [5, 11, 1, 3]);
    }

    #[test]
    fn an_urgent_stream_arriving_later_goes_first() {
        let mut s = Scheduler::new();
        let (seen, _) = offers(&mut s, &[(1, p(5, false))], |_| Sent::Quantum);
        assert_eq!(seen, [1]);
        let (seen, pass) = offers(&mut s, &[(1, p(5, false)), (3, p(0, false))], |_| Sent::Quantum);
        assert_eq!(seen, [3]);
        assert_eq!(pass.release, [StreamId(1)]);
        // Out-of-range urgencies (never produced by the parser) count as the least urgent.
        let (seen, _) = offers(&mut s, &[(1, p(200, false)), (3, p(7, false))], |_| Sent::All);
        assert_eq!(seen, [1, 3]);
    }
}
