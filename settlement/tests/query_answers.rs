//! Every query answer, byte for byte: a few hundred paths (each served path
//! with good, missing and malformed arguments, each paging parameter, every
//! page of each listing, and word soup) asked of one state with records in
//! several windows, a settled and a signed batch, pending hub calls,
//! allowances and a threshold key. The answers (code, log, value) were
//! recorded from the server as it was before the route table
//! (`settlement/src/query/`) replaced its one long `match`, and recorded
//! again with the table once every answer but the "unknown path" log (which
//! now lists the table's patterns) was shown equal, so a change in any
//! answer shows here. `TALLY_RECORD=1` writes the file again: only for a
//! change made on purpose, said in the commit.

use std::fmt::Write as _;
use std::sync::Arc;

use ed25519_dalek::SigningKey;
use prost::Message;
use tally_settlement::bls::{self, deal, Kind, SecretShare};
use tally_settlement::proto::{
    tx, HubResult, Outcome, PartialSig, ReportUsage, SubmitPartials, Tx, UsageRecord,
};
use tally_settlement::query::query;
use tally_settlement::sync;
use tally_settlement::{
    begin_block, init_chain, sign_report, AllowanceEntry, BalanceEntry, Block, Code, GatewayEntry,
    Genesis, KeyEpoch, Params, UserEntry,
};
use tally_store::{MemBackend, Pending};

const CHAIN: &str = "answers";
const T0: u64 = 1_800_000_000;
const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/query_answers.jsonl");

struct Env {
    kv: Pending,
    shares: Vec<SecretShare>,
    gw: SigningKey,
    height: u64,
    now: u64,
    next_id: u8,
}

const USERS: [&str; 3] = ["alice", "bob", "org/carol"];
const PROVIDERS: [&str; 2] = ["acme-ai", "org/prov"];

impl Env {
    fn new() -> Self {
        let gw = SigningKey::from_bytes(&[5; 32]);
        let coeffs: Vec<[u8; 64]> = (0..3u8).map(|i| [i + 40; 64]).collect();
        let (pubs, shares) = deal(4, 3, &coeffs).unwrap();
        let hexk = |k: &blst::min_pk::PublicKey| hex::encode(k.compress());
        let g = Genesis {
            params: Params {
                max_batch_calls: 2,
                ..Params::default()
            },
            gateways: vec![GatewayEntry {
                name: "gw".into(),
                pubkey: hex::encode(gw.verifying_key().to_bytes()),
            }],
            balances: USERS
                .iter()
                .map(|u| BalanceEntry {
                    user: u.to_string(),
                    amount: 1000,
                })
                .collect(),
            users: vec![UserEntry {
                name: "alice".into(),
                pubkey: hex::encode(SigningKey::from_bytes(&[6; 32]).verifying_key().to_bytes()),
            }],
            allowances: USERS
                .iter()
                .map(|u| AllowanceEntry {
                    user: u.to_string(),
                    gateway: "gw".into(),
                    max_per_window: if *u == "bob" { 500 } else { u64::MAX },
                    expires_at: if *u == "bob" { T0 + 124 } else { u64::MAX },
                })
                .collect(),
            dkg: Some(KeyEpoch {
                epoch: 0,
                threshold: 3,
                group_key: hexk(&pubs.group),
                public_shares: pubs.shares.iter().map(hexk).collect(),
                signers: (0..4u8).map(|i| hex::encode([i; 20])).collect(),
            }),
        };
        let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
        init_chain(&mut kv, CHAIN, &g).unwrap();
        Env {
            kv,
            shares,
            gw,
            height: 0,
            now: T0,
            next_id: 1,
        }
    }

    fn block(&mut self, txs: Vec<Vec<u8>>, step: u64) {
        self.height += 1;
        let b = Block {
            height: self.height,
            time: self.now,
        };
        begin_block(&mut self.kv, &b).unwrap();
        let mut all = Vec::new();
        if let Some(s) = sync::next_sync_start(&self.kv, self.now).unwrap() {
            all.push(
                Tx {
                    sum: Some(tx::Sum::SyncStart(s)),
                }
                .encode_to_vec(),
            );
        }
        all.extend(txs);
        for t in &all {
            let r = tally_settlement::deliver_tx(&mut self.kv, &b, t).expect("no local fault");
            assert_eq!(r.code, Code::Ok, "{}", r.log);
        }
        self.now += step;
    }

    /// A report of one record per (user, provider) pair, outcomes varied.
    fn report(&mut self, amount: u64) -> Vec<u8> {
        self.next_id += 1;
        let outcomes = [
            Outcome::Ok,
            Outcome::Cancel,
            Outcome::RateLimit,
            Outcome::Client,
        ];
        let mut records = Vec::new();
        for (i, u) in USERS.iter().enumerate() {
            for (j, p) in PROVIDERS.iter().enumerate() {
                let outcome = outcomes[(i + j + self.next_id as usize) % outcomes.len()];
                records.push(UsageRecord {
                    user: u.to_string(),
                    provider: p.to_string(),
                    model: if j == 0 { "llama/3-70b" } else { "m" }.into(),
                    route: if i == 0 { "/v1/chat" } else { "r" }.into(),
                    outcome: outcome as i32,
                    units: 3 + i as u64,
                    amount: if outcome == Outcome::RateLimit {
                        0
                    } else {
                        amount
                    },
                    ..Default::default()
                });
            }
        }
        sign_report(
            &self.gw,
            &ReportUsage {
                chain_id: CHAIN.into(),
                report_id: vec![self.next_id; 16],
                expires_at: self.now + 100,
                records,
                route_calls: Vec::new(),
            },
        )
    }

    /// Three signers' partials of one message.
    fn partials(&self, kind: Kind, d: &[u8; 32]) -> Vec<PartialSig> {
        self.shares[..3]
            .iter()
            .map(|s| PartialSig {
                epoch: 0,
                index: s.index,
                kind: kind.value(),
                digest: d.to_vec(),
                signature: s.sign(&bls::message(CHAIN, kind, d)).sig_bytes().to_vec(),
            })
            .collect()
    }

    /// The current batch's digest.
    fn current_digest(&self) -> [u8; 32] {
        let st = sync::sync_state(&self.kv, "hub").unwrap();
        let b = sync::batch(&self.kv, "hub", st.current_nonce)
            .unwrap()
            .unwrap();
        b.digest.as_slice().try_into().unwrap()
    }

    /// Signs the current batch, and settles it when `settle`.
    fn sign_current(&mut self, settle: bool) {
        let st = sync::sync_state(&self.kv, "hub").unwrap();
        let mut partials = self.partials(Kind::Batch, &self.current_digest());
        let mut hub_results = Vec::new();
        if settle {
            let res = HubResult {
                chain: "hub".into(),
                nonce: st.current_nonce,
                attempt: st.attempt,
                settled: true,
            };
            partials.extend(self.partials(Kind::HubResult, &sync::result_digest(&res)));
            hub_results.push(res);
        }
        let tx = Tx {
            sum: Some(tx::Sum::Partials(SubmitPartials {
                partials,
                hub_results,
                hub_blocks: Vec::new(),
            })),
        }
        .encode_to_vec();
        self.block(vec![tx], 1);
    }
}

/// Three windows of records, batch 1 settled, batch 2 pending (its
/// signature collected), more hub calls waiting, window 3 open.
fn state() -> Env {
    let mut env = Env::new();
    let t = env.report(5);
    env.block(vec![t], 30);
    let t = env.report(7);
    env.block(vec![t], 31); // next block is in window 2
    let t = env.report(11);
    env.block(vec![t], 1); // window 1 closed: hub calls, batch 1
    env.sign_current(true); // batch 1 signed and settled
    env.now += 60;
    let t = env.report(2);
    env.block(vec![t], 1); // window 2 closed, batch 2 formed
    env.sign_current(false); // batch 2 signed, not settled
    env
}

fn paths(w1: u64) -> Vec<String> {
    let ws = [w1.to_string(), (w1 + 1).to_string(), (w1 + 2).to_string()];
    let mut out = Vec::new();
    let enc = tally_settlement::query_path::encode;
    let bad_ids = ["", "a b", "%zz", "%C3%28", &"x".repeat(65), "ä"];
    // Routes, with valid, unknown and malformed identifiers and windows.
    for u in USERS.iter().chain(&["nobody"]) {
        for (p, m) in [("acme-ai", "llama/3-70b"), ("org/prov", "m")] {
            let r = if *u == "alice" { "/v1/chat" } else { "r" };
            let base = format!("/sla/route/{}/{}/{}/{}", enc(u), enc(p), enc(m), enc(r));
            out.push(base.clone());
            for w in ws
                .iter()
                .map(String::as_str)
                .chain(["x", "-1", "18446744073709551616"])
            {
                out.push(format!("{base}/{w}"));
            }
            out.push(format!("{base}/{}/extra", ws[0]));
            out.push(format!("{base}/{}?limit=1", ws[0]));
        }
    }
    for b in bad_ids {
        out.push(format!("/sla/route/{b}/acme-ai/m/r"));
        out.push(format!("/sla/route/alice/{b}/m/r/{}", ws[0]));
        out.push(format!("/sla/route/alice/acme-ai/{b}/r"));
        out.push(format!("/sla/route/alice/acme-ai/m/{b}/x"));
        out.push(format!("/sla/provider/{b}"));
        out.push(format!("/sla/user/{b}/x"));
        out.push(format!("/balance/{b}"));
        out.push(format!("/allowances/{b}"));
        out.push(format!("/sync/{b}"));
        out.push(format!("/batch/{b}/1"));
        out.push(format!("/hubcalls/{b}"));
    }
    out.push("/sla/route/alice/acme-ai/m".into());
    for kind in ["provider", "user"] {
        let names: &[&str] = if kind == "user" { &USERS } else { &PROVIDERS };
        for n in names.iter().chain(&["nobody"]) {
            let base = format!("/sla/{kind}/{}", enc(n));
            out.push(base.clone());
            for w in ws.iter().map(String::as_str).chain(["x", ""]) {
                out.push(format!("{base}/{w}"));
            }
            out.push(format!("{base}/{}/x", ws[0]));
        }
        out.push(format!("/sla/{kind}"));
    }
    out.push("/sla".into());
    out.push("/sla/other/x".into());
    for u in USERS.iter().chain(&["nobody"]) {
        out.push(format!("/balance/{}", enc(u)));
        out.push(format!("/allowances/{}", enc(u)));
    }
    for chain in ["hub", "other", "a/b"] {
        out.push(format!("/sync/{}", enc(chain)));
        out.push(format!("/hubcalls/{}", enc(chain)));
        for n in ["0", "1", "2", "3", "x", "-1", "18446744073709551616"] {
            out.push(format!("/batch/{}/{n}", enc(chain)));
        }
    }
    for simple in [
        "/windows",
        "/params",
        "/gateways",
        "/dkg",
        "/validators",
        "/proposals",
        "/proposals?from=1",
        "/proposals?from=x",
        "/proposals?limit=2",
        "/proposals?",
        "params",
        "//params",
        "/params/",
        "/params/x",
        "/PARAMS",
        "/",
        "",
        "?",
        "/key",
        "/balance",
        "/balance/alice/x",
        "/batch/hub",
        "/batch/hub/1/x",
        "/sync",
        "/sync/hub/x",
        "/hubcalls",
        "/windows/1",
        "/dkg/x",
        "/validators/x",
        "/gateways/x",
        "/allowances",
        "/proposals/x",
        "/nope",
        "/sla/route/%",
        "/%zz",
        "/%FF/x",
    ] {
        out.push(simple.into());
    }
    // Query strings on every kind of path.
    let qs = [
        "",
        "limit=1",
        "limit=2",
        "limit=0",
        "limit=1000",
        "limit=1001",
        "limit=x",
        "cursor=zz",
        "cursor=00",
        "cursor=",
        "x=1",
        "limit=1&&x",
        "%zz=1",
        "limit=%zz",
        "limit=1&limit=3",
        "cursor=0000000000000001",
    ];
    let bases = [
        format!("/sla/provider/acme-ai/{}", ws[0]),
        "/sla/provider/acme-ai".into(),
        "/sla/user/alice".into(),
        "/sla/route/alice/acme-ai/llama%2F3-70b/%2Fv1%2Fchat".into(),
        "/windows".into(),
        "/hubcalls/hub".into(),
        "/balance/alice".into(),
        "/allowances/alice".into(),
        "/params".into(),
        "/gateways".into(),
        "/sync/hub".into(),
        "/batch/hub/1".into(),
        "/dkg".into(),
        "/validators".into(),
        "/nope".into(),
    ];
    for b in &bases {
        for q in qs {
            out.push(format!("{b}?{q}"));
        }
    }
    out.extend(soup(200));
    out
}

/// Paths made of the served paths' own words, from a fixed linear
/// congruential sequence.
fn soup(n: usize) -> Vec<String> {
    const WORDS: &[&str] = &[
        "/",
        "sla",
        "route",
        "provider",
        "user",
        "windows",
        "balance",
        "params",
        "gateways",
        "sync",
        "batch",
        "hubcalls",
        "dkg",
        "validators",
        "proposals",
        "allowances",
        "hub",
        "alice",
        "acme-ai",
        "m",
        "r",
        "1",
        "0",
        "?",
        "&",
        "=",
        "limit",
        "cursor",
        "from",
        "%",
        "%2F",
        "%zz",
        "00",
    ];
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) as usize
    };
    (0..n)
        .map(|_| {
            let len = next() % 9;
            (0..len).map(|_| WORDS[next() % WORDS.len()]).collect()
        })
        .collect()
}

fn answer(env: &Env, path: &str, out: &mut String) -> Option<String> {
    let r = query(&env.kv, path);
    let value = String::from_utf8(r.value.clone()).expect("utf-8 value");
    let line = serde_json::json!([path, r.code.value(), r.log, value]);
    writeln!(out, "{line}").unwrap();
    if r.code != Code::Ok {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&value).ok()?;
    v.get("next_cursor")?.as_str().map(String::from)
}

fn answers() -> String {
    let env = state();
    let w1 = T0 / 60;
    let mut out = String::new();
    for p in paths(w1) {
        answer(&env, &p, &mut out);
    }
    // Every page of every listing, one and two items at a time.
    for base in [
        "/sla/provider/acme-ai".to_string(),
        "/sla/provider/org%2Fprov".into(),
        format!("/sla/user/org%2Fcarol/{}", w1 + 1),
        "/sla/user/alice".into(),
        "/sla/route/bob/org%2Fprov/m/r".into(),
        "/windows".into(),
        "/hubcalls/hub".into(),
    ] {
        for limit in [1, 2] {
            let mut cursor = None;
            for _ in 0..50 {
                let path = match &cursor {
                    None => format!("{base}?limit={limit}"),
                    Some(c) => format!("{base}?limit={limit}&cursor={c}"),
                };
                cursor = answer(&env, &path, &mut out);
                if cursor.is_none() {
                    break;
                }
            }
        }
    }
    out
}

#[test]
fn every_answer_is_the_recorded_one() {
    let got = answers();
    if std::env::var_os("TALLY_RECORD").is_some() {
        std::fs::write(GOLDEN, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(GOLDEN).expect("recorded answers");
    let mut diffs = Vec::new();
    for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
        if g != w {
            diffs.push(format!("line {}:\n  now  {g}\n  was  {w}", i + 1));
        }
    }
    assert_eq!(
        got.lines().count(),
        want.lines().count(),
        "number of answers"
    );
    assert!(
        diffs.is_empty(),
        "{} answers changed:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}
