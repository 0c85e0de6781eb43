//! Per-key monotone counters from the per-cgroup LRU maps. An entry of `CPU_TIME`, `EVENTS` or
//! `MIGRATE_REASONS` can be evicted (the maps are full) and made again from 0 by the next
//! event, so a raw value read below the previous read of the same key counts from 0; a key a
//! read no longer finds is gone, and when it comes back its value is all new. [`Monotone`]
//! turns each read, key by key, into cumulative counts that never go back, carrying the counts
//! of a kept cgroup's vanished keys. Resets must be decided here, per key: a cgroup's sum over
//! nodes going back says nothing about which of its entries was evicted (one evicted node
//! would make the sum "reset" and count every other node's lifetime as one period), and the
//! scaled DRAM events of a local-includes-remote pair (local = L·p − R·q) go back without any
//! reset at all. Pure; unit-tested.
use std::{collections::HashMap, hash::Hash};

use rebalancer_common::{CgEvents, CgNodeKey, CgReasonKey};

use super::sample::RawMaps;

/// A map value made of counters.
pub trait Counters: Copy + Default {
    /// Adds to `cum` what a key counted between the raw reads `last` and `now`, field by field
    /// (a field below its last read was reset: it counted `now` since).
    fn advance(cum: &mut Self, last: &Self, now: &Self);
}

fn step(cum: &mut u64, last: u64, now: u64) {
    let counted = if now >= last { now - last } else { now };
    *cum = cum.saturating_add(counted);
}

impl Counters for u64 {
    fn advance(cum: &mut u64, last: &u64, now: &u64) {
        step(cum, *last, *now);
    }
}

impl Counters for CgEvents {
    fn advance(cum: &mut CgEvents, last: &CgEvents, now: &CgEvents) {
        step(&mut cum.migrations, last.migrations, now.migrations);
        step(
            &mut cum.cross_node_migrations,
            last.cross_node_migrations,
            now.cross_node_migrations,
        );
        step(&mut cum.numa_moves, last.numa_moves, now.numa_moves);
        step(&mut cum.numa_stuck, last.numa_stuck, now.numa_stuck);
        step(
            &mut cum.pages_migrated,
            last.pages_migrated,
            now.pages_migrated,
        );
        step(&mut cum.local_faults, last.local_faults, now.local_faults);
        step(
            &mut cum.remote_faults,
            last.remote_faults,
            now.remote_faults,
        );
        step(
            &mut cum.remote_events,
            last.remote_events,
            now.remote_events,
        );
        step(&mut cum.local_events, last.local_events, now.local_events);
    }
}

/// A map key that names its cgroup.
pub trait CgroupKey: Copy + Eq + Hash {
    fn cgroup(&self) -> u64;
}

impl CgroupKey for CgNodeKey {
    fn cgroup(&self) -> u64 {
        self.cgroup_id
    }
}

impl CgroupKey for CgReasonKey {
    fn cgroup(&self) -> u64 {
        self.cgroup_id
    }
}

/// One key: its last raw value, its cumulative value, and the read that last found it.
#[derive(Debug)]
struct Seen<V> {
    last: V,
    cum: V,
    read: u64,
}

/// One map's keys.
#[derive(Debug)]
pub struct Monotone<K, V> {
    seen: HashMap<K, Seen<V>>,
    reads: u64,
}

impl<K, V> Default for Monotone<K, V> {
    fn default() -> Self {
        Monotone {
            seen: HashMap::new(),
            reads: 0,
        }
    }
}

impl<K: CgroupKey, V: Counters> Monotone<K, V> {
    /// Rewrites `entries` (raw values of one read, one per key) into cumulative values, and
    /// appends the cumulative values of keys this read did not find whose cgroup is `kept`
    /// (their next value counts from 0). Keys of cgroups not kept are forgotten.
    pub fn apply(&mut self, entries: &mut Vec<(K, V)>, kept: impl Fn(u64) -> bool) {
        self.reads += 1;
        let read = self.reads;
        for (k, v) in entries.iter_mut() {
            let s = self.seen.entry(*k).or_insert_with(|| Seen {
                last: V::default(),
                cum: V::default(),
                read,
            });
            V::advance(&mut s.cum, &s.last, v);
            s.last = *v;
            s.read = read;
            *v = s.cum;
        }
        self.seen.retain(|k, s| {
            if s.read == read {
                return true;
            }
            if !kept(k.cgroup()) {
                return false;
            }
            // Gone from the map: made again, it starts from 0.
            s.last = V::default();
            entries.push((*k, s.cum));
            true
        });
    }

    /// Keys remembered (present at the last read, or carried for a kept cgroup).
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// The three per-cgroup maps' monotone counts.
#[derive(Debug, Default)]
pub struct MonotoneMaps {
    cpu_time: Monotone<CgNodeKey, u64>,
    events: Monotone<CgNodeKey, CgEvents>,
    reasons: Monotone<CgReasonKey, u64>,
}

impl MonotoneMaps {
    /// Rewrites the per-cgroup maps of `raw` into cumulative counts (see [`Monotone::apply`]);
    /// `pending` (exact mode's per-CPU time not yet flushed) is not a counter and is left as
    /// read.
    pub fn apply(&mut self, raw: &mut RawMaps, kept: impl Fn(u64) -> bool) {
        self.cpu_time.apply(&mut raw.cpu_time, &kept);
        self.events.apply(&mut raw.events, &kept);
        self.reasons.apply(&mut raw.reasons, &kept);
    }

    /// Keys remembered over the three maps.
    pub fn len(&self) -> usize {
        self.cpu_time.len() + self.events.len() + self.reasons.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::ebpf::sample::fold;

    fn key(cg: u64, node: u32) -> CgNodeKey {
        CgNodeKey {
            cgroup_id: cg,
            node,
            _pad: 0,
        }
    }

    fn ev(migrations: u64) -> CgEvents {
        CgEvents {
            migrations,
            ..Default::default()
        }
    }

    fn read(m: &mut MonotoneMaps, events: &[(u32, u64)], kept: bool) -> crate::ebpf::Sample {
        let mut raw = RawMaps {
            events: events.iter().map(|&(n, v)| (key(7, n), ev(v))).collect(),
            ..Default::default()
        };
        m.apply(&mut raw, |_| kept);
        fold(&raw, |_| None, &BTreeMap::new(), false)
            .remove(&7)
            .unwrap_or_default()
    }

    /// helper-17: one evicted (cgroup, node) entry made the cgroup's sum go back, and the
    /// period counted every other node's lifetime (902 migrations for 2).
    #[test]
    fn an_evicted_entry_counts_from_zero_and_the_others_count_their_growth() {
        let mut m = MonotoneMaps::default();
        let a = read(&mut m, &[(0, 900), (1, 100)], true);
        let b = read(&mut m, &[(0, 900), (1, 2)], true);
        assert_eq!(b.delta(&a).migrations, 2);
        let c = read(&mut m, &[(0, 905), (1, 4)], true);
        assert_eq!(c.delta(&b).migrations, 7);
    }

    #[test]
    fn a_vanished_entry_keeps_its_count_and_starts_again_from_zero() {
        let mut m = MonotoneMaps::default();
        let a = read(&mut m, &[(0, 900), (1, 100)], true);
        let b = read(&mut m, &[(0, 910)], true);
        assert_eq!(b.migrations, 1010, "node 1's count is carried");
        assert_eq!(b.delta(&a).migrations, 10);
        // Back with 150: all of it is new (it started from 0 when it was made again).
        let c = read(&mut m, &[(0, 910), (1, 150)], true);
        assert_eq!(c.delta(&b).migrations, 150);
    }

    #[test]
    fn keys_of_cgroups_not_kept_are_forgotten() {
        let mut m = MonotoneMaps::default();
        read(&mut m, &[(0, 900), (1, 100)], true);
        assert_eq!(m.len(), 2);
        let b = read(&mut m, &[(0, 901)], false);
        assert_eq!(
            m.len(),
            1,
            "the vanished key of a cgroup no longer kept is dropped"
        );
        assert_eq!(b.migrations, 901);
        read(&mut m, &[], false);
        assert!(m.is_empty());
    }

    #[test]
    fn every_field_and_map_is_made_monotone() {
        let mut m = MonotoneMaps::default();
        let rk = CgReasonKey {
            cgroup_id: 7,
            reason: 3,
            _pad: 0,
        };
        let full = CgEvents {
            migrations: 10,
            cross_node_migrations: 10,
            numa_moves: 10,
            numa_stuck: 10,
            pages_migrated: 10,
            local_faults: 10,
            remote_faults: 10,
            remote_events: 10,
            local_events: 10,
        };
        let mut raw = RawMaps {
            cpu_time: vec![(key(7, 0), 1000)],
            events: vec![(key(7, 0), full)],
            reasons: vec![(rk, 10)],
            ..Default::default()
        };
        m.apply(&mut raw, |_| true);
        let low = CgEvents {
            migrations: 1,
            cross_node_migrations: 1,
            numa_moves: 1,
            numa_stuck: 1,
            pages_migrated: 1,
            local_faults: 1,
            remote_faults: 1,
            remote_events: 1,
            local_events: 1,
        };
        let mut raw = RawMaps {
            cpu_time: vec![(key(7, 0), 5)],
            events: vec![(key(7, 0), low)],
            reasons: vec![(rk, 2)],
            ..Default::default()
        };
        m.apply(&mut raw, |_| true);
        assert_eq!(raw.cpu_time, vec![(key(7, 0), 1005)]);
        assert_eq!(raw.reasons, vec![(rk, 12)]);
        let e = raw.events[0].1;
        for v in [
            e.migrations,
            e.cross_node_migrations,
            e.numa_moves,
            e.numa_stuck,
            e.pages_migrated,
            e.local_faults,
            e.remote_faults,
            e.remote_events,
            e.local_events,
        ] {
            assert_eq!(v, 11);
        }
    }
}
