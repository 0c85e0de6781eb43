//! The shipped deployment files agree with each other: the Prometheus Operator's
//! PrometheusRule carries exactly the rule groups of config/prometheus/rules.yaml (the file
//! `promtool check rules` / `promtool test rules` check in `cargo xtask test`).
use std::path::Path;

use serde_yaml_ng::Value;

fn yaml(rel: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn the_prometheusrule_carries_the_tested_rule_file() {
    let rules = yaml("config/prometheus/rules.yaml");
    let cr = yaml("config/kubernetes/prometheusrule.yaml");
    assert_eq!(cr["kind"].as_str(), Some("PrometheusRule"));
    assert_eq!(cr["spec"]["groups"], rules["groups"]);
    let alerts: Vec<&str> = rules["groups"][0]["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert_eq!(alerts.len(), 6, "{alerts:?}");
}
