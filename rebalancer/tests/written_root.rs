//! What the measured access source (`controller.written_pages`, on by default) costs on this
//! machine, per GiB of resident memory and per control period:
//! - the sampler's CPU time (`WrittenPages::sample`: the pagemap read, the nodes of the written
//!   pages through move_pages(2), clear_refs), with every page written and with none;
//! - the writer's extra minor faults and CPU time: after clear_refs, the first write to each
//!   page (or each transparent huge page) faults once;
//! - what a period costs at scale (`written_pages_cost_per_period_at_scale`): real cgroups
//!   (1,000, or `REBALANCER_WRITTEN_CGROUPS`), each with one small process (`sleep`), every one
//!   read as the daemon reads a cgroup whose memory spans nodes (`cgroup.procs`, then
//!   `WrittenPages::sample`, and `memory.numa_stat`) within the period's pagemap budget.
//!
//! The figures are printed (BENCHMARKS.md, "Measured access", quotes them); the test fails when
//! the source does not see the writes, sees writes that were not made, or costs more than a
//! bound no default period could afford. On a kernel without soft-dirty tracking the sampler's
//! two reads are still measured (the pagemap scan of the resident memory, the node lookup of
//! every page as a fully written period needs) and the rest is skipped with the reason.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use rebalancer::cgroup::{Cgroups, Mounts};
use rebalancer::written::{
    probe, written_addresses, Live, Source, WrittenPages, PERIOD_PAGES, PROCESS_COST,
    PROCS_READ_COST,
};

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
    let me_cg = vec!["me".to_string()];
    let _ = t.period(&mut Me, &me_cg); // the first period only clears
    let (mut sample_cpu, mut write_cpu, mut write_faults) = (vec![], vec![], vec![]);
    for p in 0..PERIODS {
        let (c, f) = write_all(&mut buf, 3 + p as u8);
        write_cpu.push(c);
        write_faults.push(f);
        let (c0, _) = thread_usage();
        let w = t
            .period(&mut Me, &me_cg)
            .remove("me")
            .expect("a period after the clear");
        let (c1, _) = thread_usage();
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
        .period(&mut Me, &me_cg)
        .remove("me")
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

/// This test process as the one process of cgroup "me".
struct Me;
impl Source for Me {
    fn procs(&mut self, _: &str) -> Vec<u32> {
        vec![std::process::id()]
    }
    fn read(
        &mut self,
        pid: u32,
        limit: u64,
    ) -> std::io::Result<(std::collections::BTreeMap<u32, u64>, u64)> {
        rebalancer::written::written_per_node(Path::new("/proc"), pid, limit)
    }
    fn clear(&mut self, pid: u32) -> std::io::Result<()> {
        rebalancer::written::clear(Path::new("/proc"), pid)
    }
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

/// Periods of the source over every cgroup at scale, as the daemon's round runs them when
/// every cgroup's memory is on two nodes or more: `WrittenPages::period` over all of them
/// (`cgroup.procs`, then each process read and cleared, within the period's budget, going on
/// where the last period stopped). Prints the median period's CPU time (this thread, user +
/// system) and wall time, how many cgroups a period visits and how many periods a full pass
/// takes. On a kernel without soft-dirty tracking (this host's) no page is ever marked
/// written, so this is the part that scales with the cgroup count when nothing was written:
/// reading each process's mappings and pagemap, and clearing its bits.
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
    // Its cgroups get the memory controller, as a workload's do: a visit reads their
    // `memory.numa_stat` too (first touches). Where the root does not delegate it, none.
    let _ = std::fs::write(v2.join(&parent).join("cgroup.subtree_control"), "+memory");
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
    let mut src = Live {
        cgroups: &cg,
        proc_root,
    };
    let mut t = WrittenPages::default();
    // The most cgroups of one `sleep` a period can pay for.
    let most = (PERIOD_PAGES / (PROCS_READ_COST + PROCESS_COST)) as usize;
    // Two passes: the first visit of each cgroup clears, the second reads. Per period: CPU
    // ns, wall ns, cgroups visited.
    let (mut runs, mut measured) = (Vec::new(), std::collections::BTreeSet::new());
    let mut periods = 0;
    let bound = 2 * (n.div_ceil(most / 2) + 1);
    while measured.len() < n {
        assert!(
            periods < bound,
            "{} of {n} cgroups measured after {periods} periods",
            measured.len()
        );
        let (c0, _) = thread_usage();
        let w0 = Instant::now();
        let got = t.period(&mut src, &rels);
        let (c1, _) = thread_usage();
        runs.push((c1 - c0, w0.elapsed().as_nanos() as u64, t.visited));
        assert!(t.visited <= most, "{} cgroups visited", t.visited);
        assert!(t.visited == n || t.visited > 0);
        measured.extend(got.into_keys());
        periods += 1;
    }
    let visits: usize = runs.iter().map(|r| r.2).sum();
    runs.sort_by_key(|r| r.0);
    let (cpu, wall, visited) = runs[runs.len() / 2];
    let max_cpu = runs.last().expect("a period").0;
    let ms = |ns: u64| ns as f64 / 1e6;
    println!(
        "written pages at {n} cgroups, one `sleep` each (median of {periods} periods by CPU): \
         {:.1} ms CPU per period (most {:.1} ms), {:.1} ms wall; {visited} cgroups visited a \
         period (budget {PERIOD_PAGES} pagemap-entry equivalents); every cgroup read after \
         {periods} periods ({visits} visits: a first visit clears, the next reads), i.e. a \
         full pass every {:.1} periods",
        ms(cpu),
        ms(max_cpu),
        ms(wall),
        periods as f64 / 2.0,
    );
    // Past a second of CPU per period the source would cost a fifth of a CPU at the default
    // 5 s period.
    assert!(ms(cpu) < 1000.0, "{:.1} ms of CPU per period", ms(cpu));
}
