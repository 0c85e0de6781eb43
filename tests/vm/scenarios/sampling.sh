# Scenario sampling (host-judged): `rebalancer sample --json` for a cgroup spanning every CPU
# node shows on-CPU time on each of them and cross-node migrations; once its cpuset pins it to
# the first CPU node, time on that node only and no cross-node migrations. The same samples'
# `runnable_per_cpu` (run queues the cpu-clock samples read) is judged as `sampling-runq`: a
# spinner or more per CPU spanning, all of them on the first node's CPUs once pinned.
. /vm/lib.sh
. /vm/topology.env
require_subcommand sampling sample || exit 0
cg=/sys/fs/cgroup/vmtest-span
mkdir "$cg" || { verdict sampling FAIL "cannot create $cg"; exit 0; }
a=$(first_cpu_node)
b=$(last_cpu_node)
flip=$(echo $CPU_NODES | tr ' ' ',')
# One spinning thread per CPU, and one more that moves itself round every CPU node.
sh -c "echo \$\$ > $cg/cgroup.procs && exec guest-tool spin --threads $NCPUS --seconds 600" &
sh -c "echo \$\$ > $cg/cgroup.procs && exec guest-tool spin --threads 1 --seconds 600 --flip-nodes $flip --flip-ms 200" &
flipper=$!
sleep 1
echo "# spanning: cpuset.cpus.effective=$(cat $cg/cpuset.cpus.effective) procs=$(wc -l < $cg/cgroup.procs)"
t=$(uptime_s)
data span rebalancer sample --seconds 3 --cgroup "$cg" --json
echo "# span sample took $(awk -v a=$t -v b=$(uptime_s) 'BEGIN{print b-a}') s"
kill "$flipper"
cpus_of "$a" > "$cg"/cpuset.cpus
echo "$a" > "$cg"/cpuset.mems
sleep 1
echo "# pinned: cpuset.cpus.effective=$(cat $cg/cpuset.cpus.effective) mems=$(cat $cg/cpuset.mems.effective)"
data pinned rebalancer sample --seconds 3 --cgroup "$cg" --json
exit 0
