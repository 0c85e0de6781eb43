//! Rounds on events, not only on the period: an inotify watch (IN_MODIFY) on `cpuset.cpus` of
//! every managed cgroup wakes the control loop as soon as someone writes it — the operator
//! pinning a workload away from its memory is fixed at once, not up to a period later. The
//! watcher wakes the loop the same way after a new cgroup's first placement. The loop rate-
//! limits the rounds it runs on such wake-ups (see `run`).
//!
//! The watched set follows the managed cgroups: [`CpusetTrigger::watch`] after every round
//! adds the new ones and drops the gone ones. Our own writes to `cpuset.cpus` wake the loop
//! too; the round that follows finds nothing to do (the cooldown holds the moved cgroup).

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio::sync::Notify;

/// The watches over the managed cgroups' `cpuset.cpus`, and the thread that turns their
/// events into wake-ups of `wake`.
pub struct CpusetTrigger {
    watches: Mutex<(Watches, BTreeMap<PathBuf, WatchDescriptor>)>,
}

impl CpusetTrigger {
    /// Starts the thread. Fails when inotify is unavailable (the loop then runs on the period).
    pub fn spawn(wake: Arc<Notify>) -> std::io::Result<Arc<CpusetTrigger>> {
        let mut ino = Inotify::init()?;
        let t = Arc::new(CpusetTrigger {
            watches: Mutex::new((ino.watches(), BTreeMap::new())),
        });
        std::thread::Builder::new()
            .name("cpuset-trigger".into())
            .spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                loop {
                    let events = match ino.read_events_blocking(&mut buf) {
                        Ok(e) => e,
                        Err(e) => {
                            tracing::warn!(error = %e, "cpuset trigger stopped; rounds run on the period only");
                            return;
                        }
                    };
                    let mut any = false;
                    for ev in events {
                        any |= ev.mask.contains(EventMask::MODIFY)
                            || ev.mask.contains(EventMask::Q_OVERFLOW);
                    }
                    if any {
                        wake.notify_one();
                    }
                }
            })?;
        Ok(t)
    }

    /// Watches exactly `files` (each a cgroup's `cpuset.cpus`): new ones added, others
    /// removed. A file that cannot be watched (the cgroup just vanished) is skipped.
    pub fn watch(&self, files: impl IntoIterator<Item = PathBuf>) {
        let want: std::collections::BTreeSet<PathBuf> = files.into_iter().collect();
        let mut g = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        let (watches, have) = &mut *g;
        let gone: Vec<PathBuf> = have
            .keys()
            .filter(|p| !want.contains(*p))
            .cloned()
            .collect();
        for p in gone {
            if let Some(wd) = have.remove(&p) {
                let _ = watches.remove(wd); // fails harmlessly when the file is already gone
            }
        }
        for p in want {
            if have.contains_key(&p) {
                continue;
            }
            if let Ok(wd) = watches.add(&p, WatchMask::MODIFY) {
                have.insert(p, wd);
            }
        }
    }

    /// Files watched now.
    pub fn watched(&self) -> usize {
        self.watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A write to a watched cpuset.cpus wakes the loop; after `watch` drops it, a write does not.
    #[test]
    fn a_write_to_a_watched_cpuset_wakes_the_loop() {
        let dir = std::env::temp_dir().join(format!("rb-trigger-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::create_dir_all(dir.join("b")).unwrap();
        let (fa, fb) = (dir.join("a/cpuset.cpus"), dir.join("b/cpuset.cpus"));
        std::fs::write(&fa, "0-3\n").unwrap();
        std::fs::write(&fb, "0-3\n").unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let wake = Arc::new(Notify::new());
        let t = CpusetTrigger::spawn(wake.clone()).unwrap();
        t.watch([fa.clone(), fb.clone(), dir.join("gone/cpuset.cpus")]);
        assert_eq!(t.watched(), 2, "a missing file is skipped");
        let woken = |f: &PathBuf| {
            std::fs::write(f, "0-1\n").unwrap();
            rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(10), wake.notified())
                    .await
                    .is_ok()
            })
        };
        assert!(
            woken(&fa),
            "the operator's write to a's cpuset.cpus woke nobody"
        );
        assert!(woken(&fb));
        t.watch([fb.clone()]);
        assert_eq!(t.watched(), 1);
        // One write may come as two events (truncate, write): drop a wake-up still pending.
        std::thread::sleep(Duration::from_millis(300));
        rt.block_on(async {
            let _ = tokio::time::timeout(Duration::from_millis(1), wake.notified()).await;
        });
        // a is no longer watched: its write must not wake.
        std::fs::write(&fa, "2-3\n").unwrap();
        let stray = rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(500), wake.notified())
                .await
                .is_ok()
        });
        assert!(!stray, "a write to an unwatched file woke the loop");
        assert!(woken(&fb), "b still wakes it");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
