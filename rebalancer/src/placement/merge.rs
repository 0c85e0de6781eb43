//! The Topology Manager hint merge, exactly as kubelet's `policy.go` (see
//! ../shared/design/hint-merge.md): policies none / best-effort / restricted / single-numa-node,
//! the prefer-closest-numa-nodes option, admission per policy, container and pod scopes.
//!
//! Two engines compute the same result:
//! - [`merge_enumerate`] walks the cartesian product of the hint lists literally, as kubelet does
//!   (exponential: the reference, used by the property tests);
//! - [`merge`] gives an identical result without the product, fast beyond 8 nodes. Why it is
//!   exact:
//!   1. `compare` is a *total order* on non-empty merged hints (preferred first; among preferred,
//!      `fit`; among non-preferred, count == bnp first, then counts below bnp widest first, then
//!      counts above bnp narrowest first, `fit` within a count). `fit` itself orders by (count,
//!      int) or (count, avg distance, int). Two merged hints that tie are identical, so kubelet's
//!      fold returns the maximum of the *set* of merged hints whatever the iteration order — and
//!      so also whatever the order of resources inside a provider (a Go map has none).
//!   2. A merged hint is preferred iff every hint is preferred and every non-none affinity equals
//!      the first one, `F`. So the preferred results are exactly `ALL ∩ F` for each `F` that every
//!      list offers as a preferred hint (or covers with a preferred none-affinity hint), plus `ALL`
//!      when every list has a preferred none-affinity hint. Checked in O(hints × lists).
//!   3. If one of those is non-empty it beats every non-preferred result. Otherwise every
//!      non-empty combination is non-preferred and only its mask matters: the best AND of one
//!      mask per list is found by the branch-and-bound of `merge_search` (its header has the
//!      proof), in memory linear in the hints.
//!
//! Resource order inside a provider is the map's order (`BTreeMap`: by name); by 1. it does not
//! change the result, and the property test checks that too.

use std::collections::{BTreeMap, HashSet};

use super::mask::{NodeMask, TopologyHint};
use super::merge_search::{self, Within};
use super::numa_info::{narrowest_cmp, NumaInfo};
pub use crate::config::TopologyPolicy as MergePolicy;

/// kubelet's default (and minimum) `max-allowable-numa-nodes`.
pub const DEFAULT_MAX_ALLOWABLE_NUMA_NODES: u32 = 8;

/// One provider's hints: `None` = the provider returned a nil map; per resource, `None` = nil
/// list ("no preference"), `Some(vec![])` = empty list ("no possible placement").
pub type ProviderHints = Option<BTreeMap<String, Option<Vec<TopologyHint>>>>;

/// Topology Manager policy options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MergeOptions {
    pub prefer_closest_numa: bool,
    /// `None` = kubelet's default, [`DEFAULT_MAX_ALLOWABLE_NUMA_NODES`]. kubelet refuses to start
    /// a non-none policy on a machine with more nodes; the merge itself does not use it (ours
    /// stays fast beyond 8 nodes). See [`MergeOptions::check`].
    pub max_allowable_numa_nodes: Option<u32>,
}

/// Why options cannot be used (kubelet's own start-up checks).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error("max-allowable-numa-nodes is {0}; kubelet requires at least {DEFAULT_MAX_ALLOWABLE_NUMA_NODES}")]
    MaxAllowableTooSmall(u32),
    #[error("prefer-closest-numa-nodes needs NUMA distances: {0}")]
    Distances(#[from] super::numa_info::NumaInfoError),
}

impl MergeOptions {
    pub fn from_config(c: &crate::config::PlacementConfig) -> Self {
        Self {
            prefer_closest_numa: c.prefer_closest_numa_nodes,
            max_allowable_numa_nodes: Some(c.max_allowable_numa_nodes),
        }
    }

    pub fn max_allowable(&self) -> u32 {
        self.max_allowable_numa_nodes
            .unwrap_or(DEFAULT_MAX_ALLOWABLE_NUMA_NODES)
    }

    /// The checks kubelet makes on its options before merging anything (none under policy
    /// `none`: kubelet's `NewManager` returns before reading them): the option value is at
    /// least 8; with closest-NUMA, a distance row for every node (`NewNUMAInfo`, for every
    /// other policy, single-numa-node too though it never uses them), and rows long enough to
    /// average over every mask where `fit` uses them. (kubelet also refuses machines with more
    /// nodes than `max_allowable`; we do not — callers that want kubelet's refusal compare
    /// `numa.nodes.len()` with [`MergeOptions::max_allowable`].)
    pub fn check(&self, policy: MergePolicy, numa: &NumaInfo) -> Result<(), OptionsError> {
        if policy == MergePolicy::None {
            return Ok(());
        }
        if let Some(m) = self.max_allowable_numa_nodes {
            if m < DEFAULT_MAX_ALLOWABLE_NUMA_NODES {
                return Err(OptionsError::MaxAllowableTooSmall(m));
            }
        }
        if uses_closest(policy, self) {
            numa.check_distances()?;
        } else if self.prefer_closest_numa {
            numa.check_rows()?;
        }
        Ok(())
    }
}

fn uses_closest(policy: MergePolicy, opts: &MergeOptions) -> bool {
    opts.prefer_closest_numa && matches!(policy, MergePolicy::BestEffort | MergePolicy::Restricted)
}

/// A merged hint and whether the policy admits it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MergeDecision {
    pub hint: TopologyHint,
    pub admit: bool,
}

/// Admission: none and best-effort always admit; restricted and single-numa-node only a
/// preferred hint.
pub fn admit(policy: MergePolicy, hint: &TopologyHint) -> bool {
    match policy {
        MergePolicy::None | MergePolicy::BestEffort => true,
        MergePolicy::Restricted | MergePolicy::SingleNumaNode => hint.preferred,
    }
}

/// The merged hint (fast engine).
pub fn merge(
    policy: MergePolicy,
    opts: &MergeOptions,
    numa: &NumaInfo,
    providers: &[ProviderHints],
) -> TopologyHint {
    merge_with(policy, opts, numa, providers, Engine::Search)
}

/// The merged hint by plain enumeration of the cartesian product (kubelet's algorithm; the
/// reference for tests — exponential in the number of hint lists).
pub fn merge_enumerate(
    policy: MergePolicy,
    opts: &MergeOptions,
    numa: &NumaInfo,
    providers: &[ProviderHints],
) -> TopologyHint {
    merge_with(policy, opts, numa, providers, Engine::Enumerate)
}

/// The merged hint by the previous fast engine: the preferred check, then the set of reachable
/// masks built list by list (exact, but up to 2^N masks of work per list with kubelet-shaped
/// hints). A reference: tests compare it with [`merge`] beyond 8 nodes, where the enumeration is
/// too slow, and the bench measures both.
pub fn merge_reachable(
    policy: MergePolicy,
    opts: &MergeOptions,
    numa: &NumaInfo,
    providers: &[ProviderHints],
) -> TopologyHint {
    merge_with(policy, opts, numa, providers, Engine::Reach)
}

/// Which engine [`merge_with`] runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Engine {
    /// The cartesian product (kubelet's algorithm).
    Enumerate,
    /// The preferred check, then the branch-and-bound search.
    Search,
    /// The preferred check, then the reachable-set engine.
    Reach,
}

/// Merge and admit: what the admission code calls for one set of provider hints.
pub fn decide(
    policy: MergePolicy,
    opts: &MergeOptions,
    numa: &NumaInfo,
    providers: &[ProviderHints],
) -> MergeDecision {
    let hint = merge(policy, opts, numa, providers);
    MergeDecision {
        hint,
        admit: admit(policy, &hint),
    }
}

/// Pod scope: the providers' pod-level hints (kubelet's `GetPodTopologyHints`) merged once; every
/// container of the pod gets this decision.
pub fn merge_pod(
    policy: MergePolicy,
    opts: &MergeOptions,
    numa: &NumaInfo,
    pod_providers: &[ProviderHints],
) -> MergeDecision {
    decide(policy, opts, numa, pod_providers)
}

/// Container scope: each container's providers' hints merged on their own, in container order.
/// The pod is admitted only if every container is.
pub fn merge_containers(
    policy: MergePolicy,
    opts: &MergeOptions,
    numa: &NumaInfo,
    per_container: &[Vec<ProviderHints>],
) -> Vec<MergeDecision> {
    per_container
        .iter()
        .map(|providers| decide(policy, opts, numa, providers))
        .collect()
}

/// Step 1: providers → hint lists (nil / empty map → `[{none, true}]`; nil list →
/// `[{none, true}]`; empty list → `[{none, false}]`).
pub fn normalise(providers: &[ProviderHints]) -> Vec<Vec<TopologyHint>> {
    let dont_care = vec![TopologyHint::new(None, true)];
    let mut lists = Vec::new();
    for p in providers {
        match p {
            None => lists.push(dont_care.clone()),
            Some(map) if map.is_empty() => lists.push(dont_care.clone()),
            Some(map) => {
                for hints in map.values() {
                    lists.push(match hints {
                        None => dont_care.clone(),
                        Some(h) if h.is_empty() => vec![TopologyHint::new(None, false)],
                        Some(h) => h.clone(),
                    });
                }
            }
        }
    }
    lists
}

/// Step 2 (single-numa-node): keep preferred hints with no affinity or exactly one node.
pub fn filter_single_numa(lists: Vec<Vec<TopologyHint>>) -> Vec<Vec<TopologyHint>> {
    lists
        .into_iter()
        .map(|l| {
            l.into_iter()
                .filter(|h| h.preferred && h.affinity.is_none_or(|a| a.count() == 1))
                .collect()
        })
        .collect()
}

/// Step 3: the largest, over lists, of the popcount of the list's narrowest non-none affinity.
pub fn best_non_preferred_count(lists: &[Vec<TopologyHint>]) -> u32 {
    lists
        .iter()
        .filter_map(|l| {
            l.iter()
                .filter_map(|h| h.affinity)
                .min_by(|a, b| narrowest_cmp(*a, *b))
        })
        .map(NodeMask::count)
        .max()
        .unwrap_or(0)
}

fn merge_with(
    policy: MergePolicy,
    opts: &MergeOptions,
    numa: &NumaInfo,
    providers: &[ProviderHints],
    engine: Engine,
) -> TopologyHint {
    if policy == MergePolicy::None {
        return TopologyHint::new(None, false);
    }
    let mut lists = normalise(providers);
    if policy == MergePolicy::SingleNumaNode {
        lists = filter_single_numa(lists);
    }
    let merger = Merger {
        numa,
        all: numa.all(),
        bnp: best_non_preferred_count(&lists),
        closest: uses_closest(policy, opts),
    };
    let hint = match engine {
        Engine::Enumerate => merger.best_enumerated(&lists),
        _ => merger.best_pruned(&lists, engine),
    };
    if policy == MergePolicy::SingleNumaNode && hint.affinity == Some(merger.all) {
        return TopologyHint::new(None, hint.preferred);
    }
    hint
}

/// The state shared by both engines: `ALL`, `bnp` and which `fit` to use.
struct Merger<'a> {
    numa: &'a NumaInfo,
    all: NodeMask,
    bnp: u32,
    closest: bool,
}

impl Merger<'_> {
    fn fallback(&self) -> TopologyHint {
        TopologyHint::new(Some(self.all), false)
    }

    /// `fit`: equal masks keep `cur`; otherwise the closest or the narrowest.
    fn fit(&self, cur: TopologyHint, cand: TopologyHint) -> TopologyHint {
        let (c, n) = (mask_of(cur), mask_of(cand));
        if c == n {
            return cur;
        }
        let ord = if self.closest {
            self.numa.closest_cmp(c, n)
        } else {
            narrowest_cmp(c, n)
        };
        if ord.is_le() {
            cur
        } else {
            cand
        }
    }

    /// kubelet's `HintMerger.compare`, case by case.
    fn compare(&self, cur: Option<TopologyHint>, cand: TopologyHint) -> Option<TopologyHint> {
        let n = mask_of(cand).count();
        if n == 0 {
            return cur;
        }
        let Some(cur) = cur else {
            return Some(cand);
        };
        Some(match (cur.preferred, cand.preferred) {
            (false, true) => cand,
            (true, false) => cur,
            (true, true) => self.fit(cur, cand),
            (false, false) => {
                let (c, bnp) = (mask_of(cur).count(), self.bnp);
                if c > bnp {
                    self.fit(cur, cand)
                } else if c == bnp {
                    if n == bnp {
                        self.fit(cur, cand)
                    } else {
                        cur
                    }
                } else if n > bnp {
                    cur
                } else if n == bnp || n > c {
                    // steer to bnp; otherwise, below it, the wider of the two
                    cand
                } else if n < c {
                    cur
                } else {
                    self.fit(cur, cand)
                }
            }
        })
    }

    /// kubelet's `mergePermutation`.
    fn merge_permutation(&self, perm: &[TopologyHint]) -> TopologyHint {
        let mut preferred = true;
        let mut first: Option<NodeMask> = None;
        let mut aff = self.all;
        for h in perm {
            if let Some(a) = h.affinity {
                let f = *first.get_or_insert(a);
                if a != f {
                    preferred = false;
                }
                aff = aff.and(a);
            }
            if !h.preferred {
                preferred = false;
            }
        }
        TopologyHint::new(Some(aff), preferred)
    }

    /// The reference engine: every combination, folded through `compare`.
    fn best_enumerated(&self, lists: &[Vec<TopologyHint>]) -> TopologyHint {
        fn walk(
            m: &Merger,
            lists: &[Vec<TopologyHint>],
            acc: &mut Vec<TopologyHint>,
            best: &mut Option<TopologyHint>,
        ) {
            let Some((first, rest)) = lists.split_first() else {
                *best = m.compare(*best, m.merge_permutation(acc));
                return;
            };
            for h in first {
                acc.push(*h);
                walk(m, rest, acc, best);
                acc.pop();
            }
        }
        let mut best = None;
        walk(self, lists, &mut Vec::new(), &mut best);
        best.unwrap_or_else(|| self.fallback())
    }

    /// The fast engine (see the module header for why it equals `best_enumerated`).
    fn best_pruned(&self, lists: &[Vec<TopologyHint>], engine: Engine) -> TopologyHint {
        if lists.iter().any(Vec::is_empty) {
            return self.fallback();
        }
        if let Some(best) = self.best_preferred(lists) {
            return best;
        }
        let masks = self.distinct_masks(lists);
        let best = if engine == Engine::Reach {
            masks.and_then(|m| self.best_reachable(m))
        } else {
            masks.and_then(|m| self.best_non_preferred(&m))
        };
        best.unwrap_or_else(|| self.fallback())
    }

    /// The best non-empty preferred merged hint, if any.
    fn best_preferred(&self, lists: &[Vec<TopologyHint>]) -> Option<TopologyHint> {
        struct ListPrefs {
            dont_care: bool,
            masks: HashSet<NodeMask>,
        }
        let prefs: Vec<ListPrefs> = lists
            .iter()
            .map(|l| ListPrefs {
                dont_care: l.iter().any(|h| h.preferred && h.affinity.is_none()),
                masks: l
                    .iter()
                    .filter(|h| h.preferred)
                    .filter_map(|h| h.affinity)
                    .collect(),
            })
            .collect();
        let mut best = None;
        if prefs.iter().all(|p| p.dont_care) {
            best = self.compare(best, TopologyHint::new(Some(self.all), true));
        }
        let mut seen = HashSet::new();
        for p in &prefs {
            for &f in &p.masks {
                if seen.insert(f) && prefs.iter().all(|q| q.dont_care || q.masks.contains(&f)) {
                    best = self.compare(best, TopologyHint::new(Some(f.and(self.all)), true));
                }
            }
        }
        best
    }

    /// Every list's distinct non-empty masks within ALL (none-affinity = ALL); `None` when a
    /// list has none, or ALL is empty: then every merged mask is empty.
    fn distinct_masks(&self, lists: &[Vec<TopologyHint>]) -> Option<Vec<Vec<NodeMask>>> {
        if self.all.is_empty() {
            return None;
        }
        lists
            .iter()
            .map(|l| {
                let mut seen = HashSet::new();
                let masks: Vec<NodeMask> = l
                    .iter()
                    .map(|h| h.affinity.map_or(self.all, |a| a.and(self.all)))
                    .filter(|m| !m.is_empty() && seen.insert(*m))
                    .collect();
                (!masks.is_empty()).then_some(masks)
            })
            .collect()
    }

    /// The best non-empty merged mask, ignoring preference (called when no preferred result
    /// exists, so every non-empty result is non-preferred).
    fn best_non_preferred(&self, per_list: &[Vec<NodeMask>]) -> Option<TopologyHint> {
        let within = if self.closest {
            Within::Closest(self.numa)
        } else {
            Within::Narrowest
        };
        merge_search::best_mask(per_list, self.all, self.bnp, within)
            .map(|m| TopologyHint::new(Some(m), false))
    }

    /// The previous engine, kept as a reference: the set of reachable masks, list by list.
    fn best_reachable(&self, mut per_list: Vec<Vec<NodeMask>>) -> Option<TopologyHint> {
        // Lists with a single mask first keep the reachable set small; a list whose only mask
        // is ALL changes nothing.
        per_list.retain(|l| l.as_slice() != [self.all]);
        per_list.sort_by_key(Vec::len);
        let mut reach: Vec<NodeMask> = vec![self.all];
        for masks in &per_list {
            let mut seen = HashSet::with_capacity(reach.len() * 2);
            let mut next = Vec::new();
            for &s in &reach {
                for &m in masks {
                    let r = s.and(m);
                    if !r.is_empty() && seen.insert(r) {
                        next.push(r);
                    }
                }
            }
            if next.is_empty() {
                return None;
            }
            reach = next;
        }
        reach.into_iter().fold(None, |best, m| {
            self.compare(best, TopologyHint::new(Some(m), false))
        })
    }
}

fn mask_of(h: TopologyHint) -> NodeMask {
    h.affinity.unwrap_or_default()
}

#[cfg(test)]
#[path = "merge_tests.rs"]
mod tests;
