#!/usr/bin/env bash
# Runs every Tally check and test: formatting, clippy, unit and property
# tests, the in-process ABCI driver, the end-to-end tests against real
# CometBFT processes on loopback (reported SKIPPED, not passed, when cometbft
# is missing), and the wire-format check of the hand-derived protobuf types
# (tools/proto-check, a workspace of its own). Installs what is missing first.
# Ends with `tests: N passed, M failed` (`, K skipped` when some were).
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
echo "== cargo fmt --check"
cargo fmt --all -- --check
cargo fmt "${proto_check[@]}" --all -- --check
echo "== build (release profile; first run compiles RocksDB, ~25 min on 2 cores)"
cargo build --release --locked --workspace --all-targets
# The test-only tallyd-byzantine of tests/tests/e2e_byzantine.rs (feature
# `byzantine`, which no workspace crate enables): `--bin`, so that tallyd is
# not rebuilt with the feature; checked below.
echo "== build tallyd-byzantine (test-only)"
cargo build --release --locked -p tally-node --features byzantine --bin tallyd-byzantine
if grep -q TALLY_BYZANTINE_MODE "$CARGO_TARGET_DIR/release/tallyd"; then
  echo "error: $CARGO_TARGET_DIR/release/tallyd contains the byzantine wrapper" >&2
  exit 1
fi
export TALLY_BYZANTINE_BIN="$CARGO_TARGET_DIR/release/tallyd-byzantine"
echo "== clippy"
cargo clippy --release --locked --workspace --all-targets -- -D warnings
cargo clippy --release --locked -p tally-node --features byzantine --all-targets -- -D warnings
cargo clippy --release --locked "${proto_check[@]}" --all-targets -- -D warnings
echo "== tests (unit, property, in-process ABCI driver, end-to-end on CometBFT, wire format)"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
set +e
cargo test --release --locked --workspace --no-fail-fast --lib --bins --tests -- --test-threads 2 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
echo "== the test-only byzantine wrapper's unit tests"
cargo test --release --locked -p tally-node --features byzantine --lib byzantine 2>&1 | tee -a "$log"
byz_status=${PIPESTATUS[0]}
[ "$status" -ne 0 ] || status=$byz_status
echo "== wire format: settlement/src/proto.rs (+ proto/validators.rs) against proto/tally/v1/*.proto"
cargo test --release --locked "${proto_check[@]}" 2>&1 | tee -a "$log"
proto_status=${PIPESTATUS[0]}
set -e
[ "$status" -ne 0 ] || status=$proto_status
echo
count "$log"
exit "$status"
