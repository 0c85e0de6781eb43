//! Running `rebalancer hints <SUB>` (merge, memory, cpu) through the real binary: from a file, from
//! stdin, and its JSON-lines output. Shared by `hints_merge.rs` and `hints_memory.rs`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rebalancer"))
}

/// `rebalancer hints SUB --file PATH`.
pub fn run_file(sub: &str, path: &Path) -> Output {
    bin()
        .args(["hints", sub, "--file"])
        .arg(path)
        .output()
        .expect("run rebalancer")
}

/// `rebalancer hints SUB` with `input` on stdin.
pub fn run_stdin(sub: &str, input: &str) -> Output {
    let mut child = bin()
        .args(["hints", sub])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rebalancer");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().expect("wait rebalancer")
}

/// Every stdout line, parsed as JSON.
pub fn lines(out: &Output) -> Vec<Value> {
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
        .collect()
}
