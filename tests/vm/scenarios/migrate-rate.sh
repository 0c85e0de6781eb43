# migrate-rate (not run by default): how fast each migration path moves a busy single-threaded
# hog's memory (MIGRATE_MIB MiB, default 256, first-touched on the last CPU node, the hog then
# running on the first), per condition of the hog (running / stopped by SIGSTOP / frozen by
# cgroup.freeze) and of the rest of the guest (LOAD spinning threads beside it, default 2: with
# the hog, 3 busy vCPUs of 4, as in vm-bench). Methods:
#   cpuset   the narrowing cpuset.mems write (the kernel migrates in cpuset_migrate_mm_wq)
#   mp512q   move_pages(2) per 512 pages, a query call before and after each (the writer's old path)
#   mp512    move_pages(2) per 512 pages
#   mpall    one move_pages(2) call for every page
#   mpages   one migrate_pages(2) call (the kernel's own walk of the mm, in the caller)
#   autonuma no mover: kernel.numa_balancing=1 until 95% of the pages left node B or 40 s passed
# AutoNUMA is off (numa_balancing=0) for every other method: it would migrate the running hog's
# pages itself, and its PROT_NONE PTEs make move_pages(2) report a stopped task's pages absent.
# Run with `--node-mem-mib 1024` (the target node must hold the hog).
# Each case ("load:state:method", in CASES below) prints `RATE load=.. state=.. method=..
# pages=.. seconds=.. rate=<pages/s> thp_kb=..`; the spinners are restarted when the load changes.
. /vm/lib.sh
. /vm/topology.env
S=migrate-rate
MIB=${MIGRATE_MIB:-256}
CASES="2:running:cpuset 2:stopped:cpuset 2:running:mp512q 2:running:mp512 2:stopped:mp512 2:frozen:mp512 2:running:mpall 2:running:mpages 2:stopped:mpages 2:running:autonuma 0:running:cpuset 0:running:mp512 0:stopped:mp512"
A=$(first_cpu_node)
B=$(last_cpu_node)
[ "$A" != "$B" ] || { verdict "$S" SKIP "one CPU node"; exit 0; }
vmstat() { awk -v k="$1" '$1 == k {print $2}' /proc/vmstat; }
CG=/sys/fs/cgroup/mr
echo "+cpuset +memory +cpu" > /sys/fs/cgroup/cgroup.subtree_control
echo 0 > /proc/sys/kernel/numa_balancing
off_b() { awk -v b="N$B=" '{for (i = 1; i <= NF; i++) if (index($i, b) == 1) s += substr($i, length(b) + 1)} END {print s + 0}' /proc/"$1"/numa_maps; }
echo "# kernel $(uname -r), $(nproc) vCPUs, hog ${MIB} MiB from node $B, running on node $A"
n=0
SPIN=
cur=
for c in $CASES; do
    load=${c%%:*}; c=${c#*:}; state=${c%%:*}; method=${c#*:}
    if [ "$load" != "$cur" ]; then
        [ -n "$SPIN" ] && kill -9 "$SPIN" 2>/dev/null
        SPIN=
        if [ "$load" -gt 0 ]; then
            guest-tool spin --threads "$load" --seconds 100000 > /dev/null 2>&1 &
            SPIN=$!
        fi
        cur=$load
    fi
    mkdir "$CG" || { verdict "$S" FAIL "cannot create $CG"; exit 0; }
    echo "$A,$B" > "$CG"/cpuset.mems
    sh -c "echo \$\$ > $CG/cgroup.procs && exec guest-tool hog --mib $MIB --from-node $B --to-node $A --seconds 100000 --interval-ms 100000000" > /tmp/mr.out 2>&1 &
    P=$!
    i=0
    until grep -q '"allocated"' /tmp/mr.out; do
        sleep 0.5; i=$((i + 1))
        [ $i -lt 240 ] || { cat /tmp/mr.out; verdict "$S" FAIL "the hog never allocated"; exit 0; }
    done
    sleep 1
    thp=$(awk '/^AnonHugePages/ {s += $2} END {print s + 0}' /proc/$P/smaps 2>/dev/null)
    case $state in
        stopped) kill -STOP "$P" ;;
        frozen)
            echo 1 > "$CG"/cgroup.freeze
            i=0; until grep -q 'frozen 1' "$CG"/cgroup.events || [ $i -ge 50 ]; do sleep 0.1; i=$((i + 1)); done ;;
    esac
    m0=$(vmstat pgmigrate_success)
    t0=$(uptime_s)
    case $method in
        cpuset) echo "$A" > "$CG"/cpuset.mems ;;
        mp512q) guest-tool migrate --pid "$P" --to-node "$A" --batch-pages 512 --query ;;
        mp512) guest-tool migrate --pid "$P" --to-node "$A" --batch-pages 512 ;;
        mpall) guest-tool migrate --pid "$P" --to-node "$A" --batch-pages 100000000 ;;
        mpages) guest-tool migrate --pid "$P" --to-node "$A" --method migrate-pages ;;
        autonuma)
            all=$(off_b "$P")
            echo 1 > /proc/sys/kernel/numa_balancing
            until [ "$(off_b "$P")" -le $((all / 20)) ] || fgt "$(since "$t0")" 40; do sleep 0.5; done
            echo 0 > /proc/sys/kernel/numa_balancing ;;
    esac > /tmp/mr.migrate 2>&1
    secs=$(since "$t0")
    pages=$(($(vmstat pgmigrate_success) - m0))
    left=$(off_b "$P")
    echo 0 > "$CG"/cgroup.freeze 2>/dev/null
    kill -CONT "$P" 2>/dev/null
    rate=$(awk -v p="$pages" -v s="$secs" 'BEGIN{printf "%.0f", (s > 0 ? p / s : 0)}')
    echo "RATE load=$load state=$state method=$method pages=$pages seconds=$secs rate=$rate thp_kb=$thp left_on_$B=$left"
    sed 's/^/#   /' /tmp/mr.migrate
    kill -9 "$P" 2>/dev/null
    i=0; while [ -d /proc/"$P" ] && [ $i -lt 60 ]; do sleep 0.2; i=$((i + 1)); done
    i=0; while [ -d "$CG" ] && [ $i -lt 50 ]; do rmdir "$CG" 2>/dev/null || sleep 0.2; i=$((i + 1)); done
    n=$((n + 1))
done
[ -n "$SPIN" ] && kill -9 "$SPIN" 2>/dev/null
verdict "$S" PASS "$n cases measured (RATE lines above)"
