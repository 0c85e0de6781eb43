# Scenario rebalance: with kernel.numa_balancing=0 and the daemon running, a process whose memory
# is on one node while its cgroup's CPUs are on another ends >= 95% local (pages on the nodes where
# its threads may run) within 3 control periods of the daemon's first round; pages migrated are
# counted (/proc/vmstat pgmigrate_success and the cgroup's memory.numa_stat). The control run
# (no daemon: nothing moves) is scenario rebalance-control. SKIPs until `rebalancer explain` exists.
. /vm/lib.sh
. /vm/topology.env
S=rebalance
need_subcommand $S explain "issue 5, the controller" || exit 0
PERIOD_MS=2000
STARTUP_S=40   # daemon start under emulation (eBPF load, BTF parse) before its first round
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
RUST_LOG=rebalancer=debug rebalancer run --config /tmp/rb.toml > /tmp/rb-daemon.log 2>&1 &
daemon=$!
limit=$(awk -v s=$STARTUP_S -v p=$PERIOD_MS 'BEGIN{print s + 3 * p / 1000}')
reached=none
while :; do
    now=$(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN{printf "%.1f", b - a}')
    loc=$(guest-tool locality --pid $hog | grep '^LOCALITY')
    echo "# t=${now}s $loc cpus=$(cat $cg/cpuset.cpus.effective) mems=$(cat $cg/cpuset.mems.effective)"
    if fgt "$(kv local "$loc")" 0.9499; then reached=$now; break; fi
    fgt "$now" "$limit" && break
    kill -0 $daemon 2>/dev/null || break
    sleep 1
done
mig=$(( $(awk '/^pgmigrate_success /{print $2}' /proc/vmstat) - mig0 ))
echo "# daemon log (tail):"; tail -30 /tmp/rb-daemon.log
echo "# rebalancer explain vmtest-rb:"; rebalancer explain vmtest-rb 2>&1 | head -80
echo "# memory.numa_stat anon: $(grep '^anon ' $cg/memory.numa_stat)"
alive=yes; kill -0 $daemon 2>/dev/null || alive=no
kill $daemon 2>/dev/null
cpus=$(cat $cg/cpuset.cpus.effective)
[ -n "$cpus" ] || { verdict $S FAIL "the workload's cgroup was left with an empty cpuset"; exit 0; }
if [ "$alive" = no ]; then
    verdict $S FAIL "the daemon exited: $(tail -1 /tmp/rb-daemon.log)"; exit 0
fi
if [ "$reached" = none ]; then
    verdict $S FAIL "not 95% local within ${limit} s of the daemon's start ($STARTUP_S s start-up + 3 periods of $PERIOD_MS ms): $loc, pgmigrate +$mig"
    exit 0
fi
verdict $S PASS "95% local ${reached} s after the daemon started (limit ${limit} s = $STARTUP_S s start-up + 3 x $PERIOD_MS ms): $loc, cpus=$cpus mems=$(cat $cg/cpuset.mems.effective), pgmigrate +$mig"
