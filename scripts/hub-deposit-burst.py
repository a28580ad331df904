#!/usr/bin/env python3
"""Floods a (loopback) reference hub with tiny deposits, the way anyone can
without a Tally key: N one-credit deposits for distinct users, sent with
broadcast_tx_async from several threads. Used to check that a burst of hub
deposits only costs Tally more signing rounds (ADR 0010), never a halt.

  scripts/hub-deposit-burst.py --hub http://127.0.0.1:26757 --count 30000 --threads 8

Prints how many the hub's mempool accepted and the time taken.
"""

import argparse
import base64
import json
import sys
import threading
import time
import urllib.parse
import urllib.request


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def deposit_tx(user: str, amount: int) -> bytes:
    """HubTx { deposit (field 1) = Deposit { user (1), amount (2) } }."""
    u = user.encode()
    body = b"\x0a" + varint(len(u)) + u + b"\x10" + varint(amount)
    return b"\x0a" + varint(len(body)) + body


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hub", required=True, help="hub RPC URL (loopback only)")
    ap.add_argument("--count", type=int, default=30000)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--prefix", default="burst")
    a = ap.parse_args()
    host = urllib.parse.urlparse(a.hub).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"refusing non-loopback hub {a.hub}", file=sys.stderr)
        return 2
    ok = [0] * a.threads
    bad = [0] * a.threads

    def worker(k: int) -> None:
        for i in range(k, a.count, a.threads):
            tx = deposit_tx(f"{a.prefix}-{i:06d}", 1)
            req = json.dumps({
                "jsonrpc": "2.0", "id": i, "method": "broadcast_tx_async",
                "params": {"tx": base64.b64encode(tx).decode()},
            }).encode()
            try:
                r = urllib.request.urlopen(
                    urllib.request.Request(a.hub, req, {"Content-Type": "application/json"}),
                    timeout=10)
                v = json.loads(r.read())
                if "error" in v or v.get("result", {}).get("code", 0) != 0:
                    bad[k] += 1
                else:
                    ok[k] += 1
            except OSError:
                bad[k] += 1

    t0 = time.time()
    ts = [threading.Thread(target=worker, args=(k,)) for k in range(a.threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(f"sent {a.count} deposits in {time.time() - t0:.1f} s: "
          f"{sum(ok)} accepted by the mempool, {sum(bad)} refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
