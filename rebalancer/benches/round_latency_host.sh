#!/bin/bash
# Admission (unix socket) and /healthz (TCP) latency of a real daemon while its control rounds
# run, on this host (root; cgroup v1 or v2 cpuset). The rounds are made long for a real reason:
# NPROCS processes in a managed cgroup (configured root), whose threads' CPU time the round reads
# from /proc every period. This host has one NUMA node, so nothing migrates here: the 1 GiB
# migration figure comes from the guest (tests/vm/scenarios/round-latency.sh). Dry-run, eBPF
# off, rate limit off.
#
#   rebalancer/benches/round_latency_host.sh BIN GUEST_TOOL [NPROCS] [SECONDS]
#
# Prints the round duration (from /metrics) and n / p50 / p99 / max of each client, in µs.
set -eu
BIN=$1 TOOL=$2 N=${3:-3000} SECS=${4:-20}
ROOT=/sys/fs/cgroup/cpuset
[ -d "$ROOT" ] || ROOT=/sys/fs/cgroup
NAME=rb-lat-$$
CG=$ROOT/$NAME
DIR=$(mktemp -d /dev/shm/rb-lat.XXXXXX)
PORT=$((20000 + $$ % 20000))
cleanup() {
    [ -n "${DAEMON:-}" ] && kill "$DAEMON" 2>/dev/null || true
    for p in $(cat "$CG/cgroup.procs" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
    sleep 1; rmdir "$CG" 2>/dev/null || true; rm -rf "$DIR"
}
trap cleanup EXIT
mkdir "$CG"
if [ -f "$CG/cpuset.cpus" ] && [ -z "$(cat "$CG/cpuset.cpus")" ]; then
    cat "$ROOT/cpuset.cpus" > "$CG/cpuset.cpus"; cat "$ROOT/cpuset.mems" > "$CG/cpuset.mems"
fi
i=0
while [ $i -lt "$N" ]; do
    sh -c "echo \$\$ > $CG/cgroup.procs && exec sleep 900" &
    i=$((i + 1))
done
sleep 2
echo "# $(wc -l < "$CG/cgroup.procs") processes in $CG"
cat > "$DIR/c.toml" <<CONF
[daemon]
dry_run = true
log_level = "warn"
state_dir = "$DIR/state"
[ebpf]
enabled = false
[cgroups]
roots = ["$NAME"]
kubernetes = false
[controller]
period_ms = 500
[server]
socket = "$DIR/api.sock"
metrics_listen = "127.0.0.1:$PORT"
requests_per_second = 0
CONF
"$BIN" run --config "$DIR/c.toml" > "$DIR/daemon.log" 2>&1 &
DAEMON=$!
i=0
until [ -S "$DIR/api.sock" ]; do sleep 0.1; i=$((i + 1)); [ $i -lt 300 ] || { cat "$DIR/daemon.log"; exit 1; }; done
sleep 3
"$TOOL" latency --socket "$DIR/api.sock" --healthz "127.0.0.1:$PORT" --seconds "$SECS" --interval-ms 5 > "$DIR/lat.out"
m=$(exec 3<>/dev/tcp/127.0.0.1/$PORT && printf 'GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n' >&3 && cat <&3)
sum=$(echo "$m" | awk '/^rebalancer_control_round_duration_seconds_sum/{print $2}')
cnt=$(echo "$m" | awk '/^rebalancer_control_round_duration_seconds_count/{print $2}')
echo "# rounds: $cnt, mean $(awk -v s="${sum:-0}" -v c="${cnt:-1}" 'BEGIN{printf "%.1f", 1000 * s / (c ? c : 1)}') ms each"
for kind in admit healthz; do
    grep "^LAT $kind " "$DIR/lat.out" | awk '{print $4, $5}' > "$DIR/$kind"
    bad=$(awk '$2 != 200' "$DIR/$kind" | wc -l)
    cut -d' ' -f1 "$DIR/$kind" | sort -n | awk -v k=$kind -v bad="$bad" '{v[NR]=$1} END{n=NR; printf "%-8s n=%d p50=%d p99=%d max=%d µs non200=%d\n", k, n, v[int(0.5*(n-1)+0.5)+1], v[int(0.99*(n-1)+0.5)+1], v[n], bad}'
done
