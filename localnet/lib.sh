# Shared settings of the localnet scripts. Sourced, not run.
# Every value can be overridden from the environment, so tests can run their
# own network beside a developer's (other dir, other ports).

TALLY_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCALNET_DIR="${TALLY_LOCALNET_DIR:-$TALLY_REPO/localnet/.data}"
PORT_BASE="${TALLY_PORT_BASE:-26656}"     # validator i: p2p PORT_BASE+10i, rpc +1, abci +2, pprof +3, prometheus +4
NVAL="${TALLY_VALIDATORS:-4}"
CHAIN_ID="${TALLY_CHAIN_ID:-tally-localnet}"
TIMEOUT_COMMIT="${TALLY_TIMEOUT_COMMIT:-1s}"
WINDOW_SECS="${TALLY_WINDOW_SECS:-60}"
THRESHOLD="${TALLY_THRESHOLD:-$((2 * NVAL / 3 + 1))}"   # partial signatures needed
SNAPSHOT_INTERVAL="${TALLY_SNAPSHOT_INTERVAL:-50}"       # validators' state-sync snapshots, every N heights
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tally-target}"
TALLYD="${TALLYD:-$CARGO_TARGET_DIR/release/tallyd}"
TALLY_HUB_BIN="${TALLY_HUB_BIN:-$(dirname "$TALLYD")/tally-hub}"
# TALLY_HUB: 1 (default) runs the reference hub chain (tally-hub on its own
# 1-validator CometBFT), evm runs an EVM chain (anvil) with Tally's hub
# contract (ADR 0022), 0 runs no hub.
case "${TALLY_HUB:-1}" in
  1|tally) HUB=1; HUB_KIND=tally ;;
  evm) HUB=1; HUB_KIND=evm ;;
  0) HUB=0; HUB_KIND=none ;;
  *) printf 'TALLY_HUB must be 1 (the reference hub), evm or 0, got %s\n' "$TALLY_HUB" >&2; exit 2 ;;
esac
DEALER="${TALLY_DEALER:-0}"                # 1 (tests only): a trusted dealer makes the threshold key, no on-chain DKG
HUB_DIR="$LOCALNET_DIR/hub"
HUB_PORT_BASE=$((PORT_BASE + 100))        # hub: p2p +0, rpc +1, abci +2, pprof +3, prometheus +4
hub_rpc_url() { echo "http://127.0.0.1:$((HUB_PORT_BASE + 1))"; }
# A localnet remembers which hub it runs (node.sh, down.sh and later
# scripts read it; TALLY_HUB only chooses at up.sh).
[ -f "$HUB_DIR/kind" ] && HUB_KIND="$(cat "$HUB_DIR/kind")" && HUB=1

# The EVM hub (TALLY_HUB=evm): anvil and solc-js from the npm packages
# pinned in hub-evm/contract, the operator tool tally-evm, anvil's chain id
# and two of its well-known development accounts (the mnemonic "test test
# ... junk"; a devnet only): 0 deploys the contract, 1 makes the demo
# deposits; 2 to 4 are the hub's governors.
EVM_CONTRACT_DIR="$TALLY_REPO/hub-evm/contract"
ANVIL="${TALLY_ANVIL:-$EVM_CONTRACT_DIR/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil}"
TALLY_EVM_BIN="${TALLY_EVM_BIN:-$(dirname "$TALLYD")/tally-evm}"
EVM_CHAIN_ID="${TALLY_EVM_CHAIN_ID:-31337}"
EVM_BLOCK_TIME="${TALLY_EVM_BLOCK_TIME:-1}"
EVM_DEV_KEYS=(
  ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80
  59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d
  5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a
  7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6
  47e179ec197488593b187f8a64eb2d1f9f8d4cf61ee1d63b4a3f0b53ba8f7a05
)
export PATH="$PATH:$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin:/usr/local/go/bin"

node_home() { echo "$LOCALNET_DIR/node$1"; }
port() { echo $((PORT_BASE + 10 * $1 + $2)); }   # port I OFFSET
rpc_url() { echo "http://127.0.0.1:$(port "$1" 1)"; }

log() { printf '[localnet %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# alive PID: a running process (a zombie left by a killed child is not).
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  ! grep -qE '^[0-9]+ \(.*\) Z' "/proc/$1/stat" 2>/dev/null
}

# pid_alive FILE: the pid in FILE is a running process.
pid_alive() { [ -f "$1" ] && alive "$(cat "$1")"; }

# stop_pid FILE SIGNAL: signal the process in FILE and wait for it to exit.
stop_pid() {
  local f="$1" sig="${2:-TERM}" pid i
  [ -f "$f" ] || return 0
  pid="$(cat "$f")"
  if alive "$pid"; then
    kill -s "$sig" "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; sleep 0.2; fi
  fi
  rm -f "$f"
}

# node_app I: the binary that runs validator I's app: TALLYD_<I> if set
# (tests run a test-only tallyd-byzantine there), else TALLYD.
node_app() {
  local var="TALLYD_$1"
  echo "${!var:-$TALLYD}"
}

# start_node I: start tallyd and CometBFT of validator I in the background.
start_node() {
  local i="$1" home
  home="$(node_home "$i")"
  pid_alive "$home/tallyd.pid" || {
    nohup "$(node_app "$i")" start --home "$home" >>"$home/tallyd.log" 2>&1 &
    echo $! >"$home/tallyd.pid"
  }
  # CometBFT dials the app at start: wait for the ABCI port.
  local t
  for t in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$(port "$i" 2)") 2>/dev/null && break
    pid_alive "$home/tallyd.pid" || die "tallyd of node$i exited; see $home/tallyd.log"
    sleep 0.1
  done
  pid_alive "$home/cometbft.pid" || {
    nohup cometbft node --home "$home" >>"$home/cometbft.log" 2>&1 &
    echo $! >"$home/cometbft.pid"
  }
}

# start_hub: start the hub chain's app and CometBFT.
start_hub() {
  [ "$HUB_KIND" = evm ] && { start_anvil; return; }
  pid_alive "$HUB_DIR/tally-hub.pid" || {
    nohup "$TALLY_HUB_BIN" start --home "$HUB_DIR" --abci-listen "127.0.0.1:$((HUB_PORT_BASE + 2))" >>"$HUB_DIR/tally-hub.log" 2>&1 &
    echo $! >"$HUB_DIR/tally-hub.pid"
  }
  local t
  for t in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$((HUB_PORT_BASE + 2))") 2>/dev/null && break
    sleep 0.1
  done
  pid_alive "$HUB_DIR/cometbft.pid" || {
    nohup cometbft node --home "$HUB_DIR" >>"$HUB_DIR/cometbft.log" 2>&1 &
    echo $! >"$HUB_DIR/cometbft.pid"
  }
}

# stop_hub [SIGNAL]
stop_hub() {
  stop_pid "$HUB_DIR/cometbft.pid" "${1:-TERM}"
  stop_pid "$HUB_DIR/tally-hub.pid" "${1:-TERM}"
  stop_pid "$HUB_DIR/anvil.pid" "${1:-TERM}"
}

# evm_rpc METHOD PARAMS_JSON: one JSON-RPC call to the EVM hub; its result.
evm_rpc() {
  curl -s --max-time 5 -H 'content-type: application/json' \
    --data "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$1\",\"params\":$2}" "$(hub_rpc_url)" |
    python3 -c 'import json,sys; r=json.load(sys.stdin); sys.exit("error: %s" % r["error"]) if "error" in r else print(r["result"] if isinstance(r["result"], str) else json.dumps(r["result"]))'
}

# start_anvil: the EVM hub chain, from its state file if it has one (the
# state is dumped every second and on exit, with the historical states the
# relay's reads at past blocks need), mining a block every EVM_BLOCK_TIME s.
start_anvil() {
  [ -x "$ANVIL" ] || die "no anvil at $ANVIL (run: npm ci --prefix $EVM_CONTRACT_DIR)"
  pid_alive "$HUB_DIR/anvil.pid" || {
    nohup "$ANVIL" --host 127.0.0.1 --port $((HUB_PORT_BASE + 1)) --chain-id "$EVM_CHAIN_ID" \
      --block-time "$EVM_BLOCK_TIME" --state "$HUB_DIR/anvil-state.json" --state-interval 1 \
      --preserve-historical-states >>"$HUB_DIR/anvil.log" 2>&1 &
    echo $! >"$HUB_DIR/anvil.pid"
  }
  local t
  for t in $(seq 1 100); do
    evm_rpc eth_blockNumber '[]' >/dev/null 2>&1 && return 0
    pid_alive "$HUB_DIR/anvil.pid" || die "anvil exited; see $HUB_DIR/anvil.log"
    sleep 0.1
  done
  die "anvil does not answer on $(hub_rpc_url); see $HUB_DIR/anvil.log"
}

# configure_cometbft CONFIG BASE PEERS: ports from BASE, loopback, devnet settings.
configure_cometbft() {
  local c="$1" b="$2" peers="$3"
  sed -i \
    -e "s|^proxy_app = .*|proxy_app = \"tcp://127.0.0.1:$((b + 2))\"|" \
    -e "/^\[rpc\]/,/^\[/ s|^laddr = .*|laddr = \"tcp://127.0.0.1:$((b + 1))\"|" \
    -e "/^\[p2p\]/,/^\[/ s|^laddr = .*|laddr = \"tcp://127.0.0.1:$b\"|" \
    -e "s|^pprof_laddr = .*|pprof_laddr = \"127.0.0.1:$((b + 3))\"|" \
    -e "s|^prometheus_listen_addr = .*|prometheus_listen_addr = \"127.0.0.1:$((b + 4))\"|" \
    -e "s|^prometheus = .*|prometheus = true|" \
    -e "s|^persistent_peers = .*|persistent_peers = \"$peers\"|" \
    -e "s|^allow_duplicate_ip = .*|allow_duplicate_ip = true|" \
    -e "s|^addr_book_strict = .*|addr_book_strict = false|" \
    -e "s|^create_empty_blocks = .*|create_empty_blocks = true|" \
    -e "s|^timeout_commit = .*|timeout_commit = \"$TIMEOUT_COMMIT\"|" \
    -e "s|^log_level = .*|log_level = \"info\"|" \
    "$c"
}

# stop_node I [SIGNAL]: stop validator I (CometBFT first, then the app).
stop_node() {
  local home
  home="$(node_home "$1")"
  stop_pid "$home/cometbft.pid" "${2:-TERM}"
  stop_pid "$home/tallyd.pid" "${2:-TERM}"
}

# height I: latest block height of validator I (0 if unreachable).
height() {
  curl -s --max-time 2 "$(rpc_url "$1")/status" 2>/dev/null |
    sed -n 's/.*"latest_block_height":"\([0-9]*\)".*/\1/p' | head -n1 | grep . || echo 0
}

# wait_height I H SECS: wait until validator I reaches height H.
wait_height() {
  local i="$1" want="$2" secs="${3:-60}" start h
  start=$(date +%s)
  while :; do
    h=$(height "$i")
    [ "$h" -ge "$want" ] && return 0
    [ $(( $(date +%s) - start )) -ge "$secs" ] && return 1
    if [ $(( ($(date +%s) - start) % 5 )) -eq 0 ]; then log "waiting for node$i to reach height $want (at $h)"; fi
    sleep 1
  done
}

# latest_block I: "HEIGHT HASH" of validator I's latest block (empty if unreachable).
latest_block() {
  local b h hash
  b=$(curl -s --max-time 2 "$(rpc_url "$1")/block" 2>/dev/null) || return 0
  # The first "height" of /block is the header's.
  h=$(printf '%s' "$b" | grep -o '"height":"[0-9]*"' | head -n1 | grep -o '[0-9]*')
  # The first "block_id" is the block's own (the last commit's comes later).
  hash=$(printf '%s' "$b" | grep -o '"block_id":{"hash":"[0-9A-Fa-f]*"' | head -n1 | sed 's/.*"hash":"//; s/"$//')
  [ -n "$h" ] && [ -n "$hash" ] && echo "$h $hash"
}

# dkg_field FIELD [I]: a top-level field of validator I's (default 0) /dkg
# query (the active key: group_key, epoch, validators, ...); empty when the
# chain has no key yet or the node does not answer.
dkg_field() {
  "$TALLYD" query raw /dkg --node "$(rpc_url "${2:-0}")" 2>/dev/null |
    python3 -c 'import json, sys
v = json.load(sys.stdin).get(sys.argv[1])
print("" if v is None else v)' "$1" 2>/dev/null || true
}

# last_rotation: the newest key rotation validator 0's chain made (0: none;
# a contract deployed with the current key continues from there).
last_rotation() {
  "$TALLYD" query raw /rotations --node "$(rpc_url 0)" 2>/dev/null |
    python3 -c 'import json, sys
print(max([r.get("nonce", 0) for r in json.load(sys.stdin).get("rotations", [])] or [0]))' 2>/dev/null || echo 0
}

# configure_app I: validator I's app.toml: snapshots, its metrics port and,
# with a hub, its relay's hub endpoints (TALLY_HUB_ENDPOINTS_<I>, else
# TALLY_HUB_ENDPOINTS, comma-separated, replaces the list: tests put fault
# proxies there; TALLY_HUB_CONFIRMATIONS and TALLY_RELAY_STAGGER_SECS
# override the relay's defaults).
configure_app() {
  local i="$1" h hub_list override_var override
  h="$(node_home "$i")"
  sed -i -e "s|^snapshot_interval = .*|snapshot_interval = $SNAPSHOT_INTERVAL|" \
    -e "s|^metrics_listen = .*|metrics_listen = \"127.0.0.1:$(port "$i" 5)\"|" "$h/config/app.toml"
  [ "$HUB" = 1 ] || return 0
  hub_list="\"$(hub_rpc_url)\""
  override_var="TALLY_HUB_ENDPOINTS_$i"
  override="${!override_var:-${TALLY_HUB_ENDPOINTS:-}}"
  [ -n "$override" ] && hub_list="\"${override//,/\", \"}\""
  # The EVM hub: the relay speaks the contract's protocol and pays gas
  # from the key tallyd init made (funded by up.sh).
  [ "$HUB_KIND" = evm ] && sed -i -e "s|^hub_kind = .*|hub_kind = \"evm\"|" "$h/config/app.toml"
  sed -i -e "s|^hub_endpoints = .*|hub_endpoints = [$hub_list]|" \
    ${TALLY_HUB_CONFIRMATIONS:+-e "s|^hub_confirmations = .*|hub_confirmations = $TALLY_HUB_CONFIRMATIONS|"} \
    ${TALLY_RELAY_STAGGER_SECS:+-e "s|^relay_stagger_secs = .*|relay_stagger_secs = $TALLY_RELAY_STAGGER_SECS|"} \
    "$h/config/app.toml"
}

# node_pubkey I: validator I's CometBFT consensus key, hex (32 bytes).
node_pubkey() {
  cometbft show-validator --home "$(node_home "$1")" |
    sed -n 's/.*"value":"\([^"]*\)".*/\1/p' | base64 -d | od -An -tx1 | tr -d ' \n'
}

# new_node_home I MONIKER: a fresh CometBFT and tallyd home for node I with
# this network's genesis, peered with every node that has a home here.
new_node_home() {
  local i="$1" moniker="$2" home peers d j id off
  home="$(node_home "$i")"
  [ -e "$home" ] && die "node$i already exists in $LOCALNET_DIR"
  for off in 0 1 2; do
    (exec 3<>"/dev/tcp/127.0.0.1/$(port "$i" "$off")") 2>/dev/null && die "port $(port "$i" "$off") is in use"
  done
  peers=""
  for d in "$LOCALNET_DIR"/node*; do
    j="${d##*/node}"
    [[ "$j" =~ ^[0-9]+$ ]] && [ -f "$d/config/node_key.json" ] || continue
    id=$(cometbft show-node-id --home "$d")
    peers="${peers:+$peers,}$id@127.0.0.1:$(port "$j" 0)"
  done
  cometbft init --home "$home" >/dev/null 2>&1
  cp "$(node_home 0)/config/genesis.json" "$home/config/genesis.json"
  configure_cometbft "$home/config/config.toml" "$(port "$i" 0)" "$peers"
  sed -i "s|^moniker = .*|moniker = \"$moniker\"|" "$home/config/config.toml"
  "$TALLYD" --home "$home" init --abci-listen "127.0.0.1:$(port "$i" 2)" --force >/dev/null
}

# join_node I MODE: create full node I (not a validator) beside the running
# validators and start it; MODE statesync restores the newest snapshot the
# validators serve (trusting validator 0's latest block), blocksync
# replays every block from genesis.
join_node() {
  local i="$1" mode="$2" home trust
  home="$(node_home "$i")"
  new_node_home "$i" "full$i"
  # Its relay too (hub endpoints): it only observes the hub until the node
  # holds a share of the active key, so a full node promoted to validator
  # later submits like the others.
  configure_app "$i"
  if [ "$mode" = statesync ]; then
    trust=$(latest_block 0)
    [ -n "$trust" ] || die "validator 0 does not answer at $(rpc_url 0); cannot pick a trusted block"
    log "node$i: state sync trusting block ${trust% *} (${trust#* }) of $(rpc_url 0)"
    sed -i \
      -e "/^\[statesync\]/,/^\[/ s|^enable = .*|enable = true|" \
      -e "/^\[statesync\]/,/^\[/ s|^rpc_servers = .*|rpc_servers = \"$(rpc_url 0),$(rpc_url 1)\"|" \
      -e "/^\[statesync\]/,/^\[/ s|^trust_height = .*|trust_height = ${trust% *}|" \
      -e "/^\[statesync\]/,/^\[/ s|^trust_hash = .*|trust_hash = \"${trust#* }\"|" \
      -e "/^\[statesync\]/,/^\[/ s|^trust_period = .*|trust_period = \"168h0m0s\"|" \
      -e "/^\[statesync\]/,/^\[/ s|^discovery_time = .*|discovery_time = \"5s\"|" \
      "$home/config/config.toml"
  fi
  start_node "$i"
}
