# Scenario admission: container cgroups made in the Kubernetes layouts (systemd and cgroupfs
# drivers) get their cpuset from the daemon's cgroup watcher, and it satisfies the policy:
# - a Guaranteed integer-CPU container (admitted through the API and bound by the watcher, or
#   admitted by the watcher alone from cpu.max/memory.max) gets exclusive CPUs: as many as it
#   requests, on one node, mems = that node, overlapping no other exclusive set;
# - Burstable and BestEffort containers get CPUs from the shared pool (never an exclusive CPU,
#   also when the exclusive CPUs were taken after them), mems covering their CPUs' nodes;
# - no managed cgroup is left with an empty cpuset; a removed container's CPUs return to the
#   shared pool (`rebalancer status` and the next BestEffort container show it).
# The time from mkdir to the cpuset being written is measured for each container (guest-tool
# mkcg: mkdir, write the limits as a runtime does, poll cpuset.cpus).
. /vm/lib.sh
. /vm/topology.env
S=admission
require_subcommand $S admit || exit 0
LOG=/tmp/adm-daemon.log
fail() { daemon_fail $S $LOG "$*"; }
ALL=$(cat $CG/cpuset.cpus.effective)
kube_conf /tmp/adm.toml /tmp/adm-state 60000
kdir kubepods.slice/kubepods-burstable.slice && kdir kubepods.slice/kubepods-besteffort.slice &&
    kdir kubepods/besteffort || fail "cannot make the kubepods QoS cgroups"
start_daemon /tmp/adm.toml $LOG || fail "the daemon did not start"
echo "# daemon answering after ${DAEMON_UP}s; all CPUs $ALL"

LAT=""
# make NAME REL [--set FILE=VALUE]...: a container cgroup as a runtime makes it; sets D, CPUS, MEMS.
make() {
    _n=$1; D=$CG/$2; shift 2
    kdir "$(dirname "${D#$CG/}")" || fail "cannot make the pod cgroup of $_n"
    out=$(guest-tool mkcg --dir "$D" "$@") || fail "$_n: mkcg failed: $out"
    echo "# $_n: $out"
    w=$(kv written_us "$out")
    [ "$w" != none ] || fail "$_n: the watcher wrote no cpuset within 5 s ($out)"
    LAT="$LAT $_n=$(awk -v u="$w" 'BEGIN{printf "%.1f", u / 1000}')ms"
    CPUS=$(kv cpus "$out"); MEMS=$(kv mems "$out")
}
# exclusive NAME REQ: CPUS/MEMS are REQ CPUs on one node, mems = that node.
exclusive() {
    [ "$(ncount "$CPUS")" = "$2" ] || fail "$1: Guaranteed ${2}-CPU container got cpus=$CPUS"
    nodes=$(nodes_of "$CPUS")
    case $nodes in *,*) fail "$1: exclusive CPUs $CPUS span nodes $nodes although $2 CPU fits one node" ;; esac
    [ "$MEMS" = "$nodes" ] || fail "$1: exclusive CPUs $CPUS on node $nodes but mems=$MEMS"
}
# shared NAME DIR: its live cpuset is non-empty, avoids every exclusive CPU, mems cover its nodes.
# The shrink of the shared containers is written just after the new exclusive container's
# cpuset (daemon/admission.rs), which is what `make` waited for: allow it 5 s to land.
shared() {
    i=0
    while :; do
        c=$(cat "$2/cpuset.cpus"); m=$(cat "$2/cpuset.mems")
        excl=$(status_field exclusive_cpus)
        [ -z "$(common "$c" "$excl")" ] && break
        i=$((i + 1)); [ $i -lt 50 ] || break
        sleep 0.1
    done
    [ -n "$c" ] && [ -n "$m" ] || fail "$1: empty cpuset (cpus=$c mems=$m)"
    [ -z "$(common "$c" "$excl")" ] || fail "$1: shared container has cpus=$c, overlapping exclusive CPUs $excl"
    [ -z "$(minus "$(nodes_of "$c")" "$m")" ] || fail "$1: cpus=$c on nodes $(nodes_of "$c") but mems=$m"
}

# 1. Guaranteed, admitted through the API (as a kubelet admit hook would), then bound.
G1=11111111-0000-4000-8000-000000000001
echo "{\"uid\":\"$G1\",\"containers\":[{\"name\":\"main\",\"cpu_request_millis\":1000,\"cpu_limit_millis\":1000,\"memory_bytes\":67108864,\"memory_limit_bytes\":67108864}]}" > /tmp/g1.json
rebalancer admit --pod /tmp/g1.json || fail "admitting Guaranteed pod $G1 through the API failed"
make G1 "$(pod_slice guaranteed $G1)/cri-containerd-$(cid 1).scope" --set "cpu.max=100000 100000" --set memory.max=67108864
exclusive G1 1; G1CPUS=$CPUS; G1DIR=$D

# 2. BestEffort, watcher only, cgroupfs-driver layout: the whole shared pool.
E1=33333333-0000-4000-8000-000000000001
make E1 "kubepods/besteffort/pod$E1/$(cid 2)"
E1DIR=$D
same "$CPUS" "$(minus "$ALL" "$G1CPUS")" || fail "E1: BestEffort got cpus=$CPUS, not the shared pool $(minus "$ALL" "$G1CPUS")"

# 3. Guaranteed, watcher only: limits read from cpu.max / memory.max. Its exclusive CPU is taken
#    from the pool E1 already runs on, so E1 must shrink.
G2=11111111-0000-4000-8000-000000000002
make G2 "$(pod_slice guaranteed $G2)/crio-$(cid 3).scope" --set "cpu.max=100000 100000" --set memory.max=67108864
exclusive G2 1; G2CPUS=$CPUS; G2DIR=$D
[ -z "$(common "$G1CPUS" "$G2CPUS")" ] || fail "G1 ($G1CPUS) and G2 ($G2CPUS) share exclusive CPUs"
excl=$(status_field exclusive_cpus)
same "$excl" "$G1CPUS,$G2CPUS" || fail "status shows exclusive CPUs $excl, not G1+G2 = $G1CPUS,$G2CPUS"
shared E1 "$E1DIR"

# 4. Burstable (500m), admitted through the API, then bound.
B1=22222222-0000-4000-8000-000000000001
echo "{\"uid\":\"$B1\",\"containers\":[{\"name\":\"main\",\"cpu_request_millis\":500}]}" > /tmp/b1.json
rebalancer admit --pod /tmp/b1.json || fail "admitting Burstable pod $B1 through the API failed"
make B1 "$(pod_slice burstable $B1)/cri-containerd-$(cid 4).scope" --set cpu.weight=20
shared B1 "$D"
B1CPUS=$CPUS; B1DIR=$D

# 5. Removal releases: G2's CPU leaves the exclusive set, and the next BestEffort container
#    (watcher only, systemd layout) gets the shared pool including it.
rmdir "$G2DIR" || fail "cannot remove G2's cgroup"
i=0
while [ -n "$(common "$(status_field exclusive_cpus)" "$G2CPUS")" ]; do
    i=$((i + 1)); [ $i -lt 50 ] || fail "G2's CPU $G2CPUS still exclusive 10 s after its cgroup was removed"
    sleep 0.2
done
E2=33333333-0000-4000-8000-000000000002
make E2 "$(pod_slice besteffort $E2)/cri-containerd-$(cid 5).scope"
E2DIR=$D; E2CPUS=$CPUS
same "$CPUS" "$(minus "$ALL" "$G1CPUS")" || fail "E2: BestEffort got cpus=$CPUS after G2's release, not the shared pool $(minus "$ALL" "$G1CPUS")"

empty=$(empty_cpusets kubepods.slice kubepods)
[ -z "$empty" ] || fail "empty cpusets: $empty"
E1NOW=$(cat "$E1DIR/cpuset.cpus")
[ -n "$(cat "$G1DIR/cpuset.cpus")" ] || fail "G1 lost its cpuset"
echo "# status:"; rebalancer status

# 7. Everything removed (API pods released by DELETE): nothing admitted, nothing exclusive.
for d in "$G1DIR" "$E1DIR" "$E2DIR" "$B1DIR"; do rmdir "$d" || fail "cannot remove $d"; done
rebalancer admit --release --pod /tmp/g1.json > /dev/null || fail "releasing $G1 through the API failed"
rebalancer admit --release --pod /tmp/b1.json > /dev/null || fail "releasing $B1 through the API failed"
i=0
until st=$(rebalancer status --json | tr -d ' \n') && echo "$st" | grep -q '"pods":\[\]' && echo "$st" | grep -q '"exclusive_cpus":\[\]'; do
    i=$((i + 1)); [ $i -lt 50 ] || fail "pods or exclusive CPUs remain after every container was removed: $(rebalancer status --json | tr -d ' \n' | head -c 400)"
    sleep 0.2
done
kill $DAEMON
verdict $S PASS "mkdir→cpuset:$LAT; exclusive G1=$G1CPUS G2=$G2CPUS (1 node each, mems=node); E1 shared pool shrank to $E1NOW when G2 took $G2CPUS; B1=$B1CPUS; G2's CPU back in the pool after rmdir (E2=$E2CPUS); all released; daemon up in ${DAEMON_UP}s"
