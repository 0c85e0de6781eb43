# Scenario consolidate: a BestEffort container (the watcher gives it the whole shared pool) runs
# threads that sleep and wake and move themselves round every node (as a work-stealing runtime
# might: a node its cpuset no longer allows is skipped) while its memory sits on one: the daemon (eBPF on)
# counts its cross-node migrations, consolidates its CPUs onto the memory's node, and the sampled
# cross-node migrations fall. Before: 3 periods in dry run; after: 3 periods once it acted.
. /vm/lib.sh
. /vm/topology.env
S=consolidate
require_subcommand $S explain || exit 0
PERIOD_MS=2000
LOG=/tmp/con-daemon.log
mem=$(first_cpu_node)
fail() { kill -9 $WORK 2>/dev/null; daemon_fail $S $LOG "$*"; }
# conf DRY_RUN: the Kubernetes-layout config, eBPF on.
conf() {
    kube_conf /tmp/con.base /tmp/con-state $PERIOD_MS
    awk -v d="$1" '/^enabled = false/ {print "enabled = true"; next} {print} /^\[daemon\]/ {print "dry_run = " d}' /tmp/con.base > /tmp/con.toml
}
echo 0 > /proc/sys/kernel/numa_balancing
kdir kubepods/besteffort || { verdict $S FAIL "cannot make the kubepods QoS cgroups"; exit 0; }
conf true
start_daemon /tmp/con.toml $LOG || { tail -20 $LOG; verdict $S FAIL "the daemon did not start"; exit 0; }
kdir kubepods/besteffort/pod5e000000-0000-4000-8000-000000000001 || fail "cannot make the pod cgroup"
D=$CG/kubepods/besteffort/pod5e000000-0000-4000-8000-000000000001/$(cid 5)
rel=${D#$CG/}
out=$(guest-tool mkcg --dir "$D") || fail "mkcg failed: $out"
echo "# container: $out"
spread=$(cat "$D"/cpuset.cpus.effective)
[ -n "$(common "$spread" "$(cpus_of "$(last_cpu_node)")")" ] || fail "BestEffort container not spread: cpus=$spread"
# Threads that sleep and wake (placed anew at each wakeup), 64 MiB on node $mem.
sh -c "echo \$\$ > $D/cgroup.procs && exec guest-tool spin --threads $NCPUS --seconds 900 --sleep-us 2000 --flip-nodes $(echo $CPU_NODES | tr ' ' ',') --flip-ms 100 --mib 64 --mem-node $mem" > /tmp/con-spin.out 2>&1 &
WORK=$!
_i=0
until grep -q SPIN-ALLOCATED /tmp/con-spin.out; do
    sleep 0.5; _i=$((_i + 1)); [ $_i -lt 120 ] || fail "the workload never allocated"
done
crossings() { wget -qO- http://127.0.0.1:9717/metrics | awk '/^rebalancer_cross_node_migrations_total /{print $2}'; }
[ -n "$(crossings)" ] || fail "no rebalancer_cross_node_migrations_total in /metrics"
rebalancer status --json | tr '{' '\n' | grep -E 'sched_migrate_task' | cut -c1-200
# rate SECONDS: cross-node migrations per second the daemon sampled over that long.
rate() {
    _a=$(crossings); _t=$(uptime_s); sleep "$1"
    _b=$(crossings)
    awk -v a="$_a" -v b="$_b" -v t0="$_t" -v t1="$(uptime_s)" 'BEGIN{printf "%.1f", (b - a) / (t1 - t0)}'
}
sleep $((2 * PERIOD_MS / 1000))
before=$(rate $((3 * PERIOD_MS / 1000)))
echo "# before: cpus=$(cat "$D"/cpuset.cpus.effective) mems=$(cat "$D"/cpuset.mems.effective) cross-node migrations ${before}/s"
rebalancer explain "$rel" 2>&1 | head -60

conf false; kill -HUP $DAEMON
t0=$(uptime_s)
moved=none
while :; do
    c=$(cat "$D"/cpuset.cpus.effective)
    if [ -z "$(common "$c" "$(cpus_of "$(last_cpu_node)")")" ]; then moved=$(since "$t0"); break; fi
    fgt "$(since "$t0")" 30 && break
    kill -0 $DAEMON 2>/dev/null || fail "the daemon exited"
    sleep 1
done
[ "$moved" != none ] || fail "not consolidated within 30 s: cpus=$c; before ${before}/s"
sleep $((PERIOD_MS / 1000))
after=$(rate $((3 * PERIOD_MS / 1000)))
cpus=$(cat "$D"/cpuset.cpus.effective); mems=$(cat "$D"/cpuset.mems.effective)
echo "# after: cpus=$cpus mems=$mems cross-node migrations ${after}/s"
echo "# moves: $(wget -qO- http://127.0.0.1:9717/metrics | grep -E '^rebalancer_(moves_applied|moves_by_evidence)')"
kill $DAEMON 2>/dev/null
kill -9 $WORK 2>/dev/null
[ -n "$cpus" ] || { verdict $S FAIL "empty cpuset after the move"; exit 0; }
fgt "$before" 10 || { verdict $S FAIL "too few cross-node migrations before the move to judge (${before}/s)"; exit 0; }
fgt "$(awk -v b="$before" 'BEGIN{print b / 10}')" "$after" || { verdict $S FAIL "cross-node migrations did not fall tenfold: ${before}/s -> ${after}/s"; exit 0; }
verdict $S PASS "consolidated onto node $mem (cpus $spread -> $cpus, mems $mems) ${moved} s after acting; sampled cross-node migrations ${before}/s -> ${after}/s"
