# Scenario written-cost (not run by default; a bench): what the measured access source
# (`controller.written_pages`, on by default) costs the workload it reads, on the guest's kernel
# (Debian's, with soft-dirty tracking). One busy writer of WRITTEN_COST_MIB MiB (default 256) on
# the first CPU node, 16 MiB it never writes on the last one (memory on two nodes: the daemon
# reads it every period), once with transparent huge pages (the kernel's default here) and once
# with 4 KiB pages only. Three windows of the same process each (20 s, the writer's clock):
#   none      numa_balancing=0, no daemon;
#   daemon    the daemon with its defaults (5 s period) in dry-run: it reads the written pages
#             (clear_refs, pagemap) as always and moves nothing, so the window is all sampling;
#   autonuma  numa_balancing=1, no daemon: the kernel's own sampling (hinting faults).
# Per window: pages written per second (what the writer got done; noisy under TCG), its minor
# faults per second, and the daemon's own CPU time per period. FAIL when the daemon's source is
# not on, when its window shows no more faults than the window without it (the cost was not
# exercised), or more than one fault per written page per period (past the design).
. /vm/lib.sh
. /vm/topology.env
S=written-cost
require_subcommand $S explain || exit 0
a=$(first_cpu_node)
b=$(last_cpu_node)
[ "$a" != "$b" ] || { verdict $S SKIP "one CPU node: no remote memory to keep"; exit 0; }
MIB=${WRITTEN_COST_MIB:-256}
WIN=20
PERIOD_S=5
cg=$CG/vmtest-wc
out=/tmp/wc-work.out
log=/tmp/wc-daemon.log
cat > /tmp/wc.toml <<CONF
[daemon]
state_dir = "/tmp/wc-state"
dry_run = true
[cgroups]
roots = ["vmtest-wc"]
kubernetes = false
[server]
socket = "$SOCK"
metrics_listen = "127.0.0.1:9717"
CONF

# window NAME: WIN s of the writer's clock; prints the ROW and sets FPS (minor faults per s).
window() {
    _l0=$(grep '^HOTSET' $out | tail -1)
    _c0=na
    [ -n "$DAEMON" ] && _c0=$(awk '{print $14 + $15}' /proc/$DAEMON/stat)
    sleep $WIN
    _l1=$(grep '^HOTSET' $out | tail -1)
    _c1=na
    [ -n "$DAEMON" ] && _c1=$(awk '{print $14 + $15}' /proc/$DAEMON/stat)
    _s=$(awk -v a="$(kv t "$_l0")" -v b="$(kv t "$_l1")" 'BEGIN{printf "%.1f", b - a}')
    _pps=$(awk -v a="$(kv written "$_l0")" -v b="$(kv written "$_l1")" -v s="$_s" 'BEGIN{printf "%.0f", (b - a) / s}')
    FPS=$(awk -v a="$(kv minflt "$_l0")" -v b="$(kv minflt "$_l1")" -v s="$_s" 'BEGIN{printf "%.0f", (b - a) / s}')
    _dcpu=na
    [ "$_c0" != na ] && _dcpu=$(awk -v a="$_c0" -v b="$_c1" -v s="$_s" -v p=$PERIOD_S -v hz="$(getconf CLK_TCK 2>/dev/null || echo 100)" \
        'BEGIN{printf "%.0f", (b - a) * 1000 / hz / s * p}')
    echo "ROW pages=$PAGES_KIND cond=$1 seconds=$_s pages_written_per_s=$_pps minor_faults_per_s=$FPS daemon_cpu_ms_per_period=$_dcpu"
}

# measure KIND FLAGS: one writer (guest-tool hotset FLAGS), its three windows; sets SUMMARY, or
# prints the verdict and exits on a failure.
measure() {
    PAGES_KIND=$1
    echo 0 > /proc/sys/kernel/numa_balancing
    mkdir -p "$cg" || { verdict $S FAIL "cannot create $cg"; exit 0; }
    cat $CG/cpuset.cpus.effective > "$cg"/cpuset.cpus
    cat $CG/cpuset.mems.effective > "$cg"/cpuset.mems
    : > $out
    # It stays on the first node's CPUs (its own affinity); its cgroup spans every node.
    sh -c "echo \$\$ > $cg/cgroup.procs && exec guest-tool hotset --hot-mib $MIB --hot-node $a --cold-mib 16 --cold-node $b --run-node $a --seconds 900 --interval-ms 1000 $2" > $out 2>&1 &
    WORK=$!
    _i=0
    until grep -q '^HOTSET' $out; do
        sleep 0.5; _i=$((_i + 1))
        [ $_i -lt 240 ] || { cat $out; verdict $S FAIL "the writer never started writing"; exit 0; }
    done
    echo "# $PAGES_KIND: $(grep -m1 '"allocated"' $out); AnonHugePages: $(awk '/AnonHugePages/ {print $2, $3}' /proc/$WORK/smaps_rollup)"

    DAEMON=
    window none
    none_fps=$FPS

    rm -rf /tmp/wc-state
    RUST_LOG=rebalancer=debug start_daemon /tmp/wc.toml $log || { tail -20 $log; kill -9 $WORK; verdict $S FAIL "daemon did not start"; exit 0; }
    # Its first period only clears: the window starts after it.
    sleep $((PERIOD_S + 1))
    src=$(rebalancer status --json | tr -d ' \n' | tr '{' '\n' | grep '"name":"written_pages' | head -1 | cut -c1-300)
    echo "# daemon up after ${DAEMON_UP} s; written-pages source: $src"
    case $src in
        *'"available":true'*) ;;
        *) kill -9 $WORK; kill $DAEMON; verdict $S FAIL "the written-pages source is not on with the defaults: $src"; exit 0 ;;
    esac
    window daemon
    rb_fps=$FPS
    echo "# daemon log on written pages:"; grep 'written pages' $log | tail -3 | cut -c1-300
    kill -0 $DAEMON 2>/dev/null || { kill -9 $WORK; verdict $S FAIL "the daemon exited"; exit 0; }
    kill $DAEMON 2>/dev/null
    _i=0; while kill -0 $DAEMON 2>/dev/null && [ $_i -lt 50 ]; do sleep 0.2; _i=$((_i + 1)); done
    DAEMON=

    echo 1 > /proc/sys/kernel/numa_balancing
    window autonuma
    echo 0 > /proc/sys/kernel/numa_balancing
    an_fps=$FPS
    kill -9 $WORK 2>/dev/null
    _i=0; while [ -d /proc/$WORK ] && [ $_i -lt 60 ]; do sleep 0.5; _i=$((_i + 1)); done
    rmdir $cg 2>/dev/null

    pages=$((MIB * 256))
    SUMMARY="$SUMMARY $PAGES_KIND: minor faults per s none $none_fps, daemon $rb_fps, AutoNUMA $an_fps;"
    [ "$rb_fps" -gt "$none_fps" ] || { verdict $S FAIL "the daemon's window shows no faults of its own: the source did not read the writer ($SUMMARY)"; exit 0; }
    # One fault per written page per period at most (+10% for the window's edges).
    [ $((rb_fps - none_fps)) -le $((pages * 11 / 10 / PERIOD_S)) ] || { verdict $S FAIL "more than one fault per written page per period: $SUMMARY"; exit 0; }
}

SUMMARY=
measure thp ""
measure 4k --no-thp
verdict $S PASS "$SUMMARY ($((MIB * 256)) pages written, period ${PERIOD_S} s)"
