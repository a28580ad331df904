#!/usr/bin/env bash
# Runs every Tally check and test: formatting, clippy, unit and property
# tests, the in-process ABCI driver, and the end-to-end tests against real
# CometBFT processes on loopback. Installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tally-target}"
export PATH="$PATH:$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"

localnet/install-deps.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== build (release profile; first run compiles RocksDB, ~25 min on 2 cores)"
cargo build --release --locked --workspace --all-targets
echo "== clippy"
cargo clippy --release --locked --workspace --all-targets -- -D warnings
echo "== tests (unit, property, in-process ABCI driver, end-to-end on CometBFT)"
cargo test --release --locked --workspace -- --test-threads 2
