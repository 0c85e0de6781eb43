//! Changes to the runtime's containers made *outside* the NRI hooks — the control round's
//! moves, the CPU-hotplug replacement (`Admission::replace_offline`), the shared pool's shrink
//! after an API admission — sent to the runtime as NRI `UpdateContainers` while the plugin is
//! connected, so the runtime's view (its container spec, `runc update`) and cgroupfs agree.
//!
//! [`Runtime`] is shared by the plugin thread (`daemon::nri`, which knows which cgroup is which
//! runtime container and owns the socket) and the writers of the other threads:
//! - [`RuntimeMoveWriter`], the control round's `CgroupWriter` in NRI mode: cpus and mems
//!   writes become updates; `cpuset.memory_migrate` (v1: not part of the OCI spec, so the
//!   runtime never touches it) and the staged page moves (move_pages) stay the daemon's own.
//!   Memory follows a mems update exactly as it follows our own write: runc writes
//!   `cpuset.mems`, and the kernel migrates (v2 always, v1 with memory_migrate, which the
//!   actuator turns on before and off only after the runtime answered).
//! - [`RuntimeCpusetWriter`], the admission service's `CpusetWriter` for those threads.
//!
//! A write never waits for the runtime: it is called under `Daemon::order`, and the runtime
//! may at that moment be waiting for the plugin's answer to a CreateContainer, which needs
//! that lock (containerd holds its NRI lock until the plugin answers, and applies unsolicited
//! updates only after). The change is recorded as *given* (what readers see until the runtime
//! answered) and queued; [`CgroupWriter::settle`] — the actuator calls it before reading a
//! move back, without the lock — waits for the runtime's answer.
//!
//! Ordering: at most one `UpdateContainers` is in flight, each carrying the latest given
//! cpuset of its containers; when its answer comes and a container was given something newer
//! meanwhile (a CreateContainer answer's own updates overtake a queued one), it is sent again,
//! so the last decision is the one the runtime ends with. The plugin sends only after the
//! connection has been quiet for `nri::session::QUIET`: containerd 1.7 takes its two NRI locks in opposite
//! orders for lifecycle events and plugin-initiated updates (containerd/containerd#13733, fixed
//! upstream in containerd/nri#301), and a quiet connection makes it unlikely that a lifecycle
//! event is between its two locks when our update arrives.
//!
//! Not connected, or a cgroup that is not one of the runtime's containers: written to cgroupfs
//! directly, logged, and counted in `rebalancer_nri_direct_writes_total{reason}`.

use std::{
    collections::BTreeMap,
    sync::{Arc, Condvar, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use super::{
    engine::RealWriter,
    writer::{CgroupCpusetWriter, CpusetChange, CpusetWriter, WriteError},
};
use crate::{
    cgroup::Cgroups,
    controller::{CgroupFile, CgroupWriteError, CgroupWriter},
    cpuset::CpuSet,
    nri::api,
    serve::{metrics::ReasonLabel, Metrics},
};

/// How long [`Runtime::settle`] waits for the runtime's answer.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(3);

/// What a container was last given (through a hook's answer or an update).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Given {
    pub cpus: Option<CpuSet>,
    pub mems: Option<CpuSet>,
}

/// Why a change was not forwarded to the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direct {
    NotConnected,
    NotRuntimeContainer,
}

impl Direct {
    fn label(self) -> &'static str {
        match self {
            Direct::NotConnected => "not-connected",
            Direct::NotRuntimeContainer => "not-runtime-container",
        }
    }
}

#[derive(Default)]
struct State {
    connected: bool,
    /// cgroup → the runtime's container id (containers the plugin placed or adopted).
    ids: BTreeMap<String, String>,
    given: BTreeMap<String, Given>,
    /// Cgroups whose given cpuset is to be sent, in order.
    queued: Vec<String>,
    /// Sent and not answered: (cgroup, what was sent).
    inflight: Vec<(String, Given)>,
    /// cgroup → why the runtime did not apply its last update (taken by `settle`).
    failed: BTreeMap<String, String>,
}

impl State {
    fn pending(&self, cg: &str) -> bool {
        self.queued.iter().any(|c| c == cg) || self.inflight.iter().any(|(c, _)| c == cg)
    }
}

/// The runtime's side of container changes (see the module doc).
pub struct Runtime {
    state: Mutex<State>,
    answered: Condvar,
    metrics: Metrics,
}

impl Runtime {
    pub fn new(metrics: Metrics) -> Runtime {
        Runtime {
            state: Mutex::default(),
            answered: Condvar::new(),
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The plugin registered (`true`) or lost its connection: what was queued or in flight
    /// is dropped and its waiters told.
    pub fn set_connected(&self, up: bool) {
        let mut s = self.lock();
        s.connected = up;
        if !up {
            let mut lost = std::mem::take(&mut s.queued);
            lost.extend(std::mem::take(&mut s.inflight).into_iter().map(|(c, _)| c));
            for cg in lost {
                s.failed.insert(
                    cg,
                    "the NRI connection was lost before the runtime answered".into(),
                );
            }
            self.answered.notify_all();
        }
    }

    /// `cgroup` is the runtime's container `id`.
    pub fn track(&self, cgroup: &str, id: &str) {
        self.lock().ids.insert(cgroup.to_string(), id.to_string());
    }

    /// The container is gone: forgotten (with what it was given).
    pub fn untrack(&self, cgroup: &str) {
        let mut s = self.lock();
        s.ids.remove(cgroup);
        s.given.remove(cgroup);
        s.queued.retain(|c| c != cgroup);
    }

    /// Synchronize: the runtime's containers are exactly `ids` (cgroup → id).
    pub fn retrack(&self, ids: BTreeMap<String, String>) {
        let mut s = self.lock();
        s.given.retain(|cg, _| ids.contains_key(cg));
        s.queued.retain(|cg| ids.contains_key(cg));
        s.ids = ids;
    }

    /// A hook's answer gave `cgroup` this cpuset (the runtime applies it with the answer).
    pub fn note_given(&self, cgroup: &str, cpus: &CpuSet, mems: Option<&CpuSet>) {
        let mut s = self.lock();
        let g = s.given.entry(cgroup.to_string()).or_default();
        g.cpus = Some(cpus.clone());
        if let Some(m) = mems {
            g.mems = Some(m.clone());
        }
    }

    /// What `cgroup` was last given, if anything.
    pub fn given(&self, cgroup: &str) -> Option<Given> {
        self.lock().given.get(cgroup).cloned()
    }

    /// What `cgroup` was given while the runtime has not answered yet (None once it has).
    pub fn pending_given(&self, cgroup: &str) -> Option<Given> {
        let s = self.lock();
        s.pending(cgroup)
            .then(|| s.given.get(cgroup).cloned())
            .flatten()
    }

    /// The runtime's container id of `cgroup`, if it is one.
    pub fn id_of(&self, cgroup: &str) -> Option<String> {
        self.lock().ids.get(cgroup).cloned()
    }

    /// Gives `cgroup` new cpus and/or mems through the runtime: recorded and queued, never
    /// waited for. `Err` when it cannot go through the runtime (the caller writes cgroupfs).
    pub fn submit(
        &self,
        cgroup: &str,
        cpus: Option<&CpuSet>,
        mems: Option<&CpuSet>,
    ) -> Result<(), Direct> {
        let mut s = self.lock();
        if !s.connected {
            return Err(Direct::NotConnected);
        }
        if !s.ids.contains_key(cgroup) {
            return Err(Direct::NotRuntimeContainer);
        }
        let g = s.given.entry(cgroup.to_string()).or_default();
        if let Some(c) = cpus {
            g.cpus = Some(c.clone());
        }
        if let Some(m) = mems {
            g.mems = Some(m.clone());
        }
        s.failed.remove(cgroup);
        if !s.queued.iter().any(|c| c == cgroup) {
            s.queued.push(cgroup.to_string());
        }
        Ok(())
    }

    /// For the plugin thread, when the connection is quiet and no update is in flight: the
    /// queued changes as one batch of container updates (each the latest given), now in flight.
    pub fn take_batch(&self) -> Vec<api::ContainerUpdate> {
        let mut s = self.lock();
        if !s.connected || !s.inflight.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let queued = std::mem::take(&mut s.queued);
        for cg in queued {
            let (Some(id), Some(g)) = (s.ids.get(&cg).cloned(), s.given.get(&cg).cloned()) else {
                continue;
            };
            let Some(cpus) = &g.cpus else {
                // Only mems given so far (never for a placed container): its cpus stay.
                out.push(update(&id, None, g.mems.as_ref()));
                s.inflight.push((cg, g));
                continue;
            };
            out.push(update(&id, Some(cpus), g.mems.as_ref()));
            s.inflight.push((cg, g));
        }
        out
    }

    /// The runtime answered the batch in flight: `Ok(failed container ids)` or the error of
    /// the whole request. Containers given something newer meanwhile are queued again.
    pub fn answered(&self, result: Result<Vec<String>, String>) {
        let mut s = self.lock();
        let inflight = std::mem::take(&mut s.inflight);
        let mut ok = 0u64;
        let mut bad = 0u64;
        for (cg, sent) in inflight {
            let id = s.ids.get(&cg).cloned().unwrap_or_default();
            let why = match &result {
                Err(e) => Some(format!("the runtime refused the update: {e}")),
                Ok(failed) if failed.contains(&id) => {
                    Some(format!("the runtime failed the update of container {id}"))
                }
                Ok(_) => None,
            };
            match why {
                Some(w) => {
                    bad += 1;
                    tracing::warn!(cgroup = %cg, container = %id, error = %w, "container update through the runtime failed");
                    s.failed.insert(cg, w);
                }
                None => {
                    ok += 1;
                    let newer = s.given.get(&cg).is_some_and(|g| *g != sent);
                    if newer && s.ids.contains_key(&cg) && !s.queued.contains(&cg) {
                        s.queued.push(cg);
                    }
                }
            }
        }
        drop(s);
        for (n, result) in [(ok, "applied"), (bad, "failed")] {
            if n > 0 {
                self.metrics
                    .nri_updates
                    .get_or_create(&ReasonLabel {
                        reason: result.into(),
                    })
                    .inc_by(n);
            }
        }
        self.answered.notify_all();
    }

    /// Waits (at most `timeout`) until the runtime answered every update of `cgroup`; the
    /// reason when it did not apply the last one.
    pub fn settle(&self, cgroup: &str, timeout: Duration) -> Result<(), String> {
        let end = Instant::now() + timeout;
        let mut s = self.lock();
        while s.pending(cgroup) {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "the runtime did not answer the update of {cgroup} within {timeout:?}"
                ));
            }
            s = self
                .answered
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        match s.failed.remove(cgroup) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    fn count_direct(&self, cgroup: &str, why: Direct, what: &str) {
        tracing::info!(cgroup = %cgroup, reason = why.label(), change = what, "NRI mode: cpuset written to cgroupfs directly, not through the runtime");
        self.metrics
            .nri_direct_writes
            .get_or_create(&ReasonLabel {
                reason: why.label().into(),
            })
            .inc();
    }
}

/// One container update of cpus (and mems).
pub fn update(id: &str, cpus: Option<&CpuSet>, mems: Option<&CpuSet>) -> api::ContainerUpdate {
    api::ContainerUpdate {
        container_id: id.to_string(),
        linux: Some(api::LinuxContainerUpdate {
            resources: Some(api::LinuxResources {
                cpu: Some(api::LinuxCpu {
                    cpus: cpus.map(|c| c.to_string()).unwrap_or_default(),
                    mems: mems.map(|m| m.to_string()).unwrap_or_default(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }),
        ignore_failure: true,
    }
}

/// The control round's [`CgroupWriter`] in NRI mode (see the module doc): the runtime's
/// containers through the runtime, anything else through `real` (the cgroup layer's
/// [`RealWriter`]).
pub struct RuntimeMoveWriter<'a, W = RealWriter<'a>> {
    pub real: W,
    pub runtime: &'a Runtime,
}

fn settle_error(cg: &str, file: CgroupFile, why: String) -> CgroupWriteError {
    CgroupWriteError::Io {
        cgroup: cg.to_string(),
        file,
        source: std::io::Error::other(why),
    }
}

impl<W: CgroupWriter> CgroupWriter for RuntimeMoveWriter<'_, W> {
    fn read_cpus(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
        match self.runtime.pending_given(cg).and_then(|g| g.cpus) {
            Some(c) => Ok(c),
            None => self.real.read_cpus(cg),
        }
    }
    fn read_mems(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
        match self.runtime.pending_given(cg).and_then(|g| g.mems) {
            Some(m) => Ok(m),
            None => self.real.read_mems(cg),
        }
    }
    fn write_cpus(&mut self, cg: &str, cpus: &CpuSet) -> Result<(), CgroupWriteError> {
        if cpus.is_empty() {
            // As the cgroup layer refuses it.
            return self.real.write_cpus(cg, cpus);
        }
        match self.runtime.submit(cg, Some(cpus), None) {
            Ok(()) => Ok(()),
            Err(why) => {
                self.runtime.count_direct(cg, why, "cpus");
                self.real.write_cpus(cg, cpus)
            }
        }
    }
    fn write_mems(&mut self, cg: &str, mems: &CpuSet) -> Result<(), CgroupWriteError> {
        if mems.is_empty() {
            return self.real.write_mems(cg, mems);
        }
        // The runtime needs the cpus with them when it never gave any (an adopted container).
        let cpus = match self.runtime.given(cg).and_then(|g| g.cpus) {
            Some(_) => None,
            None => self.real.read_cpus(cg).ok(),
        };
        match self.runtime.submit(cg, cpus.as_ref(), Some(mems)) {
            Ok(()) => Ok(()),
            Err(why) => {
                self.runtime.count_direct(cg, why, "mems");
                self.real.write_mems(cg, mems)
            }
        }
    }
    fn needs_memory_migrate(&self) -> bool {
        self.real.needs_memory_migrate()
    }
    fn read_memory_migrate(&self, cg: &str) -> Result<bool, CgroupWriteError> {
        self.real.read_memory_migrate(cg)
    }
    fn set_memory_migrate(&mut self, cg: &str, on: bool) -> Result<(), CgroupWriteError> {
        if !on {
            // Off only once the runtime wrote the mems: the kernel migrates on that write.
            self.settle(cg)?;
        }
        self.real.set_memory_migrate(cg, on)
    }
    fn move_pages(
        &mut self,
        cg: &str,
        toward: &CpuSet,
        max_bytes: u64,
    ) -> Result<u64, CgroupWriteError> {
        self.settle(cg)?;
        self.real.move_pages(cg, toward, max_bytes)
    }
    fn settle(&mut self, cg: &str) -> Result<(), CgroupWriteError> {
        self.runtime
            .settle(cg, SETTLE_TIMEOUT)
            .map_err(|why| settle_error(cg, CgroupFile::Cpus, why))
    }
}

/// The admission service's [`CpusetWriter`] for the threads other than the plugin's in NRI
/// mode (control round: hotplug replacement; API admissions' shrink): the runtime's
/// containers through the runtime, never waited for (see the module doc); anything else
/// through cgroupfs.
pub struct RuntimeCpusetWriter {
    pub runtime: Arc<Runtime>,
    pub cgroupfs: CgroupCpusetWriter,
}

impl CpusetWriter for RuntimeCpusetWriter {
    fn write(&self, c: &CpusetChange) -> Result<(), WriteError> {
        match self
            .runtime
            .submit(&c.cgroup, Some(&c.cpus), c.mems.as_ref())
        {
            Ok(()) => {
                tracing::info!(cgroup = %c.cgroup, cpus = %c.cpus, "container cpuset change sent to the runtime (NRI update)");
                Ok(())
            }
            Err(why) => {
                self.runtime.count_direct(&c.cgroup, why, "cpuset");
                self.cgroupfs.write(c)
            }
        }
    }

    fn cpus(&self, cgroup: &str) -> Option<CpuSet> {
        self.runtime
            .given(cgroup)
            .and_then(|g| g.cpus)
            .or_else(|| self.cgroupfs.cpus(cgroup))
    }
}

impl RuntimeCpusetWriter {
    pub fn new(runtime: Arc<Runtime>, cgroups: Cgroups) -> RuntimeCpusetWriter {
        RuntimeCpusetWriter {
            runtime,
            cgroupfs: CgroupCpusetWriter(cgroups),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::FakeCgroups;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap()
    }

    #[test]
    fn one_batch_in_flight_and_the_latest_decision_wins() {
        let rt = Runtime::new(Metrics::default());
        assert_eq!(
            rt.submit("a", Some(&set("0")), None),
            Err(Direct::NotConnected)
        );
        rt.set_connected(true);
        assert_eq!(
            rt.submit("a", Some(&set("0")), None),
            Err(Direct::NotRuntimeContainer)
        );
        rt.track("a", "ida");
        rt.track("b", "idb");
        rt.submit("a", None, Some(&set("0"))).unwrap();
        rt.submit("a", Some(&set("1")), None).unwrap();
        rt.submit("b", Some(&set("2-3")), None).unwrap();
        // Coalesced: one update per container, with everything given so far.
        let batch = rt.take_batch();
        assert_eq!(batch.len(), 2);
        let cpu = |u: &api::ContainerUpdate| {
            let c = u.linux.as_ref().unwrap().resources.as_ref().unwrap();
            let c = c.cpu.as_ref().unwrap();
            (c.cpus.clone(), c.mems.clone())
        };
        assert_eq!(batch[0].container_id, "ida");
        assert_eq!(cpu(&batch[0]), ("1".into(), "0".into()));
        assert_eq!(cpu(&batch[1]), ("2-3".into(), String::new()));
        // Readers see what the runtime is about to apply.
        assert_eq!(rt.pending_given("a").unwrap().cpus, Some(set("1")));
        // A newer decision while in flight: nothing more is sent until the answer.
        rt.note_given("a", &set("0"), None);
        assert!(rt.take_batch().is_empty());
        assert!(rt.settle("a", Duration::from_millis(10)).is_err());
        rt.answered(Ok(vec!["idb".into()]));
        // b failed; a is sent again with the newer cpus.
        assert!(rt.settle("b", Duration::ZERO).unwrap_err().contains("idb"));
        let again = rt.take_batch();
        assert_eq!(again.len(), 1);
        assert_eq!(cpu(&again[0]), ("0".into(), "0".into()));
        rt.answered(Ok(vec![]));
        assert!(rt.settle("a", Duration::ZERO).is_ok());
        assert!(rt.pending_given("a").is_none());
        assert!(rt.take_batch().is_empty());
    }

    /// The fake kernel, shared by the "runtime" (a thread applying the batches, as runc
    /// update does) and the daemon's writer, which counts what it writes itself.
    #[derive(Clone)]
    struct Shared(Arc<Mutex<FakeCgroups>>, Arc<Mutex<Vec<String>>>);

    impl CgroupWriter for Shared {
        fn read_cpus(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
            self.0.lock().unwrap().read_cpus(cg)
        }
        fn read_mems(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
            self.0.lock().unwrap().read_mems(cg)
        }
        fn write_cpus(&mut self, cg: &str, c: &CpuSet) -> Result<(), CgroupWriteError> {
            self.1.lock().unwrap().push(format!("cpus {cg} {c}"));
            self.0.lock().unwrap().write_cpus(cg, c)
        }
        fn write_mems(&mut self, cg: &str, m: &CpuSet) -> Result<(), CgroupWriteError> {
            self.1.lock().unwrap().push(format!("mems {cg} {m}"));
            self.0.lock().unwrap().write_mems(cg, m)
        }
        fn needs_memory_migrate(&self) -> bool {
            self.0.lock().unwrap().needs_memory_migrate()
        }
        fn read_memory_migrate(&self, cg: &str) -> Result<bool, CgroupWriteError> {
            self.0.lock().unwrap().read_memory_migrate(cg)
        }
        fn set_memory_migrate(&mut self, cg: &str, on: bool) -> Result<(), CgroupWriteError> {
            self.0.lock().unwrap().set_memory_migrate(cg, on)
        }
        fn move_pages(&mut self, cg: &str, t: &CpuSet, b: u64) -> Result<u64, CgroupWriteError> {
            self.0.lock().unwrap().move_pages(cg, t, b)
        }
    }

    /// A runtime on its own thread: applies each batch to the fake kernel, then answers.
    fn runtime_thread(
        rt: Arc<Runtime>,
        kernel: Arc<Mutex<FakeCgroups>>,
        ids: BTreeMap<String, String>,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> std::thread::JoinHandle<usize> {
        std::thread::spawn(move || {
            let mut updates = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let batch = rt.take_batch();
                if batch.is_empty() {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
                for u in &batch {
                    let cg = ids.iter().find(|(_, id)| **id == u.container_id).unwrap().0;
                    let cpu = u.linux.as_ref().unwrap().resources.as_ref().unwrap();
                    let cpu = cpu.cpu.as_ref().unwrap();
                    let mut k = kernel.lock().unwrap();
                    // runc: cpus, then mems.
                    if !cpu.cpus.is_empty() {
                        k.write_cpus(cg, &set(&cpu.cpus)).unwrap();
                    }
                    if !cpu.mems.is_empty() {
                        k.write_mems(cg, &set(&cpu.mems)).unwrap();
                    }
                    updates += 1;
                }
                rt.answered(Ok(vec![]));
            }
            updates
        })
    }

    fn a_move() -> crate::controller::Move {
        crate::controller::Move {
            cgroup: "kubepods/pod1/c1".into(),
            from_cpus: set("0-1"),
            to_cpus: set("2-3"),
            from_mems: set("0"),
            to_mems: set("1"),
            bytes_to_migrate: 1 << 20,
            reason: crate::controller::Trigger::PoorLocality,
            locality_before: 0.0,
            locality_after: 1.0,
            net: 1.0,
            stage: None,
        }
    }

    #[test]
    fn a_move_of_a_runtime_container_goes_through_the_runtime_and_memory_follows() {
        let mut fake = FakeCgroups::v1().with("kubepods/pod1/c1", "0-1", "0");
        fake.set_memory("kubepods/pod1/c1", &[(0, 1 << 20)]);
        let kernel = Arc::new(Mutex::new(fake));
        let direct = Arc::new(Mutex::new(Vec::new()));
        let metrics = Metrics::default();
        let rt = Arc::new(Runtime::new(metrics.clone()));
        rt.set_connected(true);
        let ids: BTreeMap<String, String> =
            [("kubepods/pod1/c1".to_string(), "c1id".to_string())].into();
        rt.retrack(ids.clone());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let runtime = runtime_thread(rt.clone(), kernel.clone(), ids, stop.clone());
        let mv = a_move();
        let mut w = RuntimeMoveWriter {
            real: Shared(kernel.clone(), direct.clone()),
            runtime: &rt,
        };
        let done = crate::controller::apply(&mv, &mut w, false).unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let updates = runtime.join().unwrap();
        assert!(
            direct.lock().unwrap().is_empty(),
            "{:?}",
            direct.lock().unwrap()
        );
        assert!(updates >= 1);
        let k = kernel.lock().unwrap();
        assert_eq!(k.cpus("kubepods/pod1/c1"), Some(&set("2-3")));
        assert_eq!(k.mems("kubepods/pod1/c1"), Some(&set("1")));
        // v1: memory_migrate was on while the runtime narrowed mems, and off again after.
        assert_eq!(
            k.memory("kubepods/pod1/c1").unwrap().get(&1),
            Some(&(1 << 20))
        );
        assert_eq!(k.memory_migrate("kubepods/pod1/c1"), Some(false));
        assert_eq!(done.moved_bytes, 1 << 20);
        assert!(metrics
            .render()
            .contains("rebalancer_nri_updates_total{reason=\"applied\"}"));
    }

    #[test]
    fn without_the_runtime_a_move_is_written_directly_and_counted() {
        let kernel = Arc::new(Mutex::new(FakeCgroups::v2().with(
            "kubepods/pod1/c1",
            "0-1",
            "0",
        )));
        let direct = Arc::new(Mutex::new(Vec::new()));
        let metrics = Metrics::default();
        let rt = Runtime::new(metrics.clone());
        let mut w = RuntimeMoveWriter {
            real: Shared(kernel.clone(), direct.clone()),
            runtime: &rt,
        };
        crate::controller::apply(&a_move(), &mut w, false).unwrap();
        assert!(!direct.lock().unwrap().is_empty());
        assert!(metrics
            .render()
            .contains("rebalancer_nri_direct_writes_total{reason=\"not-connected\"}"));
        // Connected, but not a container of the runtime's.
        rt.set_connected(true);
        let mut mv = a_move();
        (mv.from_cpus, mv.to_cpus, mv.from_mems, mv.to_mems) =
            (set("2-3"), set("0-1"), set("1"), set("0"));
        crate::controller::apply(&mv, &mut w, false).unwrap();
        assert!(metrics
            .render()
            .contains("rebalancer_nri_direct_writes_total{reason=\"not-runtime-container\"}"));
        assert_eq!(
            kernel.lock().unwrap().cpus("kubepods/pod1/c1"),
            Some(&set("0-1"))
        );
    }

    #[test]
    fn a_lost_connection_fails_what_was_pending() {
        let rt = Arc::new(Runtime::new(Metrics::default()));
        rt.set_connected(true);
        rt.track("a", "ida");
        rt.submit("a", Some(&set("1")), None).unwrap();
        assert_eq!(rt.take_batch().len(), 1);
        let waiter = {
            let rt = rt.clone();
            std::thread::spawn(move || rt.settle("a", Duration::from_secs(5)))
        };
        std::thread::sleep(Duration::from_millis(20));
        rt.set_connected(false);
        let e = waiter.join().unwrap().unwrap_err();
        assert!(e.contains("connection was lost"), "{e}");
        assert_eq!(
            rt.submit("a", Some(&set("1")), None),
            Err(Direct::NotConnected)
        );
    }
}
