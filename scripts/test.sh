#!/usr/bin/env bash
# Runs every Tally check and test: formatting, clippy, unit and property
# tests, the in-process ABCI driver, and the end-to-end tests against real
# CometBFT processes on loopback. Installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tally-target}"
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
export PATH="$PATH:$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"

localnet/install-deps.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== build (release profile; first run compiles RocksDB, ~25 min on 2 cores)"
cargo build --release --locked --workspace --all-targets
echo "== clippy"
cargo clippy --release --locked --workspace --all-targets -- -D warnings
echo "== tests (unit, property, in-process ABCI driver, end-to-end on CometBFT)"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
set +e
cargo test --release --locked --workspace --lib --bins --tests -- --test-threads 2 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
passed=$(sed -n 's/^test result: .* \([0-9]\+\) passed; \([0-9]\+\) failed.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
failed=$(sed -n 's/^test result: .* \([0-9]\+\) passed; \([0-9]\+\) failed.*/\2/p' "$log" | awk '{s+=$1} END {print s+0}')
echo
echo "tests: $passed passed, $failed failed"
exit "$status"
