//! What a cgroup path is: a Kubernetes pod or container (either kubelet cgroup driver), a QoS
//! tier, a systemd slice/service/scope, something below a configured root, or other.
//!
//! Kubernetes kinds are recognised only under kubelet's cgroup root: `kubepods` or
//! `kubepods.slice` directly under the hierarchy root, or the configured `cgroups.kubernetes_root`
//! (for a `--cgroup-root` such as `/kubelet.slice/kubelet-kubepods.slice`). Anywhere else a
//! kubepods-looking path is never a pod or container: whoever may create cgroups elsewhere (a
//! user with a delegated `user@.service` subtree) cannot pose as one. Layouts recognised:
//! - systemd driver: `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
//!   cri-containerd-<id>.scope` (also `crio-<id>.scope`, `docker-<id>.scope`); Guaranteed pods
//!   sit directly under `kubepods.slice` as `kubepods-pod<uid>.slice`; the pod UID's dashes are
//!   written as underscores in slice names and are restored here.
//! - cgroupfs driver: `kubepods/burstable/pod<uid>/<id>`, Guaranteed as `kubepods/pod<uid>/<id>`.
//!
//! Pure: `classify` does no I/O.
use serde::Serialize;

use crate::placement::pod::Qos;

/// What a cgroup is, from its path relative to the hierarchy root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CgroupKind {
    /// The hierarchy root.
    Root,
    /// `kubepods(.slice)` itself.
    Kubepods,
    /// A QoS tier (`kubepods-burstable.slice`, `kubepods/besteffort`).
    QosTier {
        qos: Qos,
    },
    Pod {
        uid: String,
        qos: Qos,
    },
    Container {
        pod_uid: String,
        qos: Qos,
        /// The runtime's id (64 hex digits for containerd, CRI-O and Docker).
        id: String,
        /// `containerd`, `crio`, `docker`, or `None` for a bare cgroupfs-driver id.
        runtime: Option<String>,
    },
    /// Anything else inside a pod (e.g. CRI-O's `crio-conmon-<id>.scope`).
    PodOther {
        pod_uid: String,
        qos: Qos,
        name: String,
    },
    SystemdSlice {
        name: String,
    },
    SystemdService {
        name: String,
    },
    SystemdScope {
        name: String,
    },
    /// At or below one of the configured roots (`root` as configured).
    Configured {
        root: String,
    },
    Other,
}

impl CgroupKind {
    pub fn pod_uid(&self) -> Option<&str> {
        match self {
            CgroupKind::Pod { uid, .. } => Some(uid),
            CgroupKind::Container { pod_uid, .. } | CgroupKind::PodOther { pod_uid, .. } => {
                Some(pod_uid)
            }
            _ => None,
        }
    }
}

/// Where kubelet's pods are: `kubernetes_root` (`cgroups.kubernetes_root`), else `kubepods`
/// and `kubepods.slice` at the top of the hierarchy.
pub fn kubernetes_roots(kubernetes_root: Option<&str>) -> Vec<String> {
    match kubernetes_root {
        Some(k) => vec![k.to_string()],
        None => vec!["kubepods".into(), "kubepods.slice".into()],
    }
}

/// Classifies a cgroup path (relative to the hierarchy root; a leading `/` is fine).
pub fn classify(rel: &str) -> CgroupKind {
    classify_with_roots(rel, &[])
}

/// Like [`classify`], but a path at or below one of `roots` (e.g. `"/batch.slice"`) is
/// [`CgroupKind::Configured`] unless it is a Kubernetes pod or container.
pub fn classify_with_roots(rel: &str, roots: &[String]) -> CgroupKind {
    classify_in(rel, None, roots)
}

/// Like [`classify_with_roots`], with kubelet's cgroup root at `kubepods` (relative to the
/// hierarchy root, e.g. `"/kubelet.slice/kubelet-kubepods.slice"`); `None`: `kubepods` or
/// `kubepods.slice` directly under the hierarchy root.
pub fn classify_in(rel: &str, kubepods: Option<&str>, roots: &[String]) -> CgroupKind {
    let segs: Vec<&str> = rel.split('/').filter(|s| !s.is_empty()).collect();
    if segs.is_empty() {
        return CgroupKind::Root;
    }
    let at = match kubepods {
        None => (segs[0] == "kubepods" || segs[0] == "kubepods.slice").then_some(0),
        Some(k) => {
            let k: Vec<&str> = k.split('/').filter(|s| !s.is_empty()).collect();
            (!k.is_empty() && segs.starts_with(&k)).then(|| k.len() - 1)
        }
    };
    if let Some(k) = at.and_then(|at| kubernetes(&segs, at)) {
        return k;
    }
    for root in roots {
        let r: Vec<&str> = root.split('/').filter(|s| !s.is_empty()).collect();
        if !r.is_empty() && segs.starts_with(&r) {
            return CgroupKind::Configured { root: root.clone() };
        }
    }
    let last = segs[segs.len() - 1].to_string();
    if last.ends_with(".slice") {
        CgroupKind::SystemdSlice { name: last }
    } else if last.ends_with(".service") {
        CgroupKind::SystemdService { name: last }
    } else if last.ends_with(".scope") {
        CgroupKind::SystemdScope { name: last }
    } else {
        CgroupKind::Other
    }
}

/// The Kubernetes kind of `segs`, whose segment `at` is kubelet's cgroup root.
fn kubernetes(segs: &[&str], at: usize) -> Option<CgroupKind> {
    let systemd = segs[at].ends_with(".slice");
    let rest = &segs[at + 1..];
    let Some(first) = rest.first() else {
        return Some(CgroupKind::Kubepods);
    };
    let tier = |s: &str| -> Option<Qos> {
        let name = if systemd {
            s.strip_suffix(".slice")?.rsplit('-').next()?
        } else {
            s
        };
        match name {
            "burstable" => Some(Qos::Burstable),
            "besteffort" => Some(Qos::BestEffort),
            _ => None,
        }
    };
    let (qos, rest) = match tier(first) {
        Some(q) => (q, &rest[1..]),
        None => (Qos::Guaranteed, rest),
    };
    let Some(pod_seg) = rest.first() else {
        return Some(CgroupKind::QosTier { qos });
    };
    let uid = if systemd {
        pod_seg
            .strip_suffix(".slice")
            .and_then(|s| s.rsplit_once("-pod"))
            .map(|(_, uid)| uid.replace('_', "-"))
    } else {
        pod_seg.strip_prefix("pod").map(str::to_string)
    };
    let Some(uid) = uid.filter(|u| !u.is_empty()) else {
        return Some(CgroupKind::Other);
    };
    let Some(leaf) = rest.get(1) else {
        return Some(CgroupKind::Pod { uid, qos });
    };
    if rest.len() > 2 {
        // Something nested inside a container (e.g. a process's own sub-cgroup).
        return Some(CgroupKind::PodOther {
            pod_uid: uid,
            qos,
            name: rest[1..].join("/"),
        });
    }
    let name = leaf.strip_suffix(".scope").unwrap_or(leaf);
    for (prefix, runtime) in [
        ("cri-containerd-", "containerd"),
        ("crio-", "crio"),
        ("docker-", "docker"),
    ] {
        if let Some(id) = name.strip_prefix(prefix) {
            if is_container_id(id) {
                return Some(CgroupKind::Container {
                    pod_uid: uid,
                    qos,
                    id: id.to_string(),
                    runtime: Some(runtime.to_string()),
                });
            }
        }
    }
    if !systemd && is_container_id(name) {
        return Some(CgroupKind::Container {
            pod_uid: uid,
            qos,
            id: name.to_string(),
            runtime: None,
        });
    }
    Some(CgroupKind::PodOther {
        pod_uid: uid,
        qos,
        name: leaf.to_string(),
    })
}

/// Container ids are hex strings (64 digits for every common runtime; accept 12 and up).
fn is_container_id(s: &str) -> bool {
    s.len() >= 12 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f8c1b2a9d3e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a";
    const UID: &str = "8d5c3f2e-1b4a-4c6d-9e8f-7a6b5c4d3e2f";

    fn container(qos: Qos, runtime: Option<&str>) -> CgroupKind {
        CgroupKind::Container {
            pod_uid: UID.into(),
            qos,
            id: ID.into(),
            runtime: runtime.map(str::to_string),
        }
    }

    fn check(path: &str, want: CgroupKind) {
        assert_eq!(
            classify_with_roots(path, &["/batch.slice".into(), "/jobs".into()]),
            want,
            "{path}"
        );
    }

    #[test]
    fn classifies_layouts() {
        let us = UID.replace('-', "_");
        let pod = |qos| CgroupKind::Pod {
            uid: UID.into(),
            qos,
        };
        let table: Vec<(String, CgroupKind)> = vec![
            ("/".into(), CgroupKind::Root),
            ("/kubepods.slice".into(), CgroupKind::Kubepods),
            ("/kubepods".into(), CgroupKind::Kubepods),
            ("/kubepods.slice/kubepods-burstable.slice".into(), CgroupKind::QosTier { qos: Qos::Burstable }),
            ("/kubepods/besteffort".into(), CgroupKind::QosTier { qos: Qos::BestEffort }),
            (format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{us}.slice"), pod(Qos::Burstable)),
            (format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{us}.slice/cri-containerd-{ID}.scope"), container(Qos::Burstable, Some("containerd"))),
            (format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{us}.slice/crio-{ID}.scope"), container(Qos::BestEffort, Some("crio"))),
            (format!("/kubepods.slice/kubepods-pod{us}.slice/docker-{ID}.scope"), container(Qos::Guaranteed, Some("docker"))),
            (format!("/kubepods.slice/kubepods-pod{us}.slice"), pod(Qos::Guaranteed)),
            (format!("/kubepods/burstable/pod{UID}/{ID}"), container(Qos::Burstable, None)),
            (format!("/kubepods/pod{UID}/{ID}"), container(Qos::Guaranteed, None)),
            (format!("/kubepods/pod{UID}"), pod(Qos::Guaranteed)),
            (format!("/kubepods/besteffort/pod{UID}/crio-{ID}"), container(Qos::BestEffort, Some("crio"))),
            // A --cgroup-root prefix (kind, kubelet.slice) is not kubelet's root unless configured.
            (format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{us}.slice/cri-containerd-{ID}.scope"), CgroupKind::SystemdScope { name: format!("cri-containerd-{ID}.scope") }),
            // Decoys: kubepods-looking paths anywhere but at the top are never pods or containers.
            (format!("/user.slice/user-1000.slice/user@1000.service/kubepods.slice/kubepods-pod{us}.slice/cri-containerd-{ID}.scope"), CgroupKind::SystemdScope { name: format!("cri-containerd-{ID}.scope") }),
            (format!("/rbt/kubepods/pod{UID}/{ID}"), CgroupKind::Other),
            (format!("/jobs/kubepods/pod{UID}/{ID}"), CgroupKind::Configured { root: "/jobs".into() }),
            (format!("/kubepods.slice/kubepods-pod{us}.slice/crio-conmon-{ID}.scope"),
             CgroupKind::PodOther { pod_uid: UID.into(), qos: Qos::Guaranteed, name: format!("crio-conmon-{ID}.scope") }),
            (format!("/kubepods/pod{UID}/{ID}/sub"),
             CgroupKind::PodOther { pod_uid: UID.into(), qos: Qos::Guaranteed, name: format!("{ID}/sub") }),
            ("/kubepods/notapod".into(), CgroupKind::Other),
            ("/system.slice".into(), CgroupKind::SystemdSlice { name: "system.slice".into() }),
            ("/system.slice/containerd.service".into(), CgroupKind::SystemdService { name: "containerd.service".into() }),
            ("/user.slice/user-1000.slice/session-3.scope".into(), CgroupKind::SystemdScope { name: "session-3.scope".into() }),
            ("/batch.slice/job-1.service".into(), CgroupKind::Configured { root: "/batch.slice".into() }),
            ("/jobs/a/b".into(), CgroupKind::Configured { root: "/jobs".into() }),
            ("/jobsx".into(), CgroupKind::Other),
            ("/process_api/ae09604c1d47a80af21d4b397d7672fb".into(), CgroupKind::Other),
        ];
        for (path, want) in table {
            check(&path, want);
        }
        assert_eq!(
            classify(&format!("/kubepods/pod{UID}")).pod_uid(),
            Some(UID)
        );
    }

    #[test]
    fn a_configured_kubelet_root_is_the_only_place_of_pods() {
        let us = UID.replace('-', "_");
        let root = Some("/kubelet.slice/kubelet-kubepods.slice");
        let nested = format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{us}.slice/cri-containerd-{ID}.scope");
        assert_eq!(
            classify_in(&nested, root, &[]),
            container(Qos::Burstable, Some("containerd"))
        );
        assert_eq!(
            classify_in("/kubelet.slice/kubelet-kubepods.slice", root, &[]),
            CgroupKind::Kubepods
        );
        // With a configured root, the top-level one is not kubelet's either.
        assert_eq!(
            classify_in(&format!("/kubepods/pod{UID}/{ID}"), root, &[]),
            CgroupKind::Other
        );
        assert_eq!(
            classify_in(
                &format!("/rbt-x/kubepods/burstable/pod{UID}/{ID}"),
                Some("rbt-x/kubepods"),
                &[]
            ),
            container(Qos::Burstable, None)
        );
    }

    proptest::proptest! {
        #[test]
        fn classify_never_panics(path in "(/|kubepods|\\.slice|-pod|burstable|besteffort|_|[a-f0-9]{1,70}|cri-containerd-|crio-|\\.scope){0,12}") {
            let _ = classify_with_roots(&path, &["/a".into()]);
        }
    }
}
