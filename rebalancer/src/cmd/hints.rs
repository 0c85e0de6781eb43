//! `rebalancer hints merge`: the Topology Manager merge as a command (conformance contract,
//! ../shared/conformance/README.md), `rebalancer hints memory`: one Memory Manager
//! operation per case (../shared/conformance/memory-manager.md), and `rebalancer hints cpu`:
//! kubelet's static-policy CPU take per case (../shared/conformance/cpu-manager.md). One case
//! object on stdin, or `--file` with an array of cases (for `memory` and `cpu` also
//! `{"cases": [...]}`); one JSON result line
//! per case on stdout, in order. A malformed case gets an
//! `{"error": …}` line and a message on stderr naming its index and field; the exit status is
//! then 2 (the other cases still print their result). Input that is not JSON at all, or a file
//! that cannot be read, is reported on stderr with exit status 2 and no lines.
//!
//! Leniency beyond the contract: stdin may also hold an array, and `--file` a single object.
use std::io::{Read, Write};
use std::process::ExitCode;

use anyhow::Context;
use serde_json::Value;

use crate::placement::merge_case::{decision_json, error_json, parse_case, CaseError};
use crate::placement::{cpu_case, memory_case};

#[derive(Debug, clap::Subcommand)]
pub enum HintsCommand {
    /// Merge provider hints under a policy: one case object on stdin, or an array with --file.
    ///
    /// Prints one line per case: {"affinity":[ids]|null,"preferred":bool,"admit":bool}.
    /// Exit status 2 when a case is malformed (its line then holds "error").
    Merge {
        /// A JSON file holding an array of cases (one result line per case, same order).
        #[arg(long)]
        file: Option<std::path::PathBuf>,
    },
    /// Run one Memory Manager (static policy) operation per case: new, start, allocate,
    /// remove_container, get_topology_hints or get_pod_requested_resources.
    ///
    /// Prints one line per case: {"error":…,"assignments":…,"machine_state":…,
    /// "topology_hints":…,"requested":…}. Exit status 2 when a case is malformed.
    Memory {
        /// A JSON file holding an array of cases, or {"cases": [...]}.
        #[arg(long)]
        file: Option<std::path::PathBuf>,
    },
    /// kubelet's static-policy CPU take (takeByTopologyNUMAPacked / NUMADistributed) per case:
    /// a machine's CPUs, the available ones, a request and the options.
    ///
    /// Prints one line per case: {"cpus":"0-3,8"} or {"error":"…"} (kubelet's error text).
    /// Exit status 2 when a case is malformed.
    Cpu {
        /// A JSON file holding an array of cases, or {"cases": [...]}.
        #[arg(long)]
        file: Option<std::path::PathBuf>,
    },
}

pub fn run(c: HintsCommand) -> anyhow::Result<ExitCode> {
    match c {
        HintsCommand::Merge { file } => run_cases("merge", file.as_deref(), &|case, index| {
            parse_case(case)
                .map(|c| decision_json(&c.decide()))
                .map_err(|e| (error_json(index, &e), e))
        }),
        HintsCommand::Memory { file } => run_cases("memory", file.as_deref(), &|case, index| {
            memory_case::parse_case(case)
                .map(|c| memory_case::outcome_json(&c.evaluate()))
                .map_err(|e| (memory_case::error_line(index, &e), e))
        }),
        HintsCommand::Cpu { file } => run_cases("cpu", file.as_deref(), &|case, index| {
            cpu_case::parse_case(case)
                .map(|c| cpu_case::outcome_json(&c.evaluate()))
                .map_err(|e| (error_json(index, &e), e))
        }),
    }
}

/// One case to its output line, or to its error line and error.
type Eval<'a> = dyn Fn(&Value, usize) -> Result<String, (String, CaseError)> + 'a;

fn run_cases(name: &str, file: Option<&std::path::Path>, eval: &Eval) -> anyhow::Result<ExitCode> {
    let (text, source) = match read_input(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("rebalancer: hints {name}: {e:#}");
            return Ok(ExitCode::from(2));
        }
    };
    let input: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("rebalancer: hints {name}: {source} is not valid JSON: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let cases = match input {
        Value::Array(items) => items,
        Value::Object(mut o) if name != "merge" && o.get("cases").is_some_and(Value::is_array) => {
            match o.remove("cases") {
                Some(Value::Array(items)) => items,
                _ => Vec::new(),
            }
        }
        one => vec![one],
    };
    let mut out = std::io::stdout().lock();
    let mut failed = false;
    for (index, case) in cases.iter().enumerate() {
        let line = match eval(case, index) {
            Ok(l) => l,
            Err((line, e)) => {
                failed = true;
                eprintln!("rebalancer: hints {name}: {source}: case {index}: {e}");
                line
            }
        };
        writeln!(out, "{line}").context("writing stdout")?;
    }
    out.flush().context("writing stdout")?;
    Ok(if failed {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

fn read_input(file: Option<&std::path::Path>) -> anyhow::Result<(String, String)> {
    match file {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?;
            Ok((text, p.display().to_string()))
        }
        None => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("cannot read stdin")?;
            Ok((text, "stdin".to_string()))
        }
    }
}
