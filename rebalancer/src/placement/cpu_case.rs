//! `rebalancer hints cpu` cases (../shared/conformance/cpu-manager.md): a machine as a list of
//! logical CPUs, the available CPUs, a request and the static policy's options, parsed with
//! errors naming the field, and evaluated with [`super::cpu_take`] as kubelet's static policy
//! `takeByTopology` dispatches.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::cpuset::CpuSet;
use crate::placement::cpu_take::{self, CpuInfo, CpuTopology, Strategy, TakeError};
use crate::placement::merge_case::{err, CaseError};

/// kubelet's option names, for its "can not be used at the same time" error.
const ACROSS_NUMA: &str = "distribute-cpus-across-numa";
const ACROSS_CORES: &str = "distribute-cpus-across-cores";
const BY_UNCORE: &str = "prefer-align-cpus-by-uncorecache";

/// A parsed, validated case.
#[derive(Clone, Debug)]
pub struct CpuCase {
    pub topology: CpuTopology,
    pub available: CpuSet,
    pub request: usize,
    pub across_numa: bool,
    pub group_size: usize,
    pub across_cores: bool,
    pub by_uncore: bool,
}

impl CpuCase {
    /// kubelet's result: the CPUs, or the error its options check or its take returns.
    pub fn evaluate(&self) -> Result<CpuSet, String> {
        // kubelet's NewStaticPolicyOptions checks, in its order
        let conflict = if self.across_numa && self.across_cores {
            Some((ACROSS_NUMA, ACROSS_CORES))
        } else if self.by_uncore && self.across_cores {
            Some((BY_UNCORE, ACROSS_CORES))
        } else if self.by_uncore && self.across_numa {
            Some((BY_UNCORE, ACROSS_NUMA))
        } else {
            None
        };
        if let Some((a, b)) = conflict {
            return Err(format!(
                "static policy options {a} and {b} can not be used at the same time"
            ));
        }
        let strategy = if self.across_cores {
            Strategy::Spread
        } else {
            Strategy::Packed
        };
        let got = if self.across_numa {
            cpu_take::take_distributed(
                &self.topology,
                &self.available,
                self.request,
                self.group_size,
                strategy,
            )
        } else {
            cpu_take::take_packed(
                &self.topology,
                &self.available,
                self.request,
                strategy,
                self.by_uncore,
            )
        };
        got.map_err(|e: TakeError| e.to_string())
    }
}

/// The output line of an evaluated case.
pub fn outcome_json(r: &Result<CpuSet, String>) -> String {
    match r {
        Ok(cpus) => serde_json::json!({"cpus": cpus.to_cpulist()}),
        Err(e) => serde_json::json!({"error": e}),
    }
    .to_string()
}

fn uint(v: &Value, field: &str) -> Result<u64, CaseError> {
    match v {
        Value::Number(n) => match n.as_u64() {
            Some(x) => Ok(x),
            None if n.as_i64().is_some() => err(field, format!("must be ≥ 0, got {n}")),
            None => err(field, format!("must be an integer, got {n}")),
        },
        Value::Null => err(field, "missing"),
        other => err(field, format!("must be an integer, got {other}")),
    }
}

fn id(v: &Value, field: &str) -> Result<u32, CaseError> {
    let x = uint(v, field)?;
    u32::try_from(x).or_else(|_| err(field, format!("{x} is too large")))
}

fn flag(o: &Value, name: &str) -> Result<bool, CaseError> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => err(
            format!("options.{name}"),
            format!("must be a bool, got {other}"),
        ),
    }
}

/// Parses and validates one case; extra fields are ignored.
pub fn parse_case(v: &Value) -> Result<CpuCase, CaseError> {
    if !v.is_object() {
        return err("", "a case must be a JSON object");
    }
    let Some(list) = v.get("topology").and_then(|t| t.get("cpus")) else {
        return err("topology.cpus", "missing");
    };
    let Some(list) = list.as_array() else {
        return err("topology.cpus", "must be an array");
    };
    let mut seen = BTreeSet::new();
    let mut cpus = Vec::with_capacity(list.len());
    for (i, c) in list.iter().enumerate() {
        let f = |k: &str| format!("topology.cpus[{i}].{k}");
        if !c.is_object() {
            return err(format!("topology.cpus[{i}]"), "must be an object");
        }
        let cpu = id(&c["cpu"], &f("cpu"))?;
        let socket = id(&c["socket"], &f("socket"))?;
        let info = CpuInfo {
            cpu,
            core: id(&c["core"], &f("core"))?,
            socket,
            numa: id(&c["numa"], &f("numa"))?,
            // kubelet's discovery without L3 information: the socket
            uncore: match c.get("uncore") {
                None | Some(Value::Null) => socket,
                Some(u) => id(u, &f("uncore"))?,
            },
        };
        if !seen.insert(cpu) {
            return err(f("cpu"), format!("duplicate cpu id {cpu}"));
        }
        cpus.push(info);
    }
    let topology = CpuTopology::new(cpus);
    let available = match v.get("available") {
        Some(Value::String(s)) => CpuSet::parse(s.trim())
            .or_else(|e| err("available", format!("bad cpulist {s:?}: {e}")))?,
        None | Some(Value::Null) => return err("available", "missing"),
        Some(other) => {
            return err(
                "available",
                format!("must be a cpulist string, got {other}"),
            )
        }
    };
    if let Some(c) = available.iter().find(|c| !topology.cpus().contains(*c)) {
        return err("available", format!("CPU {c} is not in topology.cpus"));
    }
    let request = uint(v.get("request").unwrap_or(&Value::Null), "request")?;
    let request = usize::try_from(request).or_else(|_| err("request", "too large"))?;
    let empty = Value::Object(Default::default());
    let o = match v.get("options") {
        None | Some(Value::Null) => &empty,
        Some(o) if o.is_object() => o,
        Some(other) => return err("options", format!("must be an object, got {other}")),
    };
    let group_size = match o.get("cpu_group_size") {
        None | Some(Value::Null) => 1,
        Some(g) => {
            let g = uint(g, "options.cpu_group_size")?;
            if g < 1 {
                return err("options.cpu_group_size", "must be ≥ 1");
            }
            usize::try_from(g).or_else(|_| err("options.cpu_group_size", "too large"))?
        }
    };
    Ok(CpuCase {
        topology,
        available,
        request,
        across_numa: flag(o, "distribute_cpus_across_numa")?,
        group_size,
        across_cores: flag(o, "distribute_cpus_across_cores")?,
        by_uncore: flag(o, "prefer_align_cpus_by_uncorecache")?,
    })
}
