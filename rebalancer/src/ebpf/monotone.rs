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
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    hash::{BuildHasherDefault, Hash, Hasher},
};

use rebalancer_common::{CgEvents, CgNodeKey, CgReasonKey};

use super::sample::RawMaps;

/// A hasher for the per-read tables keyed by cgroup ids and small integers (tens of thousands
/// of lookups a read): a multiply-rotate mix, several times cheaper than the default SipHash.
/// The keys come from the kernel's maps, not from a peer, and a tenant making cgroups picks
/// no ids, so flooding a table with colliding keys is not a concern.
#[derive(Clone, Copy, Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0xf135_7aea_2e62_a9c5);
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
    fn finish(&self) -> u64 {
        // The multiply leaves the low bits weakest; the table takes its bucket from them.
        self.0.rotate_left(26)
    }
}

/// A `HashMap` with [`IdHasher`].
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
/// A `HashSet` with [`IdHasher`].
pub type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

/// A map value made of counters.
pub trait Counters: Copy + Default {
    /// Adds to `cum` what a key counted between the raw reads `last` and `now`, field by field
    /// (a field below its last read was reset: it counted `now` since).
    fn advance(cum: &mut Self, last: &Self, now: &Self);
    /// `self += other`, field by field.
    fn add(&mut self, other: &Self) {
        Self::advance(self, &Self::default(), other);
    }
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
        // No field of a live entry goes back: one that did means the entry was made again,
        // and every field counts what it holds.
        let reset = now.migrations < last.migrations
            || now.cross_node_migrations < last.cross_node_migrations
            || now.numa_moves < last.numa_moves
            || now.numa_stuck < last.numa_stuck
            || now.pages_migrated < last.pages_migrated
            || now.local_faults < last.local_faults
            || now.remote_faults < last.remote_faults
            || now.remote_events < last.remote_events
            || now.local_events < last.local_events;
        let last = if reset { &CgEvents::default() } else { last };
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

/// One key: its last raw value and its cumulative value.
#[derive(Clone, Copy, Debug, Default)]
struct Seen<V> {
    last: V,
    cum: V,
}

/// One map's keys.
#[derive(Debug)]
pub struct Monotone<K, V> {
    /// Keys found at earlier reads (or skipped by a walk that was not exhaustive), sorted:
    /// a read, sorted too, is walked in step with them (no lookup per entry).
    seen: Vec<(K, Seen<V>)>,
    /// Counts of vanished keys folded into one key per cgroup (`fold`).
    carried: BTreeMap<K, V>,
    /// The key a vanished key's counts are folded into, for a map whose reader sums a
    /// cgroup's keys anyway (`EVENTS`): the state then stays one entry per cgroup however many
    /// of its keys come and go. None: a vanished key is carried as itself (its key matters).
    fold: Option<fn(&K) -> K>,
}

impl<K, V> Default for Monotone<K, V> {
    fn default() -> Self {
        Monotone {
            seen: Vec::new(),
            carried: BTreeMap::new(),
            fold: None,
        }
    }
}

impl<K: CgroupKey + Ord, V: Counters> Monotone<K, V> {
    /// Rewrites the entries of `kept` cgroups in `entries` (raw values of one read) into
    /// cumulative values, and appends the cumulative values of their keys this read did not
    /// find. `exhaustive`: the read saw every key in the map, so a key it did not find is gone
    /// and counts from 0 when it comes back; otherwise it may have been skipped, and keeps its
    /// last value (a re-created entry below it is still a reset). Entries of cgroups not kept
    /// pass through as read and leave no state: a cgroup kept again later starts from what
    /// its entries count then, as the engine, which forgot it too, expects. A key found twice
    /// in one read counts once (the first). `entries` come back sorted by key, the carried
    /// counts after them.
    pub fn apply(
        &mut self,
        entries: &mut Vec<(K, V)>,
        exhaustive: bool,
        kept: impl Fn(u64) -> bool,
    ) {
        // Stable: of a key read twice, the first stays first.
        entries.sort_by_key(|e| e.0);
        let read = std::mem::take(entries);
        let before = std::mem::take(&mut self.seen);
        let mut seen: Vec<(K, Seen<V>)> = Vec::with_capacity(before.len().max(read.len()));
        let mut out: Vec<(K, V)> = Vec::with_capacity(read.len() + self.carried.len());
        let (fold, carried) = (self.fold, &mut self.carried);
        // A key seen before that this read did not find.
        let mut unread = |k: K, mut s: Seen<V>, out: &mut Vec<(K, V)>, seen: &mut Vec<_>| {
            if !kept(k.cgroup()) {
                return;
            }
            if exhaustive {
                // Gone from the map.
                if let Some(f) = fold {
                    carried.entry(f(&k)).or_default().add(&s.cum);
                    return;
                }
                s.last = V::default();
            }
            out.push((k, s.cum));
            seen.push((k, s));
        };
        let mut before = before.into_iter().peekable();
        for (k, v) in read {
            while let Some((bk, s)) = before.next_if(|(bk, _)| *bk < k) {
                unread(bk, s, &mut out, &mut seen);
            }
            let last = before.next_if(|(bk, _)| *bk == k).map(|(_, s)| s);
            if !kept(k.cgroup()) {
                out.push((k, v));
                continue;
            }
            if seen.last().is_some_and(|(sk, _)| *sk == k) {
                continue;
            }
            let mut s = last.unwrap_or_default();
            V::advance(&mut s.cum, &s.last, &v);
            s.last = v;
            out.push((k, s.cum));
            seen.push((k, s));
        }
        for (bk, s) in before {
            unread(bk, s, &mut out, &mut seen);
        }
        self.seen = seen;
        carried.retain(|k, _| kept(k.cgroup()));
        out.extend(carried.iter().map(|(k, v)| (*k, *v)));
        *entries = out;
    }

    /// Keys remembered (present at the last read, or carried for a kept cgroup).
    pub fn len(&self) -> usize {
        self.seen.len() + self.carried.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The three per-cgroup maps' monotone counts. What they remember of a watched cgroup is
/// bounded whatever a tenant does with its entries: its `EVENTS` keys that vanished fold into
/// one per cgroup (the reader sums them over nodes), its `CPU_TIME` keys number its nodes with
/// CPUs, its `MIGRATE_REASONS` keys at most `MAX_MIGRATE_REASONS` (16): about 2.5 KB per
/// cgroup on 8 nodes, 40–80 MB at 16,384 watched cgroups that all ran and migrated pages for
/// every reason on every node (the maps cannot even hold that many keys at once).
#[derive(Debug)]
pub struct MonotoneMaps {
    cpu_time: Monotone<CgNodeKey, u64>,
    events: Monotone<CgNodeKey, CgEvents>,
    reasons: Monotone<CgReasonKey, u64>,
}

/// Where a cgroup's vanished `EVENTS` keys are carried (node `u32::MAX`, which the programs
/// also use for a CPU without a node; the two are kept apart, `carried` against `seen`, and
/// the only reader sums a cgroup's events over nodes).
fn events_carry(k: &CgNodeKey) -> CgNodeKey {
    CgNodeKey {
        cgroup_id: k.cgroup_id,
        node: u32::MAX,
        _pad: 0,
    }
}

impl Default for MonotoneMaps {
    fn default() -> Self {
        MonotoneMaps {
            cpu_time: Monotone::default(),
            events: Monotone {
                fold: Some(events_carry),
                ..Monotone::default()
            },
            reasons: Monotone::default(),
        }
    }
}

impl MonotoneMaps {
    /// Rewrites the per-cgroup maps of `raw` into cumulative counts (see [`Monotone::apply`]);
    /// `pending` (exact mode's per-CPU time not yet flushed) is not a counter and is left as
    /// read.
    pub fn apply(&mut self, raw: &mut RawMaps, kept: impl Fn(u64) -> bool) {
        let ex = raw.exhaustive;
        self.cpu_time.apply(&mut raw.cpu_time, ex, &kept);
        self.events.apply(&mut raw.events, ex, &kept);
        self.reasons.apply(&mut raw.reasons, ex, &kept);
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
    use std::hash::BuildHasher;

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
        read_with(m, events, kept, true)
    }

    fn read_with(
        m: &mut MonotoneMaps,
        events: &[(u32, u64)],
        kept: bool,
        exhaustive: bool,
    ) -> crate::ebpf::Sample {
        let mut raw = RawMaps {
            events: events.iter().map(|&(n, v)| (key(7, n), ev(v))).collect(),
            exhaustive,
            ..Default::default()
        };
        m.apply(&mut raw, |_| kept);
        fold(&raw, |_| None, &BTreeMap::new(), false)
            .remove(&7)
            .unwrap_or_default()
    }

    /// One evicted (cgroup, node) entry made the cgroup's sum go back, and the
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

    /// A tenant whose entries keep vanishing (evicted) on ever new nodes must not
    /// grow the state past one carried entry per cgroup for `EVENTS`.
    #[test]
    fn vanished_events_keys_fold_into_one_per_cgroup() {
        let mut m = MonotoneMaps::default();
        let mut total = 0;
        for node in 0..50 {
            let s = read(&mut m, &[(node, 10)], true);
            total += 10;
            assert_eq!(s.migrations, total, "every vanished key's count kept");
            assert!(m.len() <= 2, "{} keys after {} nodes", m.len(), node + 1);
        }
        // Back on node 0: all of its 7 are new.
        let s = read(&mut m, &[(0, 7)], true);
        assert_eq!(s.migrations, total + 7);
    }

    /// A key a walk skipped (entry by entry, an eviction under its feet) and found
    /// again must not count its whole value a second time.
    #[test]
    fn a_key_a_walk_may_have_skipped_keeps_its_last_value() {
        let mut m = MonotoneMaps::default();
        let a = read_with(&mut m, &[(0, 900), (1, 100)], true, false);
        let b = read_with(&mut m, &[(0, 900)], true, false);
        assert_eq!(b.migrations, 1000, "node 1's count is carried");
        let c = read_with(&mut m, &[(0, 900), (1, 103)], true, false);
        assert_eq!(c.delta(&b).migrations, 3, "not 103");
        assert_eq!(c.delta(&a).migrations, 3);
        // Made again below its last value: still a reset.
        let d = read_with(&mut m, &[(0, 900), (1, 5)], true, false);
        assert_eq!(d.delta(&c).migrations, 5);
    }

    /// A cgroup out of the watch list for one round (emptied, or its parent closed)
    /// came back with its lifetime counts, the engine having forgotten its baseline.
    #[test]
    fn keys_of_cgroups_not_kept_are_forgotten_and_pass_through() {
        let mut m = MonotoneMaps::default();
        read(&mut m, &[(0, 900), (1, 100)], true);
        assert_eq!(m.len(), 2);
        let b = read(&mut m, &[(0, 901)], false);
        assert!(
            m.is_empty(),
            "no state for a cgroup not kept, even for keys read"
        );
        assert_eq!(b.migrations, 901, "as read");
        // Watched again: its entries were deleted meanwhile and count from 0.
        let c = read(&mut m, &[(0, 1)], true);
        assert_eq!(c.migrations, 1, "what it counted since, not its lifetime");
    }

    #[test]
    fn a_key_twice_in_one_read_counts_once() {
        let mut m = MonotoneMaps::default();
        let a = read(&mut m, &[(0, 10), (0, 10)], true);
        assert_eq!(a.migrations, 10);
    }

    /// One field below its last value means the entry was made again; the other
    /// fields then hold only what they counted since, and count it all.
    #[test]
    fn a_reset_is_decided_for_the_whole_entry() {
        let mut m = MonotoneMaps::default();
        let k = key(7, 0);
        let mut raw = RawMaps {
            events: vec![(
                k,
                CgEvents {
                    migrations: 100,
                    remote_faults: 2,
                    ..Default::default()
                },
            )],
            exhaustive: true,
            ..Default::default()
        };
        m.apply(&mut raw, |_| true);
        let mut raw = RawMaps {
            events: vec![(
                k,
                CgEvents {
                    migrations: 5,
                    remote_faults: 3,
                    ..Default::default()
                },
            )],
            exhaustive: true,
            ..Default::default()
        };
        m.apply(&mut raw, |_| true);
        assert_eq!(raw.events[0].1.migrations, 105);
        assert_eq!(
            raw.events[0].1.remote_faults, 5,
            "3 since it was made again, not 1"
        );
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
            exhaustive: true,
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
            exhaustive: true,
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

    /// One key: its last raw value, its cumulative value, and the read that last found it.
    #[derive(Debug)]
    struct SeenAt<V> {
        last: V,
        cum: V,
        read: u64,
    }

    /// One map's keys in hash tables, as the counts were kept before the sorted walk: the
    /// oracle [`Monotone`] must equal.
    #[derive(Debug)]
    pub struct ByHash<K, V, S> {
        seen: HashMap<K, SeenAt<V>, S>,
        /// Counts of vanished keys folded into one key per cgroup (`fold`).
        carried: HashMap<K, V, S>,
        /// The key a vanished key's counts are folded into, for a map whose reader sums a
        /// cgroup's keys anyway (`EVENTS`): the state then stays one entry per cgroup however many
        /// of its keys come and go. None: a vanished key is carried as itself (its key matters).
        fold: Option<fn(&K) -> K>,
        reads: u64,
    }

    impl<K, V, S: Default> Default for ByHash<K, V, S> {
        fn default() -> Self {
            ByHash {
                seen: HashMap::default(),
                carried: HashMap::default(),
                fold: None,
                reads: 0,
            }
        }
    }

    impl<K: CgroupKey, V: Counters, S: BuildHasher> ByHash<K, V, S> {
        /// Rewrites the entries of `kept` cgroups in `entries` (raw values of one read) into
        /// cumulative values, and appends the cumulative values of their keys this read did not
        /// find. `exhaustive`: the read saw every key in the map, so a key it did not find is gone
        /// and counts from 0 when it comes back; otherwise it may have been skipped, and keeps its
        /// last value (a re-created entry below it is still a reset). Entries of cgroups not kept
        /// pass through as read and leave no state: a cgroup kept again later starts from what
        /// its entries count then, as the engine, which forgot it too, expects. A key found twice
        /// in one read counts once.
        pub fn apply(
            &mut self,
            entries: &mut Vec<(K, V)>,
            exhaustive: bool,
            kept: impl Fn(u64) -> bool,
        ) {
            self.reads += 1;
            let read = self.reads;
            let seen = &mut self.seen;
            entries.retain_mut(|(k, v)| {
                if !kept(k.cgroup()) {
                    seen.remove(k);
                    return true;
                }
                let s = seen.entry(*k).or_insert_with(|| SeenAt {
                    last: V::default(),
                    cum: V::default(),
                    read: 0,
                });
                if s.read == read {
                    return false;
                }
                V::advance(&mut s.cum, &s.last, v);
                s.last = *v;
                s.read = read;
                *v = s.cum;
                true
            });
            let (fold, carried) = (self.fold, &mut self.carried);
            self.seen.retain(|k, s| {
                if s.read == read {
                    return true;
                }
                if !kept(k.cgroup()) {
                    return false;
                }
                if exhaustive {
                    // Gone from the map.
                    if let Some(f) = fold {
                        carried.entry(f(k)).or_default().add(&s.cum);
                        return false;
                    }
                    s.last = V::default();
                }
                entries.push((*k, s.cum));
                true
            });
            carried.retain(|k, _| kept(k.cgroup()));
            entries.extend(carried.iter().map(|(k, v)| (*k, *v)));
        }

        /// Keys remembered (present at the last read, or carried for a kept cgroup).
        pub fn len(&self) -> usize {
            self.seen.len() + self.carried.len()
        }
    }

    type Reads = Vec<(Vec<(u64, u32, u64)>, bool, u64)>;

    /// One read's `CPU_TIME` and `EVENTS` (migrations) entries, and the keys remembered.
    type ReadOut = (Vec<(CgNodeKey, u64)>, Vec<(CgNodeKey, u64)>, usize);

    /// Random reads: entries (cgroup, node, value; values go back now and then, as re-made
    /// entries do), whether the read was exhaustive, and which cgroups are kept.
    fn reads() -> impl proptest::strategy::Strategy<Value = Reads> {
        use proptest::prelude::*;
        let entry = (0u64..24, 0u32..4, 0u64..50);
        proptest::collection::vec(
            (
                proptest::collection::vec(entry, 0..60),
                any::<bool>(),
                any::<u64>(),
            ),
            1..8,
        )
    }

    /// A map's counts kept one way or the other.
    trait Counts<V> {
        fn apply(
            &mut self,
            entries: &mut Vec<(CgNodeKey, V)>,
            exhaustive: bool,
            kept: &dyn Fn(u64) -> bool,
        );
        fn len(&self) -> usize;
    }

    impl<V: Counters> Counts<V> for Monotone<CgNodeKey, V> {
        fn apply(
            &mut self,
            entries: &mut Vec<(CgNodeKey, V)>,
            exhaustive: bool,
            kept: &dyn Fn(u64) -> bool,
        ) {
            Monotone::apply(self, entries, exhaustive, kept)
        }
        fn len(&self) -> usize {
            Monotone::len(self)
        }
    }

    impl<V: Counters, S: BuildHasher> Counts<V> for ByHash<CgNodeKey, V, S> {
        fn apply(
            &mut self,
            entries: &mut Vec<(CgNodeKey, V)>,
            exhaustive: bool,
            kept: &dyn Fn(u64) -> bool,
        ) {
            ByHash::apply(self, entries, exhaustive, kept)
        }
        fn len(&self) -> usize {
            ByHash::len(self)
        }
    }

    /// Runs `reads` through a `CPU_TIME`-like and an `EVENTS`-like counter; the entries of
    /// each read sorted (every reader sums them, in any order).
    fn run(
        reads: &Reads,
        cpu: &mut dyn Counts<u64>,
        events: &mut dyn Counts<CgEvents>,
    ) -> Vec<ReadOut> {
        reads
            .iter()
            .map(|(entries, exhaustive, kept_bits)| {
                let kept = |cg: u64| kept_bits >> (cg % 64) & 1 == 1;
                let mut c: Vec<(CgNodeKey, u64)> =
                    entries.iter().map(|&(cg, n, v)| (key(cg, n), v)).collect();
                let mut e: Vec<(CgNodeKey, CgEvents)> = entries
                    .iter()
                    .map(|&(cg, n, v)| (key(cg, n), ev(v)))
                    .collect();
                cpu.apply(&mut c, *exhaustive, &kept);
                events.apply(&mut e, *exhaustive, &kept);
                let mut e: Vec<(CgNodeKey, u64)> =
                    e.into_iter().map(|(k, v)| (k, v.migrations)).collect();
                c.sort();
                e.sort();
                (c, e, cpu.len() + events.len())
            })
            .collect()
    }

    proptest::proptest! {
        /// The sorted walk counts exactly as hash tables looked up key by key did, read after
        /// read (evictions, skipped keys, cgroups dropped and kept again, keys read twice).
        #[test]
        fn sorted_walk_counts_as_hash_tables(reads in reads()) {
            let sorted = run(
                &reads,
                &mut Monotone::<CgNodeKey, u64>::default(),
                &mut Monotone::<CgNodeKey, CgEvents> {
                    fold: Some(events_carry),
                    ..Monotone::default()
                },
            );
            let by_hash = run(
                &reads,
                &mut ByHash::<CgNodeKey, u64, std::collections::hash_map::RandomState>::default(),
                &mut ByHash::<CgNodeKey, CgEvents, std::collections::hash_map::RandomState> {
                    fold: Some(events_carry),
                    ..ByHash::default()
                },
            );
            proptest::prop_assert_eq!(sorted, by_hash);
        }
    }
}
