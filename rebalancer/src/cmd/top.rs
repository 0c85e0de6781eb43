//! `rebalancer top`: a live terminal view of the running daemon — nodes × workloads (CPU share,
//! memory share, locality), redrawn every interval from `GET /v1/top`. `--once` prints one
//! screen and exits (for scripts and non-terminals).
use std::{io::IsTerminal, process::ExitCode, time::Duration};

use anyhow::Context;

use crate::serve::{client, top};

#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 2.0, value_name = "SECONDS")]
    pub interval: f64,
    /// Show at most this many workloads (the busiest by CPU, then memory).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Print one screen and exit (the default when stdout is not a terminal).
    #[arg(long)]
    pub once: bool,
    /// Print the view as JSON (implies --once).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub socket: super::admit::SocketArg,
}

fn fetch(a: &TopArgs) -> anyhow::Result<Result<String, (u16, String)>> {
    let (code, body) = client::request(
        &a.socket.socket,
        "GET",
        &format!("/v1/top?limit={}", a.limit),
        None,
    )?;
    Ok(if code == 200 {
        Ok(body)
    } else {
        Err((code, body))
    })
}

/// Width of the terminal (COLUMNS, else 100), for the workload column.
fn name_width() -> usize {
    let cols: usize = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(100);
    cols.saturating_sub(40).clamp(12, 60)
}

pub fn run(a: TopArgs) -> anyhow::Result<ExitCode> {
    if !(a.interval.is_finite() && a.interval >= 0.1) {
        anyhow::bail!("--interval must be at least 0.1 s");
    }
    let live = !a.once && !a.json && std::io::stdout().is_terminal();
    loop {
        let body = match fetch(&a)? {
            Ok(b) => b,
            Err((code, body)) => {
                eprintln!(
                    "rebalancer: the daemon answered HTTP {code}: {}",
                    body.trim()
                );
                return Ok(ExitCode::from(1));
            }
        };
        if a.json {
            println!("{}", body.trim_end());
            return Ok(ExitCode::SUCCESS);
        }
        let view: top::TopView = serde_json::from_str(&body).context("top view is not JSON")?;
        let screen = top::render(&view, name_width());
        if !live {
            print!("{screen}");
            return Ok(ExitCode::SUCCESS);
        }
        // Home, clear, draw.
        print!(
            "\x1b[H\x1b[2J{screen}\n(refreshing every {} s; Ctrl-C to quit)\n",
            a.interval
        );
        std::io::Write::flush(&mut std::io::stdout())?;
        std::thread::sleep(Duration::from_secs_f64(a.interval));
    }
}
