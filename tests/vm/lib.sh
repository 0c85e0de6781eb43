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

# need_subcommand SCENARIO SUBCOMMAND ISSUE: prints SKIP and returns 1 when
# `rebalancer SUBCOMMAND --help` fails (the feature has not landed yet).
need_subcommand() {
    if rebalancer "$2" --help >/dev/null 2>&1; then return 0; fi
    verdict "$1" SKIP "rebalancer has no '$2' subcommand yet ($3)"
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
        [ -s "$p/cmdline" ] || continue   # kernel threads have an empty cmdline
        kill -9 "$pid" 2>/dev/null
    done
    sleep 0.2
    for d in $(find /sys/fs/cgroup -mindepth 1 -type d | sort -r); do rmdir "$d" 2>/dev/null; done
}
