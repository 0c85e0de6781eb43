# Scenario bad-input: against a running daemon holding admitted containers, malformed admission
# API requests — bad JSON, unknown fields, an oversized body, wrong types, a negative CPU
# request, a request above its limit, an empty uid, a `..` path in explain, DELETE of an unknown
# pod, an unknown endpoint — each get a 4xx with a message; then malformed configs reloaded with
# SIGHUP (a TOML syntax error, an unknown key next to a valid change, an out-of-range value) are
# refused and the running config kept. Afterwards the daemon answers status with the same
# document, every cpuset.cpus / cpuset.mems under /sys/fs/cgroup is byte-identical, and a valid
# request still succeeds.
. /vm/lib.sh
. /vm/topology.env
S=bad-input
require_subcommand $S admit || exit 0
LOG=/tmp/bi-daemon.log
fail() { daemon_fail $S $LOG "$*"; }
# An hour's period: no period round can fall between the two snapshots, however slow the guest.
good_conf() { kube_conf /tmp/bi.toml /tmp/bi-state 3600000; }
good_conf
kdir kubepods.slice/kubepods-besteffort.slice || fail "cannot make the kubepods cgroups"
start_daemon /tmp/bi.toml $LOG || fail "the daemon did not start"
# Something to lose: an exclusive container (API + watcher) and a BestEffort one (watcher).
G1=11111111-0000-4000-8000-0000000000b1
gpod_json $G1 1 > /tmp/bi-g1.json
rebalancer admit --pod /tmp/bi-g1.json > /dev/null || fail "admitting $G1 failed"
for d in "$(pod_slice guaranteed $G1)/cri-containerd-$(cid 21).scope" "$(pod_slice besteffort 33333333-0000-4000-8000-0000000000b1)/cri-containerd-$(cid 22).scope"; do
    kdir "$(dirname "$d")" || fail "cannot make $(dirname "$d")"
    out=$(guest-tool mkcg --dir "$CG/$d")
    [ "$(kv written_us "$out")" != none ] || fail "no cpuset written for $d ($out)"
done
# The placements above start event rounds and their follow-ups (daemon/trigger.rs: a follow-up
# 1 s after an event round, rounds at least 1 s apart). With an hour's period nothing else starts
# one, so wait until no round has run for 3 s: from then on any round, decision or counter that
# changes was caused by the bad input below.
rounds() { rebalancer status --json | tr -d ' \n' | sed -n 's/.*"rounds":\([0-9]*\).*/\1/p'; }
last=$(rounds); still=0; i=0
while [ $still -lt 6 ]; do
    i=$((i + 1)); [ $i -lt 120 ] || fail "rounds never went quiet after the placements (rounds $(rounds))"
    sleep 0.5
    now=$(rounds)
    if [ -n "$now" ] && [ "$now" = "$last" ]; then still=$((still + 1)); else still=0; last=$now; fi
done
echo "# rounds quiet at $last before the bad input"
cpuset_snapshot > /tmp/bi-before.txt
rebalancer status --json > /tmp/bi-status-before.json || fail "status did not answer"

# expect NAME CODE CMD...: CMD (a rebalancer client) must fail with HTTP CODE and a message.
n=0
codes=""
expect() {
    name=$1; want=$2; shift 2
    "$@" > /tmp/bi.out 2> /tmp/bi.err
    rc=$?
    got=$(sed -n 's/.*the daemon answered HTTP \([0-9]*\).*/\1/p' /tmp/bi.err)
    [ "$rc" = 3 ] && got=409   # the client's exit status for a policy rejection
    msg=$(tr -d '\n' < /tmp/bi.out | head -c 160)
    echo "# $name: rc=$rc HTTP ${got:-none}: $msg"
    [ "$rc" != 0 ] || fail "$name: accepted (rc 0): $msg"
    [ "$got" = "$want" ] || fail "$name: expected HTTP $want, got ${got:-no answer} ($(cat /tmp/bi.err | head -c 200))"
    [ -n "$msg" ] || fail "$name: HTTP $got without a message"
    n=$((n + 1)); codes="$codes $name=$got"
}
body() { printf '%s' "$2" > /tmp/bi-$1.json; echo /tmp/bi-$1.json; }
expect bad-json 400 rebalancer admit --pod "$(body badjson '{"uid":"x","containers":[{"name":')"
expect not-json 400 rebalancer admit --pod "$(body notjson 'uid=x containers=1')"
expect empty-body 400 rebalancer admit --pod "$(body empty '')"
expect unknown-field 400 rebalancer admit --pod "$(body unknown '{"uid":"x","containers":[{"name":"c","cpu_request_millis":1000,"gpus_please":8}]}')"
expect wrong-types 400 rebalancer admit --pod "$(body types '{"uid":5,"containers":"all of them"}')"
expect negative-cpu 400 rebalancer admit --pod "$(body neg '{"uid":"x","containers":[{"name":"c","cpu_request_millis":-1000,"cpu_limit_millis":-1000}]}')"
expect huge-cpu 400 rebalancer admit --pod "$(body huge '{"uid":"x","containers":[{"name":"c","cpu_request_millis":1e30}]}')"
expect request-above-limit 422 rebalancer admit --pod "$(body above '{"uid":"x","containers":[{"name":"c","cpu_request_millis":2000,"cpu_limit_millis":1000}]}')"
expect empty-uid 422 rebalancer admit --pod "$(body nouid '{"uid":"","containers":[{"name":"c"}]}')"
expect duplicate-container 422 rebalancer admit --pod "$(body dup '{"uid":"x","containers":[{"name":"c"},{"name":"c"}]}')"
# 80 KiB: over the 64 KiB body limit.
awk 'BEGIN{printf "{\"uid\":\"big\",\"containers\":[{\"name\":\"c\"}],\"pad\":\""; for (i = 0; i < 81920; i++) printf "x"; printf "\"}"}' > /tmp/bi-big.json
expect oversized 413 rebalancer admit --pod /tmp/bi-big.json
expect explain-dotdot 400 rebalancer explain "kubepods.slice/../../etc"
expect explain-dotdot-only 400 rebalancer explain ".."
expect explain-unmanaged 404 rebalancer explain "no/such/cgroup"
expect delete-unknown 404 rebalancer admit --release --pod "$(body unknownpod '{"uid":"99999999-0000-4000-8000-000000000000"}')"
expect delete-dotdot 404 rebalancer admit --release --pod "$(body dotdot '{"uid":"../../etc"}')"
expect a-pod-twice 409 rebalancer admit --pod /tmp/bi-g1.json
kill -0 $DAEMON 2>/dev/null || fail "the daemon died under malformed requests"

# Malformed configs via SIGHUP: each refused, the running config kept (dry_run stays false).
reloads=0
for bad in '[daemon' '[daemon]
dry_run = true
typo_key = 1' '[daemon]
dry_run = true
[controller]
period_ms = 5' '[placement]
policy = "sometimes"'; do
    good_conf
    printf '%s\n' "$bad" > /tmp/bi.toml
    before=$(grep -c "config reload failed" $LOG)
    kill -HUP $DAEMON
    i=0
    until [ "$(grep -c "config reload failed" $LOG)" -gt "$before" ]; do
        i=$((i + 1)); [ $i -lt 50 ] || fail "no 'config reload failed' logged for config: $bad"
        sleep 0.2
    done
    kill -0 $DAEMON 2>/dev/null || fail "the daemon died on SIGHUP with config: $bad"
    reloads=$((reloads + 1))
done
grep "config reload failed" $LOG | tail -4 | sed 's/^/# /'
rebalancer status --json > /tmp/bi-status-after.json || fail "status does not answer after the bad input"
grep -q '"dry_run": *false' /tmp/bi-status-after.json || fail "a refused config changed dry_run: $(grep dry_run /tmp/bi-status-after.json)"
cpuset_snapshot > /tmp/bi-after.txt
if ! cmp -s /tmp/bi-before.txt /tmp/bi-after.txt; then
    diff /tmp/bi-before.txt /tmp/bi-after.txt
    fail "cpusets changed under bad input"
fi
if ! cmp -s /tmp/bi-status-before.json /tmp/bi-status-after.json; then
    diff /tmp/bi-status-before.json /tmp/bi-status-after.json | head -20
    fail "the status document changed under bad input"
fi
# Still serving: the good config reloads, a valid pod is admitted and released.
good_conf
kill -HUP $DAEMON
i=0
until grep -q "config reloaded" $LOG; do
    i=$((i + 1)); [ $i -lt 50 ] || fail "the good config was not reloaded"
    sleep 0.2
done
echo '{"uid":"after-bad-input","containers":[{"name":"c","cpu_request_millis":100}]}' > /tmp/bi-ok.json
rebalancer admit --pod /tmp/bi-ok.json > /dev/null || fail "a valid pod was refused after the bad input"
rebalancer admit --release --pod /tmp/bi-ok.json > /dev/null || fail "releasing the valid pod failed"
cells=$(wc -l < /tmp/bi-after.txt)
kill $DAEMON
verdict $S PASS "$n malformed requests each got a 4xx with a message ($codes), $reloads malformed configs refused on SIGHUP (running config kept); $cells cgroups' cpusets and the status document byte-identical; valid admit/release and reload still work"
