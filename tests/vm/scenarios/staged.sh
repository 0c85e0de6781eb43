# Scenario staged: a workload with four times more remote memory than the daemon's per-round
# migration budget (128 MiB vs 32 MiB, kernel.numa_balancing=0) is moved in stages: no round
# migrates more than the budget (the kernel's own pgmigrate_success, sampled between rounds, and
# the daemon's log), at least two rounds are page-by-page stages (move_pages), and the workload
# ends >= 95% local with cpuset.mems narrowed to its CPUs' node (or, where only pages other
# processes map were left off it, left widened by the final move, which says so in its log:
# `daemon::apply`), one stage per period: the first
# move is queued by the daemon's 4th round, and from then to the final narrowing at most one round
# per stage (held back by the budget, whose window is a period) plus one neither queues a move nor
# has one in flight (counted in the debug log: a round counter, not wall time, so neither the
# start-up under emulation nor the emulated migration's speed is measured).
. /vm/lib.sh
. /vm/topology.env
S=staged
PERIOD_MS=3000
BUDGET_MIB=32
MAX_FIRST=4   # the first round and the 3 periods after it
# Guards only (the verdict comes before the guest's timeout): the start-up under emulation and
# the emulated migration of 128 MiB.
STARTUP_MAX_S=60
LOOP_MAX_S=150
from=$(last_cpu_node)
to=$(first_cpu_node)
cg=/sys/fs/cgroup/vmtest-st
LOG=/tmp/st-daemon.log
echo 0 > /proc/sys/kernel/numa_balancing
remote_hog $S "$cg" 128 "$from" "$to" /tmp/st-hog.out || exit 0
hog=$HOG
before=$(guest-tool locality --pid $hog | grep '^LOCALITY')
echo "# before the daemon: $before"

cat > /tmp/st.toml <<CONF
[daemon]
state_dir = "/tmp/st-state"
[cgroups]
roots = ["vmtest-st"]
kubernetes = false
[controller]
period_ms = $PERIOD_MS
migration_budget_mib = $BUDGET_MIB
[server]
socket = "/run/rebalancer/rebalancer.sock"
metrics_listen = "127.0.0.1:9717"
CONF
budget_pages=$((BUDGET_MIB * 256))
t0=$(uptime_s)
RUST_LOG=rebalancer=debug rebalancer run --config /tmp/st.toml > $LOG 2>&1 &
daemon=$!
started=yes
first_round $LOG $daemon $STARTUP_MAX_S || started=no
echo "# first round $(since "$t0") s after the daemon's start"
t0=${ROUND0:-$t0}
reached=none
maxwin=0
prev=$(awk '/^pgmigrate_success /{print $2}' /proc/vmstat)
total=0
n=0
while [ $started = yes ]; do
    sleep 0.5
    cur=$(awk '/^pgmigrate_success /{print $2}' /proc/vmstat)
    d=$((cur - prev)); prev=$cur; total=$((total + d))
    [ $d -gt $maxwin ] && maxwin=$d
    n=$((n + 1))
    [ $((n % 2)) = 0 ] || continue
    now=$(since "$t0")
    loc=$(guest-tool locality --pid $hog | grep '^LOCALITY')
    echo "# t=${now}s $loc mems=$(cat $cg/cpuset.mems.effective) migrated so far $total pages, most in 0.5 s: $maxwin"
    # The final move's end: mems narrowed to $to, or left widened over $to (logged).
    ended=no
    [ "$(cat $cg/cpuset.mems.effective)" = "$to" ] && ended=narrowed
    [ $ended = no ] && grep 'cpuset.mems left widened' $LOG | grep -q 'cgroup=vmtest-st' &&
        [ "$(common "$(cat $cg/cpuset.mems.effective)" "$to")" = "$to" ] && ended=widened
    if fgt "$(kv local "$loc")" 0.9499 && [ $ended != no ]; then reached=$now; break; fi
    fgt "$now" "$LOOP_MAX_S" && break
    kill -0 $daemon 2>/dev/null || break
done
echo "# daemon log (moves):"; grep "move applied\|staged move" $LOG | tail -20
alive=yes; kill -0 $daemon 2>/dev/null || alive=no
kill $daemon 2>/dev/null
stages=$(grep "move applied" $LOG | grep -c 'staged_toward=Some')
over=$(grep "move applied" $LOG | sed -n 's/.* moved=\([0-9]*\).*/\1/p' | awk -v b=$((BUDGET_MIB << 20)) '$1 > b' | wc -l)
empty=$(grep -c 'staged move: moving pages failed' $LOG)
# The round that first queued a move, and the rounds after it with nothing queued and nothing in
# flight, up to the final narrowing (empty: none came).
read -r first idle <<EOF2
$(rounds_of $LOG | awk '$1 == "round" { r++; if (!q && $2 > 0) q = r; if (q && $2 == 0 && $3 == 0) n++ }
    $1 == "applied" && $3 == "None" { print q + 0, n + 0; exit }')
EOF2
echo "# rounds (queued in_flight) and moves applied:"; rounds_of $LOG | tr '\n' ';'; echo
[ -n "$(cat $cg/cpuset.cpus.effective)" ] || { verdict $S FAIL "the workload's cgroup was left with an empty cpuset"; exit 0; }
[ "$alive" = yes ] || { verdict $S FAIL "the daemon exited: $(tail -1 $LOG)"; exit 0; }
[ $started = yes ] || { verdict $S FAIL "no round within $STARTUP_MAX_S s of the daemon's start"; exit 0; }
[ "$empty" = 0 ] || { verdict $S FAIL "move_pages failed $empty times: $(grep 'moving pages failed' $LOG | head -1)"; exit 0; }
[ $maxwin -le $budget_pages ] || { verdict $S FAIL "$maxwin pages migrated within 0.5 s, past the $BUDGET_MIB MiB ($budget_pages pages) budget of a round"; exit 0; }
[ "$over" = 0 ] || { verdict $S FAIL "$over moves report more bytes moved than the budget"; exit 0; }
[ "$stages" -ge 2 ] || { verdict $S FAIL "only $stages staged rounds in the log (expected >= 2 for 128 MiB over a $BUDGET_MIB MiB budget)"; exit 0; }
[ "$reached" != none ] || { verdict $S FAIL "not >= 95% local with mems=$to (or left widened over it by the final move) within $LOOP_MAX_S s of the first round: $loc, $stages stages, $total pages migrated"; exit 0; }
[ -n "$idle" ] || { verdict $S FAIL "no final narrowing (staged_toward=None) in the log"; exit 0; }
[ "$first" -le $MAX_FIRST ] || { verdict $S FAIL "the first move was queued in round $first (at most $MAX_FIRST: the first round + 3 periods of $PERIOD_MS ms)"; exit 0; }
max_idle=$((stages + 1))
[ "$idle" -le $max_idle ] || { verdict $S FAIL "$idle rounds neither queued nor had a move in flight between the first move and the final narrowing (at most $max_idle: one held back by the budget after each of the $stages stages, plus one)"; exit 0; }
verdict $S PASS "95% local with mems $ended ($(cat $cg/cpuset.mems.effective), target $to) ${reached} s after the first round, first move queued in round $first, $stages stages + the final move with $idle idle rounds (at most $max_idle); at most $maxwin pages (budget $budget_pages) migrated within 0.5 s, $total in all"
