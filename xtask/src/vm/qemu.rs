//! Boots a guest under QEMU TCG (KVM hangs on these machines) and collects its serial console,
//! with a deadline: every line goes to the log file, most are echoed live. A guest whose kernel
//! never reaches the test init (`VM-BOOTED`) within [`INIT_LIMIT`] is booted once more: under
//! TCG the kernel has hung at boot, a worker in a soft lockup from its first seconds, before
//! any scenario ran (one boot in about a hundred).
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

#[derive(Debug)]
pub struct Boot {
    pub console: String,
    pub seconds: f64,
    pub timed_out: bool,
}

/// How long a kernel may take to reach the test init (`VM-BOOTED`): 5-15 s under TCG here,
/// up to about 30 s beside a busy build.
const INIT_LIMIT: Duration = Duration::from_secs(120);

/// How one QEMU run ended.
enum Ended {
    /// It exited, or `timeout` passed (`true`: killed).
    Ran(Boot),
    /// Killed: the kernel never reached the test init within [`INIT_LIMIT`].
    NoInit,
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

/// Runs QEMU with `args` until it exits or `timeout` passes (then kills it); a kernel that never
/// reached the test init is killed after [`INIT_LIMIT`] and booted once more (its log kept
/// beside `log` as `<log>.no-init`).
pub fn boot(args: &[String], log: &Path, timeout: Duration, prefix: &str) -> Result<Boot> {
    boot_with(
        "qemu-system-x86_64",
        args,
        log,
        (timeout, INIT_LIMIT),
        prefix,
    )
}

/// [`boot`] of `program`, with `(timeout, init_limit)`.
fn boot_with(
    program: &str,
    args: &[String],
    log: &Path,
    limits: (Duration, Duration),
    prefix: &str,
) -> Result<Boot> {
    let (timeout, init_limit) = limits;
    if let Ended::Ran(b) = boot_once(program, args, log, limits, prefix)? {
        return Ok(b);
    }
    let kept = log.with_extension("log.no-init");
    std::fs::rename(log, &kept).with_context(|| format!("renaming {}", log.display()))?;
    println!(
        "{prefix} the guest kernel did not reach the test init within {:.1}s (log: {}); booting it once more",
        init_limit.as_secs_f64(),
        kept.display()
    );
    match boot_once(program, args, log, limits, prefix)? {
        Ended::Ran(b) => Ok(b),
        Ended::NoInit => anyhow::bail!(
            "the guest kernel did not reach the test init within {:.1}s, twice (logs: {}, {}; timeout {}s)",
            init_limit.as_secs_f64(),
            kept.display(),
            log.display(),
            timeout.as_secs()
        ),
    }
}

fn boot_once(
    program: &str,
    args: &[String],
    log: &Path,
    (timeout, init_limit): (Duration, Duration),
    prefix: &str,
) -> Result<Ended> {
    let mut logf = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    writeln!(logf, "# {program} {}", args.join(" "))?;
    let start = Instant::now();
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {program}"))?;
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
    let init_deadline = start + init_limit.min(timeout);
    let mut console = String::new();
    let mut in_data = false;
    let mut timed_out = false;
    let mut booted = false;
    loop {
        let until = if booted { deadline } else { init_deadline };
        match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                writeln!(logf, "{line}")?;
                if echo(&line, &mut in_data) {
                    println!("{prefix} {line}");
                }
                // Not at the line's start: the firmware's clear-screen sequence and "Booting
                // from ROM.." share the console's line with it.
                booted |= line.contains("VM-BOOTED ");
                console.push_str(&line);
                console.push('\n');
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) if !booted && until < deadline => {
                let _ = child.kill();
                let _ = child.wait();
                writeln!(
                    logf,
                    "# host: killed QEMU: no VM-BOOTED within {}s",
                    init_limit.as_secs_f64()
                )?;
                return Ok(Ended::NoInit);
            }
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
    Ok(Ended::Ran(Boot {
        console,
        seconds: start.elapsed().as_secs_f64(),
        timed_out,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guest that never reaches the init is booted once more; the second boot's console is
    /// the result and the first one's log is kept. One that never reaches it twice is an error.
    #[test]
    fn a_kernel_that_never_reaches_the_init_is_booted_once_more() {
        let dir = tempfile_dir("qemu-retry");
        let log = dir.join("guest.log");
        let marker = dir.join("first-done");
        // First run: silent (a hung kernel); later runs: the init's lines.
        let script = format!(
            "if [ -e {m} ]; then printf 'Booting from ROM..\\033c\\033[2JVM-BOOTED x\\n'; echo VM-DONE; else touch {m}; exec sleep 30; fi",
            m = marker.display()
        );
        let args = vec!["-c".to_string(), script];
        let limits = (Duration::from_secs(20), Duration::from_millis(300));
        let b = boot_with("sh", &args, &log, limits, "[t]").unwrap();
        assert!(b.console.contains("VM-DONE"), "{}", b.console);
        assert!(!b.timed_out);
        assert!(log.with_extension("log.no-init").exists());
        let never = vec!["-c".to_string(), "exec sleep 30".to_string()];
        let e = boot_with("sh", &never, &dir.join("never.log"), limits, "[t]").unwrap_err();
        assert!(e.to_string().contains("twice"), "{e:#}");
        // A guest that booted is never cut short by the init limit, whatever precedes the
        // line on the console (the firmware's escape sequences do).
        let slow = vec![
            "-c".to_string(),
            "printf 'Booting from ROM..\\033c\\033[?7l\\033[2JVM-BOOTED x\\n'; sleep 1; echo VM-DONE"
                .to_string(),
        ];
        let b = boot_with("sh", &slow, &dir.join("slow.log"), limits, "[t]").unwrap();
        assert!(
            b.console.contains("VM-DONE") && !b.timed_out,
            "{}",
            b.console
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

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
