#!/bin/bash
# CPU time per planner_scale round, less sensitive to host load than criterion's wall time.
# Usage (as root, perf installed): rebalancer/benches/cpu_per_round.sh BIN NAME FILTER [SECS]
#   BIN    a built planner_scale bench binary (cargo bench -p rebalancer --bench planner_scale --no-run)
#   NAME   a name for the uprobe (one per binary)
#   FILTER a criterion filter, e.g. 'planner_round/32n/10000$'
# A uprobe on controller::plan_scored (or plan) counts the rounds; cpu-clock samples (1 ms each) whose stack
# is inside criterion's Bencher::iter (state clone + observe + plan + the plan's drop) give the
# CPU time spent in them. CPU ms per round = those samples / rounds.
set -euo pipefail
bin=$1; name=$2; filt=$3; secs=${4:-4}
# The round's planner entry: `plan_scored` where the bench calls it, else (older builds) `plan`.
addr=0x$(nm "$bin" | { grep ' T _ZN10rebalancer10controller7planner11plan_scored17h' || true; } | awk '{print $1}')
if [ "$addr" = 0x ]; then
    addr=0x$(nm "$bin" | grep ' T _ZN10rebalancer10controller7planner4plan17h' | awk '{print $1}')
fi
read -r off vaddr <<<"$(readelf -lW "$bin" | awk '/LOAD/ && / R E / {print $2, $3}')"
fo=$(printf '0x%x' $((addr - vaddr + off)))
perf probe -q -x "$bin" -a "$name=$fo" 2>/dev/null || true
ev=$(perf probe -l 2>/dev/null | grep -o "probe_[a-z_0-9]*:$name" | head -1)
data=$(mktemp)
perf record -q -o "$data" -e cpu-clock -F 1000 --call-graph dwarf,8192 -e "$ev" \
    "$bin" --bench "$filt" --profile-time "$secs" --noplot >/dev/null 2>&1
perf script -i "$data" -F event,ip,sym 2>/dev/null | python3 -c "
import sys
calls = ins = 0
for s in sys.stdin.read().split('\n\n'):
    s = s.strip()
    if not s:
        continue
    if 'probe' in s.split('\n')[0]:
        calls += 1
    elif 'Bencher' in s:
        ins += 1
print('$filt: %.1f CPU ms per round (%d rounds)' % (ins / max(calls, 1), calls))
"
rm -f "$data"
