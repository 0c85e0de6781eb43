//! Component health: each long-lived part of the daemon (the cgroup watcher, the checkpointer,
//! the round loop, later the NRI connection) registers here and holds a [`Reporter`]. A
//! component is dead when its reporter is dropped without [`Reporter::stopped`] — the thread
//! returned, or panicked (unwinding drops it) — or, for a component registered with a maximum
//! silence, when it has not called [`Reporter::beat`] for that long. `/healthz` answers 503 naming
//! every dead component, `rebalancer_component_up{component}` shows 1/0, and the daemon's main
//! loop exits non-zero once a component has been dead for [`EXIT_AFTER`] so that systemd or the
//! DaemonSet restarts it (a restart reconciles from the live cgroups).
//!
//! A component that works but cannot do all of its job (the NodeResourceTopology exporter
//! while the API server is down or refuses) is *degraded*: named with its reason in `/healthz`
//! (still 200: restarting the daemon would not help) and `rebalancer_component_degraded`.
//!
//! No I/O; the lock is held only to read or flip a few fields.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use prometheus_client::metrics::{family::Family, gauge::Gauge};

use crate::serve::metrics::ComponentLabel;

/// How long a component may stay dead before the daemon exits non-zero to be restarted.
pub const EXIT_AFTER: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Running,
    /// Stopped on purpose (daemon shutdown): not a failure.
    Stopped,
    Dead {
        reason: String,
        since: Instant,
    },
    /// Not doing its job but still working around it (see [`Reporter::failing`]): unhealthy,
    /// yet no reason to restart the daemon.
    Failing {
        reason: String,
        since: Instant,
    },
}

#[derive(Debug)]
struct Component {
    state: State,
    last_beat: Instant,
    max_silence: Option<Duration>,
    /// Working, but not fully: why.
    degraded: Option<String>,
}

/// The registry, cheap to clone.
#[derive(Clone, Default)]
pub struct Health {
    inner: Arc<Mutex<BTreeMap<String, Component>>>,
    up: Family<ComponentLabel, Gauge>,
    degraded: Family<ComponentLabel, Gauge>,
}

/// A dead component: its name, why, and for how long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dead {
    pub component: String,
    pub reason: String,
    pub for_: Duration,
    /// Whether a restart is the cure (false: a failing component that works around it, where
    /// a restart would fail the same way).
    pub restart: bool,
}

impl Health {
    /// A registry exporting `rebalancer_component_up` through `up`.
    pub fn new(
        up: Family<ComponentLabel, Gauge>,
        degraded: Family<ComponentLabel, Gauge>,
    ) -> Health {
        Health {
            inner: Default::default(),
            up,
            degraded,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Component>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `name` as running. With `max_silence`, it must [`Reporter::beat`] at least
    /// that often.
    pub fn register(&self, name: &str, max_silence: Option<Duration>) -> Reporter {
        self.lock().insert(
            name.to_string(),
            Component {
                state: State::Running,
                last_beat: Instant::now(),
                max_silence,
                degraded: None,
            },
        );
        self.set_up(name, true);
        Reporter {
            health: self.clone(),
            name: name.to_string(),
            done: false,
        }
    }

    fn set_up(&self, name: &str, up: bool) {
        self.up
            .get_or_create(&ComponentLabel {
                component: name.to_string(),
            })
            .set(up as i64);
    }

    fn mark(&self, name: &str, state: State) {
        let dead = matches!(state, State::Dead { .. });
        if let Some(c) = self.lock().get_mut(name) {
            if matches!(c.state, State::Dead { .. }) {
                return;
            }
            c.state = state;
        }
        if dead {
            self.set_up(name, false);
        }
    }

    /// Every dead component now (silent ones included), and refreshes the gauges.
    pub fn dead(&self) -> Vec<Dead> {
        self.dead_at(Instant::now())
    }

    /// [`Health::dead`] as seen at `now` (tests: the silence without sleeping).
    fn dead_at(&self, now: Instant) -> Vec<Dead> {
        let out: Vec<Dead> = self
            .lock()
            .iter()
            .filter_map(|(name, c)| match &c.state {
                State::Dead { reason, since } => Some(Dead {
                    component: name.clone(),
                    reason: reason.clone(),
                    for_: now.duration_since(*since),
                    restart: true,
                }),
                State::Failing { reason, since } => Some(Dead {
                    component: name.clone(),
                    reason: reason.clone(),
                    for_: now.duration_since(*since),
                    restart: false,
                }),
                State::Running => {
                    let silent = now.duration_since(c.last_beat);
                    c.max_silence.filter(|m| silent > *m).map(|m| Dead {
                        component: name.clone(),
                        reason: format!("no progress for {silent:.1?} (limit {m:?})"),
                        for_: silent - m,
                        restart: true,
                    })
                }
                State::Stopped => None,
            })
            .collect();
        for (name, _) in self.lock().iter() {
            self.set_up(name, !out.iter().any(|d| &d.component == name));
        }
        out
    }

    /// The maximum silence `name` is registered with.
    #[cfg(test)]
    pub(crate) fn max_silence(&self, name: &str) -> Option<Duration> {
        self.lock().get(name).and_then(|c| c.max_silence)
    }

    /// Every degraded component and why.
    pub fn degraded(&self) -> Vec<(String, String)> {
        self.lock()
            .iter()
            .filter_map(|(n, c)| Some((n.clone(), c.degraded.clone()?)))
            .collect()
    }

    /// The `/healthz` answer: `Ok("ok\n")` (followed by the degraded components and why), or
    /// `Err(text naming each dead component)`.
    pub fn report(&self) -> Result<String, String> {
        let dead = self.dead();
        if dead.is_empty() {
            let mut s = String::from("ok\n");
            for (name, reason) in self.degraded() {
                s.push_str(&format!("degraded: {name}: {reason}\n"));
            }
            return Ok(s);
        }
        let mut s = String::from("unhealthy:\n");
        for d in dead {
            s.push_str(&format!("{}: {}\n", d.component, d.reason));
        }
        Err(s)
    }
}

/// Held by a component for its lifetime. Dropping it without [`Reporter::stopped`] marks the
/// component dead ("panicked" while unwinding, else "exited").
pub struct Reporter {
    health: Health,
    name: String,
    done: bool,
}

impl Reporter {
    /// Progress: resets the silence clock.
    pub fn beat(&self) {
        if let Some(c) = self.health.lock().get_mut(&self.name) {
            c.last_beat = Instant::now();
        }
    }

    /// Working but not fully (`Some(why)`), or fully again (`None`).
    pub fn set_degraded(&self, why: Option<String>) {
        let on = why.is_some();
        if let Some(c) = self.health.lock().get_mut(&self.name) {
            c.degraded = why;
        }
        self.health
            .degraded
            .get_or_create(&ComponentLabel {
                component: self.name.clone(),
            })
            .set(on as i64);
    }

    /// A new maximum silence (the component's pace changed, e.g. a reloaded period).
    pub fn set_max_silence(&self, max_silence: Option<Duration>) {
        if let Some(c) = self.health.lock().get_mut(&self.name) {
            c.max_silence = max_silence;
        }
    }

    /// The component fails for `reason` but keeps running a fallback (unhealthy in /healthz,
    /// never a restart: the cause is outside the daemon). A new reason replaces the old one.
    pub fn failing(&self, reason: impl Into<String>) {
        let reason = reason.into();
        if let Some(c) = self.health.lock().get_mut(&self.name) {
            match &mut c.state {
                State::Failing { reason: r, .. } => *r = reason,
                State::Running => {
                    c.state = State::Failing {
                        reason,
                        since: Instant::now(),
                    }
                }
                State::Dead { .. } | State::Stopped => {}
            }
        }
        self.health.set_up(&self.name, false);
    }

    /// A failing component works again.
    pub fn recovered(&self) {
        let mut up = false;
        if let Some(c) = self.health.lock().get_mut(&self.name) {
            if matches!(c.state, State::Failing { .. }) {
                c.state = State::Running;
            }
            up = c.state == State::Running;
        }
        if up {
            self.health.set_up(&self.name, true);
        }
    }

    /// The component failed and stops: dead with `reason`.
    pub fn failed(mut self, reason: impl Into<String>) {
        self.done = true;
        self.health.mark(
            &self.name,
            State::Dead {
                reason: reason.into(),
                since: Instant::now(),
            },
        );
    }

    /// The component stops on purpose (shutdown).
    pub fn stopped(mut self) {
        self.done = true;
        self.health.mark(&self.name, State::Stopped);
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let reason = if std::thread::panicking() {
            "thread panicked"
        } else {
            "thread exited"
        };
        self.health.mark(
            &self.name,
            State::Dead {
                reason: reason.into(),
                since: Instant::now(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(h: &Health, name: &str) -> i64 {
        h.up.get_or_create(&ComponentLabel {
            component: name.into(),
        })
        .get()
    }

    /// A failing component (a fallback running) is unhealthy with its reason, but not one a
    /// restart cures; recovered, it is healthy again. A dead one stays dead.
    #[test]
    fn a_failing_component_is_unhealthy_but_no_restart_and_recovers() {
        let h = Health::default();
        let r = h.register("inotify", None);
        r.failing("no inotify instance left");
        let d = h.dead();
        assert_eq!(d.len(), 1);
        assert!(!d[0].restart);
        assert_eq!(up(&h, "inotify"), 0);
        let text = h.report().unwrap_err();
        assert!(text.contains("inotify: no inotify instance left"), "{text}");
        r.failing("no inotify watch left");
        assert!(h.report().unwrap_err().contains("watch left"));
        r.recovered();
        assert_eq!(h.report(), Ok("ok\n".into()));
        assert_eq!(up(&h, "inotify"), 1);
        let k = h.register("watcher", None);
        drop(k);
        assert!(h.dead()[0].restart);
        let k = h.register("watcher", None);
        k.failed("gone");
        assert!(h.dead().iter().all(|d| d.restart));
    }

    #[test]
    fn a_panicked_or_returned_thread_is_dead_and_named() {
        let h = Health::default();
        let r = h.register("watcher", None);
        let c = h.register("checkpointer", None);
        assert_eq!(h.report(), Ok("ok\n".into()));
        assert_eq!(up(&h, "watcher"), 1);
        let t = std::thread::spawn(move || {
            let _r = r;
            panic!("boom");
        });
        assert!(t.join().is_err());
        std::thread::spawn(move || drop(c)).join().unwrap();
        let text = h.report().unwrap_err();
        assert!(text.contains("watcher: thread panicked"), "{text}");
        assert!(text.contains("checkpointer: thread exited"), "{text}");
        assert_eq!(up(&h, "watcher"), 0);
        assert_eq!(up(&h, "checkpointer"), 0);
    }

    #[test]
    fn silence_past_the_limit_is_death_and_stopping_is_not() {
        // Seen at chosen instants: no sleep, so no preemption between a beat and
        // a look can pass for silence, and the silence is real however slow the machine.
        let ms = Duration::from_millis;
        let h = Health::default();
        let r = h.register("rounds", Some(ms(30)));
        let before = Instant::now();
        r.beat();
        assert!(h.dead_at(before + ms(29)).is_empty());
        // More than 30 ms after the beat.
        let d = h.dead_at(Instant::now() + ms(31));
        assert_eq!(d.len(), 1);
        assert!(d[0].reason.contains("no progress"), "{:?}", d);
        assert_eq!(up(&h, "rounds"), 0);
        let before = Instant::now();
        r.beat();
        assert!(h.dead_at(before + ms(29)).is_empty());
        assert_eq!(up(&h, "rounds"), 1);
        r.stopped();
        assert!(h.dead_at(Instant::now() + ms(60)).is_empty());
        assert!(h.dead().is_empty());
        let k = h.register("kubernetes", None);
        k.set_degraded(Some("API server: connection refused".into()));
        assert_eq!(
            h.report(),
            Ok("ok\ndegraded: kubernetes: API server: connection refused\n".into())
        );
        assert_eq!(up(&h, "kubernetes"), 1);
        k.set_degraded(None);
        assert_eq!(h.report(), Ok("ok\n".into()));
        k.stopped();
        h.register("nri", None).failed("connection lost");
        assert_eq!(
            h.report().unwrap_err(),
            "unhealthy:\nnri: connection lost\n"
        );
    }
}
