# Scenario rebalance-control: the control run of the rebalancing scenario.
# 1. kernel.numa_balancing=0, no daemon: a process first-touches 256 MiB on the last CPU node, then
#    its affinity moves to the first CPU node; after 8 s its pages must still be remote.
# 2. kernel.numa_balancing=1 (kernel AutoNUMA): the same process must end >= 95% local; the time
#    it took is recorded (the peer rebalancer is measured against).
. /vm/lib.sh
. /vm/topology.env
S=rebalance-control
MIB=256
from=$(last_cpu_node)
to=$(first_cpu_node)

hog() { # hog OUTFILE ARGS...: runs the guest tool's hog, output kept and shown
    f=$1; shift
    guest-tool hog --mib $MIB --from-node "$from" --to-node "$to" "$@" > "$f" 2>&1
    rc=$?
    cat "$f"
    res=$(grep '^HOG-RESULT' "$f")
    [ "$rc" = 0 ] && [ -n "$res" ]
}

echo 0 > /proc/sys/kernel/numa_balancing
echo "# control: numa_balancing=0, $MIB MiB first-touched on node $from, then moved to node $to"
if ! hog /tmp/control.out --seconds 8 --interval-ms 2000; then
    verdict $S FAIL "control hog failed: $(tail -1 /tmp/control.out)"; exit 0
fi
on_from=$(kv on_from "$res"); loc=$(kv local "$res"); moved=$(kv moved "$res"); pages=$(kv pages "$res")
mig=$(kv pgmigrate "$res")
if ! fgt "$on_from" 0.95; then
    verdict $S FAIL "only $on_from of the memory landed on node $from: the control is invalid"; exit 0
fi
if fgt "$loc" 0.05; then
    verdict $S FAIL "pages moved without a daemon and with numa_balancing=0: local=$loc moved=$moved"; exit 0
fi
control="numa_balancing=0: $on_from of $pages pages on node $from, local $loc after 8 s ($moved off node $from, pgmigrate +$mig)"

echo 1 > /proc/sys/kernel/numa_balancing
echo "# AutoNUMA: numa_balancing=1, same workload, until 95% local (at most 90 s)"
if ! hog /tmp/autonuma.out --seconds 90 --interval-ms 500 --until-local 0.95; then
    verdict $S FAIL "$control; AutoNUMA hog failed: $(tail -1 /tmp/autonuma.out)"; exit 0
fi
reached=$(kv reached "$res"); loc=$(kv local "$res"); moved=$(kv moved "$res"); mig=$(kv pgmigrate "$res")
if [ "$reached" = none ]; then
    verdict $S FAIL "$control; AutoNUMA did not reach 95% local in 90 s (local=$loc, moved $moved)"
    exit 0
fi
verdict $S PASS "$control; AutoNUMA (numa_balancing=1): $loc local after ${reached} s, $moved pages off node $from, pgmigrate +$mig"
