# Scenario fresh-start: the daemon starts with no checkpoint on a node where four Kubernetes
# containers already run with their memory off their CPUs' node (two Guaranteed 1-CPU ones on
# node $to's CPUs, two Burstable ones on node $from's, each with $MIB MiB on the other node; the
# issue's 1 GiB each does not fit the guest's 512 MiB nodes), and checks, from the kernel and
# cgroupfs:
# - the start-up adopts them without migrating their memory: nothing migrated before the daemon
#   answers, the Guaranteed ones adopted with their mems widened by the node their memory is on
#   (`Admission::adopting`), and G1 kept on the exclusive CPU it ran on, which a fresh admission
#   would not pick (G2's may be kept for the shared containers admitted before it);
# - no more than `migration_budget_mib` is migrated per round (the kernel's pgmigrate_success:
#   cumulatively no more than a budget per round started, and no more than one budget within any
#   0.5 s, rounds being $PERIOD_MS ms apart);
# - the first admission after the start (a new container made as soon as the daemon answers) is
#   answered within its normal latency (a new container made once the rounds run: at most 4x it
#   plus 250 ms, both printed).
. /vm/lib.sh
. /vm/topology.env
S=fresh-start
PERIOD_MS=3000
BUDGET_MIB=16
MIB=48
RUN_S=10
LOG=/tmp/fs-daemon.log
fail() { daemon_fail $S $LOG "$*"; }
echo 0 > /proc/sys/kernel/numa_balancing
to=$(first_cpu_node); from=$(last_cpu_node)
set -- $(ids "$(cpus_of "$to")"); T1=$1; T2=$2
cat > /tmp/fs.toml <<CONF
[daemon]
state_dir = "/tmp/fs-state"
[cgroups]
kubernetes = true
[ebpf]
enabled = false
[placement]
policy = "single-numa-node"
[controller]
period_ms = $PERIOD_MS
migration_budget_mib = $BUDGET_MIB
[server]
socket = "$SOCK"
metrics_listen = "127.0.0.1:9717"
CONF
kdir kubepods.slice/kubepods-burstable.slice && kdir kubepods.slice/kubepods-besteffort.slice ||
    fail "cannot make the kubepods QoS cgroups"
# run NAME REL CPUS MEM_NODE FILE=VALUE...: a container cgroup with a hog that first-touches
# $MIB MiB on node MEM_NODE, then runs confined to CPUS. Sets D.
run() {
    _n=$1; _rel=$2; D=$CG/$2; _cpus=$3; _mem=$4; shift 4
    kdir "$(dirname "$_rel")" || fail "cannot make the pod cgroup of $_n"
    mkdir "$D" || fail "cannot make $D"
    for _kv in "$@"; do echo "${_kv#*=}" > "$D/${_kv%%=*}" || fail "$_n: cannot write $_kv"; done
    sh -c "echo \$\$ > $D/cgroup.procs && exec guest-tool hog --mib $MIB --from-node $_mem --seconds 300 --interval-ms 5000" > /tmp/fs-$_n.out 2>&1 &
    _i=0
    until grep -q '"allocated"' /tmp/fs-$_n.out; do
        sleep 0.2; _i=$((_i + 1)); [ $_i -lt 300 ] || fail "$_n never finished allocating: $(cat /tmp/fs-$_n.out)"
    done
    echo "$_cpus" > "$D/cpuset.cpus" || fail "$_n: cannot confine it to $_cpus"
}
GLIM="cpu.max=100000 100000"
# G1 runs on the second CPU of node $to: a fresh admission would pick the first.
run G1 "$(pod_slice guaranteed 44444444-0000-4000-8000-00000000000a)/cri-containerd-$(cid 41).scope" "$T2" "$from" "$GLIM" memory.max=67108864
G1=$D
run G2 "$(pod_slice guaranteed 44444444-0000-4000-8000-00000000000b)/cri-containerd-$(cid 42).scope" "$T1" "$from" "$GLIM" memory.max=67108864
G2=$D
run B1 "$(pod_slice burstable 44444444-0000-4000-8000-00000000000c)/cri-containerd-$(cid 43).scope" "$(cpus_of "$from")" "$to" cpu.weight=20
run B2 "$(pod_slice burstable 44444444-0000-4000-8000-00000000000d)/cri-containerd-$(cid 44).scope" "$(cpus_of "$from")" "$to" cpu.weight=20
echo "# before the daemon: G1 cpus=$(cat $G1/cpuset.cpus) G2 cpus=$(cat $G2/cpuset.cpus), memory on node $from; B1, B2 on node $from's CPUs, memory on node $to"

pgm() { awk '/^pgmigrate_success /{print $2}' /proc/vmstat; }
budget_pages=$((BUDGET_MIB * 256))
rm -rf /tmp/fs-state
pg0=$(pgm)
# the kernel's count every 0.1 s from just before the start: "uptime pages"
( while :; do echo "$(uptime_s) $(pgm)"; sleep 0.1; done ) > /tmp/fs-samples &
sampler=$!
export RUST_LOG=rebalancer=debug
start_daemon /tmp/fs.toml $LOG || fail "the daemon did not start"
at_answer=$(($(pgm) - pg0))
g1a=$(cat $G1/cpuset.mems); g2a=$(cat $G2/cpuset.mems)
rounds_at_answer=$(grep -c 'round start' $LOG)
# newc UID N: a new BestEffort container made as a runtime does; prints mkcg's line.
newc() {
    kdir "$(pod_slice besteffort "$1")" || fail "cannot make the pod cgroup of $1"
    guest-tool mkcg --dir "$CG/$(pod_slice besteffort "$1")/cri-containerd-$(cid "$2").scope" --wait-ms 30000
}
first=$(newc 44444444-0000-4000-8000-00000000000e 45)
echo "# daemon answering after ${DAEMON_UP}s with $at_answer pages migrated, $rounds_at_answer rounds started, G1 mems=$g1a, G2 mems=$g2a; first admission: $first"
sleep $RUN_S
normal=$(newc 44444444-0000-4000-8000-00000000000f 46)
echo "# a later admission: $normal"
kill $sampler
total=$(($(pgm) - pg0))
rounds=$(grep -c 'round start' $LOG)
maxwin=$(awk '{t[NR] = $1; c[NR] = $2} END {m = 0; j = 1; for (i = 1; i <= NR; i++) { while (t[i] - t[j] > 0.5) j++; if (c[i] - c[j] > m) m = c[i] - c[j] } print m}' /tmp/fs-samples)
g1=$(cat $G1/cpuset.cpus); g1m=$(cat $G1/cpuset.mems); g2=$(cat $G2/cpuset.cpus); g2m=$(cat $G2/cpuset.mems)
echo "# after ${RUN_S}s: $total pages migrated in $rounds rounds (budget $budget_pages pages a round), at most $maxwin within 0.5 s; G1 cpus=$g1 mems=$g1m, G2 cpus=$g2 mems=$g2m"
echo "# daemon log (adoption, moves):"; grep "adopted\|move applied\|budget" $LOG | head -20
kill -0 $DAEMON 2>/dev/null || fail "the daemon exited: $(tail -1 $LOG)"
us() { kv written_us "$1"; }
[ "$(us "$first")" != none ] || fail "the first admission after the start wrote no cpuset within 30 s ($first)"
[ "$(us "$normal")" != none ] || fail "the later admission wrote no cpuset within 30 s ($normal)"
[ "$at_answer" -le $((rounds_at_answer * budget_pages)) ] ||
    fail "$at_answer pages migrated by the time the daemon answered, after $rounds_at_answer rounds (budget $budget_pages pages a round): the start-up migrated memory"
[ "$total" -le $((rounds * budget_pages)) ] || fail "$total pages migrated in $rounds rounds: more than the budget of $budget_pages pages a round"
[ "$maxwin" -le $budget_pages ] || fail "$maxwin pages migrated within 0.5 s, past the budget of $budget_pages pages a round"
# G1, the first Guaranteed one adopted, runs where a fresh admission would not put it; G2 may
# find its CPU kept for the shared containers (then it is placed anew, on its memory's node)
[ "$g1" = "$T2" ] || fail "G1 was moved at start: $T2 -> $g1"
# adopted with the node their memory is on kept in their mems (widened where placed elsewhere)
[ -n "$(common "$g1a" "$from")" ] && [ -n "$(common "$g2a" "$from")" ] ||
    fail "adopted with mems G1=$g1a G2=$g2a: their memory's node $from left out (its pages migrated in the write)"
f=$(us "$first"); n=$(us "$normal")
[ "$f" -le $((n * 4 + 250000)) ] || fail "the first admission after the start took ${f} us, more than 4x a later one (${n} us) plus 250 ms"
verdict $S PASS "start-up migrated $at_answer pages; $total pages in $rounds rounds (budget $budget_pages a round, at most $maxwin within 0.5 s); G1 kept on CPU $g1 (mems now $g1m), G2 on $g2 (was $T1, mems now $g2m); first admission after start ${f} us, later ${n} us"
