#!/usr/bin/env bash
# A localnet under a schedule of faults for N minutes, with gateways reporting
# through the SDK for several users under allowances, ending in an audit of
# the credits (see tests/src/chaos.rs for the schedule and the invariants).
# Installs what it needs (CometBFT, Debian packages), builds the binaries
# (release, the shared target dir), and exits non-zero if the audit fails.
#
#   scripts/chaos.sh --minutes 60
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=60
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="${2:?--minutes needs a number}"; shift 2 ;;
    *) echo "usage: scripts/chaos.sh [--minutes N]" >&2; exit 2 ;;
  esac
done
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tally-target}"
localnet/install-deps.sh
localnet/build.sh
cargo build --release --locked -p tally-tests --bin tally-bench
exec "$CARGO_TARGET_DIR/release/tally-bench" chaos --minutes "$minutes"
