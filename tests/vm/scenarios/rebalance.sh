# Scenario rebalance: with kernel.numa_balancing=0 and the daemon running, a process whose memory
# is on one node while its cgroup's CPUs are on another ends >= 95% local (pages on the nodes where
# its threads may run): the move is queued within 3 control periods of the daemon's first round
# (by its 4th round, counted in the debug log: a round counter, not wall time, so neither the
# start-up under emulation nor the emulated migration's speed is measured), and once it is
# applied the workload is >= 95% local; pages migrated are counted (/proc/vmstat
# pgmigrate_success and the cgroup's memory.numa_stat). The control run (no daemon: nothing
# moves) is scenario rebalance-control. SKIPs until `rebalancer explain` exists.
. /vm/lib.sh
. /vm/topology.env
S=rebalance
require_subcommand $S explain || exit 0
PERIOD_MS=2000
MAX_ROUNDS=4   # the first round and the 3 periods after it
# Guards only (the verdict comes before the guest's timeout): the start-up under emulation (eBPF
# load, BTF parse) and the emulated migration of 256 MiB.
STARTUP_MAX_S=80
APPLY_MAX_S=80
from=$(last_cpu_node)
to=$(first_cpu_node)
cg=/sys/fs/cgroup/vmtest-rb
echo 0 > /proc/sys/kernel/numa_balancing

# The workload: 256 MiB first-touched on node $from, then it moves itself to node $to and keeps
# touching its memory; an operator confines its cgroup to node $to's CPUs.
remote_hog $S "$cg" 256 "$from" "$to" /tmp/rb-hog.out || exit 0
hog=$HOG
before=$(guest-tool locality --pid $hog | grep '^LOCALITY')
echo "# before the daemon: $before; cpuset.cpus=$(cat $cg/cpuset.cpus.effective) mems=$(cat $cg/cpuset.mems.effective)"
if fgt "$(kv local "$before")" 0.05; then
    verdict $S FAIL "the workload was already local before the daemon started: $before"; exit 0
fi

cat > /tmp/rb.toml <<CONF
[daemon]
state_dir = "/tmp/rb-state"
[cgroups]
roots = ["vmtest-rb"]
kubernetes = false
[controller]
period_ms = $PERIOD_MS
[server]
socket = "/run/rebalancer/rebalancer.sock"
metrics_listen = "127.0.0.1:9717"
CONF
mig0=$(awk '/^pgmigrate_success /{print $2}' /proc/vmstat)
t0=$(uptime_s)
LOG=/tmp/rb-daemon.log
RUST_LOG=rebalancer=debug rebalancer run --config /tmp/rb.toml > $LOG 2>&1 &
daemon=$!
started=yes
first_round $LOG $daemon $STARTUP_MAX_S || started=no
echo "# first round $(since "$t0") s after the daemon's start"
reached=none
while [ $started = yes ]; do
    now=$(since "$ROUND0")
    loc=$(guest-tool locality --pid $hog | grep '^LOCALITY')
    echo "# t=${now}s after the first round: $loc cpus=$(cat $cg/cpuset.cpus.effective) mems=$(cat $cg/cpuset.mems.effective)"
    if grep -q 'move applied cgroup=vmtest-rb ' $LOG; then
        # Applied: the workload must be local now (one more look lets the last pages settle).
        fgt "$(kv local "$loc")" 0.9499 && { reached=$now; break; }
        [ "${applied_seen:-}" = yes ] && break
        applied_seen=yes
    fi
    fgt "$now" "$APPLY_MAX_S" && break
    kill -0 $daemon 2>/dev/null || break
    sleep 1
done
# The rounds up to and including the first that queued a move (there is one managed cgroup).
queued_in=$(rounds_of $LOG | awk '$1 == "round" { n++; if ($2 > 0) { print n; exit } }')
mig=$(( $(awk '/^pgmigrate_success /{print $2}' /proc/vmstat) - mig0 ))
echo "# daemon log (tail):"; tail -30 $LOG
echo "# rebalancer explain vmtest-rb:"; rebalancer explain vmtest-rb 2>&1 | head -80
echo "# memory.numa_stat anon: $(grep '^anon ' $cg/memory.numa_stat)"
alive=yes; kill -0 $daemon 2>/dev/null || alive=no
kill $daemon 2>/dev/null
cpus=$(cat $cg/cpuset.cpus.effective)
[ -n "$cpus" ] || { verdict $S FAIL "the workload's cgroup was left with an empty cpuset"; exit 0; }
if [ "$alive" = no ]; then
    verdict $S FAIL "the daemon exited: $(tail -1 $LOG)"; exit 0
fi
[ $started = yes ] || { verdict $S FAIL "no round within $STARTUP_MAX_S s of the daemon's start"; exit 0; }
if [ -z "$queued_in" ] || [ "$queued_in" -gt $MAX_ROUNDS ]; then
    verdict $S FAIL "no move queued by round $MAX_ROUNDS (the first round + 3 periods of $PERIOD_MS ms): queued by round '$queued_in' of $(rounds_of $LOG | grep -c '^round'); $loc, pgmigrate +$mig"
    exit 0
fi
if [ "$reached" = none ]; then
    verdict $S FAIL "not 95% local once the move was applied (or not applied within $APPLY_MAX_S s of the first round): $loc, pgmigrate +$mig"
    exit 0
fi
verdict $S PASS "move queued by round $queued_in (limit $MAX_ROUNDS: the first round + 3 x $PERIOD_MS ms), 95% local ${reached} s after the first round once applied: $loc, cpus=$cpus mems=$(cat $cg/cpuset.mems.effective), pgmigrate +$mig"
