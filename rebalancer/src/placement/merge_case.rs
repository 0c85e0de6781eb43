//! One conformance case of `rebalancer hints merge` (../shared/conformance/README.md): parsed
//! from JSON with errors that name the offending field, evaluated with [`super::merge`].
//!
//! Validation (what is refused, and why):
//! - wrong JSON types anywhere, an unknown `policy`, node ids that are negative or >= 128 (our
//!   mask's width; kubelet's own stops at 64), a hint without a boolean `preferred`;
//! - `options.max_allowable_numa_nodes` below 8 (kubelet refuses the option value);
//! - for best-effort / restricted with `prefer_closest_numa`: `distances` missing, or without a row
//!   for some machine node, or a row too short to index every machine node (kubelet cannot start
//!   without them either).
//!
//! Accepted as kubelet accepts them: extra fields (ignored); hint node ids outside `numa_nodes`
//! (the AND with ALL drops them, but they count for bnp and the equal-affinity test); duplicate
//! ids; `numa_nodes: []` (then ALL is empty and the result is `{ALL = [], false}`); a machine with
//! more nodes than `max_allowable_numa_nodes` (kubelet would not start; our merge handles it);
//! distances that are unused or asymmetric. For policy `none`, only fields present are checked.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::mask::{NodeMask, TopologyHint, MAX_NODES};
use super::merge::{self, MergeDecision, MergeOptions, MergePolicy, ProviderHints};
use super::numa_info::NumaInfo;

/// A malformed case: the field (a path such as `providers[1].cpu[0].affinity`) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {message}")]
pub struct CaseError {
    pub field: String,
    pub message: String,
}

pub(crate) fn err<T>(field: impl Into<String>, message: impl Into<String>) -> Result<T, CaseError> {
    Err(CaseError {
        field: field.into(),
        message: message.into(),
    })
}

/// A parsed, validated case.
#[derive(Clone, Debug, PartialEq)]
pub struct MergeCase {
    pub policy: MergePolicy,
    pub numa: NumaInfo,
    pub options: MergeOptions,
    pub providers: Vec<ProviderHints>,
}

impl MergeCase {
    pub fn decide(&self) -> MergeDecision {
        merge::decide(self.policy, &self.options, &self.numa, &self.providers)
    }
}

/// One output line, fields in the contract's order.
#[derive(Debug, serde::Serialize)]
struct ResultLine {
    affinity: Option<Vec<u32>>,
    preferred: bool,
    admit: bool,
}

/// The output line of a decision: `{"affinity":[1],"preferred":true,"admit":true}`.
pub fn decision_json(d: &MergeDecision) -> String {
    let line = ResultLine {
        affinity: d.hint.affinity.map(|m| m.ids().collect()),
        preferred: d.hint.preferred,
        admit: d.admit,
    };
    serde_json::to_string(&line).unwrap_or_default()
}

/// The output line of a malformed case: `{"error":"…","index":2,"field":"policy"}`.
pub fn error_json(index: usize, e: &CaseError) -> String {
    serde_json::json!({"error": format!("case {index}: {e}"), "index": index, "field": e.field})
        .to_string()
}

pub fn parse_policy(s: &str) -> Option<MergePolicy> {
    Some(match s {
        "none" => MergePolicy::None,
        "best-effort" => MergePolicy::BestEffort,
        "restricted" => MergePolicy::Restricted,
        "single-numa-node" => MergePolicy::SingleNumaNode,
        _ => return None,
    })
}

/// Parses and validates one case object.
pub fn parse_case(v: &Value) -> Result<MergeCase, CaseError> {
    let Some(obj) = v.as_object() else {
        return err("(case)", format!("expected an object, got {}", kind(v)));
    };
    let policy = match obj.get("policy") {
        Some(Value::String(s)) => parse_policy(s).ok_or_else(|| CaseError {
            field: "policy".into(),
            message: format!(
                "unknown policy {s:?} (expected none, best-effort, restricted or single-numa-node)"
            ),
        })?,
        Some(other) => return err("policy", format!("expected a string, got {}", kind(other))),
        None => return err("policy", "missing"),
    };
    let lenient = policy == MergePolicy::None;
    let nodes = match present(obj, "numa_nodes") {
        Some(v) => node_ids(v, "numa_nodes")?,
        None if lenient => Vec::new(),
        None => return err("numa_nodes", "missing"),
    };
    let options = parse_options(obj)?;
    let distances = match present(obj, "distances") {
        Some(v) => parse_distances(v)?,
        None => BTreeMap::new(),
    };
    let numa = NumaInfo::new(nodes, distances);
    if let Err(e) = options.check(policy, &numa) {
        let field = match e {
            merge::OptionsError::MaxAllowableTooSmall(_) => "options.max_allowable_numa_nodes",
            merge::OptionsError::Distances(_) => "distances",
        };
        return err(field, e.to_string());
    }
    let providers = match present(obj, "providers") {
        Some(Value::Array(ps)) => ps
            .iter()
            .enumerate()
            .map(|(i, p)| parse_provider(p, &format!("providers[{i}]")))
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return err(
                "providers",
                format!("expected an array, got {}", kind(other)),
            )
        }
        None if lenient => Vec::new(),
        None => return err("providers", "missing"),
    };
    Ok(MergeCase {
        policy,
        numa,
        options,
        providers,
    })
}

/// A field that is present and not null.
pub(crate) fn present<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn parse_options(obj: &Map<String, Value>) -> Result<MergeOptions, CaseError> {
    let Some(v) = present(obj, "options") else {
        return Ok(MergeOptions::default());
    };
    let Some(o) = v.as_object() else {
        return err("options", format!("expected an object, got {}", kind(v)));
    };
    let prefer_closest_numa = match present(o, "prefer_closest_numa") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return err(
                "options.prefer_closest_numa",
                format!("expected a boolean, got {}", kind(other)),
            )
        }
    };
    let max_allowable_numa_nodes = match present(o, "max_allowable_numa_nodes") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| CaseError {
                    field: "options.max_allowable_numa_nodes".into(),
                    message: format!("expected a non-negative integer or null, got {v}"),
                })?,
        ),
    };
    Ok(MergeOptions {
        prefer_closest_numa,
        max_allowable_numa_nodes,
    })
}

fn parse_distances(v: &Value) -> Result<BTreeMap<u32, Vec<u64>>, CaseError> {
    let Some(o) = v.as_object() else {
        return err(
            "distances",
            format!("expected an object of rows or null, got {}", kind(v)),
        );
    };
    let mut rows = BTreeMap::new();
    for (k, row) in o {
        let field = format!("distances.{k}");
        let id: u32 = match k.parse() {
            Ok(id) if id < MAX_NODES => id,
            _ => {
                return err(
                    field,
                    format!("the key must be a node id below {MAX_NODES}"),
                )
            }
        };
        let Some(items) = row.as_array() else {
            return err(field, format!("expected an array, got {}", kind(row)));
        };
        let mut r = Vec::with_capacity(items.len());
        for (j, d) in items.iter().enumerate() {
            match d.as_u64() {
                Some(d) => r.push(d),
                None => {
                    return err(
                        format!("{field}[{j}]"),
                        format!("expected a non-negative integer, got {d}"),
                    )
                }
            }
        }
        rows.insert(id, r);
    }
    Ok(rows)
}

fn node_ids(v: &Value, field: &str) -> Result<Vec<u32>, CaseError> {
    let Some(items) = v.as_array() else {
        return err(
            field,
            format!("expected an array of node ids, got {}", kind(v)),
        );
    };
    items
        .iter()
        .enumerate()
        .map(|(i, n)| match n.as_u64() {
            Some(id) if id < MAX_NODES as u64 => Ok(id as u32),
            _ => err(
                format!("{field}[{i}]"),
                format!("expected a node id in 0..{MAX_NODES}, got {n}"),
            ),
        })
        .collect()
}

fn parse_provider(v: &Value, field: &str) -> Result<ProviderHints, CaseError> {
    let o = match v {
        Value::Null => return Ok(None),
        Value::Object(o) => o,
        other => {
            return err(
                field,
                format!(
                    "expected null or an object of resource hints, got {}",
                    kind(other)
                ),
            )
        }
    };
    let mut map = BTreeMap::new();
    for (res, hints) in o {
        let rfield = format!("{field}.{res}");
        let list = match hints {
            Value::Null => None,
            Value::Array(hs) => Some(
                hs.iter()
                    .enumerate()
                    .map(|(i, h)| parse_hint(h, &format!("{rfield}[{i}]")))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            other => {
                return err(
                    rfield,
                    format!("expected null or an array of hints, got {}", kind(other)),
                )
            }
        };
        map.insert(res.clone(), list);
    }
    Ok(Some(map))
}

fn parse_hint(v: &Value, field: &str) -> Result<TopologyHint, CaseError> {
    let Some(o) = v.as_object() else {
        return err(field, format!("expected a hint object, got {}", kind(v)));
    };
    let affinity = match present(o, "affinity") {
        None => None,
        Some(a) => {
            let ids = node_ids(a, &format!("{field}.affinity"))?;
            NodeMask::from_ids(ids)
        }
    };
    let preferred = match o.get("preferred") {
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return err(
                format!("{field}.preferred"),
                format!("expected a boolean, got {}", kind(other)),
            )
        }
        None => return err(format!("{field}.preferred"), "missing"),
    };
    Ok(TopologyHint::new(affinity, preferred))
}

pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(input: Value, want: Result<&str, (&str, &str)>) {
        let got = parse_case(&input).map(|c| decision_json(&c.decide()));
        match (got, want) {
            (Ok(line), Ok(w)) => assert_eq!(line, w, "input {input}"),
            (Err(e), Err((field, needle))) => {
                assert_eq!(e.field, field, "input {input}: {e}");
                assert!(e.message.contains(needle), "{e} lacks {needle:?}");
            }
            (got, want) => panic!("input {input}: got {got:?}, want {want:?}"),
        }
    }

    fn base(policy: &str) -> Value {
        json!({"policy": policy, "numa_nodes": [0, 1], "providers": []})
    }

    fn with(mut v: Value, key: &str, val: Value) -> Value {
        v[key] = val;
        v
    }

    #[test]
    fn parses_and_validates_cases() {
        let hint1 = json!([{"r": [{"affinity": [1], "preferred": true}]}]);
        let closest = json!({"prefer_closest_numa": true});
        type Case<'a> = (&'a str, Value, Result<&'a str, (&'a str, &'a str)>);
        let cases: Vec<Case> = vec![
            (
                "no providers: ALL preferred",
                base("best-effort"),
                Ok(r#"{"affinity":[0,1],"preferred":true,"admit":true}"#),
            ),
            (
                "one hint",
                with(base("restricted"), "providers", hint1.clone()),
                Ok(r#"{"affinity":[1],"preferred":true,"admit":true}"#),
            ),
            (
                "none ignores everything",
                json!({"policy": "none", "numa_nodes": []}),
                Ok(r#"{"affinity":null,"preferred":false,"admit":true}"#),
            ),
            (
                "extra fields ignored",
                with(base("best-effort"), "expected", json!("x")),
                Ok(r#"{"affinity":[0,1],"preferred":true,"admit":true}"#),
            ),
            (
                "empty machine",
                with(base("restricted"), "numa_nodes", json!([])),
                Ok(r#"{"affinity":[],"preferred":false,"admit":false}"#),
            ),
            (
                "hint ids outside the machine are accepted",
                with(
                    base("best-effort"),
                    "providers",
                    json!([{"r": [{"affinity": [1, 5], "preferred": true}]}]),
                ),
                Ok(r#"{"affinity":[1],"preferred":true,"admit":true}"#),
            ),
            (
                "not an object",
                json!([1]),
                Err(("(case)", "expected an object")),
            ),
            (
                "unknown policy",
                base("static"),
                Err(("policy", "unknown policy")),
            ),
            (
                "missing policy",
                json!({"numa_nodes": []}),
                Err(("policy", "missing")),
            ),
            (
                "missing nodes",
                json!({"policy": "restricted", "providers": []}),
                Err(("numa_nodes", "missing")),
            ),
            (
                "node id too big",
                with(base("restricted"), "numa_nodes", json!([0, 128])),
                Err(("numa_nodes[1]", "0..128")),
            ),
            (
                "negative node id",
                with(base("restricted"), "numa_nodes", json!([-1])),
                Err(("numa_nodes[0]", "0..128")),
            ),
            (
                "providers not an array",
                with(base("restricted"), "providers", json!({})),
                Err(("providers", "expected an array")),
            ),
            (
                "provider a string",
                with(base("restricted"), "providers", json!(["x"])),
                Err(("providers[0]", "expected null or an object")),
            ),
            (
                "resource a number",
                with(base("restricted"), "providers", json!([{"cpu": 3}])),
                Err(("providers[0].cpu", "expected null or an array")),
            ),
            (
                "hint without preferred",
                with(
                    base("restricted"),
                    "providers",
                    json!([null, {"cpu": [{"affinity": [0]}]}]),
                ),
                Err(("providers[1].cpu[0].preferred", "missing")),
            ),
            (
                "bad affinity id",
                with(
                    base("restricted"),
                    "providers",
                    json!([{"cpu": [{"affinity": [200], "preferred": true}]}]),
                ),
                Err(("providers[0].cpu[0].affinity[0]", "0..128")),
            ),
            (
                "max allowable below 8",
                with(
                    base("restricted"),
                    "options",
                    json!({"max_allowable_numa_nodes": 4}),
                ),
                Err(("options.max_allowable_numa_nodes", "at least 8")),
            ),
            (
                "max allowable not a number",
                with(
                    base("restricted"),
                    "options",
                    json!({"max_allowable_numa_nodes": "8"}),
                ),
                Err(("options.max_allowable_numa_nodes", "integer")),
            ),
            (
                "prefer closest not a bool",
                with(
                    base("restricted"),
                    "options",
                    json!({"prefer_closest_numa": 1}),
                ),
                Err(("options.prefer_closest_numa", "boolean")),
            ),
            (
                "closest without distances",
                with(base("best-effort"), "options", closest.clone()),
                Err(("distances", "no distance row for node 0")),
            ),
            (
                "closest with a short row",
                with(
                    with(base("best-effort"), "options", closest.clone()),
                    "distances",
                    json!({"0": [10, 11], "1": [11]}),
                ),
                Err(("distances", "node 1 has 1 entries")),
            ),
            (
                "closest without distances under single-numa-node: kubelet refuses it too",
                with(base("single-numa-node"), "options", closest.clone()),
                Err(("distances", "no distance row for node 0")),
            ),
            (
                "closest unused by single-numa-node: a short row is fine",
                with(
                    with(base("single-numa-node"), "options", closest.clone()),
                    "distances",
                    json!({"0": [10], "1": [11]}),
                ),
                Ok(r#"{"affinity":null,"preferred":true,"admit":true}"#),
            ),
            (
                "policy none reads no option, as kubelet",
                with(
                    base("none"),
                    "options",
                    json!({"max_allowable_numa_nodes": 2, "prefer_closest_numa": true}),
                ),
                Ok(r#"{"affinity":null,"preferred":false,"admit":true}"#),
            ),
            (
                "distances key not an id",
                with(base("best-effort"), "distances", json!({"a": [1]})),
                Err(("distances.a", "node id")),
            ),
            (
                "distance not a number",
                with(base("best-effort"), "distances", json!({"0": [10, "x"]})),
                Err(("distances.0[1]", "non-negative integer")),
            ),
            (
                "unused incomplete distances are fine",
                with(base("best-effort"), "distances", json!({"0": [10]})),
                Ok(r#"{"affinity":[0,1],"preferred":true,"admit":true}"#),
            ),
        ];
        for (name, input, want) in cases {
            eprintln!("case: {name}");
            check(input, want);
        }
    }
}
