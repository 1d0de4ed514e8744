//! Who an `/api/events` stream is for: its caller ([`Viewer`], or nobody) and the resources
//! it asked for (`?resources=a,b`), and the one question asked of it for every change event:
//! may this stream see a change of resource `i` owned by `owner_id`?
//!
//! The answer is the resource's `read` rule ([`super::Read::allows`], the same rule the
//! resource routes apply), so an event never shows a record to a stream whose caller could
//! not `GET` it. Asking costs no allocation: the resource set is a bitset over registry
//! indexes, built once when the stream opens.

use super::Registry;
use crate::store::records::Viewer;

/// A set of resources, by index in [`Registry::list`]; `All` until a stream narrows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Selection {
    /// Every resource.
    #[default]
    All,
    /// Only these: bit `i % 64` of word `i / 64` stands for resource `i`.
    Only(Box<[u64]>),
}

impl Selection {
    /// The set of the resources named in `list` (comma-separated); `Err(name)` for the first
    /// name that is not a resource whose changes are pushed.
    pub fn parse<'a>(registry: &Registry, list: &'a str) -> Result<Selection, &'a str> {
        let mut words = vec![0u64; registry.list.len().div_ceil(64)];
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let i = registry.list.iter().position(|r| r.name == name && r.events).ok_or(name)?;
            words[i / 64] |= 1 << (i % 64);
        }
        Ok(Selection::Only(words.into()))
    }

    /// Whether resource `i` is in the set.
    pub fn contains(&self, i: usize) -> bool {
        match self {
            Selection::All => true,
            Selection::Only(words) => words.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0),
        }
    }
}

/// The caller and the resources of one event stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Audience {
    /// The stream's user (`Authorization: Bearer` or `?token=`); `None`: anonymous.
    pub viewer: Option<Viewer>,
    /// The resources it asked for.
    pub only: Selection,
}

impl Audience {
    /// Whether a change of resource `i` of `registry`, to a record owned by `owner_id`, may
    /// go to this stream: the resource is in its set, pushes changes, and its `read` rule lets
    /// the stream's caller read the record.
    pub fn sees(&self, registry: &Registry, i: usize, owner_id: i64) -> bool {
        self.only.contains(i)
            && registry.list.get(i).is_some_and(|r| r.events && r.read.allows(self.viewer.as_ref(), owner_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{Read, Resource};

    fn registry(rules: &[(&str, Read, bool)]) -> Registry {
        let list = rules
            .iter()
            .map(|&(name, read, events)| Resource {
                name: name.into(),
                read,
                events,
                ..crate::resources::builtin::posts()
            })
            .collect();
        Registry { list, declared: Vec::new() }
    }

    const ALICE: Viewer = Viewer { user_id: 1, admin: false };
    const BOB: Viewer = Viewer { user_id: 2, admin: false };
    const ADMIN: Viewer = Viewer { user_id: 3, admin: true };

    #[test]
    fn each_read_rule_admits_exactly_its_callers() {
        let cases = [
            (Read::Public, [true, true, true, true]),
            (Read::SignedIn, [false, true, true, true]),
            (Read::Owner, [false, true, false, true]),
            (Read::Admin, [false, false, false, true]),
        ];
        for (rule, want) in cases {
            let got = [None, Some(&ALICE), Some(&BOB), Some(&ADMIN)].map(|v| rule.allows(v, ALICE.user_id));
            assert_eq!(got, want, "{rule:?} for nobody, the owner, another user, an admin");
        }
    }

    #[test]
    fn a_stream_sees_only_readable_changes_of_its_resources() {
        let reg =
            registry(&[("notes", Read::Owner, true), ("news", Read::Public, true), ("quiet", Read::Public, false)]);
        let alice = Audience { viewer: Some(ALICE), only: Selection::All };
        assert!(alice.sees(&reg, 0, ALICE.user_id));
        assert!(!alice.sees(&reg, 0, BOB.user_id), "another's record under an owner rule");
        assert!(alice.sees(&reg, 1, BOB.user_id));
        assert!(!alice.sees(&reg, 2, ALICE.user_id), "a resource without events");
        assert!(!alice.sees(&reg, 9, ALICE.user_id), "an index past the registry");
        let anonymous = Audience::default();
        assert!(!anonymous.sees(&reg, 0, ALICE.user_id));
        assert!(anonymous.sees(&reg, 1, ALICE.user_id));
        let narrowed = Audience { viewer: Some(ADMIN), only: Selection::parse(&reg, "news").expect("known") };
        assert!(!narrowed.sees(&reg, 0, ALICE.user_id), "not asked for");
        assert!(narrowed.sees(&reg, 1, ALICE.user_id));
    }

    #[test]
    fn a_selection_names_only_resources_that_push_changes() {
        let reg = registry(&[("notes", Read::Owner, true), ("quiet", Read::Public, false)]);
        assert_eq!(Selection::parse(&reg, "notes,nope"), Err("nope"));
        assert_eq!(Selection::parse(&reg, "quiet"), Err("quiet"));
        let s = Selection::parse(&reg, " notes ,").expect("known");
        assert!(s.contains(0) && !s.contains(1) && !s.contains(640));
        assert!(!Selection::parse(&reg, "").expect("empty").contains(0), "an empty list selects nothing");
    }

    #[test]
    fn a_selection_past_sixty_four_resources_keeps_every_bit() {
        let names: Vec<String> = (0..130).map(|i| format!("r{i}")).collect();
        let rules: Vec<(&str, Read, bool)> = names.iter().map(|n| (n.as_str(), Read::Public, true)).collect();
        let reg = registry(&rules);
        let s = Selection::parse(&reg, "r0,r64,r129").expect("known");
        let hit: Vec<usize> = (0..130).filter(|&i| s.contains(i)).collect();
        assert_eq!(hit, [0, 64, 129]);
    }
}
