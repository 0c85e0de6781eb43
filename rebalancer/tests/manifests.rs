//! The shipped deployment files agree with each other: the Prometheus Operator's
//! PrometheusRule carries exactly the rule groups of config/prometheus/rules.yaml (the file
//! `promtool check rules` / `promtool test rules` check in `cargo xtask test`), and the
//! NodeResourceTopology overlay changes the DaemonSet only as the export needs.
use std::path::Path;

use serde::Deserialize;
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

/// `kubectl kustomize DIR` as a list of documents. kubectl is part of this machine class; the
/// test fails, not skips, without it, since the overlay is what operators apply.
fn kustomize(rel: &str) -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("kubectl (for `kubectl kustomize`) must be installed");
    assert!(
        out.status.success(),
        "kubectl kustomize {rel}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    (docs.iter().find(|d| d["kind"].as_str() == Some(kind)))
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

fn config_of(docs: &[Value]) -> rebalancer::config::Config {
    let text = find(docs, "ConfigMap")["data"]["rebalancer.toml"]
        .as_str()
        .unwrap();
    rebalancer::config::Config::parse(text, "ConfigMap").unwrap()
}

#[test]
fn the_topology_export_overlay_adds_its_account_token_node_name_and_setting_only() {
    let base = kustomize("config/kubernetes");
    let nrt = kustomize("config/overlays/noderesourcetopology");
    // the base is the DaemonSet file as written
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/kubernetes/daemonset.yaml"),
    )
    .unwrap();
    let file: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .collect();
    assert_eq!(base.len(), file.len());
    for d in &file {
        assert!(
            base.contains(d),
            "{:?} differs in the kustomize base",
            d["kind"]
        );
    }

    // the config: the base's with the export on, nothing else
    let mut want = config_of(&base);
    assert!(!want.kubernetes.export_topology, "the base exports nothing");
    want.kubernetes.export_topology = true;
    assert_eq!(config_of(&nrt), want);

    // the pod runs as the account the RBAC binds, with its token, and knows its node's name
    let pod = |docs: &[Value]| find(docs, "DaemonSet")["spec"]["template"]["spec"].clone();
    let (base_pod, nrt_pod) = (pod(&base), pod(&nrt));
    assert_eq!(
        base_pod["automountServiceAccountToken"].as_bool(),
        Some(false)
    );
    assert_eq!(
        nrt_pod["automountServiceAccountToken"].as_bool(),
        Some(true)
    );
    let sa = find(&nrt, "ServiceAccount");
    assert_eq!(nrt_pod["serviceAccountName"], sa["metadata"]["name"]);
    let subject = &find(&nrt, "ClusterRoleBinding")["subjects"][0];
    assert_eq!(subject["name"], sa["metadata"]["name"]);
    assert_eq!(subject["namespace"], sa["metadata"]["namespace"]);
    assert_eq!(
        sa["metadata"]["namespace"],
        find(&nrt, "DaemonSet")["metadata"]["namespace"]
    );
    let env = nrt_pod["containers"][0]["env"].as_sequence().unwrap();
    let node_name = env
        .iter()
        .find(|e| e["name"].as_str() == Some("NODE_NAME"))
        .expect("NODE_NAME");
    assert_eq!(
        node_name["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("spec.nodeName")
    );

    // the least RBAC: what the exporter does (get, create, update) on the one resource
    let role = find(&nrt, "ClusterRole");
    assert_eq!(role["rules"].as_sequence().unwrap().len(), 1);
    let rule = &role["rules"][0];
    assert_eq!(
        rule["resources"],
        Value::from(vec!["noderesourcetopologies"])
    );
    assert_eq!(rule["verbs"], Value::from(vec!["get", "create", "update"]));

    // and nothing else of the pod changed
    let strip = |mut p: Value| {
        let m = p.as_mapping_mut().unwrap();
        m.remove("serviceAccountName");
        m.remove("automountServiceAccountToken");
        let c = m.get_mut("containers").unwrap().as_sequence_mut().unwrap()[0]
            .as_mapping_mut()
            .unwrap();
        let env = c.get_mut("env").unwrap().as_sequence_mut().unwrap();
        env.retain(|e| e["name"].as_str() != Some("NODE_NAME"));
        p
    };
    assert_eq!(strip(nrt_pod), strip(base_pod));
}
