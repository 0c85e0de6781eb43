#!/usr/bin/env bash
# How far Static's own slowdown moves when one job of a churn-storm trace lives one second
# longer (BENCHMARKS.md, "Simulator: the oracle's gain on machines never tuned on"): the
# spread a case's "slower than Static" is read against. One row per machine of a half (every
# other seed from FIRST: 1000 the tune half, 1001 the held-out one): Static, Rebalancer −
# Static, and Static's change under each of PERTURB perturbations (the job chosen by a fixed
# rule on the machine seed).
#
#   scripts/sim-perturb.sh [BINARY]       (default: target/release/rebalancer)
#   FIRST=1000 COUNT=60 PERTURB=3 KIND=churn-storm scripts/sim-perturb.sh
#
# Needs jq.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/rebalancer}
FIRST=${FIRST:-1000}
COUNT=${COUNT:-60}
PERTURB=${PERTURB:-3}
KIND=${KIND:-churn-storm}
# The trace seed of a kind on a machine, as `sim::heldout::cases` derives it.
case $KIND in
multi-tenant) k=1 ;; database) k=2 ;; gpu) k=3 ;; churn-storm) k=4 ;;
*) echo "unknown KIND $KIND" >&2; exit 2 ;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
slowdown() { # machine trace policy
    "$bin" simulate --machine "$1" --workload "$2" --policy "$3" --json |
        jq -r '.policies[0].slowdown'
}
echo "| machine | Static | Rebalancer − Static | Static, one job 1 s longer − Static |"
echo "|---|---:|---:|---|"
for ((m = FIRST; m < FIRST + COUNT; m += 2)); do
    "$bin" simulate --generate "$KIND" --seed $((m * 7919 + k)) >"$tmp/t.json"
    s=$(slowdown "$m" "$tmp/t.json" static)
    r=$(slowdown "$m" "$tmp/t.json" rebalancer)
    jobs=($(jq -r '.tasks | to_entries[] | select(.value.leave_s != null) | .key' "$tmp/t.json"))
    ds=()
    for ((j = 0; j < PERTURB; j++)); do
        i=${jobs[$(((m * 31 + j * 977) % ${#jobs[@]}))]}
        jq ".tasks[$i].leave_s += 1" "$tmp/t.json" >"$tmp/p.json"
        ds+=("$(jq -n "$(slowdown "$m" "$tmp/p.json" static) - $s" | xargs printf '%+.4f')")
    done
    printf '| %s | %.4f | %+.4f | %s |\n' "$m" "$s" "$(jq -n "$r - $s")" "${ds[*]}"
done
