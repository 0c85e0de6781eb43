# Scenario restart (slot): kill -9 the daemon mid-round, restart it: no double allocation, no
# empty cpuset. Needs the controller's checkpointed state (issue 5): SKIPs until `rebalancer
# explain` exists, then SKIPs with NOT WRITTEN until written.
. /vm/lib.sh
need_subcommand restart explain "issue 5, controller state" || exit 0
verdict restart SKIP "NOT WRITTEN: the controller has landed, but this scenario body is still a slot (tests/vm/scenarios/restart.sh)"
