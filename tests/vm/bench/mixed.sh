# Benchmark (cargo xtask vm-bench): one condition of the fixed mixed workload.
#   sh /vm/bench/mixed.sh none|autonuma|numad|rebalancer|baseline|rebalancer-autonuma
# (baseline: the same as rebalancer with /bin/rebalancer-baseline, vm-bench --baseline-bin.)
# Parameters come from /vm/bench.env (MIB, WINDOW, SHIFT, PERIOD_MS, SAMPLE_S, LOCALITY: the
# locality reader's flag, empty for numa_maps or --pagemap). The guest's init runs one
# condition per "scenario" and cleans up between them (every process killed, cgroups removed).
#
# Workload (A = first CPU node, B = last CPU node), each in its own cgroup under /bench:
#   w1: MIB MiB first-touched on B; at t=0 the operator pins its cgroup to A's CPUs.
#   w2: the same; at t=SHIFT the operator re-pins it to B (the CPU load shifts).
#   w3: MIB MiB first-touched on A, then the process moves its own affinity to B (no cpuset pin).
# Each hog is a busy thread (it keeps touching its memory), so w2's re-pin is CPU load moving
# from A to B. The CPUs are not saturated (3 busy threads, 4 CPUs): numad only moves a process
# to a node with spare CPU. The manager (if any) runs from before the workload starts. Every
# SAMPLE_S seconds: the workload's aggregate locality (pages on the nodes where its threads may
# run, `guest-tool locality`), stamped at the middle of the reading (a reading takes 0.3-0.6 s
# under TCG, longer while a large migration runs). The reading loop runs at nice -20, so that
# neither manager's work spaces its readings: at nice 0 the daemon's page moves (nice -10, on
# the workloads' CPUs) stretched its interval to 1.1-1.2 s against 0.75 s under AutoNUMA, and
# at a positive nice its readings stretched to 10 s behind the hogs.
# Output for the host (xtask/src/vm/bench.rs): data block `bench` with lines
#   cond=.. mib=.. window=.. shift=.. period_ms=..
#   sample t=<s> pids=.. missing=.. pages=.. local_pages=.. local=.. mig=<pgmigrate since t=0>
#   shift t=<s>
#   result first_move_pin=<s>|never first_move_shift=<s>|never pgmigrate=.. numa_pte_updates=.. numa_hint_faults=.. numa_pages_migrated=..
#          mgr=.. mgr_cpu_ticks=..|na mgr_total_ticks=..|na mgr_alive=yes|no|na clk_tck=..
. /vm/lib.sh
. /vm/topology.env
. /vm/bench.env
COND=$1
S=bench-$COND
case $COND in
    none) NB=0; MGR=none ;;
    autonuma) NB=1; MGR=none ;;
    numad) NB=0; MGR=numad ;;
    rebalancer) NB=0; MGR=rebalancer; BIN=rebalancer ;;
    baseline) NB=0; MGR=rebalancer; BIN=rebalancer-baseline ;;
    rebalancer-autonuma) NB=1; MGR=rebalancer; BIN=rebalancer ;;
    *) verdict "$S" FAIL "unknown condition $COND"; exit 0 ;;
esac
A=$(first_cpu_node)
B=$(last_cpu_node)
CG=/sys/fs/cgroup/bench
vmstat() { awk -v k="$1" '$1 == k {print $2}' /proc/vmstat | grep . || echo 0; }
NODE_DIR=/sys/devices/system/node/node
ticks() { awk '{print $14 + $15}' /proc/"$1"/stat 2>/dev/null; }
since() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN{printf "%.2f", b - a}'; }

# rmdir_tree DIR: removes DIR and its children, retrying while dying processes still hold them.
rmdir_tree() {
    i=0
    while [ -d "$1" ] && [ $i -lt 60 ]; do
        for d in $(find "$1" -mindepth 1 -type d | sort -r) "$1"; do rmdir "$d" 2>/dev/null; done
        [ -d "$1" ] && sleep 0.5
        i=$((i + 1))
    done
    [ ! -d "$1" ]
}
rmdir_tree "$CG" || { verdict "$S" FAIL "a previous condition's $CG is still busy"; exit 0; }
echo "$NB" > /proc/sys/kernel/numa_balancing
mkdir "$CG" || { verdict "$S" FAIL "cannot create $CG"; exit 0; }
echo "+cpuset +memory +cpu" > "$CG"/cgroup.subtree_control
for w in w1 w2 w3; do mkdir "$CG/$w"; done

# The manager, started before the workload (a service that is already running).
MGR_PID=
case $MGR in
    numad)
        [ -x /bin/numad ] || { verdict "$S" FAIL "no numad in the guest"; exit 0; }
        mkdir -p /var/log /var/run
        # -i 1:2: scan every 1-2 s (default 5-15 s); -H 0: leave khugepaged's setting alone.
        LD_LIBRARY_PATH=/lib/x86_64-linux-gnu numad -i 1:2 -H 0 -l 7 &
        i=0
        while [ -z "$MGR_PID" ] && [ $i -lt 20 ]; do
            sleep 0.5; i=$((i + 1)); MGR_PID=$(pidof numad)
        done
        [ -n "$MGR_PID" ] || { cat /var/log/numad.log; verdict "$S" FAIL "numad did not start"; exit 0; }
        ;;
    rebalancer)
        cat > /tmp/bench.toml <<CONF
[daemon]
state_dir = "/tmp/rb-state"
[cgroups]
roots = ["bench"]
kubernetes = false
[controller]
period_ms = $PERIOD_MS
[server]
socket = "/run/rebalancer/rebalancer.sock"
metrics_listen = "127.0.0.1:9717"
CONF
        t=$(uptime_s)
        RUST_LOG=rebalancer=debug,rebalancer::rounds=trace $BIN run --config /tmp/bench.toml > /tmp/bench-daemon.log 2>&1 &
        MGR_PID=$!
        i=0
        until grep -q 'round done' /tmp/bench-daemon.log; do
            sleep 1; i=$((i + 1))
            if [ $i -ge 150 ] || ! kill -0 "$MGR_PID" 2>/dev/null; then
                tail -20 /tmp/bench-daemon.log; verdict "$S" FAIL "the daemon did not start"; exit 0
            fi
        done
        echo "# rebalancer: first round $(since "$t") s after start, $(ticks "$MGR_PID") ticks of CPU so far"
        ;;
esac

# The workload: allocations first (w1, w2 on B; w3 on A, then it moves itself to B).
start() { # start CGROUP OUTFILE CMD...: runs CMD inside bench/CGROUP; prints its pid
    g=$1; o=$2; shift 2
    sh -c "echo \$\$ > $CG/$g/cgroup.procs && exec $*" > "$o" 2>&1 &
    echo $!
}
HOG="guest-tool hog --mib $MIB --seconds 100000 --interval-ms 100000000"
t=$(uptime_s)
P1=$(start w1 /tmp/w1.out "$HOG --from-node $B")
P2=$(start w2 /tmp/w2.out "$HOG --from-node $B")
P3=$(start w3 /tmp/w3.out "$HOG --from-node $A --to-node $B")
i=0
for f in /tmp/w1.out /tmp/w2.out /tmp/w3.out; do
    until grep -q '"allocated"' "$f"; do
        sleep 0.5; i=$((i + 1))
        [ $i -lt 360 ] || { cat /tmp/w*.out; verdict "$S" FAIL "the workload never finished allocating"; exit 0; }
    done
done
echo "# allocated 3 x $MIB MiB in $(since "$t") s"

# first_move OUT CGROUP... NODE: starts `guest-tool first-move` (the first MiB of the cgroups'
# memory arriving on NODE, whoever moves it) and waits until it has read its baseline.
first_move() {
    o=$1; n=$2; shift 2
    fm=""
    for g in "$@"; do fm="$fm --cgroup $CG/$g"; done
    # shellcheck disable=SC2086 # one flag per cgroup
    guest-tool first-move $fm --node "$n" --seconds $((WINDOW + 30)) > "$o" 2>&1 &
    i=0
    until grep -q '^FIRST-MOVE' "$o"; do
        sleep 0.1; i=$((i + 1))
        [ $i -lt 300 ] || { cat "$o"; echo "first-move never became ready" >&2; return 1; }
    done
}
# rel OUT T: the first move's time in OUT relative to uptime T ("never" if none).
rel() {
    awk -v t="$2" '$1 == "FIRST-MOVE" && $2 ~ /^uptime=/ { printf "%.2f", substr($2, 8) - t; f = 1 }
        END { if (!f) printf "never" }' "$1"
}

# t=0: the operator pins w1 and w2 to A. Decision latency: from here to the first MiB of w1 or
# w2 on A; the rest of the time to 95% is the copy.
first_move /tmp/fm-pin.out "$A" w1 w2 || { verdict "$S" FAIL "first-move did not start"; exit 0; }
cpus_of "$A" > "$CG"/w1/cpuset.cpus
cpus_of "$A" > "$CG"/w2/cpuset.cpus
T0=$(uptime_s)
MIG0=$(vmstat pgmigrate_success)
MFAIL0=$(vmstat pgmigrate_fail)
SPLIT0=$(vmstat thp_migration_split)
CSTALL0=$(vmstat compact_stall)
PTE0=$(vmstat numa_pte_updates)
HINT0=$(vmstat numa_hint_faults)
NPM0=$(vmstat numa_pages_migrated)
CPU0=na
[ -n "$MGR_PID" ] && CPU0=$(ticks "$MGR_PID")

measure() {
    echo "cond=$COND mib=$MIB window=$WINDOW shift=$SHIFT period_ms=$PERIOD_MS"
    shifted=no
    while :; do
        now=$(since "$T0")
        if [ $shifted = no ] && ! fgt "$SHIFT" "$now"; then
            first_move /tmp/fm-shift.out "$B" w2 || return 1
            cpus_of "$B" > "$CG"/w2/cpuset.cpus
            TS=$(uptime_s)
            now=$(since "$T0")
            echo "shift t=$now"
            shifted=yes
        fi
        echo "$now" > /tmp/heartbeat
        r0=$(uptime_s)
        # shellcheck disable=SC2086 # LOCALITY is a flag or nothing
        guest-tool locality $LOCALITY --pid "$P1" --pid "$P2" --pid "$P3" > /tmp/locality.out
        r1=$(uptime_s)
        grep -q '^LOCALITY-TOTAL ' /tmp/locality.out || { echo "no reading from guest-tool locality $LOCALITY" >&2; return 1; }
        # One awk (a process spawned per reading is a delay under a migration): the time
        # stamp (the middle of the reading), the aggregate, and for the reader of a slow
        # migration each workload's locality (w1/w2/w3), the pages the kernel failed to
        # migrate, THP migrations split, compaction stalls (since t=0), MemFree (MiB) of A/B.
        awk -v r0="$r0" -v r1="$r1" -v z="$T0" -v g0="$MIG0" -v m0="$MFAIL0" -v s0="$SPLIT0" -v c0="$CSTALL0" \
            -v fa="$NODE_DIR$A/meminfo" -v fb="$NODE_DIR$B/meminfo" '
            FILENAME == "/tmp/locality.out" && $1 == "LOCALITY-TOTAL" { tot = substr($0, 16) }
            FILENAME == "/tmp/locality.out" && $1 == "LOCALITY" {
                for (i = 2; i <= NF; i++) if ($i ~ /^local=/) { per = per sep substr($i, 7); sep = "/" } }
            FILENAME == "/proc/vmstat" { c[$1] = $2 }
            $1 == "Node" && $3 == "MemFree:" { free[FILENAME] = int($4 / 1024) }
            END {
                printf "sample t=%.2f %s mig=%d read_s=%.2f per=%s mfail=%d thp_split=%d cstall=%d free=%d/%d\n",
                    (r0 + r1) / 2 - z, tot, c["pgmigrate_success"] - g0, r1 - r0, per,
                    c["pgmigrate_fail"] - m0, c["thp_migration_split"] - s0, c["compact_stall"] - c0, free[fa], free[fb]
            }' /tmp/locality.out /proc/vmstat "$NODE_DIR$A/meminfo" "$NODE_DIR$B/meminfo"
        ! fgt "$WINDOW" "$(since "$T0")" && break
        sleep "$SAMPLE_S"
    done
    cpu=na; total=na; alive=na
    if [ -n "$MGR_PID" ]; then
        alive=no
        if kill -0 "$MGR_PID" 2>/dev/null; then
            alive=yes; total=$(ticks "$MGR_PID"); cpu=$((total - CPU0))
        fi
    fi
    fm_pin=$(rel /tmp/fm-pin.out "$T0")
    fm_shift=never
    [ $shifted = yes ] && fm_shift=$(rel /tmp/fm-shift.out "$TS")
    echo "result first_move_pin=$fm_pin first_move_shift=$fm_shift pgmigrate=$(($(vmstat pgmigrate_success) - MIG0)) numa_pte_updates=$(($(vmstat numa_pte_updates) - PTE0)) numa_hint_faults=$(($(vmstat numa_hint_faults) - HINT0)) numa_pages_migrated=$(($(vmstat numa_pages_migrated) - NPM0)) mgr=$MGR mgr_cpu_ticks=$cpu mgr_total_ticks=$total mgr_alive=$alive clk_tck=$(getconf CLK_TCK 2>/dev/null || echo 100)"
}
# A reading loop that stalls (spawning a process took seconds under some conditions) is
# reported by a watcher that spawns nothing: what the loop's processes and D-state tasks wait on.
echo 0 > /tmp/heartbeat
guest-tool watch --heartbeat /tmp/heartbeat --pid $$ ${MGR_PID:+--pid $MGR_PID} --seconds $((WINDOW + 30)) > /tmp/watch.out 2>&1 &
WATCH_PID=$!
renice -n -20 -p $$ > /dev/null || echo "# the reading loop could not be reniced: its interval follows the load"
data bench measure || verdict "$S" FAIL "the measurement stopped: $(tail -n 3 /tmp/.data-stderr | tr '\n' ' ')"

kill "$WATCH_PID" 2>/dev/null
for f in /tmp/fm-pin.out /tmp/fm-shift.out; do sed 's/^/# /' "$f" 2>/dev/null; done
echo "# watch: $(grep -c '^WATCH stale' /tmp/watch.out) reports of a stalled reading loop"
# (the daemon's idle threads left out)
grep -v -e futex_wait_queue -e wait_woken -e do_epoll_wait /tmp/watch.out | head -500 | sed 's/^/# /'
# For the reader of the log.
for w in w1 w2 w3; do
    echo "# $w: cpus=$(cat $CG/$w/cpuset.cpus.effective) mems=$(cat $CG/$w/cpuset.mems.effective) anon: $(grep '^anon ' $CG/$w/memory.numa_stat)"
done
# shellcheck disable=SC2086
guest-tool locality $LOCALITY --pid "$P1" --pid "$P2" --pid "$P3" | grep '^LOCALITY' | sed 's/^/# /'
for w in w1 w2 w3; do grep -H 'error' /tmp/$w.out | sed 's/^/# workload /'; done
case $MGR in
    numad)
        echo "# numad log (decisions):"
        grep -E 'Advis|moved|Bad|Skipping|Tried|percent|Could not|Cannot' /var/log/numad.log | tail -30
        echo "# numad log (tail):"; tail -12 /var/log/numad.log ;;
    rebalancer)
        # Rounds that queued a move are kept (their time stamp is when the round decided).
        echo "# daemon log (moves):"; grep -v -e 'moves=0 queued=0' -e 'eBPF source' -e 'round start' -e 'in the last window and now' -e 'no last window to compare' /tmp/bench-daemon.log | tail -60
        echo "# daemon log (w3 from the start to the pins' follow-up: CPU time in the last window and now, and its moves):"
        # (up to w3's line of the follow-up round, the second brought forward by the pins)
        awk '/round brought forward/ {n++} n > 2 {exit} /bench\/w3/ && /last window|moved to another node|move/ {print; if (n == 2 && !/move applied/) exit}' /tmp/bench-daemon.log | tail -16
        for w in w1 w2 w3; do
            echo "# rebalancer explain bench/$w:"; $BIN explain bench/$w 2>&1 | head -40
        done ;;
esac
# Clean slate for the next condition: the workload and the manager gone, their memory freed.
kill -9 "$P1" "$P2" "$P3" $MGR_PID 2>/dev/null
i=0
while [ $i -lt 60 ] && { [ -d /proc/"$P1" ] || [ -d /proc/"$P2" ] || [ -d /proc/"$P3" ]; }; do
    sleep 0.5; i=$((i + 1))
done
rmdir_tree "$CG" || echo "# $CG still busy after the workload was killed"
exit 0
