//! kubelet's static-policy CPU take, exactly: `takeByTopologyNUMAPacked` and
//! `takeByTopologyNUMADistributed` of `pkg/kubelet/cm/cpumanager/cpu_assignment.go`, with the
//! packed / spread CPU sorting strategy and prefer-align-cpus-by-uncorecache. The admission
//! engine (`cpu::take_by_topology`) and `rebalancer hints cpu` both call this module, so the
//! conformance cases check the CPUs pods really get.
//!
//! Operators compare the sets we pick with what kubelet would pick, so this follows kubelet
//! step by step, quirks included: sort orders keep duplicates where kubelet's do, `take`
//! counts every CPU it is handed, and the distributed take reads its best combination through
//! Go's slice aliasing (`GoSlice`). Pure and deterministic.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use crate::cpuset::CpuSet;

/// One logical CPU as kubelet's `topology.CPUInfo` sees it. `core` is machine-wide unique (kubelet
/// keys a core by its lowest thread id); `uncore` is the last-level cache id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuInfo {
    pub cpu: u32,
    pub core: u32,
    pub socket: u32,
    pub numa: u32,
    pub uncore: u32,
}

/// kubelet's `CPUTopology`: the CPUs and the counts `topology.Discover` derives from them.
#[derive(Clone, Debug)]
pub struct CpuTopology {
    info: BTreeMap<u32, CpuInfo>,
    all: CpuSet,
    num_cores: usize,
    num_sockets: usize,
    num_numa: usize,
    num_uncore: usize,
}

impl CpuTopology {
    /// From every logical CPU of the machine; a repeated `cpu` keeps the last entry (callers
    /// that take input from outside reject duplicates first).
    pub fn new(cpus: impl IntoIterator<Item = CpuInfo>) -> CpuTopology {
        let info: BTreeMap<u32, CpuInfo> = cpus.into_iter().map(|c| (c.cpu, c)).collect();
        let distinct = |f: fn(&CpuInfo) -> u32| {
            info.values()
                .map(f)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        };
        CpuTopology {
            all: info.keys().copied().collect(),
            num_cores: distinct(|c| c.core),
            num_sockets: distinct(|c| c.socket),
            num_numa: distinct(|c| c.numa),
            num_uncore: distinct(|c| c.uncore),
            info,
        }
    }

    pub fn cpus(&self) -> &CpuSet {
        &self.all
    }

    pub fn info(&self, cpu: u32) -> Option<&CpuInfo> {
        self.info.get(&cpu)
    }

    fn num_cpus(&self) -> usize {
        self.info.len()
    }

    /// kubelet's `CPUsPerCore`: NumCPUs / NumCores (0 on an empty topology).
    pub fn cpus_per_core(&self) -> usize {
        self.num_cpus().checked_div(self.num_cores).unwrap_or(0)
    }

    fn cpus_per_socket(&self) -> usize {
        self.num_cpus().checked_div(self.num_sockets).unwrap_or(0)
    }

    fn cpus_per_uncore(&self) -> usize {
        self.num_cpus().checked_div(self.num_uncore).unwrap_or(0)
    }

    /// CPUs of `set` whose `key` is `id`.
    fn cpus_in(&self, set: &CpuSet, key: Key, id: u32) -> CpuSet {
        set.iter()
            .filter(|c| self.info.get(c).is_some_and(|i| key.of(i) == id))
            .collect()
    }

    /// Distinct `key` ids of the CPUs of `set`, ascending.
    fn ids(&self, set: &CpuSet, key: Key) -> Vec<u32> {
        let mut v: Vec<u32> = set
            .iter()
            .filter_map(|c| self.info.get(&c).map(|i| key.of(i)))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Distinct `key` ids of the CPUs of `set` whose `within` is `id`, ascending.
    fn ids_within(&self, set: &CpuSet, key: Key, within: Key, id: u32) -> Vec<u32> {
        self.ids(&self.cpus_in(set, within, id), key)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    Core,
    Socket,
    Numa,
    Uncore,
}

impl Key {
    fn of(self, i: &CpuInfo) -> u32 {
        match self {
            Key::Core => i.core,
            Key::Socket => i.socket,
            Key::Numa => i.numa,
            Key::Uncore => i.uncore,
        }
    }
}

/// kubelet's `CPUSortingStrategy`: packed, or spread (distribute-cpus-across-cores).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Strategy {
    #[default]
    Packed,
    Spread,
}

/// The errors kubelet's take returns, with kubelet's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TakeError {
    #[error("not enough cpus available to satisfy request: requested={requested}, available={available}")]
    NotEnough { requested: usize, available: usize },
    #[error("failed to allocate cpus")]
    Failed,
    #[error("accounting error, not enough CPUs allocated, remaining: {0}")]
    TooFew(i64),
    #[error("accounting error, too many CPUs allocated, remaining: {0}")]
    TooMany(i64),
}

/// kubelet's `cpuAccumulator`.
struct Acc<'a> {
    topo: &'a CpuTopology,
    /// kubelet's `details`: the available CPUs not taken yet.
    avail: CpuSet,
    need: i64,
    result: CpuSet,
    numa_first: bool,
    strategy: Strategy,
}

impl<'a> Acc<'a> {
    fn new(topo: &'a CpuTopology, available: &CpuSet, n: usize, strategy: Strategy) -> Self {
        Acc {
            topo,
            avail: available.intersection(&topo.all),
            need: n as i64,
            result: CpuSet::new(),
            numa_first: topo.num_sockets >= topo.num_numa,
            strategy,
        }
    }

    fn take(&mut self, cpus: &CpuSet) {
        self.result = self.result.union(cpus);
        self.avail = self.avail.difference(&self.result);
        self.need -= cpus.len() as i64;
    }

    fn satisfied(&self) -> bool {
        self.need < 1
    }

    fn failed(&self) -> bool {
        self.need > self.avail.len() as i64
    }

    fn needs_at_least(&self, n: usize) -> bool {
        self.need >= n as i64
    }

    fn count(&self, key: Key, id: u32) -> usize {
        self.topo.cpus_in(&self.avail, key, id).len()
    }

    /// kubelet's `sort`: free CPUs ascending, then id (ids come in ascending).
    fn sort(&self, mut ids: Vec<u32>, key: Key) -> Vec<u32> {
        ids.sort_by_key(|&id| (self.count(key, id), id));
        ids
    }

    fn sorted_numa_nodes(&self) -> Vec<u32> {
        if self.numa_first {
            self.sort(self.topo.ids(&self.avail, Key::Numa), Key::Numa)
        } else {
            self.sorted_sockets()
                .into_iter()
                .flat_map(|s| {
                    let ids = self.topo.ids_within(&self.avail, Key::Numa, Key::Socket, s);
                    self.sort(ids, Key::Numa)
                })
                .collect()
        }
    }

    fn sorted_sockets(&self) -> Vec<u32> {
        if self.numa_first {
            self.sorted_numa_nodes()
                .into_iter()
                .flat_map(|n| {
                    let ids = self.topo.ids_within(&self.avail, Key::Socket, Key::Numa, n);
                    self.sort(ids, Key::Socket)
                })
                .collect()
        } else {
            self.sort(self.topo.ids(&self.avail, Key::Socket), Key::Socket)
        }
    }

    fn sorted_cores(&self) -> Vec<u32> {
        let (parents, within) = if self.numa_first {
            (self.sorted_sockets(), Key::Socket)
        } else {
            (self.sorted_numa_nodes(), Key::Numa)
        };
        parents
            .into_iter()
            .flat_map(|p| {
                let ids = self.topo.ids_within(&self.avail, Key::Core, within, p);
                self.sort(ids, Key::Core)
            })
            .collect()
    }

    fn sorted_uncores(&self) -> Vec<u32> {
        self.sorted_numa_nodes()
            .into_iter()
            .flat_map(|n| {
                let ids = self.topo.ids_within(&self.avail, Key::Uncore, Key::Numa, n);
                self.sort(ids, Key::Uncore)
            })
            .collect()
    }

    fn sorted_cpus(&self) -> Vec<u32> {
        let (groups, key) = match self.strategy {
            Strategy::Packed => (self.sorted_cores(), Key::Core),
            Strategy::Spread => (self.sorted_sockets(), Key::Socket),
        };
        groups
            .into_iter()
            .flat_map(|g| {
                self.topo
                    .cpus_in(&self.avail, key, g)
                    .iter()
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn all_of(&self, key: Key, id: u32) -> CpuSet {
        self.topo.cpus_in(&self.topo.all, key, id)
    }

    fn take_full(&mut self, order: Vec<u32>, key: Key) {
        // kubelet's free lists: computed once, from the sorted order, before any take
        let free: Vec<u32> = order
            .into_iter()
            .filter(|&id| {
                let size = match key {
                    Key::Socket => self.topo.cpus_per_socket(),
                    Key::Core => self.topo.cpus_per_core(),
                    Key::Numa | Key::Uncore => self.all_of(key, id).len(),
                };
                self.count(key, id) == size
            })
            .collect();
        for id in free {
            let cpus = self.all_of(key, id);
            if self.needs_at_least(cpus.len()) {
                self.take(&cpus);
            }
        }
    }

    fn take_full_numa_nodes(&mut self) {
        let order = self.sorted_numa_nodes();
        self.take_full(order, Key::Numa);
    }

    fn take_full_sockets(&mut self) {
        let order = self.sorted_sockets();
        self.take_full(order, Key::Socket);
    }

    fn take_full_cores(&mut self) {
        let order = self.sorted_cores();
        self.take_full(order, Key::Core);
    }

    fn take_full_uncore(&mut self) {
        let order = self.sorted_uncores();
        self.take_full(order, Key::Uncore);
    }

    fn take_full_first_level(&mut self) {
        if self.numa_first {
            self.take_full_numa_nodes()
        } else {
            self.take_full_sockets()
        }
    }

    fn take_full_second_level(&mut self) {
        if self.numa_first {
            self.take_full_sockets()
        } else {
            self.take_full_numa_nodes()
        }
    }

    /// kubelet's `takePartialUncore`: the first cores (by id) of the uncore cache that have a
    /// free CPU, as many as the need in cores, taken only when their free CPUs are exactly
    /// the need (an odd need under SMT drops the highest CPU).
    fn take_partial_uncore(&mut self, uncore: u32) {
        let per_core = self.topo.cpus_per_core().max(1) as i64;
        let cores_needed = ((self.need + per_core - 1) / per_core).max(0) as usize;
        let cores = self
            .topo
            .ids_within(&self.avail, Key::Core, Key::Uncore, uncore);
        if cores.len() < cores_needed {
            return;
        }
        let mut free = CpuSet::new();
        for &core in &cores[..cores_needed] {
            free.union_with(&self.topo.cpus_in(&self.avail, Key::Core, core));
        }
        if self.need % 2 != 0 && per_core > 1 {
            let list: Vec<u32> = free.iter().collect();
            if list.len() as i64 > self.need {
                free = list[..list.len() - 1].iter().copied().collect();
            }
        }
        if free.len() as i64 == self.need {
            self.take(&free);
        }
    }

    fn take_uncore_cache(&mut self) {
        let per_uncore = self.topo.cpus_per_uncore();
        for uncore in self.sorted_uncores() {
            if self.needs_at_least(per_uncore) {
                self.take_full_uncore();
            }
            if self.satisfied() {
                return;
            }
            self.take_partial_uncore(uncore);
            if self.satisfied() {
                return;
            }
        }
    }

    fn take_remaining_cpus(&mut self) {
        for cpu in self.sorted_cpus() {
            self.take(&std::iter::once(cpu).collect());
            if self.satisfied() {
                return;
            }
        }
    }

    /// kubelet's `rangeNUMANodesNeededToSatisfy`.
    fn numa_range(&self, group: usize) -> (usize, usize) {
        let numa_count = self.topo.ids(&self.topo.all, Key::Numa).len().max(1);
        let available_numa = self.topo.ids(&self.avail, Key::Numa).len();
        let cpus = self.topo.num_cpus().max(1);
        let groups = (cpus - 1) / group + 1;
        let groups_per_numa = (groups - 1) / numa_count + 1;
        let groups_needed = (self.need.max(1) as usize - 1) / group + 1;
        (
            (groups_needed - 1) / groups_per_numa + 1,
            groups_needed.min(available_numa),
        )
    }
}

/// kubelet's `takeByTopologyNUMAPacked`.
pub fn take_packed(
    topo: &CpuTopology,
    available: &CpuSet,
    n: usize,
    strategy: Strategy,
    prefer_uncore: bool,
) -> Result<CpuSet, TakeError> {
    let mut acc = Acc::new(topo, available, n, strategy);
    if acc.satisfied() {
        return Ok(acc.result);
    }
    if acc.failed() {
        return Err(TakeError::NotEnough {
            requested: n,
            available: available.len(),
        });
    }
    acc.take_full_first_level();
    if acc.satisfied() {
        return Ok(acc.result);
    }
    acc.take_full_second_level();
    if acc.satisfied() {
        return Ok(acc.result);
    }
    if prefer_uncore {
        acc.take_uncore_cache();
        if acc.satisfied() {
            return Ok(acc.result);
        }
    }
    if strategy != Strategy::Spread {
        acc.take_full_cores();
        if acc.satisfied() {
            return Ok(acc.result);
        }
    }
    acc.take_remaining_cpus();
    if acc.satisfied() {
        return Ok(acc.result);
    }
    Err(TakeError::Failed)
}

/// A Go `[]int` as kubelet's `iterateCombinations` builds it with `append`: while the backing
/// array has room, append writes in place, so a combination kept past its callback sees what
/// later appends wrote there. kubelet keeps its best combination that way; reading it back
/// the same way gives kubelet's result.
#[derive(Clone)]
struct GoSlice {
    backing: Rc<RefCell<Vec<u32>>>,
    len: usize,
}

impl GoSlice {
    fn empty() -> GoSlice {
        GoSlice {
            backing: Rc::new(RefCell::new(Vec::new())),
            len: 0,
        }
    }

    fn append(&self, v: u32) -> GoSlice {
        let cap = self.backing.borrow().len();
        if self.len < cap {
            self.backing.borrow_mut()[self.len] = v;
            GoSlice {
                backing: Rc::clone(&self.backing),
                len: self.len + 1,
            }
        } else {
            // Go doubles small int slices (1, 2, 4, 8, …)
            let new_cap = if cap == 0 { 1 } else { cap * 2 };
            let mut grown = vec![0; new_cap];
            grown[..self.len].copy_from_slice(&self.backing.borrow()[..self.len]);
            grown[self.len] = v;
            GoSlice {
                backing: Rc::new(RefCell::new(grown)),
                len: self.len + 1,
            }
        }
    }

    fn to_vec(&self) -> Vec<u32> {
        self.backing.borrow()[..self.len].to_vec()
    }
}

/// kubelet's `iterateCombinations`: every k-combination of `items` in order; `f` returns false
/// to stop (kubelet's `Break`).
fn combinations(items: &[u32], k: usize, f: &mut dyn FnMut(&GoSlice) -> bool) {
    fn go(
        items: &[u32],
        k: usize,
        start: usize,
        acc: GoSlice,
        f: &mut dyn FnMut(&GoSlice) -> bool,
    ) -> bool {
        if k == 0 {
            return f(&acc);
        }
        let mut i = start;
        while i + k <= items.len() {
            if !go(items, k - 1, i + 1, acc.append(items[i]), f) {
                return false;
            }
            i += 1;
        }
        true
    }
    if k >= 1 {
        go(items, k, 0, GoSlice::empty(), f);
    }
}

fn round3(x: f64) -> f64 {
    // Go's math.Round: half away from zero, as f64::round
    (x * 1000.0).round() / 1000.0
}

/// kubelet's `standardDeviation` (mean and result rounded to three places).
fn std_dev(xs: &[i64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let m = round3(xs.iter().map(|&x| x as f64).sum::<f64>() / xs.len() as f64);
    let s = xs
        .iter()
        .map(|&x| (x as f64 - m) * (x as f64 - m))
        .sum::<f64>();
    round3((s / xs.len() as f64).sqrt())
}

/// kubelet's `takeByTopologyNUMADistributed`: spread evenly, `group` CPUs at a time, over the
/// fewest NUMA nodes that can hold the request, picking the combination that leaves the free
/// CPUs most balanced; packed when `n` is not a multiple of `group` or nothing balances.
pub fn take_distributed(
    topo: &CpuTopology,
    available: &CpuSet,
    n: usize,
    group: usize,
    strategy: Strategy,
) -> Result<CpuSet, TakeError> {
    let group = group.max(1);
    if !n.is_multiple_of(group) {
        return take_packed(topo, available, n, strategy, false);
    }
    let mut acc = Acc::new(topo, available, n, strategy);
    if acc.satisfied() {
        return Ok(acc.result);
    }
    if acc.failed() {
        return Err(TakeError::NotEnough {
            requested: n,
            available: available.len(),
        });
    }
    let numas = acc.sorted_numa_nodes();
    let free: BTreeMap<u32, i64> = numas
        .iter()
        .map(|&id| (id, acc.count(Key::Numa, id) as i64))
        .collect();
    let (min_k, max_k) = acc.numa_range(group);
    let (need, g) = (n as i64, group as i64);
    for k in min_k..=max_k {
        let mut best_balance = f64::MAX;
        let mut best_remainder: Option<GoSlice> = None;
        let mut best_combo: Option<GoSlice> = None;
        combinations(&numas, k, &mut |combo_slice| {
            if best_balance == 0.0 {
                return false;
            }
            let combo = combo_slice.to_vec();
            if combo.iter().map(|c| free[c]).sum::<i64>() < need {
                return true;
            }
            if combo.iter().map(|c| free[c] / g).sum::<i64>() * g < need {
                return true;
            }
            let dist = (need / combo.len() as i64 / g) * g;
            if combo.iter().any(|c| free[c] < dist) {
                return true;
            }
            let mut after = free.clone();
            for c in &combo {
                *after.get_mut(c).expect("combination of known nodes") -= dist;
            }
            let remainder = need - dist * combo.len() as i64;
            let rem_combo: Vec<u32> = combo.iter().copied().filter(|c| after[c] >= g).collect();
            let mut best_local = f64::MAX;
            let mut best_local_rem: Option<GoSlice> = None;
            if remainder == 0 {
                best_local = std_dev(&after.values().copied().collect::<Vec<_>>());
            }
            let mut size = rem_combo.len();
            while remainder > 0 && size >= 1 {
                combinations(&rem_combo, size, &mut |subset_slice| {
                    let subset = subset_slice.to_vec();
                    let mut trial = after.clone();
                    let mut left = remainder;
                    if subset.iter().map(|c| trial[c]).sum::<i64>() < left {
                        return true;
                    }
                    while left > 0 {
                        let before = left;
                        for c in &subset {
                            if left == 0 {
                                break;
                            }
                            let v = trial.get_mut(c).expect("subset of known nodes");
                            if *v < g {
                                continue;
                            }
                            *v -= g;
                            left -= g;
                        }
                        // kubelet would spin for ever here; no such subset can place it
                        if left == before {
                            return true;
                        }
                    }
                    let balance = std_dev(&trial.values().copied().collect::<Vec<_>>());
                    if balance < best_local {
                        best_local = balance;
                        best_local_rem = Some(subset_slice.clone());
                    }
                    true
                });
                size -= 1;
            }
            if best_local < best_balance {
                best_balance = best_local;
                best_remainder = best_local_rem;
                best_combo = Some(combo_slice.clone());
            }
            true
        });
        let Some(best) = best_combo else { continue };
        let chosen = best.to_vec();
        let dist = (n / chosen.len() / group) * group;
        for numa in &chosen {
            let cpus = topo.cpus_in(&acc.avail, Key::Numa, *numa);
            let got = take_packed(topo, &cpus, dist, strategy, false).unwrap_or_default();
            acc.take(&got);
        }
        let mut remainder = n - dist * chosen.len();
        let rem_numas = best_remainder.map(|r| r.to_vec()).unwrap_or_default();
        while remainder > 0 {
            let before = remainder;
            for numa in &rem_numas {
                if remainder == 0 {
                    break;
                }
                let cpus = topo.cpus_in(&acc.avail, Key::Numa, *numa);
                if cpus.len() < group {
                    continue;
                }
                let got = take_packed(topo, &cpus, group, strategy, false).unwrap_or_default();
                acc.take(&got);
                remainder -= group;
            }
            if remainder == before {
                break;
            }
        }
        if acc.need > 0 {
            return Err(TakeError::TooFew(acc.need));
        }
        if acc.need < 0 {
            return Err(TakeError::TooMany(acc.need));
        }
        return Ok(acc.result);
    }
    take_packed(topo, available, n, strategy, false)
}

#[cfg(test)]
#[path = "cpu_take_tests.rs"]
mod tests;
