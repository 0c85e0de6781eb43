//! What one Topology Manager decision saw, as kubelet logs it for every admission
//! (`TopologyHints` of each provider, then `ContainerTopologyHint`, the merged hint): kept
//! with the placement it led to, so the daemon's log line and `explain` show why a container
//! landed where it did. Rendered compactly and bounded: at most [`MAX_HINTS`] hints per
//! resource are kept (the rest counted), so a decision on a many-node machine stays small in
//! the books and the checkpoint.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::placement::merge::ProviderHints;
use crate::placement::TopologyHint;

/// Hints kept per resource; the rest are counted (`… and N more`).
pub const MAX_HINTS: usize = 16;

/// One decision: provider → resource → its hints, and the merged hint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HintDecision {
    /// `cpu`, `memory`, `device` → resource → hints, e.g. `[0 preferred, 1 preferred, 0-1]`:
    /// the nodes of each hint (`any`: no NUMA preference), `preferred` where it is. A
    /// resource whose provider has no preference for it reads `[any preferred]` (kubelet's
    /// nil list), one that fits nowhere `[]`. A provider asked nothing is absent.
    pub providers: BTreeMap<String, BTreeMap<String, String>>,
    /// The merged hint (before the tie-break of `numa_allocation_strategy`).
    pub merged: String,
}

/// One hint as `nodes[ preferred]`.
pub fn hint(h: &TopologyHint) -> String {
    let nodes = match h.affinity {
        Some(m) => m.to_cpuset().to_string(),
        None => "any".into(),
    };
    if h.preferred {
        format!("{nodes} preferred")
    } else {
        nodes
    }
}

/// A hint list, at most [`MAX_HINTS`] of it.
fn list(hints: &[TopologyHint]) -> String {
    let mut out = String::from("[");
    for (i, h) in hints.iter().take(MAX_HINTS).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&hint(h));
    }
    if hints.len() > MAX_HINTS {
        let _ = write!(out, ", … and {} more", hints.len() - MAX_HINTS);
    }
    out.push(']');
    out
}

impl HintDecision {
    /// The decision over `providers` (named as `names`, in the same order) that merged into
    /// `merged`.
    pub fn new(names: &[&str], providers: &[ProviderHints], merged: &TopologyHint) -> Self {
        let mut out = BTreeMap::new();
        for (name, p) in names.iter().zip(providers) {
            let Some(resources) = p else { continue };
            let rendered = resources
                .iter()
                .map(|(r, hints)| {
                    let text = match hints {
                        None => "[any preferred]".to_string(),
                        Some(l) => list(l),
                    };
                    (r.clone(), text)
                })
                .collect();
            out.insert(name.to_string(), rendered);
        }
        HintDecision {
            providers: out,
            merged: hint(merged),
        }
    }

    /// The providers' hints on one line: `cpu: cpu [..]; memory: memory [..], hugepages-2Mi [..]`.
    pub fn hints_line(&self) -> String {
        let mut out = String::new();
        for (p, resources) in &self.providers {
            if !out.is_empty() {
                out.push_str("; ");
            }
            let _ = write!(out, "{p}:");
            for (i, (r, h)) in resources.iter().enumerate() {
                let _ = write!(out, "{} {r} {h}", if i == 0 { "" } else { "," });
            }
        }
        if out.is_empty() {
            out.push_str("no provider had hints");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::NodeMask;

    fn h(ids: &[u32], preferred: bool) -> TopologyHint {
        TopologyHint::new(NodeMask::from_ids(ids.iter().copied()), preferred)
    }

    #[test]
    fn a_decision_renders_each_providers_hints_and_the_merged_one() {
        let cpu: ProviderHints = Some(
            [(
                "cpu".to_string(),
                Some(vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
            )]
            .into_iter()
            .collect(),
        );
        let device: ProviderHints = Some(
            [
                ("pci:0000:41:00.0".to_string(), Some(vec![h(&[1], true)])),
                ("nvidia.com/gpu".to_string(), None),
                ("example.com/nic".to_string(), Some(vec![])),
            ]
            .into_iter()
            .collect(),
        );
        let d = HintDecision::new(
            &["cpu", "memory", "device"],
            &[cpu, None, device],
            &h(&[1], true),
        );
        assert_eq!(d.merged, "1 preferred");
        assert_eq!(
            d.hints_line(),
            "cpu: cpu [0 preferred, 1 preferred, 0-1]; device: example.com/nic [], nvidia.com/gpu [any preferred], pci:0000:41:00.0 [1 preferred]"
        );
        assert_eq!(hint(&TopologyHint::new(None, false)), "any");
        assert_eq!(
            HintDecision::new(&["cpu"], &[None], &TopologyHint::new(None, true)).hints_line(),
            "no provider had hints"
        );
    }

    /// A many-node machine's long hint lists are cut at MAX_HINTS, the rest counted.
    #[test]
    fn long_hint_lists_are_bounded() {
        let many: Vec<TopologyHint> = (0..100u32).map(|i| h(&[i], false)).collect();
        let p: ProviderHints = Some([("cpu".to_string(), Some(many))].into_iter().collect());
        let d = HintDecision::new(&["cpu"], &[p], &h(&[0], false));
        let text = &d.providers["cpu"]["cpu"];
        assert!(text.ends_with(", 15, … and 84 more]"), "{text}");
        assert!(text.len() < 200, "{}", text.len());
    }
}
