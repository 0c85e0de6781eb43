//! `guest-tool`: static helper run inside the multi-NUMA test guest (`cargo xtask vm-test`).
//! The guest has busybox only (no numactl, no jq), so workloads and measurements live here.
//!
//! - `hog`: allocate N MiB by first touch while pinned to one node, move its own affinity to
//!   another node, keep touching, and report where its pages are (/proc/self/numa_maps)
//!   as JSON lines, then one `HOG-RESULT key=value …` line for shell scripts.
//! - `locality`: the same measure for other processes, from /proc/PID/numa_maps (one line per
//!   pid, and for several pids a `LOCALITY-TOTAL` line summing them: the benchmark's aggregate).
//! - `spin`: burn CPU on N threads for S seconds (load for the sampling scenarios).
//! - `hotset`: a hot set written on one node beside a larger cold set on another, run from a
//!   third (or either); reports the truth it knows — the share of the pages it writes that are
//!   local — next to the share of all its pages that are.
//! - `mkcg`: make a cgroup as a container runtime does and time the daemon's cpuset write.
//! - `latency`: admission and `/healthz` latency of a running daemon, request by request.
//! - `migrate`: move another process's memory to a node by one method and report the rate.
//! - `first-move`: when the first pages of some cgroups arrive on a node (decision latency).
//! - `vmstat`: a /proc/vmstat counter sampled steadily, each reading bracketed by the clock.
mod firstmove;
mod latency;
mod migrate;
mod mkcg;
mod numa;
mod vmstat;
mod watch;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use serde_json::json;

const PAGE: usize = 4096;

#[derive(Parser)]
#[command(name = "guest-tool")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Allocate memory on one node, move to another, report page locality over time.
    Hog(HogArgs),
    /// Page locality of running processes (pages on the nodes their threads may run on).
    Locality {
        /// Process to measure (repeatable; a pid that is gone is counted as missing).
        #[arg(long, required = true)]
        pid: Vec<i32>,
        /// Count file-backed pages too (default: anonymous memory only).
        #[arg(long)]
        all: bool,
        /// Read where each page is from /proc/PID/pagemap (frames, root only) and the memory
        /// blocks of each node, instead of numa_maps: the same count by another path (a page
        /// the NUMA balancer made PROT_NONE is still present with its frame).
        #[arg(long)]
        pagemap: bool,
        /// Lower this reader's priority first (setpriority; the guest's busybox has no `nice`).
        #[arg(long, default_value_t = 0)]
        nice: i32,
    },
    /// Burn CPU.
    Spin {
        #[arg(long, default_value_t = 1)]
        threads: u32,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Each thread moves its own affinity round these nodes (comma list), forcing
        /// cross-node migrations (a node its cpuset no longer allows is skipped).
        #[arg(long, value_delimiter = ',')]
        flip_nodes: Vec<u32>,
        /// Time on each node when flipping (ms).
        #[arg(long, default_value_t = 200)]
        flip_ms: u64,
        /// Sleep this long (µs) after every burst of work (threads that sleep and wake are
        /// placed anew by the scheduler at each wakeup).
        #[arg(long, default_value_t = 0)]
        sleep_us: u64,
        /// First touch this much memory (MiB) on `mem_node`, then run on every allowed CPU.
        #[arg(long, default_value_t = 0)]
        mib: usize,
        #[arg(long, default_value_t = 0)]
        mem_node: u32,
    },
    /// Write a hot set while a cold set sits idle; report which share of the written pages
    /// (the truth) and of all pages (what resident memory says) is local.
    Hotset(HotsetArgs),
    /// Make a cgroup as a runtime does (mkdir, then its limits), and wait for its cpuset.
    Mkcg {
        #[arg(long)]
        dir: std::path::PathBuf,
        /// FILE=VALUE written right after mkdir, e.g. --set "cpu.max=100000 100000".
        #[arg(long = "set", value_name = "FILE=VALUE")]
        set: Vec<String>,
        /// How long to wait for cpuset.cpus to be written (ms).
        #[arg(long, default_value_t = 5000)]
        wait_ms: u64,
    },
    /// Move a process's memory to one node (move_pages(2) in batches, or migrate_pages(2))
    /// and print the pages moved per second.
    Migrate {
        #[arg(long)]
        pid: i32,
        #[arg(long)]
        to_node: u32,
        /// move-pages or migrate-pages.
        #[arg(long, default_value = "move-pages")]
        method: String,
        /// Pages per move_pages call.
        #[arg(long, default_value_t = 512)]
        batch_pages: u64,
        /// Query where the pages are before and after each move_pages call.
        #[arg(long)]
        query: bool,
    },
    /// Report what a stalled loop waits for: when HEARTBEAT is older than STALE_MS, the D-state
    /// tasks and the watched processes' threads with their kernel stacks (spawns nothing).
    Watch {
        #[arg(long)]
        heartbeat: std::path::PathBuf,
        /// A process whose threads and descendants are reported (repeatable).
        #[arg(long)]
        pid: Vec<u32>,
        #[arg(long, default_value_t = 1500)]
        stale_ms: u64,
        #[arg(long, default_value_t = 120.0)]
        seconds: f64,
    },
    /// Time admissions over the socket and /healthz over TCP, request by request.
    Latency {
        #[arg(long, default_value = "/run/rebalancer/rebalancer.sock")]
        socket: std::path::PathBuf,
        /// host:port of the daemon's metrics listener.
        #[arg(long, default_value = "127.0.0.1:9717")]
        healthz: String,
        #[arg(long, default_value_t = 30.0)]
        seconds: f64,
        /// Pause between two requests of one client (ms).
        #[arg(long, default_value_t = 20)]
        interval_ms: u64,
    },
    /// Wait for the first pages of some cgroups to arrive on a node; print when (uptime).
    FirstMove {
        /// A cgroup directory (repeatable): the first of them to gain `bytes` on `node` counts.
        #[arg(long, required = true)]
        cgroup: Vec<std::path::PathBuf>,
        #[arg(long)]
        node: u32,
        /// Growth of anonymous memory on the node that counts as pages moved there.
        #[arg(long, default_value_t = 1 << 20)]
        bytes: u64,
        #[arg(long, default_value_t = 20)]
        poll_ms: u64,
        /// Give up after this long (prints `FIRST-MOVE never`).
        #[arg(long, default_value_t = 60.0)]
        seconds: f64,
    },
    /// Sample a /proc/vmstat counter: `BEFORE COUNT AFTER` lines, the UTC times of day read
    /// just before and just after each reading.
    Vmstat {
        #[arg(long, default_value = "pgmigrate_success")]
        key: String,
        #[arg(long, default_value_t = 100)]
        interval_ms: u64,
        /// Raise (negative) or lower this sampler's priority first.
        #[arg(long, default_value_t = 0)]
        nice: i32,
        #[arg(long, default_value_t = 3600.0)]
        seconds: f64,
    },
}

#[derive(clap::Args)]
struct HotsetArgs {
    /// Hot (written) memory, MiB, first-touched on `hot_node`.
    #[arg(long, default_value_t = 32)]
    hot_mib: usize,
    #[arg(long)]
    hot_node: u32,
    /// Cold (never touched again) memory, MiB, first-touched on `cold_node`.
    #[arg(long, default_value_t = 224)]
    cold_mib: usize,
    #[arg(long)]
    cold_node: u32,
    /// Node whose CPUs it then runs on, writing the hot set.
    #[arg(long)]
    run_node: u32,
    #[arg(long, default_value_t = 300.0)]
    seconds: f64,
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// 4 KiB pages only (MADV_NOHUGEPAGE), not transparent huge pages where the kernel gives them.
    #[arg(long)]
    no_thp: bool,
}

#[derive(clap::Args)]
struct HogArgs {
    /// Memory to allocate (MiB).
    #[arg(long, default_value_t = 256)]
    mib: usize,
    /// Node whose CPUs the hog runs on while it first-touches its memory.
    #[arg(long)]
    from_node: u32,
    /// Node whose CPUs the hog moves to after allocating (omit to stay; e.g. when a daemon or
    /// a cpuset change moves it).
    #[arg(long)]
    to_node: Option<u32>,
    /// Keep touching on the first node this long before moving (ms).
    #[arg(long, default_value_t = 0)]
    settle_ms: u64,
    /// Run this long after the move (s).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Report every this many ms.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Stop as soon as this fraction of pages is local.
    #[arg(long)]
    until_local: Option<f64>,
    /// madvise(MADV_NOHUGEPAGE) the buffer (4 KiB pages only).
    #[arg(long)]
    no_thp: bool,
}

fn main() {
    if let Err(e) = run(Cli::parse().cmd) {
        eprintln!("guest-tool: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Hog(a) => hog(a),
        Cmd::Locality {
            pid,
            all,
            pagemap,
            nice,
        } => {
            if nice != 0 {
                // SAFETY: plain syscall on this process.
                if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
                    return Err(std::io::Error::last_os_error()).context("setpriority");
                }
            }
            locality_of(&pid, all, pagemap)
        }
        Cmd::Spin {
            threads,
            seconds,
            flip_nodes,
            flip_ms,
            sleep_us,
            mib,
            mem_node,
        } => {
            let _mem = if mib > 0 {
                Some(first_touch(mib, mem_node)?)
            } else {
                None
            };
            spin(threads, seconds, &flip_nodes, flip_ms, sleep_us)
        }
        Cmd::Hotset(a) => hotset(a),
        Cmd::Mkcg { dir, set, wait_ms } => mkcg::mkcg(&dir, &set, wait_ms),
        Cmd::Migrate {
            pid,
            to_node,
            method,
            batch_pages,
            query,
        } => migrate::run(pid, to_node, &method, batch_pages, query),
        Cmd::Watch {
            heartbeat,
            pid,
            stale_ms,
            seconds,
        } => watch::run(&heartbeat, &pid, stale_ms, seconds),
        Cmd::Latency {
            socket,
            healthz,
            seconds,
            interval_ms,
        } => latency::run(&socket, &healthz, seconds, interval_ms),
        Cmd::FirstMove {
            cgroup,
            node,
            bytes,
            poll_ms,
            seconds,
        } => firstmove::run(&cgroup, node, bytes, poll_ms, seconds),
        Cmd::Vmstat {
            key,
            interval_ms,
            nice,
            seconds,
        } => vmstat::run(&key, interval_ms, nice, seconds),
    }
}

fn hotset(a: HotsetArgs) -> Result<()> {
    let map = node_cpus()?;
    let cpus = |n: u32| map.get(&n).with_context(|| format!("no node {n}"));
    set_affinity(0, cpus(a.hot_node)?)?;
    std::thread::sleep(Duration::from_millis(20));
    let hot = Buffer::new(a.hot_mib << 20, a.no_thp)?;
    hot.touch(1);
    set_affinity(0, cpus(a.cold_node)?)?;
    std::thread::sleep(Duration::from_millis(20));
    let cold = Buffer::new(a.cold_mib << 20, a.no_thp)?;
    cold.touch(1);
    let (h, c) = (hot.placement()?, cold.placement()?);
    println!(
        "{}",
        json!({"event": "allocated", "hot": per_node_json(&h), "cold": per_node_json(&c)})
    );
    set_affinity(0, cpus(a.run_node)?)?;
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(a.seconds);
    let (mut cursor, mut round) = (0, 2u8);
    // Pages written since t0: what the writer got done (a manager's faults slow it).
    let mut written = 0u64;
    while Instant::now() < end {
        let next = (Instant::now() + Duration::from_millis(a.interval_ms)).min(end);
        while Instant::now() < next {
            let from = cursor;
            hot.touch_until(&mut cursor, round, Some(next));
            // A pass that reached the end leaves the cursor at 0.
            let to = if cursor == 0 { hot.len } else { cursor };
            written += ((to - from) / PAGE) as u64;
            if cursor == 0 {
                round = round.wrapping_add(1);
            }
        }
        let (h, c) = (hot.placement()?, cold.placement()?);
        let local_nodes = nodes_of(&affinity(0)?, &map);
        let mut all = h.clone();
        for (n, p) in &c {
            *all.entry(*n).or_default() += p;
        }
        // Every write goes to the hot set: its local share is the locality of the accesses.
        let truth = numa::locality(&h, &local_nodes);
        let resident = numa::locality(&all, &local_nodes);
        println!(
            "{}",
            json!({"event": "sample", "t": t0.elapsed().as_secs_f64(), "hot": per_node_json(&h),
                   "cold": per_node_json(&c), "local_nodes": local_nodes})
        );
        let (minflt, cpu_ms) = usage();
        println!(
            "HOTSET t={:.1} truth={truth:.4} resident={resident:.4} pgmigrate={} written={written} minflt={minflt} cpu_ms={cpu_ms}",
            t0.elapsed().as_secs_f64(),
            migrate::pgmigrate(),
        );
    }
    Ok(())
}

/// This process's minor faults and CPU time (ms, user and system) so far.
fn usage() -> (u64, u64) {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (0, 0);
    }
    let ms = |t: libc::timeval| t.tv_sec as u64 * 1000 + t.tv_usec as u64 / 1000;
    (ru.ru_minflt as u64, ms(ru.ru_utime) + ms(ru.ru_stime))
}

/// `mib` MiB first-touched on `node`'s CPUs; the affinity is then widened back to every CPU
/// the cgroup allows.
fn first_touch(mib: usize, node: u32) -> Result<Buffer> {
    let map = node_cpus()?;
    let before = affinity(0)?;
    set_affinity(
        0,
        map.get(&node).with_context(|| format!("no node {node}"))?,
    )?;
    std::thread::sleep(Duration::from_millis(20));
    let buf = Buffer::new(mib << 20, false)?;
    buf.touch(1);
    set_affinity(0, &before)?;
    println!("SPIN-ALLOCATED mib={mib} node={node}");
    Ok(buf)
}

fn spin(threads: u32, seconds: f64, flip_nodes: &[u32], flip_ms: u64, sleep_us: u64) -> Result<()> {
    let map = node_cpus()?;
    let flips: Vec<Vec<u32>> = flip_nodes
        .iter()
        .map(|n| map.get(n).cloned().with_context(|| format!("no node {n}")))
        .collect::<Result<_>>()?;
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let flips = flips.clone();
            std::thread::spawn(move || -> Result<()> {
                let mut x = 0u64;
                let mut next_flip = Instant::now();
                let mut k = 0;
                while Instant::now() < end {
                    if !flips.is_empty() && Instant::now() >= next_flip {
                        // Refused (EINVAL) once a cpuset leaves none of that node's CPUs:
                        // the thread then stays where the cpuset lets it run.
                        let _ = set_affinity(0, &flips[k % flips.len()]);
                        k += 1;
                        next_flip += Duration::from_millis(flip_ms);
                    }
                    for i in 0..10_000u64 {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
                    }
                    if sleep_us > 0 {
                        std::thread::sleep(Duration::from_micros(sleep_us));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for h in hs {
        h.join()
            .map_err(|_| anyhow::anyhow!("spin thread panicked"))??;
    }
    Ok(())
}

/// CPUs of each node, from /sys/devices/system/node/node*/cpulist.
fn node_cpus() -> Result<BTreeMap<u32, Vec<u32>>> {
    let mut m = BTreeMap::new();
    for e in std::fs::read_dir("/sys/devices/system/node").context("listing NUMA nodes")? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let p = e.path().join("cpulist");
        let s = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        m.insert(id, numa::parse_list(&s).map_err(anyhow::Error::msg)?);
    }
    Ok(m)
}

fn set_affinity(tid: i32, cpus: &[u32]) -> Result<()> {
    if cpus.is_empty() {
        bail!("refusing an empty CPU affinity");
    }
    // SAFETY: cpu_set_t is plain data; CPU_SET stays in bounds for ids < CPU_SETSIZE (checked).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c as usize >= libc::CPU_SETSIZE as usize {
                bail!("cpu {c} beyond CPU_SETSIZE");
            }
            libc::CPU_SET(c as usize, &mut set);
        }
        if libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) != 0 {
            return Err(std::io::Error::last_os_error()).context("sched_setaffinity");
        }
    }
    Ok(())
}

fn affinity(tid: i32) -> Result<Vec<u32>> {
    // SAFETY: as above; the kernel fills the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(tid, std::mem::size_of_val(&set), &mut set) != 0 {
            return Err(std::io::Error::last_os_error()).context("sched_getaffinity");
        }
        Ok((0..libc::CPU_SETSIZE as u32)
            .filter(|&c| libc::CPU_ISSET(c as usize, &set))
            .collect())
    }
}

/// Nodes whose CPUs intersect `cpus`.
fn nodes_of(cpus: &[u32], map: &BTreeMap<u32, Vec<u32>>) -> Vec<u32> {
    map.iter()
        .filter(|(_, cs)| cs.iter().any(|c| cpus.contains(c)))
        .map(|(n, _)| *n)
        .collect()
}

/// An anonymous private mapping, unmapped on drop.
struct Buffer {
    ptr: *mut u8,
    len: usize,
}

impl Buffer {
    fn new(len: usize, no_thp: bool) -> Result<Self> {
        // SAFETY: anonymous mapping; checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mmap");
        }
        if no_thp {
            // SAFETY: the range was just mapped.
            unsafe { libc::madvise(ptr, len, libc::MADV_NOHUGEPAGE) };
        }
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Writes one byte in every page (first touch allocates; later touches keep the pages hot
    /// for NUMA hinting faults).
    fn touch(&self, round: u8) {
        let mut cursor = 0;
        self.touch_until(&mut cursor, round, None);
    }

    /// Like `touch`, from `*cursor` on, returning early (cursor kept) once `deadline` passes —
    /// a pass can take seconds under emulation while pages fault and migrate.
    fn touch_until(&self, cursor: &mut usize, round: u8, deadline: Option<Instant>) {
        while *cursor < self.len {
            // SAFETY: cursor < len, inside the mapping.
            unsafe { std::ptr::write_volatile(self.ptr.add(*cursor), round) };
            *cursor += PAGE;
            if (*cursor / PAGE).is_multiple_of(256) && deadline.is_some_and(|d| Instant::now() >= d)
            {
                return;
            }
        }
        *cursor = 0;
    }

    /// Pages of the buffer per node, from /proc/self/numa_maps (the line of the mapping that
    /// holds the buffer; /proc/self/maps gives its start). move_pages(2) in query mode is no
    /// use here: it reports -ENOENT for pages whose PTEs AutoNUMA has made PROT_NONE.
    fn placement(&self) -> Result<BTreeMap<u32, u64>> {
        let addr = self.ptr as usize;
        let maps = std::fs::read_to_string("/proc/self/maps").context("reading /proc/self/maps")?;
        let start = maps
            .lines()
            .find_map(|l| {
                let (a, b) = l.split_whitespace().next()?.split_once('-')?;
                let (a, b) = (
                    usize::from_str_radix(a, 16).ok()?,
                    usize::from_str_radix(b, 16).ok()?,
                );
                (a <= addr && addr < b).then_some(a)
            })
            .context("buffer not found in /proc/self/maps")?;
        let text = std::fs::read_to_string("/proc/self/numa_maps")
            .context("reading /proc/self/numa_maps")?;
        let line = text
            .lines()
            .find(|l| {
                l.split_whitespace()
                    .next()
                    .and_then(|a| usize::from_str_radix(a, 16).ok())
                    == Some(start)
            })
            .context("buffer not found in /proc/self/numa_maps")?;
        Ok(numa::numa_maps_line(line, false))
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: unmapping what new() mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn per_node_json(m: &BTreeMap<u32, u64>) -> serde_json::Value {
    m.iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn hog(a: HogArgs) -> Result<()> {
    let map = node_cpus()?;
    let from_cpus = map
        .get(&a.from_node)
        .with_context(|| format!("no node {}", a.from_node))?;
    set_affinity(0, from_cpus).with_context(|| format!("pinning to node {}", a.from_node))?;
    // Let the scheduler move us before the first touch.
    std::thread::sleep(Duration::from_millis(20));
    let buf = Buffer::new(a.mib << 20, a.no_thp)?;
    let t_alloc = Instant::now();
    buf.touch(1);
    let alloc_s = t_alloc.elapsed().as_secs_f64();
    let settle_end = Instant::now() + Duration::from_millis(a.settle_ms);
    let mut round = 2u8;
    while Instant::now() < settle_end {
        buf.touch(round);
        round = round.wrapping_add(1);
    }
    let hist = buf.placement()?;
    let pages = (a.mib << 20) / PAGE;
    let on_from = numa::locality(&hist, &[a.from_node]);
    let migrated0 = migrate::pgmigrate();
    println!(
        "{}",
        json!({"event": "allocated", "mib": a.mib, "pages": pages, "seconds": alloc_s,
               "per_node": per_node_json(&hist), "on_from_node": on_from})
    );
    if let Some(to) = a.to_node {
        let cpus = map.get(&to).with_context(|| format!("no node {to}"))?;
        set_affinity(0, cpus).with_context(|| format!("moving to node {to}"))?;
    }
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(a.seconds);
    let mut reached: Option<f64> = None;
    let mut cursor = 0;
    let mut last;
    loop {
        let next = (Instant::now() + Duration::from_millis(a.interval_ms)).min(end);
        while Instant::now() < next {
            buf.touch_until(&mut cursor, round, Some(next));
            if cursor == 0 {
                round = round.wrapping_add(1);
            }
        }
        let hist = buf.placement()?;
        let local_nodes = nodes_of(&affinity(0)?, &map);
        let local = numa::locality(&hist, &local_nodes);
        let off_from: u64 = hist
            .iter()
            .filter(|(n, _)| **n != a.from_node)
            .map(|(_, p)| p)
            .sum();
        let migrated = migrate::pgmigrate().saturating_sub(migrated0);
        let t = t0.elapsed().as_secs_f64();
        println!(
            "{}",
            json!({"event": "sample", "t": t, "per_node": per_node_json(&hist),
                   "local_nodes": local_nodes, "local": local, "off_from": off_from,
                   "pgmigrate": migrated})
        );
        last = (local, off_from, migrated, t);
        if reached.is_none() && a.until_local.is_some_and(|f| local >= f) {
            reached = Some(t);
        }
        if reached.is_some() || Instant::now() >= end {
            break;
        }
    }
    let (local, moved, migrated, t) = last;
    println!(
        "HOG-RESULT pages={pages} on_from={on_from:.4} local={local:.4} moved={moved} pgmigrate={migrated} elapsed={t:.2} reached={} alloc_s={alloc_s:.2}",
        reached.map_or("none".to_string(), |r| format!("{r:.2}")),
    );
    Ok(())
}

fn locality_of(pids: &[i32], all: bool, pagemap: bool) -> Result<()> {
    let map = node_cpus()?;
    let frames = if pagemap { Some(frame_nodes()?) } else { None };
    let (mut pages, mut local_pages, mut missing) = (0u64, 0u64, 0u32);
    for &pid in pids {
        match locality_one(pid, all, &map, frames.as_ref()) {
            Ok((p, l)) => {
                pages += p;
                local_pages += l;
            }
            Err(e) if pids.len() > 1 => {
                eprintln!("guest-tool: pid {pid}: {e:#}");
                missing += 1;
            }
            Err(e) => return Err(e),
        }
    }
    if pids.len() == 1 {
        return Ok(());
    }
    let local = if pages == 0 {
        0.0
    } else {
        local_pages as f64 / pages as f64
    };
    println!(
        "LOCALITY-TOTAL pids={} missing={missing} pages={pages} local_pages={local_pages} local={local:.4}",
        pids.len()
    );
    Ok(())
}

/// Prints one process's locality; returns its (pages, local pages).
fn locality_one(
    pid: i32,
    all: bool,
    map: &BTreeMap<u32, Vec<u32>>,
    frames: Option<&numa::FrameNodes>,
) -> Result<(u64, u64)> {
    let per_node = match frames {
        Some(f) => pagemap_nodes(pid, all, f)?,
        None => {
            let path = format!("/proc/{pid}/numa_maps");
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
            numa::numa_maps(&text, !all)
        }
    };
    let mut cpus = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task")).context("listing threads")? {
        let tid: i32 = e?.file_name().to_string_lossy().parse().unwrap_or(-1);
        if tid > 0 {
            if let Ok(c) = affinity(tid) {
                cpus.extend(c);
            }
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    let local_nodes = nodes_of(&cpus, map);
    let local = numa::locality(&per_node, &local_nodes);
    let pages: u64 = per_node.values().sum();
    let local_pages = numa::local_pages(&per_node, &local_nodes);
    println!(
        "{}",
        json!({"pid": pid, "pages": pages, "per_node": per_node_json(&per_node),
               "local_nodes": local_nodes, "local": local})
    );
    println!("LOCALITY pid={pid} pages={pages} local={local:.4}");
    Ok((pages, local_pages))
}

/// Page frame → node from sysfs: the memory block size and each node's `memoryM` blocks.
fn frame_nodes() -> Result<numa::FrameNodes> {
    let p = "/sys/devices/system/memory/block_size_bytes";
    let bs = std::fs::read_to_string(p).with_context(|| format!("reading {p}"))?;
    let block_bytes = u64::from_str_radix(bs.trim(), 16).with_context(|| format!("{p}: {bs:?}"))?;
    // A block that crosses a node boundary is listed under both: its frames' node is unknown.
    let mut blocks: BTreeMap<u64, Option<u32>> = BTreeMap::new();
    for e in std::fs::read_dir("/sys/devices/system/node").context("listing NUMA nodes")? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(node) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        for b in std::fs::read_dir(e.path()).with_context(|| format!("listing {name}"))? {
            let b = b?.file_name().to_string_lossy().into_owned();
            if let Some(m) = b.strip_prefix("memory").and_then(|m| m.parse::<u64>().ok()) {
                let e = blocks.entry(m).or_insert(Some(node));
                if *e != Some(node) {
                    *e = None;
                }
            }
        }
    }
    let blocks = blocks
        .into_iter()
        .filter_map(|(b, n)| Some((b, n?)))
        .collect();
    Ok(numa::FrameNodes::new(block_bytes, blocks, PAGE as u64))
}

/// Pages per node of one process from its page table (`/proc/PID/pagemap`). Errors when the
/// frames are hidden (not CAP_SYS_ADMIN) or name no node's memory.
fn pagemap_nodes(pid: i32, all: bool, frames: &numa::FrameNodes) -> Result<BTreeMap<u32, u64>> {
    use std::os::unix::fs::FileExt;
    let maps = format!("/proc/{pid}/maps");
    let text = std::fs::read_to_string(&maps).with_context(|| format!("reading {maps}"))?;
    let path = format!("/proc/{pid}/pagemap");
    let f = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    let mut out = BTreeMap::new();
    let (mut present, mut unknown, mut hidden) = (0u64, 0u64, 0u64);
    // Pages read but never written map the shared zero page: not the process's memory (numa_maps
    // leaves them out too).
    let zero = zero_page_pfn();
    let mut buf = vec![0u8; 8 * 65536];
    for (a, b) in text.lines().filter_map(|l| numa::maps_range(l, all)) {
        let mut page = a / PAGE as u64;
        let end = b / PAGE as u64;
        while page < end {
            let n = ((end - page) as usize).min(buf.len() / 8);
            let got = f
                .read_at(&mut buf[..n * 8], page * 8)
                .with_context(|| format!("reading {path}"))?;
            if got < 8 {
                break; // the mapping went away
            }
            for e in buf[..got - got % 8].chunks_exact(8) {
                let e = u64::from_ne_bytes(e.try_into().expect("8 bytes"));
                match numa::pagemap_pfn(e) {
                    // Frame 0: hidden from a reader without CAP_SYS_ADMIN.
                    Some(0) => hidden += 1,
                    Some(pfn) if Some(pfn) == zero => {}
                    Some(pfn) => {
                        present += 1;
                        match frames.node(pfn) {
                            Some(node) => *out.entry(node).or_insert(0) += 1,
                            None => unknown += 1,
                        }
                    }
                    None => {}
                }
            }
            page += (got / 8) as u64;
        }
    }
    if hidden > 0 {
        bail!("{path}: page frames hidden (needs CAP_SYS_ADMIN)");
    }
    if present > 0 && unknown == present {
        bail!("{path}: no page frame in any node's memory blocks");
    }
    Ok(out)
}

/// The frame of the shared zero page (None when it cannot be found): one page of this
/// process's own, read and never written.
fn zero_page_pfn() -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let b = Buffer::new(PAGE, true).ok()?;
    // SAFETY: `b` maps PAGE readable bytes; the volatile read makes the kernel map a page.
    unsafe { std::ptr::read_volatile(b.ptr) };
    let f = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut e = [0u8; 8];
    f.read_exact_at(&mut e, (b.ptr as u64 / PAGE as u64) * 8)
        .ok()?;
    numa::pagemap_pfn(u64::from_ne_bytes(e)).filter(|&p| p != 0)
}
