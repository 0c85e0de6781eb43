//! `NumaInfo`: the machine's NUMA node ids and distance rows, and the two mask orderings the
//! Topology Manager merge uses — `narrowest` (popcount, then integer value) and `closest`
//! (popcount, then mean distance, then integer value), as kubelet's `numa_info.go` defines them.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::mask::NodeMask;

/// Why a `NumaInfo` cannot serve `closest` comparisons.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NumaInfoError {
    #[error("no distance row for node {node}")]
    MissingRow { node: u32 },
    #[error("the distance row of node {node} has {len} entries; node {needed} needs one")]
    ShortRow { node: u32, len: usize, needed: u32 },
}

/// The machine's NUMA nodes and their distance matrix (`distances[i][j]`, rows by node id, as in
/// `/sys/devices/system/node/node<i>/distance`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NumaInfo {
    pub nodes: Vec<u32>,
    pub distances: BTreeMap<u32, Vec<u64>>,
}

impl NumaInfo {
    pub fn new(nodes: Vec<u32>, distances: BTreeMap<u32, Vec<u64>>) -> Self {
        Self { nodes, distances }
    }

    /// Nodes without distances (enough for every policy unless prefer-closest-numa is on).
    pub fn without_distances(nodes: Vec<u32>) -> Self {
        Self {
            nodes,
            distances: BTreeMap::new(),
        }
    }

    /// `ALL`: the mask of every machine node (ids >= 128 are not representable and are skipped;
    /// callers validate ids before building a `NumaInfo`).
    pub fn all(&self) -> NodeMask {
        NodeMask::from_ids(
            self.nodes
                .iter()
                .copied()
                .filter(|&n| n < super::mask::MAX_NODES),
        )
        .unwrap_or_default()
    }

    /// kubelet's `NewNUMAInfo` with closest-NUMA: a distance row for every node.
    pub fn check_rows(&self) -> Result<(), NumaInfoError> {
        match self.nodes.iter().find(|n| !self.distances.contains_key(n)) {
            Some(&node) => Err(NumaInfoError::MissingRow { node }),
            None => Ok(()),
        }
    }

    /// Checks that `avg()` can be computed for every mask of machine nodes: a row per node, each
    /// long enough to index every node id.
    pub fn check_distances(&self) -> Result<(), NumaInfoError> {
        self.check_rows()?;
        let Some(&max) = self.nodes.iter().max() else {
            return Ok(());
        };
        for &n in &self.nodes {
            let row = &self.distances[&n];
            if row.len() <= max as usize {
                return Err(NumaInfoError::ShortRow {
                    node: n,
                    len: row.len(),
                    needed: max,
                });
            }
        }
        Ok(())
    }

    /// kubelet's `CalculateAverageFor`: the mean of `D[i][j]` over all ordered pairs of the mask,
    /// summed in the same order and in the same floating-point type as kubelet. Missing entries
    /// count as 0 (never reached once `check_distances` passed).
    pub fn avg(&self, m: NodeMask) -> f64 {
        if m.is_empty() {
            return 0.0;
        }
        let (mut sum, mut count) = (0f64, 0f64);
        for i in m.ids() {
            let row = self.distances.get(&i);
            for j in m.ids() {
                sum += row.and_then(|r| r.get(j as usize)).copied().unwrap_or(0) as f64;
                count += 1.0;
            }
        }
        sum / count
    }

    /// `Ordering::Less` when `a` is the closer of two masks: fewer nodes, then the smaller mean
    /// distance, then the smaller integer value.
    pub fn closest_cmp(&self, a: NodeMask, b: NodeMask) -> Ordering {
        a.count().cmp(&b.count()).then_with(|| {
            let (da, db) = (self.avg(a), self.avg(b));
            // Distances are finite, so partial_cmp never fails; Equal falls through to the int.
            da.partial_cmp(&db)
                .unwrap_or(Ordering::Equal)
                .then(a.0.cmp(&b.0))
        })
    }
}

/// `Ordering::Less` when `a` is narrower than `b` (popcount, then integer value).
pub fn narrowest_cmp(a: NodeMask, b: NodeMask) -> Ordering {
    a.count().cmp(&b.count()).then(a.0.cmp(&b.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(ids: &[u32]) -> NodeMask {
        NodeMask::from_ids(ids.iter().copied()).unwrap()
    }

    fn four() -> NumaInfo {
        let d = [
            [10, 11, 12, 12],
            [11, 10, 12, 12],
            [12, 12, 10, 11],
            [12, 12, 11, 10],
        ];
        NumaInfo::new(
            vec![0, 1, 2, 3],
            d.iter()
                .enumerate()
                .map(|(i, r)| (i as u32, r.to_vec()))
                .collect(),
        )
    }

    #[test]
    fn avg_counts_every_ordered_pair_including_diagonal() {
        let n = four();
        assert_eq!(n.avg(m(&[0, 1])), (10.0 + 11.0 + 11.0 + 10.0) / 4.0);
        assert_eq!(n.avg(m(&[0])), 10.0);
        assert_eq!(n.avg(NodeMask::EMPTY), 0.0);
    }

    #[test]
    fn closest_prefers_count_then_distance_then_int() {
        let n = four();
        assert_eq!(n.closest_cmp(m(&[3]), m(&[0, 1])), Ordering::Less);
        // {2,3} (avg 10.5) is closer than {0,2} (avg 11).
        assert_eq!(n.closest_cmp(m(&[2, 3]), m(&[0, 2])), Ordering::Less);
        // {0,1} and {2,3} tie on distance: the smaller integer wins.
        assert_eq!(n.closest_cmp(m(&[0, 1]), m(&[2, 3])), Ordering::Less);
        assert_eq!(narrowest_cmp(m(&[1, 2]), m(&[0, 3])), Ordering::Less);
    }

    #[test]
    fn check_distances_names_the_missing_or_short_row() {
        let mut n = four();
        assert_eq!(n.check_distances(), Ok(()));
        n.distances.get_mut(&2).unwrap().truncate(3);
        assert_eq!(
            n.check_distances(),
            Err(NumaInfoError::ShortRow {
                node: 2,
                len: 3,
                needed: 3
            })
        );
        n.distances.remove(&1);
        assert_eq!(
            n.check_distances(),
            Err(NumaInfoError::MissingRow { node: 1 })
        );
        assert_eq!(
            NumaInfo::without_distances(vec![]).check_distances(),
            Ok(())
        );
    }
}
