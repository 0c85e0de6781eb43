//! `NodeMask` (a set of NUMA node ids, up to 128) and `TopologyHint` — kubelet's bitmask and
//! hint types. Ordering helpers follow ../shared/design/hint-merge.md: `narrower` compares the
//! popcount, then the integer value of the mask.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Largest node id + 1 a mask can hold.
pub const MAX_NODES: u32 = 128;

/// A set of NUMA node ids as a bitmask (`int(m)` = Σ 2^id).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeMask(pub u128);

impl NodeMask {
    pub const EMPTY: NodeMask = NodeMask(0);

    /// A mask of the given ids; `None` if an id is >= [`MAX_NODES`].
    pub fn from_ids<I: IntoIterator<Item = u32>>(ids: I) -> Option<NodeMask> {
        let mut m = 0u128;
        for id in ids {
            if id >= MAX_NODES {
                return None;
            }
            m |= 1 << id;
        }
        Some(NodeMask(m))
    }

    pub fn single(id: u32) -> NodeMask {
        debug_assert!(id < MAX_NODES);
        NodeMask(1u128 << id)
    }

    pub fn count(self) -> u32 {
        self.0.count_ones()
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn contains(self, id: u32) -> bool {
        id < MAX_NODES && self.0 & (1 << id) != 0
    }

    pub fn and(self, o: NodeMask) -> NodeMask {
        NodeMask(self.0 & o.0)
    }

    pub fn or(self, o: NodeMask) -> NodeMask {
        NodeMask(self.0 | o.0)
    }

    pub fn is_subset_of(self, o: NodeMask) -> bool {
        self.0 & !o.0 == 0
    }

    /// Ids in ascending order.
    pub fn ids(self) -> impl Iterator<Item = u32> {
        let mut m = self.0;
        std::iter::from_fn(move || {
            if m == 0 {
                return None;
            }
            let b = m.trailing_zeros();
            m &= m - 1;
            Some(b)
        })
    }

    /// kubelet's `IsNarrowerThan`: fewer nodes, or as many and a smaller integer value.
    pub fn narrower_than(self, o: NodeMask) -> bool {
        let (a, b) = (self.count(), o.count());
        a < b || (a == b && self.0 < o.0)
    }

    /// As a cpuset-style set (for cpuset.mems).
    pub fn to_cpuset(self) -> crate::cpuset::CpuSet {
        self.ids().collect()
    }
}

impl fmt::Debug for NodeMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.ids()).finish()
    }
}

impl Serialize for NodeMask {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.ids())
    }
}

impl<'de> Deserialize<'de> for NodeMask {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let ids = Vec::<u32>::deserialize(d)?;
        NodeMask::from_ids(ids)
            .ok_or_else(|| serde::de::Error::custom(format!("node id must be below {MAX_NODES}")))
    }
}

/// A provider's hint: a NUMA affinity (`None` = "no preference") and whether it is preferred.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TopologyHint {
    pub affinity: Option<NodeMask>,
    pub preferred: bool,
}

impl TopologyHint {
    pub fn new(affinity: Option<NodeMask>, preferred: bool) -> Self {
        Self {
            affinity,
            preferred,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrower_is_an_integer_comparison() {
        let m12 = NodeMask::from_ids([1, 2]).unwrap();
        let m03 = NodeMask::from_ids([0, 3]).unwrap();
        assert!(m12.narrower_than(m03));
        assert!(NodeMask::single(5).narrower_than(m12));
        assert!(!m12.narrower_than(m12));
        assert_eq!(
            NodeMask::from_ids([127]).unwrap().ids().collect::<Vec<_>>(),
            vec![127]
        );
        assert!(NodeMask::from_ids([128]).is_none());
    }
}
