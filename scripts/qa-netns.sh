#!/usr/bin/env bash
# Network namespaces with emulated latency for the QA runs (docs/qa.md):
# validator i of N lives in namespace tqa<i> at 10.77.0.<i+1>, behind a veth
# pair on the bridge tqabr (10.77.0.254 on the host side, so the load
# generator reaches every node's RPC). Every packet a namespace sends waits
# DELAY ms ± JITTER ms (tc netem, normal distribution), so one way between
# two validators costs DELAY ± JITTER and a round trip twice that.
#
#   scripts/qa-netns.sh up N [DELAY_MS] [JITTER_MS]   (default 50 10)
#   scripts/qa-netns.sh down                          (removes every tqa*)
#   scripts/qa-netns.sh exec I CMD...                  (CMD in namespace tqaI)
#
# Needs root (ip, tc). Addresses are private to this machine: nothing leaves
# it. `tally-bench network --netns DELAY,JITTER` calls up and down itself.
set -euo pipefail

BR=tqabr
NET=10.77.0

die() { echo "qa-netns: $*" >&2; exit 1; }

down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^tqa[0-9]+$' || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$BR" 2>/dev/null || true
  # Root-side veth ends vanish with their peers; drop any left over.
  for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E '^tqa[0-9]+h$' || true); do
    ip link del "$l" 2>/dev/null || true
  done
}

up() {
  local n="$1" delay="${2:-50}" jitter="${3:-10}" i ns
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "N must be 1..200, got $n"
  [[ "$delay" =~ ^[0-9]+$ && "$jitter" =~ ^[0-9]+$ ]] || die "DELAY and JITTER are whole milliseconds"
  [ "$(id -u)" = 0 ] || die "needs root (ip netns, tc)"
  down
  ip link add "$BR" type bridge
  ip addr add "$NET.254/24" dev "$BR"
  ip link set "$BR" up
  for ((i = 0; i < n; i++)); do
    ns="tqa$i"
    ip netns add "$ns"
    ip link add "tqa${i}h" type veth peer name "tqa${i}n"
    ip link set "tqa${i}n" netns "$ns"
    ip link set "tqa${i}h" master "$BR"
    ip link set "tqa${i}h" up
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "tqa${i}n" name eth0
    ip -n "$ns" addr add "$NET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [ "$delay" -gt 0 ]; then
      # A large queue: netem's default (1000 packets) drops under load.
      ip netns exec "$ns" tc qdisc add dev eth0 root netem \
        delay "${delay}ms" "${jitter}ms" distribution normal limit 100000
    fi
  done
  echo "qa-netns: $n namespaces tqa0..tqa$((n - 1)) at $NET.1..$NET.$n, ${delay}ms ± ${jitter}ms one way" >&2
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  exec) shift; i="$1"; shift; exec ip netns exec "tqa$i" "$@" ;;
  *) die "usage: $0 up N [DELAY_MS] [JITTER_MS] | down | exec I CMD..." ;;
esac
