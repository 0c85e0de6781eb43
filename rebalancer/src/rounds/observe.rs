//! A round's observations, with their I/O: the managed cgroups (walked under kubelet's root
//! and the configured roots), each one's CPU time, memory, cpusets and constraints, the nodes'
//! busy share, run queues and free memory, and the topology followed through hotplug.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use super::{report_source, Engine};
use crate::{
    cgroup::{classify_in, CgroupKind, Controller},
    config::Config,
    controller::{
        observe::{ShiftGuard, FRESH_MAX_PERIODS, SHIFT_MIN_BEFORE_NS, SHIFT_MIN_CPU_NS},
        CgroupObs, Constraints, NodeObs, Observations,
    },
    cpuset::CpuSet,
    daemon::{admission::Admission, Daemon, Io},
    ebpf::{Sample, SourceStatus},
    procfs,
    topology::{sysfs, Topology},
};

impl Engine {
    /// Each of `managed`'s own wait on the run queues since the last round (`crate::runwait`)
    /// when `controller.own_wait` is on and this kernel keeps run delays; the first call probes
    /// and reports the source in `status` (with the reason, when it is absent).
    fn own_waits(
        &mut self,
        io: &mut Io,
        d: &Daemon,
        on: bool,
        managed: &[String],
    ) -> BTreeMap<String, crate::runwait::Measured> {
        if !on {
            // Turned off by a reload: the baselines would span the rounds it was off.
            if let Some(Ok(t)) = &mut self.own_wait {
                *t = Default::default();
            }
            return BTreeMap::new();
        }
        if self.own_wait.is_none() {
            const NAME: &str = "own_wait:schedstat";
            let probed = crate::runwait::probe(&self.proc_root);
            let st = match &probed {
                Ok(()) => SourceStatus::ok(
                    NAME,
                    "each workload's threads' run_delay (/proc/<tid>/schedstat), per round",
                ),
                Err(why) => {
                    tracing::warn!(reason = %why, "controller.own_wait is on but this kernel keeps no run delays; a workload's demand on a crowded node is estimated from its node's queue and no move passes overload_busy");
                    SourceStatus::skipped(NAME, why.clone())
                }
            };
            report_source(io, d, st);
            self.own_wait = Some(probed.map(|()| Default::default()));
        }
        let Some(Ok(t)) = &mut self.own_wait else {
            return BTreeMap::new();
        };
        let mut src = crate::runwait::Live {
            cgroups: &self.cgroups,
            proc_root: &self.proc_root,
        };
        let now_ns = self.epoch.elapsed().as_nanos() as u64;
        let out = t.sample(managed, &mut src, crate::runwait::MAX_THREADS, now_ns);
        if t.truncated && !self.own_wait_truncated {
            tracing::warn!(
                max_threads = crate::runwait::MAX_THREADS,
                "the managed cgroups hold more threads than one round reads for their own wait; those past it are estimated from their node's queue"
            );
        }
        self.own_wait_truncated = t.truncated;
        out
    }

    /// The written-pages tracker when `controller.written_pages` is on and this kernel tracks
    /// soft-dirty bits; the first call probes and reports the source in `status` (loudly, with
    /// the reason, when it is absent).
    fn written_tracker(
        &mut self,
        io: &mut Io,
        d: &Daemon,
        on: bool,
    ) -> Option<&mut crate::written::WrittenPages> {
        if !on {
            return None;
        }
        if self.written.is_none() {
            const NAME: &str = "written_pages:soft_dirty";
            let probed = crate::written::probe(&self.proc_root);
            let st = match &probed {
                Ok(()) => {
                    tracing::info!("written-pages sampling on: locality weighted by the pages each workload writes (soft-dirty bits)");
                    SourceStatus::ok(
                        NAME,
                        "soft-dirty bits via clear_refs + pagemap, nodes via move_pages",
                    )
                }
                Err(why) => {
                    tracing::warn!(reason = %why, "controller.written_pages is on but this kernel cannot track written pages; locality falls back to the other evidence");
                    SourceStatus::skipped(NAME, why.clone())
                }
            };
            report_source(io, d, st);
            self.written = Some(probed.map(|()| crate::written::WrittenPages::default()));
        }
        self.written.as_mut().and_then(|w| w.as_mut().ok())
    }

    /// Cgroups someone else re-pinned (`trigger::Hub::take_repinned`): the written-pages
    /// windows of those that are candidates, or whose memory spans nodes, (re)start now, at
    /// the event, so the event's round reads what they wrote since the pin
    /// (`written::WrittenPages::restart`, `start`). Runs on the
    /// round thread between rounds; takes no lock.
    pub fn repinned(&mut self, io: &mut Io, d: &Daemon, cgroups: &[String]) {
        if cgroups.is_empty() || !d.lock(io).config().controller.written_pages {
            return;
        }
        // Not one whose move is under way: its clear would take the mm's write lock against
        // the migration (and this thread with it); its round does not read it either.
        let (moving, _) = self.applier(d).in_flight(io);
        let Some(Ok(t)) = &mut self.written else {
            return;
        };
        let mut src = crate::written::Live {
            cgroups: &self.cgroups,
            proc_root: &self.proc_root,
        };
        for cg in cgroups.iter().filter(|cg| !moving.contains(*cg)) {
            if let Ok(cpus) = self.cgroups.effective_cpus(cg) {
                // One no period has seen yet starts its window here too when its memory
                // spans nodes (what makes a candidate), e.g. a workload pinned right after
                // it allocated: its round would otherwise only clear it, a settle delay later.
                let spans = |cg: &str| {
                    (self.cgroups.numa_stat(cg).ok()).is_some_and(|n| {
                        let mut mem = n.anon.clone();
                        for (node, b) in &n.file {
                            *mem.entry(*node).or_default() += b;
                        }
                        crate::written::spans_nodes(mem.into_values())
                    })
                };
                let started = t.restart(&mut src, cg, &cpus)
                    || (!t.knows(cg) && spans(cg) && t.start(&mut src, cg, &cpus));
                if started {
                    let (at, which) = (self.written_restarted)
                        .get_or_insert_with(|| (std::time::Instant::now(), Default::default()));
                    *at = std::time::Instant::now();
                    which.insert(cg.clone());
                }
            }
        }
    }

    /// The managed cgroups — Kubernetes containers (when enabled) and cgroups with processes
    /// at or below a configured root, sorted, relative, without a leading '/' — and every
    /// cgroup that would be one with processes in it (a configured root's empty cgroups).
    pub(super) fn walk(&self, cfg: &Config) -> Option<(Vec<String>, Vec<String>)> {
        // Only under kubelet's root and the configured roots: the rest of the hierarchy (users'
        // delegated subtrees, any number of cgroups) is never managed, so never walked.
        let mut roots = Vec::new();
        if cfg.cgroups.kubernetes {
            roots = crate::cgroup::kube::kubernetes_roots(cfg.cgroups.kubernetes_root.as_deref());
        }
        roots.extend(cfg.cgroups.roots.iter().cloned());
        let all = match self.cgroups.walk_roots(Controller::Cpuset, &roots) {
            Ok(all) => all,
            Err(e) => {
                tracing::warn!(error = %e, "cannot walk the cpuset hierarchy: this round is skipped");
                return None;
            }
        };
        let mut managed = Vec::new();
        let mut watchable = Vec::new();
        for p in all {
            let p = p.trim_start_matches('/').to_string();
            let kind = classify_in(
                &p,
                cfg.cgroups.kubernetes_root.as_deref(),
                &cfg.cgroups.roots,
            );
            let populated = match kind {
                CgroupKind::Container { .. } if cfg.cgroups.kubernetes => true,
                CgroupKind::Configured { .. } => (self.cgroups)
                    .procs(Controller::Cpuset, &p)
                    .is_ok_and(|v| !v.is_empty()),
                _ => continue,
            };
            if populated {
                managed.push(p.clone());
            }
            watchable.push(p);
        }
        Some((managed, watchable))
    }

    fn node_obs(&mut self, cfg: &Config, topo: &Topology) -> BTreeMap<u32, NodeObs> {
        let stat = procfs::read_stat(&self.proc_root).ok();
        let busy = match (&self.prev_stat, &stat) {
            (Some(a), Some(b)) => procfs::busy_between(a, b),
            _ => BTreeMap::new(),
        };
        self.prev_stat = stat;
        let node_busy = |n: &crate::topology::Node| {
            let cpus: Vec<f64> = n
                .cpus
                .iter()
                .filter_map(|c| busy.get(&c).copied())
                .collect();
            if cpus.is_empty() {
                0.0
            } else {
                cpus.iter().sum::<f64>() / cpus.len() as f64
            }
        };
        let busy_by_node: BTreeMap<u32, f64> =
            topo.nodes.iter().map(|n| (n.id, node_busy(n))).collect();
        // Run queues over the window since the last round that measured them (nodes without
        // enough readings: None, and the planner takes the busy share).
        let runq_now = self.cpu_source.runq().unwrap_or_default();
        let cpu_node = topo.cpu_node_map();
        let runnable = self.runq.update(runq_now, &cpu_node, &busy_by_node);
        let node_dir = cfg.daemon.sysfs_root.join("devices/system/node");
        topo.nodes
            .iter()
            .map(|n| {
                let cpu_busy = busy_by_node.get(&n.id).copied().unwrap_or(0.0);
                let free = node_free_bytes(&node_dir, n.id).unwrap_or(n.memory_free_bytes);
                let free_hp: u64 = n
                    .hugepages
                    .iter()
                    .map(|(size, hp)| {
                        hp.free * size.trim_end_matches("kB").parse::<u64>().unwrap_or(0) * 1024
                    })
                    .sum();
                (
                    n.id,
                    NodeObs {
                        cpu_busy,
                        free_bytes: free,
                        free_hugepage_bytes: free_hp,
                        runnable: runnable.get(&n.id).copied(),
                    },
                )
            })
            .collect()
    }

    /// Constraints of one cgroup: admission's promises for bound containers, and the operator's
    /// pins (task affinity, or a cpuset we did not write) for everything else. Takes the
    /// shared lock only for the binding lookup (the /proc reads run without it, so the watcher
    /// is never held up by a round).
    fn constraints(
        &self,
        io: &mut Io,
        d: &Daemon,
        topo: &Topology,
        cg: &str,
        eff_cpus: &CpuSet,
    ) -> Constraints {
        if let Some(c) = d.lock(io).bound_constraints(cg) {
            return c;
        }
        let mut c = Constraints {
            keep_cpus: true,
            ..Default::default()
        };
        // Not ours: the threads' own affinity and the cgroup's cpuset are the operator's choice.
        let mut allowed = CpuSet::new();
        for pid in self
            .cgroups
            .procs(Controller::Cpuset, cg)
            .unwrap_or_default()
        {
            if let Some((aff, _)) = procfs::task_placement(&self.proc_root, pid) {
                allowed = allowed.union(&aff);
            }
        }
        let pinned_cpus = if allowed.is_empty() {
            eff_cpus.clone()
        } else {
            allowed.intersection(eff_cpus)
        };
        let nodes: CpuSet = pinned_cpus
            .iter()
            .filter_map(|cpu| topo.node_of_cpu(cpu))
            .collect();
        let all_nodes: CpuSet = topo
            .nodes
            .iter()
            .filter(|n| !n.cpus.is_empty())
            .map(|n| n.id)
            .collect();
        if !nodes.is_empty() && nodes != all_nodes {
            c.allowed_nodes = Some(nodes);
        }
        c
    }

    /// Rebuilds the topology when CPUs or nodes went online or offline since the last check
    /// (a node taken offline, CPU hotplug): `cpu/online` and `node/online` are compared each
    /// round, and on a change the whole sysfs tree is read again and replaces the shared
    /// topology, so the planner only targets CPUs and nodes that exist. Returns true when the
    /// topology was rebuilt (the round then has the CPU-time source follow it: the eBPF
    /// sampler's per-CPU perf events and `CPU_NODE`). A tree that cannot be read keeps the old
    /// topology (and is tried again next round).
    pub fn refresh_topology(&mut self, io: &mut Io, adm: &Admission) -> bool {
        let d = &adm.daemon;
        let root = d.lock(io).config().daemon.sysfs_root.clone();
        let now = topology_fingerprint(&root);
        let Some(before) = self.topo_fingerprint.replace(now.clone()) else {
            return false;
        };
        if before == now {
            return false;
        }
        let topo = match sysfs::read(&root) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "CPUs or nodes changed but the topology cannot be read again; keeping the old one");
                self.topo_fingerprint = Some(before);
                return false;
            }
        };
        d.lock(io).set_topology(topo);
        adm.replace_offline(io);
        true
    }

    /// A round's topology check: [`Self::refresh_topology`], then, when the topology was
    /// rebuilt or the CPU-time source still misses some online CPU, the source follows the
    /// current topology (the eBPF sampler opens and closes per-CPU perf events: syscalls, made
    /// with no lock held). Returns whether the topology was rebuilt.
    pub fn follow_topology(&mut self, io: &mut Io, adm: &Admission) -> bool {
        let changed = self.refresh_topology(io, adm);
        if changed || self.cpu_source.cpus_pending() {
            let topo = adm.daemon.lock(io).topology().clone();
            self.cpu_source.sync_cpus(&topo);
        }
        changed
    }

    /// The round's observations of `managed` and of the nodes, from the samples `cumulative`
    /// (the window since the last round, and since the mark where one was taken).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn observe(
        &mut self,
        io: &mut Io,
        d: &Daemon,
        cfg: &Config,
        topo: &Topology,
        managed: &[String],
        cumulative: BTreeMap<String, Sample>,
        moving: &BTreeSet<String>,
    ) -> Observations {
        let period_ns = self
            .last_round
            .map_or(cfg.controller.period_ms * 1_000_000, |t| {
                t.elapsed().as_nanos() as u64
            });
        // A cgroup this round finds that the last one did not (not at the daemon's first
        // round, which finds them all) is a new workload.
        let first_round = self.last_round.is_none();
        self.last_round = Some(std::time::Instant::now());
        let nodes = self.node_obs(cfg, topo);
        let waits = self.own_waits(io, d, cfg.controller.own_wait, managed);
        // Taken for this round's window only (a failed read leaves it for the next).
        let mark = self.mark.take();
        let mut window = Window {
            cumulative: &cumulative,
            mark: mark.as_ref(),
            sees_moves: self.cpu_source.sees_moves(),
            ran: BTreeMap::new(),
            // The managed cgroups compared with the part of a window before its mark so far.
            fresh_tried: (managed.iter())
                .filter(|cg| self.fresh_tried.contains(*cg))
                .cloned()
                .collect(),
        };
        let mut obs = Observations {
            period_ns,
            cgroups: Vec::new(),
            nodes,
            reserved_cpus: CpuSet::new(),
        };
        // Probed (and reported in `status`) at the first round, whether or not a cgroup needs it.
        let _ = self.written_tracker(io, d, cfg.controller.written_pages);
        // Sorted, as `managed` is: the written-pages source goes round them.
        let mut written_candidates = Vec::new();
        for cg in managed {
            let Some(mut o) = self.observe_cgroup(io, d, topo, cg, &mut window) else {
                continue;
            };
            o.constraints.moving = moving.contains(cg);
            let wait = (waits.get(cg))
                .and_then(|m| crate::runwait::wait_for_period(m, o.total_cpu_ns(), period_ns));
            if let Some(wait) = wait {
                let runnable = nodes_of(topo, &o.cpus);
                o.wait_ns_per_node = crate::runwait::split(wait, &o.cpu_ns_per_node, &runnable);
            }
            // Only where its memory is on two nodes or more (`written::spans_nodes`), or new.
            // Not while its move is under way: it is not planned then, and a clear takes its
            // mm's write lock against the migration (a 2-node guest's move of 8,538 pages
            // took 3.3 s beside a round reading it, 0.12 s alone).
            let spans = crate::written::spans_nodes(o.mem_bytes_per_node.values().copied());
            // A new workload that may place memory on two nodes or more gets its first window
            // whatever its memory yet (see `written`): one still allocating is read once it
            // settles (within `written::FIRST_WINDOWS_LIMIT`), rather than a round later when
            // its memory first spans nodes. One confined to a node (what admission gives most
            // containers) is not read: its writes can only be where its memory is.
            let new =
                !first_round && o.mems.len() >= 2 && self.last_managed.binary_search(cg).is_err();
            if cfg.controller.written_pages && (spans || new) && !o.constraints.moving {
                written_candidates.push((cg.clone(), o.cpus.clone()));
            }
            obs.cgroups.push(o);
        }
        self.ran = window.ran;
        self.fresh_tried = window.fresh_tried;
        self.prev = cumulative;
        if let Some(Ok(t)) = &mut self.written {
            let mut src = crate::written::Live {
                cgroups: &self.cgroups,
                proc_root: &self.proc_root,
            };
            for (cg, cpus) in &written_candidates {
                t.placed(cg, cpus);
            }
            let names: Vec<String> = written_candidates.into_iter().map(|(cg, _)| cg).collect();
            // A window restarted at an event that came while the last round ran is read no
            // sooner than QUICK_WINDOW after (its round may be due at once); a round that
            // reads none of them (their memory now on one node, say) does not wait for them.
            if let Some((at, which)) = self.written_restarted.take() {
                if names.iter().any(|n| which.contains(n)) {
                    std::thread::sleep(crate::written::QUICK_WINDOW.saturating_sub(at.elapsed()));
                }
            }
            let reading = std::time::Instant::now();
            let mut written = t.period(&mut src, &names);
            let period_ms = reading.elapsed().as_millis() as u64;
            // New candidates (or re-pinned ones) were only cleared: their first window is a
            // short one read now, not a period later (`WrittenPages::quick`). This thread
            // holds no lock while it waits; the round is that much longer, at most
            // `FIRST_WINDOWS_LIMIT` and a read — less when an event comes meanwhile (an
            // operator's pin): the round then ends, the event's round follows, and the
            // windows left open are read whole at their next visit.
            let cleared = std::time::Instant::now();
            while t.has_fresh() {
                if d.rounds.event_waiting() {
                    tracing::debug!(
                        period_ms,
                        ms = reading.elapsed().as_millis() as u64,
                        "written pages: first windows left open for an event's round"
                    );
                    break;
                }
                std::thread::sleep(crate::written::QUICK_STEP);
                let quick = t.quick(&mut src, cleared.elapsed());
                if !quick.is_empty() {
                    tracing::debug!(cgroups = ?quick.keys().collect::<Vec<_>>(), period_ms, ms = reading.elapsed().as_millis() as u64, "written pages: first windows read");
                }
                written.extend(quick);
            }
            for o in &mut obs.cgroups {
                if let Some(w) = written.remove(&o.id) {
                    o.written_bytes_per_node = w;
                }
            }
            if t.visited < names.len() || t.skipped > 0 {
                tracing::debug!(
                    visited = t.visited,
                    candidates = names.len(),
                    processes_left = t.skipped,
                    budget = t.budget,
                    "written pages: the period's budget ran out; the next period goes on from there"
                );
            }
        }
        // Memory the Memory Manager promised Guaranteed containers and they have not touched
        // yet is free to the kernel but not to moves: the planner sees it as taken.
        for (node, bytes) in d.lock(io).promised_unused(&obs) {
            if let Some(n) = obs.nodes.get_mut(&node) {
                n.free_bytes = n.free_bytes.saturating_sub(bytes);
            }
        }
        obs
    }

    /// One managed cgroup's observation in this window (None: its cpusets cannot be read).
    fn observe_cgroup(
        &self,
        io: &mut Io,
        d: &Daemon,
        topo: &Topology,
        cg: &String,
        w: &mut Window,
    ) -> Option<CgroupObs> {
        let cpus = self.cgroups.effective_cpus(cg).ok()?;
        let mems = self.cgroups.effective_mems(cg).ok()?;
        let numa = self.cgroups.numa_stat(cg).unwrap_or_default();
        let now = w.cumulative.get(cg).cloned().unwrap_or_default();
        let delta = now.delta(self.prev.get(cg).unwrap_or(&Sample::default()));
        let cpu_ns_per_node = (delta.cpu_ns.iter())
            .filter(|(_, v)| **v > 0)
            .map(|(n, v)| (*n, *v))
            .collect();
        (d.metrics.cross_node_migrations).inc_by(delta.cross_node_migrations);
        d.metrics.numa_balancing_moves.inc_by(delta.numa_moves);
        let mut mem = numa.anon.clone();
        for (n, b) in &numa.file {
            *mem.entry(*n).or_default() += b;
        }
        let constraints = self.constraints(io, d, topo, cg, &cpus);
        let mut o = CgroupObs {
            id: cg.clone(),
            cpu_ns_per_node,
            mem_bytes_per_node: mem,
            hugepage_bytes_per_node: numa.hugetlb.clone(),
            cross_node_migrations: delta.cross_node_migrations,
            numa_moves: delta.numa_moves,
            cpus,
            mems,
            constraints,
            ..Default::default()
        };
        delta.access().fill(&mut o);
        self.follow_shift(io, d, cg, &now, &mut o, w);
        // Where its threads may run now (the nodes of its cpuset, which bounds every
        // thread): CPU time spent elsewhere this period predates a re-pin or a move
        // and is counted there. Not the threads' affinity (read from each process's
        // main thread only, it would move its workers' time too) nor admission's
        // allowed nodes (where it may be placed, not where it runs).
        o.project_cpu_to(&nodes_of(topo, &o.cpus));
        // Where it ran, for the next round: a window with enough of its time;
        // otherwise the last one still says it. Empty after a shift: that window is
        // partly the placement it left (or, for a workload whose last window merely
        // looked settled, a few samples), and a shift is not followed by another at
        // once (a workload flipping its threads' affinity restarts its score at most
        // every other round).
        let kept = if o.shifted {
            Some(BTreeMap::new())
        } else if o.total_cpu_ns() >= SHIFT_MIN_BEFORE_NS {
            Some(o.cpu_ns_per_node.clone())
        } else {
            // An empty entry (the shift's) holds for one round only.
            self.ran.get(cg).filter(|r| !r.is_empty()).cloned()
        };
        if let Some(r) = kept {
            w.ran.insert(cg.clone(), r);
        }
        Some(o)
    }

    /// Threads that moved themselves to another node since the last window: the window's CPU
    /// time is counted where they run now (before the projection onto the cpuset). Where they
    /// run now: since the mark, where one was taken and saw enough of it, else the whole
    /// window.
    fn follow_shift(
        &self,
        io: &mut Io,
        d: &Daemon,
        cg: &String,
        now: &Sample,
        o: &mut CgroupObs,
        w: &mut Window,
    ) {
        let at_mark = w.mark.and_then(|m| m.get(cg));
        let since_mark = at_mark
            .map(|m| now.delta(m).cpu_ns)
            .filter(|r| r.values().sum::<u64>() >= SHIFT_MIN_CPU_NS);
        let recent = since_mark.as_ref().unwrap_or(&o.cpu_ns_per_node).clone();
        // Compared with its last window that said where it ran; a workload with none
        // (managed at the last round but idle until now: a fresh task that moved
        // itself right after touching its memory) with the part of this window
        // before the mark, and since the mark (not the whole window, which holds
        // that part), with the tests for a fresh workload (`ShiftGuard::FRESH`). Not
        // in the round after a shift (its entry is then empty, see `observe_cgroup`).
        // Once per cgroup (a light workload that never has a reference window is
        // not tested every round), and only while its score is young (not a history
        // restored at a restart).
        let prev_or_zero = self.prev.get(cg).cloned().unwrap_or_default();
        let grew = |a: &Sample, b: &Sample| {
            a.cpu_ns
                .iter()
                .all(|(n, &v)| b.cpu_ns.get(n).copied().unwrap_or(0) >= v)
        };
        let earlier = at_mark
            .filter(|_| !self.ran.contains_key(cg) && !self.fresh_tried.contains(cg))
            // Counters that went back (the cgroup re-created at its path since the
            // last round or the mark) say nothing of where it ran.
            .filter(|m| grew(&prev_or_zero, m) && grew(m, now))
            .filter(|_| (d.lock(io).score_periods(cg)).is_none_or(|p| p < FRESH_MAX_PERIODS))
            .map(|m| m.delta(&prev_or_zero).cpu_ns);
        let (before, guard) = match self.ran.get(cg) {
            Some(r) => (Some(r), ShiftGuard::REFERENCE),
            None => (
                earlier.as_ref().filter(|_| since_mark.is_some()),
                ShiftGuard::FRESH,
            ),
        };
        if !w.sees_moves {
            return;
        }
        if guard == ShiftGuard::FRESH && before.is_some() {
            w.fresh_tried.insert(cg.clone());
        }
        if let Some(before) = before {
            if o.follow(before, &recent, guard) {
                tracing::debug!(cgroup = %cg, ?before, ?recent, "its threads moved to another node: its score restarts where they run now");
            } else {
                tracing::trace!(cgroup = %cg, ?before, ?recent, "CPU time in the last window and now");
            }
        } else {
            tracing::trace!(cgroup = %cg, ?recent, marked = at_mark.is_some(), "CPU time now; no last window to compare with");
        }
    }
}

/// What one round's per-cgroup observations read and build up.
struct Window<'a> {
    cumulative: &'a BTreeMap<String, Sample>,
    mark: Option<&'a BTreeMap<String, Sample>>,
    sees_moves: bool,
    ran: BTreeMap<String, BTreeMap<u32, u64>>,
    fresh_tried: BTreeSet<String>,
}

/// The nodes of `cpus`.
fn nodes_of(topo: &Topology, cpus: &CpuSet) -> CpuSet {
    cpus.iter()
        .filter_map(|cpu| topo.node_of_cpu(cpu))
        .collect()
}

/// `cpu/online` and `node/online` under a sysfs root: what changes when CPUs or nodes go
/// online or offline.
fn topology_fingerprint(root: &Path) -> String {
    ["devices/system/cpu/online", "devices/system/node/online"]
        .iter()
        .map(|f| std::fs::read_to_string(root.join(f)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("|")
}

/// MemFree of a node now, in bytes (node meminfo is in kB).
pub fn node_free_bytes(node_dir: &Path, node: u32) -> Option<u64> {
    let p = node_dir.join(format!("node{node}/meminfo"));
    let text = std::fs::read_to_string(&p).ok()?;
    sysfs::parse_meminfo(&p, &text)
        .ok()
        .map(|(_, free_kb)| free_kb.saturating_mul(1024))
}
#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: node free memory was taken in kB as if it were bytes, so every target looked
    /// full ("no-memory", free 452784 for 442 MiB) and the controller never moved memory.
    #[test]
    fn node_free_memory_is_in_bytes_like_the_topology() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sysfs/epyc-nps4");
        let topo = sysfs::read(&root).unwrap();
        let node_dir = root.join("devices/system/node");
        for n in &topo.nodes {
            assert_eq!(
                node_free_bytes(&node_dir, n.id),
                Some(n.memory_free_bytes),
                "node {}",
                n.id
            );
        }
        assert!(topo.nodes[0].memory_free_bytes > 1 << 30);
    }
}
