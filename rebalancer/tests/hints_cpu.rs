//! `rebalancer hints cpu` through the real binary: the shared conformance examples (when the
//! shared/ directory is beside the clone), our committed copy of them, kubelet's own
//! takeByTopologyNUMAPacked / spread / NUMADistributed / uncore-cache test tables
//! (`conformance/cpu-cases.json`, with the expected sets of cpu_assignment_test.go, and
//! policy_static_test.go's TestStaticPolicyAdd cases without a topology hint, where
//! allocateCPUs is the take on the free CPUs), stdin mode, and the error contract (exit
//! status 2, index and field named).

mod hints_cli;

use std::path::{Path, PathBuf};

use serde_json::Value;

use hints_cli::{lines, run_file};

fn run_stdin(input: &str) -> std::process::Output {
    hints_cli::run_stdin("cpu", input)
}

/// Every case of `path` against its `expected` / `expected_error`.
fn check_file(path: &Path) {
    let cases: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let out = run_file("cpu", path);
    assert!(
        out.status.success(),
        "{}: status {:?}, stderr {}",
        path.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let got = lines(&out);
    assert_eq!(got.len(), cases.len(), "one line per case");
    let mut failed = Vec::new();
    for (case, line) in cases.iter().zip(&got) {
        let want = match &case["expected_error"] {
            Value::String(e) => serde_json::json!({ "error": e }),
            _ => serde_json::json!({ "cpus": case["expected"] }),
        };
        if *line != want {
            failed.push(format!("{}: want {want}, got {line}", case["name"]));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
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
        .map(|r| r.join("conformance/cpu-examples.json"))
        .find(|p| p.is_file())
}

#[test]
fn shared_cpu_examples_pass() {
    match shared_examples() {
        Some(p) => check_file(&p),
        None => eprintln!(
            "SKIP: shared/conformance/cpu-examples.json not found (set REBALANCER_SHARED to \
             the shared/ directory); the committed copy is checked by committed_cases_pass"
        ),
    }
}

#[test]
fn committed_cases_pass() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
    check_file(&dir.join("cpu-examples.json"));
    check_file(&dir.join("cpu-cases.json"));
}

const DUAL: &str = r#"{"cpus":[{"cpu":0,"core":0,"socket":0,"numa":0},{"cpu":1,"core":1,"socket":1,"numa":1},
    {"cpu":2,"core":0,"socket":0,"numa":0},{"cpu":3,"core":1,"socket":1,"numa":1}]}"#;

#[test]
fn stdin_takes_one_case_and_uncore_defaults_to_the_socket() {
    let out = run_stdin(&format!(
        r#"{{"topology":{DUAL},"available":"0-3","request":3,"name":"x"}}"#
    ));
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "{\"cpus\":\"0-2\"}\n"
    );
    let out = run_stdin(&format!(
        r#"{{"cases":[{{"topology":{DUAL},"available":"","request":0}},
                     {{"topology":{DUAL},"available":"1,3","request":1,
                       "options":{{"prefer_align_cpus_by_uncorecache":true}}}}]}}"#
    ));
    assert!(out.status.success());
    assert_eq!(
        lines(&out),
        vec![
            serde_json::json!({"cpus": ""}),
            serde_json::json!({"cpus": "1"})
        ]
    );
}

#[test]
fn a_malformed_case_exits_2_and_names_index_and_field() {
    for (case, field) in [
        (format!(r#"{{"topology":{DUAL},"available":"0-4","request":1}}"#), "available"),
        (format!(r#"{{"topology":{DUAL},"available":"0-","request":1}}"#), "available"),
        (format!(r#"{{"topology":{DUAL},"available":"0","request":-1}}"#), "request"),
        (format!(r#"{{"topology":{DUAL},"available":"0"}}"#), "request"),
        (
            format!(r#"{{"topology":{DUAL},"available":"0","request":1,"options":{{"cpu_group_size":0}}}}"#),
            "options.cpu_group_size",
        ),
        (
            r#"{"topology":{"cpus":[{"cpu":0,"core":0,"socket":0,"numa":0},{"cpu":0,"core":1,"socket":0,"numa":0}]},"available":"0","request":1}"#.to_string(),
            "topology.cpus[1].cpu",
        ),
        (
            r#"{"topology":{"cpus":[{"cpu":0,"core":"a","socket":0,"numa":0}]},"available":"0","request":1}"#.to_string(),
            "topology.cpus[0].core",
        ),
    ] {
        let out = run_stdin(&format!(
            r#"[{{"topology":{DUAL},"available":"0","request":1}}, {case}]"#
        ));
        assert_eq!(out.status.code(), Some(2), "{case}");
        let got = lines(&out);
        assert_eq!(got.len(), 2, "{case}");
        assert_eq!(got[0], serde_json::json!({"cpus": "0"}));
        assert_eq!(got[1]["field"], field, "{case}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("case 1") && err.contains(field), "{err}");
    }
    assert_eq!(run_stdin("not json").status.code(), Some(2));
}
