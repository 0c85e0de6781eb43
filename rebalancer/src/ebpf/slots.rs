//! Counter slots of the watched cgroups. Each managed cgroup the programs count owns one slot
//! of `SLOT_CPU` (one u64 per node) and `SLOT_EVENTS` ([`SlotEvents`]); `WATCHED` maps it and
//! the cgroups below it to that slot. [`Slots`] decides which cgroup owns which slot (pure);
//! [`Mapped`] is an array map mapped into this process, read and zeroed with atomic accesses.
//!
//! A freed slot is not given again at once: a program that looked the old owner's id up just
//! before its `WATCHED` entry was deleted may still add to the slot. Programs run to the end
//! without sleeping (preemption is off in tracepoint, kprobe and perf_event programs), so a
//! slot freed at one call is given again only at a later call at least [`REUSE_AFTER`] later,
//! and zeroed before any id is mapped to it: a new owner starts from 0.
use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    io,
    os::fd::{AsRawFd, BorrowedFd},
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use rebalancer_common::SlotEvents;

/// How long a freed slot rests before it is given again (far beyond any program's run, even
/// on a vCPU the hypervisor held for a while).
pub const REUSE_AFTER: Duration = Duration::from_secs(1);

/// u64 words of one [`SlotEvents`] in `SLOT_EVENTS`.
pub const EVENT_WORDS: usize = std::mem::size_of::<SlotEvents>() / 8;

/// Which managed cgroup owns which slot.
#[derive(Debug)]
pub struct Slots {
    capacity: u32,
    /// Managed cgroup id → its slot.
    owners: BTreeMap<u64, u32>,
    /// Slots never given yet: `next..capacity`.
    next: u32,
    /// Freed slots whose rest is over.
    free: Vec<u32>,
    /// Freed slots resting: (slot, the call that freed it, when).
    resting: VecDeque<(u32, u64, Duration)>,
    calls: u64,
}

/// What one [`Slots::assign`] asks of the maps, in this order: delete the `WATCHED` entries not
/// in `entries`, zero the slots of `zero`, then write `entries`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SlotPlan {
    /// Slots given to a new owner at this call.
    pub zero: Vec<u32>,
    /// What `WATCHED` must hold: every id of the watch list whose cgroup owns a slot → it.
    pub entries: BTreeMap<u64, u32>,
    /// Managed cgroups that got no slot (none free yet): tried again at the next call.
    pub waiting: usize,
}

impl Slots {
    pub fn new(capacity: u32) -> Self {
        Self {
            capacity,
            owners: BTreeMap::new(),
            next: 0,
            free: Vec::new(),
            resting: VecDeque::new(),
            calls: 0,
        }
    }

    /// Brings the owners in step with `watch` (cgroup id → the managed id it is counted
    /// under) at time `now` (monotonic): a managed cgroup no longer counted under frees its
    /// slot, one without a slot gets a free one.
    pub fn assign(&mut self, watch: &BTreeMap<u64, u64>, now: Duration) -> SlotPlan {
        self.calls += 1;
        let wanted: BTreeSet<u64> = watch.values().copied().collect();
        let gone: Vec<u64> = self
            .owners
            .keys()
            .copied()
            .filter(|id| !wanted.contains(id))
            .collect();
        for id in gone {
            if let Some(slot) = self.owners.remove(&id) {
                self.resting.push_back((slot, self.calls, now));
            }
        }
        while let Some(&(slot, call, at)) = self.resting.front() {
            if call >= self.calls || now.saturating_sub(at) < REUSE_AFTER {
                break;
            }
            self.resting.pop_front();
            self.free.push(slot);
        }
        let mut plan = SlotPlan::default();
        for id in wanted {
            if self.owners.contains_key(&id) {
                continue;
            }
            let slot = match self.free.pop() {
                Some(s) => s,
                None if self.next < self.capacity => {
                    self.next += 1;
                    self.next - 1
                }
                None => {
                    plan.waiting += 1;
                    continue;
                }
            };
            self.owners.insert(id, slot);
            plan.zero.push(slot);
        }
        plan.entries = watch
            .iter()
            .filter_map(|(id, to)| Some((*id, *self.owners.get(to)?)))
            .collect();
        plan
    }

    /// Managed cgroup id → slot, in id order.
    pub fn owners(&self) -> &BTreeMap<u64, u32> {
        &self.owners
    }

    /// Freed slots not given again yet (resting or free).
    pub fn unowned_used(&self) -> usize {
        self.free.len() + self.resting.len()
    }
}

/// An array map's values mapped into this process (`BPF_F_MMAPABLE`), as u64 words: the
/// programs add to them atomically, so they are read and written only through atomics.
pub struct Mapped {
    ptr: std::ptr::NonNull<AtomicU64>,
    words: usize,
    len: usize,
}

// SAFETY: the mapping is shared memory accessed only through atomics; it lives until drop.
unsafe impl Send for Mapped {}
unsafe impl Sync for Mapped {}

impl Mapped {
    /// Maps the `bytes` of values of the array map behind `fd` (its max entries × value
    /// size; the kernel maps whole pages).
    pub fn new(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .unwrap_or(4096)
            .max(1);
        let len = bytes.div_ceil(page).max(1) * page;
        // SAFETY: a new shared mapping of the map's fd; the kernel checks the length against
        // the map's size and the flags against its mmapability.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(p.cast::<AtomicU64>())
            .ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self {
            ptr,
            words: bytes / 8,
            len,
        })
    }

    /// Word `i` (0 past the end).
    #[inline]
    pub fn load(&self, i: usize) -> u64 {
        if i >= self.words {
            return 0;
        }
        // SAFETY: in bounds of the live mapping, 8-byte aligned (page-aligned base).
        unsafe { &*self.ptr.as_ptr().add(i) }.load(Ordering::Relaxed)
    }

    /// Adds `v` to word `i` as the programs do (ignored past the end).
    pub fn add(&self, i: usize, v: u64) {
        if i < self.words {
            // SAFETY: as in `load`.
            unsafe { &*self.ptr.as_ptr().add(i) }.fetch_add(v, Ordering::Relaxed);
        }
    }

    /// Stores 0 in words `from..to` (clamped to the mapping).
    pub fn zero(&self, from: usize, to: usize) {
        for i in from..to.min(self.words) {
            // SAFETY: as in `load`.
            unsafe { &*self.ptr.as_ptr().add(i) }.store(0, Ordering::Relaxed);
        }
    }

    /// Words of values mapped.
    pub fn words(&self) -> usize {
        self.words
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn watch(pairs: &[(u64, u64)]) -> BTreeMap<u64, u64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn a_cgroup_and_those_below_it_share_its_slot() {
        let mut s = Slots::new(4);
        let p = s.assign(&watch(&[(10, 10), (11, 10), (20, 20)]), S);
        assert_eq!(p.zero, vec![0, 1]);
        assert_eq!(p.entries, BTreeMap::from([(10, 0), (11, 0), (20, 1)]));
        assert_eq!(p.waiting, 0);
        // Same list: nothing zeroed, same slots.
        let p = s.assign(&watch(&[(10, 10), (11, 10), (20, 20)]), 2 * S);
        assert!(p.zero.is_empty());
        assert_eq!(p.entries, BTreeMap::from([(10, 0), (11, 0), (20, 1)]));
        // A sub-cgroup gone: its container keeps its slot (and its counts).
        let p = s.assign(&watch(&[(10, 10), (20, 20)]), 3 * S);
        assert!(p.zero.is_empty());
        assert_eq!(p.entries, BTreeMap::from([(10, 0), (20, 1)]));
    }

    /// A program may still add to a slot just after its owner's entry went: the slot is not
    /// given again at the same call nor within `REUSE_AFTER`, and when it is, it is zeroed
    /// first.
    #[test]
    fn a_freed_slot_rests_before_it_is_zeroed_and_given_again() {
        let mut s = Slots::new(2);
        s.assign(&watch(&[(1, 1), (2, 2)]), S);
        assert_eq!(s.owners(), &BTreeMap::from([(1, 0), (2, 1)]));
        // 1 goes and 3 comes at the same call: no slot for 3 yet (the only one is resting).
        let p = s.assign(&watch(&[(2, 2), (3, 3)]), 10 * S);
        assert_eq!(p.zero, Vec::<u32>::new());
        assert_eq!(p.entries, BTreeMap::from([(2, 1)]));
        assert_eq!(p.waiting, 1);
        assert_eq!(s.unowned_used(), 1);
        // A later call, but too soon.
        let p = s.assign(&watch(&[(2, 2), (3, 3)]), 10 * S + REUSE_AFTER / 2);
        assert_eq!(p.waiting, 1);
        // Rested: 3 gets slot 0, zeroed before its entry is written.
        let p = s.assign(&watch(&[(2, 2), (3, 3)]), 11 * S);
        assert_eq!(p.zero, vec![0]);
        assert_eq!(p.entries, BTreeMap::from([(2, 1), (3, 0)]));
        assert_eq!(p.waiting, 0);
        assert_eq!(s.unowned_used(), 0);
    }

    #[test]
    fn a_cgroup_watched_again_gets_a_zeroed_slot() {
        let mut s = Slots::new(8);
        s.assign(&watch(&[(5, 5)]), S);
        s.assign(&watch(&[]), 2 * S);
        let p = s.assign(&watch(&[(5, 5)]), 3 * S);
        assert_eq!(p.zero.len(), 1, "counts from 0 again");
        assert_eq!(p.entries.len(), 1);
    }

    #[test]
    fn slots_never_exceed_the_capacity() {
        let mut s = Slots::new(3);
        let many: BTreeMap<u64, u64> = (1..=10).map(|i| (i, i)).collect();
        let p = s.assign(&many, S);
        assert_eq!(p.zero.len(), 3);
        assert_eq!(p.waiting, 7);
        assert_eq!(p.entries.len(), 3);
        let slots: BTreeSet<u32> = p.entries.values().copied().collect();
        assert_eq!(slots, BTreeSet::from([0, 1, 2]));
        // Churn: every owner replaced, many times; no slot ever has two owners.
        for round in 0..50u64 {
            let ids: BTreeMap<u64, u64> =
                (0..3).map(|i| (100 * round + i, 100 * round + i)).collect();
            let p = s.assign(&ids, (2 + 2 * round as u32) * S);
            let owned: Vec<u32> = s.owners().values().copied().collect();
            let distinct: BTreeSet<u32> = owned.iter().copied().collect();
            assert_eq!(owned.len(), distinct.len(), "a slot with two owners");
            assert!(owned.iter().all(|&x| x < 3));
            assert!(p.zero.iter().all(|z| owned.contains(z)));
        }
    }
}
