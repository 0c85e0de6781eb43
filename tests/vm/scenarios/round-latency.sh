# Scenario round-latency (not run by default; a bench): admission over the socket and
# /healthz over TCP, timed request by request (guest-tool latency) while one control round
# migrates 1 GiB: a process first-touches 1 GiB on the last CPU node, its cgroup's CPUs are then
# confined to the first node, and the daemon (staged migration off, budget 2 GiB) moves its
# memory with one cpuset.mems write — the kernel migrates every page before the write returns.
# The round's window is its "round start" .. "round done" lines in the daemon's debug log; the
# requests issued inside it are reported (n, p50, p99, max) for both clients.
# Needs nodes of >= 1.5 GiB: cargo xtask vm-test --topology 2node --node-mem-mib 1536.
# PASS when the round moved >= 1 GiB and both p99 inside the window are < 2 ms.
. /vm/lib.sh
. /vm/topology.env
S=round-latency
MIB=1024
from=$(last_cpu_node)
to=$(first_cpu_node)
cg=/sys/fs/cgroup/vmtest-lat
LOG=/tmp/lat-daemon.log
free_kb=$(awk '/MemFree/{print $4}' /sys/devices/system/node/node"$to"/meminfo)
if [ "$free_kb" -lt $((MIB * 1024 + 131072)) ]; then
    verdict $S SKIP "node $to has ${free_kb} kB free, less than 1 GiB + 128 MiB (boot with --node-mem-mib 1536)"
    exit 0
fi
echo 0 > /proc/sys/kernel/numa_balancing
remote_hog $S "$cg" $MIB "$from" "$to" /tmp/lat-hog.out || exit 0
hog=$HOG
echo "# before the daemon: $(guest-tool locality --pid $hog | grep '^LOCALITY')"

cat > /tmp/lat.toml <<CONF
[daemon]
state_dir = "/tmp/lat-state"
[ebpf]
enabled = false
[cgroups]
roots = ["vmtest-lat"]
kubernetes = false
[controller]
period_ms = 2000
migration_budget_mib = 2048
[server]
socket = "/run/rebalancer/rebalancer.sock"
metrics_listen = "127.0.0.1:9717"
requests_per_second = 0
CONF
export RUST_LOG=rebalancer=debug
start_daemon /tmp/lat.toml $LOG || daemon_fail $S $LOG "the daemon did not start"
guest-tool latency --seconds 40 --interval-ms 20 > /tmp/lat.out 2>&1 &
lat=$!
_i=0
until grep -q "move applied" $LOG; do
    sleep 1; _i=$((_i + 1))
    [ $_i -lt 60 ] || break
done
sleep 5
kill $lat 2>/dev/null; wait $lat 2>/dev/null
kill $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null
echo "# daemon log (round lines and moves):"
grep -E "round start|round done|move applied|move failed" $LOG | tail -20
echo "# after: $(guest-tool locality --pid $hog | grep '^LOCALITY')"
kill $hog 2>/dev/null

# Seconds of day of a log line's RFC 3339 timestamp.
sod() { echo "$1" | sed -n 's/^[0-9-]*T\([0-9]*\):\([0-9]*\):\([0-9.]*\)Z.*/\1 \2 \3/p' | awk '{printf "%.6f", $1 * 3600 + $2 * 60 + $3}'; }
moved=$(grep "move applied" $LOG | head -1)
[ -n "$moved" ] || { verdict $S FAIL "no move was applied: $(tail -3 $LOG | tr '\n' ' ')"; exit 0; }
bytes=$(echo "$moved" | sed -n 's/.* bytes=\([0-9]*\).*/\1/p')
end_line=$(awk '/move applied/{f=1} f && /round done/{print; exit}' $LOG)
start_line=$(awk '/round start/{l=$0} /move applied/{print l; exit}' $LOG)
t_start=$(sod "$start_line"); t_end=$(sod "$end_line")
round_s=$(awk -v a="$t_start" -v b="$t_end" 'BEGIN{printf "%.3f", b - a}')
# stats KIND [FROM TO]: "n= p50= p99= max= non200=" of KIND's requests issued inside the round
# (or between FROM and TO, seconds of day), in µs.
stats() {
    grep "^LAT $1 " /tmp/lat.out | awk -v a="${2:-$t_start}" -v b="${3:-$t_end}" '$3 >= a && $3 <= b {print $4, $5}' > /tmp/lat.win
    n=$(grep -c . /tmp/lat.win)
    bad=$(awk '$2 != 200' /tmp/lat.win | grep -c .)
    [ "$n" -gt 0 ] || { echo "n=0"; return; }
    cut -d' ' -f1 /tmp/lat.win | sort -n > /tmp/lat.sorted
    awk -v n="$n" '{v[NR]=$1} END{i50=int(0.5*(n-1)+0.5)+1; i99=int(0.99*(n-1)+0.5)+1; printf "n=%d p50=%d p99=%d max=%d", n, v[i50], v[i99], v[n]}' /tmp/lat.sorted
    echo " non200=$bad"
}
adm=$(stats admit); hz=$(stats healthz)
# The same guest's figure with no migration running: the requests issued after the move's round.
t_after=$(awk -v a="$t_end" 'BEGIN{printf "%.6f", a + 0.5}')
idle_adm=$(stats admit "$t_after" 999999); idle_hz=$(stats healthz "$t_after" 999999)
all_adm=$(grep -c "^LAT admit " /tmp/lat.out); all_hz=$(grep -c "^LAT healthz " /tmp/lat.out)
detail="round with the move: ${round_s} s, bytes=$bytes; inside it: admit $adm µs; healthz $hz µs; after it (no migration): admit $idle_adm µs; healthz $idle_hz µs (all requests: $all_adm admits, $all_hz healthz)"
echo "# $detail"
[ "$bytes" -ge $((MIB << 20)) ] || { verdict $S FAIL "the move was $bytes bytes, not 1 GiB: $detail"; exit 0; }
p99a=$(kv p99 "$adm"); p99h=$(kv p99 "$hz")
[ -n "$p99a" ] && [ -n "$p99h" ] || { verdict $S FAIL "no request inside the round's window: $detail"; exit 0; }
if [ "$p99a" -lt 2000 ] && [ "$p99h" -lt 2000 ] && [ "$(kv non200 "$adm")" = 0 ] && [ "$(kv non200 "$hz")" = 0 ]; then
    verdict $S PASS "$detail"
else
    verdict $S FAIL "p99 not < 2 ms for both (or a request failed): $detail"
fi
