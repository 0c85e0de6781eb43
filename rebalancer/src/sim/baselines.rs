//! What each policy does to the simulated machine besides admission: the AutoNUMA-like
//! page-follows-thread migration (its task placement is in the kernel model, `run`), the clairvoyant greedy oracle, and one round of the REAL
//! planner ([`crate::controller::plan`]) whose moves are applied to cpus/mems and recorded in
//! the allocator's books as the daemon's are.

use std::collections::BTreeMap;

use super::run::{normalise, World};
use crate::controller::{self, CgroupObs, NodeObs, Observations};
use crate::cpuset::CpuSet;

/// AutoNUMA-like: per workload (hugetlb excluded, as the kernel does), move up to the model's
/// rate of pages from nodes holding more than the threads' share toward nodes holding less,
/// within mems and free memory.
pub(super) fn autonuma_step(w: &mut World<'_>, step_s: f64) {
    let budget = (w.cfg.model.autonuma_bytes_per_s as f64 * step_s) as u64;
    let uids: Vec<String> = w.live.keys().cloned().collect();
    for u in uids {
        let l = &w.live[&u];
        if w.task(l).hugepages {
            continue;
        }
        let total = l.total_mem();
        if total == 0 {
            continue;
        }
        let mut share: BTreeMap<u32, f64> = BTreeMap::new();
        for (&n, &s) in &l.threads {
            if let Some(m) = l.mems.iter().min_by_key(|&m| (w.topo.distance(n, m), m)) {
                *share.entry(m).or_default() += s;
            }
        }
        let share = normalise(share);
        let desired = |n: u32| total as f64 * share.get(&n).copied().unwrap_or(0.0);
        let excess: BTreeMap<u32, f64> = l
            .mem
            .iter()
            .map(|(&n, &b)| (n, b as f64 - desired(n)))
            .filter(|&(_, e)| e > 0.0)
            .collect();
        let deficit: BTreeMap<u32, f64> = share
            .keys()
            .map(|&n| (n, desired(n) - l.mem.get(&n).copied().unwrap_or(0) as f64))
            .filter(|&(_, d)| d > 0.0)
            .collect();
        let (te, td): (f64, f64) = (excess.values().sum(), deficit.values().sum());
        if te < total as f64 * 0.01 || td <= 0.0 {
            continue;
        }
        let amount = (budget as f64).min(te).min(td) as u64;
        let dest = w.spread(&normalise(deficit), amount, false);
        let moved: u64 = dest.values().sum();
        let l = w.live.get_mut(&u).expect("listed");
        let mut left = moved;
        for (&n, &e) in &excess {
            let t = ((moved as f64 * e / te) as u64).min(left);
            if let Some(b) = l.mem.get_mut(&n) {
                let t = t.min(*b);
                *b -= t;
                left -= t;
            }
        }
        for &n in excess.keys() {
            if let Some(b) = l.mem.get_mut(&n) {
                let t = left.min(*b);
                *b -= t;
                left -= t;
            }
        }
        let moved = moved - left;
        // `left` > 0 only if rounding left nothing to take: give back what was not taken
        let mut give = moved;
        for (n, b) in dest {
            let b = b.min(give);
            *l.mem.entry(n).or_default() += b;
            give -= b;
        }
        l.mem.retain(|_, b| *b > 0);
        w.count_migration(moved);
    }
}

/// The oracle: at every arrival, departure and phase change it knows each workload's demand
/// and places it on the fewest, nearest nodes with room (keeping it where it is when that
/// still fits), migrating its memory at once. A greedy clairvoyant bound, not a proof.
pub(super) fn oracle_place(w: &mut World<'_>) {
    let reserved = w.alloc.reserved_cpus.clone();
    let mut cpu_left: BTreeMap<u32, f64> = w
        .topo
        .nodes
        .iter()
        .map(|n| (n.id, n.cpus.difference(&reserved).len() as f64))
        .collect();
    let mut mem_left = w.mem_cap.clone();
    let mut huge_left = w.huge_cap.clone();
    let max_node = cpu_left.values().copied().fold(0.0, f64::max);
    let mut order: Vec<(String, f64)> = w
        .live
        .iter()
        .map(|(u, l)| (u.clone(), w.task(l).phases[l.phase].cpus))
        .collect();
    order.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut assigned: BTreeMap<String, CpuSet> = BTreeMap::new();
    let fits =
        |s: &CpuSet, d: f64, need: u64, cpu: &BTreeMap<u32, f64>, mem: &BTreeMap<u32, u64>| {
            s.iter()
                .map(|n| cpu.get(&n).copied().unwrap_or(0.0))
                .sum::<f64>()
                >= d
                && s.iter()
                    .map(|n| mem.get(&n).copied().unwrap_or(0))
                    .sum::<u64>()
                    >= need
        };
    let take = |s: &CpuSet,
                d: f64,
                need: u64,
                cpu: &mut BTreeMap<u32, f64>,
                mem: &mut BTreeMap<u32, u64>| {
        let k = s.len().max(1) as f64;
        for n in s.iter() {
            *cpu.entry(n).or_default() -= d / k;
            let m = mem.entry(n).or_default();
            *m = m.saturating_sub(need / k as u64);
        }
    };
    // pass 1: stay where it still fits (and is as small as it can be)
    for (u, d) in &order {
        let l = &w.live[u];
        let huge = w.task(l).hugepages;
        let need = l.total_mem() + l.pending_initial;
        let ml = if huge { &mut huge_left } else { &mut mem_left };
        let minimal = l.mems.len() == 1 || *d > max_node;
        if minimal && allowed_set(l, &l.mems) && fits(&l.mems, *d, need, &cpu_left, ml) {
            take(&l.mems, *d, need, &mut cpu_left, ml);
            assigned.insert(u.clone(), l.mems.clone());
        }
    }
    // pass 2: the rest on the fewest nearest nodes with room
    for (u, d) in &order {
        if assigned.contains_key(u) {
            continue;
        }
        let l = &w.live[u];
        let huge = w.task(l).hugepages;
        let need = l.total_mem() + l.pending_initial;
        let ml = if huge { &mut huge_left } else { &mut mem_left };
        let seeds: Vec<u32> = w
            .topo
            .nodes
            .iter()
            .filter(|n| !n.cpus.is_empty() && allowed_node(l, n.id))
            .map(|n| n.id)
            .collect();
        let mut best: Option<(usize, u64, f64, CpuSet)> = None;
        for &s in &seeds {
            let mut others = seeds.clone();
            others.sort_by_key(|&n| (w.topo.distance(s, n), n));
            let mut set = CpuSet::new();
            for n in others {
                set.insert(n);
                if fits(&set, *d, need, &cpu_left, ml) {
                    break;
                }
            }
            if !fits(&set, *d, need, &cpu_left, ml) {
                continue;
            }
            let outside: u64 = l
                .mem
                .iter()
                .filter(|(n, _)| !set.contains(**n))
                .map(|(_, b)| b)
                .sum();
            let room: f64 = set.iter().map(|n| cpu_left[&n]).sum();
            let key = (set.len(), outside, -room, set);
            if best.as_ref().is_none_or(|b| {
                (key.0, key.1)
                    .cmp(&(b.0, b.1))
                    .then(key.2.total_cmp(&b.2))
                    .is_lt()
            }) {
                best = Some(key);
            }
        }
        let set = match best {
            Some(b) => b.3,
            // nowhere fits: stay if it already runs somewhere allowed (moving would not
            // relieve anything), else the allowed node with most CPU left
            None if allowed_set(l, &l.mems) && !l.cpus.is_empty() => l.mems.clone(),
            None => seeds
                .iter()
                .copied()
                .max_by(|a, b| cpu_left[a].total_cmp(&cpu_left[b]).then(b.cmp(a)))
                .map(|n| CpuSet::from_iter([n]))
                .unwrap_or_else(|| l.mems.clone()),
        };
        take(&set, *d, need, &mut cpu_left, ml);
        assigned.insert(u.clone(), set);
    }
    for (u, set) in assigned {
        let l = &w.live[&u];
        if l.mems == set && !l.cpus.is_empty() {
            continue;
        }
        let cpus = w.topo.cpus_of_nodes(&set).difference(&reserved);
        if cpus.is_empty() {
            continue;
        }
        let threads = w.threads_for(&cpus, false);
        let l = w.live.get_mut(&u).expect("listed");
        l.cpus = cpus;
        l.mems = set.clone();
        l.threads = threads.clone();
        let moved = w.evacuate(&u, &set, &threads);
        w.count_migration(moved);
        w.stats.moves += 1;
    }
}

fn allowed_node(l: &super::run::Live, n: u32) -> bool {
    l.constraints
        .allowed_nodes
        .as_ref()
        .is_none_or(|a| a.contains(n))
        && l.device_node.is_none_or(|d| d == n)
}

fn allowed_set(l: &super::run::Live, s: &CpuSet) -> bool {
    !s.is_empty() && s.iter().all(|n| allowed_node(l, n))
}

/// The observations the daemon would build for this period (the controller's input).
pub(super) fn observations(w: &World<'_>) -> Observations {
    let steps = w.acc_steps.max(1);
    let free = w.free(false);
    let free_huge = w.free(true);
    let cgroups = w
        .live
        .iter()
        .map(|(u, l)| {
            let huge = w.task(l).hugepages;
            let mem = l.mem.clone();
            let mut constraints = l.constraints.clone();
            constraints.pinned |= w.cfg.frozen.contains(u);
            CgroupObs {
                id: u.clone(),
                cpu_ns_per_node: l.cpu_ns_acc.clone(),
                wait_ns_per_node: l.wait_ns_acc.clone(),
                cross_node_migrations: l.migrations_acc.round() as u64,
                mem_bytes_per_node: if huge { BTreeMap::new() } else { mem.clone() },
                hugepage_bytes_per_node: if huge { mem } else { BTreeMap::new() },
                cpus: l.cpus.clone(),
                mems: l.mems.clone(),
                constraints,
                ..Default::default()
            }
        })
        .collect();
    let nodes = w
        .topo
        .nodes
        .iter()
        .map(|n| {
            let busy = w.busy_acc.get(&n.id).copied().unwrap_or(0.0) / steps as f64;
            (
                n.id,
                NodeObs {
                    cpu_busy: busy,
                    free_bytes: free.get(&n.id).copied().unwrap_or(0),
                    free_hugepage_bytes: free_huge.get(&n.id).copied().unwrap_or(0),
                    runnable: Some(
                        w.runnable_acc.get(&n.id).copied().unwrap_or(0.0) / steps as f64,
                    ),
                },
            )
        })
        .collect();
    Observations {
        period_ns: steps * w.cfg.step_ms * 1_000_000,
        cgroups,
        nodes,
        reserved_cpus: w.alloc.reserved_cpus.clone(),
    }
}

/// Records `mv` (diagnostics): what the planner priced for the option it chose, the
/// workload's age and the rest of its life in the trace.
fn log_move(w: &mut World<'_>, plan: &controller::Plan, mv: &controller::Move, now_ms: u64) {
    let l = &w.live[&mv.cgroup];
    let task = w.task(l);
    let now_s = now_ms as f64 / 1000.0;
    let toward = mv.stage.as_ref().map_or(&mv.to_mems, |s| &s.toward);
    let priced = plan
        .decisions
        .iter()
        .find(|d| d.cgroup == mv.cgroup)
        .and_then(|d| d.considered.iter().find(|c| &c.nodes == toward))
        .cloned();
    let trigger = format!("{:?}", mv.reason);
    let rec = super::run::MoveRecord {
        t_s: now_s,
        cgroup: mv.cgroup.clone(),
        trigger: trigger
            .split(|c: char| !c.is_alphanumeric())
            .next()
            .unwrap_or("")
            .to_string(),
        from_mems: mv.from_mems.to_string(),
        to_mems: mv.to_mems.to_string(),
        staged: mv.stage.is_some(),
        bytes: mv.bytes_to_migrate,
        age_s: now_s - task.arrive_s as f64,
        left_s: task.leave_s.map(|x| x as f64 - now_s),
        priced,
        realized_relief: 0.0,
    };
    w.stats.move_log.push(rec);
    let horizon = rec_horizon(&w.stats.move_log[w.stats.move_log.len() - 1], w.cfg);
    let before = w.live[&mv.cgroup].threads.clone();
    let k = w.stats.move_log.len() - 1;
    w.stats.tracking.push((k, before, now_ms + horizon));
}

/// How long a logged move's relief is counted: the relief horizon it was priced with, else the
/// config's horizon.
fn rec_horizon(r: &super::run::MoveRecord, cfg: &super::run::SimConfig) -> u64 {
    r.priced.as_ref().map_or(cfg.controller.horizon_ms, |c| {
        c.relief_horizon_ms.max(c.horizon_ms)
    })
}

/// One controller round: observe, plan with the real planner, apply its moves.
pub(super) fn rebalancer_round(w: &mut World<'_>, now_ms: u64) {
    let obs = observations(w);
    let ccfg = &w.cfg.controller;
    // As the daemon's round: placements tracked (a re-pin restarts a score).
    let period_ms = obs.period_ns / 1_000_000;
    (w.state).observe_window(w.topo, &obs, crate::controller::EWMA_ALPHA, period_ms);
    // As the daemon's round: what admission sees beyond the books, measured before the moves
    // are booked (a moved workload's overuse stays on its old node until measured again).
    let lasting = (w.state).lasting_pressure(ccfg.admission_load_periods as usize);
    w.overuse = w.alloc.overuse(w.topo, &lasting);
    let plan = controller::plan(w.topo, &obs, &w.state, ccfg, now_ms);
    let online = w.topo.online_cpus();
    let budget = ccfg.migration_budget_mib.saturating_mul(1 << 20);
    if plan.bytes_to_migrate() > budget {
        w.stats.violations += 1;
    }
    for d in &plan.decisions {
        if let controller::Outcome::Skipped(skip) = &d.outcome {
            let name = format!("{skip:?}");
            let name = name
                .split(|c: char| !c.is_alphanumeric())
                .next()
                .unwrap_or("");
            *w.stats.skips.entry(name.to_string()).or_default() += 1;
        }
    }
    for mv in &plan.moves {
        let ok = !mv.to_cpus.is_empty()
            && !mv.to_mems.is_empty()
            && mv.to_cpus.is_subset(&online)
            && mv.to_cpus.is_disjoint(&w.alloc.reserved_cpus)
            && w.live.contains_key(&mv.cgroup);
        if !ok {
            w.stats.violations += 1;
            continue;
        }
        if w.cfg.log_moves {
            log_move(w, &plan, mv, now_ms);
        }
        let excl = w.live[&mv.cgroup].constraints.exclusive;
        let threads = w.threads_for(&mv.to_cpus, excl);
        let l = w.live.get_mut(&mv.cgroup).expect("checked");
        // A reversal: mems changed back to what they were before the previous change (the
        // rounds of a staged move keep mems as they are: not a change).
        if l.mems != mv.to_mems {
            if l.prev_mems.as_ref() == Some(&mv.to_mems) {
                w.stats.reversals += 1;
            }
            l.prev_mems = Some(l.mems.clone());
        }
        l.cpus = mv.to_cpus.clone();
        l.mems = mv.to_mems.clone();
        l.threads = threads.clone();
        let moved = match &mv.stage {
            None => w.evacuate(&mv.cgroup, &mv.to_mems, &threads),
            Some(s) => w.evacuate_upto(&mv.cgroup, &s.toward, &threads, mv.bytes_to_migrate),
        };
        w.count_migration(moved);
        // Through the allocator's books, as the daemon's moves are (`daemon::apply`): later
        // admissions see where the planner put the workload.
        let container = w
            .alloc
            .pods
            .get(&mv.cgroup)
            .and_then(|p| p.containers.first());
        if let Some(c) = container.map(|c| c.placement.container.clone()) {
            w.alloc.record_move_cpus(&mv.cgroup, &c, &mv.to_cpus);
            if mv.stage.is_none() {
                w.alloc.record_move_mems(&mv.cgroup, &c, &mv.to_mems);
            }
        }
        w.stats.moves += 1;
        w.stats.staged += u64::from(mv.stage.is_some());
        w.state.record_move(mv, moved, now_ms);
    }
    for l in w.live.values_mut() {
        l.cpu_ns_acc.clear();
        l.wait_ns_acc.clear();
        l.migrations_acc = 0.0;
    }
    w.busy_acc.clear();
    w.runnable_acc.clear();
    w.acc_steps = 0;
    w.stats.planner_rounds += 1;
}
