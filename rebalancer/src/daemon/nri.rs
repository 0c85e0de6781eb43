//! The NRI plugin's policy: admission inside the container lifecycle. The transport
//! (`crate::nri::session`) calls this [`Policy`] for every pod and container event it
//! subscribed to; it admits through the one admission service (`daemon::admission`) with an
//! [`NriWriter`], so nothing here touches a socket and nothing writes cgroupfs — the runtime
//! applies every cpuset (never behind the runtime's back).
//!
//! - CreateContainer: the container's request ([`request`], the one mapping from NRI to a
//!   placement request) is admitted by the allocator; the answer is a ContainerAdjustment of
//!   `linux.resources.cpu.cpus` / `mems`, so the placement holds from the first instruction.
//!   When exclusive CPUs were handed out, the shared containers that still have them get a
//!   ContainerUpdate in the same answer. A refusal fails CreateContainer with the reason.
//! - StopContainer / RemoveContainer / RemovePodSandbox: release. An init container's CPUs are
//!   free again once it stopped, so the app containers after it reuse them, as kubelet does;
//!   a sidecar (restartable init container) keeps running and keeps its CPUs.
//! - Synchronize (every connect): running containers already bound by the checkpoint keep
//!   their allocation; unknown ones are admitted (adopted) and updated; bindings of containers
//!   the runtime no longer has are released — no double allocation after a restart.
//!
//! Admissions and releases are checkpointed soon after (coalesced), not before the answer: the
//! runtime remembers what runs, and Synchronize re-adopts anything the checkpoint missed.
//!
//! A container's device nodes (`linux.devices`) are resolved through the configured sysfs root
//! to the PCI devices behind them (`topology::devnode`) and admitted as the container's
//! `attached_devices`: the device provider's hints follow their PCI NUMA node, as for the
//! admission API's `device_addresses` (docs/kubernetes-and-nri.md says what is not seen).
//!
//! Each container is admitted as its own allocator entry keyed `<pod uid>/<container id, 12>`
//! (as the watcher keys its admissions), bound to its cgroup path. Under
//! `placement.scope = "pod"` it is admitted as one container of its pod (keyed by the pod uid,
//! `Admission::admit_member`), the pod's totals from `PodSandbox.linux.pod_resources` — which
//! containerd 1.7 fills from the CRI sandbox config's `linux.resources`, kubelet's sums of the
//! pod's requests and limits (CPU shares, quota / period, memory limit; no hugepages, so the
//! pod's hugepages count as its containers seen so far); RemovePodSandbox releases the pod.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::cgroup::kube::{classify_in, CgroupKind};
use crate::cgroup::Cgroups;
use crate::cpuset::CpuSet;
use crate::daemon::admission::{Admission, AdmitError, Durability};
use crate::daemon::nri_updates::{update, Runtime};
use crate::daemon::writer::{CgroupCpusetWriter, CpusetChange, CpusetWriter, WriteError};
use crate::daemon::{Daemon, Io};
use crate::nri::api;
use crate::nri::session::Handler;
use crate::placement::admission::{Container, Pod, PodMember};
use crate::placement::key::AllocKey;
use crate::placement::pod::Qos;
use crate::topology::devnode::{self, DevNode, Resolution};

/// Device nodes of one container resolved through sysfs for alignment (three sysfs reads
/// each, on the CreateContainer path): a container spec may carry many (CDI injection), and
/// the answer must come well within the runtime's plugin timeout. Real accelerators number a
/// few per container.
const MAX_RESOLVED_DEVICES: usize = 64;

/// One container's admission request, from the NRI pod and container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Allocator key: `<pod uid>/<container id, 12>`.
    pub key: AllocKey,
    /// Its cgroup, relative to the hierarchy root (as the watcher and controller name it).
    pub cgroup: String,
    pub qos: Qos,
    pub pod: Pod,
    /// The pod's totals (`pod_resources`), for pod scope; None when the runtime sent none.
    pub totals: Option<Container>,
    /// The container's device nodes (`linux.devices`), resolved to PCI devices at admission
    /// ([`Policy::attached_devices`]); empty for a container that may open every device (an
    /// allow-all device rule: a privileged container sees the host's devices, none of them
    /// given to it).
    pub devices: Vec<DevNode>,
}

/// Events the plugin subscribes to.
pub const EVENTS: &[api::Event] = &[
    api::Event::RunPodSandbox,
    api::Event::StopPodSandbox,
    api::Event::RemovePodSandbox,
    api::Event::CreateContainer,
    api::Event::UpdateContainer,
    api::Event::StopContainer,
    api::Event::RemoveContainer,
];

/// NRI's event mask: bit `e - 1` per event.
pub fn event_mask(events: &[api::Event]) -> i32 {
    events.iter().fold(0, |m, e| m | 1 << (*e as i32 - 1))
}

/// The runtime's cgroups path as a path under the hierarchy root: cgroupfs form
/// (`/kubepods/burstable/pod<uid>/<id>`) as it is; systemd form
/// (`kubepods-burstable-pod<uid>.slice:cri-containerd:<id>`) expanded as systemd lays it out.
pub fn cgroup_rel(cgroups_path: &str) -> String {
    let parts: Vec<&str> = cgroups_path.split(':').collect();
    if let [slice, prefix, name] = parts[..] {
        let mut out = Vec::new();
        let stem = slice.strip_suffix(".slice").unwrap_or(slice);
        let mut acc = String::new();
        for (i, piece) in stem.split('-').enumerate() {
            if i > 0 {
                acc.push('-');
            }
            acc.push_str(piece);
            out.push(format!("{acc}.slice"));
        }
        out.push(if prefix.is_empty() {
            format!("{name}.scope")
        } else {
            format!("{prefix}-{name}.scope")
        });
        return out.join("/");
    }
    cgroups_path.trim_matches('/').to_string()
}

/// (limit, request) millicores of an NRI `LinuxCpu`: the CFS quota over its period (100 ms
/// when unset), rounded up, and kubelet's shares inverted; saturating, so a hostile quota
/// cannot overflow.
fn cpu_millis(cpu: Option<&api::LinuxCpu>) -> (u64, u64) {
    let quota = cpu.and_then(|c| c.quota.as_ref()).map_or(0, |q| q.value);
    let period = cpu
        .and_then(|c| c.period.as_ref())
        .map_or(100_000, |p| p.value)
        .max(1);
    let limit = if quota > 0 {
        (quota as u64).saturating_mul(1000).div_ceil(period)
    } else {
        0
    };
    let shares = cpu
        .and_then(|c| c.shares.as_ref())
        .map_or(0, |s| millis_from_shares(s.value));
    (limit, shares)
}

/// A Guaranteed container's CPU: its quota, or without one (kubelet's `cpuCFSQuota: false`)
/// the request its shares carry.
fn guaranteed_millis(limit_millis: u64, shares_millis: u64) -> u64 {
    if limit_millis > 0 {
        limit_millis
    } else {
        shares_millis
    }
}

/// kubelet's shares = millis * 1024 / 1000 (at least 2), inverted.
fn millis_from_shares(shares: u64) -> u64 {
    if shares <= 2 {
        0
    } else {
        shares.saturating_mul(1000).div_ceil(1024)
    }
}

/// The whole mapping from an NRI pod and container to an admission request. `Ok(None)`: not a
/// Kubernetes container (its cgroup is not under kubelet's cgroup root, `kube_root` as
/// `cgroups.kubernetes_root`; None: `kubepods` or `kubepods.slice` at the top) — left as the
/// runtime makes it.
pub fn request(
    pod: &api::PodSandbox,
    c: &api::Container,
    kube_root: Option<&str>,
) -> Result<Option<Request>, String> {
    if c.id.is_empty() {
        return Err("container without an id".into());
    }
    if c.pod_sandbox_id != pod.id {
        return Err(format!(
            "container {} names pod sandbox {:?} but came with pod {:?}",
            c.id, c.pod_sandbox_id, pod.id
        ));
    }
    let linux = c.linux.as_ref();
    let path = linux.map(|l| l.cgroups_path.as_str()).unwrap_or("");
    if path.is_empty() {
        return Err(format!(
            "container {} ({}) has no cgroups path",
            c.id, c.name
        ));
    }
    let cgroup = cgroup_rel(path);
    let CgroupKind::Container { pod_uid, qos, .. } = classify_in(&cgroup, kube_root, &[]) else {
        return Ok(None);
    };
    if !pod.uid.is_empty() && pod.uid != pod_uid {
        return Err(format!(
            "container {}: cgroup {cgroup} belongs to pod {pod_uid}, not to pod {}",
            c.id, pod.uid
        ));
    }
    let totals = pod
        .linux
        .as_ref()
        .and_then(|l| l.pod_resources.as_ref())
        .and_then(|r| container_of(r, qos, "pod"));
    let res = linux.and_then(|l| l.resources.as_ref());
    if res.is_none() && qos != Qos::BestEffort {
        return Err(format!(
            "container {} ({}) of {qos:?} pod {pod_uid} came without linux resources",
            c.id, c.name
        ));
    }
    let mut hp2m = 0;
    let mut hp1g = 0;
    for h in res.map(|r| r.hugepage_limits.as_slice()).unwrap_or(&[]) {
        match h.page_size.as_str() {
            "2MB" => hp2m = u64::saturating_add(hp2m, h.limit),
            "1GB" => hp1g = u64::saturating_add(hp1g, h.limit),
            other => {
                return Err(format!(
                    "container {}: hugepage size {other:?} unknown (2MB and 1GB are)",
                    c.id
                ))
            }
        }
    }
    let container = match qos {
        Qos::Guaranteed => {
            let sized = res.and_then(|r| container_of(r, qos, &c.name)).ok_or_else(|| {
                format!(
                    "container {} ({}) of Guaranteed pod {pod_uid} has no CPU quota or shares, or no memory limit",
                    c.id, c.name
                )
            })?;
            Container {
                hugepages_2mi_bytes: hp2m,
                hugepages_1gi_bytes: hp1g,
                ..sized
            }
        }
        Qos::Burstable => {
            let (limit_millis, shares_millis) = cpu_millis(res.and_then(|r| r.cpu.as_ref()));
            Container {
                name: c.name.clone(),
                cpu_request_millis: shares_millis.max(1),
                cpu_limit_millis: limit_millis.max(shares_millis.max(1)),
                ..Default::default()
            }
        }
        Qos::BestEffort => Container {
            name: c.name.clone(),
            ..Default::default()
        },
    };
    let all_devices_allowed = res.is_some_and(|r| {
        r.devices
            .iter()
            .any(|d| d.allow && matches!(d.r#type.as_str(), "" | "a") && d.major.is_none())
    });
    let devices = match linux {
        Some(l) if !all_devices_allowed => l
            .devices
            .iter()
            .map(|d| DevNode {
                kind: d.r#type.clone(),
                major: d.major,
                minor: d.minor,
                path: d.path.clone(),
            })
            .collect(),
        _ => Vec::new(),
    };
    let short: String = c.id.chars().take(12).collect();
    let key = AllocKey::container(&pod_uid, &short);
    Ok(Some(Request {
        key: key.clone(),
        cgroup,
        qos,
        pod: Pod {
            uid: key.to_string(),
            containers: vec![container],
            init_containers: Vec::new(),
        },
        totals,
        devices,
    }))
}

/// The memory limit `r` sets (0: none).
fn memory_limit(r: &api::LinuxResources) -> u64 {
    (r.memory.as_ref())
        .and_then(|m| m.limit.as_ref())
        .map_or(0, |l| l.value.max(0) as u64)
}

/// Resources as one container of QoS class `qos` (a Guaranteed one needs its CPU — a quota,
/// or with kubelet's `cpuCFSQuota: false` the shares — and a memory limit, as kubelet sets
/// them); None when they say nothing usable.
fn container_of(r: &api::LinuxResources, qos: Qos, name: &str) -> Option<Container> {
    let (limit, shares) = cpu_millis(r.cpu.as_ref());
    let mem = memory_limit(r);
    let cpu = guaranteed_millis(limit, shares);
    let c = match qos {
        Qos::Guaranteed if cpu > 0 && mem > 0 => Container {
            cpu_request_millis: cpu,
            cpu_limit_millis: cpu,
            memory_bytes: mem,
            memory_limit_bytes: mem,
            ..Default::default()
        },
        Qos::Burstable if shares > 0 => Container {
            cpu_request_millis: shares,
            ..Default::default()
        },
        _ => return None,
    };
    Some(Container {
        name: name.into(),
        ..c
    })
}

/// A container the plugin placed (or adopted).
#[derive(Clone, Debug)]
struct Tracked {
    key: AllocKey,
    cgroup: String,
    pod_id: String,
}

/// The [`CpusetWriter`] of NRI mode: admission's changes are collected and handed to the
/// runtime (the new container's as its CreateContainer adjustment, others' as container
/// updates). A change of a container that already runs is also written to cgroupfs at once,
/// booked before it is written (the books never run ahead of cgroupfs; the runtime
/// then applies the same values to its spec). What each container was last given is
/// remembered in the shared [`Runtime`]; readers see cgroupfs, and that only for a container
/// the runtime has not created yet.
pub struct NriWriter {
    changes: Mutex<Vec<CpusetChange>>,
    runtime: Arc<Runtime>,
    cgroups: Option<Cgroups>,
    /// The cgroupfs sink, for a container that already runs.
    sink: Option<CgroupCpusetWriter>,
}

impl NriWriter {
    pub fn new(cgroups: Option<Cgroups>, runtime: Arc<Runtime>) -> NriWriter {
        NriWriter {
            changes: Mutex::new(Vec::new()),
            runtime,
            sink: cgroups.clone().map(CgroupCpusetWriter::new),
            cgroups,
        }
    }

    fn take(&self) -> Vec<CpusetChange> {
        std::mem::take(&mut *self.changes.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl CpusetWriter for NriWriter {
    fn write(&self, io: &Io, change: &CpusetChange) -> Result<(), WriteError> {
        if self.runtime.id_of(&change.cgroup).is_some() {
            if let Some(w) = self.sink.as_ref() {
                w.write(io, change)?;
            }
        }
        self.runtime
            .note_given(&change.cgroup, &change.cpus, change.mems.as_ref());
        self.changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(change.clone());
        Ok(())
    }

    fn cpus(&self, cgroup: &str) -> Option<CpuSet> {
        (self.sink.as_ref().and_then(|w| w.cpus(cgroup)))
            .or_else(|| self.runtime.given(cgroup).and_then(|g| g.cpus))
    }

    fn memory_nodes(&self, cgroup: &str) -> Option<CpuSet> {
        self.sink.as_ref()?.memory_nodes(cgroup)
    }
}

/// Whether an UpdateContainer's resources carry a size: CPU shares or quota, or a memory
/// limit (zero counts as unset, as containerd fills the CRI request's unset fields).
fn asks_a_size(r: Option<&api::LinuxResources>) -> bool {
    let Some(r) = r else { return false };
    let cpu = r.cpu.as_ref().is_some_and(|c| {
        c.shares.as_ref().is_some_and(|v| v.value != 0)
            || c.quota.as_ref().is_some_and(|v| v.value != 0)
    });
    let memory = (r.memory.as_ref())
        .and_then(|m| m.limit.as_ref())
        .is_some_and(|v| v.value != 0);
    cpu || memory
}

/// The runtime's container id at the end of a container cgroup's path (cgroupfs
/// `…/<id>`, systemd `…/cri-containerd-<id>.scope`); None when it does not look like one.
fn container_id_of(cgroup: &str) -> Option<String> {
    let last = cgroup.rsplit('/').next()?;
    let last = last.strip_suffix(".scope").unwrap_or(last);
    let id = last.rsplit('-').next()?;
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
}

/// A container's Kubernetes names, for the per-cgroup series' labels.
fn names_of(pod: &api::PodSandbox, c: &api::Container) -> crate::serve::metrics::WorkloadNames {
    crate::serve::metrics::WorkloadNames {
        namespace: pod.namespace.clone(),
        pod: pod.name.clone(),
        pod_uid: pod.uid.clone(),
        container: c.name.clone(),
    }
}

/// Records what `pod`'s annotations ask (`daemon::annotations`), logging values we do not know;
/// `true` when it asks something.
fn note_annotations(
    asked: &mut BTreeMap<String, super::annotations::Ask>,
    pod: &api::PodSandbox,
) -> bool {
    let (ask, unknown) = super::annotations::parse(&pod.annotations);
    for u in unknown {
        tracing::warn!(pod = %pod.uid, annotation = %u, "pod annotation not understood; it asks nothing");
    }
    super::annotations::note(asked, &pod.uid, ask);
    !ask.is_empty()
}

/// A container of a pod kubelet's static managers placed, or not (`Policy::kubelets`).
enum Kubelets {
    /// Not a kubelet pod's: the plugin admits it.
    No,
    /// kubelet's: with kubelet CPUs (or in a dry run) left as kubelet made it (None); without
    /// them, its cpus fenced off the exclusive CPUs (`admission::fence_cpus`), its
    /// mems left to kubelet — the cpus to give, None when it is already off them.
    Theirs(Option<CpuSet>),
}

/// The plugin's policy over the admission service.
pub struct Policy {
    admission: Admission,
    writer: Arc<NriWriter>,
    /// Pod sandboxes by id.
    pods: BTreeMap<String, api::PodSandbox>,
    /// Placed containers by id (mirrored, by cgroup, in `runtime`).
    containers: BTreeMap<String, Tracked>,
    /// What the runtime's containers were given, and the unsolicited updates to send (the
    /// shared pool growing after a RemoveContainer; the other threads' changes).
    runtime: Arc<Runtime>,
    /// The `nri` health component (the plugin thread only): beaten while registered and while
    /// no runtime listens, so a plugin a listening runtime does not register for
    /// [`NRI_MAX_UNREGISTERED`] (refused, never answered), or a thread that died, shows in
    /// /healthz.
    health: Option<crate::health::Reporter>,
}

/// How long the plugin may go without being registered with a runtime that accepts its
/// connection before its health component counts as dead (a socket that is absent or refuses
/// connections — the runtime stopped — is waited for without counting).
pub const NRI_MAX_UNREGISTERED: std::time::Duration = std::time::Duration::from_secs(60);

impl Drop for Policy {
    /// A plugin thread that ends (a panic included) leaves no one registered: the connected
    /// flags say so, and updates are no longer queued for it.
    fn drop(&mut self) {
        if self.health.is_some() {
            let _stale = self.runtime.set_connected(false);
            self.d().metrics.nri_connected.set(0);
            self.d().in_drop(|s| s.nri_connected = false);
        }
    }
}

/// A CreateContainer answer's adjustment: the container's cpuset (and its mems, if given).
fn adjustment(cpus: &CpuSet, mems: Option<&CpuSet>) -> api::ContainerAdjustment {
    api::ContainerAdjustment {
        linux: Some(api::LinuxContainerAdjustment {
            resources: Some(super::nri_updates::cpu_resources(Some(cpus), mems)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The cpus and mems a container's spec holds, as the runtime reports them (empty: none set,
/// the container runs on its parent's).
fn spec_cpuset(c: &api::Container) -> (CpuSet, CpuSet) {
    let cpu = (c.linux.as_ref())
        .and_then(|l| l.resources.as_ref())
        .and_then(|r| r.cpu.as_ref());
    let parse = |v: Option<&String>| v.and_then(|v| CpuSet::parse(v).ok()).unwrap_or_default();
    (parse(cpu.map(|c| &c.cpus)), parse(cpu.map(|c| &c.mems)))
}

impl Policy {
    /// A policy over `d`; `cgroups` (when given) answers what a container's cpuset is before
    /// the plugin gave it one (after a restart); `runtime` is shared with the writers of the
    /// other threads (`daemon::nri_updates`).
    pub fn new(d: Daemon, cgroups: Option<Cgroups>, runtime: Arc<Runtime>) -> Policy {
        let writer = Arc::new(NriWriter::new(cgroups, runtime.clone()));
        Policy {
            admission: Admission::new(d, writer.clone()),
            writer,
            pods: BTreeMap::new(),
            containers: BTreeMap::new(),
            runtime,
            health: None,
        }
    }

    fn track(&mut self, id: &str, t: Tracked) {
        self.runtime.track(&t.cgroup, id);
        self.containers.insert(id.to_string(), t);
    }

    fn d(&self) -> &Daemon {
        &self.admission.daemon
    }

    /// [`request`] under the configured kubelet cgroup root.
    fn request(
        &self,
        io: &mut Io,
        pod: &api::PodSandbox,
        c: &api::Container,
    ) -> Result<Option<Request>, String> {
        let kube_root = self.d().lock(io).cfg.cgroups.kubernetes_root.clone();
        request(pod, c, kube_root.as_deref())
    }

    /// Whether `c` is a container of a pod kubelet's static managers placed
    /// (`daemon::kubelet`), and what becomes of it (see [`Kubelets`]).
    fn kubelets(&self, io: &mut Io, r: &Request, c: &api::Container) -> Kubelets {
        let uid = r.key.pod_uid();
        let left_to_runtime =
            (self.d().lock(io).state.annotated.get(uid)).is_some_and(|a| a.runtime);
        let (given, _) = spec_cpuset(c);
        // (kubelet's answer, the cpus to fence to, what it runs on once the answer applies)
        let (assigned, fenced, runs) = {
            let mut s = self.d().lock(io);
            // a pod left to the runtime by its annotation is treated as one of kubelet's
            // without kubelet CPUs: not admitted, only fenced (as containers never admitted)
            let assigned = if left_to_runtime {
                Some(false)
            } else {
                super::kubelet::cpu_assigned(&s, uid, Some(&c.name))
            };
            if assigned != Some(false) || s.cfg.daemon.dry_run {
                (assigned, None, None)
            } else {
                // fenced again as exclusive CPUs come (`admission::shared_changes`)
                if left_to_runtime {
                    s.refused.insert(r.cgroup.clone());
                } else {
                    s.fenced.insert(r.cgroup.clone(), uid.to_string());
                }
                // only CPUs online now (a spec's set from before a hotplug would make the
                // runtime's cpuset write fail); no set, or none online: every online CPU
                let online = s.topo.online_cpus();
                let current = Some(given.intersection(&online))
                    .filter(|g| !g.is_empty())
                    .unwrap_or(online);
                let (excl, pool) = super::admission::exclusive_and_pool(&s);
                let fenced = super::admission::fence_cpus(&current, &excl, &pool);
                let runs = fenced.clone().unwrap_or(current);
                (assigned, fenced, Some(runs))
            }
        };
        // its cgroup may not exist yet (the runtime makes it after this hook): what it will
        // run on is where the next fence starts from
        if let Some(cpus) = &runs {
            self.runtime.note_given(&r.cgroup, cpus, None);
        }
        match assigned {
            None => Kubelets::No,
            Some(true) => {
                tracing::info!(cgroup = %r.cgroup, pod = %uid, "container of a pod kubelet's static CPU / Memory Manager placed; left as kubelet made it");
                Kubelets::Theirs(None)
            }
            Some(false) => {
                tracing::info!(cgroup = %r.cgroup, pod = %uid, container = %c.name, fenced = ?fenced, left_to_runtime, "container not admitted (its pod annotated {}=runtime, or one kubelet's static managers placed without kubelet CPUs): mems left as they are, cpus kept off the exclusive CPUs", super::annotations::ADMISSION);
                Kubelets::Theirs(fenced)
            }
        }
    }

    /// The collected changes as runtime updates, except `own`'s (returned apart). A change
    /// for a cgroup the plugin did not place (none in NRI mode) is written to cgroupfs, so
    /// it is made exactly once. `hooked`: the updates ride a hook's answer (looked at again
    /// once it settled: `Runtime::settle_hooked`), else they go out unsolicited.
    fn drain(
        &self,
        own: Option<&str>,
        hooked: bool,
    ) -> (Option<CpusetChange>, Vec<api::ContainerUpdate>) {
        let mut mine = None;
        let mut out = Vec::new();
        let mut sent = Vec::new();
        for c in self.writer.take() {
            if Some(c.cgroup.as_str()) == own {
                mine = Some(c);
            } else if let Some(id) = self.runtime.id_of(&c.cgroup) {
                tracing::info!(container = %id, cgroup = %c.cgroup, cpus = %c.cpus, "container cpuset updated through the runtime");
                out.push(update(&id, Some(&c.cpus), c.mems.as_ref()));
                sent.push(c);
            } else if let Some(cg) = &self.writer.cgroups {
                if let Err(e) = cg.write_cpus(&c.cgroup, &c.cpus) {
                    tracing::warn!(cgroup = %c.cgroup, error = %e, "cpuset change of a container unknown to the runtime failed");
                }
            }
        }
        if hooked {
            self.runtime
                .note_hooked(sent.iter().map(|c| (c.cgroup.as_str(), &c.cpus)));
        }
        (mine, out)
    }

    /// The shared pool's growth after a release, as runtime updates: what the admission
    /// service queued through the writer for the release, plus any shared container still off
    /// its pool (one adopted after a restart) — one rule, `Admission::follow_pool`.
    fn regrow(&self, io: &mut Io, hooked: bool) -> Vec<api::ContainerUpdate> {
        let dry_run = self.dry_run(io);
        self.admission.follow_pool(io, dry_run);
        self.drain(None, hooked).1
    }

    /// [`Self::regrow`] outside any answer (after a RemoveContainer, an event): the updates
    /// are queued in `runtime` and sent once the connection is quiet.
    fn regrow_unsolicited(&self, io: &mut Io) {
        for u in self.regrow(io, false) {
            let Some(t) = self.containers.get(&u.container_id) else {
                continue;
            };
            // what the writer gave it is noted in `runtime` already: queued as it is
            if let Err(why) = self.runtime.submit(&t.cgroup, None, None) {
                tracing::warn!(cgroup = %t.cgroup, reason = ?why, "shared pool growth not sent to the runtime");
            }
        }
    }

    /// Writes `stale` cgroups' given cpusets to cgroupfs again (the runtime may have applied
    /// an older value over them: see `nri_updates`), with no lock held.
    fn rewrite(&self, io: &mut Io, stale: Vec<String>) {
        let Some(cgroups) = self.writer.cgroups.as_ref().filter(|_| !stale.is_empty()) else {
            return;
        };
        if self.dry_run(io) {
            tracing::info!(cgroups = ?stale, "dry run: cpusets not written again after a stale runtime update");
            return;
        }
        let sink = CgroupCpusetWriter::new(cgroups.clone());
        for cg in stale {
            let Some(g) = self.runtime.given(&cg) else {
                continue;
            };
            let r = match (g.cpus, g.mems) {
                (Some(cpus), mems) => {
                    let change = CpusetChange {
                        cgroup: cg.clone(),
                        cpus,
                        mems,
                    };
                    let rounds = &self.d().rounds;
                    super::writer::apply(io, &sink, rounds, &change).map_err(|e| e.to_string())
                }
                (None, Some(m)) => cgroups.write_mems(&cg, &m).map_err(|e| e.to_string()),
                (None, None) => Ok(()),
            };
            match r {
                Ok(()) => {
                    tracing::info!(cgroup = %cg, "cpuset written again after a stale runtime update")
                }
                Err(e) => {
                    tracing::warn!(cgroup = %cg, error = %e, "writing a cpuset again after a stale runtime update failed")
                }
            }
        }
    }

    fn dry_run(&self, io: &mut Io) -> bool {
        self.d().lock(io).cfg.daemon.dry_run
    }

    /// The queued runtime updates for a hook's answer; none in a dry run (one turned on by a
    /// reload holds back what was queued before it: a dry run changes nothing, the runtime's
    /// specs included).
    fn queued_for_hook(&self, io: &mut Io) -> Vec<api::ContainerUpdate> {
        if self.dry_run(io) {
            return Vec::new();
        }
        self.runtime.take_for_hook()
    }

    /// The hooked updates due now whose container was given newer cpus since:
    /// where cgroupfs holds the answer's old cpus, the runtime overwrote the newer write:
    /// written again and told again; where it holds the newer ones, looked at again later;
    /// anything else is someone else's write, left alone.
    fn settle_hooked(&self, io: &mut Io) {
        let Some(cgroups) = self.writer.cgroups.as_ref() else {
            return;
        };
        let mut stale = Vec::new();
        for h in self.runtime.settle_hooked(Instant::now()) {
            let live = cgroups.cpus(&h.cgroup).ok();
            let given = self.runtime.given(&h.cgroup).and_then(|g| g.cpus);
            if live.as_ref() == Some(&h.sent) {
                tracing::warn!(cgroup = %h.cgroup, cpus = %h.sent, "the runtime applied a hook's older cpuset over a newer write; written again");
                self.runtime.overwritten(&h.cgroup);
                stale.push(h.cgroup);
            } else if live.is_none() || live != given {
                self.runtime.settled(&h.cgroup);
            }
        }
        self.rewrite(io, stale);
    }

    /// A removed container the plugin did not place (kubelet's, fenced or left alone): what
    /// it was given and its fence are forgotten now, not at the next Synchronize.
    fn forget_unplaced(&self, io: &mut Io, c: &api::Container) {
        let path = c.linux.as_ref().map_or("", |l| l.cgroups_path.as_str());
        if path.is_empty() {
            return;
        }
        let cg = cgroup_rel(path);
        self.runtime.untrack(&cg);
        let mut s = self.d().lock(io);
        s.fenced.remove(&cg);
        s.refused.remove(&cg);
        s.fence_failures.remove(&cg);
    }

    /// Releases a placed container; `true` when it held an allocation.
    fn release(&mut self, io: &mut Io, id: &str, durability: Durability) -> bool {
        let Some(t) = self.containers.remove(id) else {
            return false;
        };
        if !t.key.is_container() {
            // one container of a pod under pod scope: its share goes back to the pod
            self.runtime.untrack(&t.cgroup);
            return self.admission.unbind(io, &t.cgroup, durability).is_some();
        }
        match self.admission.release(io, &t.key, durability) {
            Ok(()) => {
                self.runtime.untrack(&t.cgroup);
                if durability == Durability::Deferred {
                    self.admission.request_checkpoint(io);
                }
                tracing::info!(container = %id, cgroup = %t.cgroup, "container released");
                true
            }
            Err(e @ super::admission::ReleaseError::Checkpoint(_)) => {
                // Undone by the admission service: the container still holds its CPUs, so
                // it stays tracked and a later Stop/Remove (or Synchronize) releases it.
                tracing::warn!(container = %id, error = %e, "release failed; still tracked");
                self.containers.insert(id.to_string(), t);
                false
            }
            Err(e) => {
                self.runtime.untrack(&t.cgroup);
                tracing::warn!(container = %id, error = %e, "release failed");
                false
            }
        }
    }

    /// Synchronize: bound containers the runtime did not list but whose cgroups still hold
    /// processes still run on what they hold (containerd 1.7, restarted, reports a container
    /// it finds paused as unknown and leaves it out of the list): they keep their allocation,
    /// counted `live` and tracked again, until they go (RemoveContainer, or a later
    /// Synchronize that finds their cgroup empty or gone).
    fn keep_unlisted(&mut self, io: &mut Io, live: &mut Vec<String>) {
        let Some(cgroups) = self.writer.cgroups.clone() else {
            return;
        };
        let unlisted: Vec<(String, AllocKey)> = {
            let s = self.d().lock(io);
            (s.state.bindings.iter())
                .filter(|(cg, _)| !live.contains(cg))
                .map(|(cg, b)| (cg.clone(), b.pod_uid.clone()))
                .collect()
        };
        for (cg, key) in unlisted {
            // populated, not its own procs: a paused container's processes may all be in
            // cgroups nested below its own
            if !(cgroups.populated(crate::cgroup::Controller::Cpuset, &cg)).unwrap_or(false) {
                continue;
            }
            tracing::warn!(cgroup = %cg, "synchronize: a bound container the runtime did not list still has processes (paused, or in a state the runtime cannot tell); it keeps its allocation");
            live.push(cg.clone());
            if let Some(id) = container_id_of(&cg) {
                let uid = key.pod_uid();
                let pod_id = (self.pods.values())
                    .find(|p| p.uid == uid)
                    .map(|p| p.id.clone())
                    .unwrap_or_default();
                self.containers.insert(
                    id,
                    Tracked {
                        key,
                        cgroup: cg,
                        pod_id,
                    },
                );
            }
        }
    }

    /// Fails the `hook` (CreateContainer, UpdateContainer) with `why`; a dry run lets the
    /// container start or the update through as the runtime makes it instead (the empty
    /// answer), logging and counting the refusal it would have made.
    fn refuse<T: Default>(
        &self,
        io: &mut Io,
        hook: &str,
        id: &str,
        why: String,
    ) -> Result<T, String> {
        if self.dry_run(io) {
            tracing::warn!(container = %id, error = %why, "dry run: {hook} would be refused; left as the runtime makes it");
            self.d().metrics.dry_run_refusals.inc();
            return Ok(T::default());
        }
        tracing::warn!(container = %id, error = %why, "{hook} refused");
        Err(why)
    }

    /// An update of placed container `id` to the cpus it has now, when `r` names a cpuset
    /// (kubelet's CPU Manager writes its own pools that way) and this is no dry run.
    fn pin_current(
        &self,
        io: &mut Io,
        id: &str,
        cgroup: &str,
        r: Option<&api::LinuxResources>,
    ) -> Option<api::ContainerUpdate> {
        let names = (r.and_then(|r| r.cpu.as_ref())).is_some_and(|c| !c.cpus.is_empty());
        if !names || self.dry_run(io) {
            return None;
        }
        let cpus = self.writer.cpus(cgroup)?;
        Some(update(id, Some(&cpus), None))
    }

    /// Per node: its CPUs free for an exclusive allocation now (for refusal messages).
    fn free_by_node(&self, io: &mut Io) -> String {
        let s = self.d().lock(io);
        let pool = s
            .state
            .allocator
            .shared_pool(&crate::placement::cpu::CpuView::new(&s.topo));
        s.topo
            .nodes
            .iter()
            .map(|n| {
                format!(
                    "node {}: {} of {} CPUs free",
                    n.id,
                    n.cpus.intersection(&pool).len(),
                    n.cpus.len()
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The PCI devices behind `r`'s first [`MAX_RESOLVED_DEVICES`] device nodes, resolved below the configured sysfs root
    /// (`topology::devnode`; sysfs reads, so no lock is held), that the topology knows: the
    /// device provider's hints come from their PCI NUMA node. Each node's outcome is logged
    /// at debug; a PCI device the topology does not list (hot-plugged after the topology was
    /// read) is left out with a warning.
    fn attached_devices(&self, io: &mut Io, r: &Request) -> Vec<String> {
        if r.devices.is_empty() {
            return Vec::new();
        }
        let (root, known) = {
            let s = self.d().lock(io);
            let known: std::collections::BTreeSet<String> =
                s.topo.devices.iter().map(|d| d.address.clone()).collect();
            (s.cfg.daemon.sysfs_root.clone(), known)
        };
        if r.devices.len() > MAX_RESOLVED_DEVICES {
            tracing::warn!(cgroup = %r.cgroup, devices = r.devices.len(), resolved = MAX_RESOLVED_DEVICES, "container has more device nodes than are resolved for alignment; the rest are not aligned");
        }
        let mut out: Vec<String> = Vec::new();
        for dev in r.devices.iter().take(MAX_RESOLVED_DEVICES) {
            let (kind, major, minor, path) = (&dev.kind, dev.major, dev.minor, &dev.path);
            match devnode::resolve(&root, dev) {
                Resolution::Pci { address, node } if known.contains(&address) => {
                    tracing::debug!(cgroup = %r.cgroup, %path, %kind, major, minor, pci = %address, numa_node = ?node, "device node of a container aligned with its PCI device");
                    if !out.contains(&address) {
                        out.push(address);
                    }
                }
                Resolution::Pci { address, .. } => {
                    tracing::warn!(cgroup = %r.cgroup, %path, major, minor, pci = %address, "device node's PCI device is not in the topology read at start; not aligned");
                }
                Resolution::Unresolved(why) => {
                    tracing::debug!(cgroup = %r.cgroup, %path, %kind, major, minor, reason = why, "device node not aligned");
                }
            }
        }
        out
    }

    /// Admits one request (bound to its cgroup): (cpus, mems) and the other containers'
    /// updates, or the refusal message.
    fn admit(
        &mut self,
        io: &mut Io,
        r: &Request,
        id: &str,
        pod_id: &str,
        durability: Durability,
    ) -> Result<(CpuSet, CpuSet, Vec<api::ContainerUpdate>), String> {
        let attached = self.attached_devices(io, r);
        let with_devices;
        let r = if attached.is_empty() {
            r
        } else {
            let mut x = r.clone();
            x.pod.containers[0].attached_devices = attached;
            with_devices = x;
            &with_devices
        };
        self.writer.take();
        let pod_scope = self.d().lock(io).cfg.placement.scope == crate::config::TopologyScope::Pod;
        // Pod scope: one container of its pod, named uniquely (a restarted container keeps
        // its name), the pod's totals as the runtime sent them.
        let member = (r.key.container_part())
            .filter(|_| pod_scope)
            .map(|short| Container {
                name: format!("{}-{short}", r.pod.containers[0].name),
                ..r.pod.containers[0].clone()
            });
        let none = Container::default();
        let member = member.as_ref().map(|container| PodMember {
            pod_uid: r.key.pod_uid(),
            totals: r.totals.as_ref().unwrap_or(&none),
            container,
        });
        let since = Instant::now();
        let res = (self.admission).admit_bound(io, &r.pod, member, &r.cgroup, durability, since);
        match res {
            Ok(a) => {
                self.track(
                    id,
                    Tracked {
                        key: a.uid.as_str().into(),
                        cgroup: r.cgroup.clone(),
                        pod_id: pod_id.to_string(),
                    },
                );
                let p = &a.placements[0];
                let (_, updates) = self.drain(Some(&r.cgroup), true);
                Ok((p.cpus.clone(), p.mems.clone(), updates))
            }
            Err(e) => {
                self.writer.take();
                let c = &r.pod.containers[0];
                let mut ask = format!(
                    "asks {}m CPU, {} MiB memory",
                    c.cpu_request(),
                    c.memory_request() >> 20
                );
                if !c.attached_devices.is_empty() {
                    let s = self.d().lock(io);
                    let on = |a: &String| {
                        let node = s.topo.devices.iter().find(|d| &d.address == a);
                        match node.and_then(|d| d.node) {
                            Some(n) => format!("{a} on node {n}"),
                            None => format!("{a} on no known node"),
                        }
                    };
                    let devs: Vec<String> = c.attached_devices.iter().map(on).collect();
                    ask.push_str(&format!(", has devices {}", devs.join(", ")));
                }
                Err(match e {
                    AdmitError::Rejected { rejection, .. } => format!(
                        "rebalancer refused container {} of pod {} ({ask}): {}: {} [{}]",
                        c.name,
                        r.key.pod_uid(),
                        rejection.reason,
                        rejection.details,
                        self.free_by_node(io)
                    ),
                    other => format!("rebalancer: container {}: {other}", c.name),
                })
            }
        }
    }
}

impl Handler for Policy {
    fn configure(&mut self, req: api::ConfigureRequest) -> Result<api::ConfigureResponse, String> {
        let io = &mut Io::new();
        use crate::config::RuntimeUpdates as U;
        let mode = self.d().lock(io).cfg.kubernetes.nri_runtime_updates;
        let (safe, why) =
            super::nri_updates::runtime_updates_safe(&req.runtime_name, &req.runtime_version);
        let (on, why) = match mode {
            U::Auto => (safe, why),
            U::On => (
                true,
                format!("kubernetes.nri_runtime_updates = true ({why})"),
            ),
            U::Off => (false, "kubernetes.nri_runtime_updates = false".to_string()),
        };
        let (on, why) = if self.runtime.set_updates(on) || !on {
            (on, why)
        } else {
            (
                false,
                "the runtime left unsolicited updates unanswered past the deadline on earlier connections: off until the daemon restarts".to_string(),
            )
        };
        tracing::info!(runtime = %req.runtime_name, version = %req.runtime_version, unsolicited_updates = on, reason = %why, "NRI plugin configured by the runtime");
        self.d().lock(io).nri_runtime = super::status::NriRuntime {
            name: req.runtime_name.clone(),
            version: req.runtime_version.clone(),
            unsolicited_updates: on,
            reason: why,
        };
        Ok(api::ConfigureResponse {
            events: event_mask(EVENTS),
        })
    }

    fn synchronize(
        &mut self,
        mut req: api::SynchronizeRequest,
    ) -> Result<api::SynchronizeResponse, String> {
        let io = &mut Io::new();
        // moved, not cloned: the request is as large as the runtime's whole node
        let listed: Vec<String> = req.pods.iter().map(|p| p.uid.clone()).collect();
        let pods = std::mem::take(&mut req.pods);
        {
            // the runtime's pods are all there is: what gone pods asked goes with them
            let mut s = self.d().lock(io);
            s.state.annotated.clear();
            for p in &pods {
                note_annotations(&mut s.state.annotated, p);
            }
        }
        self.pods = pods.into_iter().map(|p| (p.id.clone(), p)).collect();
        self.containers.clear();
        let mut updates = Vec::new();
        let mut live = Vec::new();
        let mut adopt = Vec::new();
        // what the runtime says each container runs on (its spec's cpuset), by cgroup
        let mut reported = BTreeMap::new();
        self.d().metrics.forget_workloads();
        for c in &req.containers {
            // a paused container still holds what it was given
            let running = matches!(
                api::ContainerState::try_from(c.state),
                Ok(api::ContainerState::ContainerCreated
                    | api::ContainerState::ContainerRunning
                    | api::ContainerState::ContainerPaused)
            );
            let Some(pod) = self.pods.get(&c.pod_sandbox_id).cloned() else {
                tracing::warn!(container = %c.id, pod = %c.pod_sandbox_id, "synchronize: container of a pod the runtime did not list; ignored");
                continue;
            };
            let r = match self.request(io, &pod, c) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(container = %c.id, error = %e, "synchronize: container not adopted");
                    continue;
                }
            };
            if !running {
                continue;
            }
            self.d().metrics.name_workload(&r.cgroup, names_of(&pod, c));
            if let Kubelets::Theirs(fenced) = self.kubelets(io, &r, c) {
                updates.extend(fenced.map(|cpus| update(&c.id, Some(&cpus), None)));
                continue;
            }
            live.push(r.cgroup.clone());
            let bound = self.d().lock(io).state.bindings.get(&r.cgroup).cloned();
            match bound {
                // Placed before the restart: kept as it is, once.
                Some(b) => {
                    reported.insert(r.cgroup.clone(), spec_cpuset(c));
                    self.containers.insert(
                        c.id.clone(),
                        Tracked {
                            key: b.pod_uid,
                            cgroup: r.cgroup.clone(),
                            pod_id: pod.id.clone(),
                        },
                    );
                }
                None => adopt.push((r, c.id.clone(), pod.id.clone())),
            }
        }
        self.keep_unlisted(io, &mut live);
        self.runtime.retrack(
            self.containers
                .iter()
                .map(|(id, t)| (t.cgroup.clone(), id.clone()))
                .collect(),
        );
        // Bindings of Kubernetes containers the runtime no longer runs: released. Pod scope:
        // containers gone give their share back, pods gone release their hold.
        let (mut gone, mut gone_members) = (Vec::new(), Vec::new());
        {
            let s = self.d().lock(io);
            for (cg, b) in (s.state.bindings.iter()).filter(|(cg, _)| !live.contains(cg)) {
                if b.pod_uid.is_container() {
                    gone.push(b.pod_uid.to_string());
                } else if (s.state.allocator.pods.get(&b.pod_uid)).is_some_and(|p| p.hold.is_some())
                {
                    gone_members.push(cg.clone());
                }
            }
        }
        for cg in &gone_members {
            self.admission.unbind(io, cg, Durability::Deferred);
        }
        let mut pods_gone = 0;
        for uid in self.admission.held_pods(io) {
            if !listed.contains(&uid) && self.admission.pod_gone(io, &uid, Durability::Deferred) {
                pods_gone += 1;
            }
        }
        for key in &gone {
            if let Err(e) = self.admission.release(io, key, Durability::Deferred) {
                tracing::warn!(%key, error = %e, "synchronize: release failed");
            } else {
                tracing::info!(%key, "synchronize: container gone while disconnected; released");
            }
        }
        // these already run: adopted where they run (`Admission::adopting`), for this loop only
        let adopting = self.admission.adopting();
        let plain = std::mem::replace(&mut self.admission, adopting);
        for (r, id, pod_id) in adopt {
            match self.admit(io, &r, &id, &pod_id, Durability::Deferred) {
                Ok((cpus, mems, others)) => {
                    tracing::info!(container = %id, cgroup = %r.cgroup, %cpus, %mems, "running container adopted");
                    if !self.d().lock(io).cfg.daemon.dry_run {
                        updates.push(update(&id, Some(&cpus), Some(&mems)));
                    }
                    updates.extend(others);
                }
                Err(e) => {
                    tracing::warn!(container = %id, error = %e, "running container not adopted; left as it runs")
                }
            }
        }
        self.admission = plain;
        if !gone.is_empty() || !gone_members.is_empty() || pods_gone > 0 {
            updates.extend(self.regrow(io, true));
        }
        // Every bound container the runtime runs elsewhere than booked (an answer it gave up
        // waiting for started it unplaced; an update it never got): set back, through it.
        let repaired = self.admission.repair(io, |cg| {
            let (cpus, mems) = reported.get(cg)?;
            let mut seen = super::reconcile::Seen {
                cpus: vec![cpus.clone()],
                // no mems in its spec: it never got ours
                mems: mems.is_empty().then(CpuSet::new),
            };
            seen.cpus.extend(self.writer.cpus(cg));
            Some(seen)
        });
        if !repaired.is_empty() {
            updates.extend(self.drain(None, true).1);
        }
        self.admission.checkpoint_logged(io);
        tracing::info!(
            pods = listed.len(),
            containers = req.containers.len(),
            placed = self.containers.len(),
            released = gone.len(),
            repaired = repaired.len(),
            "synchronized with the runtime"
        );
        updates.extend(self.queued_for_hook(io));
        Ok(api::SynchronizeResponse { update: updates })
    }

    fn create_container(
        &mut self,
        req: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, String> {
        let io = &mut Io::new();
        let (Some(pod), Some(c)) = (req.pod.as_ref(), req.container.as_ref()) else {
            self.admission.record_invalid();
            return Err("rebalancer: CreateContainer without its pod or container".into());
        };
        if !self.pods.contains_key(&pod.id) {
            self.admission.record_invalid();
            return Err(format!(
                "rebalancer: container {} ({}) of pod sandbox {} that the runtime never announced",
                c.id, c.name, pod.id
            ));
        }
        let r = match self.request(io, pod, c) {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(Default::default()),
            Err(e) => {
                self.admission.record_invalid();
                return self.refuse(io, "CreateContainer", &c.id, format!("rebalancer: {e}"));
            }
        };
        self.d().metrics.name_workload(&r.cgroup, names_of(pod, c));
        // kubelet writes its state file at admission, before CreateContainer: a changed file
        // is read again first, and the shared containers it shrank ride this answer
        let refreshed = self.admission.refresh_kubelet(io);
        if let Kubelets::Theirs(fenced) = self.kubelets(io, &r, c) {
            let update = if refreshed {
                self.drain(None, true).1
            } else {
                Vec::new()
            };
            return Ok(api::CreateContainerResponse {
                adjust: fenced.map(|cpus| adjustment(&cpus, None)),
                update,
                ..Default::default()
            });
        }
        if self.containers.contains_key(&c.id) {
            self.admission.record_invalid();
            return self.refuse(
                io,
                "CreateContainer",
                &c.id,
                format!("rebalancer: container {} created twice", c.id),
            );
        }
        let (cpus, mems, updates) = match self.admit(io, &r, &c.id, &pod.id, Durability::Deferred) {
            Ok(a) => a,
            Err(e) => return self.refuse(io, "CreateContainer", &c.id, e),
        };
        // Checkpointed soon (coalesced), not before answering: if the daemon dies first, the
        // runtime's Synchronize on reconnect lists the container and it is adopted again.
        self.admission.request_checkpoint(io);
        tracing::info!(container = %c.id, name = %c.name, cgroup = %r.cgroup, %cpus, %mems, "container admitted at creation (NRI)");
        if self.d().lock(io).cfg.daemon.dry_run {
            return Ok(Default::default());
        }
        Ok(api::CreateContainerResponse {
            adjust: Some(adjustment(&cpus, Some(&mems))),
            update: updates
                .into_iter()
                .chain(self.queued_for_hook(io))
                .collect(),
            evict: vec![],
        })
    }

    /// An in-place resize (CRI `UpdateContainerResources`): the placed container's new
    /// requests go through the admission service (`Admission::resize`); its new cpuset rides
    /// the answer as an update of the container itself, which the runtime merges into the
    /// resources it applies, and the shared containers that change ride it too. A resize the
    /// books cannot take fails the update with the reason (a dry run logs and counts it).
    fn update_container(
        &mut self,
        req: api::UpdateContainerRequest,
    ) -> Result<api::UpdateContainerResponse, String> {
        let io = &mut Io::new();
        let (Some(pod), Some(c)) = (req.pod.as_ref(), req.container.as_ref()) else {
            self.admission.record_invalid();
            return Err("rebalancer: UpdateContainer without its pod or container".into());
        };
        let Some(t) = self.containers.get(&c.id).cloned() else {
            // not placed by the plugin (not Kubernetes', kubelet's, or never admitted)
            return Ok(api::UpdateContainerResponse {
                update: self.queued_for_hook(io),
                ..Default::default()
            });
        };
        // An update that names no CPU shares or quota and no memory limit (kubelet's CPU
        // Manager sends its cpuset alone; containerd passes the CRI request's fields, zero
        // where unset) asks for no size: not a resize, whatever QoS its zeros would read as.
        // Either way, a cpuset it names is answered with the one the container has: the
        // runtime would apply the asked one over the books otherwise.
        let pin = self.pin_current(io, &c.id, &t.cgroup, req.linux_resources.as_ref());
        if !asks_a_size(req.linux_resources.as_ref()) {
            let mut update = self.queued_for_hook(io);
            update.extend(pin);
            return Ok(api::UpdateContainerResponse {
                update,
                ..Default::default()
            });
        }
        // the container as it will be: its spec with the resources asked for now
        let mut next = c.clone();
        if let (Some(l), Some(r)) = (next.linux.as_mut(), req.linux_resources.clone()) {
            l.resources = Some(r);
        }
        let asked = match self.request(io, pod, &next) {
            Ok(Some(r)) => r.pod.containers[0].clone(),
            Ok(None) => return Ok(Default::default()),
            Err(e) => return self.refuse(io, "UpdateContainer", &c.id, format!("rebalancer: {e}")),
        };
        self.writer.take();
        match self
            .admission
            .resize(io, &t.cgroup, &asked, Durability::Deferred)
        {
            Ok(placed) => {
                let (mine, mut updates) = self.drain(Some(&t.cgroup), true);
                if let Some(p) = &placed {
                    tracing::info!(container = %c.id, cgroup = %t.cgroup, cpus = %p.cpus, mems = %p.mems, exclusive = p.exclusive, "container resized");
                }
                updates.extend(self.queued_for_hook(io));
                // last: the runtime takes its resized container's resources from its update
                match mine {
                    Some(m) => updates.push(update(&c.id, Some(&m.cpus), m.mems.as_ref())),
                    None => updates.extend(pin),
                }
                Ok(api::UpdateContainerResponse {
                    update: updates,
                    ..Default::default()
                })
            }
            Err(e) => {
                self.writer.take();
                let why = format!(
                    "rebalancer refused the resize of container {} ({}) to {}m CPU, {} MiB memory: {e} [{}]",
                    c.id,
                    c.name,
                    asked.cpu_request(),
                    asked.memory_request() >> 20,
                    self.free_by_node(io)
                );
                self.refuse(io, "UpdateContainer", &c.id, why)
            }
        }
    }

    fn stop_container(
        &mut self,
        req: api::StopContainerRequest,
    ) -> Result<api::StopContainerResponse, String> {
        let io = &mut Io::new();
        let Some(c) = req.container.as_ref() else {
            return Err("rebalancer: StopContainer without its container".into());
        };
        let mut update = if self.release(io, &c.id, Durability::Deferred) {
            self.regrow(io, true)
        } else {
            Vec::new()
        };
        update.extend(self.queued_for_hook(io));
        Ok(api::StopContainerResponse { update })
    }

    fn state_change(&mut self, ev: api::StateChangeEvent) -> Result<(), String> {
        let io = &mut Io::new();
        let event = api::Event::try_from(ev.event)
            .map_err(|_| format!("rebalancer: unknown NRI event {}", ev.event))?;
        match event {
            api::Event::RunPodSandbox => {
                let pod = ev.pod.ok_or("rebalancer: RunPodSandbox without its pod")?;
                let asks = note_annotations(&mut self.d().lock(io).state.annotated, &pod);
                if asks {
                    self.admission.request_checkpoint(io);
                }
                self.pods.insert(pod.id.clone(), pod);
            }
            api::Event::RemoveContainer => {
                let c = ev
                    .container
                    .ok_or("rebalancer: RemoveContainer without its container")?;
                let path = c.linux.as_ref().map_or("", |l| l.cgroups_path.as_str());
                self.d()
                    .metrics
                    .forget_workload(Some(&cgroup_rel(path)), None);
                if self.release(io, &c.id, Durability::Deferred) {
                    self.regrow_unsolicited(io);
                } else {
                    self.forget_unplaced(io, &c);
                }
            }
            // A stopped sandbox (a completed pod keeps it until the pod object goes) frees
            // what it held, as kubelet frees a terminated pod's CPUs and memory.
            api::Event::StopPodSandbox | api::Event::RemovePodSandbox => {
                let pod = ev
                    .pod
                    .ok_or("rebalancer: a pod sandbox event without its pod")?;
                if event == api::Event::RemovePodSandbox {
                    self.pods.remove(&pod.id);
                    self.d().metrics.forget_workload(None, Some(&pod.uid));
                    let asked = self.d().lock(io).state.annotated.remove(&pod.uid);
                    if asked.is_some() {
                        self.admission.request_checkpoint(io);
                    }
                }
                // kubelet's containers of the pod that were fenced: gone with it
                {
                    let mut s = self.d().lock(io);
                    let sh = &mut *s;
                    for (cg, _) in sh.fenced.iter().filter(|(_, uid)| **uid == pod.uid) {
                        self.runtime.untrack(cg);
                    }
                    sh.fenced.retain(|_, uid| *uid != pod.uid);
                    (sh.fence_failures).retain(|cg, _| sh.fenced.contains_key(cg));
                }
                let ids: Vec<String> = self
                    .containers
                    .iter()
                    .filter(|(_, t)| t.pod_id == pod.id)
                    .map(|(id, _)| id.clone())
                    .collect();
                let mut any = false;
                for id in ids {
                    any |= self.release(io, &id, Durability::Deferred);
                }
                // pod scope: the pod's hold goes with its sandbox
                any |= self.admission.pod_gone(io, &pod.uid, Durability::Deferred);
                if any {
                    self.regrow_unsolicited(io);
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn pending_updates(&mut self) -> Vec<api::ContainerUpdate> {
        let io = &mut Io::new();
        if self.dry_run(io) {
            return Vec::new();
        }
        // hook answers the runtime has had time to apply: newer writes put back
        self.settle_hooked(io);
        self.runtime.take_batch()
    }

    fn updates_answered(&mut self, result: Result<Vec<String>, String>) {
        let io = &mut Io::new();
        self.rewrite(io, self.runtime.answered(result));
    }

    fn updates_timed_out(&mut self) {
        let io = &mut Io::new();
        self.rewrite(io, self.runtime.timed_out());
    }

    fn alive(&mut self) {
        if let Some(h) = &self.health {
            h.beat();
        }
    }

    fn runtime_absent(&mut self) {
        // The runtime is stopped or restarting: nothing to admit through, nothing stuck. Only a
        // runtime that accepts the connection and never registers the plugin counts as silence.
        self.alive();
    }

    fn connection(&mut self, up: bool) {
        let io = &mut Io::new();
        if up {
            self.alive();
        }
        let stale = self.runtime.set_connected(up);
        self.rewrite(io, stale);
        self.d().metrics.nri_connected.set(i64::from(up));
        self.d().lock(io).nri_connected = up;
        if up {
            tracing::info!("NRI plugin registered with the runtime");
        } else {
            tracing::warn!("NRI connection lost");
        }
    }
}

/// The admission mode in force: `auto` resolved by whether the NRI socket exists.
pub fn resolve_mode(cfg: &crate::config::KubernetesConfig) -> crate::config::AdmissionMode {
    use crate::config::AdmissionMode as M;
    match cfg.admission {
        M::Auto if crate::nri::session::socket_exists(&cfg.nri_socket) => M::Nri,
        M::Auto => M::Watcher,
        m => m,
    }
}

/// Starts the plugin thread: connects to the runtime and reconnects for as long as the daemon
/// runs.
pub fn spawn(
    io: &mut Io,
    d: Daemon,
    cgroups: Cgroups,
    runtime: Arc<Runtime>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let k = d.lock(io).cfg.kubernetes.clone();
    let opts = crate::nri::session::Options {
        socket: k.nri_socket,
        name: "rebalancer".into(),
        index: k.nri_plugin_index,
        update_deadline: crate::nri::session::UPDATE_DEADLINE,
    };
    std::thread::Builder::new()
        .name("nri".into())
        .spawn(move || {
            let health = d.metrics.health.register("nri", Some(NRI_MAX_UNREGISTERED));
            let mut p = Policy::new(d, Some(cgroups), runtime);
            p.health = Some(health);
            crate::nri::session::run(&opts, &mut p, &stop);
            // Returns only when the daemon stops.
            if let Some(h) = p.health.take() {
                h.stopped();
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nri::envelope;
    use crate::nri::session::{
        dispatch, CODE_INVALID_ARGUMENT, CODE_UNIMPLEMENTED, PLUGIN_SERVICE,
    };
    use crate::{config::Config, daemon::Shared, serve::Metrics, topology::TopologyBuilder};
    use prost::Message as _;

    const UID: &str = "8d5c3f2e-1b4a-4c6d-9e8f-7a6b5c4d3e2f";

    /// A daemon on 2 nodes x 2 CPUs with its state in `dir`.
    fn policy(dir: &std::path::Path) -> Policy {
        let topo = TopologyBuilder {
            cores_per_node: 2,
            threads_per_core: 1,
            ..Default::default()
        }
        .build();
        let mut cfg = Config::default();
        cfg.daemon.state_dir = dir.join("state");
        // kubelet's files (none unless a test writes them) from the test's dir, not the host's
        cfg.kubernetes.kubelet_state_dir = dir.to_path_buf();
        let d = Daemon::new(Shared::fresh(topo, cfg).unwrap(), Metrics::default());
        let rt = Arc::new(Runtime::new(d.metrics.clone()));
        Policy::new(d, None, rt)
    }

    fn pod(id: &str, qos: &str) -> api::PodSandbox {
        api::PodSandbox {
            id: id.into(),
            name: format!("pod-{id}"),
            uid: UID.into(),
            linux: Some(api::LinuxPodSandbox {
                cgroup_parent: format!("/kubepods/{qos}pod{UID}"),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ctr(id: &str, pod: &api::PodSandbox, quota: i64, shares: u64, mem: i64) -> api::Container {
        let parent = &pod.linux.as_ref().unwrap().cgroup_parent;
        let opt_i = |v: i64| (v != 0).then_some(api::OptionalInt64 { value: v });
        api::Container {
            id: id.repeat(64 / id.len()),
            pod_sandbox_id: pod.id.clone(),
            name: format!("c{id}"),
            linux: Some(api::LinuxContainer {
                cgroups_path: format!("{parent}/{}", id.repeat(64 / id.len())),
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
        }
    }

    fn run_pod(p: &mut Policy, pod: &api::PodSandbox) {
        p.state_change(api::StateChangeEvent {
            event: api::Event::RunPodSandbox as i32,
            pod: Some(pod.clone()),
            container: None,
        })
        .unwrap();
    }

    fn create(
        p: &mut Policy,
        pod: &api::PodSandbox,
        c: &api::Container,
    ) -> Result<api::CreateContainerResponse, String> {
        p.create_container(api::CreateContainerRequest {
            pod: Some(pod.clone()),
            container: Some(c.clone()),
        })
    }

    fn adjusted_cpus(r: &api::CreateContainerResponse) -> CpuSet {
        let cpu = r.adjust.as_ref().unwrap().linux.as_ref().unwrap();
        let cpu = cpu.resources.as_ref().unwrap().cpu.as_ref().unwrap();
        CpuSet::parse(&cpu.cpus).unwrap()
    }

    /// The plugin thread is a health component: alive while registered; a thread that ends
    /// without being stopped (a panic in the policy) shows dead in /healthz and leaves the
    /// connected flags down, so no update is queued for a plugin that is gone.
    #[test]
    fn the_plugin_thread_is_a_health_component() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        let d = p.d().clone();
        p.health = Some(d.metrics.health.register("nri", Some(NRI_MAX_UNREGISTERED)));
        p.connection(true);
        p.alive();
        assert!(d.lock(&mut Io::new()).nri_connected);
        assert_eq!(d.metrics.nri_connected.get(), 1);
        assert!(d.metrics.health.dead().is_empty());
        drop(p);
        assert!(!d.lock(&mut Io::new()).nri_connected);
        assert_eq!(d.metrics.nri_connected.get(), 0);
        let dead = d.metrics.health.dead();
        assert_eq!(dead.len(), 1, "{dead:?}");
        assert_eq!(dead[0].component, "nri");
    }

    /// Under a kubelet `--cgroup-root` (`cgroups.kubernetes_root`), the runtime's containers
    /// are admitted, in the systemd form too; a kubepods-looking path elsewhere is not.
    #[test]
    fn a_configured_kubelet_root_is_where_nri_admits() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        // cgroupfs driver, kubelet --cgroup-root=/kubelet
        let root = "/kubelet/kubepods";
        p.d().lock(&mut Io::new()).cfg.cgroups.kubernetes_root = Some(root.into());
        let mut gp = pod("g", "");
        gp.linux.as_mut().unwrap().cgroup_parent = format!("{root}/pod{UID}");
        run_pod(&mut p, &gp);
        let c = ctr("a", &gp, 100_000, 1024, 1 << 20);
        assert!(request(&gp, &c, Some(root)).unwrap().is_some());
        assert!(request(&gp, &c, None).unwrap().is_none());
        let cpus = adjusted_cpus(&create(&mut p, &gp, &c).unwrap());
        assert_eq!(cpus.len(), 1, "{cpus}");
        // the default root: the same container is not Kubernetes', left as it is
        let mut q = policy(dir.path());
        run_pod(&mut q, &gp);
        let r = create(&mut q, &gp, &c).unwrap();
        assert!(r.adjust.is_none() && r.update.is_empty(), "{r:?}");
        // systemd driver: kubelet-kubepods-pod<uid>.slice:cri-containerd:<id>
        let root = "/kubelet.slice/kubelet-kubepods.slice";
        let mut sc = ctr("b", &gp, 100_000, 1024, 1 << 20);
        sc.linux.as_mut().unwrap().cgroups_path = format!(
            "kubelet-kubepods-pod{}.slice:cri-containerd:{}",
            UID.replace('-', "_"),
            "b".repeat(64)
        );
        let r = request(&gp, &sc, Some(root)).unwrap().unwrap();
        assert!(
            r.cgroup
                .starts_with("kubelet.slice/kubelet-kubepods.slice/"),
            "{}",
            r.cgroup
        );
        assert!(request(&gp, &sc, None).unwrap().is_none());
    }

    /// A pod annotated to be left to the runtime is neither admitted nor moved, yet fenced off
    /// the exclusive CPUs handed out after it; one annotated never to move is admitted as usual
    /// and pinned for the planner; its twin without the annotation is not.
    #[test]
    fn annotated_pods_get_less_and_take_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        let with_uid = |id: &str, qos: &str, uid: &str, ann: &[(&str, &str)]| {
            let mut pd = pod(id, qos);
            pd.uid = uid.into();
            pd.linux.as_mut().unwrap().cgroup_parent = format!("/kubepods/{qos}pod{uid}");
            pd.annotations = ann
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            pd
        };
        use crate::daemon::annotations::{ADMISSION, REBALANCE};
        let lp = with_uid(
            "l",
            "burstable/",
            "0000000l-0000-0000-0000-000000000000",
            &[(ADMISSION, "runtime")],
        );
        let kp = with_uid(
            "k",
            "burstable/",
            "0000000k-0000-0000-0000-000000000000",
            &[(REBALANCE, "never")],
        );
        let tp = with_uid(
            "t",
            "burstable/",
            "0000000t-0000-0000-0000-000000000000",
            &[(REBALANCE, "sometimes")],
        );
        let gp = with_uid("g", "", "0000000g-0000-0000-0000-000000000000", &[]);
        for pd in [&lp, &kp, &tp, &gp] {
            run_pod(&mut p, pd);
        }
        let left = ctr("a", &lp, 0, 512, 0);
        assert!(create(&mut p, &lp, &left).unwrap().adjust.is_none());
        let kept = ctr("b", &kp, 0, 512, 0);
        assert!(!adjusted_cpus(&create(&mut p, &kp, &kept).unwrap()).is_empty());
        let twin = ctr("c", &tp, 0, 512, 0);
        assert!(!adjusted_cpus(&create(&mut p, &tp, &twin).unwrap()).is_empty());
        let cg = |c: &api::Container| cgroup_rel(&c.linux.as_ref().unwrap().cgroups_path);
        {
            let mut io = Io::new();
            let s = p.d().lock(&mut io);
            assert!(
                !s.state.bindings.contains_key(&cg(&left)),
                "left to the runtime: not admitted"
            );
            assert!(s.state.bindings.contains_key(&cg(&kept)));
            let pinned = |c| s.bound_constraints(&cg(c)).is_some_and(|c| c.pinned);
            assert!(pinned(&left) && pinned(&kept));
            assert!(!pinned(&twin), "an unknown value asks nothing");
        }
        // Control rounds: each container runs where it was placed and has its memory on the
        // other node. The planner moves the twin there and never the pinned one.
        let moved = {
            use crate::controller::{self, CgroupObs, NodeObs, Observations};
            let mut io = Io::new();
            let s = p.d().lock(&mut io);
            let mut obs = Observations {
                period_ns: 2_000_000_000,
                nodes: (s.topo.nodes.iter())
                    .map(|n| {
                        (
                            n.id,
                            NodeObs {
                                cpu_busy: 0.2,
                                free_bytes: 8 << 30,
                                ..Default::default()
                            },
                        )
                    })
                    .collect(),
                ..Default::default()
            };
            for c in [&kept, &twin] {
                let cg = cg(c);
                let b = &s.state.bindings[&cg];
                let cpus = s
                    .state
                    .allocator
                    .current_cpus(&b.pod_uid, &b.container)
                    .unwrap();
                let here = s.topo.node_of_cpu(cpus.iter().next().unwrap()).unwrap();
                let there = 1 - here;
                obs.cgroups.push(CgroupObs {
                    id: cg.clone(),
                    cpu_ns_per_node: [(here, 1_000_000_000)].into(),
                    mem_bytes_per_node: [(there, 256 << 20)].into(),
                    mems: [here].into_iter().collect(),
                    cpus,
                    constraints: s.bound_constraints(&cg).unwrap(),
                    ..Default::default()
                });
            }
            let ctl = s.cfg.controller.clone();
            let mut state = s.state.controller.clone();
            let mut moved = std::collections::BTreeSet::new();
            for round in 0..20u64 {
                state.observe(&obs, crate::controller::EWMA_ALPHA);
                let plan = controller::plan(&s.topo, &obs, &state, &ctl, 1_000_000 + round * 2_000);
                moved.extend(plan.moves.into_iter().map(|m| m.cgroup));
            }
            moved
        };
        assert!(moved.contains(&cg(&twin)), "the twin is moved: {moved:?}");
        assert!(
            !moved.contains(&cg(&kept)),
            "the annotated pod is never moved: {moved:?}"
        );
        // the per-cgroup series carry the names NRI gave
        let d = p.d().clone();
        d.metrics.set_cgroup_scores(&[(cg(&kept), 0.5, 0.5)], None);
        let want = format!(
            "cgroup=\"{}\",namespace=\"\",pod=\"pod-k\",pod_uid=\"{}\",container=\"cb\"",
            cg(&kept),
            kp.uid
        );
        assert!(d.metrics.render().contains(&want), "{want}");
        // exclusive CPUs for a Guaranteed pod: the left-alone container is fenced off them
        let rg = create(&mut p, &gp, &ctr("d", &gp, 200_000, 2048, 1 << 30)).unwrap();
        let excl = adjusted_cpus(&rg);
        // (a container the plugin did not place is written where it lives, as kubelet's are)
        let given = p.runtime.given(&cg(&left)).unwrap();
        let fenced = given.cpus.unwrap();
        assert!(
            !fenced.is_empty() && fenced.is_disjoint(&excl),
            "{fenced} vs {excl}"
        );
        assert!(given.mems.is_none(), "its mems stay the runtime's");
        // gone with its pod: the checkpointed ask too
        p.state_change(api::StateChangeEvent {
            event: api::Event::RemovePodSandbox as i32,
            pod: Some(kp.clone()),
            container: None,
        })
        .unwrap();
        let mut io = Io::new();
        let s = p.d().lock(&mut io);
        assert!(!s.state.annotated.contains_key(&kp.uid));
        assert!(s.state.annotated.contains_key(&lp.uid));
    }

    #[test]
    fn guaranteed_gets_exclusive_cpus_and_the_shared_container_an_update() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        let bp = pod("b", "burstable/");
        let gp = pod("g", "");
        run_pod(&mut p, &bp);
        run_pod(&mut p, &gp);
        let b = ctr("b", &bp, 0, 512, 0);
        let rb = create(&mut p, &bp, &b).unwrap();
        // numa-aware shared pools: one node's CPUs.
        assert_eq!(adjusted_cpus(&rb).len(), 2);
        // 3 exclusive CPUs cannot avoid the burstable container's node.
        let g = ctr("a", &gp, 300_000, 3072, 1 << 30);
        let rg = create(&mut p, &gp, &g).unwrap();
        let gc = adjusted_cpus(&rg);
        assert_eq!(gc.len(), 3);
        assert_eq!(rg.update.len(), 1, "{:?}", rg.update);
        assert_eq!(rg.update[0].container_id, b.id);
        let upd = rg.update[0]
            .linux
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap();
        let bc = CpuSet::parse(&upd.cpu.as_ref().unwrap().cpus).unwrap();
        assert!(bc.is_disjoint(&gc) && !bc.is_empty(), "{bc} vs {gc}");
        // Stop releases and gives the CPUs back to the shared container.
        let stop = p
            .stop_container(api::StopContainerRequest {
                pod: Some(gp.clone()),
                container: Some(g.clone()),
            })
            .unwrap();
        assert_eq!(stop.update.len(), 1);
        assert!(p
            .d()
            .lock(&mut Io::new())
            .state
            .allocator
            .exclusive_cpus()
            .is_empty());
    }

    /// A dry run turned on by a reload sends nothing to the runtime, not even
    /// what was queued before it, which it holds back (the same steps without the dry run
    /// send the update).
    #[test]
    fn a_dry_run_turned_on_holds_back_the_queued_runtime_updates() {
        for dry in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let mut p = policy(dir.path());
            p.runtime.set_connected(true);
            p.runtime.set_updates(true);
            let bp = pod("b", "burstable/");
            let gp = pod("g", "");
            run_pod(&mut p, &bp);
            run_pod(&mut p, &gp);
            create(&mut p, &bp, &ctr("b", &bp, 0, 512, 0)).unwrap();
            let g = ctr("a", &gp, 300_000, 3072, 1 << 30);
            create(&mut p, &gp, &g).unwrap();
            // the release grows the shared pool again: an unsolicited update, queued
            p.state_change(api::StateChangeEvent {
                event: api::Event::RemoveContainer as i32,
                pod: Some(gp.clone()),
                container: Some(g.clone()),
            })
            .unwrap();
            p.d().lock(&mut Io::new()).cfg.daemon.dry_run = dry;
            let sent = p.pending_updates();
            if dry {
                assert!(sent.is_empty(), "dry run sent {sent:?}");
                // nor in a later hook's answer
                let stop = p
                    .stop_container(api::StopContainerRequest {
                        pod: Some(gp.clone()),
                        container: Some(g.clone()),
                    })
                    .unwrap();
                assert!(stop.update.is_empty(), "{:?}", stop.update);
            } else {
                assert_eq!(sent.len(), 1, "the control run queues the growth: {sent:?}");
            }
        }
    }

    /// Kubelet's static CPU Manager assigns a CPU after the daemon started
    /// (its state file is written at admission, before CreateContainer). At that
    /// CreateContainer the changed file is read again: the container is kubelet's (no
    /// adjustment, nothing booked for it), and the shared container on that CPU leaves it in
    /// the same answer.
    #[test]
    fn a_kubelet_assignment_made_after_start_is_adopted_at_its_create_container() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        let bp = pod("b", "burstable/");
        run_pod(&mut p, &bp);
        let b = ctr("b", &bp, 0, 512, 0);
        let pool = adjusted_cpus(&create(&mut p, &bp, &b).unwrap());
        let k = pool.iter().next().unwrap();
        let kube_uid = "5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9";
        let mut c = crate::kubelet_files::CpuCheckpoint {
            policy_name: "static".into(),
            default_cpu_set: String::new(),
            entries: Some(
                [(
                    kube_uid.to_string(),
                    [("app".to_string(), k.to_string())].into(),
                )]
                .into(),
            ),
            checksum: 0,
        };
        c.checksum = crate::kubelet_files::fnv1a32(&crate::kubelet_files::spew_cpu(&c)).into();
        std::fs::write(
            dir.path().join("cpu_manager_state"),
            format!(
                r#"{{"policyName":"static","defaultCpuSet":"","entries":{{"{kube_uid}":{{"app":"{k}"}}}},"checksum":{}}}"#,
                c.checksum
            ),
        )
        .unwrap();
        let mut kp = pod("k", "");
        kp.uid = kube_uid.into();
        kp.linux.as_mut().unwrap().cgroup_parent = format!("/kubepods/pod{kube_uid}");
        run_pod(&mut p, &kp);
        let mut kc = ctr("f", &kp, 100_000, 1024, 1 << 20);
        kc.name = "app".into();
        let r = create(&mut p, &kp, &kc).unwrap();
        assert!(r.adjust.is_none(), "{r:?}");
        assert!(super::super::kubelet::owns_pod(
            &p.d().lock(&mut Io::new()),
            kube_uid
        ));
        assert_eq!(r.update.len(), 1, "{:?}", r.update);
        assert_eq!(r.update[0].container_id, b.id);
        let upd = r.update[0]
            .linux
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap();
        let bc = CpuSet::parse(&upd.cpu.as_ref().unwrap().cpus).unwrap();
        assert!(
            !bc.contains(k) && !bc.is_empty(),
            "{bc} still has kubelet's CPU {k}"
        );
    }

    /// kubelet with `cpuCFSQuota: false`: a Guaranteed container comes without a quota, its
    /// request in the shares (milli * 1024 / 1000). 2048 shares ask for 2 CPUs, given
    /// exclusively; without shares or memory limit it is refused with the reason.
    #[test]
    fn a_guaranteed_container_without_a_quota_gets_its_shares_as_exclusive_cpus() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        let gp = pod("g", "");
        run_pod(&mut p, &gp);
        let c = ctr("a", &gp, 0, 2048, 1 << 30);
        let r = request(&gp, &c, None).unwrap().unwrap();
        assert_eq!(r.pod.containers[0].cpu_request_millis, 2000);
        assert_eq!(r.pod.containers[0].cpu_limit_millis, 2000);
        let cpus = adjusted_cpus(&create(&mut p, &gp, &c).unwrap());
        assert_eq!(cpus.len(), 2, "{cpus}");
        assert_eq!(
            p.d().lock(&mut Io::new()).state.allocator.exclusive_cpus(),
            cpus
        );
        // a quota, when there is one, is the request
        let q = request(&gp, &ctr("b", &gp, 100_000, 2048, 1 << 30), None)
            .unwrap()
            .unwrap();
        assert_eq!(q.pod.containers[0].cpu_request_millis, 1000);
        let e = request(&gp, &ctr("c", &gp, 0, 0, 1 << 30), None).unwrap_err();
        assert!(e.contains("no CPU quota or shares"), "{e}");
        // pod-level totals the same way
        let totals = api::LinuxResources {
            cpu: Some(api::LinuxCpu {
                shares: Some(api::OptionalUInt64 { value: 4096 }),
                ..Default::default()
            }),
            memory: Some(api::LinuxMemory {
                limit: Some(api::OptionalInt64 { value: 1 << 30 }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let t = container_of(&totals, Qos::Guaranteed, "pod").unwrap();
        assert_eq!((t.cpu_request_millis, t.cpu_limit_millis), (4000, 4000));
    }

    /// An UpdateContainer of a placed Guaranteed container: its resources as CRI
    /// `UpdateContainerResources` gives them.
    fn resize(
        p: &mut Policy,
        pod: &api::PodSandbox,
        c: &api::Container,
        quota: i64,
    ) -> Result<api::UpdateContainerResponse, String> {
        let next = ctr(
            &c.id[..1],
            pod,
            quota,
            (quota as u64) * 1024 / 100_000,
            1 << 30,
        );
        p.update_container(api::UpdateContainerRequest {
            pod: Some(pod.clone()),
            container: Some(c.clone()),
            linux_resources: next.linux.unwrap().resources,
        })
    }

    fn updated_cpus(r: &api::UpdateContainerResponse, id: &str) -> Option<CpuSet> {
        let u = r.update.iter().rev().find(|u| u.container_id == id)?;
        let cpu = u.linux.as_ref()?.resources.as_ref()?.cpu.as_ref()?;
        Some(CpuSet::parse(&cpu.cpus).unwrap())
    }

    /// Resize through NRI (2 nodes x 2 CPUs): a Guaranteed container grown from 1 to 2 CPUs
    /// keeps its CPU and takes the other of its node, the shared container moved off them in
    /// the same answer and the resized container's own update last (the runtime applies
    /// that one to it); a grow past its node fails the update with the reason and changes
    /// nothing; a shrink gives a CPU back to the shared container. The books agree each time.
    #[test]
    fn a_resize_grows_within_the_node_refuses_past_it_and_shrinks_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        let (gp, bp) = (pod("g", ""), pod("b", "burstable/"));
        run_pod(&mut p, &gp);
        run_pod(&mut p, &bp);
        let g = ctr("a", &gp, 100_000, 1024, 1 << 30);
        let one = adjusted_cpus(&create(&mut p, &gp, &g).unwrap());
        let b = ctr("b", &bp, 0, 512, 0);
        create(&mut p, &bp, &b).unwrap();
        let excl = |p: &Policy| p.d().lock(&mut Io::new()).state.allocator.exclusive_cpus();

        let r = resize(&mut p, &gp, &g, 200_000).unwrap();
        let two = updated_cpus(&r, &g.id).expect("the resized container's update");
        assert_eq!(r.update.last().unwrap().container_id, g.id, "{r:?}");
        assert_eq!(two.len(), 2);
        assert!(one.is_subset(&two), "{one} kept in {two}");
        assert_eq!(excl(&p), two, "the books agree");
        if let Some(bc) = updated_cpus(&r, &b.id) {
            assert!(bc.is_disjoint(&two), "shared {bc} off {two}");
        }
        let shared = p
            .writer
            .cpus(&request(&bp, &b, None).unwrap().unwrap().cgroup);
        assert!(shared.is_none_or(|s| s.is_disjoint(&two)));

        let before = p.d().lock(&mut Io::new()).state.clone();
        let e = resize(&mut p, &gp, &g, 300_000).unwrap_err();
        assert!(
            e.contains("refused the resize") && e.contains("InsufficientCPU"),
            "{e}"
        );
        assert_eq!(
            p.d().lock(&mut Io::new()).state,
            before,
            "a refused resize changes nothing"
        );

        let r = resize(&mut p, &gp, &g, 100_000).unwrap();
        let back = updated_cpus(&r, &g.id).unwrap();
        assert_eq!(back.len(), 1);
        assert!(back.is_subset(&two));
        assert_eq!(excl(&p), back);
        // the same request again: nothing to change, no update of it
        let r = resize(&mut p, &gp, &g, 100_000).unwrap();
        assert!(updated_cpus(&r, &g.id).is_none(), "{r:?}");
    }

    /// A dry run never refuses a resize: the update goes through untouched, the refusal
    /// counted.
    #[test]
    fn a_dry_run_lets_a_resize_it_would_refuse_through() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        let gp = pod("g", "");
        run_pod(&mut p, &gp);
        let g = ctr("a", &gp, 100_000, 1024, 1 << 30);
        create(&mut p, &gp, &g).unwrap();
        p.d().lock(&mut Io::new()).cfg.daemon.dry_run = true;
        let r = resize(&mut p, &gp, &g, 300_000).expect("a dry run refuses nothing");
        assert!(r.update.is_empty(), "{r:?}");
        assert_eq!(p.d().metrics.dry_run_refusals.get(), 1);
    }

    /// An UpdateContainer carrying a cpuset alone (kubelet's CPU Manager reconcile,
    /// `crictl update --cpuset-cpus`; containerd zeroes the unset fields) is not a resize: it
    /// is neither refused as a QoS change nor booked, and a real resize still is.
    #[test]
    fn an_update_without_a_size_is_not_a_resize() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        let gp = pod("g", "");
        run_pod(&mut p, &gp);
        let g = ctr("a", &gp, 100_000, 1024, 1 << 30);
        create(&mut p, &gp, &g).unwrap();
        let before = p.d().lock(&mut Io::new()).state.clone();
        let zero_i = Some(api::OptionalInt64 { value: 0 });
        let r = p
            .update_container(api::UpdateContainerRequest {
                pod: Some(gp.clone()),
                container: Some(g.clone()),
                linux_resources: Some(api::LinuxResources {
                    cpu: Some(api::LinuxCpu {
                        shares: Some(api::OptionalUInt64 { value: 0 }),
                        quota: zero_i,
                        period: Some(api::OptionalUInt64 { value: 0 }),
                        cpus: "0-3".into(),
                        ..Default::default()
                    }),
                    memory: Some(api::LinuxMemory {
                        limit: zero_i,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            })
            .expect("a cpuset-only update is not refused");
        let placed = before.allocator.exclusive_cpus();
        assert_eq!(
            updated_cpus(&r, &g.id),
            Some(placed.clone()),
            "the cpuset it has, not the asked one: {r:?}"
        );
        assert_eq!(r.update.last().unwrap().container_id, g.id);
        assert_eq!(p.d().lock(&mut Io::new()).state, before, "nothing booked");
        assert!(resize(&mut p, &gp, &g, 200_000).is_ok());
        assert_ne!(
            p.d().lock(&mut Io::new()).state,
            before,
            "a real resize is still booked"
        );
    }

    #[test]
    fn a_container_cgroup_names_its_runtime_id() {
        let id = "ab".repeat(32);
        for cg in [
            format!("kubepods/burstable/pod{UID}/{id}"),
            format!("kubepods.slice/kubepods-pod.slice/cri-containerd-{id}.scope"),
        ] {
            assert_eq!(container_id_of(&cg).as_deref(), Some(id.as_str()), "{cg}");
        }
        assert_eq!(container_id_of("kubepods/pod1/short"), None);
    }

    /// Hugepage limits from the runtime are summed without overflow.
    #[test]
    fn hugepage_limits_from_the_runtime_saturate() {
        let gp = pod("g", "");
        let mut c = ctr("a", &gp, 100_000, 1024, 1 << 30);
        let res = c.linux.as_mut().unwrap().resources.as_mut().unwrap();
        for page_size in ["2MB", "2MB", "1GB", "1GB"] {
            res.hugepage_limits.push(api::HugepageLimit {
                page_size: page_size.into(),
                limit: u64::MAX - 1,
            });
        }
        let r = request(&gp, &c, None).unwrap().unwrap();
        let k = &r.pod.containers[0];
        assert_eq!(
            (k.hugepages_2mi_bytes, k.hugepages_1gi_bytes),
            (u64::MAX, u64::MAX)
        );
    }

    /// A dry run refuses nothing: a container it would refuse (too big, or bad input) starts
    /// as the runtime makes it, the would-be refusal counted; the same container without the
    /// dry run is refused.
    #[test]
    fn a_dry_run_lets_a_container_it_would_refuse_start_untouched() {
        for dry in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let mut p = policy(dir.path());
            p.d().lock(&mut Io::new()).cfg.daemon.dry_run = dry;
            let gp = pod("g", "");
            run_pod(&mut p, &gp);
            let before = p.d().lock(&mut Io::new()).state.clone();
            let big = create(&mut p, &gp, &ctr("a", &gp, 900_000, 9216, 1 << 20));
            let mut bad = ctr("b", &gp, 100_000, 1024, 1 << 20);
            bad.linux.as_mut().unwrap().resources = None;
            let bad = create(&mut p, &gp, &bad);
            if dry {
                for r in [big, bad] {
                    let r = r.expect("a dry run refuses nothing");
                    assert!(r.adjust.is_none() && r.update.is_empty(), "{r:?}");
                }
                assert_eq!(p.d().metrics.dry_run_refusals.get(), 2);
            } else {
                assert!(big.unwrap_err().contains("InsufficientCPU"));
                assert!(bad.unwrap_err().contains("without linux resources"));
                assert_eq!(p.d().metrics.dry_run_refusals.get(), 0);
            }
            assert_eq!(p.d().lock(&mut Io::new()).state, before, "nothing booked");
        }
    }

    #[test]
    fn bad_input_gets_a_clear_error_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        let gp = pod("g", "");
        run_pod(&mut p, &gp);
        let before = p.d().lock(&mut Io::new()).state.clone();
        // A container of a pod the runtime never announced.
        let other = pod("x", "");
        let e = create(&mut p, &other, &ctr("a", &other, 100_000, 1024, 1 << 20)).unwrap_err();
        assert!(e.contains("never announced"), "{e}");
        // Missing resources on a Guaranteed container.
        let mut c = ctr("a", &gp, 100_000, 1024, 1 << 20);
        c.linux.as_mut().unwrap().resources = None;
        let e = create(&mut p, &gp, &c).unwrap_err();
        assert!(e.contains("without linux resources"), "{e}");
        // No memory limit: not a Guaranteed container.
        let e = create(&mut p, &gp, &ctr("a", &gp, 100_000, 1024, 0)).unwrap_err();
        assert!(e.contains("no memory limit"), "{e}");
        // Pod / container mismatch.
        let mut c = ctr("a", &gp, 100_000, 1024, 1 << 20);
        c.pod_sandbox_id = "elsewhere".into();
        let e = create(&mut p, &gp, &c).unwrap_err();
        assert!(e.contains("names pod sandbox"), "{e}");
        // No pod at all.
        let e = p
            .create_container(api::CreateContainerRequest {
                pod: None,
                container: Some(c),
            })
            .unwrap_err();
        assert!(e.contains("without its pod"), "{e}");
        // An unknown event.
        let e = p
            .state_change(api::StateChangeEvent {
                event: 99,
                ..Default::default()
            })
            .unwrap_err();
        assert!(e.contains("unknown NRI event 99"), "{e}");
        // Too big: refused with the reason.
        let e = create(&mut p, &gp, &ctr("a", &gp, 900_000, 9216, 1 << 20)).unwrap_err();
        assert!(e.contains("InsufficientCPU"), "{e}");
        assert_eq!(p.d().lock(&mut Io::new()).state, before, "nothing changed");

        // Through the wire: garbage payloads and unknown methods are refused by status code.
        let req = |method: &str, payload: Vec<u8>| envelope::Request {
            service: PLUGIN_SERVICE.into(),
            method: method.into(),
            payload,
            ..Default::default()
        };
        let st = dispatch(&mut p, &req("CreateContainer", vec![0xff, 0xff, 0xff])).unwrap_err();
        assert_eq!(st.code, CODE_INVALID_ARGUMENT);
        assert!(
            st.message.contains("malformed CreateContainerRequest"),
            "{}",
            st.message
        );
        let st = dispatch(&mut p, &req("Frobnicate", vec![])).unwrap_err();
        assert_eq!(st.code, CODE_UNIMPLEMENTED);
        let mut other_service = req("Configure", vec![]);
        other_service.service = "x.Y".into();
        assert_eq!(
            dispatch(&mut p, &other_service).unwrap_err().code,
            CODE_UNIMPLEMENTED
        );
        assert_eq!(p.d().lock(&mut Io::new()).state, before, "nothing changed");

        // Unknown fields (a newer NRI) are skipped, as protobuf intends: the request works.
        let g = ctr("a", &gp, 100_000, 1024, 1 << 20);
        let mut bytes = api::CreateContainerRequest {
            pod: Some(gp.clone()),
            container: Some(g),
        }
        .encode_to_vec();
        bytes.extend([0xf8, 0x07, 0x01]); // field 127, varint 1
        let ok = dispatch(&mut p, &req("CreateContainer", bytes)).unwrap();
        let r = api::CreateContainerResponse::decode(ok.as_slice()).unwrap();
        assert_eq!(adjusted_cpus(&r).len(), 1);
    }

    #[test]
    fn synchronize_adopts_once_and_releases_what_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        let gp = pod("g", "");
        run_pod(&mut p, &gp);
        let g = ctr("a", &gp, 100_000, 1024, 1 << 20);
        let g2 = ctr("c", &gp, 100_000, 1024, 1 << 20);
        let answer = create(&mut p, &gp, &g).unwrap();
        create(&mut p, &gp, &g2).unwrap();
        let excl = p.d().lock(&mut Io::new()).state.allocator.exclusive_cpus();
        // A restarted plugin (fresh Policy, same state): g still runs, g2 is gone, g3 is new.
        let mut p = Policy::new(p.d().clone(), None, p.runtime.clone());
        let mut running = g.clone();
        running.state = api::ContainerState::ContainerRunning as i32;
        // the runtime applied g's adjustment: its spec reports it
        let given = answer
            .adjust
            .unwrap()
            .linux
            .unwrap()
            .resources
            .unwrap()
            .cpu
            .unwrap();
        let spec = running.linux.as_mut().unwrap().resources.as_mut().unwrap();
        let cpu = spec.cpu.as_mut().unwrap();
        (cpu.cpus, cpu.mems) = (given.cpus, given.mems);
        let mut g3 = ctr("d", &gp, 100_000, 1024, 1 << 20);
        g3.state = api::ContainerState::ContainerRunning as i32;
        let r = p
            .synchronize(api::SynchronizeRequest {
                pods: vec![gp.clone()],
                containers: vec![running, g3.clone()],
            })
            .unwrap();
        let mut io = Io::new();
        let s = p.d().lock(&mut io);
        assert_eq!(
            s.state.allocator.pods.len(),
            2,
            "g kept once, g2 released, g3 adopted"
        );
        assert_eq!(s.state.bindings.len(), 2);
        assert_eq!(s.state.allocator.exclusive_cpus().len(), 2);
        assert!(!s
            .state
            .allocator
            .exclusive_cpus()
            .intersection(&excl)
            .is_empty());
        assert_eq!(r.update.len(), 1, "only the adopted container is updated");
        assert_eq!(r.update[0].container_id, g3.id);
    }

    /// A CreateContainer answer the runtime gave up waiting for: the daemon booked the
    /// container, the runtime started it with no cpuset (and so reports none). The reconnect's
    /// Synchronize sets it to its booked CPU; a paused container counts as running (kept,
    /// repaired), not gone.
    #[test]
    fn synchronize_repairs_a_bound_container_the_runtime_started_unplaced() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        let gp = pod("g", "");
        run_pod(&mut p, &gp);
        let g = ctr("a", &gp, 100_000, 1024, 1 << 20);
        let booked = adjusted_cpus(&create(&mut p, &gp, &g).unwrap());
        let mut p = Policy::new(p.d().clone(), None, p.runtime.clone());
        let mut paused = g.clone();
        paused.state = api::ContainerState::ContainerPaused as i32;
        let r = p
            .synchronize(api::SynchronizeRequest {
                pods: vec![gp.clone()],
                containers: vec![paused],
            })
            .unwrap();
        assert_eq!(
            p.d().lock(&mut Io::new()).state.allocator.exclusive_cpus(),
            booked
        );
        assert_eq!(r.update.len(), 1, "{:?}", r.update);
        assert_eq!(r.update[0].container_id, g.id);
        let cpu = r.update[0]
            .linux
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .cpu
            .as_ref()
            .unwrap();
        assert_eq!(CpuSet::parse(&cpu.cpus).unwrap(), booked);
        assert!(!cpu.mems.is_empty(), "the mems it never got are given too");
        assert_eq!(p.d().metrics.books_repairs.get(), 1);
    }

    /// A bound container the runtime leaves out of a Synchronize (containerd 1.7, restarted,
    /// counts a paused one unknown and omits it) keeps its allocation while its cgroup holds
    /// processes, its own or below it; with its cgroup empty it is released.
    #[test]
    fn synchronize_keeps_an_unlisted_container_whose_cgroup_still_has_processes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("cgroup.controllers"), "cpuset cpu memory\n").unwrap();
        let cgroups = Cgroups::new(crate::cgroup::mode::Mounts::scan_root(root).unwrap());
        let mut p = policy(root);
        let gp = pod("g", "");
        run_pod(&mut p, &gp);
        let g = ctr("a", &gp, 100_000, 1024, 1 << 20);
        let booked = adjusted_cpus(&create(&mut p, &gp, &g).unwrap());
        let cg = request(&gp, &g, None).unwrap().unwrap().cgroup;
        std::fs::create_dir_all(root.join(&cg)).unwrap();
        // its processes in a cgroup nested below its own (its own cgroup.procs empty)
        std::fs::write(root.join(&cg).join("cgroup.procs"), "").unwrap();
        let events = root.join(&cg).join("cgroup.events");
        let sync = |p: &mut Policy| {
            p.synchronize(api::SynchronizeRequest {
                pods: vec![gp.clone()],
                containers: vec![],
            })
            .unwrap()
        };
        std::fs::write(&events, "populated 1\nfrozen 1\n").unwrap();
        let mut p = Policy::new(p.d().clone(), Some(cgroups), p.runtime.clone());
        sync(&mut p);
        assert_eq!(
            p.d().lock(&mut Io::new()).state.allocator.exclusive_cpus(),
            booked
        );
        assert!(p.d().lock(&mut Io::new()).state.bindings.contains_key(&cg));
        std::fs::write(&events, "populated 0\nfrozen 0\n").unwrap();
        sync(&mut p);
        assert!(
            p.d().lock(&mut Io::new()).state.bindings.is_empty(),
            "released once empty"
        );
        assert!(p
            .d()
            .lock(&mut Io::new())
            .state
            .allocator
            .exclusive_cpus()
            .is_empty());
    }

    #[test]
    fn init_cpus_are_reused_by_app_containers_and_a_sidecar_keeps_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        let gp = pod("g", "");
        run_pod(&mut p, &gp);
        // An init container runs to completion first; kubelet stops it before the app starts.
        let init = ctr("1", &gp, 200_000, 2048, 1 << 20);
        let init_cpus = adjusted_cpus(&create(&mut p, &gp, &init).unwrap());
        p.stop_container(api::StopContainerRequest {
            pod: Some(gp.clone()),
            container: Some(init.clone()),
        })
        .unwrap();
        // A sidecar (restartable init container) keeps running beside the app.
        let sidecar = ctr("2", &gp, 100_000, 1024, 1 << 20);
        let side_cpus = adjusted_cpus(&create(&mut p, &gp, &sidecar).unwrap());
        assert!(
            side_cpus.is_subset(&init_cpus),
            "the sidecar reuses the init's CPUs"
        );
        let app = ctr("3", &gp, 200_000, 2048, 1 << 20);
        let app_cpus = adjusted_cpus(&create(&mut p, &gp, &app).unwrap());
        assert_eq!(app_cpus.len(), 2);
        assert!(
            app_cpus.is_disjoint(&side_cpus),
            "never the running sidecar's CPUs"
        );
        assert_eq!(
            app_cpus.union(&side_cpus).len(),
            3,
            "pod total = sidecar + app, as kubelet counts a restartable init container"
        );
        // Another pod can use what the finished init container had and the app did not take.
        let mut io = Io::new();
        let s = p.d().lock(&mut io);
        assert_eq!(
            s.state.allocator.exclusive_cpus(),
            app_cpus.union(&side_cpus)
        );
    }

    /// Pod scope through NRI: the pod's totals come from `pod_resources` (kubelet's sums, as
    /// containerd 1.7 passes them on). A pod of two 1-CPU containers (2 CPUs in all) keeps both
    /// on one node although another pod's container came between them; a pod of 3 CPUs fits
    /// no node under single-numa-node and its first CreateContainer fails with the reason;
    /// RemovePodSandbox releases the pod's hold.
    #[test]
    fn pod_scope_admits_each_container_within_the_pods_affinity_from_pod_resources() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        {
            let mut io = Io::new();
            let mut s = p.d().lock(&mut io);
            s.cfg.placement.scope = crate::config::TopologyScope::Pod;
            s.cfg.placement.policy = crate::config::TopologyPolicy::SingleNumaNode;
        }
        let with_totals = |id: &str, uid: &str, cpus: i64| {
            let mut pod = pod(id, "");
            pod.uid = uid.into();
            let l = pod.linux.as_mut().unwrap();
            l.cgroup_parent = format!("/kubepods/pod{uid}");
            l.pod_resources = Some(api::LinuxResources {
                cpu: Some(api::LinuxCpu {
                    shares: Some(api::OptionalUInt64 {
                        value: cpus as u64 * 1024,
                    }),
                    quota: Some(api::OptionalInt64 {
                        value: cpus * 100_000,
                    }),
                    period: Some(api::OptionalUInt64 { value: 100_000 }),
                    ..Default::default()
                }),
                memory: Some(api::LinuxMemory {
                    limit: Some(api::OptionalInt64 { value: cpus << 20 }),
                    ..Default::default()
                }),
                ..Default::default()
            });
            pod
        };
        // a 3-CPU pod fits no node: refused at its first container, nothing held
        let big = with_totals("k", "2a3b4c5d-6e7f-4a8b-9c0d-1e2f3a4b5c6d", 3);
        run_pod(&mut p, &big);
        let err = create(&mut p, &big, &ctr("d", &big, 100_000, 1024, 1 << 20)).unwrap_err();
        assert!(err.contains("TopologyAffinityError"), "{err}");
        assert!(!p
            .d()
            .lock(&mut Io::new())
            .state
            .allocator
            .pods
            .contains_key(&big.uid));
        let gp = with_totals("g", UID, 2);
        let hp = with_totals("h", "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9", 1);
        run_pod(&mut p, &gp);
        run_pod(&mut p, &hp);
        let r = request(&gp, &ctr("a", &gp, 100_000, 1024, 1 << 20), None)
            .unwrap()
            .unwrap();
        assert_eq!(r.totals.as_ref().unwrap().cpu_limit_millis, 2000);
        let node = |p: &Policy, cpus: &CpuSet| {
            p.d()
                .lock(&mut Io::new())
                .topo
                .node_of_cpu(cpus.first().unwrap())
        };
        let a_ctr = ctr("a", &gp, 100_000, 1024, 1 << 20);
        let a = adjusted_cpus(&create(&mut p, &gp, &a_ctr).unwrap());
        let x =
            adjusted_cpus(&create(&mut p, &hp, &ctr("c", &hp, 100_000, 1024, 1 << 20)).unwrap());
        let b = ctr("b", &gp, 100_000, 1024, 1 << 20);
        let bc = adjusted_cpus(&create(&mut p, &gp, &b).unwrap());
        assert_eq!(node(&p, &a), node(&p, &bc), "{a} and {bc}: one node");
        assert_ne!(
            node(&p, &x),
            node(&p, &a),
            "{x}: the other pod on the other node"
        );
        // b stops: its CPU stays the pod's
        p.stop_container(api::StopContainerRequest {
            pod: Some(gp.clone()),
            container: Some(b.clone()),
        })
        .unwrap();
        assert_eq!(
            p.d().lock(&mut Io::new()).state.allocator.exclusive_cpus(),
            a.union(&bc).union(&x)
        );
        // the sandbox stopped (a completed pod keeps it until the pod object goes): the pod
        // and its hold are released; its removal later changes nothing more
        p.stop_container(api::StopContainerRequest {
            pod: Some(gp.clone()),
            container: Some(a_ctr.clone()),
        })
        .unwrap();
        p.state_change(api::StateChangeEvent {
            event: api::Event::StopPodSandbox as i32,
            pod: Some(gp.clone()),
            container: None,
        })
        .unwrap();
        {
            let mut io = Io::new();
            let s = p.d().lock(&mut io);
            assert!(!s.state.allocator.pods.contains_key(UID));
            assert_eq!(s.state.allocator.exclusive_cpus(), x);
        }
        p.state_change(api::StateChangeEvent {
            event: api::Event::RemovePodSandbox as i32,
            pod: Some(gp.clone()),
            container: None,
        })
        .unwrap();
        let mut io = Io::new();
        let s = p.d().lock(&mut io);
        assert!(!s.state.allocator.pods.contains_key(UID));
        assert_eq!(s.state.allocator.exclusive_cpus(), x);
    }

    /// kubelet's pod in kubelet_cpus' tests: its container "app" on CPU 0.
    const KUBE_UID: &str = "5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9";

    /// kubelet's static CPU Manager state in `dir` (its format and checksum): [`KUBE_UID`]'s
    /// container "app" on CPU 0, the default set 1-3; adopted by `p`'s daemon.
    fn kubelets_cpu_zero(p: &Policy, dir: &std::path::Path) {
        let mut c = crate::kubelet_files::CpuCheckpoint {
            policy_name: "static".into(),
            default_cpu_set: "1-3".into(),
            entries: Some(
                [(
                    KUBE_UID.to_string(),
                    [("app".to_string(), "0".to_string())].into(),
                )]
                .into(),
            ),
            checksum: 0,
        };
        c.checksum = crate::kubelet_files::fnv1a32(&crate::kubelet_files::spew_cpu(&c)).into();
        std::fs::write(
            dir.join("cpu_manager_state"),
            format!(
                r#"{{"policyName":"static","defaultCpuSet":"1-3","entries":{{"{KUBE_UID}":{{"app":"0"}}}},"checksum":{}}}"#,
                c.checksum
            ),
        )
        .unwrap();
        let mut io = Io::new();
        let mut s = p.d().lock(&mut io);
        s.cfg.kubernetes.kubelet_state_dir = dir.to_path_buf();
        let m = p.d().metrics.clone();
        crate::daemon::kubelet::adopt(&mut s, &m);
        assert_eq!(s.kubelet.adopted.len(), 1, "{:?}", s.kubelet);
    }

    /// Coexistence with kubelet's static CPU Manager: CPU 0 is kubelet's (its state file, in
    /// kubelet's format). Its pod's container is left as kubelet made it (no adjustment, no
    /// allocation); the other Guaranteed containers take every other CPU but never CPU 0; and
    /// the planner, which moves the same observation of an unpinned container, never moves
    /// kubelet's.
    #[test]
    fn kubelets_static_cpus_are_never_handed_out_and_its_containers_never_planned() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        let kube_uid = KUBE_UID;
        kubelets_cpu_zero(&p, dir.path());
        let zero = CpuSet::parse("0").unwrap();
        // kubelet's pod: its container is kubelet's
        let mut kp = pod("k", "");
        kp.uid = kube_uid.into();
        kp.linux.as_mut().unwrap().cgroup_parent = format!("/kubepods/pod{kube_uid}");
        run_pod(&mut p, &kp);
        let mut kc = ctr("f", &kp, 100_000, 1024, 1 << 20);
        kc.name = "app".into();
        assert!(
            request(&kp, &kc, None).unwrap().is_some(),
            "a Kubernetes container"
        );
        let r = create(&mut p, &kp, &kc).unwrap();
        assert!(r.adjust.is_none() && r.update.is_empty(), "{r:?}");
        assert!(!p
            .d()
            .lock(&mut Io::new())
            .state
            .bindings
            .keys()
            .any(|cg| cg.contains(kube_uid)));
        // three more 1-CPU pods take CPUs 1-3, never 0; a fourth finds no CPU
        let mut given = CpuSet::new();
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            let mut gp = pod(id, "");
            gp.uid = format!("0000000{i}-1b4a-4c6d-9e8f-7a6b5c4d3e2f");
            gp.linux.as_mut().unwrap().cgroup_parent = format!("/kubepods/pod{}", gp.uid);
            run_pod(&mut p, &gp);
            let cpus =
                adjusted_cpus(&create(&mut p, &gp, &ctr(id, &gp, 100_000, 1024, 1 << 20)).unwrap());
            assert!(cpus.is_disjoint(&zero), "{cpus}");
            given = given.union(&cpus);
        }
        assert_eq!(given, CpuSet::parse("1-3").unwrap());
        let mut gp = pod("d", "");
        gp.uid = "0000000d-1b4a-4c6d-9e8f-7a6b5c4d3e2f".into();
        gp.linux.as_mut().unwrap().cgroup_parent = format!("/kubepods/pod{}", gp.uid);
        run_pod(&mut p, &gp);
        assert!(create(&mut p, &gp, &ctr("d", &gp, 100_000, 1024, 1 << 20)).is_err());
        // never planned: the same pulled observation moves an unpinned container
        let mut io = Io::new();
        let s = p.d().lock(&mut io);
        let kube_cg = request(&kp, &kc, None).unwrap().unwrap().cgroup;
        let obs_of =
            |id: &str, c: crate::controller::Constraints| crate::controller::Observations {
                period_ns: 1_000_000_000,
                cgroups: vec![crate::controller::CgroupObs {
                    id: id.into(),
                    cpu_ns_per_node: [(0, 2_000_000_000)].into(),
                    mem_bytes_per_node: [(1, 8 << 30)].into(),
                    cpus: CpuSet::parse("0-1").unwrap(),
                    mems: CpuSet::parse("0-1").unwrap(),
                    constraints: c,
                    ..Default::default()
                }],
                nodes: s
                    .topo
                    .nodes
                    .iter()
                    .map(|n| {
                        (
                            n.id,
                            crate::controller::NodeObs {
                                cpu_busy: 0.1,
                                free_bytes: 32 << 30,
                                free_hugepage_bytes: 0,
                                runnable: None,
                            },
                        )
                    })
                    .collect(),
                reserved_cpus: CpuSet::new(),
            };
        let plan = |o| {
            crate::controller::plan(
                &s.topo,
                &o,
                &Default::default(),
                &s.cfg.controller,
                1_000_000,
            )
        };
        let pinned = s.bound_constraints(&kube_cg).unwrap();
        assert!(pinned.pinned);
        assert!(plan(obs_of(&kube_cg, pinned)).moves.is_empty());
        assert!(
            !plan(obs_of("kubepods/other/c", Default::default()))
                .moves
                .is_empty(),
            "the scenario moves an unpinned container"
        );
    }

    /// A container of a kubelet pod that kubelet gave no CPUs (a sidecar on
    /// kubelet's default set, or any container when CPU Manager is `none` and only the Memory
    /// Manager has entries) is neither admitted nor left on the exclusive CPUs: its cpus are
    /// fenced off kubelet's and ours, its mems left to kubelet; kubelet's own container keeps
    /// what kubelet gave it.
    #[test]
    fn a_kubelet_pods_container_without_kubelet_cpus_is_fenced_off_the_exclusive_cpus() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        let kube_uid = KUBE_UID;
        kubelets_cpu_zero(&p, dir.path());
        // one exclusive CPU of ours
        let mut gp = pod("a", "");
        gp.uid = "0000000a-1b4a-4c6d-9e8f-7a6b5c4d3e2f".into();
        gp.linux.as_mut().unwrap().cgroup_parent = format!("/kubepods/pod{}", gp.uid);
        run_pod(&mut p, &gp);
        let ours =
            adjusted_cpus(&create(&mut p, &gp, &ctr("a", &gp, 100_000, 1024, 1 << 20)).unwrap());
        let excl = p.d().lock(&mut Io::new()).state.allocator.exclusive_cpus();
        assert!(excl.contains(0) && ours.is_subset(&excl), "{excl}");
        let mut kp = pod("k", "");
        kp.uid = kube_uid.into();
        kp.linux.as_mut().unwrap().cgroup_parent = format!("/kubepods/pod{kube_uid}");
        run_pod(&mut p, &kp);
        // kubelet's container: as kubelet made it
        let mut app = ctr("f", &kp, 100_000, 1024, 1 << 20);
        app.name = "app".into();
        assert!(create(&mut p, &kp, &app).unwrap().adjust.is_none());
        // its sidecar on kubelet's default set 1-3, which has our CPU: fenced to the rest
        let mut side = ctr("e", &kp, 50_000, 512, 1 << 20);
        side.name = "side".into();
        let cpu = side
            .linux
            .as_mut()
            .unwrap()
            .resources
            .as_mut()
            .unwrap()
            .cpu
            .as_mut()
            .unwrap();
        cpu.cpus = "1-3".into();
        let fenced = adjusted_cpus(&create(&mut p, &kp, &side).unwrap());
        let want = CpuSet::parse("1-3").unwrap().difference(&excl);
        assert!(!want.is_empty());
        assert_eq!(fenced, want);
        // no cpuset from the runtime (CPU Manager none): every online CPU but the exclusive ones
        let mut bare = ctr("d", &kp, 50_000, 512, 1 << 20);
        bare.name = "bare".into();
        let fenced = adjusted_cpus(&create(&mut p, &kp, &bare).unwrap());
        let online = p.d().lock(&mut Io::new()).topo.online_cpus();
        assert_eq!(fenced, online.difference(&excl));
        // neither is admitted or bound: kubelet booked the pod
        assert!(!p
            .d()
            .lock(&mut Io::new())
            .state
            .bindings
            .keys()
            .any(|cg| cg.contains(kube_uid)));
        // already off the exclusive CPUs: no adjustment
        let mut off = ctr("b", &kp, 50_000, 512, 1 << 20);
        off.name = "off".into();
        let cpu = off
            .linux
            .as_mut()
            .unwrap()
            .resources
            .as_mut()
            .unwrap()
            .cpu
            .as_mut()
            .unwrap();
        cpu.cpus = fenced.to_string();
        assert!(create(&mut p, &kp, &off).unwrap().adjust.is_none());
        // An exclusive CPU admitted after them is fenced off them too
        let mut g2 = pod("9", "");
        g2.uid = "00000009-1b4a-4c6d-9e8f-7a6b5c4d3e2f".into();
        g2.linux.as_mut().unwrap().cgroup_parent = format!("/kubepods/pod{}", g2.uid);
        run_pod(&mut p, &g2);
        let later =
            adjusted_cpus(&create(&mut p, &g2, &ctr("9", &g2, 100_000, 1024, 1 << 20)).unwrap());
        assert_eq!(later.len(), 1);
        for k in [&side, &bare, &off] {
            let cg = request(&kp, k, None).unwrap().unwrap().cgroup;
            let runs = p.runtime.given(&cg).and_then(|g| g.cpus).unwrap();
            assert!(
                runs.is_disjoint(&later) && !runs.is_empty(),
                "{} runs on {runs}, {later} is exclusive now",
                k.name
            );
        }
        // a kubelet container removed: what it was given and its fence go with it at once
        let side_cg = request(&kp, &side, None).unwrap().unwrap().cgroup;
        p.state_change(api::StateChangeEvent {
            event: api::Event::RemoveContainer as i32,
            pod: Some(kp.clone()),
            container: Some(side.clone()),
        })
        .unwrap();
        assert!(p.runtime.given(&side_cg).is_none());
        assert!(!p.d().lock(&mut Io::new()).fenced.contains_key(&side_cg));
        // the sandbox gone: nothing of it is fenced or remembered any more
        p.state_change(api::StateChangeEvent {
            event: api::Event::RemovePodSandbox as i32,
            pod: Some(kp.clone()),
            ..Default::default()
        })
        .unwrap();
        assert!(p.d().lock(&mut Io::new()).fenced.is_empty());
        for k in [&bare, &off] {
            let cg = request(&kp, k, None).unwrap().unwrap().cgroup;
            assert!(p.runtime.given(&cg).is_none(), "{cg} still remembered");
        }
    }

    /// The unsolicited-updates decision at Configure: `auto` follows the version rule for the
    /// runtime that answered, `true` / `false` force it; the decision is in `status`.
    #[test]
    fn configure_decides_unsolicited_updates_by_the_runtime_version() {
        use crate::config::RuntimeUpdates as U;
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(dir.path());
        let conf = |p: &mut Policy, version: &str| {
            p.configure(api::ConfigureRequest {
                runtime_name: "containerd".into(),
                runtime_version: version.into(),
                ..Default::default()
            })
            .unwrap();
            let mut io = Io::new();
            let s = p.d().lock(&mut io);
            assert_eq!(s.nri_runtime.version, version);
            (
                p.runtime.updates_enabled(),
                s.nri_runtime.unsolicited_updates,
                s.nri_runtime.reason.clone(),
            )
        };
        let (on, shown, why) = conf(&mut p, "1.7.24~ds1");
        assert!(!on && !shown, "{why}");
        assert!(why.contains("13733"), "{why}");
        assert!(conf(&mut p, "v2.4.1").0);
        p.d()
            .lock(&mut Io::new())
            .cfg
            .kubernetes
            .nri_runtime_updates = U::On;
        let (on, _, why) = conf(&mut p, "1.7.24~ds1");
        assert!(on && why.contains("nri_runtime_updates = true"), "{why}");
        p.d()
            .lock(&mut Io::new())
            .cfg
            .kubernetes
            .nri_runtime_updates = U::Off;
        assert!(!conf(&mut p, "v2.4.1").0);
        // the config key takes "auto", true and false, and refuses anything else
        let k = |v: &str| {
            toml::from_str::<crate::config::KubernetesConfig>(&format!("nri_runtime_updates = {v}"))
        };
        assert_eq!(k("\"auto\"").unwrap().nri_runtime_updates, U::Auto);
        assert_eq!(k("true").unwrap().nri_runtime_updates, U::On);
        assert_eq!(k("false").unwrap().nri_runtime_updates, U::Off);
        assert!(k("\"sometimes\"")
            .unwrap_err()
            .to_string()
            .contains("expected"));
    }

    #[test]
    fn systemd_cgroups_paths_expand_as_systemd_lays_them_out() {
        assert_eq!(
            cgroup_rel("kubepods-burstable-pod1234.slice:cri-containerd:abc"),
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-abc.scope"
        );
        assert_eq!(cgroup_rel("/kubepods/pod1/abc"), "kubepods/pod1/abc");
        assert_eq!(
            event_mask(&[api::Event::RunPodSandbox, api::Event::CreateContainer]),
            0b1001
        );
        assert_eq!(millis_from_shares(1024), 1000);
        assert_eq!(millis_from_shares(102), 100);
        assert_eq!(millis_from_shares(2), 0);
        assert_eq!(millis_from_shares(u64::MAX), u64::MAX.div_ceil(1024));
        // quota / period: rounded up, saturating on a hostile quota
        let cpu = |quota: i64, period: u64| api::LinuxCpu {
            quota: Some(api::OptionalInt64 { value: quota }),
            period: Some(api::OptionalUInt64 { value: period }),
            ..Default::default()
        };
        assert_eq!(cpu_millis(Some(&cpu(150_000, 100_000))).0, 1500);
        assert_eq!(cpu_millis(Some(&cpu(1, 100_000))).0, 1);
        assert_eq!(cpu_millis(Some(&cpu(-1, 100_000))).0, 0);
        assert_eq!(cpu_millis(Some(&cpu(i64::MAX, 1))).0, u64::MAX);
        assert_eq!(cpu_millis(None), (0, 0));
    }

    /// A container's device nodes become the device provider's hints: its GPU (char 241:1,
    /// on node 1 through the sysfs root) puts it on node 1 under single-numa-node, restricted
    /// and best-effort (policy none aligns nothing, as kubelet's); a block device with the
    /// same numbers, or the same GPU in a container that may open every device (privileged),
    /// aligns nothing and the container lands where kubelet's merge puts it first (node 0).
    #[test]
    fn a_containers_device_nodes_steer_its_numa_node() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        let pci = sys.join("bus/pci/devices/0000:c1:00.0");
        std::fs::create_dir_all(&pci).unwrap();
        std::fs::write(pci.join("numa_node"), "1\n").unwrap();
        std::fs::create_dir_all(sys.join("dev/char/241:1")).unwrap();
        std::os::unix::fs::symlink(&pci, sys.join("dev/char/241:1/device")).unwrap();
        use crate::config::TopologyPolicy as T;
        let placed = |kind: &str, allow_all: bool, policy_is: T| {
            let mut p = policy(dir.path());
            {
                let mut io = Io::new();
                let mut s = p.d().lock(&mut io);
                s.cfg.daemon.sysfs_root = sys.clone();
                s.cfg.placement.policy = policy_is;
                s.topo.devices.push(crate::topology::PciDevice {
                    address: "0000:c1:00.0".into(),
                    class: crate::topology::DeviceClass::Gpu,
                    node: Some(1),
                    vendor: None,
                    device: None,
                });
            }
            let gp = pod("g", "");
            run_pod(&mut p, &gp);
            let mut c = ctr("a", &gp, 100_000, 1024, 1 << 20);
            let l = c.linux.as_mut().unwrap();
            l.devices.push(api::LinuxDevice {
                path: "/dev/gpu1".into(),
                r#type: kind.into(),
                major: 241,
                minor: 1,
                ..Default::default()
            });
            if allow_all {
                l.resources
                    .as_mut()
                    .unwrap()
                    .devices
                    .push(api::LinuxDeviceCgroup {
                        allow: true,
                        r#type: "a".into(),
                        access: "rwm".into(),
                        ..Default::default()
                    });
            }
            adjusted_cpus(&create(&mut p, &gp, &c).unwrap())
        };
        // 2 nodes x 2 CPUs: node 0 = 0-1, node 1 = 2-3
        for t in [T::SingleNumaNode, T::Restricted, T::BestEffort] {
            assert_eq!(placed("c", false, t).to_string(), "2", "{t:?}");
        }
        assert_eq!(placed("c", false, T::None).to_string(), "0");
        assert_eq!(placed("b", false, T::SingleNumaNode).to_string(), "0");
        assert_eq!(placed("c", true, T::SingleNumaNode).to_string(), "0");
    }
}
