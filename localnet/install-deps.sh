#!/usr/bin/env bash
# Installs what building and running Tally needs when it is missing:
# Debian packages for the RocksDB bindings, curl, python3 (the scripts read
# JSON with it), headless Chromium and its
# WebDriver (the explorer's browser test), libfaketime (`faketime`: the
# clock-skew tests offset one process's wall clock), and CometBFT.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
missing=()
for pkg in libclang-dev clang curl python3 chromium chromium-driver faketime; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# promtool (tests/tests/promtool.rs): Debian ships it in `prometheus`, which
# also installs the Prometheus server, so only on request.
if ! command -v promtool >/dev/null; then
  if [ -n "${TALLY_INSTALL_PROMTOOL:-}" ]; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null ||
      echo "install-deps: could not install prometheus (promtool); its tests will be SKIPPED" >&2
  else
    echo "install-deps: no promtool: the promtool tests will be SKIPPED (TALLY_INSTALL_PROMTOOL=1 installs Debian's prometheus)" >&2
  fi
fi
command -v cargo >/dev/null || { echo "install-deps: Rust (cargo) is required: https://rustup.rs" >&2; exit 1; }
"$here/install-cometbft.sh"
# The EVM hub (hub-evm/contract): anvil and solc-js, the versions pinned in
# its package-lock.json, for its build check, its tests and TALLY_HUB=evm.
evm_dir="$here/../hub-evm/contract"
if [ ! -x "$evm_dir/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil" ] || [ ! -d "$evm_dir/node_modules/solc" ]; then
  if command -v npm >/dev/null; then
    echo "installing anvil and solc-js (npm ci in hub-evm/contract)" >&2
    npm ci --prefix "$evm_dir" --no-audit --no-fund --loglevel=error >&2 ||
      echo "install-deps: npm ci failed in hub-evm/contract; the EVM hub's tests will fail" >&2
  else
    echo "install-deps: no npm: the EVM hub's tests will be SKIPPED (Debian: apt-get install npm)" >&2
  fi
fi
# The interop test verifies batch signatures with py_ecc, the Ethereum
# reference BLS library.
if command -v python3 >/dev/null && ! python3 -c 'import py_ecc' 2>/dev/null; then
  echo "installing py_ecc (PyPI)" >&2
  python3 -m pip install -q py_ecc >&2 || echo "install-deps: could not install py_ecc; the interop test will fail" >&2
fi
