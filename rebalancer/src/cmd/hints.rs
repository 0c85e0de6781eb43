//! `rebalancer hints merge`: the Topology Manager merge as a command (conformance contract,
//! ../shared/conformance/README.md). One case object on stdin, or `--file` with an array of
//! cases; one JSON result line per case on stdout, in order. A malformed case gets an
//! `{"error": …}` line and a message on stderr naming its index and field; the exit status is
//! then 2 (the other cases still print their result). Input that is not JSON at all, or a file
//! that cannot be read, is reported on stderr with exit status 2 and no lines.
//!
//! Leniency beyond the contract: stdin may also hold an array, and `--file` a single object.
use std::io::{Read, Write};
use std::process::ExitCode;

use anyhow::Context;
use serde_json::Value;

use crate::placement::merge_case::{decision_json, error_json, parse_case};

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
}

pub fn run(c: HintsCommand) -> anyhow::Result<ExitCode> {
    match c {
        HintsCommand::Merge { file } => merge(file.as_deref()),
    }
}

fn merge(file: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    let (text, source) = match read_input(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("rebalancer: hints merge: {e:#}");
            return Ok(ExitCode::from(2));
        }
    };
    let input: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("rebalancer: hints merge: {source} is not valid JSON: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let cases = match input {
        Value::Array(items) => items,
        one => vec![one],
    };
    let mut out = std::io::stdout().lock();
    let mut failed = false;
    for (index, case) in cases.iter().enumerate() {
        let line = match parse_case(case) {
            Ok(c) => decision_json(&c.decide()),
            Err(e) => {
                failed = true;
                eprintln!("rebalancer: hints merge: {source}: case {index}: {e}");
                error_json(index, &e)
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
