//! The DKG participant: a thread of `tallyd start` (never inside an ABCI
//! call) that, after each committed height, sends what this validator owes
//! the running ceremony and picks up its share of every key a ceremony
//! made.
//!
//! Each new committed height (polled every [`POLL`]) it
//! 1. when a ceremony names it, makes (or loads) its encryption key for
//!    that round (`<home>/data/dkg_round_<R>.json`, ADR 0018), asks
//!    [`dkg::next_messages`] what to send (its round key, dealing, acks,
//!    reveals), signs each with the consensus key and sends it with
//!    `broadcast_tx_sync` to its own CometBFT node; the same bytes are not
//!    sent again within [`RESEND_AFTER`] blocks (the chain refuses a
//!    duplicate anyway; this keeps the mempool quiet);
//! 2. derives its share of the newest key from the chain
//!    ([`dkg::derive_share`]); a share of an epoch it does not hold yet is
//!    written to `<home>/data/bls_share_epoch_<E>.json` and given to the
//!    app ([`TallyApp::add_signer`]); a held share that differs from the
//!    derived one (a stale or wrong file) is replaced;
//! 3. once a key is active, drops the shares of older keys (memory zeroed)
//!    and deletes their files; deletes every round key no longer needed
//!    (its round is over and, if it made a key, the share is derived), so
//!    a disk taken later opens no past dealing.
//!
//! So a node that was offline during a ceremony, or lost a share file,
//! gets its share back from the chain once it has caught up, as long as
//! it still has that round's key. Errors are logged (once until they
//! change) and the loop goes on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ed25519_dalek::SigningKey;
use tally_abci::TallyApp;
use tally_client::rpc::RpcClient;
use tally_settlement::bls::SecretShare;
use tally_settlement::dkg::{self, crypto::EncKey};
use tracing::{debug, info, warn};

use crate::dkgkey;

/// How often the committed height is checked.
pub const POLL: Duration = Duration::from_millis(250);
/// Blocks before the same message bytes are sent again.
pub const RESEND_AFTER: u64 = 3;

/// The participant's state between heights.
pub struct Participant {
    app: TallyApp,
    home: PathBuf,
    rpc: RpcClient,
    key: SigningKey,
    /// Round keys in memory (also on disk until retired).
    round_keys: BTreeMap<u64, EncKey>,
    address: [u8; 20],
    /// This node's shares by key epoch (loaded at start, then derived).
    shares: BTreeMap<u64, SecretShare>,
    /// Message bytes sent, with the height they were sent at.
    sent: BTreeMap<Vec<u8>, u64>,
    /// The last error logged, so a lasting one is logged once.
    last_error: Option<String>,
}

impl std::fmt::Debug for Participant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Participant")
            .field("address", &hex::encode(self.address))
            .field("rpc", &self.rpc.shown_url())
            .field("epochs", &self.shares.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Participant {
    /// A participant for the validator of `home` that sends to `rpc_url`;
    /// `shares` are the shares the node loaded at start.
    pub fn new(
        app: TallyApp,
        home: &Path,
        rpc_url: &str,
        key: SigningKey,
        shares: impl IntoIterator<Item = (u64, SecretShare)>,
    ) -> Self {
        let address = dkg::address_of(&key.verifying_key().to_bytes());
        Self {
            app,
            home: home.to_path_buf(),
            rpc: RpcClient::new(rpc_url, Duration::from_secs(2), Duration::from_secs(10)),
            key,
            round_keys: BTreeMap::new(),
            address,
            shares: shares.into_iter().collect(),
            sent: BTreeMap::new(),
            last_error: None,
        }
    }

    /// Runs the loop on its own thread until the process ends.
    pub fn spawn(mut self) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("dkg-participant".into())
            .spawn(move || {
                let mut seen = 0u64;
                loop {
                    std::thread::sleep(POLL);
                    let h = self.app.last_commit().height;
                    if h == 0 || h == seen {
                        continue;
                    }
                    seen = h;
                    let step =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step(h)));
                    if step.is_err() {
                        warn!(height = h, "DKG participant step panicked; continuing");
                    }
                }
            })
    }

    fn report(&mut self, what: &str, e: impl std::fmt::Display) {
        let msg = format!("{what}: {e}");
        if self.last_error.as_deref() != Some(msg.as_str()) {
            warn!(error = %msg, "DKG participant");
            self.last_error = Some(msg);
        }
    }

    /// The work after committed height `h`.
    pub fn step(&mut self, h: u64) {
        self.send_messages(h);
        self.pick_up_share();
        self.retire_old_shares();
        self.retire_round_keys();
    }

    /// The key of `round`, from memory, disk, or made now.
    fn round_key(&mut self, round: u64) -> Option<EncKey> {
        if let Some(k) = self.round_keys.get(&round) {
            return Some(k.clone());
        }
        match dkgkey::round_key(&self.home, round) {
            Ok(k) => {
                self.round_keys.insert(round, k.clone());
                Some(k)
            }
            Err(e) => {
                self.report("making my round key", e);
                None
            }
        }
    }

    /// The key of `round` if this node still has one (never made here).
    fn existing_round_key(&mut self, round: u64) -> Option<EncKey> {
        if self.round_keys.contains_key(&round)
            || dkgkey::round_key_path(&self.home, round).exists()
        {
            return self.round_key(round);
        }
        None
    }

    /// Deletes every round key that is neither the running round's nor
    /// the last key's while its share is not yet held (ADR 0018).
    fn retire_round_keys(&mut self) {
        let state = self.app.committed_state().clone();
        let running = dkg::state::ceremony(&state).ok().flatten().map(|c| c.round);
        let last = dkg::state::last_ceremony(&state).ok().flatten();
        let last_needed = last
            .filter(|c| !self.shares.contains_key(&c.epoch))
            .map(|c| c.round);
        let mut on_disk = dkgkey::round_key_files(&self.home);
        on_disk.extend(self.round_keys.keys().copied());
        on_disk.sort_unstable();
        on_disk.dedup();
        for r in on_disk {
            if Some(r) == running || Some(r) == last_needed {
                continue;
            }
            self.round_keys.remove(&r);
            match dkgkey::delete_round_key(&self.home, r) {
                Ok(()) => info!(round = r, "erased my key of a finished round"),
                Err(e) => self.report("erasing a round key", e),
            }
        }
    }

    /// Once a key is active, the shares of older keys are never used again
    /// (the hub took the rotation away from them): dropped from memory
    /// (zeroed) here and in the app, and their files deleted (ADR 0017).
    fn retire_old_shares(&mut self) {
        let state = self.app.committed_state().clone();
        let active = match dkg::state::active_key_record(&state) {
            Ok(Some(k)) if k.epoch > 0 => k.epoch,
            Ok(_) => return,
            Err(e) => return self.report("reading the key", e),
        };
        let old: Vec<u64> = self.shares.range(..active).map(|(e, _)| *e).collect();
        for e in &old {
            self.shares.remove(e);
        }
        self.app.retire_signers_below(active);
        match dkgkey::delete_epoch_shares_below(&self.home, active) {
            Ok(gone) => {
                for p in gone {
                    info!(active, file = %p.display(), "deleted the share of a retired key");
                }
            }
            Err(e) => self.report("deleting a retired share", e),
        }
    }

    fn send_messages(&mut self, h: u64) {
        let state = self.app.committed_state().clone();
        let c = match dkg::state::ceremony(&state) {
            Ok(Some(c)) => c,
            Ok(None) => return,
            Err(e) => return self.report("reading the ceremony", e),
        };
        let named = c.players.iter().any(|p| p.address == self.address)
            || c.dealers.iter().any(|d| d.address == self.address);
        if !named {
            return;
        }
        let Some(enc) = self.round_key(c.round) else {
            return;
        };
        let me = dkg::Me {
            address: self.address,
            enc: &enc,
        };
        let msgs = match dkg::next_messages(&state, &me) {
            Ok(m) => m,
            Err(e) => return self.report("planning messages", e),
        };
        self.sent
            .retain(|_, at| h < at.saturating_add(RESEND_AFTER));
        for m in msgs {
            let tx = dkg::sign_validator_msg(&self.key, &m);
            if self.sent.contains_key(&tx) {
                continue;
            }
            let what = describe(&m);
            match self.rpc.broadcast_tx_sync(&tx) {
                Ok(c) if c.code == 0 => {
                    info!(height = h, msg = %what, "sent DKG message");
                    self.sent.insert(tx, h);
                }
                Ok(c) => {
                    // Refused by CheckTx (e.g. already on chain): no
                    // point in resending within the window either.
                    debug!(height = h, msg = %what, code = c.code, log = %c.log, "DKG message refused");
                    self.sent.insert(tx, h);
                }
                Err(e) => self.report("sending a DKG message", e),
            }
        }
    }

    fn pick_up_share(&mut self) {
        let state = self.app.committed_state().clone();
        let round = match dkg::state::last_ceremony(&state) {
            Ok(Some(c)) => c.round,
            Ok(None) => return,
            Err(e) => return self.report("reading the last ceremony", e),
        };
        let Some(enc) = self.existing_round_key(round) else {
            return;
        };
        let (epoch, share) = match dkg::derive_share(&state, &self.address, &enc) {
            Ok(Some(x)) => x,
            Ok(None) => return,
            Err(e) => return self.report("deriving my share", e),
        };
        match self.shares.get(&epoch) {
            Some(held) if held.index == share.index && held.to_bytes() == share.to_bytes() => {
                return;
            }
            // A share file that is not the chain's (another index, a stale
            // or corrupt value) is replaced by the derived share.
            Some(held) => warn!(
                epoch,
                held_index = held.index,
                index = share.index,
                "the share held for this epoch does not match the chain; replacing it"
            ),
            None => {}
        }
        // The key the share belongs to: waiting to activate, or active.
        let key = match dkg::state::next_key(&state) {
            Ok(Some(n)) => dkg::state::next_key_record(&n).ok(),
            _ => dkg::state::active_key_record(&state).ok().flatten(),
        }
        .filter(|k| k.epoch == epoch);
        let (group, threshold) = key.map(|k| (k.group_key, k.threshold)).unwrap_or_default();
        match dkgkey::write_epoch_share(&self.home, epoch, &share, &group, threshold) {
            Ok(path) => {
                info!(epoch, index = share.index, file = %path.display(), "derived my share of a new key")
            }
            Err(e) => self.report("writing my share", e),
        }
        self.app.add_signer(epoch, share.clone());
        self.shares.insert(epoch, share);
        while self.shares.len() > 2 {
            self.shares.pop_first();
        }
    }
}

fn describe(m: &tally_settlement::proto::ValidatorMsg) -> String {
    use tally_settlement::proto::validator_msg::Sum;
    match &m.sum {
        Some(Sum::Dealing(d)) => format!("dealing for round {}", d.round),
        Some(Sum::Ack(a)) => format!("ack of dealers {:?} in round {}", a.dealers, a.round),
        Some(Sum::Reveal(r)) => format!("{} reveal(s) in round {}", r.shares.len(), r.round),
        Some(Sum::Propose(_)) => "proposal".into(),
        Some(Sum::Approve(a)) => format!("approval of proposal {}", a.proposal),
        Some(Sum::Key(k)) => format!("key for round {}", k.round),
        None => "empty".into(),
    }
}

/// The shares a node starts with: the legacy dealer's `bls_share.json` as
/// epoch 0 (given separately) and the newest two epoch share files; a
/// file that does not load is logged and skipped (the participant derives
/// it again from the chain).
pub fn load_epoch_shares(home: &Path) -> Vec<(u64, SecretShare)> {
    let mut out = Vec::new();
    for (_, path) in dkgkey::newest_epoch_share_files(home, 2) {
        match dkgkey::load_epoch_share(&path) {
            Ok(x) => out.push(x),
            Err(e) => {
                warn!(error = %e, "epoch share file skipped (it is derived again from the chain)")
            }
        }
    }
    out
}

/// The CometBFT RPC address of this node: `cometbft_rpc` from app.toml if
/// set, else `[rpc] laddr` of `<home>/config/config.toml` (`tcp://` read as
/// `http://`, an unspecified host as 127.0.0.1), else
/// `http://127.0.0.1:26657`.
pub fn rpc_url(home: &Path, configured: &str) -> String {
    if !configured.trim().is_empty() {
        return configured.trim().to_string();
    }
    let laddr = std::fs::read_to_string(home.join("config").join("config.toml"))
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
        .and_then(|t| t.get("rpc")?.get("laddr")?.as_str().map(str::to_string));
    laddr
        .map(|a| laddr_to_url(&a))
        .unwrap_or_else(|| "http://127.0.0.1:26657".into())
}

/// `tcp://0.0.0.0:26657` -> `http://127.0.0.1:26657`.
fn laddr_to_url(laddr: &str) -> String {
    let rest = laddr
        .strip_prefix("tcp://")
        .or_else(|| laddr.strip_prefix("http://"))
        .unwrap_or(laddr);
    let rest = rest
        .strip_prefix("0.0.0.0:")
        .map(|p| format!("127.0.0.1:{p}"))
        .unwrap_or_else(|| rest.to_string());
    format!("http://{rest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rpc_address_comes_from_app_toml_then_config_toml() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(rpc_url(dir.path(), ""), "http://127.0.0.1:26657");
        std::fs::create_dir_all(dir.path().join("config")).unwrap();
        std::fs::write(
            dir.path().join("config").join("config.toml"),
            "moniker = \"x\"\n[rpc]\nladdr = \"tcp://0.0.0.0:25657\"\n[p2p]\nladdr = \"tcp://0.0.0.0:25656\"\n",
        )
        .unwrap();
        assert_eq!(rpc_url(dir.path(), ""), "http://127.0.0.1:25657");
        assert_eq!(rpc_url(dir.path(), " http://n:1 "), "http://n:1");
        assert_eq!(
            laddr_to_url("tcp://10.0.0.2:26657"),
            "http://10.0.0.2:26657"
        );
    }
}
