//! `rebalancer hints memory` through the real binary: the shared conformance examples (when the
//! shared/ directory is beside the clone), our committed copy of them and our own cases, stdin
//! mode, `{"cases": [...]}`, and the error contract (exit status 2, index and field named).

mod hints_cli;

use std::path::{Path, PathBuf};

use serde_json::Value;

fn run_file(path: &Path) -> std::process::Output {
    hints_cli::run_file("memory", path)
}

fn run_stdin(input: &str) -> std::process::Output {
    hints_cli::run_stdin("memory", input)
}

use hints_cli::lines;

/// Blocks sorted, so assignments compare ignoring block order.
fn norm(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(pods) = v.as_object_mut() {
        for cs in pods.values_mut().filter_map(Value::as_object_mut) {
            for bs in cs.values_mut().filter_map(Value::as_array_mut) {
                bs.sort_by_key(|b| b.to_string());
            }
        }
    }
    v
}

/// Every case of `path` against its `expected` (these cases split no reservation differently,
/// so machine states compare exactly).
fn check_file(path: &Path) {
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
        let want = &case["expected"];
        if let Some(e) = want.get("error") {
            assert_eq!(line["error"].is_null(), e.is_null(), "{name}: error {line}");
            if !e.is_null() {
                continue;
            }
        }
        if let Some(a) = want.get("assignments") {
            assert_eq!(norm(&line["assignments"]), norm(a), "{name}: assignments");
        }
        for f in ["machine_state", "topology_hints", "requested"] {
            if let Some(x) = want.get(f) {
                assert_eq!(&line[f], x, "{name}: {f}");
            }
        }
    }
    eprintln!("{}: {} cases pass", path.display(), cases.len());
}

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
        .map(|r| r.join("conformance/memory-examples.json"))
        .find(|p| p.is_file())
}

#[test]
fn shared_memory_examples_pass() {
    match shared_examples() {
        Some(p) => check_file(&p),
        None => eprintln!(
            "SKIP: shared/conformance/memory-examples.json not found (set REBALANCER_SHARED to \
             the shared/ directory); the committed copy is checked by committed_examples_pass"
        ),
    }
}

#[test]
fn committed_examples_pass() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
    check_file(&dir.join("memory-examples.json"));
    check_file(&dir.join("memory-cases.json"));
}

#[test]
fn stdin_takes_one_case_and_cases_objects_work() {
    let out = run_stdin(r#"{"operation":"new","system_reserved":{"0":{"memory":1}},"name":"x"}"#);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "{\"error\":null,\"assignments\":null,\"machine_state\":null,\"topology_hints\":null,\"requested\":null}\n"
    );
    let out = run_stdin(
        r#"{"cases":[{"operation":"new","system_reserved":null},{"operation":"new","system_reserved":{"1":{"memory":5}}}]}"#,
    );
    assert!(out.status.success());
    let got = lines(&out);
    assert_eq!(
        got[0]["error"],
        "[memorymanager] you should specify the system reserved memory"
    );
    assert!(got[1]["error"].is_null());
}

#[test]
fn a_malformed_case_exits_2_and_names_index_and_field() {
    let out = run_stdin(
        r#"[{"operation":"new","system_reserved":{"0":{"memory":1}}},
            {"operation":"allocate","pod":{"uid":"p","containers":[]},"call":{"containers":["ghost"]}}]"#,
    );
    assert_eq!(out.status.code(), Some(2));
    let got = lines(&out);
    assert_eq!(got.len(), 2);
    assert!(got[0]["error"].is_null());
    assert_eq!(got[1]["field"], "call.containers[0]");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("case 1") && err.contains("call.containers[0]"),
        "{err}"
    );
    let bad = run_stdin("not json");
    assert_eq!(bad.status.code(), Some(2));
}
