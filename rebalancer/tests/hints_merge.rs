//! `rebalancer hints merge` through the real binary: the shared conformance examples (when the
//! shared/ directory is beside the clone), our committed copy plus extra cases, stdin mode and
//! the error contract (exit status 2, an error naming the case index and field).

mod hints_cli;

use std::path::{Path, PathBuf};

use serde_json::Value;

fn run_file(path: &Path) -> std::process::Output {
    hints_cli::run_file("merge", path)
}

fn run_stdin(input: &str) -> std::process::Output {
    hints_cli::run_stdin("merge", input)
}

use hints_cli::lines;

/// Runs every case of `path` and compares it with its `expected` / `expected_admit`.
fn check_conformance_file(path: &Path) {
    let cases: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let out = run_file(path);
    assert!(
        out.status.success(),
        "{}: status {:?}, stderr {}",
        path.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let got = lines(&out);
    assert_eq!(got.len(), cases.len(), "one line per case");
    for (case, line) in cases.iter().zip(&got) {
        let name = &case["name"];
        assert_eq!(
            line["affinity"], case["expected"]["affinity"],
            "{name}: affinity"
        );
        assert_eq!(
            line["preferred"], case["expected"]["preferred"],
            "{name}: preferred"
        );
        assert_eq!(line["admit"], case["expected_admit"], "{name}: admit");
    }
    eprintln!("{}: {} cases pass", path.display(), cases.len());
}

/// shared/conformance/merge-examples.json: `$REBALANCER_SHARED/conformance/…`, else shared/
/// beside the clone (or beside the worktree directory).
fn shared_examples() -> Option<PathBuf> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut roots: Vec<PathBuf> = std::env::var_os("REBALANCER_SHARED")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    roots.push(manifest.join("../../shared"));
    roots.push(manifest.join("../../../shared"));
    roots
        .into_iter()
        .map(|r| r.join("conformance/merge-examples.json"))
        .find(|p| p.is_file())
}

#[test]
fn shared_conformance_examples_pass() {
    match shared_examples() {
        Some(p) => check_conformance_file(&p),
        None => eprintln!(
            "SKIP: shared/conformance/merge-examples.json not found (set REBALANCER_SHARED to the \
             shared/ directory)"
        ),
    }
}

#[test]
fn committed_conformance_cases_pass() {
    check_conformance_file(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/merge-cases.json"),
    );
}

#[test]
fn stdin_takes_one_case_object() {
    let out = run_stdin(
        r#"{"policy":"restricted","numa_nodes":[0,1],"name":"x",
            "providers":[{"cpu":[{"affinity":[1],"preferred":true}]}]}"#,
    );
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "{\"affinity\":[1],\"preferred\":true,\"admit\":true}\n"
    );
    let none = run_stdin(r#"{"policy":"none","numa_nodes":[],"providers":[null]}"#);
    assert_eq!(
        String::from_utf8(none.stdout).unwrap(),
        "{\"affinity\":null,\"preferred\":false,\"admit\":true}\n"
    );
}

#[test]
fn a_malformed_case_exits_2_and_names_index_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cases.json");
    std::fs::write(
        &path,
        r#"[
          {"policy":"best-effort","numa_nodes":[0,1],"providers":[]},
          {"policy":"best-effort","numa_nodes":[0,1],"providers":[{"cpu":[{"affinity":[0]}]}]},
          {"policy":"fastest","numa_nodes":[0,1],"providers":[]},
          {"policy":"restricted","numa_nodes":[0,1],"providers":[{"cpu":[]}]}
        ]"#,
    )
    .unwrap();
    let out = run_file(&path);
    assert_eq!(out.status.code(), Some(2));
    let got = lines(&out);
    assert_eq!(got.len(), 4, "every case prints a line");
    assert_eq!(got[0]["affinity"], serde_json::json!([0, 1]));
    assert_eq!(got[1]["index"], 1);
    assert_eq!(got[1]["field"], "providers[0].cpu[0].preferred");
    assert!(got[1]["error"].as_str().unwrap().contains("case 1"));
    assert_eq!(got[2]["field"], "policy");
    assert_eq!(got[3]["admit"], false);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("case 1") && stderr.contains("providers[0].cpu[0].preferred"),
        "{stderr}"
    );
    assert!(
        stderr.contains("case 2") && stderr.contains("`policy`"),
        "{stderr}"
    );
}

#[test]
fn input_that_is_not_json_exits_2() {
    let out = run_stdin("{ not json");
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("not valid JSON"));
    let missing = run_file(Path::new("/nonexistent/cases.json"));
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8(missing.stderr)
        .unwrap()
        .contains("cannot read"));
}
