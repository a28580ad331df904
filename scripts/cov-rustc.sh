#!/usr/bin/env bash
# rustc for the workspace's own crates under coverage (cargo's
# RUSTC_WORKSPACE_WRAPPER, set by scripts/coverage.sh and by scripts/test.sh
# when TALLY_COVERAGE=1): the same compiler with LLVM's source-based coverage
# instrumentation. Dependencies are built without it, so they are shared with
# the plain build; cargo gives the instrumented crates their own hashes, so
# both builds live side by side in one target dir. Bash, not sh: dash drops
# the variables whose names are not identifiers, such as cargo's
# CARGO_BIN_EXE_tally-evm.
exec "$@" -C instrument-coverage
