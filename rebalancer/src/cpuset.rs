//! `CpuSet`: a set of small integer ids (CPUs or NUMA nodes) and the kernel's cpulist format.
//!
//! The kernel writes CPU and node sets as "cpulists" (`0-3,8,10-11`, empty for none), used by
//! sysfs (`node0/cpulist`, `thread_siblings_list`) and cgroupfs (`cpuset.cpus`, `cpuset.mems`).
//! The set is a growable bitset, its first two words inline (no heap allocation for ids below
//! 128: every node set, and the CPU sets of small machines — the planner builds tens of
//! thousands of node sets per round); it serialises to JSON as a sorted array of integers.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use smallvec::SmallVec;

/// Largest id accepted from a cpulist (the kernel's NR_CPUS ceiling is 8192).
pub const MAX_ID: u32 = 1 << 16;

/// A set of CPU (or node) ids. Invariant: no trailing zero words, so `==` is set equality.
#[derive(Clone, Default)]
pub struct CpuSet {
    words: SmallVec<[u64; 2]>,
}

// Word by word, not the slice `==` (a `memcmp` call): these sets are a few words, and the
// planner compares tens of thousands of node sets per round.
impl PartialEq for CpuSet {
    fn eq(&self, other: &Self) -> bool {
        self.words.len() == other.words.len()
            && self.words.iter().zip(&other.words).all(|(a, b)| a == b)
    }
}

impl Eq for CpuSet {}

impl std::hash::Hash for CpuSet {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.words.hash(state);
    }
}

/// Why a cpulist could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseCpuListError {
    #[error("invalid cpulist item {item:?}: expected N or N-M")]
    BadItem { item: String },
    #[error("invalid cpulist range {item:?}: start is after end")]
    Reversed { item: String },
    #[error("cpulist id {id} is above the supported maximum {MAX_ID}")]
    TooLarge { id: u64 },
}

impl CpuSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses a kernel cpulist (`"0-3,8"`; surrounding whitespace and an empty list accepted).
    /// Only the form the kernel prints is accepted, so a typo is an error, not a surprise.
    pub fn parse(s: &str) -> Result<Self, ParseCpuListError> {
        let mut set = CpuSet::new();
        let s = s.trim();
        if s.is_empty() {
            return Ok(set);
        }
        for item in s.split(',') {
            let item = item.trim();
            let num = |t: &str| -> Result<u32, ParseCpuListError> {
                if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(ParseCpuListError::BadItem {
                        item: item.to_string(),
                    });
                }
                let v: u64 = t.parse().map_err(|_| ParseCpuListError::BadItem {
                    item: item.to_string(),
                })?;
                if v >= MAX_ID as u64 {
                    return Err(ParseCpuListError::TooLarge { id: v });
                }
                Ok(v as u32)
            };
            match item.split_once('-') {
                None => set.insert(num(item)?),
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    if a > b {
                        return Err(ParseCpuListError::Reversed {
                            item: item.to_string(),
                        });
                    }
                    for id in a..=b {
                        set.insert(id);
                    }
                }
            }
        }
        Ok(set)
    }

    /// The set of `id` alone: built in place for an id below 128 (the planner makes one per
    /// node of every candidate).
    #[inline]
    pub fn one(id: u32) -> Self {
        match id / 64 {
            0 => CpuSet {
                words: SmallVec::from_buf_and_len([1 << id, 0], 1),
            },
            1 => CpuSet {
                words: SmallVec::from_buf([0, 1 << (id % 64)]),
            },
            _ => {
                let mut s = CpuSet::new();
                s.insert(id);
                s
            }
        }
    }

    pub fn insert(&mut self, id: u32) {
        let (w, b) = ((id / 64) as usize, id % 64);
        // Grown by push, not `resize` (a generic extend: slow for the one word a node set needs).
        while self.words.len() <= w {
            self.words.push(0);
        }
        self.words[w] |= 1 << b;
    }

    pub fn remove(&mut self, id: u32) {
        let (w, b) = ((id / 64) as usize, id % 64);
        if let Some(word) = self.words.get_mut(w) {
            *word &= !(1 << b);
        }
        self.trim();
    }

    pub fn contains(&self, id: u32) -> bool {
        let (w, b) = ((id / 64) as usize, id % 64);
        self.words.get(w).is_some_and(|word| word & (1 << b) != 0)
    }

    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Ids in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let b = w.trailing_zeros();
                w &= w - 1;
                Some(i as u32 * 64 + b)
            })
        })
    }

    pub fn first(&self) -> Option<u32> {
        self.iter().next()
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        let n = self.words.len().max(other.words.len());
        let words = (0..n)
            .map(|i| {
                self.words.get(i).copied().unwrap_or(0) | other.words.get(i).copied().unwrap_or(0)
            })
            .collect();
        CpuSet { words }
    }

    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        let words = self
            .words
            .iter()
            .zip(&other.words)
            .map(|(a, b)| a & b)
            .collect();
        let mut s = CpuSet { words };
        s.trim();
        s
    }

    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        let words = self
            .words
            .iter()
            .enumerate()
            .map(|(i, a)| a & !other.words.get(i).copied().unwrap_or(0))
            .collect();
        let mut s = CpuSet { words };
        s.trim();
        s
    }

    /// Adds every CPU of `other` in place (no allocation when `self` is already as wide).
    pub fn union_with(&mut self, other: &CpuSet) {
        if self.words.len() < other.words.len() {
            self.words.resize(other.words.len(), 0);
        }
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= b;
        }
    }

    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.words
            .iter()
            .enumerate()
            .all(|(i, a)| a & !other.words.get(i).copied().unwrap_or(0) == 0)
    }

    pub fn is_disjoint(&self, other: &CpuSet) -> bool {
        self.words.iter().zip(&other.words).all(|(a, b)| a & b == 0)
    }

    /// The order of the two sets' ascending id lists, compared lexicographically (as
    /// `self.iter().cmp(other.iter())`), word by word: the planner breaks ties between
    /// thousands of options by it. At the lowest id in one set only, that set's list goes on
    /// with it while the other's goes on with a higher id (the lesser list) or ends (the
    /// greater, being a prefix of the first).
    pub fn cmp_ids(&self, other: &CpuSet) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        let n = self.words.len().max(other.words.len());
        for i in 0..n {
            let a = self.words.get(i).copied().unwrap_or(0);
            let b = other.words.get(i).copied().unwrap_or(0);
            let d = a ^ b;
            if d == 0 {
                continue;
            }
            let bit = d.trailing_zeros();
            let above = if bit == 63 { 0 } else { !0u64 << (bit + 1) };
            // Trimmed: a set with a word past `i` has an id there.
            let more = |w: u64, set: &CpuSet| w & above != 0 || set.words.len() > i + 1;
            return if a & (1 << bit) != 0 {
                if more(b, other) {
                    Ordering::Less
                } else {
                    Ordering::Greater
                }
            } else if more(a, self) {
                Ordering::Greater
            } else {
                Ordering::Less
            };
        }
        Ordering::Equal
    }

    /// The kernel's compact cpulist form (`0-3,8`); empty string for the empty set.
    pub fn to_cpulist(&self) -> String {
        self.to_string()
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut s = CpuSet::new();
        for id in iter {
            s.insert(id);
        }
        s
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.iter().peekable();
        while let Some(start) = it.next() {
            let mut end = start;
            while it.peek() == Some(&(end + 1)) {
                end = it.next().unwrap_or(end);
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

impl std::str::FromStr for CpuSet {
    type Err = ParseCpuListError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CpuSet::parse(s)
    }
}

impl Serialize for CpuSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for CpuSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let ids = Vec::<u32>::deserialize(d)?;
        if let Some(&bad) = ids.iter().find(|&&id| id >= MAX_ID) {
            return Err(serde::de::Error::custom(format!(
                "id {bad} is above {MAX_ID}"
            )));
        }
        Ok(ids.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, ids: &[u32], printed: &str) {
        let s = CpuSet::parse(input).unwrap();
        assert_eq!(s.iter().collect::<Vec<_>>(), ids, "{input:?}");
        assert_eq!(s.to_string(), printed, "{input:?}");
    }

    #[test]
    fn parses_kernel_cpulists() {
        check("", &[], "");
        check("\n", &[], "");
        check("0", &[0], "0");
        check("0-3\n", &[0, 1, 2, 3], "0-3");
        check("0-1,4,6-7", &[0, 1, 4, 6, 7], "0-1,4,6-7");
        check("63,64,127-128", &[63, 64, 127, 128], "63-64,127-128");
        check("3,1,2", &[1, 2, 3], "1-3");
    }

    /// `cmp_ids` is the order of the id lists, prefixes and word edges included.
    #[test]
    fn cmp_ids_orders_as_the_id_lists() {
        use std::cmp::Ordering::{Equal, Greater, Less};
        let set = |ids: &[u32]| CpuSet::from_iter(ids.iter().copied());
        for (a, b, want) in [
            (&[][..], &[][..], Equal),
            (&[], &[0], Less),
            (&[1, 2], &[1, 2, 3], Less),
            (&[1, 2, 70], &[1, 2], Greater),
            (&[63], &[63, 64], Less),
            (&[63, 64], &[63], Greater),
            (&[62, 63], &[62], Greater),
            (&[5], &[3, 7], Greater),
            (&[3, 200], &[3, 7], Greater),
            (&[3, 7], &[3, 200], Less),
            (&[0, 127], &[0, 128], Less),
            (&[64], &[0, 64], Greater),
            (&[130], &[130], Equal),
        ] {
            let (sa, sb) = (set(a), set(b));
            assert_eq!(sa.cmp_ids(&sb), want, "{a:?} vs {b:?}");
            assert_eq!(sa.cmp_ids(&sb), sa.iter().cmp(sb.iter()), "{a:?} vs {b:?}");
            assert_eq!(sb.cmp_ids(&sa), want.reverse(), "{b:?} vs {a:?}");
        }
    }

    #[test]
    fn rejects_malformed_cpulists() {
        for bad in [
            "0-",
            "-1",
            "a",
            "1,,2",
            "3-1",
            "0-3,",
            "1 2",
            "99999999999",
            "70000",
        ] {
            assert!(CpuSet::parse(bad).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn one_is_the_set_of_its_id() {
        for id in [0, 1, 63, 64, 65, 127, 128, 200, 4000] {
            let s = CpuSet::one(id);
            assert_eq!(s, CpuSet::from_iter([id]), "{id}");
            assert_eq!(s.iter().collect::<Vec<_>>(), vec![id]);
            assert_eq!(s.len(), 1);
        }
    }

    #[test]
    fn set_algebra_and_equality() {
        let a = CpuSet::parse("0-7").unwrap();
        let b = CpuSet::parse("4-11").unwrap();
        assert_eq!(a.intersection(&b).to_string(), "4-7");
        assert_eq!(a.difference(&b).to_string(), "0-3");
        assert_eq!(a.union(&b).to_string(), "0-11");
        let mut c = CpuSet::parse("200").unwrap();
        c.remove(200);
        assert_eq!(c, CpuSet::new());
        assert!(c.is_empty());
        assert!(CpuSet::parse("4-5").unwrap().is_subset(&a));
        assert_eq!(serde_json::to_string(&a).unwrap(), "[0,1,2,3,4,5,6,7]");
    }

    proptest::proptest! {
        #[test]
        fn in_place_and_word_wise_ops_match_set_semantics(
            a in proptest::collection::btree_set(0u32..300, 0..40),
            b in proptest::collection::btree_set(0u32..300, 0..40),
        ) {
            let (sa, sb): (CpuSet, CpuSet) = (a.iter().copied().collect(), b.iter().copied().collect());
            let mut u = sa.clone();
            u.union_with(&sb);
            let want: CpuSet = a.union(&b).copied().collect();
            proptest::prop_assert_eq!(&u, &want);
            proptest::prop_assert_eq!(&sa.union(&sb), &want);
            proptest::prop_assert_eq!(sa.is_subset(&sb), a.is_subset(&b));
            proptest::prop_assert_eq!(sa.is_disjoint(&sb), a.is_disjoint(&b));
            proptest::prop_assert_eq!(sa.cmp_ids(&sb), a.iter().cmp(b.iter()));
            proptest::prop_assert_eq!(sa.cmp_ids(&sa), std::cmp::Ordering::Equal);
        }

        #[test]
        fn cpulist_round_trips(ids in proptest::collection::btree_set(0u32..600, 0..80)) {
            let s: CpuSet = ids.iter().copied().collect();
            let back = CpuSet::parse(&s.to_string()).unwrap();
            proptest::prop_assert_eq!(back.iter().collect::<Vec<_>>(), ids.into_iter().collect::<Vec<_>>());
        }
    }
}
