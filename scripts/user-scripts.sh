#!/usr/bin/env bash
# Runs, in a short mode, every script the README and docs name that no test
# runs whole, the way a new user would: from the clone's root, with none of
# the variables the tests set (TALLYD, TALLY_*, LOCALNET_DIR, ...). Each
# script is one check; the end is a libtest-style totals line that
# scripts/test.sh adds to its own:
#   test result: ok|FAILED. N passed; M failed; K skipped;
# (localnet/up.sh with its options, node.sh, down.sh and upgrade.sh are run by
# the end-to-end tests; this runs the README's own `localnet/up.sh`.)
#
#   scripts/user-scripts.sh
set -uo pipefail
cd "$(dirname "$0")/.."

# What a new user's shell would not have. CARGO_TARGET_DIR stays (the scripts
# default to the same directory), and so do the coverage build's variables.
for v in $(compgen -e); do
  case "$v" in
    TALLY_COVERAGE) ;;
    TALLY* | LOCALNET_* | NVAL) unset "$v" ;;
  esac
done

passed=0
failed=0
skipped=0
log_dir="$(mktemp -d)"
trap 'localnet/down.sh >/dev/null 2>&1; rm -rf "$log_dir"' EXIT

# check NAME CMD...: runs CMD, its output to a log shown on failure.
check() {
  local name="$1" t0 rc log
  shift
  log="$log_dir/$(echo "$name" | tr -c 'a-zA-Z0-9' _).log"
  t0=$(date +%s)
  echo "-- $name: $*"
  "$@" > "$log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
    echo "script $name ... ok ($(($(date +%s) - t0)) s)"
  else
    failed=$((failed + 1))
    echo "script $name ... FAILED (exit $rc after $(($(date +%s) - t0)) s); its last lines:"
    tail -40 "$log" | sed 's/^/    /'
  fi
}

skip() {
  skipped=$((skipped + 1))
  echo "script $1 ... SKIPPED: $2"
}

# The README's first command, then what it says to run next against it.
check "localnet/up.sh" localnet/up.sh
check "localnet/status.sh" bash -c '
  out=$(localnet/status.sh) || exit 1
  echo "$out"
  # every genesis validator answers with a height and runs both processes
  n=$(echo "$out" | awk "\$1 ~ /^node[0-9]+\$/ && \$3 ~ /^[0-9]+\$/ && \$5 == \"cometbft\" && \$6 == \"tallyd\"" | wc -l)
  [ "$n" -ge 4 ] || { echo "expected 4 running validators with a height, got $n"; exit 1; }'
check "scripts/hub-deposit-burst.py --count 200" bash -c '
  source localnet/lib.sh
  python3 scripts/hub-deposit-burst.py --hub "$(hub_rpc_url)" --count 200 --threads 4'
check "localnet/down.sh" bash -c 'localnet/down.sh && ! pgrep -f "$PWD/localnet/.data" >/dev/null'

check "scripts/chaos.sh --minutes 1" scripts/chaos.sh --minutes 1
check "scripts/bench.sh finalize --blocks 5" scripts/bench.sh finalize --blocks 5
check "scripts/bench.sh dkg --sizes 4" scripts/bench.sh dkg --sizes 4
check "scripts/bench.sh network (quick check)" scripts/bench.sh network --apps tally,kvstore \
  --sizes 1 --step-secs 5 --max-steps 2
if [ -x scripts/faults.sh ]; then
  check "scripts/faults.sh --smoke" scripts/faults.sh --smoke
else
  failed=$((failed + 1))
  echo "script scripts/faults.sh ... FAILED: missing"
fi
if [ "${TALLY_COVERAGE:-0}" = 1 ]; then
  # The instrumented build is already there: only the client's tests run.
  check "scripts/coverage.sh --crate client" scripts/coverage.sh --crate client
else
  skip "scripts/coverage.sh --crate client" \
    "only with TALLY_COVERAGE=1 (.ci/run), which builds the workspace instrumented"
fi

verdict=ok
[ "$failed" -eq 0 ] || verdict=FAILED
echo "test result: $verdict. $passed passed; $failed failed; $skipped skipped;"
[ "$failed" -eq 0 ]
