#!/usr/bin/env bash
# Writes the compatibility fixture: the home directory of a one-validator
# localnet (no hub) run by this checkout's release for a few settlement
# windows with some reports, stopped cleanly, into
# tests/fixtures/compat/<release>-<commit>/. tests/tests/compat.rs opens
# every fixture there with the current build. Run it at each release and
# commit the new directory beside the old ones (each is a few hundred KB;
# `git add -f`: RocksDB and LevelDB keep their logs in *.log files, which
# .gitignore otherwise leaves out).
#
#   scripts/compat-fixture.sh [--no-build] [NAME]
set -euo pipefail
build=1
[ "${1:-}" = --no-build ] && { build=0; shift; }
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tally-target}"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
name="${1:-${version:-0}-$(git rev-parse --short HEAD)}"
out="tests/fixtures/compat/$name"
[ -e "$out" ] && { echo "$out exists; remove it or pass another name" >&2; exit 2; }
localnet/install-cometbft.sh >&2
[ "$build" = 1 ] && localnet/build.sh >&2
work="$(mktemp -d "${TMPDIR:-/tmp}/tally-compat-XXXXXX")"
export TALLY_LOCALNET_DIR="$work/net" TALLY_VALIDATORS=1 TALLY_HUB=0 \
  TALLY_PORT_BASE="${TALLY_PORT_BASE:-16656}" TALLY_WINDOW_SECS=5 TALLY_TIMEOUT_COMMIT=1s \
  TALLY_SNAPSHOT_INTERVAL=1000000
trap 'localnet/down.sh >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
localnet/up.sh --no-build --no-demo >&2
tallyd="$CARGO_TARGET_DIR/release/tallyd"
node="http://127.0.0.1:$((TALLY_PORT_BASE + 1))"
# Reports of every outcome class, for two users, in more than one window.
for round in 1 2; do
  for outcome in ok transient client cancel rate_limit; do
    amount=0
    case "$outcome" in ok|client|cancel) amount=$((round * 3)) ;; esac
    for user in alice bob; do
      "$tallyd" tx report --from "$TALLY_LOCALNET_DIR/gateway.key" --user "$user" \
        --provider compat-prov --model compat/model --route /v1/chat \
        --outcome "$outcome" --units $((round + 1)) --amount "$amount" --node "$node" >/dev/null
    done
  done
  sleep 6
done
# Two more windows, so the last reports' window closes and its batch forms.
sleep 12
height="$(curl -s "$node/abci_info" | python3 -c 'import json,sys; print(json.load(sys.stdin)["result"]["response"]["last_block_height"])')"
localnet/down.sh >&2
home="$TALLY_LOCALNET_DIR/node0"
mkdir -p "$out"
cp -a "$home/config" "$home/data" "$out/"
# Logs, pid files and RocksDB's info logs are not state; no snapshots were
# taken (TALLY_SNAPSHOT_INTERVAL); CometBFT rebuilds its address book, starts
# a new consensus WAL for a node stopped between heights, and the fixture
# needs no transaction index.
find "$out" \( -name 'LOG' -o -name 'LOG.old.*' -o -name '*.pid' -o -name 'addrbook.json' \) -delete
rm -rf "$out/data/snapshots" "$out/data/cs.wal" "$out/data/tx_index.db"
cat >"$out/fixture.json" <<JSON
{"release": "$version", "commit": "$(git rev-parse HEAD)", "made": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "height_before_stop": $height,
 "cometbft": "$(cometbft version)", "chain": "1 validator, no hub, window 5 s, 20 reports of alice and bob to compat-prov"}
JSON
du -sh "$out" >&2
echo "$out"
