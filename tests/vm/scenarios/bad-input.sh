# Scenario bad-input (slot): malformed API requests and config leave the running daemon and all
# cpusets intact. Needs the admission API (issue 6): SKIPs until `rebalancer admit` exists, then
# FAILs until written.
. /vm/lib.sh
need_subcommand bad-input admit "issue 6, admission API" || exit 0
verdict bad-input FAIL "the API has landed but this scenario's body is not written yet (tests/vm/scenarios/bad-input.sh)"
