#!/usr/bin/env bash
# Starts a fresh Tally localnet: NVAL validators (default 4) on 127.0.0.1,
# waits for blocks, sends demo traffic of every outcome class and prints the
# SLA records. Stops any network this data dir already runs first.
#
#   localnet/up.sh              build, start, demo
#   localnet/up.sh --no-demo    build, start
#   TALLYD=/path/to/tallyd localnet/up.sh --no-build
#   TALLYD_3=/path/to/other-binary ...   validator 3's app runs that binary
#
# The validators make their threshold key by the on-chain DKG: the
# ceremony starts at height 1, each validator registers an encryption key
# made for that round only (ADR 0018), and the key forms in the first
# 4 x dkg_phase_blocks blocks
# (TALLY_DKG_PHASE_BLOCKS sets the parameter; the localnet uses 5, the
# chain's default is 8). The hub chain is
# created once the key is active, with that group key.
# TALLY_DEALER=1 (tests only) deals the key before the first block with
# `tallyd dkg dealer` instead (TALLY_THRESHOLD partials, default 2n/3 + 1).
# The chain starts at the newest app version this tallyd carries
# (TALLY_APP_VERSION names an older one); the hub keeps a registration fee
# of TALLY_REGISTRATION_FEE (default 100) from a deposit that binds a key.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

demo=1; build=1
for a in "$@"; do
  case "$a" in
    --no-demo) demo=0 ;;
    --no-build) build=0 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) die "unknown option $a" ;;
  esac
done

t_up=$(date +%s)
"$TALLY_REPO/localnet/install-deps.sh"
[ "$build" = 1 ] && "$TALLY_REPO/localnet/build.sh"
[ -x "$TALLYD" ] || die "no tallyd binary at $TALLYD (run localnet/build.sh)"
for i in $(seq 0 $((NVAL - 1))); do
  [ -x "$(node_app "$i")" ] || die "no binary at $(node_app "$i") for validator $i (TALLYD_$i)"
done

# Never two networks on the same ports: stop what this dir runs, then check.
"$TALLY_REPO/localnet/down.sh" >/dev/null 2>&1 || true
for i in $(seq 0 $((NVAL - 1))); do
  for off in 0 1 2; do
    p=$(port "$i" "$off")
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      die "port $p is in use by another process (another localnet? try TALLY_PORT_BASE=...)"
    fi
  done
done

# The hub this network settles on: a fresh localnet chooses by TALLY_HUB
# (a previous run's choice, remembered in $HUB_DIR/kind, does not count).
case "${TALLY_HUB:-1}" in evm) HUB=1; HUB_KIND=evm ;; 0) HUB=0; HUB_KIND=none ;; *) HUB=1; HUB_KIND=tally ;; esac
HUB_NAME=hub
if [ "$HUB_KIND" = evm ]; then
  [ -x "$TALLY_EVM_BIN" ] || die "no tally-evm binary at $TALLY_EVM_BIN (run localnet/build.sh)"
  if [ ! -x "$ANVIL" ]; then
    log "installing anvil and solc-js (npm ci in $EVM_CONTRACT_DIR)"
    npm ci --prefix "$EVM_CONTRACT_DIR" --no-audit --no-fund --loglevel=error >&2 || die "npm ci failed in $EVM_CONTRACT_DIR"
  fi
  [ -x "$ANVIL" ] || die "no anvil at $ANVIL after npm ci"
  # The contract's address is that of the deployer's first CREATE, known
  # before deploying: genesis names the hub after it (ADR 0022).
  evm_keys="$(mktemp -d)"
  printf '%s\n' "${EVM_DEV_KEYS[0]}" >"$evm_keys/deployer.key"; chmod 600 "$evm_keys/deployer.key"
  HUB_NAME="$("$TALLY_EVM_BIN" hub-name --chain-id "$EVM_CHAIN_ID" --deployer-key "$evm_keys/deployer.key" --nonce 0)" ||
    die "tally-evm hub-name failed"
  rm -rf "$evm_keys"
fi
if [ "$HUB_KIND" = tally ]; then
  [ -x "$TALLY_HUB_BIN" ] || die "no tally-hub binary at $TALLY_HUB_BIN (run localnet/build.sh)"
  for off in 0 1 2; do
    (exec 3<>"/dev/tcp/127.0.0.1/$((HUB_PORT_BASE + off))") 2>/dev/null && die "hub port $((HUB_PORT_BASE + off)) is in use"
  done
fi

rm -rf "$LOCALNET_DIR"
mkdir -p "$LOCALNET_DIR"
log "creating $NVAL validators in $LOCALNET_DIR (chain $CHAIN_ID, ports from $PORT_BASE)"
cometbft testnet --v "$NVAL" --o "$LOCALNET_DIR" --populate-persistent-peers=false >/dev/null

peers=""
for i in $(seq 0 $((NVAL - 1))); do
  id=$(cometbft show-node-id --home "$(node_home "$i")")
  peers="${peers:+$peers,}$id@127.0.0.1:$(port "$i" 0)"
done

# node_peers I PEERS: validator I's persistent_peers. With
# TALLY_P2P_PROXY_BASE=P (tests/src/partition.rs), validator I reaches
# validator J at port P + NVAL*I + J, a proxy that forwards to J's P2P
# port and can cut the pair (a partition); pex is then off.
node_peers() {
  local i="$1" j id out=""
  [ -n "${TALLY_P2P_PROXY_BASE:-}" ] || { echo "$2"; return; }
  for j in $(seq 0 $((NVAL - 1))); do
    [ "$j" = "$i" ] && continue
    id=$(cometbft show-node-id --home "$(node_home "$j")")
    out="${out:+$out,}$id@127.0.0.1:$((TALLY_P2P_PROXY_BASE + NVAL * i + j))"
  done
  echo "$out"
}

# Genesis app_state, written once on node0 and copied to every node.
g0="$(node_home 0)"
"$TALLYD" keys add gateway --out "$LOCALNET_DIR/gateway.key" --force >/dev/null
"$TALLYD" --home "$g0" genesis add-gateway --name demo-gateway --key "$LOCALNET_DIR/gateway.key"
# Users: each gets a key of its own (it signs its allowance changes:
# `tallyd tx allowance grant|revoke --from $LOCALNET_DIR/users/<u>.key`) and
# an allowance for the demo gateway from genesis, good for a year.
# TALLY_USERS (space-separated) replaces the list; tests name their users.
# TALLY_GATEWAYS (space-separated names) registers more gateways, with keys
# in $LOCALNET_DIR/gateways/<name>.key, and gives each the same allowances.
mkdir -p "$LOCALNET_DIR/users" "$LOCALNET_DIR/gateways"
for gw in ${TALLY_GATEWAYS:-}; do
  "$TALLYD" keys add "$gw" --out "$LOCALNET_DIR/gateways/$gw.key" --force >/dev/null
  "$TALLYD" --home "$g0" genesis add-gateway --name "$gw" --key "$LOCALNET_DIR/gateways/$gw.key"
done
expiry=$(( $(date +%s) + 365 * 86400 ))
for u in ${TALLY_USERS:-alice bob carol}; do
  "$TALLYD" keys add "$u" --out "$LOCALNET_DIR/users/$u.key" --force >/dev/null
  "$TALLYD" --home "$g0" genesis add-user --name "$u" --key "$LOCALNET_DIR/users/$u.key"
  for gw in demo-gateway ${TALLY_GATEWAYS:-}; do
    "$TALLYD" --home "$g0" genesis allow --user "$u" --gateway "$gw" --max-per-window 1000000000 --expires-at "$expiry"
  done
done
# With the hub, users' credits come only from hub deposits (synced down as
# signed hub blocks; the hub pays a batch in full or refuses it, so credits no
# escrow backs are refused in genesis). Without the hub, from genesis.
if [ "$HUB" != 1 ]; then
  for u in alice bob carol; do "$TALLYD" --home "$g0" genesis fund --user "$u" --amount 1000000; done
fi
"$TALLYD" --home "$g0" genesis set-param settlement_window_secs "$WINDOW_SECS"
[ "$HUB_KIND" = evm ] && "$TALLYD" --home "$g0" genesis set-param hub_chain "$HUB_NAME" >/dev/null
# The app version the chain starts at: the newest this tallyd carries
# unless TALLY_APP_VERSION names an older one (the upgrade test's).
"$TALLYD" --home "$g0" genesis set-app-version ${TALLY_APP_VERSION:+"$TALLY_APP_VERSION"}
"$TALLYD" --home "$g0" genesis set-param dkg_phase_blocks "${TALLY_DKG_PHASE_BLOCKS:-5}"
# Signed messages name the chain id: set it first.
sed -i "s/\"chain_id\": *\"[^\"]*\"/\"chain_id\": \"$CHAIN_ID\"/" "$g0/config/genesis.json"
if [ "$DEALER" = 1 ]; then
  # Tests only: a trusted dealer writes the key into genesis and each
  # validator's share into its home.
  [ "$HUB_KIND" != tally ] || "$TALLYD" dkg dealer --validators "$NVAL" --threshold "$THRESHOLD" --testnet-dir "$LOCALNET_DIR" >/dev/null
fi
"$TALLYD" --home "$g0" genesis validate >/dev/null

for i in $(seq 0 $((NVAL - 1))); do
  h="$(node_home "$i")"
  [ "$i" -eq 0 ] || cp "$g0/config/genesis.json" "$h/config/genesis.json"
  "$TALLYD" --home "$h" init --abci-listen "127.0.0.1:$(port "$i" 2)" --force >/dev/null
  configure_cometbft "$h/config/config.toml" "$(port "$i" 0)" "$(node_peers "$i" "$peers")"
  sed -i "s|^moniker = .*|moniker = \"validator$i\"|" "$h/config/config.toml"
  # Behind the P2P proxy no node may learn a real P2P port from another.
  [ -n "${TALLY_P2P_PROXY_BASE:-}" ] && sed -i "s|^pex = .*|pex = false|" "$h/config/config.toml"
  configure_app "$i"
done

for i in $(seq 0 $((NVAL - 1))); do start_node "$i"; done
log "started; waiting for blocks"
for i in $(seq 0 $((NVAL - 1))); do
  wait_height "$i" 2 90 || die "node$i made no blocks in 90 s; see $(node_home "$i")/{cometbft,tallyd}.log"
done
log "all $NVAL validators are committing blocks (RPC: $(rpc_url 0) .. $(rpc_url $((NVAL - 1))))"

if [ "$DEALER" != 1 ]; then
  # The on-chain DKG runs in the first 4 x dkg_phase_blocks blocks.
  log "waiting for the validators' threshold key (on-chain DKG)"
  start_wait=$(date +%s)
  until group_key=$(dkg_field group_key) && [ -n "$group_key" ]; do
    waited=$(( $(date +%s) - start_wait ))
    [ "$waited" -gt "${TALLY_DKG_TIMEOUT:-180}" ] && die "no threshold key after ${waited}s (at height $(height 0)); see $(node_home 0)/tallyd.log"
    [ "$waited" -gt 0 ] && [ $((waited % 10)) -eq 0 ] && log "still waiting for the key (height $(height 0))"
    sleep 1
  done
  echo "threshold key ready: $group_key (epoch $(e=$(dkg_field epoch); echo "${e:-?}")) after $(( $(date +%s) - t_up )) s"
fi
if [ "$HUB_KIND" = evm ]; then
  [ -n "${group_key:-}" ] || group_key=$(dkg_field group_key)
  [ -n "$group_key" ] || die "no group key to deploy the EVM hub with"
  log "starting the EVM hub (anvil, chain id $EVM_CHAIN_ID, RPC $(hub_rpc_url)) and deploying $HUB_NAME"
  mkdir -p "$HUB_DIR/keys" "$HUB_DIR/governors"
  echo evm >"$HUB_DIR/kind"
  for n in 0 1 2 3 4; do
    f="$HUB_DIR/keys/dev$n.key"
    [ "$n" -ge 2 ] && f="$HUB_DIR/governors/gov$((n - 1)).key"
    printf '%s\n' "${EVM_DEV_KEYS[$n]}" >"$f"; chmod 600 "$f"
  done
  start_anvil
  governors=()
  for g in 1 2 3; do governors+=(--governor "$("$TALLY_EVM_BIN" address --key "$HUB_DIR/governors/gov$g.key")"); done
  deployed="$("$TALLY_EVM_BIN" deploy --rpc "$(hub_rpc_url)" --key "$HUB_DIR/keys/dev0.key" --tally-chain-id "$CHAIN_ID" \
    --group-key "$group_key" --last-rotation "$(last_rotation)" \
    --registration-fee "${TALLY_REGISTRATION_FEE:-100}" "${governors[@]}" --governor-threshold 2)" || die "deploying the hub contract failed"
  printf '%s\n' "$deployed" | grep -q "$HUB_NAME" || die "the contract was deployed as $deployed, not $HUB_NAME (was anvil's state fresh?)"
  # Each validator's relay pays its own gas from the key tallyd init made.
  for i in $(seq 0 $((NVAL - 1))); do
    a="$("$TALLYD" keys relay-address --home "$(node_home "$i")")" || die "no relay key for node$i"
    evm_rpc anvil_setBalance "[\"$a\", \"0x56bc75e2d63100000\"]" >/dev/null || die "funding node$i's relay account $a failed"
  done
  log "deployed $HUB_NAME; relay accounts funded with 100 ETH each"
fi
if [ "$HUB_KIND" = tally ]; then
  log "creating the hub chain in $HUB_DIR (RPC $(hub_rpc_url)) with the group key"
  cometbft init --home "$HUB_DIR" >/dev/null 2>&1
  sed -i "s/\"chain_id\": *\"[^\"]*\"/\"chain_id\": \"tally-hub\"/" "$HUB_DIR/config/genesis.json"
  # Three governors, two of whom accept a key Tally made by a recovery
  # (ADR 0018); their keys stay in $HUB_DIR/governors (a devnet only).
  mkdir -p "$HUB_DIR/governors"
  governors=()
  for g in 1 2 3; do
    governors+=(--governor "$("$TALLY_HUB_BIN" governor keygen --out "$HUB_DIR/governors/gov$g.json")")
  done
  if [ "$DEALER" = 1 ]; then
    key_source=(--settlement-genesis "$g0/config/genesis.json")
  else
    key_source=(--group-key "$group_key")
  fi
  "$TALLY_HUB_BIN" genesis --home "$HUB_DIR" --settlement-chain-id "$CHAIN_ID" "${key_source[@]}" "${governors[@]}" --governor-threshold 2 \
    --registration-fee "${TALLY_REGISTRATION_FEE:-100}"
  configure_cometbft "$HUB_DIR/config/config.toml" "$HUB_PORT_BASE" ""
  start_hub
fi

if [ "$HUB_KIND" = evm ]; then
  log "depositing on the EVM hub: escrow for alice, bob and carol"
  for u in alice bob carol; do
    "$TALLY_EVM_BIN" deposit --rpc "$(hub_rpc_url)" --key "$HUB_DIR/keys/dev1.key" --contract "${HUB_NAME##*:}" --user "$u" --amount 1000000 >/dev/null ||
      die "depositing for $u failed"
  done
fi
if [ "$HUB_KIND" = tally ]; then
  wait_hub=0
  until curl -s --max-time 1 "$(hub_rpc_url)/status" | grep -q '"latest_block_height":"[1-9]'; do
    wait_hub=$((wait_hub + 1)); [ "$wait_hub" -gt 60 ] && die "hub made no blocks; see $HUB_DIR/*.log"; sleep 1
  done
  log "depositing on the hub: escrow for alice, bob and carol"
  for u in alice bob carol; do "$TALLY_HUB_BIN" deposit --user "$u" --amount 1000000 --node "$(hub_rpc_url)" >/dev/null; done
fi
if [ "$HUB" = 1 ]; then
  log "waiting for the deposits to be credited on the chain (signed hub blocks, after confirmations)"
  start_wait=$(date +%s)
  until "$TALLYD" query raw /balance/carol --node "$(rpc_url 0)" 2>/dev/null | grep -q '"balance":1000000'; do
    [ $(( $(date +%s) - start_wait )) -gt 120 ] && die "deposits not credited after 120 s; see $(node_home 0)/tallyd.log"
    sleep 1
  done
fi

if [ "$demo" = 1 ]; then
  demo_file="$LOCALNET_DIR/demo.jsonl"
  : >"$demo_file"
  for o in ok ok ok ok cancel cancel rate_limit auth transient transient client unknown; do
    for u in alice bob; do
      printf '{"user":"%s","provider":"acme-ai","model":"llama/3-70b","route":"/v1/chat","outcome":"%s","units":120,"amount":%d}\n' \
        "$u" "$o" "$([ "$o" = ok ] && echo 12 || echo 0)" >>"$demo_file"
    done
  done
  for o in ok ok transient cancel; do
    printf '{"user":"carol","provider":"bolt-inference","model":"mistral/7b","route":"/v1/completions","outcome":"%s","units":40,"amount":%d}\n' \
      "$o" "$([ "$o" = ok ] && echo 4 || echo 0)" >>"$demo_file"
  done
  log "sending demo traffic ($(wc -l <"$demo_file") records, every outcome class)"
  "$TALLYD" tx report --from "$LOCALNET_DIR/gateway.key" --file "$demo_file" --node "$(rpc_url 0)"
  echo
  echo "SLA records of provider acme-ai (fail_count never counts cancel or client):"
  "$TALLYD" query sla provider --provider acme-ai --node "$(rpc_url 1)"
  echo
  echo "SLA records of provider bolt-inference:"
  "$TALLYD" query sla provider --provider bolt-inference --node "$(rpc_url 2)"
  if [ "$HUB" = 1 ]; then
    echo
    log "waiting for the ${WINDOW_SECS}s settlement window to close and its batch to settle on the hub"
    start_wait=$(date +%s)
    until "$TALLYD" query raw "/sync/$HUB_NAME" --node "$(rpc_url 0)" 2>/dev/null | grep -q '"settled_batches":[1-9]'; do
      waited=$(( $(date +%s) - start_wait ))
      [ "$waited" -gt $((WINDOW_SECS * 2 + 90)) ] && die "no batch settled after ${waited}s; see $(node_home 0)/tallyd.log"
      [ $((waited % 10)) -eq 0 ] && log "still waiting (${waited}s)"
      sleep 1
    done
    echo "first batch signed and settled on the hub $(( $(date +%s) - t_up )) s after up.sh started"
    echo "Settlement chain: batch 1 (threshold-signed, settled):"
    "$TALLYD" query batch --nonce 1 --node "$(rpc_url 0)"
    echo
    if [ "$HUB_KIND" = evm ]; then
      echo "EVM hub $HUB_NAME: batch 1's block, provider payouts, alice's escrow:"
      for q in "settled 1" "payout acme-ai" "escrow alice"; do
        # shellcheck disable=SC2086
        "$TALLY_EVM_BIN" query --rpc "$(hub_rpc_url)" --contract "${HUB_NAME##*:}" $q
      done
    else
      echo "Hub chain: batch 1 result, provider payouts, alice's escrow:"
      "$TALLY_HUB_BIN" query /batch/hub/1 --node "$(hub_rpc_url)"
      "$TALLY_HUB_BIN" query /payout/acme-ai --node "$(hub_rpc_url)"
      "$TALLY_HUB_BIN" query /escrow/alice --node "$(hub_rpc_url)"
    fi
  fi
fi
echo
echo "localnet is up: $NVAL validators, chain $CHAIN_ID, data in $LOCALNET_DIR"
echo "  status:  localnet/status.sh"
echo "  report:  $TALLYD tx report --from $LOCALNET_DIR/gateway.key --user alice --provider acme-ai --model llama/3-70b --route /v1/chat --outcome ok --units 100 --amount 10 --node $(rpc_url 0)"
[ "$HUB" = 1 ] && echo "  hub:     $(hub_rpc_url)   settlement: $TALLYD query sync; $TALLYD query batch --nonce 1 (after the ${WINDOW_SECS}s window closes)"
echo "  stop:    localnet/down.sh"
