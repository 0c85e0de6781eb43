# Scenario hotset: a workload whose hot pages are a minority of its memory — 32 MiB written on a
# remote node, 224 MiB cold on the local one — fixed by the daemon alone with its embedded
# defaults (a config that names only the cgroup root, the socket and the state directory), no
# later than the kernel's AutoNUMA in the same boot. Two runs of a fresh workload:
#   1. AutoNUMA alone (numa_balancing=1, no daemon);
#   2. the daemon alone (numa_balancing=0), started before the workload as a service is.
# Each run's time is the workload's own: from when it starts writing from its CPUs' node to
# the first report of 95% of the pages it writes local (the truth it knows). FAIL when the
# daemon never gets there, gets there later than AutoNUMA, or moves more than twice the hot set.
# Rows "ROW cond=… fixed_s=… moved=…" feed BENCHMARKS.md.
. /vm/lib.sh
. /vm/topology.env
S=hotset
require_subcommand $S explain || exit 0
LIMIT=60
HOT_PAGES=8192
hot=$(last_cpu_node)
run=$(first_cpu_node)
cg=$CG/vmtest-hot
out=/tmp/hs-work.out
log=/tmp/hs-daemon.log
vmstat() { awk -v k="$1" '$1 == k {print $2}' /proc/vmstat; }

# The embedded defaults: nothing under [controller], [ebpf] or [policy].
cat > /tmp/hs.toml <<CONF
[daemon]
state_dir = "/tmp/hs-state"
[cgroups]
roots = ["vmtest-hot"]
kubernetes = false
[server]
socket = "$SOCK"
metrics_listen = "127.0.0.1:9717"
CONF

# start_work: a fresh workload in $cg (its CPUs on every node while it allocates), then confined
# to node $run's CPUs as an operator would.
start_work() {
    mkdir -p "$cg" || { verdict $S FAIL "cannot create $cg"; exit 0; }
    cat $CG/cpuset.cpus.effective > "$cg"/cpuset.cpus
    cat $CG/cpuset.mems.effective > "$cg"/cpuset.mems
    # Emptied first: the wait below must not see the last run's reports (and pin before this
    # workload has allocated, which makes it fail).
    : > $out
    sh -c "echo \$\$ > $cg/cgroup.procs && exec guest-tool hotset --hot-mib 32 --hot-node $hot --cold-mib 224 --cold-node $run --run-node $run --seconds 900 --interval-ms 500" > $out 2>&1 &
    WORK=$!
    _i=0
    until grep -q '^HOTSET' $out; do
        sleep 0.5; _i=$((_i + 1))
        [ $_i -lt 240 ] || { cat $out; verdict $S FAIL "the workload never started writing"; exit 0; }
    done
    cpus_of "$run" > "$cg"/cpuset.cpus
    echo "# pinned at $(date -u +%T) uptime $(uptime_s) ($(grep '^HOTSET' $out | tail -1))"
}
stop_work() {
    kill -9 $WORK 2>/dev/null
    _i=0
    while [ -d /proc/$WORK ] && [ $_i -lt 60 ]; do sleep 0.5; _i=$((_i + 1)); done
}
# await COND: waits (on the workload's clock, at most LIMIT s) for 95% of the written pages local;
# sets FIXED (seconds or none), MOVED (pages migrated since the workload started writing) and
# prints the ROW.
await() {
    _m0=$1
    FIXED=none
    while :; do
        _l=$(grep '^HOTSET' $out | tail -1)
        _t=$(kv t "$_l")
        # The first report at 95%, not the last one seen by this poll (it polls every 0.5 s,
        # as the workload reports: the report that got there may already be behind another).
        if fgt "$(kv truth "$_l")" 0.9499; then
            FIXED=$(awk '/^HOTSET/ { t = $2; u = $3; sub("t=", "", t); sub("truth=", "", u);
                                     if (u + 0 > 0.9499) { print t; exit } }' $out)
            break
        fi
        fgt "$_t" $LIMIT && break
        kill -0 $WORK 2>/dev/null || { echo "# the workload exited"; break; }
        [ -z "$DAEMON" ] || kill -0 $DAEMON 2>/dev/null || break
        sleep 0.5
    done
    MOVED=$(( $(vmstat pgmigrate_success) - _m0 ))
    echo "ROW cond=$2 fixed_s=$FIXED moved=$MOVED last: $(grep '^HOTSET' $out | tail -1)"
}

# 1. AutoNUMA alone.
DAEMON=
echo 1 > /proc/sys/kernel/numa_balancing
m0=$(vmstat pgmigrate_success)
start_work
echo "# autonuma: $(grep '^HOTSET' $out | head -1); cpus=$(cat $cg/cpuset.cpus.effective)"
await "$m0" autonuma
an_fixed=$FIXED; an_moved=$MOVED
stop_work
echo 0 > /proc/sys/kernel/numa_balancing

# 2. The daemon alone, with its defaults.
RUST_LOG=rebalancer=debug start_daemon /tmp/hs.toml $log || { tail -20 $log; verdict $S FAIL "daemon did not start"; exit 0; }
echo "# daemon up after ${DAEMON_UP} s; sources:"
rebalancer status --json | tr '{' '\n' | grep -E 'dram_access|numa_faults|written_pages' | cut -c1-300
m0=$(vmstat pgmigrate_success)
start_work
echo "# rebalancer: $(grep '^HOTSET' $out | head -1); cpus=$(cat $cg/cpuset.cpus.effective)"
await "$m0" rebalancer
rb_fixed=$FIXED; rb_moved=$MOVED
echo "# the workload's reports:"; grep '^HOTSET' $out | head -12
kill -0 $DAEMON 2>/dev/null || fail_exit=yes
rebalancer explain vmtest-hot 2>&1 | head -40
# The daemon's timeline from the pin on (debug log): rounds, reads of written pages, the move's
# parts (page moves, the narrowing write).
echo "# daemon log (rounds, written pages, moves):"
grep -e 'round start' -e 'round done' -e 'brought forward' -e 'written' -e 'move' -e 'migrate_pages' \
    $log | tail -40 | cut -c1-400
stop_work
kill $DAEMON 2>/dev/null

summary="daemon alone (defaults): ${rb_fixed} s, $rb_moved pages moved; AutoNUMA alone: ${an_fixed} s, $an_moved pages moved (hot set $HOT_PAGES pages, limit $LIMIT s)"
[ -z "$fail_exit" ] || { verdict $S FAIL "the daemon exited: $summary"; exit 0; }
[ "$rb_fixed" != none ] || { verdict $S FAIL "the daemon did not make the hot set local: $summary"; exit 0; }
if [ "$an_fixed" != none ] && fgt "$rb_fixed" "$an_fixed"; then
    verdict $S FAIL "the daemon is later than AutoNUMA: $summary"; exit 0
fi
[ "$rb_moved" -le $((2 * HOT_PAGES)) ] || { verdict $S FAIL "moved more than twice the hot set: $summary"; exit 0; }
verdict $S PASS "$summary"
