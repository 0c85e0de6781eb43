# Scenario hotplug: CPU hotplug must not leave the daemon's eBPF sampler blind. A spinner in a
# managed cgroup pinned (cpuset) to the last CPU of the last CPU node is seen by the daemon
# (`rebalancer top --json`: its on-CPU time, in CPUs, and its share on that node, from the
# cpu-clock samples); that CPU goes offline (the daemon rebuilds its topology; the spinner runs
# elsewhere meanwhile) and online again (rebuilt again; the cpuset puts the spinner back). The
# kernel drops a CPU's perf events when it goes offline and never brings them back, so the
# spinner must be seen there again only because the daemon opened new ones: PASS when, 3 rounds
# after the second rebuild, its on-CPU time is >= 0.5 CPU and >= 90% of it on that node.
# Part hotplug/quick: offline and back at once (likely between two topology checks: no
# cpu/online change seen), the spinner must be seen again within 10 rounds (the sampler finds
# the CPU's count standing still and reopens its events). SKIP when the CPU cannot go offline.
. /vm/lib.sh
. /vm/topology.env
S=hotplug
PERIOD_MS=2000
STARTUP_MAX_S=90
node=$(last_cpu_node)
cpu=$(ids "$(cpus_of "$node")" | tail -1)
online=/sys/devices/system/cpu/cpu$cpu/online
if [ "$cpu" = 0 ] || [ ! -w "$online" ]; then
    verdict $S SKIP "cpu$cpu cannot be taken offline (no $online: kernel without CONFIG_HOTPLUG_CPU, or the boot CPU)"
    exit 0
fi
# Whatever happens, the next scenario gets its CPU back.
trap 'echo 1 > $online 2>/dev/null' EXIT TERM INT
cg=$CG/vmtest-hp
log=/tmp/hp-daemon.log
mkdir "$cg" || { verdict $S FAIL "cannot create $cg"; exit 0; }
echo "$cpu" > "$cg"/cpuset.cpus
echo "$node" > "$cg"/cpuset.mems
sh -c "echo \$\$ > $cg/cgroup.procs && exec guest-tool spin --threads 1 --seconds 900" &
cat > /tmp/hp.toml <<CONF
[daemon]
state_dir = "/tmp/hp-state"
dry_run = true
[cgroups]
roots = ["vmtest-hp"]
kubernetes = false
[controller]
period_ms = $PERIOD_MS
autonuma = "leave"
[server]
socket = "$SOCK"
metrics_listen = "127.0.0.1:9717"
CONF
start_daemon /tmp/hp.toml $log || { tail -30 $log; verdict $S FAIL "daemon did not start"; exit 0; }
CLOCK=$(rebalancer status --json | tr -d ' \n' | tr '{' '\n' | grep '"name":"on_cpu:cpu_clock"' | cut -c1-300)
echo "# daemon up after ${DAEMON_UP} s; cpu-clock source: $CLOCK"
# The subject is the perf events' reopening: without the cpu-clock sampler the /proc fallback
# would show the spinner as well and the scenario would prove nothing.
case "$CLOCK" in
    *'"available":true'*) ;;
    '') verdict $S FAIL "status lists no on_cpu:cpu_clock source"; exit 0 ;;
    *) verdict $S SKIP "the cpu-clock sampler is not attached in this guest: $CLOCK"; exit 0 ;;
esac

TOP= ROUNDS=0 WCPU=0 WSHARE=0
# look: the daemon's last round, flattened; sets TOP, ROUNDS, WCPU (CPUs) and WSHARE (share on
# $node) of the spinner's cgroup.
look() {
    TOP=$(rebalancer top --json 2>/dev/null | tr -d ' \n')
    ROUNDS=$(echo "$TOP" | sed -n 's/.*"rounds":\([0-9]*\).*/\1/p')
    WCPU=$(echo "$TOP" | sed -n 's/.*"cgroup":"[^"]*vmtest-hp"[^}]*"cpu":\([-0-9.eE+]*\).*/\1/p')
    _sh=$(echo "$TOP" | sed -n 's/.*"cgroup":"[^"]*vmtest-hp"[^}]*"cpu_share":{\([^}]*\)}.*/\1/p')
    WSHARE=$(echo "$_sh" | tr ',' '\n' | sed -n "s/^\"$node\":\([-0-9.eE+]*\)$/\1/p")
    ROUNDS=${ROUNDS:-0}; WCPU=${WCPU:-0}; WSHARE=${WSHARE:-0}
}
# rounds N: waits until the daemon has done N more rounds (at most 30 s each).
rounds() {
    look; _want=$((ROUNDS + $1)); _t=$(uptime_s)
    while [ "$ROUNDS" -lt $_want ]; do
        kill -0 $DAEMON 2>/dev/null || daemon_fail $S $log "the daemon exited"
        fgt "$(since "$_t")" $((30 * $1)) && daemon_fail $S $log "no round for a long time (at $ROUNDS, waiting for $_want)"
        sleep 0.5; look
    done
}
# rebuilt N: waits (at most 60 s) until the daemon logged N topology rebuilds.
rebuilt() {
    _t=$(uptime_s)
    until [ "$(grep -c 'topology rebuilt' $log)" -ge "$1" ]; do
        fgt "$(since "$_t")" 60 && daemon_fail $S $log "the daemon did not notice the hotplug (rebuilds logged: $(grep -c 'topology rebuilt' $log), wanted $1)"
        sleep 0.5
    done
}
seen() { echo "cpu=$WCPU share(node $node)=$WSHARE at round $ROUNDS"; }
sampled() { fgt "$WCPU" 0.5 && fgt "$WSHARE" 0.9; }
hotplug_log() { echo "# daemon log (hotplug):"; grep -E 'topology rebuilt|perf events|perf event on' $log | cut -c1-400; }

t0=$(uptime_s)
until [ "$ROUNDS" -ge 4 ]; do
    fgt "$(since "$t0")" $STARTUP_MAX_S && daemon_fail $S $log "fewer than 4 rounds in $STARTUP_MAX_S s"
    sleep 0.5; look
done
before=$(seen)
echo "# before: spinner on cpu$cpu (cpuset $(cat $cg/cpuset.cpus.effective)): $before"
sampled || daemon_fail $S $log "the spinner on cpu$cpu is not seen before any hotplug ($before): the setup is invalid"

echo 0 > "$online" || daemon_fail $S $log "cannot take cpu$cpu offline"
echo "# cpu$cpu offline: online=$(cat /sys/devices/system/cpu/online) cpuset.cpus.effective=$(cat $cg/cpuset.cpus.effective)"
rebuilt 1
rounds 2
offline="$(seen) (spinner on $(cat $cg/cpuset.cpus.effective))"
echo "# while offline: $offline"

echo 1 > "$online" || daemon_fail $S $log "cannot bring cpu$cpu online"
echo "# cpu$cpu online: online=$(cat /sys/devices/system/cpu/online) cpuset.cpus.effective=$(cat $cg/cpuset.cpus.effective)"
rebuilt 2
rounds 3
after=$(seen)
echo "# back online, 3 rounds after the rebuild: $after"
hotplug_log
if ! sampled; then
    verdict $S FAIL "cpu$cpu is not sampled after it came back online: before $before; offline $offline; after $after"
    kill -9 $DAEMON 2>/dev/null
    exit 0
fi
verdict $S PASS "cpu$cpu sampled again after offline/online: before $before; offline $offline; after $after"

# Part quick: offline and back at once.
n=$(grep -c 'topology rebuilt' $log)
echo 0 > "$online" && echo 1 > "$online" || daemon_fail $S $log "cannot toggle cpu$cpu"
echo "# cpu$cpu offline and online again at once"
# Seen in two rounds in a row (a round that began before the toggle may still count it).
i=0; ok=0
while [ $i -lt 10 ] && [ $ok -lt 2 ]; do
    rounds 1; i=$((i + 1))
    if sampled; then ok=$((ok + 1)); else ok=0; fi
done
quick=$(seen)
how="$(($(grep -c 'topology rebuilt' $log) - n)) topology rebuilds, $(grep -c 'perf events died' $log) dead-CPU findings"
hotplug_log
if [ $ok -ge 2 ]; then
    verdict $S/quick PASS "cpu$cpu sampled again $i rounds after a quick offline/online ($how): $quick"
else
    verdict $S/quick FAIL "cpu$cpu not sampled 10 rounds after a quick offline/online ($how): $quick"
fi
kill -9 $DAEMON 2>/dev/null
exit 0
