//! State sync in the driver: [`MemSnapshots`], a node's snapshot store
//! held in memory, and [`Net::join_by_state_sync`], a new node going
//! through CometBFT's state-sync calls against a serving node.

use std::sync::{Arc, Mutex};

use anyhow::{ensure, Context, Result};
use bytes::Bytes;
use tally_abci::{SnapshotInfo, SnapshotStore, TallyApp};
use tally_store::snapshot::{self, Metadata};
use tally_store::{Backend, MemBackend};
use tendermint_abci::Application;
use tendermint_proto::v0_38::abci::{
    response_apply_snapshot_chunk, response_offer_snapshot, RequestApplySnapshotChunk, RequestInfo,
    RequestLoadSnapshotChunk, RequestOfferSnapshot, Snapshot,
};

use super::{finalize_request, Net, Node, Storage};

/// Snapshots of one node's committed state, kept in memory: taken at every
/// multiple of `interval` when the app reports the commit, the newest two
/// kept.
#[derive(Debug)]
pub struct MemSnapshots {
    backend: Arc<dyn Backend>,
    interval: u64,
    held: Mutex<Vec<(Metadata, Vec<Vec<u8>>)>>,
}

impl MemSnapshots {
    /// The chunks of the snapshot at `height`, if held.
    pub fn chunks(&self, height: u64) -> Option<Vec<Vec<u8>>> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.iter()
            .find(|(m, _)| m.height == height)
            .map(|(_, c)| c.clone())
    }
}

impl SnapshotStore for MemSnapshots {
    fn list(&self) -> Vec<SnapshotInfo> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.iter()
            .rev()
            .map(|(m, _)| SnapshotInfo {
                metadata: m.clone(),
            })
            .collect()
    }

    fn load_chunk(&self, height: u64, format: u32, chunk: u32) -> Option<Vec<u8>> {
        if format != snapshot::FORMAT {
            return None;
        }
        self.chunks(height)?.get(chunk as usize).cloned()
    }

    fn committed(&self, height: u64) {
        if !height.is_multiple_of(self.interval) {
            return;
        }
        // The driver commits on this thread: the store is still at `height`.
        let mut chunks = Vec::new();
        let meta = snapshot::export(self.backend.as_ref(), &mut |_, c| {
            chunks.push(c.to_vec());
            Ok(())
        })
        .expect("export from an in-memory store"); // ok: test harness; a failed export must fail the test loudly
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.push((meta, chunks));
        if held.len() > 2 {
            held.remove(0);
        }
    }
}

/// A node that joined by state sync (not a validator): it follows the
/// network's decided blocks.
#[derive(Debug)]
pub struct Joined {
    /// The node.
    pub node: Node,
    /// The snapshot height it restored.
    pub restored: i64,
    /// The last height it executed.
    pub height: i64,
}

impl Joined {
    /// Executes the blocks the network decided since, checking each app
    /// hash against the network's.
    pub fn follow(&mut self, net: &Net) -> Result<()> {
        for h in self.height + 1..=net.height {
            let b = net.blocks[h as usize - 1].clone();
            let r = self.node.app.finalize_block(finalize_request(&b));
            self.node.ensure_running(usize::MAX)?;
            ensure!(
                r.app_hash.as_ref() == net.hashes[h as usize - 1].as_slice(),
                "the state-synced node executed height {h} to a different app hash"
            );
            self.node.app.commit();
            self.node.ensure_running(usize::MAX)?;
            self.height = h;
        }
        Ok(())
    }
}

/// A result code of OfferSnapshot.
pub type OfferResult = response_offer_snapshot::Result;
/// A result code of ApplySnapshotChunk.
pub type ApplyResult = response_apply_snapshot_chunk::Result;

/// The ABCI `Snapshot` CometBFT would gossip for `meta`.
pub fn abci_snapshot(meta: &Metadata) -> Snapshot {
    Snapshot {
        height: meta.height,
        format: snapshot::FORMAT,
        chunks: meta.chunks(),
        hash: Bytes::copy_from_slice(&meta.hash()),
        metadata: Bytes::from(meta.encode()),
    }
}

/// Offers `snapshot` to `app` with the trusted `app_hash`.
pub fn offer(app: &TallyApp, snapshot: Snapshot, app_hash: &[u8]) -> OfferResult {
    let r = app.offer_snapshot(RequestOfferSnapshot {
        snapshot: Some(snapshot),
        app_hash: Bytes::copy_from_slice(app_hash),
    });
    OfferResult::try_from(r.result).unwrap_or(OfferResult::Unknown)
}

/// Applies chunk `index` from `sender`: (result, refetch, rejected senders).
pub fn apply(
    app: &TallyApp,
    index: u32,
    chunk: &[u8],
    sender: &str,
) -> (ApplyResult, Vec<u32>, Vec<String>) {
    let r = app.apply_snapshot_chunk(RequestApplySnapshotChunk {
        index,
        chunk: Bytes::copy_from_slice(chunk),
        sender: sender.into(),
    });
    (
        ApplyResult::try_from(r.result).unwrap_or(ApplyResult::Unknown),
        r.refetch_chunks,
        r.reject_senders,
    )
}

impl Net {
    /// Node `i` takes a snapshot every `interval` heights from now on.
    pub fn serve_snapshots(&mut self, i: usize, interval: u64) -> Result<Arc<MemSnapshots>> {
        let backend = match &self.nodes[i].storage {
            Storage::Memory(m) => m.clone() as Arc<dyn Backend>,
            Storage::Rocks(_) => anyhow::bail!("the driver serves snapshots from in-memory nodes"),
        };
        let s = Arc::new(MemSnapshots {
            backend,
            interval: interval.max(1),
            held: Mutex::new(Vec::new()),
        });
        self.nodes[i].app.set_snapshots(s.clone());
        self.served.push((i, s.clone()));
        Ok(s)
    }

    /// The snapshot store [`Net::serve_snapshots`] gave node `i`.
    pub fn serve_snapshots_of(&self, i: usize) -> Arc<dyn SnapshotStore> {
        self.served
            .iter()
            .find(|(n, _)| *n == i)
            .map(|(_, s)| s.clone() as Arc<dyn SnapshotStore>)
            .expect("node serves no snapshots")
    }

    /// A fresh node with an empty in-memory store.
    pub fn fresh_node() -> Result<Node> {
        Node::open(Storage::Memory(Arc::new(MemBackend::new())))
    }

    /// A new node joins from node `from`'s newest snapshot the way
    /// CometBFT's state sync drives it: ListSnapshots on the server,
    /// OfferSnapshot with the app hash the network decided at that height
    /// (what the light client verifies), then LoadSnapshotChunk and
    /// ApplySnapshotChunk for every chunk in order; Info must then answer
    /// the snapshot's height and app hash. It then executes the blocks
    /// since ([`Joined::follow`]).
    pub fn join_by_state_sync(&self, from: usize) -> Result<Joined> {
        self.join_by_state_sync_as(from, tally_settlement::upgrade::LATEST_APP_VERSION)
    }

    /// [`Net::join_by_state_sync`] with a node that runs app versions up
    /// to `max_version` only (a release without the later ones).
    pub fn join_by_state_sync_as(&self, from: usize, max_version: u64) -> Result<Joined> {
        let server = &self.nodes[from].app;
        let list = server.list_snapshots();
        let s = list
            .snapshots
            .first()
            .cloned()
            .context("the server lists no snapshot")?;
        let height = s.height as i64;
        let trusted = self.hashes[height as usize - 1].clone();
        let node = Self::fresh_node()?;
        node.app.set_max_app_version(max_version);
        let offered = offer(&node.app, s.clone(), &trusted);
        ensure!(offered == OfferResult::Accept, "offer answered {offered:?}");
        for index in 0..s.chunks {
            let chunk = server
                .load_snapshot_chunk(RequestLoadSnapshotChunk {
                    height: s.height,
                    format: s.format,
                    chunk: index,
                })
                .chunk;
            ensure!(!chunk.is_empty(), "the server has no chunk {index}");
            let (r, _, _) = apply(&node.app, index, &chunk, "server");
            ensure!(r == ApplyResult::Accept, "chunk {index} answered {r:?}");
        }
        let info = node.app.info(RequestInfo::default());
        ensure!(
            info.last_block_height == height && info.last_block_app_hash.as_ref() == trusted,
            "after the restore Info says height {} app hash {}",
            info.last_block_height,
            hex::encode(&info.last_block_app_hash)
        );
        let want = self.header_version_at(height + 1);
        ensure!(
            info.app_version == want,
            "after the restore Info says app version {}, the header of {} carries {want} (CometBFT's state sync refuses the snapshot)",
            info.app_version,
            height + 1
        );
        let mut joined = Joined {
            node,
            restored: height,
            height,
        };
        joined.follow(self)?;
        Ok(joined)
    }
}
