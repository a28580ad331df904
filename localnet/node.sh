#!/usr/bin/env bash
# Controls one validator of a running localnet.
#   localnet/node.sh start I     start validator I's tallyd and CometBFT
#   localnet/node.sh stop I      stop them (SIGTERM)
#   localnet/node.sh kill I      kill them (SIGKILL), as a crash would
#   I = hub: the hub chain's node
set -euo pipefail
source "$(dirname "$0")/lib.sh"
[ $# -eq 2 ] || { sed -n '2,5p' "$0"; exit 2; }
i="$2"
if [ "$i" = hub ]; then
  [ -d "$HUB_DIR" ] || die "no hub in $LOCALNET_DIR"
  case "$1" in
    start) start_hub ;;
    stop) stop_hub TERM ;;
    kill) stop_hub KILL ;;
    *) die "unknown action $1 (start, stop, kill)" ;;
  esac
  exit 0
fi
[ -d "$(node_home "$i")" ] || die "no validator $i in $LOCALNET_DIR"
case "$1" in
  start) start_node "$i" ;;
  stop) stop_node "$i" TERM ;;
  kill) stop_node "$i" KILL ;;
  *) die "unknown action $1 (start, stop, kill)" ;;
esac
