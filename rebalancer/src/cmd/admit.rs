//! `rebalancer admit`, `status` and `explain`: clients of the running daemon's admission socket.
use std::{path::PathBuf, process::ExitCode};

use anyhow::Context;

use crate::serve::client;

/// Where the daemon listens.
#[derive(Debug, clap::Args)]
pub struct SocketArg {
    /// The daemon's admission socket.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/run/rebalancer/rebalancer.sock"
    )]
    pub socket: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct AdmitArgs {
    /// Pod JSON: {"uid", "containers":[{"name","cpu_request_millis","cpu_limit_millis",
    /// "memory_bytes","memory_limit_bytes","hugepages_2mi_bytes","hugepages_1gi_bytes",
    /// "devices":{"nvidia.com/gpu":1},"device_addresses":[…]}]}. "-" reads stdin.
    #[arg(long, value_name = "FILE")]
    pub pod: PathBuf,
    /// Release the pod (by the uid in the file) instead of admitting it.
    #[arg(long)]
    pub release: bool,
    #[command(flatten)]
    pub socket: SocketArg,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print the raw JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub socket: SocketArg,
}

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// Cgroup path relative to the hierarchy root, e.g. kubepods.slice/…/cri-containerd-…scope
    pub cgroup: String,
    #[command(flatten)]
    pub socket: SocketArg,
}

fn finish(code: u16, body: &str) -> ExitCode {
    println!("{}", body.trim_end());
    match code {
        200 => ExitCode::SUCCESS,
        409 => ExitCode::from(3), // rejected by policy
        _ => {
            eprintln!("rebalancer: the daemon answered HTTP {code}");
            ExitCode::from(1)
        }
    }
}

pub fn admit(a: AdmitArgs) -> anyhow::Result<ExitCode> {
    let body = if a.pod.as_os_str() == "-" {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut s)?;
        s
    } else {
        std::fs::read(&a.pod).with_context(|| format!("reading {}", a.pod.display()))?
    };
    let (code, resp) = if a.release {
        let v: serde_json::Value = serde_json::from_slice(&body).context("pod file is not JSON")?;
        let uid = v
            .get("uid")
            .and_then(|u| u.as_str())
            .context("pod file has no string \"uid\"")?;
        let uid: String = uid
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        client::request(&a.socket.socket, "DELETE", &format!("/v1/pods/{uid}"), None)?
    } else {
        client::request(&a.socket.socket, "POST", "/v1/admit", Some(&body))?
    };
    Ok(finish(code, &resp))
}

pub fn status(a: StatusArgs) -> anyhow::Result<ExitCode> {
    let (code, body) = client::request(&a.socket.socket, "GET", "/v1/status", None)?;
    if code != 200 || a.json {
        return Ok(finish(code, &body));
    }
    let doc: crate::daemon::status::StatusDoc =
        serde_json::from_str(&body).context("the daemon's status document")?;
    print!("{}", doc.table());
    Ok(ExitCode::SUCCESS)
}

pub fn explain(a: ExplainArgs) -> anyhow::Result<ExitCode> {
    let target = format!("/v1/explain/{}", a.cgroup.trim_matches('/'));
    let (code, body) = client::request(&a.socket.socket, "GET", &target, None)?;
    let pretty = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or(body);
    Ok(finish(code, &pretty))
}
