#!/usr/bin/env bash
# Installs CometBFT when it is missing or not the pinned version.
# The one place the CometBFT version is pinned:
COMETBFT_VERSION="v0.38.26"
set -euo pipefail
export PATH="$PATH:$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin:/usr/local/go/bin"
have="$(cometbft version 2>/dev/null || true)"
if [ "v$have" = "$COMETBFT_VERSION" ] || [ "$have" = "$COMETBFT_VERSION" ]; then
  exit 0
fi
command -v go >/dev/null || { echo "install-cometbft: Go is required (go 1.22+)" >&2; exit 1; }
echo "installing cometbft $COMETBFT_VERSION (found: ${have:-none})" >&2
go install "github.com/cometbft/cometbft/cmd/cometbft@$COMETBFT_VERSION"
cometbft version >&2
