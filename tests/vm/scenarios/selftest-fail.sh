# Scenario selftest-fail (not run by default): a harness self-test. It always FAILs, so
# `cargo xtask vm-test --scenario selftest-fail` must exit non-zero and keep the guest log.
. /vm/lib.sh
verdict selftest-fail FAIL "failing on purpose to prove that a FAIL fails vm-test"
