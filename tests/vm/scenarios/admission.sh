# Scenario admission (slot): cgroups created in the Kubernetes layout (Guaranteed, Burstable,
# BestEffort) get cpusets and mems from the watcher that satisfy the policy. Needs the admission
# API and watcher (issue 6): SKIPs until `rebalancer admit` exists, then SKIPs with NOT WRITTEN until written.
. /vm/lib.sh
need_subcommand admission admit "issue 6, admission API and watcher" || exit 0
verdict admission SKIP "NOT WRITTEN: admission has landed, but this scenario body is still a slot (tests/vm/scenarios/admission.sh)"
