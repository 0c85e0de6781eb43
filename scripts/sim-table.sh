#!/usr/bin/env bash
# The simulator's peer table of BENCHMARKS.md ("Simulator: against the peers"): every trace
# generator × seeds × machines, policies Rebalancer, Static, Kubelet, AutoNUMA, one Markdown row
# per run with whether the Rebalancer's slowdown is ≤ min(Static, Kubelet, AutoNUMA).
#
#   scripts/sim-table.sh [BINARY...]      (default: target/release/rebalancer)
#   SEEDS="1 2 3 4" MACHINES="small-snc" KINDS="gpu" scripts/sim-table.sh
#   CONFIG=my.toml scripts/sim-table.sh   (a rebalancer config: its [placement], [controller])
#
# With several binaries (e.g. a build of main and one of a branch) each run is simulated by
# each in turn, one table per binary, so "before" and "after" come from one invocation.
# Needs jq. Build: REBALANCER_NO_EBPF=1 cargo build --release -p rebalancer --bin rebalancer
set -euo pipefail
cd "$(dirname "$0")/.."
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(target/release/rebalancer)
SEEDS=${SEEDS:-"1 2 3"}
MACHINES=${MACHINES:-"epyc-nps4 intel-snc small-snc"}
KINDS=${KINDS:-"churn-storm database gpu multi-tenant"}
cfg=()
[ -z "${CONFIG:-}" ] || cfg=(--config "$CONFIG")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for b in "${bins[@]}"; do : >"$tmp/$(basename "$b").rows"; done
for m in $MACHINES; do
  for k in $KINDS; do
    for s in $SEEDS; do
      "${bins[0]}" simulate --generate "$k" --seed "$s" >"$tmp/trace.json"
      for b in "${bins[@]}"; do
        if ! "$b" simulate --topology "$m" --workload "$tmp/trace.json" \
          --policy rebalancer,static,kubelet,autonuma --json "${cfg[@]}" >"$tmp/out.json" 2>"$tmp/err"; then
          echo "| $m | $k | $s | error: $(tr '\n' ' ' <"$tmp/err" | cut -c1-160) | | | | | | |" >>"$tmp/$(basename "$b").rows"
          continue
        fi
        jq -r --arg m "$m" --arg k "$k" --arg s "$s" '
            def p(n): .policies[] | select(.policy == n);
            (p("rebalancer")) as $r | (p("static").slowdown) as $st
            | (p("kubelet").slowdown) as $ku | (p("autonuma").slowdown) as $au
            | ([$st, $ku, $au] | min) as $min
            | (if $st == $min then "Static" elif $ku == $min then "Kubelet" else "AutoNUMA" end) as $who
            | "| \($m) | \($k) | \($s) | \($r.slowdown) | \($st) | \($ku) | \($au) | \($r.mean_locality) | \($r.moves) | "
              + (if $r.slowdown <= $min then "yes"
                 else "**no** (+\((($r.slowdown - $min) * 10000 | round) / 10000) vs \($who))" end)
              + " |"' "$tmp/out.json" >>"$tmp/$(basename "$b").rows"
      done
    done
  done
done
for b in "${bins[@]}"; do
  rows="$tmp/$(basename "$b").rows"
  echo "$b: $(grep -c '| yes |' "$rows" || true) of $(wc -l <"$rows") runs ≤ min(Static, Kubelet, AutoNUMA)"
  echo
  echo "| machine | trace | seed | Rebalancer | Static | Kubelet | AutoNUMA | Rebalancer locality | moves | Rebalancer ≤ min(others) |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"
  cat "$rows"
  echo
done
