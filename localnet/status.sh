#!/usr/bin/env bash
# Shows each node's height, app hash and whether its processes run.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
printf '%-6s %-26s %-8s %-66s %s\n' NODE RPC HEIGHT APP_HASH PROCESSES
# The genesis validators and any node added since (node.sh add|join).
nodes=$(seq 0 $((NVAL - 1)); for d in "$LOCALNET_DIR"/node*; do j="${d##*/node}"; [[ "$j" =~ ^[0-9]+$ ]] && [ "$j" -ge "$NVAL" ] && echo "$j"; done | sort -n)
for i in $nodes; do
  home="$(node_home "$i")"
  s=$(curl -s --max-time 2 "$(rpc_url "$i")/status" 2>/dev/null)
  h=$(printf '%s' "$s" | sed -n 's/.*"latest_block_height":"\([0-9]*\)".*/\1/p')
  a=$(printf '%s' "$s" | sed -n 's/.*"latest_app_hash":"\([0-9A-Fa-f]*\)".*/\1/p')
  procs=""
  pid_alive "$home/cometbft.pid" && procs="cometbft" || procs="cometbft:down"
  pid_alive "$home/tallyd.pid" && procs="$procs tallyd" || procs="$procs tallyd:down"
  printf '%-6s %-26s %-8s %-66s %s\n' "node$i" "$(rpc_url "$i")" "${h:--}" "${a:--}" "$procs"
done
