//! Per-pod annotations: what a pod asks the daemon *not* to do for it. They come from the NRI
//! PodSandbox (the runtime passes the pod's annotations through; the cgroup watcher cannot see
//! them) and are kept in the checkpoint, so a restarted daemon honours them from its first
//! round, before the runtime's Synchronize lists the pods again.
//!
//! Annotations are tenant input: anyone who can create a pod sets them. So each one may only
//! make the daemon do less for that pod, never take anything from another:
//! - [`REBALANCE`] = `"never"`: the pod is admitted as usual, and control rounds never move it
//!   (its CPUs and memory stay as admitted). The books still shrink it off CPUs handed out
//!   exclusively later, as any shared container: that is another pod's right, not a move.
//! - [`ADMISSION`] = `"runtime"`: the daemon neither admits nor adjusts the pod's containers
//!   (no allocation, no exclusive CPUs, rounds never move them), but it still fences them off
//!   CPUs given exclusively to others, exactly as containers it never admitted.
//!
//! Any other value of these keys is ignored (and logged): it asks nothing.
use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::cgroup::kube::classify_in;

/// `"never"`: control rounds never move the pod.
pub const REBALANCE: &str = "rebalancer.io/rebalance";
/// `"runtime"`: the pod is left to the runtime (not admitted, fenced only).
pub const ADMISSION: &str = "rebalancer.io/admission";

/// What one pod's annotations ask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ask {
    /// Never moved by control rounds.
    pub never_move: bool,
    /// Left to the runtime: not admitted, not moved, only fenced.
    pub runtime: bool,
}

impl Ask {
    pub fn is_empty(&self) -> bool {
        *self == Ask::default()
    }
}

/// What `annotations` ask, and a note per key of ours with a value we do not know.
pub fn parse(annotations: &HashMap<String, String>) -> (Ask, Vec<String>) {
    let mut ask = Ask::default();
    let mut unknown = Vec::new();
    for (key, want, flag) in [
        (REBALANCE, "never", &mut ask.never_move),
        (ADMISSION, "runtime", &mut ask.runtime),
    ] {
        match annotations.get(key).map(|v| v.trim()) {
            None => {}
            Some(v) if v == want => *flag = true,
            Some(v) => unknown.push(format!("{key}={v:?} (only {want:?} is known)")),
        }
    }
    (ask, unknown)
}

/// Sets (or clears, when it asks nothing) what pod `uid` asks in `asked`.
pub fn note(asked: &mut BTreeMap<String, Ask>, uid: &str, ask: Ask) {
    if uid.is_empty() {
        return;
    }
    if ask.is_empty() {
        asked.remove(uid);
    } else {
        asked.insert(uid.to_string(), ask);
    }
}

/// What the pod of cgroup `cg` asks (nothing when it is no pod's container).
pub fn of_cgroup(s: &super::Shared, cg: &str) -> Ask {
    classify_in(cg, s.cfg.cgroups.kubernetes_root.as_deref(), &[])
        .pod_uid()
        .and_then(|uid| s.state.annotated.get(uid))
        .copied()
        .unwrap_or_default()
}

/// Whether control rounds must leave cgroup `cg` where it is.
pub fn pinned(s: &super::Shared, cg: &str) -> bool {
    let a = of_cgroup(s, cg);
    a.never_move || a.runtime
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_the_known_values_ask_anything() {
        // (annotations, what they ask, notes of unknown values)
        type Case<'a> = (&'a [(&'a str, &'a str)], Ask, usize);
        let cases: &[Case] = &[
            (&[], Ask::default(), 0),
            (
                &[(REBALANCE, "never")],
                Ask {
                    never_move: true,
                    runtime: false,
                },
                0,
            ),
            (
                &[(ADMISSION, " runtime ")],
                Ask {
                    never_move: false,
                    runtime: true,
                },
                0,
            ),
            (
                &[(REBALANCE, "always"), (ADMISSION, "yes")],
                Ask::default(),
                2,
            ),
            (&[("other.io/rebalance", "never")], Ask::default(), 0),
        ];
        for (kv, want, notes) in cases {
            let (ask, unknown) = parse(&map(kv));
            assert_eq!(ask, *want, "{kv:?}");
            assert_eq!(unknown.len(), *notes, "{kv:?}: {unknown:?}");
        }
    }

    #[test]
    fn a_pod_that_asks_nothing_is_forgotten() {
        let mut asked = BTreeMap::new();
        let keep = Ask {
            never_move: true,
            runtime: false,
        };
        note(&mut asked, "u1", keep);
        note(&mut asked, "", keep);
        assert_eq!(asked.len(), 1);
        note(&mut asked, "u1", Ask::default());
        assert!(asked.is_empty());
    }
}
