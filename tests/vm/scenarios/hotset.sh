# Scenario hotset: a workload whose hot pages are a minority of its memory — 32 MiB written on a
# remote node, 224 MiB cold on the local one. The locality the daemon reports is compared with
# the truth the workload knows (the local share of the pages it writes) for every source this
# guest has: the share model, written pages (soft-dirty sampling), hinting faults (AutoNUMA on).
# Then, acting on written pages, the daemon must move the hot set (and only about it) local.
# Rows "ROW source=… reported=… truth=…" feed BENCHMARKS.md.
. /vm/lib.sh
. /vm/topology.env
S=hotset
require_subcommand $S explain || exit 0
PERIOD_MS=2000
hot=$(last_cpu_node)
run=$(first_cpu_node)
cg=$CG/vmtest-hot
out=/tmp/hs-work.out
log=/tmp/hs-daemon.log
echo 0 > /proc/sys/kernel/numa_balancing
mkdir "$cg" || { verdict $S FAIL "cannot create $cg"; exit 0; }

# conf DRY_RUN WRITTEN_PAGES
conf() {
    cat > /tmp/hs.toml <<CONF
[daemon]
state_dir = "/tmp/hs-state"
dry_run = $1
[cgroups]
roots = ["vmtest-hot"]
kubernetes = false
[controller]
period_ms = $PERIOD_MS
written_pages = $2
autonuma = "leave"
[server]
socket = "$SOCK"
metrics_listen = "127.0.0.1:9717"
CONF
}
# start_work: the workload in $cg (its CPUs on every node while it allocates), then confined to
# node $run's CPUs as an operator would.
start_work() {
    cat $CG/cpuset.cpus.effective > "$cg"/cpuset.cpus
    cat $CG/cpuset.mems.effective > "$cg"/cpuset.mems
    sh -c "echo \$\$ > $cg/cgroup.procs && exec guest-tool hotset --hot-mib 32 --hot-node $hot --cold-mib 224 --cold-node $run --run-node $run --seconds 900" > $out 2>&1 &
    WORK=$!
    _i=0
    until grep -q '^HOTSET' $out; do
        sleep 0.5; _i=$((_i + 1))
        [ $_i -lt 240 ] || { cat $out; verdict $S FAIL "the workload never started writing"; exit 0; }
    done
    cpus_of "$run" > "$cg"/cpuset.cpus
}
truth() { grep '^HOTSET' $out | tail -1; }
# row SOURCE: waits 3 periods, then the daemon's period score and evidence next to the truth.
row() {
    sleep $((3 * PERIOD_MS / 1000))
    _e=$(rebalancer explain vmtest-hot 2>&1)
    _loc=$(echo "$_e" | sed -n 's/^  "locality": \([^,]*\),*$/\1/p' | head -1)
    _ev=$(echo "$_e" | sed -n 's/^  "evidence": "\([^"]*\)".*/\1/p' | head -1)
    _t=$(truth)
    echo "ROW source=$1 reported=${_loc:-none} evidence=${_ev:-none} truth=$(kv truth "$_t") resident=$(kv resident "$_t")"
    REPORTED=${_loc:-none}; EVIDENCE=${_ev:-none}; TRUTH=$(kv truth "$_t")
}
fail() { kill -9 $WORK 2>/dev/null; daemon_fail $S $log "$@"; }

start_work
echo "# $(truth); cpus=$(cat $cg/cpuset.cpus.effective) mems=$(cat $cg/cpuset.mems.effective)"
conf true false
start_daemon /tmp/hs.toml $log || { tail -20 $log; verdict $S FAIL "daemon did not start"; exit 0; }
echo "# daemon up after ${DAEMON_UP} s; sources:"
rebalancer status --json | tr '{' '\n' | grep -E 'dram_access|numa_faults|written_pages' | cut -c1-300
_i=0
until rebalancer explain vmtest-hot 2>/dev/null | grep -q '"evidence": "'; do
    sleep 1; kill -0 $DAEMON 2>/dev/null || fail "the daemon exited"
    _i=$((_i + 1)); [ $_i -lt 90 ] || fail "no decision with evidence for vmtest-hot after 90 s"
done

# 1. The share model (dry run): resident memory is 87.5% local.
row share-model
share=$REPORTED; share_ev=$EVIDENCE; share_truth=$TRUTH

# 2. Written pages (dry run).
conf true true; kill -HUP $DAEMON
row written-pages
sleep $((PERIOD_MS / 1000)); row written-pages
written=$REPORTED; written_ev=$EVIDENCE; written_truth=$TRUTH
rebalancer status --json | tr '{' '\n' | grep written_pages | cut -c1-300

# 3. Acting on written pages.
mig0=$(awk '/^pgmigrate_success /{print $2}' /proc/vmstat)
conf false true; kill -HUP $DAEMON
t0=$(uptime_s)
acted=none
while :; do
    _t=$(truth)
    if fgt "$(kv truth "$_t")" 0.9499; then acted=$(since "$t0"); break; fi
    fgt "$(since "$t0")" 40 && break
    kill -0 $DAEMON 2>/dev/null || fail "the daemon exited"
    sleep 1
done
moved=$(( $(awk '/^pgmigrate_success /{print $2}' /proc/vmstat) - mig0 ))
after=$(truth)
echo "# after acting: $after; moved $moved pages; cpus=$(cat $cg/cpuset.cpus.effective) mems=$(cat $cg/cpuset.mems.effective)"
rebalancer explain vmtest-hot 2>&1 | head -40

# 4. Hinting faults: a fresh workload, AutoNUMA on, the daemon dry again without written pages.
conf true false; kill -HUP $DAEMON; sleep 2
kill -9 $WORK 2>/dev/null; sleep 1
start_work
echo 1 > /proc/sys/kernel/numa_balancing
row hinting-faults
f1="$REPORTED $EVIDENCE $TRUTH"
row hinting-faults
f2="$REPORTED $EVIDENCE $TRUTH"
echo 0 > /proc/sys/kernel/numa_balancing
kill $DAEMON 2>/dev/null
kill -9 $WORK 2>/dev/null

summary="share-model $share ($share_ev) vs truth $share_truth; written-pages $written ($written_ev) vs truth $written_truth; acted: local after ${acted} s moving $moved pages (hot set 8192); faults: [$f1] [$f2]"
[ "$share_ev" = share-model ] || { verdict $S FAIL "phase 1 evidence $share_ev, not share-model: $summary"; exit 0; }
[ "$written_ev" = written-pages ] || { verdict $S FAIL "written pages not used: $summary"; exit 0; }
d=$(awk -v a="$written" -v b="$written_truth" 'BEGIN{d=a-b; if (d<0) d=-d; print d}')
fgt "$d" 0.1 && { verdict $S FAIL "written-pages score off the truth by $d: $summary"; exit 0; }
[ "$acted" != none ] || { verdict $S FAIL "the hot set was not made local within 40 s: $summary"; exit 0; }
[ "$moved" -le 16384 ] || { verdict $S FAIL "moved $moved pages, more than twice the hot set: $summary"; exit 0; }
verdict $S PASS "$summary"
