#!/usr/bin/env bash
# Stops every process the localnet in this data dir started.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
[ -d "$LOCALNET_DIR" ] || { log "nothing to stop ($LOCALNET_DIR does not exist)"; exit 0; }
for d in "$LOCALNET_DIR"/node* "$LOCALNET_DIR"/hub; do
  [ -d "$d" ] || continue
  stop_pid "$d/cometbft.pid" TERM
  stop_pid "$d/tallyd.pid" TERM
  stop_pid "$d/tally-hub.pid" TERM
  stop_pid "$d/anvil.pid" TERM
done
# Anything left that was started with a home in this dir (e.g. lost pid files).
# (anvil has no --home: its state file names the dir.)
pkill -KILL -f -- "--state $LOCALNET_DIR/hub/anvil-state.json" 2>/dev/null || true
if pgrep -f -- "--home $LOCALNET_DIR/" >/dev/null 2>&1; then
  pkill -TERM -f -- "--home $LOCALNET_DIR/" 2>/dev/null || true
  sleep 1
  pkill -KILL -f -- "--home $LOCALNET_DIR/" 2>/dev/null || true
fi
log "stopped the localnet in $LOCALNET_DIR"
