//! The NRI CreateContainer hook inside the plugin: from the ttrpc request's bytes to the
//! response's bytes (decode, map to a request, admit through the admission service — shared
//! pool shrink included; the checkpoint is requested, written by the checkpointer thread —,
//! encode). 200 containers on the 8-node
//! EPYC-like machine (2 sockets × 4 nodes × 8 cores × 2 threads), one in four Guaranteed with 2
//! exclusive CPUs (each shrinks every shared container: updates in the answer), the rest
//! Burstable and BestEffort; the checkpoint on tmpfs (/dev/shm, as /run is in production).
//! Prints p50 / p99 / max of the wall time and of the hook thread's CPU time (the difference is
//! waiting: the state lock, or a CPU on a loaded machine). Run:
//! `cargo bench -p rebalancer --bench nri_hook`.
use std::time::{Duration, Instant};

use prost::Message as _;
use rebalancer::config::Config;
use rebalancer::daemon::nri::Policy;
use rebalancer::daemon::{Daemon, Shared};
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

fn main() {
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
    }
    let t = Instant::now();
    for _ in 0..20 {
        d.checkpoint().unwrap();
    }
    let ckpt = t.elapsed() / 20;
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for (what, mut v) in [("wall", times), ("on-CPU (the hook's thread)", cpu)] {
        v.sort();
        let pct = |q: f64| v[((v.len() as f64 * q).ceil() as usize).min(v.len()) - 1];
        println!(
            "nri CreateContainer hook, {} containers, {what}: p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs",
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
