//! Loads the embedded eBPF object, fills `CONFIG` (tracepoint offsets from tracefs, task_struct
//! offsets from BTF, periods) and `CPU_NODE` (from the topology), then loads and attaches each
//! source, reporting it as available or skipped with the reason (the verifier log is logged in
//! full when a program is refused). Each perf_event program is attached on every online CPU or
//! not at all; its per-CPU links are handed to `perfcpu::PerfCpus`, which keeps them in step
//! with CPU hotplug afterwards (`write_cpu_node` refills `CPU_NODE` then).
use std::collections::{BTreeMap, BTreeSet};

use aya::{
    maps::Array,
    programs::{
        perf_event::{
            HwCacheEvent, HwCacheOp, HwCacheResult, PerfEventConfig, PerfEventScope, SamplePolicy,
            SoftwareEvent,
        },
        KProbe, PerfEvent, RawTracePoint, TracePoint,
    },
    Ebpf, EbpfLoader,
};
use rebalancer_common::{
    ProgConfig, CFG_RUNQ_OFFSETS, CFG_TASK_OFFSETS, MAX_CPUS, MAX_SLOT_NODES, SLOTS,
};

use super::{
    btf,
    perfcpu::{PerfCpus, PerfGroup, PerfProg},
    pmu::{self, Event, EventPair, REMOTE_PERIOD},
    tracefs::{self, Tracefs},
    SourceStatus,
};
use crate::{
    config::{EbpfConfig, OnCpuSource},
    topology::Topology,
};

/// The eBPF object built by build.rs (empty when built with REBALANCER_NO_EBPF=1).
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rebalancer"));

/// Source names, in report order.
pub const SOURCES: [&str; 10] = [
    "on_cpu:cpu_clock",
    "on_cpu:sched_switch",
    "runq:cpu_clock",
    "sched_migrate_task",
    "sched_move_numa",
    "sched_swap_numa",
    "sched_stick_numa",
    "mm_migrate_pages",
    "numa_faults:kprobe",
    "dram_access:pmu",
];

/// What loading produced: the object (None when nothing could be loaded), one status per
/// source, and the migrate reason names.
pub struct Loaded {
    pub ebpf: Option<Ebpf>,
    pub statuses: Vec<SourceStatus>,
    pub reason_names: BTreeMap<u32, String>,
    /// The local / remote DRAM events, when both attached (the PMU is a source only then).
    pub pmu: Option<EventPair>,
    /// Period of the cpu-clock sampler (what one on-CPU sample credits).
    pub sample_period_ns: u64,
    /// The attached perf_event programs' events per CPU.
    pub perf: PerfCpus,
    /// Entries each per-cgroup map was created with ([`cg_map_entries`]).
    pub cg_entries: u32,
    /// Node ids per slot of `SLOT_CPU` ([`slot_nodes`]).
    pub slot_nodes: u32,
}

/// Node ids per slot of `SLOT_CPU`: every node id of `topo` (CPU-less ones included: ids are
/// not dense), at most `MAX_SLOT_NODES`. A CPU on a node past them has its watched time
/// counted as a failed update (`Stat::MapUpdateFailed`).
pub fn slot_nodes(topo: &Topology) -> u32 {
    let top = topo
        .nodes
        .iter()
        .map(|n| n.id)
        .chain(topo.cpus.iter().filter_map(|c| c.node))
        .max()
        .unwrap_or(0);
    top.saturating_add(1).clamp(1, MAX_SLOT_NODES)
}

/// Entries of each per-cgroup map (`CPU_TIME`, `EVENTS`, `MIGRATE_REASONS`) on a machine with
/// `cpus` CPUs: the keys of `CG_MAP_ENTRIES` (cgroup, node) pairs, plus the free entries an
/// LRU hash map lets each CPU hold on its own list (`LOCAL_FREE_TARGET`, 128 in
/// kernel/bpf/bpf_lru_list.c): without them, on a machine with many CPUs, the free entries
/// sit on other CPUs' lists and the map evicts live entries long before it is full. The
/// three maps take 328 bytes per entry (5.4 MB at 16,384; 16 MB at 256 CPUs); at most 2^17
/// entries (43 MB, reached past 896 CPUs), under the daemon's 128 MiB.
pub fn cg_map_entries(cpus: u32) -> u32 {
    rebalancer_common::CG_MAP_ENTRIES
        .saturating_add(cpus.saturating_mul(128))
        .min(1 << 17)
}

fn all_skipped(reason: &str) -> Loaded {
    Loaded {
        ebpf: None,
        statuses: SOURCES
            .iter()
            .map(|s| SourceStatus::skipped(s, reason))
            .collect(),
        reason_names: BTreeMap::new(),
        pmu: None,
        sample_period_ns: 0,
        perf: PerfCpus::default(),
        cg_entries: 0,
        slot_nodes: 0,
    }
}

/// Loads and attaches everything this kernel supports. With `both_on_cpu` (probing) both
/// on-CPU sources are attached, whichever the config selects.
pub fn load(topo: &Topology, cfg: &EbpfConfig, both_on_cpu: bool) -> Loaded {
    if !cfg.enabled {
        return all_skipped("disabled by config (ebpf.enabled = false)");
    }
    if OBJECT.is_empty() {
        return all_skipped("built without eBPF (REBALANCER_NO_EBPF=1)");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return all_skipped("not root (loading eBPF needs CAP_BPF and CAP_PERFMON)");
    }
    let release = super::probe::kernel_release();
    if !super::probe::mmapable_arrays(&release) {
        return all_skipped(&format!(
            "kernel {release}: the watched cgroups' counters are mmapable BPF arrays (Linux 5.5+)"
        ));
    }
    raise_memlock();
    let ncpu_entries = topo.cpus.iter().map(|c| c.id + 1).max().unwrap_or(1);
    if ncpu_entries > MAX_CPUS {
        tracing::warn!(
            cpus = ncpu_entries,
            max = MAX_CPUS,
            "more CPUs than CPU_NODE holds"
        );
    }
    // The CPUs this machine has, not every possible one (a VM may declare hundreds of
    // hot-pluggable slots it never fills).
    let cg_entries = cg_map_entries(topo.cpus.len() as u32);
    let mut loader = EbpfLoader::new();
    for m in ["CPU_TIME", "EVENTS", "MIGRATE_REASONS"] {
        loader.map_max_entries(m, cg_entries);
    }
    let slot_nodes = slot_nodes(topo);
    loader.map_max_entries("SLOT_CPU", SLOTS * slot_nodes);
    let mut ebpf = match loader.load(OBJECT) {
        Ok(e) => e,
        Err(e) => return all_skipped(&format!("loading the eBPF object failed: {e}")),
    };
    let (mut pc, reason_names, mut pre) = prog_config(cfg);
    pc.slot_nodes = slot_nodes;
    if let Err(e) = fill_maps(&mut ebpf, topo, &pc) {
        return all_skipped(&format!("filling config maps failed: {e}"));
    }

    let online: Vec<u32> = topo.online_cpus().iter().collect();
    let mut res: BTreeMap<&str, Result<String, String>> = BTreeMap::new();

    // On-CPU time: one of the two.
    let period_ns = pc.sample_period_ns;
    let sampled = both_on_cpu || cfg.on_cpu_source == OnCpuSource::Sampled;
    let exact = both_on_cpu || cfg.on_cpu_source == OnCpuSource::Exact;
    // Why the run queue is not read although the sampler runs (its program did not load).
    let mut runq_lost = None;
    let mut perf_groups = Vec::new();
    if sampled {
        let clock = || PerfEventConfig::Software(SoftwareEvent::CpuClock);
        let attach = |ebpf: &mut Ebpf, prog: &'static str| {
            attach_perf_why(ebpf, prog, clock(), period_ns, &online)
        };
        let r = if !cfg.run_queue {
            runq_lost =
                Some("off (ebpf.run_queue = false): node pressure is the busy share".into());
            attach(&mut ebpf, "on_cpu_sample_norunq").map_err(PerfFailed::into_string)
        } else {
            match attach(&mut ebpf, "on_cpu_sample") {
                Ok(p) => Ok(p),
                // Loaded, but a perf event would not open: the program without the read
                // would fail the same way.
                Err(PerfFailed::Attach(e)) => Err(e),
                // The verifier refused it (kernels without bpf_probe_read_kernel here):
                // sample without the run-queue read.
                Err(PerfFailed::Load(e)) => match attach(&mut ebpf, "on_cpu_sample_norunq") {
                    Ok(p) => {
                        runq_lost = Some(format!(
                            "the cpu-clock program with the run-queue read did not load ({e}); sampling without it: node pressure is the busy share"
                        ));
                        Ok(p)
                    }
                    Err(e2) => Err(format!(
                        "{e}; without the run-queue read: {}",
                        e2.into_string()
                    )),
                },
            }
        };
        let r = r.map(|p| {
            perf_groups.push(PerfGroup {
                source: "on_cpu:cpu_clock",
                progs: vec![p],
            });
            format!("software cpu-clock every {period_ns} ns per CPU")
        });
        res.insert("on_cpu:cpu_clock", r);
    } else {
        res.insert(
            "on_cpu:cpu_clock",
            Err("not selected (ebpf.on_cpu_source = \"exact\")".into()),
        );
    }
    // Run queues: read by the cpu-clock sampler, when it runs and the offsets were found.
    let runq = match (sampled, res.get("on_cpu:cpu_clock")) {
        _ if runq_lost.is_some() => Err(runq_lost.unwrap_or_default()),
        (false, _) => Err("read by the cpu-clock sampler, not selected (ebpf.on_cpu_source = \"exact\"): node pressure is the busy share".into()),
        (true, Some(Err(e))) => Err(format!("the cpu-clock sampler did not attach: {e}")),
        _ if pc.flags & CFG_RUNQ_OFFSETS == 0 => Err(
            "no kernel BTF offsets for task_struct.se.cfs_rq → cfs_rq.rq → rq.nr_running: node pressure is the busy share".into(),
        ),
        _ => Ok(format!(
            "each cpu-clock sample reads its CPU's rq->nr_running (every {period_ns} ns per CPU)"
        )),
    };
    res.insert("runq:cpu_clock", runq);
    if exact {
        let r = attach_raw_tp(&mut ebpf, "sched_switch", "sched_switch");
        res.insert(
            "on_cpu:sched_switch",
            r.map(|()| "raw tracepoint, exact per-switch accounting".into()),
        );
    } else {
        res.insert(
            "on_cpu:sched_switch",
            Err("not selected (ebpf.on_cpu_source = \"sampled\")".into()),
        );
    }

    // Migrations: raw tracepoint with BTF offsets, else the classic tracepoint.
    let mig = if pc.flags & CFG_TASK_OFFSETS != 0 {
        attach_raw_tp(&mut ebpf, "sched_migrate_task", "sched_migrate_task")
            .map(|()| "raw tracepoint, migrating task's cgroup via BTF offsets".to_string())
    } else {
        Err("no kernel BTF offsets".to_string())
    };
    let mig = mig.or_else(|why| {
        if pc.migrate_pid_off == 0 {
            return Err(format!("{why}; tracepoint format unusable"));
        }
        attach_tp(
            &mut ebpf,
            "sched_migrate_task_tp",
            "sched",
            "sched_migrate_task",
        )
        .map(|()| format!("{why}: classic tracepoint, only self-migrations attributed to a cgroup"))
    });
    res.insert("sched_migrate_task", mig);

    for (name, cat) in [
        ("sched_move_numa", "sched"),
        ("sched_swap_numa", "sched"),
        ("sched_stick_numa", "sched"),
        ("mm_migrate_pages", "migrate"),
    ] {
        if !pre.contains_key(name) {
            let r = attach_tp(&mut ebpf, name, cat, name).map(|()| "tracepoint".to_string());
            res.insert(name, r);
        }
    }

    res.insert("numa_faults:kprobe", attach_kprobe(&mut ebpf));

    let cpu = pmu::CpuId::parse(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default());
    let pair = pmu::choose(
        cfg.pmu_local_raw_event
            .as_deref()
            .and_then(crate::config::parse_u64),
        cfg.pmu_raw_event
            .as_deref()
            .and_then(crate::config::parse_u64),
        &cpu,
    );
    let attached = attach_pmu_pair(&mut ebpf, &pair, &online);
    res.insert(
        "dram_access:pmu",
        attached
            .as_ref()
            .map(|_| pair.describe())
            .map_err(|e| e.clone()),
    );
    let pmu_pair = attached.ok().map(|progs| {
        perf_groups.push(PerfGroup {
            source: "dram_access:pmu",
            progs: progs.into(),
        });
        pair
    });

    let statuses = SOURCES
        .iter()
        .map(|s| match (pre.remove(*s), res.remove(s)) {
            (Some(p), _) => p,
            (None, Some(Ok(why))) => SourceStatus::ok(s, why),
            (None, Some(Err(why))) => SourceStatus::skipped(s, why),
            (None, None) => SourceStatus::skipped(s, "not attempted"),
        })
        .collect();
    Loaded {
        ebpf: Some(ebpf),
        statuses,
        reason_names,
        pmu: pmu_pair,
        sample_period_ns: period_ns,
        perf: PerfCpus::new(
            perf_groups,
            online.iter().copied().collect::<BTreeSet<u32>>(),
        ),
        cg_entries,
        slot_nodes,
    }
}

/// Builds `ProgConfig` from tracefs formats and kernel BTF; sources whose offsets cannot be
/// found are pre-reported as skipped.
fn prog_config(
    cfg: &EbpfConfig,
) -> (
    ProgConfig,
    BTreeMap<u32, String>,
    BTreeMap<String, SourceStatus>,
) {
    let mut pc = ProgConfig {
        sample_period_ns: 1_000_000_000 / u64::from(cfg.sample_hz.max(1)),
        remote_period: REMOTE_PERIOD,
        ..ProgConfig::default()
    };
    let mut skipped = BTreeMap::new();
    let mut reasons = BTreeMap::new();
    let mut skip = |name: &str, why: String| {
        skipped.insert(name.to_string(), SourceStatus::skipped(name, why));
    };
    match Tracefs::find_or_mount() {
        Err(e) => {
            for s in [
                "sched_move_numa",
                "sched_swap_numa",
                "sched_stick_numa",
                "mm_migrate_pages",
            ] {
                skip(s, format!("{e}"));
            }
        }
        Ok(t) => {
            let fmt = |cat, name| t.format(cat, name);
            match fmt("sched", "sched_migrate_task") {
                Ok(f) => {
                    if let (Some(p), Some(o), Some(d)) = (
                        f.offset("pid", 4),
                        f.offset("orig_cpu", 4),
                        f.offset("dest_cpu", 4),
                    ) {
                        (
                            pc.migrate_pid_off,
                            pc.migrate_orig_cpu_off,
                            pc.migrate_dest_cpu_off,
                        ) = (p, o, d);
                    }
                }
                Err(e) => tracing::debug!(error = %e, "sched_migrate_task format"),
            }
            for (name, slot) in [
                ("sched_move_numa", &mut pc.move_numa_dst_nid_off),
                ("sched_swap_numa", &mut pc.swap_numa_dst_nid_off),
                ("sched_stick_numa", &mut pc.stick_numa_dst_nid_off),
            ] {
                match fmt("sched", name).map(|f| f.offset("dst_nid", 4)) {
                    Ok(Some(o)) => *slot = o,
                    Ok(None) => skip(name, "format file has no 4-byte dst_nid".into()),
                    Err(e) => skip(
                        name,
                        format!("{}: kernel without NUMA balancing?", error_chain(&e)),
                    ),
                }
            }
            match fmt("migrate", "mm_migrate_pages") {
                Ok(f) => match (f.offset("succeeded", 8), f.offset("reason", 4)) {
                    (Some(s), Some(r)) => {
                        pc.mm_succeeded_off = s;
                        pc.mm_reason_off = r;
                        reasons = tracefs::print_symbolic(&f.print_fmt, "reason")
                            .into_iter()
                            .collect();
                    }
                    _ => skip(
                        "mm_migrate_pages",
                        "format file lacks succeeded (8 bytes) or reason (4 bytes)".into(),
                    ),
                },
                Err(e) => skip("mm_migrate_pages", error_chain(&e)),
            }
        }
    }
    match std::fs::read("/sys/kernel/btf/vmlinux") {
        Ok(data) => match btf::Btf::parse(&data) {
            Ok(b) => {
                match btf::task_offsets(&b) {
                    Ok(o) => {
                        [
                            pc.task_cgroups_off,
                            pc.css_set_dfl_cgrp_off,
                            pc.cgroup_kn_off,
                            pc.kernfs_node_id_off,
                            pc.task_cpu_off,
                        ] = o;
                        pc.flags |= CFG_TASK_OFFSETS;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "kernel BTF: task_struct offsets not found")
                    }
                }
                match btf::runq_offsets(&b) {
                    Ok(o) => {
                        [
                            pc.task_se_cfs_rq_off,
                            pc.cfs_rq_rq_off,
                            pc.rq_nr_running_off,
                        ] = o;
                        pc.flags |= CFG_RUNQ_OFFSETS;
                    }
                    Err(e) => tracing::warn!(error = %e, "kernel BTF: run-queue offsets not found"),
                }
            }
            Err(e) => tracing::warn!(error = %e, "kernel BTF unreadable"),
        },
        Err(e) => tracing::warn!(error = %e, "no kernel BTF at /sys/kernel/btf/vmlinux"),
    }
    (pc, reasons, skipped)
}

fn fill_maps(ebpf: &mut Ebpf, topo: &Topology, pc: &ProgConfig) -> Result<(), String> {
    let mut config: Array<_, ProgConfig> = ebpf
        .map_mut("CONFIG")
        .ok_or("no CONFIG map")?
        .try_into()
        .map_err(|e| format!("CONFIG: {e}"))?;
    config.set(0, *pc, 0).map_err(|e| format!("CONFIG: {e}"))?;
    write_cpu_node(ebpf, topo)
}

/// Writes `CPU_NODE` (CPU → node) for every CPU of `topo` with a node: at load, and again
/// when CPUs went online or offline (the topology was rebuilt).
pub(super) fn write_cpu_node(ebpf: &mut Ebpf, topo: &Topology) -> Result<(), String> {
    let mut cpu_node: Array<_, u32> = ebpf
        .map_mut("CPU_NODE")
        .ok_or("no CPU_NODE map")?
        .try_into()
        .map_err(|e| format!("CPU_NODE: {e}"))?;
    for c in &topo.cpus {
        if let (Some(n), true) = (c.node, c.id < MAX_CPUS) {
            cpu_node
                .set(c.id, n, 0)
                .map_err(|e| format!("CPU_NODE[{}]: {e}", c.id))?;
        }
    }
    Ok(())
}

fn raise_memlock() {
    // Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; later ones to the memcg.
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: valid pointer to an initialised rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) } != 0 {
        tracing::debug!("setrlimit(RLIMIT_MEMLOCK) failed");
    }
}

/// `{e}` and its sources, one line.
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Logs a load error with its verifier log and returns a one-line reason.
fn load_failed(prog: &str, e: &aya::programs::ProgramError) -> String {
    let full = error_chain(e);
    tracing::warn!(program = prog, "verifier/load error:\n{full}");
    let first = full.lines().next().unwrap_or("").to_string();
    format!("program {prog} refused: {first}")
}

fn attach_tp(ebpf: &mut Ebpf, prog: &str, cat: &str, name: &str) -> Result<(), String> {
    let p: &mut TracePoint = ebpf
        .program_mut(prog)
        .ok_or_else(|| format!("program {prog} missing"))?
        .try_into()
        .map_err(|e| format!("{prog}: {e}"))?;
    p.load().map_err(|e| load_failed(prog, &e))?;
    p.attach(cat, name)
        .map(|_| ())
        .map_err(|e| format!("attach {cat}/{name}: {}", error_chain(&e)))
}

fn attach_raw_tp(ebpf: &mut Ebpf, prog: &str, tp: &str) -> Result<(), String> {
    let p: &mut RawTracePoint = ebpf
        .program_mut(prog)
        .ok_or_else(|| format!("program {prog} missing"))?
        .try_into()
        .map_err(|e| format!("{prog}: {e}"))?;
    p.load().map_err(|e| load_failed(prog, &e))?;
    p.attach(tp)
        .map(|_| ())
        .map_err(|e| format!("attach raw_tp {tp}: {}", error_chain(&e)))
}

fn attach_kprobe(ebpf: &mut Ebpf) -> Result<String, String> {
    let has_kprobes = std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists();
    if !has_kprobes {
        return Err(
            "kernel has no kprobe PMU (/sys/bus/event_source/devices/kprobe absent: \
             CONFIG_KPROBES off); NUMA hinting faults not sampled"
                .into(),
        );
    }
    let p: &mut KProbe = ebpf
        .program_mut("task_numa_fault")
        .ok_or("program task_numa_fault missing")?
        .try_into()
        .map_err(|e| format!("task_numa_fault: {e}"))?;
    p.load().map_err(|e| load_failed("task_numa_fault", &e))?;
    p.attach("task_numa_fault", 0)
        .map(|_| "kprobe on task_numa_fault".into())
        .map_err(|e| format!("attach kprobe task_numa_fault: {}", error_chain(&e)))
}

fn perf_config(e: Event) -> PerfEventConfig {
    match e {
        Event::NodeLoads => PerfEventConfig::HwCache {
            event: HwCacheEvent::Node,
            operation: HwCacheOp::Read,
            result: HwCacheResult::Access,
        },
        Event::NodeLoadMisses => PerfEventConfig::HwCache {
            event: HwCacheEvent::Node,
            operation: HwCacheOp::Read,
            result: HwCacheResult::Miss,
        },
        Event::Raw(v) => PerfEventConfig::Raw { event_id: v },
    }
}

/// Both DRAM events, or neither: a remote counter without the local one cannot give a ratio,
/// so when the local side fails the remote program is not attached either (its links are
/// dropped with the program when the remote side fails after the local one attached).
fn attach_pmu_pair(
    ebpf: &mut Ebpf,
    pair: &EventPair,
    cpus: &[u32],
) -> Result<[PerfProg; 2], String> {
    let local = match attach_perf(
        ebpf,
        "local_mem_sample",
        perf_config(pair.local),
        pmu::LOCAL_PERIOD,
        cpus,
    ) {
        Ok(p) => p,
        Err(e) => {
            return Err(format!(
                "local-DRAM event {} ({}): {e}",
                pair.local.describe(),
                pair.why
            ))
        }
    };
    let remote = attach_perf(
        ebpf,
        "remote_mem_sample",
        perf_config(pair.remote),
        REMOTE_PERIOD,
        cpus,
    );
    match remote {
        Ok(remote) => Ok([local, remote]),
        Err(e) => {
            detach_all(ebpf, "local_mem_sample");
            Err(format!(
                "remote-DRAM event {} ({}): {e}; the local one is detached again (no ratio from one side)",
                pair.remote.describe(),
                pair.why
            ))
        }
    }
}

/// Unloads a perf_event program (its perf links go with it).
fn detach_all(ebpf: &mut Ebpf, prog: &str) {
    if let Some(p) = ebpf.program_mut(prog) {
        if let Ok(p) = <&mut PerfEvent>::try_from(p) {
            if let Err(e) = p.unload() {
                tracing::warn!(program = prog, error = %e, "unloading failed");
            }
        }
    }
}

/// Why a perf_event program is not attached: the kernel refused to load it, or it loaded and
/// a perf event could not be opened on some CPU (it is unloaded again: all CPUs or none).
enum PerfFailed {
    Load(String),
    Attach(String),
}

impl PerfFailed {
    fn into_string(self) -> String {
        match self {
            PerfFailed::Load(e) | PerfFailed::Attach(e) => e,
        }
    }
}

fn attach_perf(
    ebpf: &mut Ebpf,
    prog: &'static str,
    config: PerfEventConfig,
    period: u64,
    cpus: &[u32],
) -> Result<PerfProg, String> {
    attach_perf_why(ebpf, prog, config, period, cpus).map_err(PerfFailed::into_string)
}

/// Loads `prog` and attaches it on every CPU of `cpus` (its links per CPU returned), or leaves
/// it unloaded.
fn attach_perf_why(
    ebpf: &mut Ebpf,
    prog: &'static str,
    config: PerfEventConfig,
    period: u64,
    cpus: &[u32],
) -> Result<PerfProg, PerfFailed> {
    let p: &mut PerfEvent = ebpf
        .program_mut(prog)
        .ok_or_else(|| PerfFailed::Load(format!("program {prog} missing")))?
        .try_into()
        .map_err(|e| PerfFailed::Load(format!("{prog}: {e}")))?;
    p.load()
        .map_err(|e| PerfFailed::Load(load_failed(prog, &e)))?;
    let attached = if cpus.is_empty() {
        Err("no online CPUs in the topology".to_string())
    } else {
        cpus.iter()
            .map(|&cpu| {
                p.attach(
                    config,
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Period(period),
                    false,
                )
                .map(|id| (cpu, id))
                .map_err(|e| format!("perf_event_open on CPU {cpu}: {}", error_chain(&e)))
            })
            .collect::<Result<BTreeMap<_, _>, _>>()
    };
    // All or nothing: a program attached to some CPUs only would sample part of the machine
    // while its source reads as failed. Unloading takes its links with it.
    if attached.is_err() {
        if let Err(e) = p.unload() {
            tracing::warn!(program = prog, error = %e, "unloading failed");
        }
    }
    attached
        .map(|links| PerfProg::new(prog, config, period, links))
        .map_err(PerfFailed::Attach)
}
