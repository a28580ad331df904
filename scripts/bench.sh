#!/usr/bin/env bash
# Runs Tally's benchmarks from the shared release build (no second RocksDB
# build): scripts/bench.sh [finalize] [bls] [range] [proposal] [worst] [snapshot] [upgrade] [--blocks N]
# [--validators N] [--reps R] [--keys N]
# (all but worst, snapshot, upgrade and network when none is named; upgrade: app
# version 2's migration over --keys N live report ids, default one million).
#   scripts/bench.sh network [--apps tally,kvstore] [--sizes 1,100[,1000]] [--start-rate N]
#     [--step-secs N] [--max-steps N] [--validators N] [--netns] [--latency MS,MS] [--at-80]
#     [--constant] [--out DIR]: Tally against CometBFT's kvstore, each on a
#     4-validator loopback network (ports 18656.. and 19656..), offered load rising to saturation;
#     table on stdout, CSV + PNG in $CARGO_TARGET_DIR/bench/network. Needs cometbft on PATH.
#     The QA layouts (docs/qa.md): --netns (root) and --latency; --constant for a soak.
#   scripts/bench.sh dkg [--sizes 4,16,64,100]: one on-chain DKG ceremony per size on one node's
#     in-memory state: bytes on chain, blocks, CPU per block, per player and per dealer.
# The reporter's throughput against a running
# localnet: $CARGO_TARGET_DIR/release/examples/load --key localnet/.data/gateway.key \
#   --endpoints http://127.0.0.1:26657,http://127.0.0.1:26667 --seconds 60
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tally-target}"
localnet/build.sh
export PATH="$PATH:$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin:/usr/local/go/bin"
exec "$CARGO_TARGET_DIR/release/tally-bench" "$@"
