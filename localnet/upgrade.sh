#!/usr/bin/env bash
# Runs a software upgrade (a new app version) on a running localnet, the way
# docs/running-a-validator.md section 10 describes it (ADR 0019):
#   localnet/upgrade.sh [--binary PATH] [--name NAME] [--app-version V] [--in BLOCKS]
#                       [--late] [--swap-after SECS]
# 1. installs PATH (default: $TALLYD, the release this checkout built) on
#    every validator whose tallyd runs another binary, one at a time (stop,
#    swap, start, wait until it follows again: the others keep > 2/3 up);
#    with --late it does not: those validators stop at the height (exit 4,
#    halt and swap) and PATH is installed there, SECS seconds after the
#    chain reached the height (--swap-after, default 0: an operator who
#    comes late);
# 2. proposes the plan from validator 0 (name default v<V>, app version
#    default: the chain's plus 1, height: the latest plus BLOCKS, default 30)
#    with PATH's SHA-256, and approves it from the others until accepted;
# 3. waits for the height, starts again with PATH any validator that
#    stopped there (exit 4: it ran a binary without the version), and shows
#    the header app version at the height and after it, `query upgrade`
#    and the downtime (how long after block H - 1 block H was committed).
# Give --in 0 to skip step 1 and 2 and only do step 3 for a plan already
# pending.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

binary="$TALLYD" name="" version="" blocks=30 late=0 swap_after=0
while [ $# -gt 0 ]; do
  case "$1" in
    --late) late=1; shift ;;
    --swap-after) swap_after="$2"; shift 2 ;;
    --binary) binary="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    --app-version) version="$2"; shift 2 ;;
    --in) blocks="$2"; shift 2 ;;
    *) sed -n '2,22p' "$0"; exit 2 ;;
  esac
done
[ -x "$binary" ] || die "no binary at $binary (build it: localnet/build.sh)"
[[ "$blocks" =~ ^[0-9]+$ ]] || die "--in takes a number of blocks"
binary="$(realpath "$binary")"
[ -f "$(node_home 0)/config/genesis.json" ] || die "no localnet in $LOCALNET_DIR (run localnet/up.sh)"

query() { "$binary" query "$@" --node "$(rpc_url 0)" --output json; }
field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" | head -n1 | tr -d '"'; }

# header_version H: the app version in the header of block H.
header_version() {
  curl -s --max-time 2 "$(rpc_url 0)/block?height=$1" |
    grep -o '"version":{"block":"[0-9]*","app":"[0-9]*"' | head -n1 | grep -o '"app":"[0-9]*"' | grep -o '[0-9]*'
}

# runs_binary I: validator I's tallyd is running PATH.
runs_binary() {
  local pid
  pid="$(cat "$(node_home "$1")/tallyd.pid" 2>/dev/null)" || return 1
  [ "$(readlink -f "/proc/$pid/exe" 2>/dev/null)" = "$binary" ]
}

# install I: validator I runs PATH from now on.
install() {
  local i="$1" h
  stop_node "$i"
  export "TALLYD_$i=$binary"
  start_node "$i"
  h=$(height 0)
  wait_height "$i" "$h" 120 || die "node$i did not catch up after the install; see $(node_home "$i")/*.log"
  log "node$i runs $binary"
}

if [ "$blocks" -gt 0 ]; then
  current=$(query upgrade | field app_version)
  version="${version:-$((current + 1))}"
  name="${name:-v$version}"
  if [ "$late" = 0 ]; then
    for i in $(seq 0 $((NVAL - 1))); do
      runs_binary "$i" || install "$i"
    done
  fi
  at=$(( $(height 0) + blocks ))
  sha=$(sha256sum "$binary" | cut -d' ' -f1)
  log "proposing upgrade $name to app version $version at height $at (binary sha256 $sha)"
  id=$("$binary" tx upgrade propose --home "$(node_home 0)" --node "$(rpc_url 0)" \
    --name "$name" --app-version "$version" --height "$at" --binary-sha256 "$sha" \
    --info "localnet upgrade to app version $version" --output json | field id)
  # Every approval goes through validator 0 (signed with each validator's
  # own key): a node a block behind would not know the proposal yet. Each
  # is committed before the next status read, but the state may answer a
  # moment later: an approval refused as "not open" is fine once the plan
  # is accepted.
  for i in $(seq 1 $((NVAL - 1))); do
    status=$(query proposals --from "$id" | field status)
    [ "$status" = open ] || break
    if ! out=$("$binary" tx upgrade approve --home "$(node_home "$i")" --node "$(rpc_url 0)" --id "$id" 2>&1); then
      sleep 1
      status=$(query proposals --from "$id" | field status)
      case "$status" in
        accepted|applied) break ;;
        *) die "validator $i could not approve proposal $id ($status): $out" ;;
      esac
    fi
  done
fi
plan=$(query upgrade)
at=$(printf '%s' "$plan" | sed -n 's/.*"pending":{[^}]*"height":\([0-9]*\).*/\1/p')
[ -n "$at" ] || die "no upgrade plan is pending: $plan"
log "plan pending: $plan"

# swap_stopped: starts PATH on every validator whose tallyd exited (it
# ran a binary without the version and stopped at the height).
swap_stopped() {
  local i
  for i in $(seq 0 $((NVAL - 1))); do
    pid_alive "$(node_home "$i")/tallyd.pid" && continue
    log "node$i stopped at the height: $(cat "$(node_home "$i")/data/upgrade-info.json" 2>/dev/null)"
    stop_node "$i"
    export "TALLYD_$i=$binary"
    start_node "$i"
    log "node$i runs $binary"
  done
}
# Until the height was executed by validator 0 (or the chain stopped
# before it: more than 1/3 of the power ran binaries without the version).
wait_height 0 $((at - 1)) $(( blocks * 5 + 300 )) || die "the chain did not reach height $((at - 1))"
for k in $(seq 1 15); do
  [ "$(height 0)" -gt "$at" ] && break
  sleep 1
done
if [ "$(height 0)" -le "$at" ] || [ "$late" = 1 ]; then
  [ "$swap_after" -gt 0 ] && { log "the operators come back in $swap_after s"; sleep "$swap_after"; }
  swap_stopped
fi
wait_height 0 $((at + 1)) 300 || die "the chain did not pass height $at; see $LOCALNET_DIR/node*/*.log"
swap_stopped
before=$(header_version "$at")
after=$(header_version $((at + 1)))
t() { curl -s --max-time 2 "$(rpc_url 0)/block?height=$1" | grep -o '"time":"[^"]*"' | head -n1 | cut -d'"' -f4; }
# A header's time is when the block before it was committed (BFT time):
# block H was committed at the time of H + 1, block H - 1 at the time of H.
gap=$(( $(date -d "$(t $((at + 1)))" +%s%3N) - $(date -d "$(t "$at")" +%s%3N) ))
echo "header app version: $before at height $at, $after at height $((at + 1))"
echo "block $at (the switch) was committed ${gap} ms after block $((at - 1))"
query upgrade
