//! Tally's EVM hub (work in progress).
