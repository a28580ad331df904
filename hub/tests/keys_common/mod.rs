//! What the hub's key tests share: keys dealt by the BLS module's trusted
//! dealer, signed rotations and batches, and running a transaction.

use prost::Message;
use tally_hub::machine::{self, hub_tx, HubCode, HubTx, RotateKey, SubmitBatch};
use tally_settlement::bls::{self, deal, Kind, PublicShares, SecretShare};
use tally_settlement::proto::HubCall;
use tally_settlement::sync::{batch_digest, rotation_digest};
use tally_store::Pending;

pub const SETTLEMENT: &str = "tally-localnet";

pub type Key = (PublicShares, Vec<SecretShare>);

pub fn key(seed: u8) -> Key {
    let coeffs: Vec<[u8; 64]> = (0..3u8).map(|i| [i + seed; 64]).collect();
    deal(4, 3, &coeffs).unwrap()
}

pub fn sign(k: &Key, kind: Kind, digest: &[u8; 32]) -> Vec<u8> {
    let msg = bls::message(SETTLEMENT, kind, digest);
    let parts: Vec<_> = k.1[..3].iter().map(|s| s.sign(&msg)).collect();
    k.0.combine(&msg, &parts).unwrap().compress().to_vec()
}

pub fn rotation(signer: &Key, nonce: u64, epoch: u64, next: &[u8]) -> Vec<u8> {
    let d = rotation_digest("hub", nonce, epoch, next);
    HubTx {
        sum: Some(hub_tx::Sum::RotateKey(RotateKey {
            chain: "hub".into(),
            nonce,
            epoch,
            group_key: next.to_vec(),
            signature: sign(signer, Kind::KeyRotation, &d),
        })),
    }
    .encode_to_vec()
}

pub fn batch(signer: &Key, nonce: u64) -> Vec<u8> {
    let calls = vec![HubCall {
        id: nonce,
        user: "bob".into(),
        provider: "acme".into(),
        amount: 10,
        window: 1,
        kind: 0,
    }];
    let d = batch_digest("hub", nonce, &calls);
    HubTx {
        sum: Some(hub_tx::Sum::SubmitBatch(SubmitBatch {
            chain: "hub".into(),
            nonce,
            calls,
            signature: sign(signer, Kind::Batch, &d),
        })),
    }
    .encode_to_vec()
}

pub fn run(kv: &mut Pending, h: u64, tx: &[u8]) -> HubCode {
    machine::deliver(kv, h, tx).expect("store").code
}

pub fn keys(kv: &Pending) -> serde_json::Value {
    let r = machine::query(kv, "/keys/hub");
    assert_eq!(r.code, HubCode::Ok, "{}", r.log);
    serde_json::from_slice(&r.value).unwrap()
}
