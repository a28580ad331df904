#!/usr/bin/env bash
# Runs Tally's benchmarks from the shared release build (no second RocksDB
# build): scripts/bench.sh [finalize] [bls] [range] [proposal] [worst] [snapshot] [--blocks N]
# [--validators N] [--reps R] [--keys N]
# (all but worst and snapshot when none is named). The reporter's throughput against a running
# localnet: $CARGO_TARGET_DIR/release/examples/load --key localnet/.data/gateway.key \
#   --endpoints http://127.0.0.1:26657,http://127.0.0.1:26667 --seconds 60
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tally-target}"
localnet/build.sh
exec "$CARGO_TARGET_DIR/release/tally-bench" "$@"
