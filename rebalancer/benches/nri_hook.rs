//! The NRI CreateContainer hook inside the plugin: from the ttrpc request's bytes to the
//! response's bytes (decode, map to a request, admit through the admission service — shared
//! pool shrink included; the checkpoint is requested, written by the checkpointer thread —,
//! encode). 200 containers on the 8-node
//! EPYC-like machine (2 sockets × 4 nodes × 8 cores × 2 threads), one in four Guaranteed with 2
//! exclusive CPUs (each shrinks every shared container: updates in the answer), the rest
//! Burstable and BestEffort; the checkpoint on tmpfs (/dev/shm, as /run is in production).
//! Prints p50 / p99 / max of the wall time and of the hook thread's CPU time (the difference is
//! waiting: the state lock, or a CPU on a loaded machine).
//!
//! Run twice: idle, and with writer threads applying moves while containers are created
//! (`MIGRATING_WRITERS` threads, each flipping its own unbound cgroup between two CPU pairs
//! and two nodes through the daemon's per-move path, `apply::apply_moves`). Their writer
//! models the kernel's migration work queue (`cpuset_migrate_mm_wq`): a narrowing mems write
//! queues a migration of `MIGRATION` and waits for it, and every cpuset write (cpus or mems)
//! first waits for the queue to drain, as `flush_workqueue` makes it. A hook that waits for a
//! writer's lock shows that wait in its wall time. Run:
//! `cargo bench -p rebalancer --bench nri_hook`.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message as _;
use rebalancer::config::Config;
use rebalancer::controller::{CgroupWriteError, CgroupWriter, Move, Trigger};
use rebalancer::cpuset::CpuSet;
use rebalancer::daemon::nri::Policy;
use rebalancer::daemon::{Daemon, Io, Shared};
use rebalancer::nri::{api, envelope, session};
use rebalancer::serve::Metrics;
use rebalancer::topology::TopologyBuilder;

fn opt_i(v: i64) -> Option<api::OptionalInt64> {
    (v != 0).then_some(api::OptionalInt64 { value: v })
}

/// CPU time of the calling thread (a hook's wall time minus this is waiting: for a lock, or
/// for a CPU on a loaded machine).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_THREAD_CPUTIME_ID always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Writer threads applying moves in the busy run.
const MIGRATING_WRITERS: usize = 2;
/// How long one queued migration keeps the kernel's work queue busy (a few hundred MiB).
const MIGRATION: Duration = Duration::from_millis(20);

/// An in-memory cgroupfs whose writes wait like the kernel's: see the module doc.
struct MigratingWriter {
    live: BTreeMap<String, (CpuSet, CpuSet)>,
    /// The kernel's migration work queue, machine-wide: held while a migration runs.
    queue: Arc<Mutex<()>>,
}

impl MigratingWriter {
    fn get(&self, cg: &str) -> Result<&(CpuSet, CpuSet), CgroupWriteError> {
        self.live.get(cg).ok_or(CgroupWriteError::Vanished {
            cgroup: cg.to_string(),
        })
    }
}

impl CgroupWriter for MigratingWriter {
    fn read_cpus(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
        Ok(self.get(cg)?.0.clone())
    }
    fn read_mems(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
        Ok(self.get(cg)?.1.clone())
    }
    fn write_cpus(&mut self, _io: &Io, cg: &str, cpus: &CpuSet) -> Result<(), CgroupWriteError> {
        drop(self.queue.lock().unwrap()); // flush_workqueue
        self.live
            .get_mut(cg)
            .ok_or(CgroupWriteError::Vanished {
                cgroup: cg.to_string(),
            })?
            .0 = cpus.clone();
        Ok(())
    }
    fn write_mems(&mut self, _io: &Io, cg: &str, mems: &CpuSet) -> Result<(), CgroupWriteError> {
        let queue = self.queue.clone();
        let wq = queue.lock().unwrap();
        let entry = self.live.get_mut(cg).ok_or(CgroupWriteError::Vanished {
            cgroup: cg.to_string(),
        })?;
        if !entry.1.is_subset(mems) {
            std::thread::sleep(MIGRATION); // narrowing: the memory migrates, the writer waits
        }
        drop(wq);
        entry.1 = mems.clone();
        Ok(())
    }
    fn needs_memory_migrate(&self) -> bool {
        false
    }
    fn read_memory_migrate(&self, _: &str) -> Result<bool, CgroupWriteError> {
        Ok(true)
    }
    fn set_memory_migrate(&mut self, _io: &Io, _: &str, _: bool) -> Result<(), CgroupWriteError> {
        Ok(())
    }
    fn move_pages(
        &mut self,
        _io: &Io,
        _: &str,
        _: &CpuSet,
        _: u64,
    ) -> Result<u64, CgroupWriteError> {
        Ok(0)
    }
}

/// Writer threads that keep applying moves until `stop` (see the module doc).
fn start_writers(d: &Daemon, stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<usize>> {
    let queue = Arc::new(Mutex::new(()));
    (0..MIGRATING_WRITERS)
        .map(|i| {
            let (d, stop, queue) = (d.clone(), stop.clone(), queue.clone());
            std::thread::spawn(move || {
                let io = &mut Io::new();
                let cg = format!("system.slice/writer{i}.service");
                let set = |s: &str| CpuSet::parse(s).unwrap();
                let sides = [
                    (set(&format!("{}-{}", 240 + 4 * i, 241 + 4 * i)), set("6")),
                    (set(&format!("{}-{}", 242 + 4 * i, 243 + 4 * i)), set("7")),
                ];
                let mut w = MigratingWriter {
                    live: BTreeMap::from([(cg.clone(), sides[0].clone())]),
                    queue,
                };
                let mut moves = 0;
                while !stop.load(Ordering::Relaxed) {
                    let (from, to) = (&sides[moves % 2], &sides[(moves + 1) % 2]);
                    let mv = Move {
                        cgroup: cg.clone(),
                        from_cpus: from.0.clone(),
                        to_cpus: to.0.clone(),
                        from_mems: from.1.clone(),
                        to_mems: to.1.clone(),
                        bytes_to_migrate: 64 << 20,
                        reason: Trigger::PoorLocality,
                        locality_before: 0.2,
                        locality_after: 0.9,
                        net: 1.0,
                        stage: None,
                    };
                    let applied =
                        rebalancer::daemon::apply::apply_moves(io, &d, &mut w, &[mv], 0, false);
                    assert_eq!(applied.applied, 1, "writer {i}'s move {moves}: {applied:?}");
                    moves += 1;
                }
                moves
            })
        })
        .collect()
}

fn main() {
    run(false);
    run(true);
}

fn run(migrating: bool) {
    let topo = TopologyBuilder {
        sockets: 2,
        nodes_per_socket: 4,
        cores_per_node: 8,
        threads_per_core: 2,
        cores_per_l3: 4,
        memory_per_node_bytes: 16 << 30,
        ..Default::default()
    }
    .build();
    let dir = tempfile::Builder::new()
        .prefix("rb-nri-bench")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let mut cfg = Config::default();
    cfg.daemon.state_dir = dir.path().join("state");
    let d = Daemon::new(Shared::fresh(topo, cfg).unwrap(), Metrics::default());
    let rt = std::sync::Arc::new(rebalancer::daemon::nri_updates::Runtime::new(
        d.metrics.clone(),
    ));
    let mut p = Policy::new(d.clone(), None, rt);
    let stop = Arc::new(AtomicBool::new(false));
    let writers = if migrating {
        start_writers(&d, &stop)
    } else {
        Vec::new()
    };
    let mut times = Vec::new();
    let mut cpu = Vec::new();
    for i in 0..200u32 {
        let (qos, parent) = match i % 4 {
            0 => ("g", "kubepods".to_string()),
            1 | 2 => ("b", "kubepods/burstable".into()),
            _ => ("e", "kubepods/besteffort".into()),
        };
        let uid = format!("{i:08x}-0000-4000-8000-000000000000");
        let pod = api::PodSandbox {
            id: format!("sandbox{i}"),
            name: format!("pod{i}"),
            uid: uid.clone(),
            linux: Some(api::LinuxPodSandbox {
                cgroup_parent: format!("/{parent}/pod{uid}"),
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = format!("{i:064x}");
        let (quota, shares, mem) = match qos {
            "g" => (200_000, 2048, 256 << 20),
            "b" => (0, 256, 0),
            _ => (0, 2, 0),
        };
        let ctr = api::Container {
            id: id.clone(),
            pod_sandbox_id: pod.id.clone(),
            name: "app".into(),
            linux: Some(api::LinuxContainer {
                cgroups_path: format!("/{parent}/pod{uid}/{id}"),
                resources: Some(api::LinuxResources {
                    cpu: Some(api::LinuxCpu {
                        shares: Some(api::OptionalUInt64 { value: shares }),
                        quota: opt_i(quota),
                        period: Some(api::OptionalUInt64 { value: 100_000 }),
                        ..Default::default()
                    }),
                    memory: Some(api::LinuxMemory {
                        limit: opt_i(mem),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let run = api::StateChangeEvent {
            event: api::Event::RunPodSandbox as i32,
            pod: Some(pod.clone()),
            container: None,
        };
        let req = |method: &str, payload: Vec<u8>| envelope::Request {
            service: session::PLUGIN_SERVICE.into(),
            method: method.into(),
            payload,
            ..Default::default()
        };
        session::dispatch(&mut p, &req("StateChange", run.encode_to_vec())).unwrap();
        let create = req(
            "CreateContainer",
            api::CreateContainerRequest {
                pod: Some(pod),
                container: Some(ctr),
            }
            .encode_to_vec(),
        )
        .encode_to_vec();
        let (t0, c0) = (Instant::now(), thread_cpu());
        let r = envelope::Request::decode(create.as_slice()).unwrap();
        let out = session::dispatch(&mut p, &r).expect("admitted");
        let bytes = envelope::Response {
            status: None,
            payload: out,
        }
        .encode_to_vec();
        times.push(t0.elapsed());
        cpu.push(thread_cpu().saturating_sub(c0));
        assert!(!bytes.is_empty());
        if migrating {
            // hooks spread over the writers' moves, not bunched between two of them
            std::thread::sleep(Duration::from_micros(1500));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let moves: usize = writers.into_iter().map(|w| w.join().unwrap()).sum();
    let what = if migrating {
        format!(
            "while {MIGRATING_WRITERS} writer threads applied {moves} moves ({} ms migrations)",
            MIGRATION.as_millis()
        )
    } else {
        "idle".to_string()
    };
    let t = Instant::now();
    let io = &mut Io::new();
    for _ in 0..20 {
        d.checkpoint(io).unwrap();
    }
    let ckpt = t.elapsed() / 20;
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let what_run = what;
    for (what, mut v) in [("wall", times), ("on-CPU (the hook's thread)", cpu)] {
        v.sort();
        let pct = |q: f64| v[((v.len() as f64 * q).ceil() as usize).min(v.len()) - 1];
        println!(
            "nri CreateContainer hook {what_run}, {} containers, {what}: p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs",
            v.len(),
            us(pct(0.50)),
            us(pct(0.99)),
            us(*v.last().unwrap())
        );
    }
    println!(
        "(a durable checkpoint of the final state, {} pods, would add {:.0} µs)",
        200,
        us(ckpt)
    );
}
