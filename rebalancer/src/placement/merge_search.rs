//! The exact search behind the fast merge's non-preferred case (see merge.rs): the best mask, by
//! kubelet's `compare`, among the ANDs of one mask per hint list — without walking the cartesian
//! product and without building the set of reachable masks (both grow like 2^N per list with
//! kubelet-shaped hints, where a provider lists every mask). Memory stays O(hints + lists): a
//! depth-first branch-and-bound plus a capped memo.
//!
//! The order. Among non-empty non-preferred masks `compare` is the total order of the key
//! `(class(|m|), within)`, smaller first: `class(bnp) = 0`, a count `c < bnp` has class `bnp - c`
//! (the wider the better), a count `c > bnp` has class `c - 1` (the narrower the better, and every
//! one of them after all counts below bnp); `within` is `fit` among masks of one count: `int(m)`
//! (narrowest), or `(Σ D[i][j] over m × m, int(m))` (closest; kubelet's f64 mean over `|m|²`
//! terms orders exactly like the integer sum while every distance is ≤ 2^20: the sums are exact
//! in f64 and two different sums divided by the same `|m|²` stay apart by more than two ulps).
//! With larger distances the search only bounds the class and leaves `within` to kubelet's own
//! `closest_cmp` at the leaves.
//!
//! Why it is exact. A search node is `(S, rem)`: the AND `S` of the masks chosen so far and the
//! lists still to choose from; every result below it is `S ∧ m_1 ∧ …` for one mask per list of
//! `rem`. Only non-empty results matter (an empty mask never wins), so for a non-empty result `R`
//! every chosen mask meets `S`, and `R ⊆ S ∧ ∩_j ∪{m ∈ L_j : m ∧ S ≠ ∅}` (= `Sp`),
//! `R ⊇ S ∧ ∩_j ∩{m ∈ L_j : m ∧ S ≠ ∅}` (= `F`), `|R| ≤ min_j max_m |S ∧ m|`. So the count of `R`
//! lies in `[lo, hi]`, its best possible class is at `clamp(bnp, lo, hi)` (`c*`; every other
//! count has a worse class), and at that count `int(R) ≥ int(F ∪ lowest c*−|F| nodes of Sp∖F)`;
//! with distances, `2·Σ D over R ≥ 2·Σ D over F + the c*−|F| smallest node values of Sp∖F`
//! (a node's value: twice its own distance and its distances to and from `F`, plus `c*−|F|−1`
//! times its cheapest pair within `Sp∖F`), and a mask that ties the best sum can only use nodes
//! whose value is at most the (c*−|F|)-th smallest, which bounds its `int` the same way. A node
//! that cannot beat the best key found so far holds nothing better (keys of distinct masks never
//! tie) and is skipped. Children are visited in the order of the plain bound `(class, sum, int)`
//! computed from the child's mask alone, so once one child's bound is not below the best, none
//! of the following children can hold anything better. When `F = S` every choice gives `S`.
//! A memo of explored `(S, rem)` skips repeats (capped; an entry only saves work). None of this
//! depends on the order lists are chosen in (AND commutes), so the list to branch on is picked
//! per node: the one whose best mask keeps the fewest nodes of `S` (fail first).

use std::cmp::Ordering;
use std::collections::HashSet;

use super::mask::{NodeMask, MAX_NODES};
use super::numa_info::NumaInfo;

/// Largest distance for which the integer sum orders masks exactly like kubelet's f64 mean.
const EXACT_DISTANCE: u64 = 1 << 20;

/// How many explored `(rem, S)` pairs the memo keeps at most (32 bytes each).
const MEMO_CAP: usize = 1 << 16;

/// How masks of one count are ordered: kubelet's `fit`.
pub(super) enum Within<'a> {
    /// `narrowest`: by integer value.
    Narrowest,
    /// `closest`: by mean distance, then integer value.
    Closest(&'a NumaInfo),
}

/// The best non-empty AND of one mask per list, by `compare` among non-preferred hints with
/// "best non-preferred count" `bnp`. `lists` hold distinct non-empty masks within `all`; an empty
/// list, or no non-empty AND at all, gives `None`.
pub(super) fn best_mask(
    lists: &[Vec<NodeMask>],
    all: NodeMask,
    bnp: u32,
    within: Within<'_>,
) -> Option<NodeMask> {
    let mut root = all;
    let mut rem = Vec::new();
    for (i, l) in lists.iter().enumerate() {
        match l.as_slice() {
            [] => return None,
            // A single mask is always chosen; ALL changes nothing.
            [m] => root = root.and(*m),
            _ => rem.push(i),
        }
    }
    if root.is_empty() {
        return None;
    }
    let mut s = Search::new(lists, bnp, within, all);
    s.dfs(root, &rem, rem_bits(&rem));
    s.best.map(|(m, _)| m)
}

/// The key of a mask, or a lower bound of the keys below a search node; smaller is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    class: u32,
    /// Σ D[i][j] (closest with exact distances), else 0.
    sum: u64,
    int: u128,
}

/// Distances as a dense matrix over the machine's nodes.
struct Distances {
    /// Index of a node id in the matrix.
    pos: [u8; MAX_NODES as usize],
    n: usize,
    d: Vec<u64>,
}

impl Distances {
    fn new(numa: &NumaInfo, all: NodeMask) -> Self {
        let mut pos = [0u8; MAX_NODES as usize];
        let ids: Vec<u32> = all.ids().collect();
        for (p, &id) in ids.iter().enumerate() {
            pos[id as usize] = p as u8;
        }
        let n = ids.len();
        let mut d = vec![0u64; n * n];
        for (a, &i) in ids.iter().enumerate() {
            let row = numa.distances.get(&i);
            for (b, &j) in ids.iter().enumerate() {
                // As NumaInfo::avg: a missing entry counts as 0.
                d[a * n + b] = row.and_then(|r| r.get(j as usize)).copied().unwrap_or(0);
            }
        }
        Self { pos, n, d }
    }

    fn max(&self) -> u64 {
        self.d.iter().copied().max().unwrap_or(0)
    }

    fn at(&self, i: u32, j: u32) -> u64 {
        self.d[self.pos[i as usize] as usize * self.n + self.pos[j as usize] as usize]
    }

    /// Σ D[i][j] over every ordered pair of `m`.
    fn sum(&self, m: NodeMask) -> u64 {
        m.ids()
            .map(|i| m.ids().map(|j| self.at(i, j)).sum::<u64>())
            .sum()
    }

    /// For each node `x` of `free`, twice a lower bound of what `x` adds to `sum(R)` in a mask
    /// `R = f ∪ X`, `x ∈ X ⊆ free`, `|X| = k`: its own and its pairs with `f` twice
    /// (`2·(D[x][x] + Σ_f D[x][f] + D[f][x])`), plus `(k−1)` times its cheapest pair inside
    /// `free` (`min_y D[x][y] + D[y][x]`; each pair of `X` is shared by two nodes). So
    /// `2·sum(R) ≥ 2·sum(f) + Σ_X value(x)`. Sorted ascending.
    fn values(&self, f: NodeMask, free: NodeMask, k: u32) -> Vec<(u64, u32)> {
        let mut v: Vec<(u64, u32)> = free
            .ids()
            .map(|x| {
                let own =
                    self.at(x, x) + f.ids().map(|y| self.at(x, y) + self.at(y, x)).sum::<u64>();
                let pair = if k > 1 {
                    free.ids()
                        .filter(|&y| y != x)
                        .map(|y| self.at(x, y) + self.at(y, x))
                        .min()
                        .unwrap_or(0)
                } else {
                    0
                };
                (2 * own + u64::from(k.saturating_sub(1)) * pair, x)
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// A lower bound of `sum(R)` over masks `R` with `f ⊆ R ⊆ f ∪ free`, `|R| = c`.
    fn sum_bound(&self, f: NodeMask, free: NodeMask, c: u32) -> u64 {
        let k = c - f.count();
        let v = self.values(f, free, k);
        let twice = 2 * self.sum(f) + v[..k as usize].iter().map(|e| e.0).sum::<u64>();
        twice.div_ceil(2)
    }

    /// Whether a mask `R`, `f ⊆ R ⊆ f ∪ free`, `|R| = c`, can have a smaller `(sum, int)` than
    /// `best`. With `T` = the bound of `2·sum(R)` from the `k = c − |f|` smallest values: `T`
    /// above `2·best.sum` → no; below → maybe. Equal → only a mask of sum exactly `best.sum`
    /// could, and each of its nodes `x` then has `value(x) ≤` the k-th smallest value (else
    /// swapping `x` in for that one would push the bound past `T`), so its `int` is at least
    /// that of `f` with the `k` lowest of those nodes.
    fn can_beat(&self, f: NodeMask, free: NodeMask, c: u32, best: (u64, u128)) -> bool {
        let k = (c - f.count()) as usize;
        let v = self.values(f, free, k as u32);
        let twice = 2 * self.sum(f) + v[..k].iter().map(|e| e.0).sum::<u64>();
        match twice.cmp(&(2 * best.0)) {
            Ordering::Less => return true,
            Ordering::Greater => return false,
            Ordering::Equal => {}
        }
        let Some(&(kth, _)) = k.checked_sub(1).and_then(|i| v.get(i)) else {
            return f.0 < best.1;
        };
        let eligible =
            NodeMask::from_ids(v.iter().filter(|e| e.0 <= kth).map(|e| e.1)).unwrap_or_default();
        f.or(lowest(eligible, k as u32)).0 < best.1
    }
}

/// How `within` is bounded.
enum Bound<'a> {
    /// By `int`.
    Int,
    /// By `(sum, int)`: closest with distances ≤ [`EXACT_DISTANCE`].
    Sum(Distances),
    /// Not at all: closest with larger distances; leaves compare with kubelet's `closest_cmp`.
    ClassOnly(&'a NumaInfo),
}

/// What one search node's lists say about the results below it.
struct Analysis {
    /// Nodes every non-empty result below contains.
    forced: NodeMask,
    /// Nodes a non-empty result below may contain.
    sp: NodeMask,
    /// Bounds of its count.
    lo: u32,
    hi: u32,
    /// Index in `rem` of the list to branch on.
    pick: usize,
}

struct Search<'a> {
    lists: &'a [Vec<NodeMask>],
    bnp: u32,
    bound: Bound<'a>,
    best: Option<(NodeMask, Key)>,
    memo: HashSet<(u128, NodeMask)>,
}

/// `rem` as a bit set, or `None` (no memo) with more than 128 lists.
fn rem_bits(rem: &[usize]) -> Option<u128> {
    rem.iter()
        .try_fold(0u128, |b, &i| if i < 128 { Some(b | 1 << i) } else { None })
}

/// The `k` lowest nodes of `m`.
fn lowest(m: NodeMask, k: u32) -> NodeMask {
    let (mut m, mut r) = (m.0, 0u128);
    for _ in 0..k {
        let b = m & m.wrapping_neg();
        r |= b;
        m ^= b;
    }
    NodeMask(r)
}

impl<'a> Search<'a> {
    fn new(lists: &'a [Vec<NodeMask>], bnp: u32, within: Within<'a>, all: NodeMask) -> Self {
        let bound = match within {
            Within::Narrowest => Bound::Int,
            Within::Closest(numa) => {
                let d = Distances::new(numa, all);
                if d.max() <= EXACT_DISTANCE {
                    Bound::Sum(d)
                } else {
                    Bound::ClassOnly(numa)
                }
            }
        };
        Self {
            lists,
            bnp,
            bound,
            best: None,
            memo: HashSet::new(),
        }
    }

    /// The rank of a count (`c ≥ 1`): bnp first, then below it the wider, then above it the
    /// narrower.
    fn class(&self, c: u32) -> u32 {
        match c.cmp(&self.bnp) {
            Ordering::Equal => 0,
            Ordering::Less => self.bnp - c,
            Ordering::Greater => c - 1,
        }
    }

    fn key(&self, m: NodeMask) -> Key {
        Key {
            class: self.class(m.count()),
            sum: match &self.bound {
                Bound::Sum(d) => d.sum(m),
                _ => 0,
            },
            int: m.0,
        }
    }

    /// The best key of masks `R`, `f ⊆ R ⊆ sp`, with a count in `[lo, hi]` (`1 ≤ lo ≤ hi`,
    /// `f ⊆ sp`, `|f| ≤ lo`, `hi ≤ |sp|`).
    fn bound_key(&self, f: NodeMask, sp: NodeMask, lo: u32, hi: u32) -> Key {
        let c = self.bnp.clamp(lo, hi);
        let free = NodeMask(sp.0 & !f.0);
        Key {
            class: self.class(c),
            sum: match &self.bound {
                Bound::Sum(d) => d.sum_bound(f, free, c),
                _ => 0,
            },
            int: f.or(lowest(free, c - f.count())).0,
        }
    }

    /// Whether a mask `R`, `f ⊆ R ⊆ sp`, with a count in `[lo, hi]`, can beat the best found so
    /// far (same conditions as [`Search::bound_key`], which it refines).
    fn can_beat(&self, f: NodeMask, sp: NodeMask, lo: u32, hi: u32) -> bool {
        let Some((_, best)) = &self.best else {
            return true;
        };
        let c = self.bnp.clamp(lo, hi);
        let class = self.class(c);
        if class != best.class {
            return class < best.class;
        }
        let free = NodeMask(sp.0 & !f.0);
        match &self.bound {
            Bound::ClassOnly(_) => true,
            Bound::Int => f.or(lowest(free, c - f.count())).0 < best.int,
            Bound::Sum(d) => d.can_beat(f, free, c, (best.sum, best.int)),
        }
    }

    /// Nothing with this bound can beat the best found so far.
    fn dominated(&self, bound: Key) -> bool {
        match (&self.best, &self.bound) {
            (None, _) => false,
            (Some((_, best)), Bound::ClassOnly(_)) => bound.class > best.class,
            (Some((_, best)), _) => bound >= *best,
        }
    }

    /// A reachable non-empty result.
    fn offer(&mut self, m: NodeMask) {
        let key = self.key(m);
        let better = match (&self.best, &self.bound) {
            (None, _) => true,
            (Some((b, bk)), Bound::ClassOnly(numa)) if bk.class == key.class => {
                numa.closest_cmp(m, *b).is_lt()
            }
            (Some((_, bk)), _) => key < *bk,
        };
        if better {
            self.best = Some((m, key));
        }
    }

    /// `None`: no non-empty result below `(s, rem)`.
    fn analyse(&self, s: NodeMask, rem: &[usize]) -> Option<Analysis> {
        let (mut sp, mut forced, mut hi) = (s, s, s.count());
        let mut pick = (0, (u32::MAX, usize::MAX));
        for (at, &j) in rem.iter().enumerate() {
            let (mut union, mut inter, mut widest, mut meets) = (NodeMask::EMPTY, s, 0, 0);
            for &m in &self.lists[j] {
                let c = s.and(m);
                if !c.is_empty() {
                    union = union.or(c);
                    inter = inter.and(c);
                    widest = widest.max(c.count());
                    meets += 1;
                }
            }
            if meets == 0 {
                return None;
            }
            sp = sp.and(union);
            forced = forced.and(inter);
            hi = hi.min(widest);
            if (widest, meets) < pick.1 {
                pick = (at, (widest, meets));
            }
        }
        let hi = hi.min(sp.count());
        let lo = forced.count().max(1);
        if lo > hi {
            return None;
        }
        Some(Analysis {
            forced,
            sp,
            lo,
            hi,
            pick: pick.0,
        })
    }

    fn dfs(&mut self, s: NodeMask, rem: &[usize], bits: Option<u128>) {
        if rem.is_empty() {
            self.offer(s);
            return;
        }
        let Some(a) = self.analyse(s, rem) else {
            return;
        };
        if !self.can_beat(a.forced, a.sp, a.lo, a.hi) {
            return;
        }
        if a.forced == s {
            // Every list has a mask containing `s` and none meets `s` in less.
            self.offer(s);
            return;
        }
        if let Some(b) = bits {
            if self.memo.contains(&(b, s)) {
                return;
            }
            if self.memo.len() < MEMO_CAP {
                self.memo.insert((b, s));
            }
        }
        let pick = rem[a.pick];
        let next: Vec<usize> = rem.iter().copied().filter(|&j| j != pick).collect();
        let next_bits = bits.map(|b| b & !(1u128 << pick));
        let mut children: Vec<NodeMask> = self.lists[pick]
            .iter()
            .map(|&m| s.and(m))
            .filter(|c| !c.is_empty())
            .collect();
        children.sort_unstable();
        children.dedup();
        if next.is_empty() {
            for c in children {
                self.offer(c);
            }
            return;
        }
        let mut keyed: Vec<(Key, u32, NodeMask)> = children
            .into_iter()
            .map(|c| {
                (
                    self.bound_key(NodeMask::EMPTY, c, 1, c.count()),
                    c.count(),
                    c,
                )
            })
            .collect();
        // Best bound first; among equal bounds the narrowest child, closest to its bound.
        keyed.sort_unstable();
        for (bound, _, c) in keyed {
            if self.dominated(bound) {
                break;
            }
            if self.can_beat(NodeMask::EMPTY, c, 1, c.count()) {
                self.dfs(c, &next, next_bits);
            }
        }
    }
}
