//! Root test of the eBPF samplers on this kernel: a CPU-busy child in a fresh cgroup v2 group,
//! bounced between CPUs 0 and 1 with sched_setaffinity; the sampled on-CPU time of its cgroup
//! must be within 10% of the child's own rusage, and its migrations must be counted (attributed
//! to the child's cgroup although the parent is the one calling sched_setaffinity). Run for the
//! cpu-clock sampler and for exact sched_switch accounting. Skips (printing why) when not root,
//! without kernel BTF, without a cgroup v2 hierarchy or with fewer than 2 CPUs.
use std::{
    collections::BTreeMap,
    ffi::CString,
    os::unix::{fs::MetadataExt, process::CommandExt},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use rebalancer::{
    config::{EbpfConfig, OnCpuSource},
    ebpf::{
        probe,
        sample::{thread_cpu_time, ReadTimes, StepTime},
        Sampler,
    },
};

/// Tests that load CPUs with children take turns: 16 spinners pinned to CPU 0 would thin
/// out another test's samples of its own child and widen its error.
static CPU_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn cpu_turn() -> std::sync::MutexGuard<'static, ()> {
    CPU_TESTS.lock().unwrap_or_else(|e| e.into_inner())
}

fn skip_reason() -> Option<String> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Some("no kernel BTF".into());
    }
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if probe::cgroup2_mount(&mi).is_none() {
        return Some("no cgroup v2 hierarchy mounted".into());
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return Some("needs 2 CPUs to force migrations".into());
    }
    None
}

fn set_affinity(pid: i32, cpu: usize) {
    // SAFETY: cpu_set_t is plain data; pid is our child.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Runs a busy child in `cg` for `secs`, bouncing it between CPUs 0 and 1; returns its CPU time
/// (user + system) from wait4's rusage.
fn busy_child(cg: &Path, secs: f64) -> Duration {
    let procs = CString::new(
        cg.join("cgroup.procs")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .expect("path without NUL");
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "while :; do :; done"]);
    // SAFETY: only async-signal-safe calls (open/write/close) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let n = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
            if n != 1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Reaped below with wait4 (for its rusage), not with Child::wait.
    #[allow(clippy::zombie_processes)]
    let child = cmd.spawn().expect("spawn busy child");
    let pid = child.id() as i32;
    let start = Instant::now();
    let mut cpu = 0;
    while start.elapsed().as_secs_f64() < secs {
        set_affinity(pid, cpu);
        cpu ^= 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: our child; wait4 fills status and rusage.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        let mut status = 0;
        let mut ru: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::wait4(pid, &mut status, 0, &mut ru), pid);
        let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
        tv(ru.ru_utime) + tv(ru.ru_stime)
    }
}

struct CgroupDir(PathBuf);
impl Drop for CgroupDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn check_mode(mode: OnCpuSource) {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = probe::cgroup2_mount(&mi).unwrap();
    let cg = CgroupDir(root.join(format!("rebalancer-test-{}-{mode:?}", std::process::id())));
    std::fs::create_dir(&cg.0).expect("create cgroup");
    let id = std::fs::metadata(&cg.0).unwrap().ino();

    let topo = rebalancer::topology::sysfs::read(Path::new("/sys")).expect("read /sys topology");
    let cfg = EbpfConfig {
        on_cpu_source: mode,
        sample_hz: 997,
        ..EbpfConfig::default()
    };
    let (sampler, statuses) = Sampler::start(&topo, &cfg);
    let mut sampler = sampler.unwrap_or_else(|| panic!("no sampler: {statuses:#?}"));
    for s in &statuses {
        eprintln!(
            "{mode:?}: {} available={} ({})",
            s.name, s.available, s.reason
        );
    }
    let src = match mode {
        OnCpuSource::Sampled => "on_cpu:cpu_clock",
        OnCpuSource::Exact => "on_cpu:sched_switch",
    };
    assert!(statuses.iter().any(|s| s.name == src && s.available));
    assert!(statuses
        .iter()
        .any(|s| s.name == "sched_migrate_task" && s.available));

    let before = sampler.read().unwrap();
    assert!(
        !before.contains_key(&id),
        "fresh cgroup already has samples"
    );
    let rusage = busy_child(&cg.0, 3.0);
    std::thread::sleep(Duration::from_millis(50));
    let after = sampler.read().unwrap();
    let s = after.get(&id).cloned().unwrap_or_default();
    let sampled = Duration::from_nanos(s.total_cpu_ns());
    let ratio = sampled.as_secs_f64() / rusage.as_secs_f64();
    eprintln!(
        "{mode:?}: cgroup {id} sampled {sampled:?}, rusage {rusage:?}, ratio {ratio:.3}, \
         migrations {} (cross-node {}), path {:?}, steal {:.1}% (taken out)",
        s.migrations,
        s.cross_node_migrations,
        sampler.cgroup_path(id),
        sampler.steal_share() * 100.0
    );
    assert!(
        rusage > Duration::from_millis(300),
        "child barely ran: {rusage:?}"
    );
    assert!(
        (0.9..=1.1).contains(&ratio),
        "{mode:?}: sampled {sampled:?} vs rusage {rusage:?}"
    );
    assert!(
        s.migrations >= 5,
        "{mode:?}: only {} migrations counted for the bounced child",
        s.migrations
    );
    assert_eq!(s.cross_node_migrations, 0, "one-node machine");
    assert!(sampler
        .cgroup_path(id)
        .is_some_and(|p| p.ends_with(&format!("{mode:?}"))));

    // The cgroup goes away: its entries are deleted and no longer reported.
    let path = cg.0.clone();
    drop(cg);
    assert!(!path.exists());
    let gone = sampler.read().unwrap();
    assert!(!gone.contains_key(&id), "vanished cgroup still reported");
    // Missing at two reads in a row: its map entries are deleted.
    sampler.read().unwrap();
    let raw = sampler.read_raw().unwrap();
    assert!(
        !raw.cpu_time.iter().any(|(k, _)| k.cgroup_id == id)
            && !raw.events.iter().any(|(k, _)| k.cgroup_id == id),
        "map entries of the vanished cgroup were not deleted"
    );
}

#[test]
fn sampled_cpu_time_matches_rusage_and_migrations_are_counted() {
    let _turn = cpu_turn();
    if let Some(why) = skip_reason() {
        eprintln!("SKIP: {why}");
        return;
    }
    check_mode(OnCpuSource::Sampled);
    check_mode(OnCpuSource::Exact);
}

/// The per-cgroup hash maps are shared LRU hash maps (BPF_MAP_TYPE_LRU_HASH = 9), not per-CPU
/// ones (LRU_PERCPU_HASH = 10): a per-CPU LRU map preallocates every entry on every possible
/// CPU, 369 MB at 256 CPUs, more than the daemon's memory limit. Their memory (the kernel's
/// `memlock`) stays within a bound that does not depend on the number of CPUs. The watched
/// cgroups' slots are mmapable arrays (BPF_MAP_TYPE_ARRAY = 2, BPF_F_MMAPABLE) of one value
/// per slot (per node for on-CPU time), and the watch list a hash map (1).
#[test]
fn per_cgroup_maps_hold_one_value_per_entry() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIP: {why}");
        return;
    }
    let topo = rebalancer::topology::sysfs::read(Path::new("/sys")).expect("read /sys topology");
    let (sampler, statuses) = Sampler::start(&topo, &EbpfConfig::default());
    let sampler = sampler.unwrap_or_else(|| panic!("no sampler: {statuses:#?}"));
    let maps = sampler.map_footprint();
    let names: Vec<&str> = maps.iter().map(|m| m.0).collect();
    assert_eq!(
        names,
        [
            "CPU_TIME",
            "EVENTS",
            "MIGRATE_REASONS",
            "WATCHED",
            "SLOT_CPU",
            "SLOT_EVENTS"
        ],
        "{maps:?}"
    );
    let per_entry_bound = 16 + std::mem::size_of::<rebalancer_common::CgEvents>() as u64 + 128;
    // One value per entry, and 128 more entries per CPU (the LRU's per-CPU free lists, at
    // most 2^17 entries in all), not one value per entry per possible CPU.
    let cpus = topo.cpus.len() as u32;
    let entries = rebalancer::ebpf::loader::cg_map_entries(cpus);
    assert_eq!(
        entries,
        (rebalancer_common::CG_MAP_ENTRIES + 128 * cpus).min(1 << 17),
        "sized for this machine"
    );
    for (name, map_type, _, memlock) in &maps[..3] {
        assert_eq!(*map_type, 9, "{name} is a shared LRU hash map: {maps:?}");
        assert!(
            *memlock <= u64::from(entries) * per_entry_bound,
            "{name}: {memlock} bytes"
        );
    }
    assert_eq!(maps[3].1, 1, "WATCHED is a hash map: {maps:?}");
    let slots = u64::from(rebalancer_common::SLOTS);
    let nodes = u64::from(rebalancer::ebpf::loader::slot_nodes(&topo));
    let slot_event = std::mem::size_of::<rebalancer_common::SlotEvents>() as u64;
    for ((name, map_type, flags, memlock), values) in maps[4..]
        .iter()
        .zip([slots * nodes * 8, slots * slot_event])
    {
        assert_eq!(*map_type, 2, "{name} is an array: {maps:?}");
        assert_eq!(
            flags & rebalancer_common::BPF_F_MMAPABLE,
            rebalancer_common::BPF_F_MMAPABLE,
            "{name} is mmapable: {maps:?}"
        );
        // The values, page-rounded, and the array's header page.
        assert!(
            (values..=values + 3 * 4096).contains(memlock),
            "{name}: {memlock} bytes for {values} of values"
        );
    }
    eprintln!("maps (name, type, flags, memlock bytes): {maps:?}");
}

/// A watched cgroup's counts sit in its own slot: no eviction takes them back; out of the
/// watch list and back it counts from 0 again; and a slot freed by one cgroup and given to
/// another (after its rest) starts from 0, its first owner's counts gone and its id unmapped.
#[test]
fn a_recycled_slot_starts_from_zero() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIP: {why}");
        return;
    }
    let topo = rebalancer::topology::sysfs::read(Path::new("/sys")).expect("read /sys topology");
    let (sampler, statuses) = Sampler::start(&topo, &EbpfConfig::default());
    let mut sampler = sampler.unwrap_or_else(|| panic!("no sampler: {statuses:#?}"));
    let (a, b) = ((1u64 << 41) + 7, (1u64 << 41) + 9); // far from real cgroup ids
    let watch = |ids: &[u64]| ids.iter().map(|&i| (i, i)).collect::<BTreeMap<u64, u64>>();
    assert_eq!(
        sampler.watch_only(&watch(&[a]), &[]).expect("watch list"),
        0
    );
    let slot_a = sampler.slot_of(a).expect("a slot for a");
    assert_eq!(
        sampler.watched_in_kernel().unwrap(),
        BTreeMap::from([(a, slot_a)])
    );
    assert!(
        !sampler.read().expect("read").contains_key(&a),
        "nothing counted yet: no sample"
    );
    // One migration counted on node 0, one on node 1 (nodes need not exist for the slot).
    sampler.bench_fill(a, 1, &[0]).unwrap();
    sampler.bench_fill(a, 1, &[1]).unwrap();
    let migrations = |s: &mut Sampler, id| s.read().expect("read").get(&id).map(|s| s.migrations);
    assert_eq!(migrations(&mut sampler, a), Some(2));
    // Out of the watch list: its entry goes at once, its slot rests.
    sampler.watch_only(&watch(&[]), &[]).expect("watch list");
    assert!(sampler.watched_in_kernel().unwrap().is_empty());
    assert!(!sampler.read().expect("read").contains_key(&a));
    // Back at once: a fresh slot (the old one still rests), counting from 0.
    sampler.watch_only(&watch(&[a]), &[]).expect("watch list");
    let slot_a2 = sampler.slot_of(a).expect("a slot for a");
    assert_ne!(slot_a2, slot_a, "a resting slot is not given again at once");
    sampler.bench_fill(a, 1, &[0]).unwrap();
    assert_eq!(
        migrations(&mut sampler, a),
        Some(1),
        "back in the watch list: what it counted since"
    );
    // `a` goes, `b` comes after the rest: `b` is given `a`'s slot, zeroed first.
    for _ in 0..4 {
        sampler.bench_fill(a, 1, &[0]).unwrap();
    }
    assert_eq!(migrations(&mut sampler, a), Some(5));
    sampler.watch_only(&watch(&[]), &[]).expect("watch list");
    std::thread::sleep(rebalancer::ebpf::slots::REUSE_AFTER + Duration::from_millis(100));
    sampler.watch_only(&watch(&[b]), &[]).expect("watch list");
    let slot_b = sampler.slot_of(b).expect("a slot for b");
    assert!(
        [slot_a, slot_a2].contains(&slot_b),
        "a rested slot is given again ({slot_b} of {slot_a}, {slot_a2})"
    );
    assert_eq!(
        sampler.watched_in_kernel().unwrap(),
        BTreeMap::from([(b, slot_b)])
    );
    let read = sampler.read().expect("read");
    assert!(
        !read.contains_key(&b),
        "b starts from 0: {:?}",
        read.get(&b)
    );
    assert!(!read.contains_key(&a));
    sampler.bench_fill(b, 1, &[0]).unwrap();
    assert_eq!(migrations(&mut sampler, b), Some(1), "only b's own counts");
}

/// Reading 10,000 cgroups' entries (one CPU_TIME entry per node + one EVENTS entry each),
/// filled from userspace: reports the time of one read (map iteration) and of the fold.
#[test]
fn read_10k_cgroups_timing() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIP: {why}");
        return;
    }
    let topo = rebalancer::topology::sysfs::read(Path::new("/sys")).expect("read /sys topology");
    let nodes: Vec<u32> = topo.node_ids().collect();
    let cfg = EbpfConfig::default();
    let (sampler, statuses) = Sampler::start(&topo, &cfg);
    let mut sampler = sampler.unwrap_or_else(|| panic!("no sampler: {statuses:#?}"));
    let n = 10_000u64;
    let first = 1 << 40; // far from real cgroup ids
    let t = Instant::now();
    sampler.bench_fill(first, n, &nodes).unwrap();
    let fill = t.elapsed();
    // Entry by entry (aya's iteration) and by batches (BPF_MAP_LOOKUP_BATCH): same contents.
    let timed = |batched: bool| {
        let mut reads = Vec::new();
        let mut folds = Vec::new();
        let mut seen = 0;
        let mut last = None;
        for _ in 0..5 {
            let t = Instant::now();
            let raw = sampler.read_raw_with(batched).unwrap();
            reads.push(t.elapsed());
            let t = Instant::now();
            let folded = sampler.fold_raw(&raw);
            folds.push(t.elapsed());
            seen = folded.keys().filter(|id| **id >= first).count();
            last = Some(raw);
        }
        reads.sort();
        folds.sort();
        assert_eq!(
            seen as u64, n,
            "every filled cgroup read back (batched {batched})"
        );
        (reads, folds, last.unwrap())
    };
    let (it_reads, it_folds, it_raw) = timed(false);
    let (b_reads, b_folds, b_raw) = timed(true);
    let sorted = |raw: &rebalancer::ebpf::sample::RawMaps| {
        let mut c: Vec<(u64, u32, u64)> = raw
            .cpu_time
            .iter()
            .map(|(k, v)| (k.cgroup_id, k.node, *v))
            .filter(|e| e.0 >= first)
            .collect();
        c.sort();
        let mut e: Vec<(u64, u32, u64)> = raw
            .events
            .iter()
            .map(|(k, v)| (k.cgroup_id, k.node, v.migrations))
            .filter(|e| e.0 >= first)
            .collect();
        e.sort();
        (c, e)
    };
    let (bc, be) = sorted(&b_raw);
    assert_eq!(bc.len() as u64, n * nodes.len() as u64);
    assert_eq!(be.len() as u64, n);
    assert_eq!(
        (bc, be),
        sorted(&it_raw),
        "batched read = entry-by-entry read"
    );
    // What a round pays: the whole read (the slots' walk, exact mode's pending time, the CPU
    // counters, steal) with the 10,000 cgroups watched, each counted in its slot.
    let watch = (first..first + n).map(|id| (id, id)).collect();
    assert_eq!(
        sampler.watch_only(&watch, &[]).unwrap(),
        0,
        "all 10,000 watched"
    );
    sampler.bench_fill(first, n, &nodes).unwrap();
    let mut full = Vec::new();
    let mut full_cpu = Vec::new();
    let mut steps = Vec::new();
    // On-CPU time comes back steal-corrected: the 1,000 ns filled per node are scaled by the
    // factor of the read that first counted them (a VM's host may steal time meanwhile); later
    // reads add nothing new.
    let mut expected: Option<BTreeMap<u32, u64>> = None;
    for _ in 0..5 {
        let (t, c) = (Instant::now(), thread_cpu_time());
        let got = sampler.read().unwrap();
        full.push(t.elapsed());
        full_cpu.push(thread_cpu_time() - c);
        steps.push(sampler.last_read_times());
        assert_eq!(got.len() as u64, n, "every watched cgroup read back");
        let expected = expected.get_or_insert_with(|| {
            let f = sampler.steal_factors();
            nodes
                .iter()
                .map(|n| {
                    (
                        *n,
                        (1_000.0 * f.get(n).copied().unwrap_or(1.0)).round() as u64,
                    )
                })
                .collect()
        });
        let s = &got[&(first + n - 1)];
        assert_eq!(
            (&s.cpu_ns, s.migrations),
            (&*expected, 1),
            "what was counted (steal factors {:?})",
            sampler.steal_factors()
        );
    }
    full.sort();
    full_cpu.sort();
    let median = |f: fn(&ReadTimes) -> StepTime| {
        let mut wall: Vec<_> = steps.iter().map(|t| f(t).wall).collect();
        let mut cpu: Vec<_> = steps.iter().map(|t| f(t).cpu).collect();
        wall.sort();
        cpu.sort();
        format!("{:?} (CPU {:?})", wall[2], cpu[2])
    };
    eprintln!(
        "BENCH read_10k_cgroups: {} cgroups x {} node(s), {} CPUs: fill {fill:?}; \
         entry by entry: read median {:?} (min {:?}), fold median {:?}; \
         batched: read median {:?} (min {:?}), fold median {:?}; \
         Sampler::read (all of it) median {:?} (min {:?}), CPU median {:?} (min {:?}); \
         its steps' medians: maps {}, prune {}, fold {}, steal {}",
        n,
        nodes.len(),
        topo.cpus.len(),
        it_reads[2],
        it_reads[0],
        it_folds[2],
        b_reads[2],
        b_reads[0],
        b_folds[2],
        full[2],
        full[0],
        full_cpu[2],
        full_cpu[0],
        median(|t| t.maps),
        median(|t| t.prune),
        median(|t| t.fold),
        median(|t| t.steal),
    );
}

/// With a CPU → node map that puts CPU 0 and CPU 1 on different nodes (as the 2-node guest
/// does for real), bouncing the child between them counts cross-node migrations for its
/// cgroup (every one of its migrations here is CPU 0 <-> CPU 1).
#[test]
fn cross_node_migrations_with_a_two_node_cpu_map() {
    let _turn = cpu_turn();
    if let Some(why) = skip_reason() {
        eprintln!("SKIP: {why}");
        return;
    }
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = probe::cgroup2_mount(&mi).unwrap();
    let cg = CgroupDir(root.join(format!("rebalancer-test-{}-xnode", std::process::id())));
    std::fs::create_dir(&cg.0).expect("create cgroup");
    let id = std::fs::metadata(&cg.0).unwrap().ino();
    let mut topo =
        rebalancer::topology::sysfs::read(Path::new("/sys")).expect("read /sys topology");
    for c in &mut topo.cpus {
        c.node = Some(c.id % 2);
    }
    let (sampler, statuses) = Sampler::start(&topo, &EbpfConfig::default());
    let mut sampler = sampler.unwrap_or_else(|| panic!("no sampler: {statuses:#?}"));
    let before = sampler.read().unwrap();
    busy_child(&cg.0, 1.5);
    let after = sampler.read().unwrap();
    let d = after
        .get(&id)
        .cloned()
        .unwrap_or_default()
        .delta(before.get(&id).unwrap_or(&Default::default()));
    eprintln!(
        "xnode: migrations {} cross-node {}",
        d.migrations, d.cross_node_migrations
    );
    assert!(d.cross_node_migrations >= 5, "{d:?}");
    assert!(d.cross_node_migrations <= d.migrations, "{d:?}");
}

/// Spinning children pinned to one CPU (killed and reaped on drop).
struct Spinners(Vec<std::process::Child>);
impl Spinners {
    fn on_cpu(n: usize, cpu: usize) -> Spinners {
        let v = (0..n)
            .map(|_| {
                let c = Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
                    .expect("spawn spinner");
                set_affinity(c.id() as i32, cpu);
                c
            })
            .collect();
        Spinners(v)
    }
}
impl Drop for Spinners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The run queue the cpu-clock samples read, on this kernel: 16 spinners pinned to CPU 0 keep
/// at least 16 tasks on its queue at every sample, so CPU 0 reads ≥ 15.5 on average and the
/// node holding it ≥ 15.5 / its CPUs — where the busy share cannot go past 1.0 — while CPU 1,
/// sampled about as often, reads less than half as many, and no read fails. In exact mode the cpu-clock sampler does not run: the source is reported skipped and
/// no reading is taken. A kernel whose BTF lacks the offsets skips, printing why.
#[test]
fn the_cpu_clock_samples_read_the_run_queue() {
    let _turn = cpu_turn();
    if let Some(why) = skip_reason() {
        eprintln!("SKIP: {why}");
        return;
    }
    let topo = rebalancer::topology::sysfs::read(Path::new("/sys")).expect("read /sys topology");
    let (sampler, statuses) = Sampler::start(&topo, &EbpfConfig::default());
    let sampler = sampler.unwrap_or_else(|| panic!("no sampler: {statuses:#?}"));
    let st = statuses
        .iter()
        .find(|s| s.name == "runq:cpu_clock")
        .expect("runq status");
    if !st.available {
        assert!(
            st.reason.contains("BTF offsets"),
            "run queue not read for another reason than the kernel's BTF: {st:?}"
        );
        eprintln!("SKIP: {}", st.reason);
        return;
    }
    let spin = Spinners::on_cpu(16, 0);
    std::thread::sleep(Duration::from_millis(300));
    let before = sampler.runq().expect("RUNQ map");
    std::thread::sleep(Duration::from_millis(1500));
    let now = sampler.runq().expect("RUNQ map");
    drop(spin);
    let mean = |cpu: u32| {
        let (b, n) = (before[&cpu], now[&cpu]);
        let readings = n.readings - b.readings;
        (readings, (n.sum - b.sum) as f64 / readings.max(1) as f64)
    };
    let (readings, cpu0) = mean(0);
    assert!(readings >= 10, "CPU 0 took {readings} readings in 1.5 s");
    assert!(
        (15.5..128.0).contains(&cpu0),
        "CPU 0 read {cpu0} tasks on average with 16 spinners pinned to it"
    );
    // Another CPU: sampled as often whether busy or idle (the samples are a time average),
    // and each reads its own queue, without the spinners.
    let (readings1, cpu1) = mean(1);
    assert!(
        readings1 * 2 >= readings,
        "CPU 1 took {readings1} readings against CPU 0's {readings}: idle samples lost?"
    );
    // (Less than half: the rest of the machine's load, moved off CPU 0 by the balancer,
    // may queue on CPU 1, but not 8 tasks deep on average.)
    assert!(
        cpu1 < cpu0 / 2.0,
        "CPU 1 read {cpu1} against CPU 0's {cpu0}: not its own run queue?"
    );
    let cpu_node = topo.cpu_node_map();
    let node = cpu_node[&0];
    let ncpus = topo.nodes.iter().find(|n| n.id == node).unwrap().cpus.len() as f64;
    let per_node = rebalancer::ebpf::runq::runnable_between(&before, &now, &cpu_node);
    let got = per_node
        .get(&node)
        .copied()
        .expect("node of CPU 0 measured");
    assert!(
        got >= 15.5 / ncpus,
        "node {node} read {got} per CPU ({ncpus} CPUs, CPU 0 alone {cpu0})"
    );
    let failed = sampler
        .stats()
        .unwrap()
        .into_iter()
        .find(|(k, _)| *k == "runq_read_failed")
        .map(|(_, v)| v);
    assert_eq!(failed, Some(0), "run-queue reads failed");
    drop(sampler);

    // Exact mode (no cpu-clock sampler) and the run queue turned off (the sampler without the
    // read, as on a kernel that refuses it): reported skipped, no reading taken, and with it
    // off the cpu-clock samples still run.
    let exact = EbpfConfig {
        on_cpu_source: OnCpuSource::Exact,
        ..EbpfConfig::default()
    };
    let off = EbpfConfig {
        run_queue: false,
        ..EbpfConfig::default()
    };
    for (cfg, why) in [(exact, "exact"), (off, "run_queue = false")] {
        let (sampler, statuses) = Sampler::start(&topo, &cfg);
        let sampler = sampler.unwrap_or_else(|| panic!("no sampler: {statuses:#?}"));
        let st = statuses
            .iter()
            .find(|s| s.name == "runq:cpu_clock")
            .unwrap();
        assert!(!st.available && st.reason.contains(why), "{st:?}");
        let clock = |s: &Sampler| {
            s.stats()
                .unwrap()
                .into_iter()
                .find(|(k, _)| *k == "clock_samples")
                .map_or(0, |(_, v)| v)
        };
        let c0 = clock(&sampler);
        std::thread::sleep(Duration::from_millis(300));
        let r = sampler.runq().expect("RUNQ map");
        assert!(r.values().all(|c| c.readings == 0), "{why}: {r:?}");
        if !cfg.run_queue {
            assert!(clock(&sampler) > c0, "{why}: the cpu-clock sampler stopped");
        }
    }
}

/// CPU hotplug, without taking a CPU of this machine offline: told that CPU 1 went offline,
/// the sampler closes its cpu-clock event (CPU 1's run-queue readings stop), and told it came
/// back, opens a new one (they move again) — the path the daemon takes when its topology is
/// rebuilt (the guest scenario `hotplug` does it with a real offline/online). Skips without
/// the run-queue offsets (the per-CPU readings are what is watched).
#[test]
fn sync_cpus_closes_and_reopens_a_cpus_perf_events() {
    let _turn = cpu_turn();
    if let Some(why) = skip_reason() {
        eprintln!("SKIP: {why}");
        return;
    }
    let topo = rebalancer::topology::sysfs::read(Path::new("/sys")).expect("read /sys topology");
    let (sampler, statuses) = Sampler::start(&topo, &EbpfConfig::default());
    let mut sampler = sampler.unwrap_or_else(|| panic!("no sampler: {statuses:#?}"));
    if !statuses
        .iter()
        .any(|s| s.name == "runq:cpu_clock" && s.available)
    {
        eprintln!("SKIP: the run queue is not read here: {statuses:#?}");
        return;
    }
    let readings = |s: &Sampler, cpu: u32| s.runq().expect("RUNQ map")[&cpu].readings;
    let moved = |s: &Sampler, cpu: u32| {
        let r0 = readings(s, cpu);
        std::thread::sleep(Duration::from_millis(500));
        readings(s, cpu) - r0
    };
    let all = topo.online_cpus();
    assert_eq!(sampler.sampled_cpus(), all);
    assert!(!sampler.cpus_pending());
    assert!(moved(&sampler, 1) >= 10, "CPU 1 not sampled at start");

    // Nothing changed: nothing opened or closed.
    let r = sampler.sync_cpus(&topo);
    assert!(r.attached.is_empty() && r.detached.is_empty(), "{r:?}");

    let mut without1 = topo.clone();
    for c in &mut without1.cpus {
        if c.id == 1 {
            c.online = false;
        }
    }
    let r = sampler.sync_cpus(&without1);
    assert_eq!(r.detached, vec![("on_cpu:cpu_clock", 1)], "{r:?}");
    assert!(r.attached.is_empty() && r.failed.is_empty(), "{r:?}");
    assert!(!sampler.sampled_cpus().contains(1));
    assert!(!sampler.cpus_pending());
    std::thread::sleep(Duration::from_millis(100)); // a sample under way when it closed
    assert_eq!(
        moved(&sampler, 1),
        0,
        "CPU 1 still sampled after its event was closed"
    );
    assert!(moved(&sampler, 0) >= 10, "CPU 0 lost its samples");

    let r = sampler.sync_cpus(&topo);
    assert_eq!(r.attached, vec![("on_cpu:cpu_clock", 1)], "{r:?}");
    assert!(r.detached.is_empty() && r.failed.is_empty(), "{r:?}");
    assert_eq!(sampler.sampled_cpus(), all);
    assert!(moved(&sampler, 1) >= 10, "CPU 1 not sampled again");
}

/// Any cgroup's events created map entries, so a tenant with many cgroups could
/// keep the LRU maps full and evict a managed workload's counters. Once the daemon names its
/// cgroups (`watch_only`), only they are counted: a busy cgroup outside the list creates no
/// entry and its events are counted as `unwatched`; a watched one is read as before, with the
/// time of a cgroup below it (listed under its id: a container whose processes
/// live in a sub-cgroup read as idle) added to its own; a cgroup dropped from the list has its
/// entries deleted at the next read.
#[test]
fn only_watched_cgroups_are_counted() {
    let _turn = cpu_turn();
    if let Some(why) = skip_reason() {
        eprintln!("SKIP: {why}");
        return;
    }
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = probe::cgroup2_mount(&mi).unwrap();
    let pid = std::process::id();
    let ours = CgroupDir(root.join(format!("rebalancer-test-{pid}-watched")));
    let theirs = CgroupDir(root.join(format!("rebalancer-test-{pid}-tenant")));
    std::fs::create_dir(&ours.0).expect("create cgroup");
    std::fs::create_dir(&theirs.0).expect("create cgroup");
    let sub = CgroupDir(ours.0.join("sub"));
    std::fs::create_dir(&sub.0).expect("create cgroup");
    let sub_id = std::fs::metadata(&sub.0).unwrap().ino();
    let (our_id, their_id) = (
        std::fs::metadata(&ours.0).unwrap().ino(),
        std::fs::metadata(&theirs.0).unwrap().ino(),
    );
    let topo = rebalancer::topology::sysfs::read(Path::new("/sys")).expect("read /sys topology");
    let (sampler, statuses) = Sampler::start(&topo, &EbpfConfig::default());
    let mut sampler = sampler.unwrap_or_else(|| panic!("no sampler: {statuses:#?}"));
    let unwatched = |s: &Sampler| {
        s.stats()
            .unwrap()
            .into_iter()
            .find(|(n, _)| *n == "unwatched")
            .map(|(_, v)| v)
            .unwrap()
    };
    // Before any list, every cgroup is counted (`rebalancer sample`, `top`).
    busy_child(&theirs.0, 0.5);
    assert!(sampler.read().unwrap().contains_key(&their_id));
    assert_eq!(unwatched(&sampler), 0);

    assert_eq!(
        sampler
            .watch_only(&[(our_id, our_id), (sub_id, our_id)].into(), &[])
            .unwrap(),
        0
    );
    let read = sampler.read().unwrap();
    assert!(!read.contains_key(&their_id), "no longer reported");
    let before = read.get(&our_id).map_or(0, |s| s.total_cpu_ns());
    // What was counted is compared with what the child really ran (its rusage), not with the
    // wall time it was given: on a busy machine a spinner gets only part of a CPU. The 99 Hz
    // sampler's error is a sample or two (10.1 ms each) either way.
    let counted_as = |counted: u64, ran: Duration| {
        let ran = ran.as_nanos() as u64;
        assert!(ran >= 100_000_000, "the spinner ran only {ran} ns");
        counted + 30_000_000 >= ran * 8 / 10
    };
    let ran = busy_child(&ours.0, 1.0);
    busy_child(&theirs.0, 1.0);
    let read = sampler.read().unwrap();
    let cpu = read.get(&our_id).map_or(0, |s| s.total_cpu_ns()) - before;
    assert!(
        counted_as(cpu, ran),
        "watched cgroup counted: {cpu} ns of {ran:?}"
    );
    let ran = busy_child(&sub.0, 1.0);
    let read = sampler.read().unwrap();
    let with_sub = read.get(&our_id).map_or(0, |s| s.total_cpu_ns()) - before - cpu;
    assert!(
        counted_as(with_sub, ran),
        "the sub-cgroup's time counted under its container: {with_sub} ns of {ran:?}"
    );
    assert!(!read.contains_key(&sub_id), "not under its own id");
    assert!(!read.contains_key(&their_id), "{:?}", read.get(&their_id));
    assert!(
        unwatched(&sampler) > 0,
        "the tenant's events were seen and not counted"
    );
    let slot = sampler.slot_of(our_id).expect("our slot");
    assert_eq!(
        sampler.watched_in_kernel().unwrap(),
        BTreeMap::from([(our_id, slot), (sub_id, slot)]),
        "the sub-cgroup counted in its container's slot; the unwatched cgroup has none"
    );
    assert_eq!(sampler.slot_of(their_id), None);

    // Dropped from the list: its entries go at once, and so does its sample.
    sampler
        .watch_only(&[(their_id, their_id)].into(), &[])
        .unwrap();
    let kernel = sampler.watched_in_kernel().unwrap();
    assert_eq!(kernel.keys().copied().collect::<Vec<_>>(), [their_id]);
    assert_eq!(sampler.slot_of(our_id), None);
    assert!(!sampler.read().unwrap().contains_key(&our_id));
}
