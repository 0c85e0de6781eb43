//! What the measured access source (`controller.written_pages`, on by default) costs on this
//! machine, per GiB of resident memory and per control period:
//! - the sampler's CPU time (`WrittenPages::sample`: the pagemap read, the nodes of the written
//!   pages through move_pages(2), clear_refs), with every page written and with none;
//! - the writer's extra minor faults and CPU time: after clear_refs, the first write to each
//!   page (or each transparent huge page) faults once;
//! - what a period costs at scale (`written_pages_cost_per_period_at_scale`): real cgroups
//!   (1,000, or `REBALANCER_WRITTEN_CGROUPS`), each with one small process (`sleep`), every one
//!   read as the daemon reads a cgroup whose memory spans nodes (`cgroup.procs`, then
//!   `WrittenPages::sample`) within the period's pagemap budget.
//!
//! The figures are printed (BENCHMARKS.md, "Measured access", quotes them); the test fails when
//! the source does not see the writes, sees writes that were not made, or costs more than a
//! bound no default period could afford. On a kernel without soft-dirty tracking the sampler's
//! two reads are still measured (the pagemap scan of the resident memory, the node lookup of
//! every page as a fully written period needs) and the rest is skipped with the reason.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use rebalancer::cgroup::{Cgroups, Controller, Mounts};
use rebalancer::written::{probe, written_addresses, WrittenPages, PERIOD_PAGES};

const PAGE: usize = 4096;
const MIB: usize = 1 << 20;
/// The resident memory measured (bytes); the figures are scaled to a GiB.
const RESIDENT: usize = 256 * MIB;
const PERIODS: usize = 5;

/// This thread's CPU time (ns) and minor faults.
fn thread_usage() -> (u64, u64) {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer for clock_gettime.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    // SAFETY: zeroed rusage is a valid out-value for getrusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer for getrusage.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    (
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64,
        ru.ru_minflt as u64,
    )
}

/// Writes one byte in every page of `buf`; this thread's CPU ns and minor faults for it.
fn write_all(buf: &mut [u8], v: u8) -> (u64, u64) {
    let (c0, f0) = thread_usage();
    for i in (0..buf.len()).step_by(PAGE) {
        // SAFETY: in bounds; volatile so every page is really written.
        unsafe { std::ptr::write_volatile(buf.as_mut_ptr().add(i), v) };
    }
    let (c1, f1) = thread_usage();
    (c1 - c0, f1 - f0)
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// The sampler's reads on any kernel: the pagemap scan of every page, and the node lookup
/// (move_pages in query mode) of every page of the buffer. Their CPU ns.
fn reads(me: u32, buf: &[u8]) -> (u64, u64) {
    let proc_root = Path::new("/proc");
    let (c0, _) = thread_usage();
    let (_, scanned) = written_addresses(proc_root, me, PERIOD_PAGES).expect("pagemap read");
    let (c1, _) = thread_usage();
    assert!(
        scanned >= (RESIDENT / PAGE) as u64,
        "{scanned} entries scanned"
    );
    let base = buf.as_ptr() as u64;
    let addrs: Vec<u64> = (0..buf.len() as u64)
        .step_by(PAGE)
        .map(|o| (base + o) / PAGE as u64 * PAGE as u64)
        .collect();
    let (c2, _) = thread_usage();
    for chunk in addrs.chunks(4096) {
        let nodes = rebalancer::pages::query_nodes(me, chunk).expect("move_pages query");
        assert!(nodes.iter().all(|&n| n >= 0), "resident pages have a node");
    }
    let (c3, _) = thread_usage();
    (c1 - c0, c3 - c2)
}

#[test]
fn written_pages_cost_per_gib() {
    let proc_root = Path::new("/proc");
    let me = std::process::id();
    let mut buf = vec![0u8; RESIDENT];
    write_all(&mut buf, 1); // resident
    let per_gib = (1u64 << 30) as f64 / RESIDENT as f64;
    let ms = |ns: u64| ns as f64 / 1e6 * per_gib;
    let (scan, lookup): (Vec<u64>, Vec<u64>) = (0..PERIODS).map(|_| reads(me, &buf)).unzip();
    let (scan, lookup) = (median(scan), median(lookup));
    println!(
        "written pages, per GiB resident and period (median of {PERIODS}): pagemap scan {:.1} ms \
         CPU, node lookup of every page {:.1} ms CPU",
        ms(scan),
        ms(lookup)
    );
    // At most a second of CPU per GiB per period: past that no period of seconds affords it.
    assert!(ms(scan + lookup) < 1000.0);
    if let Err(why) = probe(proc_root) {
        eprintln!(
            "SKIP (faults and the whole sample): soft-dirty tracking unavailable here: {why}"
        );
        return;
    }
    let (base_cpu, base_faults) = write_all(&mut buf, 2); // no clear: no faults expected

    let mut t = WrittenPages::default();
    let _ = t.sample(proc_root, &[me]); // the first period only clears
    t.end_round();
    let (mut sample_cpu, mut write_cpu, mut write_faults) = (vec![], vec![], vec![]);
    for p in 0..PERIODS {
        let (c, f) = write_all(&mut buf, 3 + p as u8);
        write_cpu.push(c);
        write_faults.push(f);
        let (c0, _) = thread_usage();
        let w = t
            .sample(proc_root, &[me])
            .expect("a period after the clear");
        let (c1, _) = thread_usage();
        t.end_round();
        sample_cpu.push(c1 - c0);
        let written: u64 = w.values().sum();
        assert!(
            written >= RESIDENT as u64,
            "every page of the buffer was written, {written} bytes seen"
        );
        // Other threads of the test binary write too, but not hundreds of MiB.
        assert!(written < 2 * RESIDENT as u64, "{written} bytes seen");
    }
    // A period in which the buffer was not written: only the pagemap read is left.
    let (c0, _) = thread_usage();
    let idle = t
        .sample(proc_root, &[me])
        .expect("a period after the clear");
    let (c1, _) = thread_usage();
    let idle_cpu = c1 - c0;
    let idle_written: u64 = idle.values().sum();
    assert!(
        idle_written < RESIDENT as u64 / 8,
        "the buffer was not written this period, {idle_written} bytes seen"
    );
    std::hint::black_box(&buf);

    let (s, w, f) = (median(sample_cpu), median(write_cpu), median(write_faults));
    println!(
        "written pages, per GiB resident and period (median of {PERIODS}): sampler {:.1} ms CPU \
         with every page written, {:.1} ms with none; writer +{:.0} minor faults, +{:.1} ms CPU \
         (a write pass without clear_refs: {:.1} ms, {} faults)",
        ms(s),
        ms(idle_cpu),
        f as f64 * per_gib,
        ms(w.saturating_sub(base_cpu)),
        ms(base_cpu),
        base_faults as f64 * per_gib,
    );
    // At most a second of CPU per GiB per period: past that no period of seconds affords it.
    assert!(ms(s) < 1000.0, "sampler {:.1} ms per GiB", ms(s));
    // At most one fault per written page (a transparent huge page faults once for 512).
    assert!(
        f as usize <= RESIDENT / PAGE + 64,
        "{f} faults for {} pages",
        RESIDENT / PAGE
    );
}

/// Children killed and cgroup directories removed on drop (a failed assertion included).
struct Population {
    children: Vec<Child>,
    dirs: Vec<PathBuf>,
}

impl Drop for Population {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
        // Children first, then the parent (a cgroup with children cannot be removed).
        for d in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// One period of the source over every cgroup at scale, as the daemon's round runs it for a
/// cgroup whose memory is on two nodes or more: its `cgroup.procs`, then
/// `WrittenPages::sample` of its processes (the period's pagemap budget shared by all), then
/// `end_round`. Prints the median period's CPU time (this thread, user + system) and wall
/// time, and how many cgroups were read before the budget ran out. On a kernel without
/// soft-dirty tracking (this host's) no page is ever marked written, so this is the part
/// that scales with the cgroup count when nothing was written: reading each process's
/// mappings and pagemap, and clearing its bits.
#[test]
fn written_pages_cost_per_period_at_scale() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP: not root");
        return;
    }
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let Some(v2) = rebalancer::ebpf::probe::cgroup2_mount(&mi) else {
        println!("SKIP: no cgroup2 mount");
        return;
    };
    let n: usize = std::env::var("REBALANCER_WRITTEN_CGROUPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    let proc_root = Path::new("/proc");
    let parent = format!("rebalancer-test-written-{}", std::process::id());
    let mut pop = Population {
        children: Vec::with_capacity(n),
        dirs: vec![v2.join(&parent)],
    };
    std::fs::create_dir(v2.join(&parent)).unwrap();
    let rels: Vec<String> = (0..n).map(|i| format!("{parent}/c{i:05}")).collect();
    for rel in &rels {
        let dir = v2.join(rel);
        std::fs::create_dir(&dir).unwrap();
        pop.dirs.push(dir.clone());
        let child = Command::new("sleep")
            .arg("900")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        pop.children.push(child);
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }
    let cg = Cgroups::new(Mounts {
        v2: Some(v2.clone()),
        v1: Default::default(),
    });
    let mut t = WrittenPages::default();
    // One period: (cgroups read, processes skipped for want of budget, CPU ns, wall ns, CPU ns
    // of the cgroup.procs reads alone).
    let period = |t: &mut WrittenPages| {
        let (mut read, mut procs_ns) = (0usize, 0u64);
        let (c0, _) = thread_usage();
        let w0 = Instant::now();
        for rel in &rels {
            let (p0, _) = thread_usage();
            let pids = cg.procs(Controller::Cpuset, rel).expect("cgroup.procs");
            let (p1, _) = thread_usage();
            procs_ns += p1 - p0;
            assert_eq!(pids.len(), 1, "{rel} holds its one process");
            if t.sample(proc_root, &pids).is_some() {
                read += 1;
            }
        }
        let skipped = t.skipped as usize;
        t.end_round();
        let (c1, _) = thread_usage();
        (
            read,
            skipped,
            c1 - c0,
            w0.elapsed().as_nanos() as u64,
            procs_ns,
        )
    };
    // The first period only clears (nothing to compare yet): no cgroup has a measurement.
    let (read, skipped, ..) = period(&mut t);
    assert_eq!(read, 0, "a first period reads nothing");
    let mut runs = Vec::new();
    for _ in 0..PERIODS.min(3) {
        let (read, skipped_now, cpu, wall, procs) = period(&mut t);
        // Every cgroup's process is either read (cleared a period ago) or left for want of
        // budget, which is spent in order: what is read is a prefix.
        assert_eq!(
            read + skipped_now,
            n,
            "{read} read + {skipped_now} skipped of {n}"
        );
        if skipped_now > 0 {
            assert!(read > 0, "the budget reads some cgroups");
        }
        runs.push((cpu, wall, procs, read, skipped_now));
    }
    runs.sort_by_key(|r| r.0);
    let (cpu, wall, procs, read, skipped_now) = runs[runs.len() / 2];
    let ms = |ns: u64| ns as f64 / 1e6;
    println!(
        "written pages at {n} cgroups, one `sleep` each (median of {} periods by CPU): {:.1} ms \
         CPU per period ({:.1} ms of it reading cgroup.procs), {:.1} ms wall; {read} cgroups \
         read, {skipped_now} left for want of the period's budget ({PERIOD_PAGES} pagemap \
         entries); the clearing period left {skipped}",
        runs.len(),
        ms(cpu),
        ms(procs),
        ms(wall),
    );
    // Past a second of CPU per period the source would cost a fifth of a CPU at the default
    // 5 s period.
    assert!(ms(cpu) < 1000.0, "{:.1} ms of CPU per period", ms(cpu));
}
