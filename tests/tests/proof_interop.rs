//! Interop: Tally's `/key` proofs verify with the `ics23` crate alone.
//!
//! The verifier side of this test uses nothing of Tally's: the proof spec is
//! built by hand from `docs/proofs.md`, keys are built by hand from the same
//! page, values are decoded by hand, and the expected values come from a
//! model of the reports the test sent. An in-process validator answers the
//! queries through its ABCI `Query` handler, exactly what CometBFT's
//! `abci_query` forwards.

use std::collections::BTreeMap;

use ics23::{HashOp, HostFunctionsManager, InnerSpec, LeafOp, LengthOp, ProofSpec};
use prost_ics23::Message;
use tally_settlement::proto::UsageRecord;
use tally_tests::driver::Net;
use tally_tests::traffic::{app_state, gateway_key, Traffic};
use tendermint_abci::Application;
use tendermint_proto::v0_38::abci::RequestQuery;

const CHAIN: &str = "tally-interop";
const T0: i64 = 1_800_000_000;
const WINDOW_SECS: u64 = 3600;
const FUNDS: u64 = 1_000_000;

/// jmt's ICS23 spec, written from docs/proofs.md.
fn spec() -> ProofSpec {
    ProofSpec {
        leaf_spec: Some(LeafOp {
            hash: HashOp::Sha256.into(),
            prehash_key: HashOp::Sha256.into(),
            prehash_value: HashOp::Sha256.into(),
            length: LengthOp::NoPrefix.into(),
            prefix: b"JMT::LeafNode".to_vec(),
        }),
        inner_spec: Some(InnerSpec {
            hash: HashOp::Sha256.into(),
            child_order: vec![0, 1],
            min_prefix_length: 16,
            max_prefix_length: 16,
            child_size: 32,
            empty_child: b"SPARSE_MERKLE_PLACEHOLDER_HASH__".to_vec(),
        }),
        min_depth: 0,
        max_depth: 64,
        prehash_key_before_comparison: true,
    }
}

struct Answer {
    code: u32,
    value: Vec<u8>,
    height: i64,
    proof: ics23::CommitmentProof,
}

fn ask(net: &Net, key: &[u8], height: i64) -> Answer {
    let r = net.nodes[0].app.query(RequestQuery {
        data: key.to_vec().into(),
        path: "/key".into(),
        height,
        prove: true,
    });
    let ops = r.proof_ops.expect("proof ops").ops;
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].r#type, "ics23:jmt");
    assert_eq!(ops[0].key, key);
    Answer {
        code: r.code,
        value: r.value.to_vec(),
        height: r.height,
        proof: ics23::CommitmentProof::decode(ops[0].data.as_slice()).expect("CommitmentProof"),
    }
}

fn member(a: &Answer, root: &[u8], key: &[u8], value: &[u8]) -> bool {
    ics23::verify_membership::<HostFunctionsManager>(&a.proof, &spec(), &root.to_vec(), key, value)
}

fn absent(a: &Answer, root: &[u8], key: &[u8]) -> bool {
    ics23::verify_non_membership::<HostFunctionsManager>(&a.proof, &spec(), &root.to_vec(), key)
}

fn u64s(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
        .collect()
}

/// Ten counters in the documented order, from the model.
fn counters(rs: &[&UsageRecord]) -> Vec<u64> {
    let mut c = [0u64; 10];
    for r in rs {
        c[0] += 1;
        // ok, cancel, rate_limit, auth, transient, client, unknown
        let slot = match r.outcome {
            1 => 1,
            2 => 2,
            3 => 3,
            4 => 4,
            5 => 5,
            6 => 6,
            _ => 7,
        };
        c[slot] += 1;
        c[8] += r.units;
        c[9] += r.amount;
    }
    c.to_vec()
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn proofs_verify_with_ics23_alone_and_tampering_is_refused() -> anyhow::Result<()> {
    let key = gateway_key(3);
    let mut traffic = Traffic::new(77, key.clone(), CHAIN, [3, 3, 2, 2]);
    let mut net = Net::in_memory(1, CHAIN, T0)?;
    net.init(&app_state(&key, &traffic.users, FUNDS, WINDOW_SECS))?;
    let mut sent: Vec<UsageRecord> = Vec::new();
    let mut roots = Vec::new();
    for _ in 0..20 {
        let mut txs = Vec::new();
        for _ in 0..2 {
            let recs = traffic.records(10, 9);
            sent.extend(recs.iter().cloned());
            txs.push(traffic.report(recs, net.now as u64, 120));
        }
        let out = net.block(txs, 1)?;
        for r in &out.tx_results {
            anyhow::ensure!(r.code == 0, "report refused: {}", r.log);
        }
        roots.push(out.app_hash);
    }
    let height = roots.len() as i64;
    let root = roots.last().unwrap().clone();
    let window = (T0 as u64 / WINDOW_SECS).to_be_bytes();

    // Every route record, from the model.
    let mut routes: BTreeMap<(String, String, String, String), Vec<&UsageRecord>> = BTreeMap::new();
    for r in &sent {
        routes
            .entry((
                r.user.clone(),
                r.provider.clone(),
                r.model.clone(),
                r.route.clone(),
            ))
            .or_default()
            .push(r);
    }
    for ((u, p, m, rt), rs) in &routes {
        let k = cat(&[
            b"rr/",
            u.as_bytes(),
            b"\0",
            p.as_bytes(),
            b"\0",
            m.as_bytes(),
            b"\0",
            rt.as_bytes(),
            b"\0",
            &window,
        ]);
        let a = ask(&net, &k, 0);
        assert_eq!((a.code, a.height), (0, height));
        assert_eq!(u64s(&a.value), counters(rs), "route {u} {p} {m} {rt}");
        assert!(member(&a, &root, &k, &a.value));
        // Tampered value, root or key: refused.
        let mut v = a.value.clone();
        v[7] ^= 1;
        assert!(!member(&a, &root, &k, &v), "tampered value accepted");
        let mut bad_root = root.clone();
        bad_root[0] ^= 1;
        assert!(!member(&a, &bad_root, &k, &a.value), "wrong root accepted");
        let mut other = k.clone();
        other[3] ^= 1;
        assert!(!member(&a, &root, &other, &a.value), "other key accepted");
        assert!(!absent(&a, &root, &k), "a present key proved absent");
    }

    // Provider and user totals with route counts.
    for (ns, party_of) in [(&b"pw/"[..], 1usize), (&b"uw/"[..], 0usize)] {
        let mut parties: BTreeMap<String, (Vec<&UsageRecord>, usize)> = BTreeMap::new();
        for ((u, p, _, _), rs) in &routes {
            let party = if party_of == 0 { u } else { p };
            let e = parties.entry(party.clone()).or_default();
            e.0.extend(rs.iter().copied());
            e.1 += 1;
        }
        for (party, (rs, n)) in parties {
            let k = cat(&[ns, party.as_bytes(), b"\0", &window]);
            let a = ask(&net, &k, 0);
            assert_eq!(a.code, 0);
            let mut want = counters(&rs);
            want.push(n as u64);
            assert_eq!(
                u64s(&a.value),
                want,
                "{} {party}",
                String::from_utf8_lossy(ns)
            );
            assert!(member(&a, &root, &k, &a.value));
        }
    }

    // Balances: funds minus what the user was charged.
    for u in &traffic.users {
        let spent: u64 = sent.iter().filter(|r| &r.user == u).map(|r| r.amount).sum();
        let k = cat(&[b"bal/", u.as_bytes()]);
        let a = ask(&net, &k, 0);
        assert_eq!(u64s(&a.value), vec![FUNDS - spent]);
        assert!(member(&a, &root, &k, &a.value));
    }

    // An absent key: code 22 and a non-existence proof.
    let k = b"bal/nobody".to_vec();
    let a = ask(&net, &k, 0);
    assert_eq!(a.code, 22);
    assert!(a.value.is_empty());
    assert!(absent(&a, &root, &k));
    assert!(!member(&a, &root, &k, b""), "absence proved presence");

    // Index entries hold 0x01 and prove; absent keys beside them (in every
    // namespace with index or marker entries) prove absent.
    let (u, p, m, rt) = routes.keys().next().unwrap().clone();
    let k = cat(&[
        b"ip/",
        p.as_bytes(),
        b"\0",
        &window,
        u.as_bytes(),
        b"\0",
        m.as_bytes(),
        b"\0",
        rt.as_bytes(),
    ]);
    let a = ask(&net, &k, 0);
    assert_eq!((a.code, a.value.as_slice()), (0, &[1u8][..]));
    assert!(member(&a, &root, &k, &a.value));
    for k in [
        cat(&[b"ip/", p.as_bytes(), b"\0", &window, b"zz"]),
        cat(&[b"iu/", u.as_bytes(), b"\0", &window, b"zz"]),
        cat(&[b"rexp/", &[0xff; 8]]),
        cat(&[b"pw/nobody-here\0", &window]),
        cat(&[b"uw/nobody-here\0", &window]),
        b"rr/zzz".to_vec(),
    ] {
        let a = ask(&net, &k, 0);
        assert_eq!(a.code, 22, "{}", String::from_utf8_lossy(&k));
        assert!(
            absent(&a, &root, &k),
            "absence of {} not proven",
            String::from_utf8_lossy(&k)
        );
    }

    // A proof with one byte changed no longer verifies.
    let k = cat(&[b"bal/", traffic.users[0].as_bytes()]);
    let a = ask(&net, &k, 0);
    let mut bytes = a.proof.encode_to_vec();
    let mut refused = 0;
    for i in (0..bytes.len()).step_by(7) {
        bytes[i] ^= 0x40;
        let ok = ics23::CommitmentProof::decode(bytes.as_slice()).is_ok_and(|p| {
            ics23::verify_membership::<HostFunctionsManager>(&p, &spec(), &root, &k, &a.value)
        });
        if !ok {
            refused += 1;
        }
        bytes[i] ^= 0x40;
    }
    let tries = bytes.len().div_ceil(7);
    // Field tags and lengths may survive a flip; hashes and prefixes do not.
    assert!(
        refused * 10 >= tries * 9,
        "only {refused} of {tries} tampered proofs refused"
    );

    // A past height proves against that height's root.
    let past = 10i64;
    let a = ask(&net, &k, past);
    assert_eq!(a.height, past);
    let past_root = &roots[past as usize - 1];
    assert!(member(&a, past_root, &k, &a.value));
    assert!(!member(&a, &root, &k, &a.value) || a.value == ask(&net, &k, 0).value);
    Ok(())
}

/// App version 7 with `sla_keep_windows` = 1 (ADR 0026): once the horizon
/// passed a window, `/key` answers code 28 for its route record at every
/// later height, with the horizon's value and a membership proof of
/// `meta/sla_kept_from` that ics23 verifies against that height's root;
/// at a height before the horizon moved, the same key is still proved
/// present. Keys, the window layout and the expected horizon are written
/// from docs/proofs.md and the block times the test chose.
#[test]
fn a_pruned_window_answers_28_with_a_proof_of_the_horizon() -> anyhow::Result<()> {
    const SECS: u64 = 60;
    let key = gateway_key(4);
    let mut traffic = Traffic::new(78, key.clone(), CHAIN, [3, 3, 2, 2]);
    let mut net = Net::in_memory(1, CHAIN, T0)?;
    net.genesis_version = 7;
    let mut state: serde_json::Value =
        serde_json::from_str(&app_state(&key, &traffic.users, FUNDS, SECS))?;
    state["params"]["sla_keep_windows"] = serde_json::json!(1);
    net.init(&state.to_string())?;
    let w0 = T0 as u64 / SECS;
    let mut roots = Vec::new();
    let mut first = None;
    // Four blocks in window w0, then one in w0 + 1.
    for step in [1, 1, 1, 60, 60] {
        let recs = traffic.records(4, 9);
        first.get_or_insert_with(|| recs[0].clone());
        let out = net.block(vec![traffic.report(recs, net.now as u64, 120)], step)?;
        anyhow::ensure!(out.tx_results[0].code == 0, "{}", out.tx_results[0].log);
        roots.push(out.app_hash);
    }
    // One more block, in window w0 + 2: the horizon is w0 + 1.
    roots.push(net.block(Vec::new(), 1)?.app_hash);
    let r = first.unwrap();
    let k = cat(&[
        b"rr/",
        r.user.as_bytes(),
        b"\0",
        r.provider.as_bytes(),
        b"\0",
        r.model.as_bytes(),
        b"\0",
        r.route.as_bytes(),
        b"\0",
        &w0.to_be_bytes(),
    ]);
    let horizon_key = b"meta/sla_kept_from";
    let latest = roots.len() as i64;
    let mut pruned_from = None;
    for h in 1..=latest {
        let q = net.nodes[0].app.query(RequestQuery {
            data: k.clone().into(),
            path: "/key".into(),
            height: h,
            prove: true,
        });
        let ops = q.proof_ops.expect("proof ops").ops;
        let proof = ics23::CommitmentProof::decode(ops[0].data.as_slice())?;
        let root = &roots[h as usize - 1];
        if q.code == 28 {
            pruned_from.get_or_insert(h);
            assert_eq!(
                ops[0].key, horizon_key,
                "height {h}: the proof is of the horizon"
            );
            assert_eq!(q.value.as_ref(), (w0 + 1).to_be_bytes(), "height {h}");
            assert!(q.log.contains("pruned"), "{}", q.log);
            let a = Answer {
                code: q.code,
                value: q.value.to_vec(),
                height: q.height,
                proof,
            };
            assert!(member(&a, root, horizon_key, &a.value), "height {h}");
            let mut forged = a.value.clone();
            forged[7] ^= 1;
            assert!(!member(&a, root, horizon_key, &forged), "forged horizon");
        } else {
            assert_eq!(q.code, 0, "height {h}: {}", q.log);
            assert!(pruned_from.is_none(), "height {h} answers again after 28");
            assert_eq!(ops[0].key, k);
            let a = Answer {
                code: q.code,
                value: q.value.to_vec(),
                height: q.height,
                proof,
            };
            assert!(member(&a, root, &k, &a.value), "height {h}");
        }
    }
    // The clock moves after each block: blocks 1-4 are in w0, 5 in w0 + 1
    // and 6 in w0 + 2, where the horizon passes w0.
    assert_eq!(pruned_from, Some(6));
    Ok(())
}
