#!/usr/bin/env bash
# Runs every Tally check and test: formatting, clippy, unit and property
# tests, the in-process ABCI driver, the end-to-end tests against real
# CometBFT processes on loopback (reported SKIPPED, not passed, when cometbft
# is missing), and the wire-format check of the hand-derived protobuf types
# (tools/proto-check, a workspace of its own). Installs what is missing first.
# Then runs, in a short mode, every script the README and docs name that no
# test runs (scripts/user-scripts.sh). Ends with `tests: N passed, M failed`
# (`, K skipped` when some were).
#
# With TALLY_COVERAGE=1 (.ci/run sets it) the workspace's crates are built
# with coverage instrumentation (scripts/coverage-rustc.sh; dependencies are not)
# and the whole run, end-to-end tests and scripts included, ends with the
# per-crate line coverage, checked against the floors in scripts/coverage.sh.
#
#   scripts/test.sh                 everything
#   scripts/test.sh --count LOG     only the totals line of a captured test log
set -euo pipefail
cd "$(dirname "$0")/.."

# count LOG: sums the `test result:` lines of libtest and of the end-to-end
# runner (which adds `K skipped;`) into the totals line.
count() {
  awk '
    /^test result: / {
      for (i = 1; i < NF; i++) {
        if ($i !~ /^[0-9]+$/) continue
        if ($(i + 1) ~ /^passed;?$/) p += $i
        if ($(i + 1) ~ /^failed;?$/) f += $i
        if ($(i + 1) ~ /^skipped;?$/) k += $i
      }
    }
    END {
      printf "tests: %d passed, %d failed", p, f
      if (k > 0) printf ", %d skipped", k
      printf "\n"
    }' "$1"
}
if [ "${1:-}" = "--count" ]; then
  [ -f "${2:-}" ] || { echo "usage: scripts/test.sh --count LOG" >&2; exit 2; }
  count "$2"
  exit 0
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tally-target}"
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
export PATH="$PATH:$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"
proto_check=(--manifest-path tools/proto-check/Cargo.toml)

localnet/install-deps.sh

# Disk: a warm target dir can hold plain and instrumented builds of the
# workspace and cargo's incremental caches (tens of GiB: each plain test
# executable carries RocksDB's C++ debug info, ~470 MB). When the disk under
# it has less than $min_free GiB free, drop what is cheap to rebuild: the
# incremental caches, old coverage profiles and, if still short, the
# workspace crates' own artifacts (~8 min to rebuild). The dependencies stay
# (RocksDB alone is ~25 min on 2 cores).
min_free=50
mkdir -p "$CARGO_TARGET_DIR"
free_gib() { df -Pk "$CARGO_TARGET_DIR" | awk 'NR == 2 { print int($4 / 1048576) }'; }
echo "== disk: $(free_gib) GiB free under $CARGO_TARGET_DIR"
if [ "$(free_gib)" -lt "$min_free" ]; then
  echo "   under $min_free GiB: removing incremental caches and old coverage profiles"
  rm -rf "$CARGO_TARGET_DIR"/*/incremental "$CARGO_TARGET_DIR/coverage"
  if [ "$(free_gib)" -lt "$min_free" ]; then
    echo "   still under $min_free GiB: removing the workspace crates' artifacts"
    mapfile -t members < <(cargo metadata --no-deps --format-version 1 |
      python3 -c 'import json, sys; [print(p["name"]) for p in json.load(sys.stdin)["packages"]]')
    for m in "${members[@]}"; do cargo clean --release -p "$m" 2>/dev/null || true; done
  fi
  echo "   now $(free_gib) GiB free"
fi
# Coverage: an instrumented build beside the plain one (other hashes, same
# dependencies); every instrumented process adds its counts to a pool of
# profiles per executable (%8m: merged online, whatever the number of
# processes). Cargo's JSON messages name the executables for llvm-cov.
cargo_json=/dev/null
if [ "${TALLY_COVERAGE:-0}" = 1 ]; then
  cov_dir="$CARGO_TARGET_DIR/coverage/suite"
  rm -rf "$cov_dir"
  mkdir -p "$cov_dir"
  export RUSTC_WORKSPACE_WRAPPER="$PWD/scripts/coverage-rustc.sh"
  # One instrumented build per run: no incremental cache to keep beside it.
  export CARGO_INCREMENTAL=0
  export LLVM_PROFILE_FILE="$cov_dir/%8m%c.profraw"
  cargo_json="$cov_dir/cargo.json"
fi
echo "== cargo fmt --check"
cargo fmt --all -- --check
cargo fmt "${proto_check[@]}" --all -- --check
echo "== build (release profile; first run compiles RocksDB, ~25 min on 2 cores)"
cargo build --release --locked --workspace --all-targets \
  --message-format=json-render-diagnostics > "$cargo_json"
# The test-only tallyd-byzantine of tests/tests/e2e_byzantine.rs (feature
# `byzantine`, which no workspace crate enables): `--bin`, so that tallyd is
# not rebuilt with the feature; checked below.
echo "== build tallyd-byzantine (test-only)"
cargo build --release --locked -p tally-node --features byzantine --bin tallyd-byzantine \
  --message-format=json-render-diagnostics >> "$cargo_json"
if grep -q TALLY_BYZANTINE_MODE "$CARGO_TARGET_DIR/release/tallyd"; then
  echo "error: $CARGO_TARGET_DIR/release/tallyd contains the byzantine wrapper" >&2
  exit 1
fi
export TALLY_BYZANTINE_BIN="$CARGO_TARGET_DIR/release/tallyd-byzantine"
echo "== clippy"
# (clippy-driver is cargo's workspace wrapper itself: not the coverage one)
env -u RUSTC_WORKSPACE_WRAPPER cargo clippy --release --locked --workspace --all-targets -- -D warnings
env -u RUSTC_WORKSPACE_WRAPPER cargo clippy --release --locked -p tally-node --features byzantine --all-targets -- -D warnings
env -u RUSTC_WORKSPACE_WRAPPER cargo clippy --release --locked "${proto_check[@]}" --all-targets -- -D warnings
echo "== tests (unit, property, in-process ABCI driver, end-to-end on CometBFT, wire format, user scripts)"
# Two lanes at once, each with a log of its own (shown whole when it ends):
#   1. unit, property and driver tests, the byzantine wrapper's unit tests,
#      the wire-format check, then the scripts a user runs
#      (scripts/user-scripts.sh, short modes);
#   2. the end-to-end suites (tests/tests/e2e_*.rs), one after another.
# Each end-to-end suite, chaos.sh and the benchmarks take their own port block.
log="$(mktemp)"
lane1="$(mktemp)"
lane2="$(mktemp)"
trap 'rm -f "$log" "$lane1" "$lane2"' EXIT
mapfile -t e2e < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "test" in t["kind"] and t["name"].startswith("e2e_"):
            print("--test"); print(t["name"])
')
mapfile -t other < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "test" in t["kind"] and not t["name"].startswith("e2e_"):
            print("--test"); print(t["name"])
')
set +e
(
  status=0
  cargo test --release --locked --workspace --no-fail-fast --lib --bins "${other[@]}" \
    -- --test-threads 2 || status=1
  echo "== the test-only byzantine wrapper's unit tests"
  cargo test --release --locked -p tally-node --features byzantine --lib byzantine || status=1
  echo "== wire format: settlement/src/proto.rs (+ proto/validators.rs) against proto/tally/v1/*.proto"
  cargo test --release --locked "${proto_check[@]}" || status=1
  echo "== the scripts a user runs, in a short mode (scripts/user-scripts.sh)"
  bash scripts/user-scripts.sh || status=1
  exit "$status"
) > "$lane1" 2>&1 &
lane1_pid=$!
(
  cargo test --release --locked --workspace --no-fail-fast "${e2e[@]}" -- --test-threads 2
) > "$lane2" 2>&1 &
lane2_pid=$!
wait "$lane1_pid"
lane1_status=$?
echo "== lane 1: unit, property, driver, wire format, user scripts (exit $lane1_status)"
cat "$lane1" | tee -a "$log"
wait "$lane2_pid"
lane2_status=$?
echo "== lane 2: end-to-end suites (exit $lane2_status)"
cat "$lane2" | tee -a "$log"
set -e
status=0
[ "$lane1_status" -eq 0 ] || status=$lane1_status
[ "$status" -ne 0 ] || status=$lane2_status
if [ "${TALLY_COVERAGE:-0}" = 1 ]; then
  echo "== coverage per crate (floors in scripts/coverage.sh)"
  bash scripts/coverage.sh --executables "$cargo_json" > "$cov_dir/executables"
  set +e
  bash scripts/coverage.sh --report "$cov_dir" "$cov_dir/executables" --fail-under
  cov_status=$?
  set -e
  [ "$status" -ne 0 ] || status=$cov_status
fi
echo
count "$log"
exit "$status"
