//! "Did you mean …?" for unknown configuration keys, sections and `FORKD_*` variables: the
//! known name closest to the unknown one by edit distance, when it is close enough to be a
//! typo of it (`max_heder_bytes` → `max_header_bytes`, `FORKD_RATE_LIMIT_MAX` →
//! `FORKD_RATE_LIMIT__MAX`).
//!
//! Pure functions on strings; no I/O, no allocation beyond one row of the distance table.

/// The Levenshtein distance between `a` and `b` in characters: the fewest single-character
/// insertions, deletions and substitutions that turn one into the other.
pub(super) fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    // row[j]: the distance between the part of `a` read so far and b[..j].
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0]; // distance(a[..i], b[..j-1]) for the next j
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

/// The most edits a typo of a name of `len` characters may have: 1 up to 4 characters (`io`,
/// `max`: two edits would turn any short name into any other), else 2, or a third of the
/// length for long names.
fn limit(len: usize) -> usize {
    if len <= 4 {
        1
    } else {
        (len / 3).max(2)
    }
}

/// The candidate closest to `word`, if one is within the typo limit of its length (the first
/// one on a tie). `None` when nothing is that close, or when `word` is itself a candidate.
pub(super) fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let len = word.chars().count();
    let mut best: Option<(usize, &str)> = None;
    for candidate in candidates {
        let max = limit(candidate.chars().count());
        // The lengths alone bound the distance from below: skip the table when too far apart.
        if len.abs_diff(candidate.chars().count()) > max {
            continue;
        }
        let d = distance(word, candidate);
        if d == 0 {
            return None;
        }
        if d <= max && best.is_none_or(|(b, _)| d < b) {
            best = Some((d, candidate));
        }
    }
    best.map(|(_, candidate)| candidate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_counts_single_character_edits() {
        assert_eq!(distance("", ""), 0);
        assert_eq!(distance("abc", ""), 3);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("listen", "listen"), 0);
        assert_eq!(distance("lisen", "listen"), 1, "one deletion");
        assert_eq!(distance("listenn", "listen"), 1, "one insertion");
        assert_eq!(distance("listan", "listen"), 1, "one substitution");
        assert_eq!(distance("thredas", "threads"), 2, "a transposition is two edits");
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("flaw", "lawn"), 2);
        assert_eq!(distance("ä", "a"), 1, "characters, not bytes");
        assert_eq!(distance("abc", "xyz"), 3);
        assert_eq!(distance("sitting", "kitten"), distance("kitten", "sitting"), "symmetric");
    }

    #[test]
    fn closest_finds_typos_only() {
        let keys = ["json_body_bytes", "max_header_bytes", "header_timeout_ms", "max_connections"];
        assert_eq!(closest("max_heder_bytes", keys), Some("max_header_bytes"));
        assert_eq!(closest("max_header_byte", keys), Some("max_header_bytes"));
        assert_eq!(closest("maxconnections", keys), Some("max_connections"));
        assert_eq!(closest("body_bytes", keys), Some("json_body_bytes"), "five edits of fifteen");
        assert_eq!(closest("keepalive", keys), None, "too different");
        assert_eq!(closest("max_header_bytes", keys), None, "a known name needs no suggestion");
        assert_eq!(closest("thredas", ["threads"]), Some("threads"));
        assert_eq!(closest("lisen", ["environment", "listen", "workers"]), Some("listen"));
        assert_eq!(closest("", ["io", "db"]), None);
    }

    #[test]
    fn short_names_allow_one_edit() {
        assert_eq!(closest("maxx", ["max"]), Some("max"));
        assert_eq!(closest("mx", ["max"]), Some("max"));
        assert_eq!(closest("foo", ["max"]), None);
        assert_eq!(closest("ab", ["io", "db"]), Some("db"), "one edit from db, two from io");
        assert_eq!(closest("xy", ["io", "db"]), None, "two edits turn any two letters into any other");
    }

    #[test]
    fn long_names_allow_a_third() {
        let vars = ["RATE_LIMIT__MAX", "RATE_LIMIT__WINDOW_SECS", "LIMITS__MAX_HEADER_BYTES"];
        assert_eq!(closest("RATE_LIMIT_MAX", vars), Some("RATE_LIMIT__MAX"));
        assert_eq!(closest("RATE_LIMT__MAX", vars), Some("RATE_LIMIT__MAX"));
        assert_eq!(closest("LIMITS__MAX_HEADERS", vars), Some("LIMITS__MAX_HEADER_BYTES"));
        assert_eq!(closest("WORKERS", vars), None);
    }

    #[test]
    fn the_first_of_equally_close_candidates_wins() {
        assert_eq!(closest("origin", ["origins", "origin_"]), Some("origins"));
        assert_eq!(closest("origin", ["origin_", "origins"]), Some("origin_"));
    }

    #[test]
    fn a_huge_name_is_skipped_without_computing_the_table() {
        let huge = "x".repeat(100_000);
        assert_eq!(closest(&huge, ["listen", "workers"]), None);
    }
}
