# Helpers for the guest scenarios (busybox sh). Sourced by /init and by each scenario.
# Console protocol: see xtask/src/vm/verdict.rs.

uptime_s() { cut -d' ' -f1 /proc/uptime; }

# verdict NAME PASS|FAIL|SKIP DETAIL...
verdict() { n=$1; s=$2; shift 2; echo "VERDICT $n $s $*"; }

# data KEY CMD...: runs CMD with its stdout in data block KEY and its stderr in KEY-stderr,
# for a host judge.
data() {
    key=$1; shift
    echo "DATA-BEGIN $key"
    "$@" 2>/tmp/.data-stderr
    rc=$?
    echo ""
    echo "DATA-END $key rc=$rc"
    echo "DATA-BEGIN $key-stderr"
    cat /tmp/.data-stderr
    echo ""
    echo "DATA-END $key-stderr rc=0"
    return $rc
}

# require_subcommand SCENARIO SUBCOMMAND: prints FAIL and returns 1 when
# `rebalancer SUBCOMMAND --help` fails: a subcommand that went missing is a regression, never a skip.
require_subcommand() {
    if rebalancer "$2" --help >/dev/null 2>&1; then return 0; fi
    verdict "$1" FAIL "rebalancer has no '$2' subcommand"
    return 1
}

# cpus_of NODE: the node's cpulist.
cpus_of() { cat /sys/devices/system/node/node"$1"/cpulist; }

# first / last CPU node.
first_cpu_node() { set -- $CPU_NODES; echo "$1"; }
last_cpu_node() { for n in $CPU_NODES; do l=$n; done; echo "$l"; }

# kv KEY LINE: value of KEY=value in a "k=v k=v" line.
kv() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"; }

# fgt A B: exit 0 when float A > B.
fgt() { awk -v a="$1" -v b="$2" 'BEGIN{exit !(a > b)}'; }

# Kills every user process except init and the caller, removes test cgroups.
cleanup_all() {
    for p in /proc/[0-9]*; do
        pid=${p#/proc/}
        [ "$pid" = 1 ] || [ "$pid" = "$$" ] && continue
        [ -e "$p/exe" ] || continue   # kernel threads have no exe (procfs sizes are all 0)
        kill -9 "$pid" 2>/dev/null
    done
    sleep 0.2
    for d in $(find /sys/fs/cgroup -mindepth 1 -type d | sort -r); do rmdir "$d" 2>/dev/null; done
}

# --- cpulists (busybox has no jq or numactl) ---
# ids CPULIST: its ids, one a line ("0-2,5" → 0 1 2 5).
ids() { echo "$1" | tr ',' '\n' | awk -F- '$1 == "" {next} NF == 1 {print $1; next} {for (i = $1; i <= $2; i++) print i}'; }
# ncount CPULIST: how many ids.
ncount() { ids "$1" | grep -c .; }
# common A B: ids in both, comma-separated.
# (busybox grep -f with an empty pattern file matches every line: an empty B is handled first.)
common() { [ -n "$2" ] || return 0; ids "$2" > /tmp/.ids; ids "$1" | grep -Fx -f /tmp/.ids | tr '\n' ',' | sed 's/,$//'; }
# minus A B: ids of A not in B, comma-separated.
minus() {
    if [ -z "$2" ]; then ids "$1" | tr '\n' ',' | sed 's/,$//'; return 0; fi
    ids "$2" > /tmp/.ids; ids "$1" | grep -Fxv -f /tmp/.ids | tr '\n' ',' | sed 's/,$//'
}
# same A B: exit 0 when A and B hold the same ids.
same() { [ -z "$(minus "$1" "$2")" ] && [ -z "$(minus "$2" "$1")" ]; }
# nodes_of CPULIST: the nodes of those CPUs, comma-separated.
nodes_of() { for n in $NODES; do [ -n "$(common "$1" "$(cpus_of "$n")")" ] && printf '%s,' "$n"; done | sed 's/,$//'; }
# since T0: seconds since uptime T0.
since() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN{printf "%.2f", b - a}'; }

# --- the daemon ---
SOCK=/run/rebalancer/rebalancer.sock

# kube_conf FILE STATE_DIR PERIOD_MS [ROOTS]: the daemon config of the Kubernetes-layout
# scenarios (watcher on, eBPF off, the scenario socket); ROOTS is a TOML array, e.g. '["a"]'.
kube_conf() {
    {
        echo '[daemon]'
        echo "state_dir = \"$2\""
        echo '[cgroups]'
        [ -n "$4" ] && echo "roots = $4"
        echo 'kubernetes = true'
        echo '[ebpf]'
        echo 'enabled = false'
        echo '[controller]'
        echo "period_ms = $3"
        echo '[server]'
        echo "socket = \"$SOCK\""
        echo 'metrics_listen = "127.0.0.1:9717"'
    } > "$1"
}

# daemon_fail SCENARIO LOG DETAIL...: prints the daemon's status and log tail, the FAIL verdict,
# kills the daemon and ends the scenario.
daemon_fail() {
    s=$1; log=$2; shift 2
    echo "# status:"; rebalancer status 2>&1 | head -30
    echo "# daemon log (tail):"; tail -40 "$log"
    verdict "$s" FAIL "$*"
    kill -9 $DAEMON 2>/dev/null
    exit 0
}
CG=/sys/fs/cgroup
# start_daemon CONF LOG: starts `rebalancer run --config CONF` (output appended to LOG) and waits
# (at most 60 s) until `rebalancer status` answers. Sets DAEMON (pid) and DAEMON_UP (seconds).
start_daemon() {
    if rebalancer status > /dev/null 2>&1; then
        echo "# another daemon already answers on $SOCK"
        return 1
    fi
    _t=$(uptime_s)
    RUST_LOG=${RUST_LOG:-rebalancer=info} rebalancer run --config "$1" >> "$2" 2>&1 &
    DAEMON=$!
    _i=0
    until rebalancer status > /dev/null 2>&1; do
        kill -0 "$DAEMON" 2>/dev/null || return 1
        _i=$((_i + 1)); [ $_i -lt 300 ] || return 1
        sleep 0.2
    done
    kill -0 "$DAEMON" 2>/dev/null || return 1
    DAEMON_UP=$(since "$_t")
}
# first_round LOG PID MAX_S: waits (polling every 0.1 s, at most MAX_S s) until the daemon PID,
# run with RUST_LOG=rebalancer=debug into LOG, has logged its first "round start". Sets ROUND0 to
# the uptime at which it was seen. Returns 1 when the daemon exited or MAX_S passed.
first_round() {
    _t=$(uptime_s)
    until grep -q 'round start' "$1"; do
        kill -0 "$2" 2>/dev/null || return 1
        fgt "$(since "$_t")" "$3" && return 1
        sleep 0.1
    done
    ROUND0=$(uptime_s)
}
# rounds_of LOG: the "round done" lines of LOG as "queued in_flight", one per round, with a line
# "applied CGROUP STAGED_TOWARD" where a move was applied (in log order).
rounds_of() {
    sed -n -e 's/.*round done .* queued=\([0-9]*\) in_flight=\([0-9]*\).*/round \1 \2/p' \
        -e 's/.*move applied cgroup=\([^ ]*\) .* staged_toward=\([^ ]*\) .*/applied \1 \2/p' "$1"
}
# status_field KEY: a flat array field of `rebalancer status --json` as a cpulist
# (e.g. exclusive_cpus [1,2] → 1,2).
status_field() { rebalancer status --json | tr -d ' \n' | sed -n "s/.*\"$1\":\[\([0-9,]*\)\].*/\1/p"; }

# --- Kubernetes layouts ---
# kdir REL: makes REL and its missing parents below /sys/fs/cgroup, each with cpuset, cpu and
# memory enabled for its children (as kubelet's pod and QoS cgroups are).
kdir() {
    _p=$CG
    for _part in $(echo "$1" | tr '/' ' '); do
        _p=$_p/$_part
        [ -d "$_p" ] || mkdir "$_p" || return 1
        echo "+cpuset +cpu +memory" > "$_p/cgroup.subtree_control" || return 1
    done
}
# cid N: a 64-hex-digit container id.
cid() { printf 'c%063d' "$1"; }
# pod_slice QOS UID: the systemd-driver pod cgroup (QOS: guaranteed, burstable, besteffort).
pod_slice() {
    _u=$(echo "$2" | tr - _)
    case $1 in
        guaranteed) echo "kubepods.slice/kubepods-pod$_u.slice" ;;
        *) echo "kubepods.slice/kubepods-$1.slice/kubepods-$1-pod$_u.slice" ;;
    esac
}
# cpuset_snapshot: "path cpus mems effective-cpus effective-mems" of every cgroup, sorted.
cpuset_snapshot() {
    find $CG -name cpuset.cpus | sort | while read -r _f; do
        _d=${_f%/cpuset.cpus}
        read -r _c < "$_f"; read -r _m < "$_d/cpuset.mems"
        read -r _ec < "$_d/cpuset.cpus.effective"; read -r _em < "$_d/cpuset.mems.effective"
        echo "${_d#$CG}/ cpus=$_c mems=$_m eff=$_ec/$_em"
    done
}
# empty_cpusets REL...: cgroups at or below each REL whose effective cpus or mems are empty.
empty_cpusets() {
    for _r in "$@"; do
        [ -d "$CG/$_r" ] || continue
        find "$CG/$_r" -name cpuset.cpus.effective | while read -r _f; do
            _d=${_f%/cpuset.cpus.effective}
            read -r _ec < "$_f"; read -r _em < "$_d/cpuset.mems.effective"
            [ -n "$_ec" ] && [ -n "$_em" ] || echo "${_d#$CG/}"
        done
    done
}
# gpod_json UID CPUS: a one-container Guaranteed pod (CPUS whole CPUs, 64 MiB) for `rebalancer admit`.
gpod_json() { echo "{\"uid\":\"$1\",\"containers\":[{\"name\":\"main\",\"cpu_request_millis\":$(($2 * 1000)),\"cpu_limit_millis\":$(($2 * 1000)),\"memory_bytes\":67108864,\"memory_limit_bytes\":67108864}]}"; }

# remote_hog SCENARIO CGROUP MIB FROM TO OUT: makes CGROUP, starts `guest-tool hog` in it with MIB
# MiB first-touched on node FROM that then runs on node TO (output in OUT), waits until it has
# allocated, and confines CGROUP to node TO's CPUs (an operator's pin: the memory stays on FROM).
# Sets HOG to its pid. On failure prints the scenario's FAIL verdict and returns 1.
remote_hog() {
    _s=$1 _cg=$2 _mib=$3 _from=$4 _to=$5 _out=$6
    mkdir "$_cg" || { verdict "$_s" FAIL "cannot create $_cg"; return 1; }
    sh -c "echo \$\$ > $_cg/cgroup.procs && exec guest-tool hog --mib $_mib --from-node $_from --to-node $_to --seconds 300 --interval-ms 5000" > "$_out" 2>&1 &
    HOG=$!
    _i=0
    until grep -q '"allocated"' "$_out"; do
        sleep 0.5; _i=$((_i + 1))
        [ $_i -lt 120 ] || { cat "$_out"; verdict "$_s" FAIL "the workload never finished allocating"; return 1; }
    done
    cpus_of "$_to" > "$_cg"/cpuset.cpus
    sleep 1
}
