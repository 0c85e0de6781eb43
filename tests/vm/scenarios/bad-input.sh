# Scenario bad-input (slot): malformed API requests and config leave the running daemon and all
# cpusets intact. Needs the admission API (issue 6): SKIPs until `rebalancer admit` exists, then
# SKIPs with NOT WRITTEN until written.
. /vm/lib.sh
need_subcommand bad-input admit "issue 6, admission API" || exit 0
verdict bad-input SKIP "NOT WRITTEN: the API has landed, but this scenario body is still a slot (tests/vm/scenarios/bad-input.sh)"
