#!/usr/bin/env bash
# The slow fault scenarios that do not fit CI, from one command: each runs
# its own localnet (real CometBFT on loopback) and ends in an exact audit.
# Installs what it needs (CometBFT, Debian packages), builds the binaries
# and the test targets (release, the shared target dir), runs every
# scenario in the list below, prints how long each took, and exits non-zero
# if any failed or was skipped.
#
#   scripts/faults.sh            every scenario, at full length
#   scripts/faults.sh --smoke    one short scenario (CI; under 3 minutes
#                                once built)
#   scripts/faults.sh --list     the scenarios
#
# Adding a scenario: one line in SCENARIOS, "name|environment|cargo test
# arguments" (a long test kept out of CI with #[ignore] is run with
# "--test FILE -- --ignored").
set -euo pipefail
cd "$(dirname "$0")/.."

SCENARIOS=(
  # A full disk under one validator's tallyd, three fill-and-free cycles.
  "disk|TALLY_DISK_CYCLES=3|--test e2e_disk"
  # The hub restored from older copies: a forgotten batch, a lost deposit.
  "hub-rollback||--test e2e_hub_rollback"
  # Stores written by earlier releases opened by this build.
  "compat||--test compat"
)
# The smoke scenario: the full disk needs root (a tmpfs mount); without
# root, the hub rollback.
if [ "$(id -u)" = 0 ]; then
  SMOKE="disk||--test e2e_disk"
else
  SMOKE="hub-rollback||--test e2e_hub_rollback"
fi

mode=full
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) mode=smoke; shift ;;
    --list) printf '%s\n' "${SCENARIOS[@]}" | cut -d'|' -f1; exit 0 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "usage: scripts/faults.sh [--smoke|--list]" >&2; exit 2 ;;
  esac
done
[ "$mode" = smoke ] && SCENARIOS=("$SMOKE")

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tally-target}"
# A skipped scenario (no cometbft, no root) is a failure here, never a pass.
export TALLY_E2E_REQUIRED=1
localnet/install-deps.sh
localnet/build.sh
export PATH="$PATH:$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin:/usr/local/go/bin"
targets=()
for s in "${SCENARIOS[@]}"; do
  IFS='|' read -r _ _ args <<<"$s"
  targets+=(${args%% -- *})
done
cargo test --release --locked --workspace --no-run "${targets[@]}"

results=()
failed=0
for s in "${SCENARIOS[@]}"; do
  IFS='|' read -r name envs args <<<"$s"
  echo "=== $name: ${envs:+$envs }cargo test --release --workspace $args" >&2
  start=$(date +%s)
  # shellcheck disable=SC2086 # the list's fields are words
  if env $envs cargo test --release --locked --workspace $args; then
    outcome=ok
  else
    outcome=FAILED
    failed=1
  fi
  results+=("$(printf '%-14s %-6s %4d s' "$name" "$outcome" $(( $(date +%s) - start )))")
done
echo "=== faults ($mode)" >&2
printf '%s\n' "${results[@]}" >&2
exit "$failed"
