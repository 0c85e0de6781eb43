//! `rebalancer uninstall`: undoes what the daemon left on the node once it is stopped. Every
//! container cgroup it manages gets its parent's effective `cpuset.cpus` and `cpuset.mems`
//! back, and `kernel.numa_balancing` gets the value recorded before the daemon turned it off.
//!
//! Managed containers are the checkpoint's bindings (every door's admissions) and the
//! Kubernetes containers under kubelet's cgroup root (the daemon also narrows containers it did
//! not admit, fencing them off exclusive CPUs), except those of pods kubelet's static managers
//! placed (adopted as `kubelet:<uid>` in the checkpoint): their cpusets are kubelet's.
//!
//! Refuses while a daemon holds the state directory's lock (it would write the cpusets back),
//! unless `--force`; holds that lock itself meanwhile so no daemon starts halfway.
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::Context;

use crate::{
    cgroup::{kube::classify_in, kube::kubernetes_roots, kube::CgroupKind, Cgroups, Controller},
    config::Config,
    daemon::{lock, run::NUMA_BALANCING, run::NUMA_BALANCING_RECORD, Persisted},
};

/// Stop the daemon first (`systemctl disable --now rebalancer`, or delete the DaemonSet), then
/// run this on the node as root.
#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    /// The daemon's config file (TOML): its state directory, cgroup roots and kubelet root.
    /// Without it the embedded default is used.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Go on even though a daemon holds the state directory's lock (it may write the cpusets
    /// again).
    #[arg(long)]
    pub force: bool,
    /// Print what would be written, write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// The container cgroups to hand back, parents before children: the checkpoint's bindings and
/// the Kubernetes containers found under kubelet's root (`walked`), less those of the pods in
/// `kubelets` (uids kubelet's static managers placed).
pub fn targets(
    bound: &[String],
    kubelets: &BTreeSet<String>,
    walked: &[String],
    kubernetes_root: Option<&str>,
) -> Vec<String> {
    let mut out: BTreeSet<String> = bound.iter().cloned().collect();
    for cg in walked {
        // the walk names cgroups from the hierarchy's root (`/a/b`), the books without it
        let cg = cg.trim_start_matches('/');
        if let CgroupKind::Container { pod_uid, .. } = classify_in(cg, kubernetes_root, &[]) {
            if !kubelets.contains(&pod_uid) {
                out.insert(cg.to_string());
            }
        }
    }
    let mut out: Vec<String> = out.into_iter().collect();
    out.sort_by_key(|cg| (cg.matches('/').count(), cg.clone()));
    out
}

pub fn run(a: UninstallArgs) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(a.config.as_deref())?;
    let state_dir = &cfg.daemon.state_dir;
    // Held until we are done: a daemon that starts now waits for nothing and would find the
    // cpusets half handed back, so it is refused instead.
    let _lock = match lock::acquire(state_dir) {
        Ok(l) => Some(l),
        Err(e @ lock::LockError::Held { .. }) if !a.force => {
            anyhow::bail!("{e}\nstop the daemon first, or pass --force");
        }
        Err(e) => {
            eprintln!("rebalancer: warning: {e}; going on (--force)");
            None
        }
    };
    let state = match crate::checkpoint::load::<Persisted>(state_dir) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rebalancer: warning: checkpoint unreadable ({e}); handing back the Kubernetes containers only");
            None
        }
    };
    let cgroups = Cgroups::detect(
        Path::new("/sys/fs/cgroup"),
        Path::new("/proc/self/mountinfo"),
    )
    .context("finding the cgroup hierarchies")?;
    let k8s_root = cfg.cgroups.kubernetes_root.as_deref();
    let walked = cgroups
        .walk_roots(Controller::Cpuset, &kubernetes_roots(k8s_root))
        .context("walking kubelet's cgroups")?;
    let mut failed = 0;
    let mut done = 0;
    let bound: Vec<String> = (state.iter())
        .flat_map(|p| p.bindings.keys().cloned())
        .collect();
    let kubelets: BTreeSet<String> = (state.iter())
        .flat_map(|p| p.allocator.pods.keys())
        .filter_map(|k| k.strip_prefix(crate::daemon::kubelet::KEY_PREFIX))
        .map(String::from)
        .collect();
    for cg in targets(&bound, &kubelets, &walked, k8s_root) {
        let parent = Path::new(&cg)
            .parent()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let sets = cgroups
            .effective_cpus(&parent)
            .and_then(|c| Ok((c, cgroups.effective_mems(&parent)?)));
        let (cpus, mems) = match sets {
            Ok(s) => s,
            // gone since the checkpoint (its container ended): nothing to hand back
            Err(_) if !cgroups.exists(Controller::Cpuset, &cg) => continue,
            Err(e) => {
                eprintln!("rebalancer: {cg}: reading its parent's sets: {e}");
                failed += 1;
                continue;
            }
        };
        if a.dry_run {
            println!("{cg}: would write cpus {cpus}, mems {mems}");
            continue;
        }
        match cgroups
            .write_cpus(&cg, &cpus)
            .and_then(|()| cgroups.write_mems(&cg, &mems))
        {
            Ok(()) => {
                println!("{cg}: cpus {cpus}, mems {mems}");
                done += 1;
            }
            Err(_) if !cgroups.exists(Controller::Cpuset, &cg) => {}
            Err(e) => {
                eprintln!("rebalancer: {cg}: {e}");
                failed += 1;
            }
        }
    }
    let record = state_dir.join(NUMA_BALANCING_RECORD);
    match std::fs::read_to_string(&record) {
        Ok(before) if a.dry_run => {
            println!("kernel.numa_balancing: would restore {}", before.trim())
        }
        Ok(before) => match std::fs::write(NUMA_BALANCING, before.trim()) {
            Ok(()) => {
                let _ = std::fs::remove_file(&record);
                println!("kernel.numa_balancing restored to {}", before.trim());
            }
            Err(e) => {
                eprintln!("rebalancer: restoring kernel.numa_balancing: {e}");
                failed += 1;
            }
        },
        Err(_) => println!("kernel.numa_balancing: the daemon left it as it found it"),
    }
    if !a.dry_run {
        println!("{done} container cgroups handed back to their parents' sets");
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        eprintln!("rebalancer: {failed} failures (above)");
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings_and_kubernetes_containers_but_not_kubelets_own_parents_first() {
        let uid = "11111111-2222-3333-4444-555555555555";
        let theirs = "99999999-2222-3333-4444-555555555555";
        let id = "a".repeat(64);
        let walked = vec![
            "kubepods".to_string(),
            "kubepods/burstable".into(),
            format!("kubepods/burstable/pod{uid}"),
            format!("/kubepods/burstable/pod{uid}/{id}"),
            format!("kubepods/pod{theirs}/{id}"),
        ];
        let bound = vec![
            "system.slice/db.service".to_string(),
            format!("kubepods/burstable/pod{uid}/{id}"),
        ];
        assert_eq!(
            targets(&bound, &[theirs.to_string()].into(), &walked, None),
            vec![
                "system.slice/db.service".to_string(),
                format!("kubepods/burstable/pod{uid}/{id}"),
            ]
        );
        // no checkpoint: the Kubernetes containers, kubelet's too (nothing says they are)
        assert_eq!(targets(&[], &BTreeSet::new(), &walked, None).len(), 2);
    }
}
