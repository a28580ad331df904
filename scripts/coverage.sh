#!/usr/bin/env bash
# Line coverage per crate, with LLVM's source-based coverage and the
# toolchain's own llvm-profdata/llvm-cov (rustup's llvm-tools component,
# added when missing). Only the workspace's crates are instrumented
# (scripts/coverage-rustc.sh as cargo's RUSTC_WORKSPACE_WRAPPER), so RocksDB and
# every other dependency come from the shared release build: nothing is
# compiled twice, and the plain and instrumented builds live side by side in
# the one target dir.
#
#   scripts/coverage.sh [--crate DIR]... [--fail-under]
#       build instrumented, run every test but the end-to-end suites
#       (tests/tests/e2e_*.rs), or only the tests of the named crates
#       (`--crate relay`: its unit and integration tests), and print one line
#       per crate:  coverage: <crate> <covered>/<coverable> lines <percent>%
#       With --fail-under, exit 1 if a crate in the table below is under its
#       floor (only crates that were run are checked).
#   scripts/coverage.sh --report PROFDIR EXES [--fail-under]
#       the same lines from the profiles in PROFDIR (*.profraw) and the
#       instrumented executables listed one per line in EXES: what
#       scripts/test.sh runs at the end when TALLY_COVERAGE=1 (.ci/run sets it;
#       the whole suite, end-to-end tests included, ran instrumented).
#   scripts/coverage.sh --lcov LCOV [--fail-under]
#       only the per-crate lines of an lcov file.
#
# Floors (`--fail-under`), also in README's test section (checked by
# tests/tests/scripts.rs):
#   crate        floor
#   settlement   85
#   abci         85
#   relay        85
#   node         70
#   client       70
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

floors() {
  sed -n '/^#   crate        floor$/,/^[^#]/p' "$root/scripts/coverage.sh" |
    awk '$1 == "#" && $3 ~ /^[0-9]+$/ { print $2, $3 }'
}

# per_crate LCOV: sums LF/LH per crate (the first path component below the
# workspace root) of an lcov file.
per_crate() {
  awk -v root="$root/" '
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

# check LINES: each crate of the floor table that has a line must be at or
# above its floor.
check() {
  local bad=0 crate floor pct
  while read -r crate floor; do
    pct=$(awk -v c="$crate" '$2 == c { sub("%", "", $5); print $5 }' "$1")
    if [ -z "$pct" ]; then
      continue
    fi
    if awk -v p="$pct" -v f="$floor" 'BEGIN { exit !(p < f) }'; then
      echo "coverage: FAIL: $crate at $pct%, under its floor of $floor%" >&2
      bad=1
    else
      echo "coverage: ok: $crate at $pct% (floor $floor%)"
    fi
  done < <(floors)
  return "$bad"
}

llvm_bin() {
  local host sysroot
  host=$(rustc -vV | sed -n 's/^host: //p')
  sysroot=$(rustc --print sysroot)
  if [ ! -x "$sysroot/lib/rustlib/$host/bin/llvm-cov" ]; then
    echo "coverage: adding rustup's llvm-tools component" >&2
    rustup component add llvm-tools-preview >&2
  fi
  echo "$sysroot/lib/rustlib/$host/bin"
}

# report PROFDIR EXES: merged profile -> lcov -> per-crate lines (stdout);
# the lcov file is left in PROFDIR/lcov.info.
report() {
  local dir="$1" exes="$2" bin
  bin=$(llvm_bin)
  shopt -s nullglob
  local raws=("$dir"/*.profraw)
  shopt -u nullglob
  if [ "${#raws[@]}" -eq 0 ]; then
    echo "coverage: no profiles in $dir" >&2
    return 1
  fi
  "$bin/llvm-profdata" merge -sparse "${raws[@]}" -o "$dir/merged.profdata"
  local objs=() e
  while read -r e; do
    [ -n "$e" ] && [ -f "$e" ] && objs+=(-object "$e")
  done < <(sort -u "$exes")
  if [ "${#objs[@]}" -eq 0 ]; then
    echo "coverage: no instrumented executables listed in $exes" >&2
    return 1
  fi
  # Only the workspace's own sources, without its test code.
  "$bin/llvm-cov" export -format=lcov -instr-profile="$dir/merged.profdata" \
    -ignore-filename-regex='(^|/)(\.cargo|\.rustup|rustc)/|^/rustc/|/tests/|^'"$root"'/tools/' \
    "${objs[@]}" > "$dir/lcov.info"
  per_crate "$dir/lcov.info"
}

# executables CARGO_JSON: the executables of workspace crates among cargo's
# --message-format=json artifacts.
executables() {
  python3 -c '
import json, sys
root = sys.argv[2]
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    exe = m.get("executable")
    if m.get("reason") == "compiler-artifact" and exe and root in m.get("manifest_path", ""):
        print(exe)
' "$1" "$root/"
}

fail_under=0
mode=run
crates=()
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --fail-under) fail_under=1; shift ;;
    --crate) crates+=("${2:?--crate needs a directory, e.g. relay}"); shift 2 ;;
    --report) mode=report; args=("${2:?--report needs PROFDIR}" "${3:?--report needs EXES}"); shift 3 ;;
    --lcov) mode=lcov; args=("${2:?--lcov needs a file}"); shift 2 ;;
    --executables) mode=executables; args=("${2:?--executables needs a cargo json file}"); shift 2 ;;
    *) echo "usage: scripts/coverage.sh [--crate DIR]... [--fail-under] | --report PROFDIR EXES [--fail-under] | --lcov LCOV [--fail-under]" >&2; exit 2 ;;
  esac
done

lines=$(mktemp)
trap 'rm -f "$lines"' EXIT
case "$mode" in
  executables)
    executables "${args[0]}"
    exit 0
    ;;
  lcov)
    [ -f "${args[0]}" ] || { echo "coverage: no such file: ${args[0]}" >&2; exit 2; }
    per_crate "${args[0]}" | tee "$lines"
    ;;
  report)
    report "${args[0]}" "${args[1]}" | tee "$lines"
    ;;
  run)
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tally-target}"
    [ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
    llvm_bin > /dev/null
    dir="$CARGO_TARGET_DIR/coverage/run"
    rm -rf "$dir"
    mkdir -p "$dir"
    export RUSTC_WORKSPACE_WRAPPER="$root/scripts/coverage-rustc.sh"
    export LLVM_PROFILE_FILE="$dir/%8m%c.profraw"
    selection=()
    if [ "${#crates[@]}" -eq 0 ]; then
      # Every test target but the end-to-end suites.
      mapfile -t selection < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "test" in t["kind"] and not t["name"].startswith("e2e_"):
            print("--test"); print(t["name"])
')
      selection=(--workspace --lib --bins "${selection[@]}")
    else
      for c in "${crates[@]}"; do
        [ -f "$c/Cargo.toml" ] || { echo "coverage: no crate in $c/" >&2; exit 2; }
        pkg=$(sed -n 's/^name *= *"\(.*\)"/\1/p' "$c/Cargo.toml" | head -1)
        selection+=(-p "$pkg")
      done
      selection+=(--lib --bins --tests)
    fi
    echo "coverage: building and running the tests instrumented (${selection[*]})" >&2
    cargo test --release --locked "${selection[@]}" --no-run \
      --message-format=json-render-diagnostics > "$dir/cargo.json"
    executables "$dir/cargo.json" > "$dir/executables"
    # A failing test still leaves its counts: report them, then fail.
    test_status=0
    cargo test --release --locked --no-fail-fast "${selection[@]}" -- --test-threads 2 ||
      test_status=$?
    report "$dir" "$dir/executables" > "$lines.all"
    if [ "${#crates[@]}" -gt 0 ]; then
      # Only the named crates: the others were linked in but not tested.
      for c in "${crates[@]}"; do awk -v c="$c" '$2 == c' "$lines.all"; done > "$lines"
    else
      cp "$lines.all" "$lines"
    fi
    rm -f "$lines.all"
    cat "$lines"
    echo "coverage: lcov in $dir/lcov.info" >&2
    ;;
esac
status=0
if [ "$fail_under" = 1 ]; then
  check "$lines" || status=1
fi
if [ "${test_status:-0}" -ne 0 ]; then
  echo "coverage: some tests failed (exit $test_status)" >&2
  status=1
fi
exit "$status"
