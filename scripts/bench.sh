#!/usr/bin/env bash
# Runs Tally's benchmarks from the shared release build (no second RocksDB
# build): scripts/bench.sh [finalize] [--blocks N]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tally-target}"
localnet/build.sh
exec "$CARGO_TARGET_DIR/release/tally-bench" "$@"
