#!/usr/bin/env bash
# Builds tallyd in the shared release profile (the same artifacts tests use).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$TALLY_REPO"
log "building tallyd (target dir $CARGO_TARGET_DIR; the first build compiles RocksDB, ~25 min on 2 cores)"
cargo build --release --locked --workspace --all-targets
