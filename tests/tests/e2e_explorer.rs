//! `tallyd explorer` end to end, in a real browser: a 4-validator localnet
//! with the hub (one localnet shared by the named tests below, run in order
//! by `tally_tests::harness`), known usage reports in two settlement
//! windows, `tallyd explorer` in front of validator 0, and Debian's
//! headless Chromium driven through chromedriver over W3C WebDriver
//! (`tally_tests::webdriver`).
//!
//! 1. `page_shows_the_reported_sla`: per provider and route, the fail-rate
//!    and volume charts (SVG bars: data attributes, drawn heights, labels)
//!    and the class breakdown show exactly what the test's own arithmetic
//!    over the reports it sent gives (cancel and client apart, never in the
//!    fail rate; a window of only cancelled calls has no rate), and the
//!    balances are the funded amounts minus what was charged;
//! 2. `pipeline_matches_the_node`: once both windows' payments settled, the
//!    pipeline panel shows the node's `/sync/hub` and last batch, and the
//!    batches paid exactly what the reports charged;
//! 3. `bad_requests_are_refused`: the explorer forwards no other query
//!    path, refuses bad arguments and methods with clear errors, answers
//!    allowed paths with the node's own value, and a page whose node is
//!    down says so;
//! 4. `screenshot_is_saved`: a full-page PNG in
//!    `$CARGO_TARGET_DIR/test-artifacts/explorer.png`.
//!
//! SKIPPED without `cometbft`, `chromium` or `chromedriver` on PATH (failed
//! instead with `TALLY_E2E_REQUIRED`). About two minutes.

use std::collections::BTreeMap;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};
use tally_node::records::build_report;
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_tests::harness::{self, Test};
use tally_tests::localnet::{free_port_base, tallyd_path, Localnet};
use tally_tests::webdriver::{self, Browser, Group};

/// Ports from here, or the next free block; below the ephemeral range.
const PORT_BASE: u16 = 24656;
/// Short windows: the reports land in two of them and both close soon.
const WINDOW_SECS: u64 = 20;
/// Offsets from the localnet's port base (it uses up to +105).
const EXPLORER_OFFSET: u16 = 150;
const DRIVER_OFFSET: u16 = 151;
const DEAD_EXPLORER_OFFSET: u16 = 152;

const PROV_A: &str = "exp-prov-a";
const PROV_B: &str = "exp-prov-b";
const USERS: [&str; 2] = ["alice", "bob"];
/// Units of every record.
const UNITS: u64 = 10;

/// `count` records of one outcome, each charging `amount`.
struct Line {
    user: &'static str,
    provider: &'static str,
    model: &'static str,
    route: &'static str,
    outcome: Outcome,
    count: u64,
    amount: u64,
}

const fn line(
    user: &'static str,
    provider: &'static str,
    model: &'static str,
    route: &'static str,
    outcome: Outcome,
    count: u64,
    amount: u64,
) -> Line {
    Line {
        user,
        provider,
        model,
        route,
        outcome,
        count,
        amount,
    }
}

const M1: &str = "org/model-1";
const M2: &str = "org/model-2";
const CHAT: &str = "/v1/chat";
const EMBED: &str = "/v1/embed";

/// The first window's report.
const REPORT_1: &[Line] = &[
    line("alice", PROV_A, M1, CHAT, Outcome::Ok, 4, 3),
    line("alice", PROV_A, M1, CHAT, Outcome::RateLimit, 2, 0),
    line("alice", PROV_A, M1, CHAT, Outcome::Transient, 3, 0),
    line("alice", PROV_A, M1, CHAT, Outcome::Cancel, 2, 1),
    line("alice", PROV_A, M1, CHAT, Outcome::Client, 1, 0),
    line("bob", PROV_A, M1, CHAT, Outcome::Ok, 2, 5),
    line("bob", PROV_A, M1, CHAT, Outcome::Auth, 1, 0),
    line("bob", PROV_A, M1, CHAT, Outcome::Unknown, 1, 0),
    line("bob", PROV_A, M1, CHAT, Outcome::Cancel, 1, 0),
    line("bob", PROV_A, M1, CHAT, Outcome::Client, 2, 1),
    line("alice", PROV_A, M2, EMBED, Outcome::Ok, 5, 2),
    line("alice", PROV_A, M2, EMBED, Outcome::Transient, 1, 0),
    line("bob", PROV_B, M1, CHAT, Outcome::Ok, 3, 4),
    line("bob", PROV_B, M1, CHAT, Outcome::RateLimit, 1, 0),
];

/// The second window's report: route b1 gets only cancelled calls (no
/// fail rate at all).
const REPORT_2: &[Line] = &[
    line("alice", PROV_A, M1, CHAT, Outcome::Ok, 1, 3),
    line("alice", PROV_A, M1, CHAT, Outcome::Transient, 1, 0),
    line("alice", PROV_A, M1, CHAT, Outcome::Cancel, 3, 0),
    line("bob", PROV_A, M1, CHAT, Outcome::Client, 1, 0),
    line("bob", PROV_A, M2, EMBED, Outcome::Ok, 2, 1),
    line("bob", PROV_A, M2, EMBED, Outcome::RateLimit, 2, 0),
    line("bob", PROV_A, M2, EMBED, Outcome::Auth, 1, 0),
    line("alice", PROV_B, M1, CHAT, Outcome::Cancel, 2, 1),
];

/// A route's counters in one window, summed by the test.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    requests: u64,
    ok: u64,
    rate_limit: u64,
    auth: u64,
    transient: u64,
    unknown: u64,
    cancel: u64,
    client: u64,
    units: u64,
    amount: u64,
}

impl Counts {
    fn add(&mut self, l: &Line) {
        self.requests += l.count;
        self.units += l.count * UNITS;
        self.amount += l.count * l.amount;
        let slot = match l.outcome {
            Outcome::Ok => &mut self.ok,
            Outcome::RateLimit => &mut self.rate_limit,
            Outcome::Auth => &mut self.auth,
            Outcome::Transient => &mut self.transient,
            Outcome::Unknown => &mut self.unknown,
            Outcome::Cancel => &mut self.cancel,
            Outcome::Client => &mut self.client,
            Outcome::Unspecified => unreachable!("not in the plan"),
        };
        *slot += l.count;
    }

    /// FailCount: never cancel, never client.
    fn fail(&self) -> u64 {
        self.rate_limit + self.auth + self.transient + self.unknown
    }

    /// The fail rate's denominator.
    fn base(&self) -> u64 {
        self.requests - self.cancel - self.client
    }

    /// The fail rate as the page must print it: one decimal, half up.
    fn rate_text(&self) -> String {
        let (f, b) = (self.fail(), self.base());
        if b == 0 {
            return "n/a".into();
        }
        let tenths = (2000 * f + b) / (2 * b);
        format!("{}.{}%", tenths / 10, tenths % 10)
    }

    /// The volume chart's segments: classes with calls.
    fn segments(&self) -> BTreeMap<String, u64> {
        [
            ("ok", self.ok),
            ("rate_limit", self.rate_limit),
            ("auth", self.auth),
            ("transient", self.transient),
            ("unknown", self.unknown),
            ("cancel", self.cancel),
            ("client", self.client),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| (k.to_string(), n))
        .collect()
    }

    /// The breakdown table's row.
    fn row(&self) -> BTreeMap<String, String> {
        [
            ("requests", self.requests.to_string()),
            ("ok", self.ok.to_string()),
            ("rate_limit", self.rate_limit.to_string()),
            ("auth", self.auth.to_string()),
            ("transient", self.transient.to_string()),
            ("unknown", self.unknown.to_string()),
            ("fail_count", self.fail().to_string()),
            ("fail_rate", self.rate_text()),
            ("cancel", self.cancel.to_string()),
            ("client", self.client.to_string()),
            ("units", self.units.to_string()),
            ("amount", self.amount.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

fn plus(a: Counts, b: Counts) -> Counts {
    Counts {
        requests: a.requests + b.requests,
        ok: a.ok + b.ok,
        rate_limit: a.rate_limit + b.rate_limit,
        auth: a.auth + b.auth,
        transient: a.transient + b.transient,
        unknown: a.unknown + b.unknown,
        cancel: a.cancel + b.cancel,
        client: a.client + b.client,
        units: a.units + b.units,
        amount: a.amount + b.amount,
    }
}

/// (provider, model, route) -> window -> counts.
type Expected = BTreeMap<(String, String, String), BTreeMap<u64, Counts>>;

fn expected(reports: &[(&[Line], u64)]) -> Expected {
    let mut e = Expected::new();
    for (lines, window) in reports {
        for l in *lines {
            e.entry((l.provider.into(), l.model.into(), l.route.into()))
                .or_default()
                .entry(*window)
                .or_default()
                .add(l);
        }
    }
    e
}

fn charged(user: &str) -> u64 {
    REPORT_1
        .iter()
        .chain(REPORT_2)
        .filter(|l| l.user == user)
        .map(|l| l.count * l.amount)
        .sum()
}

const TESTS: [Test<Net>; 4] = [
    Test {
        name: "page_shows_the_reported_sla",
        needs: &[],
        run: page_shows_the_reported_sla,
    },
    Test {
        name: "pipeline_matches_the_node",
        needs: &["page_shows_the_reported_sla"],
        run: pipeline_matches_the_node,
    },
    Test {
        name: "bad_requests_are_refused",
        needs: &[],
        run: bad_requests_are_refused,
    },
    Test {
        name: "screenshot_is_saved",
        needs: &["page_shows_the_reported_sla"],
        run: screenshot_is_saved,
    },
];

fn main() -> ExitCode {
    let skip = harness::skip_reason().or_else(webdriver::skip_reason);
    harness::run_unless(&TESTS, skip, Net::start)
}

/// The shared fixture. Fields drop in order: the browser, the explorer,
/// then the localnet.
struct Net {
    browser: Browser,
    _explorer: Group,
    net: Localnet,
    url: String,
    /// The two reports' windows, once landed.
    windows: Option<(u64, u64)>,
    /// Balances before the reports.
    before: BTreeMap<String, u64>,
}

/// Starts `tallyd explorer` on `port` for `node`, and waits until it
/// answers.
fn start_explorer(net: &Localnet, port: u16, node: &str, name: &str) -> Result<(Group, String)> {
    ensure!(
        std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
        "port {port} for the explorer is in use"
    );
    let log = std::fs::File::create(net.dir().join(format!("{name}.log")))?;
    let mut cmd = Command::new(tallyd_path()?);
    cmd.args(["explorer", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--node", node])
        .args(["--provider", &format!("{PROV_A},{PROV_B}")])
        .args(["--refresh-secs", "2"])
        .env_remove("TALLY_NODE")
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log));
    let mut g = Group::spawn(name, cmd)?;
    let url = format!("http://127.0.0.1:{port}");
    let start = Instant::now();
    while ureq::get(&format!("{url}/api/config")).call().is_err() {
        if let Some(st) = g.exited() {
            let log =
                std::fs::read_to_string(net.dir().join(format!("{name}.log"))).unwrap_or_default();
            bail!("tallyd explorer exited ({st}): {log}");
        }
        ensure!(
            start.elapsed() < Duration::from_secs(10),
            "{name} did not answer in 10 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok((g, url))
}

impl Net {
    fn start() -> Result<Self> {
        let base = free_port_base(PORT_BASE, 4)?;
        let net = Localnet::start(4, base, "500ms", WINDOW_SECS)?;
        let (explorer, url) =
            start_explorer(&net, base + EXPLORER_OFFSET, &net.rpc_url(0), "explorer")?;
        let browser = Browser::start(base + DRIVER_OFFSET, 1400, 1000)?;
        let mut before = BTreeMap::new();
        for u in USERS {
            before.insert(u.to_string(), net.balance(0, u)?);
        }
        Ok(Self {
            browser,
            _explorer: explorer,
            net,
            url,
            windows: None,
            before,
        })
    }

    fn windows(&self) -> Result<(u64, u64)> {
        self.windows.context("the reports did not land")
    }

    /// Opens `path` of the explorer and waits for the page to be drawn;
    /// fails with the page's own error if it shows one.
    fn open(&self, path: &str) -> Result<()> {
        self.browser.goto(&format!("{}{path}", self.url))?;
        let state = self.browser.wait_for(
            "const s = document.body.dataset.state; return s === 'loading' ? null : s;",
            Duration::from_secs(30),
        )?;
        if state != "ready" {
            let err = self
                .browser
                .execute("return document.body.dataset.error || '';", json!([]))?;
            bail!("the page shows an error: {err}");
        }
        Ok(())
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Sends one report of `lines`; the window its records landed in (as
/// node 1 lists them).
fn send(f: &Net, lines: &[Line]) -> Result<u64> {
    let mut recs = Vec::new();
    for l in lines {
        for _ in 0..l.count {
            recs.push(UsageRecord {
                user: l.user.into(),
                provider: l.provider.into(),
                model: l.model.into(),
                route: l.route.into(),
                outcome: l.outcome as i32,
                units: UNITS,
                amount: l.amount,
                ..Default::default()
            });
        }
    }
    let key = f.net.gateway_key()?;
    let chain_id = f.net.rpc(0).status()?.chain_id;
    let built = build_report(&key, &chain_id, recs, now() + 300);
    let r = f.net.rpc(0).broadcast_tx_commit(&built.tx)?;
    ensure!(r.final_code() == 0, "report refused: {}", r.final_log());
    f.net
        .wait_height(1, r.height + 1, Duration::from_secs(30))?;
    let a = f
        .net
        .rpc(1)
        .abci_query(&format!("/sla/provider/{PROV_A}"))?;
    let v: Value = serde_json::from_slice(&a.value)?;
    v["records"]
        .as_array()
        .and_then(|rs| rs.iter().filter_map(|r| r["window"].as_u64()).max())
        .with_context(|| format!("no record of {PROV_A}: {v}"))
}

/// What the page shows, read from its DOM.
const SNAPSHOT: &str = r#"
const num = (v) => v === undefined ? null : Number(v);
const out = {generation: Number(document.body.dataset.generation), routes: [], empty: [],
             pipeline: {}, batch: null, balances: {}};
for (const sec of document.querySelectorAll('section.provider')) {
  if (!sec.querySelector('article.route')) out.empty.push(sec.dataset.provider);
  for (const art of sec.querySelectorAll('article.route')) {
    const rate = art.querySelector('svg[data-chart="fail-rate"]');
    const vol = art.querySelector('svg[data-chart="volume"]');
    const r = {provider: sec.dataset.provider, model: art.dataset.model, route: art.dataset.route,
               plot: num(rate.dataset.plotHeight), max: num(vol.dataset.max), rate: {}, volume: {}, rows: {}};
    for (const g of rate.querySelectorAll('g.bar')) {
      if (g.dataset.fail === undefined) continue;
      const rect = g.querySelector('rect.rate');
      r.rate[g.dataset.window] = {fail: num(g.dataset.fail), base: num(g.dataset.base),
        height: rect ? Number(rect.getAttribute('height')) : null,
        drawn: rect ? rect.getBoundingClientRect().height : null,
        label: g.querySelector('text.value').textContent};
    }
    for (const g of vol.querySelectorAll('g.bar')) {
      if (g.dataset.requests === undefined) continue;
      const segs = {};
      let drawn = 0;
      for (const s of g.querySelectorAll('rect.seg')) {
        segs[s.dataset.class] = Number(s.dataset.value);
        drawn += s.getBoundingClientRect().height;
      }
      r.volume[g.dataset.window] = {requests: num(g.dataset.requests), segs, drawn,
        label: g.querySelector('text.value').textContent};
    }
    for (const tr of art.querySelectorAll('table.breakdown tr[data-window]')) {
      const row = {};
      for (const td of tr.querySelectorAll('td[data-field]')) row[td.dataset.field] = td.textContent;
      r.rows[tr.dataset.window] = row;
    }
    out.routes.push(r);
  }
}
for (const st of document.querySelectorAll('#pipeline > .stats:not(#batch) > .stat'))
  out.pipeline[st.dataset.field] = st.querySelector('.value').textContent;
const b = document.getElementById('batch');
if (b) {
  out.batch = {kind: b.dataset.kind};
  for (const st of b.querySelectorAll('.stat')) out.batch[st.dataset.field] = st.querySelector('.value').textContent;
}
for (const tr of document.querySelectorAll('#balances tr[data-user]'))
  out.balances[tr.dataset.user] = tr.querySelector('td[data-field="balance"]').textContent;
return out;
"#;

/// Whether `v` is the text `want` prints as (the page shows numbers as
/// text).
fn text_is(v: &Value, want: impl std::fmt::Display) -> bool {
    let w = want.to_string();
    v.as_str() == Some(w.as_str())
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

/// Compares one route's charts and table with `want`.
fn check_route(
    page: &Value,
    key: &(String, String, String),
    want: &BTreeMap<u64, Counts>,
) -> Result<()> {
    let what = format!("{} {} {}", key.0, key.1, key.2);
    let plot = page["plot"].as_f64().context("no plot height")?;
    let max = want.values().map(|c| c.requests).max().unwrap_or(0);
    ensure!(
        page["max"].as_u64() == Some(max),
        "{what}: volume scale {} want {max}",
        page["max"]
    );
    let windows: Vec<String> = want.keys().map(u64::to_string).collect();
    let shown = |chart: &str| -> Vec<String> {
        page[chart]
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default()
    };
    ensure!(
        shown("rate") == windows,
        "{what}: fail-rate bars for {:?}, want {windows:?}",
        shown("rate")
    );
    ensure!(
        shown("volume") == windows,
        "{what}: volume bars for {:?}, want {windows:?}",
        shown("volume")
    );
    for (w, c) in want {
        let ws = w.to_string();
        let r = &page["rate"][&ws];
        ensure!(
            r["fail"].as_u64() == Some(c.fail()) && r["base"].as_u64() == Some(c.base()),
            "{what} window {w}: fail {}/{} on the page, want {}/{}",
            r["fail"],
            r["base"],
            c.fail(),
            c.base()
        );
        ensure!(
            r["label"] == c.rate_text(),
            "{what} window {w}: label {} want {}",
            r["label"],
            c.rate_text()
        );
        if c.base() == 0 {
            ensure!(
                r["height"].is_null(),
                "{what} window {w}: a rate bar without a rate: {r}"
            );
        } else {
            let h = plot * c.fail() as f64 / c.base() as f64;
            let (attr, drawn) = (
                r["height"].as_f64().context("no rate bar")?,
                r["drawn"].as_f64().unwrap_or(-1.0),
            );
            ensure!(
                close(attr, h, 0.01) && close(drawn, h, 0.6),
                "{what} window {w}: rate bar {attr} (drawn {drawn}) px, want {h}"
            );
        }
        let v = &page["volume"][&ws];
        ensure!(
            v["requests"].as_u64() == Some(c.requests),
            "{what} window {w}: {v}"
        );
        ensure!(
            text_is(&v["label"], c.requests),
            "{what} window {w}: label {}",
            v["label"]
        );
        let segs: BTreeMap<String, u64> = serde_json::from_value(v["segs"].clone())?;
        ensure!(
            segs == c.segments(),
            "{what} window {w}: segments {segs:?}, want {:?}",
            c.segments()
        );
        let h = plot * c.requests as f64 / max as f64;
        let drawn = v["drawn"].as_f64().unwrap_or(-1.0);
        ensure!(
            close(drawn, h, 0.6 * segs.len() as f64),
            "{what} window {w}: stack {drawn} px, want {h}"
        );
        let row: BTreeMap<String, String> = serde_json::from_value(page["rows"][&ws].clone())
            .with_context(|| format!("{what}: no table row for window {w}"))?;
        ensure!(
            row == c.row(),
            "{what} window {w}: row {row:?}\nwant {:?}",
            c.row()
        );
    }
    let total = want.values().copied().fold(Counts::default(), plus);
    let row: BTreeMap<String, String> = serde_json::from_value(page["rows"]["total"].clone())?;
    ensure!(
        row == total.row(),
        "{what} total: {row:?}\nwant {:?}",
        total.row()
    );
    Ok(())
}

fn page_shows_the_reported_sla(f: &mut Net) -> Result<()> {
    let w1 = send(f, REPORT_1)?;
    // The next report goes into a later window: wait for the wall clock
    // (block times follow it) to leave this one.
    let next = (w1 + 1) * WINDOW_SECS + 2;
    std::thread::sleep(Duration::from_secs(next.saturating_sub(now())));
    let w2 = send(f, REPORT_2)?;
    ensure!(w2 > w1, "both reports landed in window {w1}");
    f.windows = Some((w1, w2));
    let want = expected(&[(REPORT_1, w1), (REPORT_2, w2)]);

    f.open("/")?;
    let page = f.browser.execute(SNAPSHOT, json!([]))?;
    let routes = page["routes"].as_array().context("no routes")?;
    let shown: Vec<(String, String, String)> = routes
        .iter()
        .map(|r| {
            (
                r["provider"].as_str().unwrap_or("").to_string(),
                r["model"].as_str().unwrap_or("").to_string(),
                r["route"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let keys: Vec<_> = want.keys().cloned().collect();
    ensure!(shown == keys, "routes on the page {shown:?}, want {keys:?}");
    for (r, (key, w)) in routes.iter().zip(&want) {
        check_route(r, key, w)?;
    }
    let balances: BTreeMap<String, String> = serde_json::from_value(page["balances"].clone())?;
    let want_bal: BTreeMap<String, String> = f
        .before
        .iter()
        .map(|(u, b)| (u.clone(), (b - charged(u)).to_string()))
        .collect();
    ensure!(
        balances == want_bal,
        "balances {balances:?}, want {want_bal:?}"
    );

    // The URL's provider replaces the configured ones.
    f.open("/?provider=nobody-here")?;
    let page = f.browser.execute(SNAPSHOT, json!([]))?;
    ensure!(page["empty"] == json!(["nobody-here"]), "{}", page["empty"]);
    ensure!(page["routes"] == json!([]), "{}", page["routes"]);
    Ok(())
}

/// Waits until every call is settled and no window is converting.
fn wait_settled(f: &Net) -> Result<Value> {
    let (_, w2) = f.windows()?;
    let start = Instant::now();
    loop {
        let rpc = f.net.rpc(0);
        let sync: Value = serde_json::from_slice(&rpc.abci_query("/sync/hub")?.value)?;
        let wins: Value = serde_json::from_slice(&rpc.abci_query("/windows?limit=1000")?.value)?;
        let w2_done = wins["windows"].as_array().is_some_and(|ws| {
            ws.iter()
                .any(|w| w["window"] == w2 && w["closed"] == true && w["converting"] == false)
        });
        if w2_done
            && sync["pending_calls"] == 0
            && sync["nonce"].is_null()
            && sync["settled_batches"].as_u64() >= Some(1)
        {
            return Ok(sync);
        }
        ensure!(
            start.elapsed() < Duration::from_secs(180),
            "not settled after 180 s: {sync}\n{}",
            f.net.logs_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn pipeline_matches_the_node(f: &mut Net) -> Result<()> {
    wait_settled(f)?;
    f.open("/")?;
    let page = f.browser.execute(SNAPSHOT, json!([]))?;
    let rpc = f.net.rpc(0);
    let sync: Value = serde_json::from_slice(&rpc.abci_query("/sync/hub")?.value)?;
    let p = &page["pipeline"];
    for field in [
        "pending_calls",
        "attempt",
        "attempts",
        "failures",
        "settled_batches",
        "next_nonce",
    ] {
        ensure!(
            text_is(&p[field], &sync[field]),
            "pipeline {field}: page {} node {}",
            p[field],
            sync[field]
        );
    }
    ensure!(
        p["running"] == "no" && sync["running"] == false,
        "{p} / {sync}"
    );
    ensure!(
        p["last_error"] == sync["last_error"].as_str().unwrap_or("—"),
        "{p}"
    );
    let last = sync["next_nonce"].as_u64().context("next_nonce")? - 1;
    // The oracle: the batches paid exactly what the reports charged.
    let mut paid = 0;
    for n in 1..=last {
        let b: Value = serde_json::from_slice(&rpc.abci_query(&format!("/batch/hub/{n}"))?.value)?;
        ensure!(b["status"] == "settled", "batch {n}: {b}");
        paid += b["total"].as_u64().context("total")?;
    }
    let sent: u64 = USERS.iter().map(|u| charged(u)).sum();
    ensure!(
        paid == sent,
        "batches paid {paid}, the reports charged {sent}"
    );
    let b: Value = serde_json::from_slice(&rpc.abci_query(&format!("/batch/hub/{last}"))?.value)?;
    let shown = &page["batch"];
    ensure!(shown["kind"] == "last", "{shown}");
    ensure!(text_is(&shown["batch_nonce"], last), "{shown}");
    ensure!(shown["batch_status"] == "settled", "{shown}");
    ensure!(text_is(&shown["batch_total"], &b["total"]), "{shown} / {b}");
    ensure!(
        text_is(
            &shown["batch_calls"],
            b["calls"].as_array().map_or(0, Vec::len)
        ),
        "{shown} / {b}"
    );
    ensure!(
        text_is(&shown["batch_formed_height"], &b["formed_height"]),
        "{shown} / {b}"
    );
    Ok(())
}

/// GET (or `method`) of the explorer: status and JSON body.
fn http(method: &str, url: &str) -> Result<(u16, Value)> {
    match ureq::request(method, url).call() {
        Ok(r) => Ok((r.status(), r.into_json()?)),
        Err(ureq::Error::Status(s, r)) => Ok((s, r.into_json().unwrap_or(Value::Null))),
        Err(e) => Err(e.into()),
    }
}

fn bad_requests_are_refused(f: &mut Net) -> Result<()> {
    let u = &f.url;
    for (method, path, status, needle) in [
        (
            "GET",
            "/api/q/key",
            403,
            "not a query path the explorer forwards",
        ),
        (
            "GET",
            "/api/q/dkg",
            403,
            "not a query path the explorer forwards",
        ),
        (
            "GET",
            "/api/q/allowances/alice",
            403,
            "allowed: /sla/provider",
        ),
        ("GET", "/api/q/sla/provider/a%20b", 400, "has character ' '"),
        (
            "GET",
            "/api/q/windows?limit=100000",
            400,
            "limit must be 1..=1000",
        ),
        (
            "GET",
            "/api/q/balance/alice?height=1",
            400,
            "takes no parameters",
        ),
        ("POST", "/api/q/params", 405, "GET and HEAD only"),
        ("GET", "/secret", 404, "not found"),
        ("GET", "/api/q/batch/hub/999999", 404, "not_found"),
    ] {
        let (s, v) = http(method, &format!("{u}{path}"))?;
        let err = v["error"].as_str().unwrap_or("");
        ensure!(
            s == status && err.contains(needle),
            "{method} {path}: {s} {v}"
        );
    }
    // An allowed path answers the node's own value.
    let (s, v) = http("GET", &format!("{u}/api/q/balance/alice"))?;
    let node: Value = serde_json::from_slice(&f.net.rpc(0).abci_query("/balance/alice")?.value)?;
    ensure!(s == 200 && v["value"] == node, "{v} / {node}");

    // A page whose node is down says so.
    let port = f.net.port_base() + DEAD_EXPLORER_OFFSET;
    let (_dead, dead_url) = start_explorer(&f.net, port, "http://127.0.0.1:9", "explorer-dead")?;
    f.browser.goto(&format!("{dead_url}/"))?;
    let state = f.browser.wait_for(
        "const s = document.body.dataset.state; return s === 'loading' ? null : s;",
        Duration::from_secs(30),
    )?;
    let text = f.browser.execute(
        "return document.getElementById('error').textContent;",
        json!([]),
    )?;
    ensure!(state == "error", "page state {state} with a dead node");
    ensure!(
        text.as_str()
            .is_some_and(|t| t.contains("Could not read the node") && t.contains("cannot reach")),
        "error box: {text}"
    );
    Ok(())
}

fn screenshot_is_saved(f: &mut Net) -> Result<()> {
    f.open("/")?;
    let height = f
        .browser
        .execute("return document.documentElement.scrollHeight;", json!([]))?
        .as_u64()
        .context("no page height")?;
    f.browser
        .set_window_size(1400, (height as u32 + 120).clamp(600, 8000))?;
    // The page refreshes every 2 s; let one refresh pass after the resize.
    let g0 = f.browser.execute(
        "return Number(document.body.dataset.generation);",
        json!([]),
    )?;
    f.browser.wait_for(
        &format!("return Number(document.body.dataset.generation) > {g0} ? true : null;"),
        Duration::from_secs(15),
    )?;
    let png = f.browser.screenshot()?;
    ensure!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "not a PNG of a page: {} bytes",
        png.len()
    );
    let path = webdriver::artifacts_dir()?.join("explorer.png");
    std::fs::write(&path, &png).with_context(|| format!("writing {}", path.display()))?;
    println!("screenshot: {}", path.display());
    Ok(())
}
