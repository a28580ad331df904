//! What the relay needs of the node's application, as a small trait:
//! [`Chain`] reads committed settlement state and hands what the relay saw
//! on the hub to the signer's inbox. `tallyd` gives the relay its
//! `tally_abci::TallyApp` (implemented here with the default feature
//! `abci`); a test may give it any other implementation.

use std::sync::Arc;

use tally_settlement::proto::{HubBlock, HubResult};
use tally_store::Backend;

/// The application as the relay sees it.
pub trait Chain: Send + Sync + std::fmt::Debug {
    /// Committed state, read-only (never the block being executed).
    fn committed_state(&self) -> &Arc<dyn Backend>;
    /// Hands a hub result for an attempt to the signer: the next vote
    /// extensions sign it while the chain waits for it.
    fn hand_in_result(&self, result: HubResult);
    /// Hands a range of hub blocks (its deposits) to the signer.
    fn hand_in_block(&self, block: HubBlock);
}

/// The application, shared by the relay's loop and its submissions.
pub type SharedChain = Arc<dyn Chain>;

#[cfg(feature = "abci")]
impl Chain for tally_abci::TallyApp {
    fn committed_state(&self) -> &Arc<dyn Backend> {
        tally_abci::TallyApp::committed_state(self)
    }

    fn hand_in_result(&self, result: HubResult) {
        self.hand_in(result);
    }

    fn hand_in_block(&self, block: HubBlock) {
        self.hand_in(block);
    }
}
