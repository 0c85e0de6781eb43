# Scenario topology (host-judged, see xtask/src/vm/judge.rs): the guest's own /sys numbers and
# `rebalancer topology --json`, each compared on the host with the QEMU command line.
. /vm/lib.sh
. /vm/topology.env
sysfs_facts() {
    for d in /sys/devices/system/node/node*; do
        echo "node=${d##*node} cpus=$(cat "$d"/cpulist) memtotal_kb=$(awk '/MemTotal/ {print $4}' "$d"/meminfo) distance=$(tr ' ' ',' < "$d"/distance)"
    done
    echo "online=$(cat /sys/devices/system/node/online) has_cpu=$(cat /sys/devices/system/node/has_cpu) has_memory=$(cat /sys/devices/system/node/has_memory)"
}
data sysfs sysfs_facts
data reader rebalancer topology --json
rebalancer topology 2>&1 | head -20
exit 0
