#!/usr/bin/env bash
# Line coverage of the workspace's tests, per crate, with cargo-tarpaulin
# (installed from crates.io when missing; its LLVM engine reads the profiles
# itself, so no llvm-tools component is needed). Runs every unit, property
# and integration test except the end-to-end suites (tests/tests/e2e_*.rs),
# in a target dir of its own, and ends with one line per crate:
#   coverage: <crate> <covered>/<coverable> lines <percent>%
# Not part of .ci/run: it rebuilds the workspace instrumented (RocksDB is
# linked from the shared release build's librocksdb.a when one exists, so it
# is not compiled a second time). Needs more than 25 GB free on /; otherwise
# it says so and exits 2.
#
#   scripts/coverage.sh            run and report
#   scripts/coverage.sh --report F only the per-crate lines of an lcov file
set -euo pipefail
cd "$(dirname "$0")/.."

# report LCOV: sums LF/LH per crate (the first path component below the
# workspace root) of an lcov file.
report() {
  awk -v root="$PWD/" '
    /^SF:/ { f = substr($0, 4); sub("^" root, "", f); split(f, p, "/"); c = p[1] }
    /^LF:/ { lf[c] += substr($0, 4) }
    /^LH:/ { lh[c] += substr($0, 4) }
    END {
      for (c in lf) {
        pct = lf[c] ? 100 * lh[c] / lf[c] : 0
        printf "coverage: %s %d/%d lines %.1f%%\n", c, lh[c], lf[c], pct
      }
    }' "$1" | sort
}
if [ "${1:-}" = "--report" ]; then
  [ -f "${2:-}" ] || { echo "usage: scripts/coverage.sh --report LCOV" >&2; exit 2; }
  report "$2"
  exit 0
fi

need_gb=25
free_gb=$(df -BG --output=avail / | tail -1 | tr -dc '0-9')
if [ "$free_gb" -le "$need_gb" ]; then
  echo "coverage: SKIPPED: ${free_gb} GB free on /, an instrumented build needs more than ${need_gb} GB" >&2
  exit 2
fi

[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo tarpaulin --version >/dev/null 2>&1; then
  echo "coverage: installing cargo-tarpaulin" >&2
  (unset CARGO_TARGET_DIR; cargo install cargo-tarpaulin --locked)
fi

target="$HOME/.cache/tally-target-cov"
shared="${CARGO_TARGET_DIR:-$HOME/.cache/tally-target}"
# RocksDB's C++ library from the shared release build, if it is there: the
# same librocksdb-sys version, so its pregenerated bindings match.
if [ -z "${ROCKSDB_LIB_DIR:-}" ]; then
  lib=$(ls -t "$shared"/release/build/librocksdb-sys-*/out/librocksdb.a 2>/dev/null | head -1 || true)
  if [ -n "$lib" ]; then
    export ROCKSDB_LIB_DIR="$(dirname "$lib")" ROCKSDB_STATIC=1
    echo "coverage: linking $lib" >&2
  fi
fi

# Every test target but the end-to-end suites.
mapfile -t tests < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "test" in t["kind"] and not t["name"].startswith("e2e_"):
            print("--test"); print(t["name"])
')

out="$target/coverage"
mkdir -p "$out"
CARGO_TARGET_DIR="$target" cargo tarpaulin --engine llvm --release --workspace \
  --lib --bins "${tests[@]}" \
  --exclude-files 'tests/*' 'tools/*' \
  --timeout 900 --skip-clean --target-dir "$target" \
  --out Lcov --output-dir "$out"
report "$out/lcov.info"
