//! Boots a guest under QEMU TCG (KVM hangs on these machines) and collects its serial console,
//! with a deadline: every line goes to the log file, most are echoed live.
use std::{
    fs::File,
    io::{BufRead, BufReader, Read, Write},
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::topology::VmTopology;

pub struct Boot {
    pub console: String,
    pub seconds: f64,
    pub timed_out: bool,
}

/// The full QEMU command line for `topo`.
pub fn command_line(topo: &VmTopology, kernel: &Path, initrd: &Path) -> Vec<String> {
    let mut a: Vec<String> = ["-accel", "tcg,thread=multi", "-cpu", "max"]
        .map(String::from)
        .to_vec();
    a.extend(topo.qemu_args());
    a.extend([
        "-kernel".into(),
        kernel.display().to_string(),
        "-initrd".into(),
        initrd.display().to_string(),
        "-append".into(),
        "console=ttyS0 quiet panic=-1".into(),
        "-nographic".into(),
        "-net".into(),
        "none".into(),
        "-no-reboot".into(),
    ]);
    a
}

/// Whether a console line is worth echoing live (data blocks and per-second JSON samples stay
/// in the log only). `in_data` tracks DATA-BEGIN/DATA-END.
fn echo(line: &str, in_data: &mut bool) -> bool {
    if line.starts_with("DATA-BEGIN ") {
        *in_data = true;
        return true;
    }
    if line.starts_with("DATA-END ") {
        *in_data = false;
        return true;
    }
    !*in_data && !line.starts_with('{')
}

/// Runs QEMU with `args` until it exits or `timeout` passes (then kills it).
pub fn boot(args: &[String], log: &Path, timeout: Duration, prefix: &str) -> Result<Boot> {
    let mut logf = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    writeln!(logf, "# qemu-system-x86_64 {}", args.join(" "))?;
    let start = Instant::now();
    let mut child = Command::new("qemu-system-x86_64")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning qemu-system-x86_64")?;
    let (tx, rx) = mpsc::channel::<String>();
    let out = child.stdout.take().context("qemu stdout")?;
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(out);
        let mut buf = Vec::new();
        while r.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
            let line = String::from_utf8_lossy(&buf)
                .trim_end_matches(['\n', '\r'])
                .to_string();
            if tx.send(line).is_err() {
                break;
            }
            buf.clear();
        }
    });
    let mut err = child.stderr.take().context("qemu stderr")?;
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = start + timeout;
    let mut console = String::new();
    let mut in_data = false;
    let mut timed_out = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                writeln!(logf, "{line}")?;
                if echo(&line, &mut in_data) {
                    println!("{prefix} {line}");
                }
                console.push_str(&line);
                console.push('\n');
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                let _ = child.kill();
                writeln!(logf, "# host: killed QEMU after {}s", timeout.as_secs())?;
                break;
            }
        }
    }
    let status = child.wait()?;
    let _ = reader.join();
    let stderr = err_reader.join().unwrap_or_default();
    if !stderr.trim().is_empty() {
        writeln!(logf, "# qemu stderr:\n{stderr}")?;
        eprintln!("{prefix} qemu stderr: {}", stderr.trim());
    }
    writeln!(logf, "# qemu exit: {status}")?;
    Ok(Boot {
        console,
        seconds: start.elapsed().as_secs_f64(),
        timed_out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_hides_data_blocks_and_json_samples() {
        let mut d = false;
        let shown: Vec<&str> = [
            "VERDICT a PASS x",
            "{\"event\":\"sample\"}",
            "DATA-BEGIN k",
            "node=0",
            "DATA-END k rc=0",
            "after",
        ]
        .into_iter()
        .filter(|l| echo(l, &mut d))
        .collect();
        assert_eq!(
            shown,
            [
                "VERDICT a PASS x",
                "DATA-BEGIN k",
                "DATA-END k rc=0",
                "after"
            ]
        );
    }
}
