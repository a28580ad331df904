#!/usr/bin/env bash
# rustc for the workspace's own crates under coverage (cargo's
# RUSTC_WORKSPACE_WRAPPER, set by scripts/coverage.sh and by scripts/test.sh
# when TALLY_COVERAGE=1): the same compiler with LLVM's source-based coverage
# instrumentation. Dependencies are built without it, so they are shared with
# the plain build; cargo gives the instrumented crates their own hashes (the
# wrapper's path is part of them), so both builds live side by side in one
# target dir.
#
# Runtime counter relocation lets the profile runtime keep its counters in
# the profile file itself (`%c` in LLVM_PROFILE_FILE, continuous mode), so a
# process that is killed (tallyd stopped by SIGTERM or SIGKILL in the
# end-to-end tests) still leaves its counts.
#
# The instrumented executables carry no debug info (`strip=debuginfo`):
# llvm-cov reads its own sections, and the release profile's debug info
# would double the disk an instrumented build takes.
#
# Cargo does not see the flags added here: when you change them, give this
# file a new name (and its callers), so that cargo rebuilds with them.
#
# Bash, not sh: dash drops the variables whose names are not identifiers,
# such as cargo's CARGO_BIN_EXE_tally-evm.
exec "$@" -C instrument-coverage -C llvm-args=-runtime-counter-relocation -C strip=debuginfo
