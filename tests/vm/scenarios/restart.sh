# Scenario restart: kill -9 the daemon mid-round — several admitted containers (API-bound and
# watcher-admitted, exclusive and shared), a rebalancing move of a remote-memory workload under
# way, rounds every 200 ms — change the cgroups while it is down (one container removed, one
# Guaranteed container created), restart it on the same state_dir, and check:
# - the checkpoint was restored (not rebuilt), the exclusive CPU sets are the same as before the
#   kill and pairwise disjoint, the removed container was released, the new one admitted on CPUs
#   nobody else holds (no double allocation);
# - no empty cpuset anywhere under the managed roots;
# - the daemon is healthy: status answers, rounds go on, and it admits one more container.
. /vm/lib.sh
. /vm/topology.env
S=restart
require_subcommand $S explain || exit 0
LOG=/tmp/rs-daemon.log
fail() { daemon_fail $S $LOG "$*"; }
kube_conf /tmp/rs.toml /tmp/rs-state 200 '["vmtest-rs"]'
echo 0 > /proc/sys/kernel/numa_balancing
kdir kubepods.slice/kubepods-burstable.slice && kdir kubepods.slice/kubepods-besteffort.slice ||
    fail "cannot make the kubepods QoS cgroups"
start_daemon /tmp/rs.toml $LOG || fail "the daemon did not start"
up1=$DAEMON_UP
# mkc NAME REL [--set F=V]...: a container cgroup made as a runtime does; sets D and CPUS.
mkc() {
    _n=$1; D=$CG/$2; shift 2
    kdir "$(dirname "${D#$CG/}")" || fail "cannot make the pod cgroup of $_n"
    out=$(guest-tool mkcg --dir "$D" "$@") || fail "$_n: mkcg failed: $out"
    [ "$(kv written_us "$out")" != none ] || fail "$_n: no cpuset written ($out)"
    CPUS=$(kv cpus "$out")
}
G1=11111111-0000-4000-8000-00000000000a
gpod_json $G1 1 > /tmp/rs-g1.json
rebalancer admit --pod /tmp/rs-g1.json > /dev/null || fail "admitting $G1 failed"
mkc G1 "$(pod_slice guaranteed $G1)/cri-containerd-$(cid 11).scope" --set "cpu.max=100000 100000" --set memory.max=67108864
G1DIR=$D
mkc G2 "$(pod_slice guaranteed 11111111-0000-4000-8000-00000000000b)/cri-containerd-$(cid 12).scope" --set "cpu.max=100000 100000" --set memory.max=67108864
G2DIR=$D
mkc E1 "$(pod_slice besteffort 33333333-0000-4000-8000-00000000000a)/cri-containerd-$(cid 13).scope"
E1DIR=$D

excl_before=$(status_field exclusive_cpus)
g1=$(cat $G1DIR/cpuset.cpus); g2=$(cat $G2DIR/cpuset.cpus)
# The workload runs on a node without exclusive CPUs (the planner never moves onto those).
to=""
for n in $CPU_NODES; do [ -n "$(common "$(cpus_of "$n")" "$excl_before")" ] || to=$n; done
[ -n "$to" ] || fail "every CPU node holds exclusive CPUs ($excl_before)"
from=$(first_cpu_node); [ "$from" != "$to" ] || from=$(last_cpu_node)

# The workload to rebalance, started now so that its move comes after the admissions: 64 MiB
# first-touched on node $from; then an operator confines its cgroup to node $to's CPUs.
rb=$CG/vmtest-rs
mkdir $rb || fail "cannot make $rb"
sh -c "echo \$\$ > $rb/cgroup.procs && exec guest-tool hog --mib 64 --from-node $from --seconds 120 --interval-ms 5000" > /tmp/rs-hog.out 2>&1 &
i=0
until grep -q '"allocated"' /tmp/rs-hog.out; do
    sleep 0.2; i=$((i + 1)); [ $i -lt 150 ] || fail "the workload never finished allocating"
done
cpus_of "$to" > $rb/cpuset.cpus
mems0=$(cat $rb/cpuset.mems.effective)

# Kill -9 as soon as the move of the workload's memory starts (its cpuset.mems changes: v2
# migrates the pages after that, while the daemon's write is still under way; or its writer's
# page moves have begun: a move whose cgroup's mems already hold the target writes none), at
# most 20 s on.
t=$(uptime_s)
inflight=no
pgm0=$(awk '/^pgmigrate_success /{print $2}' /proc/vmstat)
while fgt 20 "$(since "$t")"; do
    read -r m < $rb/cpuset.mems.effective
    if [ "$m" != "$mems0" ]; then inflight=yes; break; fi
    if [ "$(awk '/^pgmigrate_success /{print $2}' /proc/vmstat)" -gt $((pgm0 + 256)) ]; then inflight=yes; break; fi
    sleep 0.05
done
pg0=$(awk '/^pgmigrate_success /{print $2}' /proc/vmstat)
kill -9 $DAEMON
wait $DAEMON 2>/dev/null
killed_at=$(since "$t")
pg=$(( $(awk '/^pgmigrate_success /{print $2}' /proc/vmstat) - pg0 ))
rounds_before=$(sed -n 's/.*"rounds": *\([0-9]*\).*/\1/p' /tmp/rs-state/checkpoint.json | head -1)
[ -s /tmp/rs-state/checkpoint.json ] || fail "no checkpoint in /tmp/rs-state after the kill"
echo "# killed ${killed_at}s after the pin (move in flight: $inflight, workload mems $mems0 → $(cat $rb/cpuset.mems.effective), $pg pages migrated after the kill was sent); exclusive $excl_before (G1=$g1 G2=$g2), checkpointed rounds $rounds_before"
[ -z "$(common "$g1" "$g2")" ] || fail "before the kill G1 ($g1) and G2 ($g2) already shared CPUs"

# While it is down: E1's container goes, a Guaranteed container G3 appears (no one to admit it).
rmdir "$E1DIR" || fail "cannot remove E1"
G3DIR=$CG/$(pod_slice guaranteed 11111111-0000-4000-8000-00000000000c)/cri-containerd-$(cid 15).scope
kdir "$(dirname "${G3DIR#$CG/}")" && mkdir "$G3DIR" && echo "100000 100000" > $G3DIR/cpu.max &&
    echo 67108864 > $G3DIR/memory.max || fail "cannot make G3"

start_daemon /tmp/rs.toml $LOG || fail "the daemon did not restart after kill -9"
grep -q "checkpoint restored" $LOG || fail "the checkpoint was not restored at the restart"
st=$(rebalancer status --json | tr -d ' \n')
excl_after=$(status_field exclusive_cpus)
g3=$(cat $G3DIR/cpuset.cpus)
[ "$(cat $G1DIR/cpuset.cpus)" = "$g1" ] && [ "$(cat $G2DIR/cpuset.cpus)" = "$g2" ] ||
    fail "exclusive cpusets changed across the restart: G1 $g1 → $(cat $G1DIR/cpuset.cpus), G2 $g2 → $(cat $G2DIR/cpuset.cpus)"
[ "$(ncount "$g3")" = 1 ] || fail "G3 (made while the daemon was down) got cpus='$g3', not 1 exclusive CPU"
[ -z "$(common "$g3" "$g1,$g2")" ] || fail "double allocation: G3 got $g3, already held by G1=$g1 / G2=$g2"
same "$excl_after" "$excl_before,$g3" || fail "exclusive CPUs after the restart $excl_after, expected $excl_before + G3 $g3"
echo "$st" | grep -q "cri-containerd-$(cid 13)" && fail "E1 (removed while down) is still bound after the restart"
for c in 11 12 15; do
    echo "$st" | grep -q "cri-containerd-$(cid $c)" || fail "container $c is not bound after the restart"
done
# Healthy: one more admission (a Burstable container: what is left of the shared pool), rounds go on.
B1=22222222-0000-4000-8000-00000000000a
echo "{\"uid\":\"$B1\",\"containers\":[{\"name\":\"main\",\"cpu_request_millis\":500}]}" > /tmp/rs-b1.json
rebalancer admit --pod /tmp/rs-b1.json > /dev/null || fail "admitting Burstable $B1 after the restart failed"
mkc B1 "$(pod_slice burstable $B1)/cri-containerd-$(cid 14).scope" --set cpu.weight=20
b1=$CPUS
[ -z "$(common "$b1" "$excl_after")" ] || fail "B1 (after the restart) got cpus $b1, overlapping exclusive CPUs $excl_after"
i=0
while :; do
    rounds_after=$(rebalancer status --json | tr -d ' \n' | sed -n 's/.*"rounds":\([0-9]*\).*/\1/p')
    [ "${rounds_after:-0}" -le "${rounds_before:-0}" ] || break
    i=$((i + 1)); [ $i -lt 25 ] || fail "no control round after the restart (rounds $rounds_before → $rounds_after)"
    sleep 0.2
done
empty=$(empty_cpusets kubepods.slice vmtest-rs)
[ -z "$empty" ] || fail "empty cpusets after the restart: $empty"
kill -0 $DAEMON 2>/dev/null || fail "the daemon died after the restart"
kill $DAEMON
verdict $S PASS "kill -9 ${killed_at}s after the pin (move in flight: $inflight, $pg pages migrated after the signal; checkpointed rounds $rounds_before), restarted in ${DAEMON_UP}s (first start ${up1}s): checkpoint restored, exclusive G1=$g1 G2=$g2 unchanged, E1 released, G3=$g3 (made while down) on a free CPU, B1=$b1 (after) in the shared pool, rounds $rounds_after, no empty cpuset"
