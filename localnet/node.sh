#!/usr/bin/env bash
# Controls one validator of a running localnet.
#   localnet/node.sh start I     start validator I's tallyd and CometBFT
#   localnet/node.sh stop I      stop them (SIGTERM)
#   localnet/node.sh kill I      kill them (SIGKILL), as a crash would
#   localnet/node.sh join I      add full node I (I >= the validator count) that
#                                joins by state sync from the validators'
#                                snapshots and follows the chain; with
#                                TALLY_JOIN=blocksync it replays from genesis
#   localnet/node.sh add [I]    create and start one more validator node
#                                (I defaults to the first free index >= the
#                                validator count) from the same genesis: it
#                                block-syncs from genesis, gets a DKG
#                                encryption key, and prints the proposal and
#                                approval commands that make it a validator
#   I = hub: the hub chain's node (with TALLY_HUB=evm, anvil: kill is a SIGKILL,
#                                start restarts it from its state file)
# Removing a validator is a proposal too:
#   tallyd tx validator propose --remove --pubkey K ..., then approve.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [ "${1:-}" = add ] && [ $# -le 2 ]; then
  i="${2:-}"
  if [ -z "$i" ]; then
    i="$NVAL"
    while [ -e "$(node_home "$i")" ]; do i=$((i + 1)); done
  fi
  [[ "$i" =~ ^[0-9]+$ ]] && [ "$i" -ge "$NVAL" ] || die "add: I must be a number >= $NVAL (the genesis validators are 0..$((NVAL - 1)))"
  [ -f "$(node_home 0)/config/genesis.json" ] || die "no localnet in $LOCALNET_DIR (run localnet/up.sh)"
  [ -d "$HUB_DIR" ] || HUB=0
  [ -e "$(node_home "$i")" ] && die "node$i already exists in $LOCALNET_DIR"
  # A home left half-made by a failed step would block the next try.
  trap 'rm -rf "$(node_home "$i")"' EXIT
  new_node_home "$i" "validator$i"
  configure_app "$i"
  trap - EXIT
  started=$(date +%s)
  start_node "$i"
  log "node$i started; block-syncing from genesis"
  until curl -s --max-time 2 "$(rpc_url "$i")/status" 2>/dev/null | grep -q '"catching_up":false' && [ "$(height "$i")" -ge $(( $(height 0) - 2 )) ] && [ "$(height "$i")" -gt 0 ]; do
    pid_alive "$(node_home "$i")/tallyd.pid" || die "tallyd of node$i exited; see $(node_home "$i")/tallyd.log"
    pid_alive "$(node_home "$i")/cometbft.pid" || die "cometbft of node$i exited; see $(node_home "$i")/cometbft.log"
    [ $(( $(date +%s) - started )) -gt "${TALLY_JOIN_TIMEOUT:-300}" ] && die "node$i did not catch up in ${TALLY_JOIN_TIMEOUT:-300} s; see $(node_home "$i")/*.log"
    sleep 1
  done
  log "node$i caught up in $(( $(date +%s) - started )) s at height $(height "$i")"
  pk=$(node_pubkey "$i")
  power=$(grep -o '"power": *"[0-9]*"' "$(node_home 0)/config/genesis.json" | head -n1 | grep -o '[0-9]*' || echo 10)
  echo "node$i: RPC $(rpc_url "$i"), home $(node_home "$i")"
  echo "consensus pubkey: $pk"
  echo "make it a validator (a proposal, then approvals from validators holding > 2/3 of the power):"
  echo "  $TALLYD tx validator propose --home $(node_home 0) --node $(rpc_url 0) --add --pubkey $pk --power ${power:-10} --candidate-home $(node_home "$i")"
  for j in $(seq 1 $((NVAL - 1))); do
    echo "  $TALLYD tx validator approve --home $(node_home "$j") --node $(rpc_url "$j") --id <proposal id>"
  done
  echo "then the new set makes a new key (4 x dkg_phase_blocks blocks) and the old key signs its rotation: $TALLYD query dkg --node $(rpc_url 0)"
  exit 0
fi
[ $# -eq 2 ] || { sed -n '2,18p' "$0"; exit 2; }
i="$2"
if [ "$1" = join ]; then
  [[ "$i" =~ ^[0-9]+$ ]] && [ "$i" -ge "$NVAL" ] || die "join: I must be a number >= $NVAL (the validators are 0..$((NVAL - 1)))"
  mode="${TALLY_JOIN:-statesync}"
  [ "$mode" = statesync ] || [ "$mode" = blocksync ] || die "TALLY_JOIN must be statesync or blocksync, got $mode"
  started=$(date +%s)
  join_node "$i" "$mode"
  log "node$i started ($mode); waiting for it to catch up with validator 0"
  while :; do
    s=$(curl -s --max-time 2 "$(rpc_url "$i")/status" 2>/dev/null || true)
    if printf '%s' "$s" | grep -q '"catching_up":false' && [ "$(height "$i")" -ge $(( $(height 0) - 2 )) ] && [ "$(height "$i")" -gt 0 ]; then
      break
    fi
    pid_alive "$(node_home "$i")/tallyd.pid" || die "tallyd of node$i exited; see $(node_home "$i")/tallyd.log"
    pid_alive "$(node_home "$i")/cometbft.pid" || die "cometbft of node$i exited; see $(node_home "$i")/cometbft.log"
    [ $(( $(date +%s) - started )) -gt "${TALLY_JOIN_TIMEOUT:-300}" ] && die "node$i did not catch up in ${TALLY_JOIN_TIMEOUT:-300} s; see $(node_home "$i")/*.log"
    sleep 1
  done
  earliest=$(printf '%s' "$s" | sed -n 's/.*"earliest_block_height":"\([0-9]*\)".*/\1/p')
  restored=$(sed 's/\x1b\[[0-9;]*m//g' "$(node_home "$i")/tallyd.log" | grep -o 'snapshot restored.*' | head -n1 || true)
  log "node$i caught up in $(( $(date +%s) - started )) s at height $(height "$i"); earliest block it holds: $earliest"
  [ -n "$restored" ] && log "node$i: $restored"
  echo "node$i: RPC $(rpc_url "$i"), home $(node_home "$i")"
  exit 0
fi
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
