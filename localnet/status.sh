#!/usr/bin/env bash
# Shows each validator's height, app hash and whether its processes run.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
printf '%-6s %-26s %-8s %-66s %s\n' NODE RPC HEIGHT APP_HASH PROCESSES
for i in $(seq 0 $((NVAL - 1))); do
  home="$(node_home "$i")"
  s=$(curl -s --max-time 2 "$(rpc_url "$i")/status" 2>/dev/null)
  h=$(printf '%s' "$s" | sed -n 's/.*"latest_block_height":"\([0-9]*\)".*/\1/p')
  a=$(printf '%s' "$s" | sed -n 's/.*"latest_app_hash":"\([0-9A-Fa-f]*\)".*/\1/p')
  procs=""
  pid_alive "$home/cometbft.pid" && procs="cometbft" || procs="cometbft:down"
  pid_alive "$home/tallyd.pid" && procs="$procs tallyd" || procs="$procs tallyd:down"
  printf '%-6s %-26s %-8s %-66s %s\n' "node$i" "$(rpc_url "$i")" "${h:--}" "${a:--}" "$procs"
done
