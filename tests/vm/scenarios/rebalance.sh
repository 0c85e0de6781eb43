# Scenario rebalance (slot): with kernel.numa_balancing=0 and the daemon running, a process whose
# memory is on node 1 while it runs on node 0 ends >= 95% local within 3 periods, pages migrated
# counted. Needs the controller (issue 5): SKIPs until `rebalancer explain` exists; once it does,
# this slot FAILs until its body is written, so the gap cannot go unnoticed.
. /vm/lib.sh
need_subcommand rebalance explain "issue 5, the controller" || exit 0
verdict rebalance FAIL "the controller has landed but this scenario's body is not written yet (tests/vm/scenarios/rebalance.sh)"
