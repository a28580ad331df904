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
//! 2. `a_breach_is_explained`: a provider with objectives from a future
//!    window (`tallyd tx slo propose`, passed by three validators) fails
//!    and is slow in that window; once it closed, the node's verdict,
//!    reputation and `/latency` equal the test's own arithmetic, and the
//!    page shows the window breached in the verdict strip (the window before
//!    it, without a policy, apart), the breach's reasons, failure classes
//!    and routes (most failures first, the causes marked), the reputation
//!    after the verdict, and each route's latency and TTFT percentiles as
//!    `/latency` gives them (screenshot `explorer-slo.png`);
//! 3. `pipeline_matches_the_node`: once both windows' payments settled, the
//!    pipeline panel shows the node's `/sync/hub` and last batch, and the
//!    batches paid exactly what the reports charged;
//! 4. `bad_requests_are_refused`: the explorer forwards no other query
//!    path, refuses bad arguments and methods with clear errors, answers
//!    allowed paths with the node's own value, and a page whose node is
//!    down says so;
//! 5. `screenshot_shows_the_page`: a full-page PNG, kept in
//!    `$CARGO_TARGET_DIR/test-artifacts/explorer.png`, decoded (by the
//!    browser) to the viewport's size, far from uniform, and showing the
//!    header and every chart bar in the colour the DOM gives it, where the
//!    DOM puts it.
//!
//! SKIPPED without `cometbft`, `chromium` or `chromedriver` on PATH (failed
//! instead with `TALLY_E2E_REQUIRED`). About two minutes.

use std::collections::BTreeMap;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use base64::Engine as _;
use serde_json::{json, Value};
use tally_node::records::build_report;
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_settlement::slo::latency::{bounds, bucket_of};
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

const TESTS: [Test<Net>; 5] = [
    Test {
        name: "page_shows_the_reported_sla",
        needs: &[],
        run: page_shows_the_reported_sla,
    },
    // Before the pipeline test: its windows settle while this one waits
    // for its own window to close (it makes no hub call: the breach
    // credits everything back).
    Test {
        name: "a_breach_is_explained",
        needs: &[],
        run: a_breach_is_explained,
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
        name: "screenshot_shows_the_page",
        needs: &["page_shows_the_reported_sla"],
        run: screenshot_shows_the_page,
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
    send_records(f, PROV_A, recs)
}

/// Sends one report of `recs`; the newest window of `provider`'s records
/// once it landed (as node 1 lists them).
fn send_records(f: &Net, provider: &str, recs: Vec<UsageRecord>) -> Result<u64> {
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
        .abci_query(&format!("/sla/provider/{provider}"))?;
    let v: Value = serde_json::from_slice(&a.value)?;
    v["records"]
        .as_array()
        .and_then(|rs| rs.iter().filter_map(|r| r["window"].as_u64()).max())
        .with_context(|| format!("no record of {provider}: {v}"))
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
        (
            "GET",
            "/api/q/slo/verdicts/exp-prov-a?limit=5",
            400,
            "unknown parameter \"limit\"",
        ),
        ("GET", "/api/q/latency/exp-prov-a/x", 400, "window must be"),
        ("GET", "/api/q/slo/verdict/exp-prov-a/1", 404, "not_found"),
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

/// Read from the DOM just before a screenshot: the viewport, the device
/// pixel ratio, the page's refresh generation, and probes (a point in CSS
/// pixels and the colour the page gave it): a corner of the header's
/// background and the centre of every chart bar at least 4 px wide and tall.
const DOM_PROBES: &str = r#"
const rgb = (c) => (c.match(/\d+(\.\d+)?/g) || []).slice(0, 3).map(Number);
const probes = [];
const h = document.querySelector('header').getBoundingClientRect();
probes.push({ what: 'header', x: h.left + 4, y: h.top + 4,
  rgb: rgb(getComputedStyle(document.querySelector('header')).backgroundColor) });
for (const r of document.querySelectorAll('svg.chart-svg rect')) {
  const b = r.getBoundingClientRect();
  if (b.width >= 4 && b.height >= 4) {
    probes.push({ what: 'rect.' + r.getAttribute('class'), x: b.left + b.width / 2,
      y: b.top + b.height / 2, rgb: rgb(getComputedStyle(r).fill) });
  }
}
return { generation: Number(document.body.dataset.generation), dpr: window.devicePixelRatio,
  width: window.innerWidth, height: window.innerHeight, scroll: window.scrollY, probes };
"#;

/// Decodes the PNG `arguments[0]` (base64) in the page and puts into
/// `window.__shot` its size, the number of distinct colours over every
/// 7th pixel, and the colour at each probe of `arguments[1]` (CSS pixels,
/// scaled by the ratio `arguments[2]`).
const DECODE_SHOT: &str = r#"
const [b64, probes, dpr] = arguments;
window.__shot = null;
// From bytes, not a data: URL, which the explorer's CSP (img-src 'self') refuses.
const bytes = Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
createImageBitmap(new Blob([bytes], { type: 'image/png' })).then((img) => {
  const c = document.createElement('canvas');
  c.width = img.width; c.height = img.height;
  const g = c.getContext('2d');
  g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  const colours = new Set();
  for (let i = 0; i < d.length; i += 4 * 7) colours.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
  const at = (p) => {
    const i = (Math.floor(p.y * dpr) * c.width + Math.floor(p.x * dpr)) * 4;
    return [d[i], d[i + 1], d[i + 2]];
  };
  window.__shot = { width: c.width, height: c.height, colours: colours.size, seen: probes.map(at) };
}, (e) => { window.__shot = { error: 'the screenshot does not decode as an image: ' + e }; });
return true;
"#;

/// The whole page in one screenshot, saved, and checked against the DOM:
/// the PNG decodes to the viewport's size in device pixels, is far from
/// uniform, and shows the header's background and every chart bar in the
/// colour the page gave it, where the page put it.
fn screenshot_shows_the_page(f: &mut Net) -> Result<()> {
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
    // The probes and the screenshot must see the same rendering: retry if
    // a refresh came between them.
    let (dom, png) = {
        let mut tries = 0;
        loop {
            let dom = f.browser.execute(DOM_PROBES, json!([]))?;
            let png = f.browser.screenshot()?;
            let after = f.browser.execute(
                "return Number(document.body.dataset.generation);",
                json!([]),
            )?;
            if after == dom["generation"] {
                break (dom, png);
            }
            tries += 1;
            ensure!(tries < 5, "the page re-rendered during every screenshot");
        }
    };
    let path = webdriver::artifacts_dir()?.join("explorer.png");
    std::fs::write(&path, &png).with_context(|| format!("writing {}", path.display()))?;
    println!("screenshot: {}", path.display());
    ensure!(dom["scroll"] == 0, "the page is scrolled: {dom}");
    let probes = dom["probes"].as_array().context("no probes")?;
    ensure!(
        probes.len() > 4,
        "the page has no chart bars to compare: {dom}"
    );
    let dpr = dom["dpr"].as_f64().context("no devicePixelRatio")?;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
    f.browser.execute(DECODE_SHOT, json!([b64, probes, dpr]))?;
    let shot = f
        .browser
        .wait_for("return window.__shot;", Duration::from_secs(15))?;
    ensure!(shot["error"].is_null(), "{}", shot["error"]);
    let css = |k: &str| dom[k].as_f64().unwrap_or(0.0) * dpr;
    let (w, h) = (shot["width"].as_f64(), shot["height"].as_f64());
    ensure!(
        w.is_some_and(|w| (w - css("width")).abs() <= 1.0)
            && h.is_some_and(|h| (h - css("height")).abs() <= 1.0),
        "screenshot {w:?} x {h:?} px, the viewport is {} x {} px",
        css("width"),
        css("height")
    );
    let colours = shot["colours"].as_u64().unwrap_or(0);
    ensure!(
        colours >= 20,
        "the screenshot has only {colours} distinct colours: a blank page?"
    );
    let seen = shot["seen"].as_array().context("no probe colours")?;
    let mut wrong = Vec::new();
    for (p, got) in probes.iter().zip(seen) {
        let close = p["rgb"]
            .as_array()
            .zip(got.as_array())
            .is_some_and(|(want, got)| {
                want.len() == 3
                    && got.len() == 3
                    && want.iter().zip(got).all(|(a, b)| {
                        (a.as_f64().unwrap_or(-99.0) - b.as_f64().unwrap_or(99.0)).abs() <= 4.0
                    })
            });
        if !close {
            wrong.push(format!(
                "{} at ({:.0}, {:.0}): page {} screenshot {got}",
                p["what"], p["x"], p["y"], p["rgb"]
            ));
        }
    }
    ensure!(
        wrong.is_empty(),
        "{} of {} probes differ between the DOM and the screenshot:\n{}",
        wrong.len(),
        probes.len(),
        wrong.join("\n")
    );
    println!(
        "screenshot {w:?} x {h:?} px, {colours} colours, {} probes match the DOM",
        probes.len()
    );
    Ok(())
}

/// The provider the SLO test makes breach (no other test reports for it).
const PROV_SLO: &str = "exp-prov-slo";
/// Its calls' user (funded in genesis; not in [`USERS`], whose balances
/// and charges the other tests check).
const SLO_USER: &str = "carol";
const COMPLETE: &str = "/v1/complete";
/// Its objectives: at most 10% failures of the judged calls from 5 judged
/// calls on, p95 latency under 2048 ms and TTFT under 512 ms (bucket
/// bounds), a breached window's charges all credited back (so the test
/// makes no hub call and the pipeline test's sums stay exact).
const SLO_POLICY: [(&str, u64); 5] = [
    ("--max-fail-ppm", 100_000),
    ("--min-requests", 5),
    ("--p95-latency-ms", 2048),
    ("--p95-ttft-ms", 512),
    ("--credit-ppm", 1_000_000),
];
/// The reputation after a first judged window that breached:
/// (15 * 1000000 + 0) / 16.
const FIRST_BREACH_PPM: u64 = 937_500;

/// `count` calls of one outcome on one route of [`PROV_SLO`], each
/// charging `amount`, with a latency and a TTFT in ms (`None`: not
/// measured).
type SloLine = (
    &'static str,
    &'static str,
    Outcome,
    u64,
    u64,
    Option<u64>,
    Option<u64>,
);

/// Before the policy: a window with calls and no verdict.
const SLO_BEFORE: &[SloLine] = &[(M1, CHAT, Outcome::Ok, 2, 0, None, None)];

/// The window the policy judges first: 5 failures of 22 judged calls
/// (over 10%) and 4 of 23 measured calls at 2048 ms or more (over 5%):
/// breached for the fail rate and the latency, not the TTFT. The chat
/// route fails most, the completion route never.
const SLO_BREACH: &[SloLine] = &[
    (M1, CHAT, Outcome::Ok, 6, 2, Some(150), Some(40)),
    (M1, CHAT, Outcome::Transient, 3, 0, Some(3000), None),
    (M1, CHAT, Outcome::RateLimit, 1, 0, Some(5), None),
    (M1, CHAT, Outcome::Cancel, 2, 0, None, None),
    (M1, CHAT, Outcome::Client, 1, 0, Some(20), None),
    (M2, EMBED, Outcome::Ok, 8, 1, Some(20), Some(10)),
    (M2, EMBED, Outcome::Unknown, 1, 0, Some(30_000), None),
    (M2, COMPLETE, Outcome::Ok, 3, 0, Some(100), Some(60)),
];

fn slo_records(lines: &[SloLine]) -> Vec<UsageRecord> {
    let bucket = |ms: Option<u64>| ms.map_or(0, |ms| u32::from(bucket_of(ms)));
    let mut recs = Vec::new();
    for &(model, route, outcome, count, amount, lat, ttft) in lines {
        for _ in 0..count {
            recs.push(UsageRecord {
                user: SLO_USER.into(),
                provider: PROV_SLO.into(),
                model: model.into(),
                route: route.into(),
                outcome: outcome as i32,
                units: UNITS,
                amount,
                latency_bucket: bucket(lat),
                ttft_bucket: bucket(ttft),
            });
        }
    }
    recs
}

/// Nearest-rank p50, p95 and p99 of `ms` as `/latency` gives them (the
/// bounds of the bucket holding each), `null` when nothing was measured.
fn percentiles(ms: &[u64]) -> Value {
    let mut b: Vec<u8> = ms.iter().map(|&m| bucket_of(m)).collect();
    b.sort_unstable();
    if b.is_empty() {
        return Value::Null;
    }
    let n = b.len() as u64;
    let est = |p: u64| {
        let at = b[((p * n).div_ceil(100).max(1) - 1) as usize];
        let (lo, hi) = bounds(at).unwrap_or((0, None));
        json!({"bucket": at, "lo_ms": lo, "hi_ms": hi})
    };
    json!({"measured": n, "p50": est(50), "p95": est(95), "p99": est(99)})
}

/// What `/latency/{PROV_SLO}/{window}` must answer for `lines`.
fn want_latency(lines: &[SloLine], window: u64) -> Value {
    // (model, route) -> (latencies, TTFTs) in ms.
    type Measured = (Vec<u64>, Vec<u64>);
    let mut routes: BTreeMap<(&str, &str), Measured> = BTreeMap::new();
    let (mut all_lat, mut all_ttft) = (Vec::new(), Vec::new());
    for &(model, route, _, count, _, lat, ttft) in lines {
        let r = routes.entry((model, route)).or_default();
        for _ in 0..count {
            r.0.extend(lat);
            r.1.extend(ttft);
            all_lat.extend(lat);
            all_ttft.extend(ttft);
        }
    }
    let rows: Vec<Value> = routes
        .iter()
        .filter(|(_, (l, t))| !l.is_empty() || !t.is_empty())
        .map(|((m, r), (l, t))| {
            json!({"model": m, "route": r, "latency": percentiles(l), "ttft": percentiles(t)})
        })
        .collect();
    json!({"provider": PROV_SLO, "window": window, "latency": percentiles(&all_lat),
           "ttft": percentiles(&all_ttft), "routes": rows, "more": false})
}

/// The verdict's figures `lines` must give under [`SLO_POLICY`] (the
/// policy and reputation checked apart).
fn want_verdict(lines: &[SloLine], window: u64) -> Value {
    let sum =
        |f: &dyn Fn(&SloLine) -> bool| lines.iter().filter(|l| f(l)).map(|l| l.3).sum::<u64>();
    let class = |o: Outcome| sum(&|l| l.2 == o);
    let requests = sum(&|_| true);
    let judged = requests - class(Outcome::Cancel) - class(Outcome::Client);
    let fail = class(Outcome::RateLimit)
        + class(Outcome::Auth)
        + class(Outcome::Transient)
        + class(Outcome::Unknown);
    let ms = |l: &SloLine, ttft: bool| if ttft { l.6 } else { l.5 };
    let measured = |ttft: bool| sum(&|l| ms(l, ttft).is_some());
    let slow = |ttft: bool, ceiling: u64| sum(&|l| ms(l, ttft).is_some_and(|m| m >= ceiling));
    let (lat_c, ttft_c) = (SLO_POLICY[2].1, SLO_POLICY[3].1);
    let mut reasons = Vec::new();
    if fail * 1_000_000 > SLO_POLICY[0].1 * judged {
        reasons.push("fail_rate");
    }
    if slow(false, lat_c) * 20 > measured(false) {
        reasons.push("latency");
    }
    if slow(true, ttft_c) * 20 > measured(true) {
        reasons.push("ttft");
    }
    let charged: u64 = lines.iter().map(|l| l.3 * l.4).sum();
    json!({
        "provider": PROV_SLO, "window": window, "status": "breached", "reasons": reasons,
        "requests": requests, "judged": judged, "fail_count": fail,
        "rate_limit": class(Outcome::RateLimit), "auth": class(Outcome::Auth),
        "transient": class(Outcome::Transient), "unknown": class(Outcome::Unknown),
        "fail_ppm": fail * 1_000_000 / judged,
        "measured_latency": measured(false), "slow_latency": slow(false, lat_c),
        "measured_ttft": measured(true), "slow_ttft": slow(true, ttft_c),
        "charged": charged, "credited": charged, "credited_users": 1,
        "reputation_ppm": FIRST_BREACH_PPM,
    })
}

/// `ppm` as the page prints it: a percentage with up to two decimals.
fn ppm_pct(ppm: u64) -> String {
    let hundredths = (ppm + 50) / 100;
    let s = format!("{}.{:02}", hundredths / 100, hundredths % 100);
    format!("{}%", s.trim_end_matches('0').trim_end_matches('.'))
}

/// A percentile estimate's cell as the page shows it.
fn est_cell(e: &Value) -> Value {
    if e.is_null() {
        return json!({"text": "—", "bucket": null, "lo": null, "hi": null});
    }
    let text = match e["hi_ms"].as_u64() {
        Some(hi) => format!("{}–{hi} ms", e["lo_ms"]),
        None => format!("≥ {} ms", e["lo_ms"]),
    };
    json!({"text": text, "bucket": e["bucket"], "lo": e["lo_ms"], "hi": e["hi_ms"]})
}

/// A `/latency` row's latency and TTFT cells as the page shows them.
fn latency_cells(row: &Value) -> Value {
    let mut cells = serde_json::Map::new();
    for kind in ["latency", "ttft"] {
        let pc = &row[kind];
        let measured = pc["measured"].as_u64().unwrap_or(0);
        cells.insert(
            format!("{kind}_measured"),
            json!({"text": measured.to_string(), "bucket": null, "lo": null, "hi": null}),
        );
        for p in ["p50", "p95", "p99"] {
            cells.insert(format!("{kind}_{p}"), est_cell(&pc[p]));
        }
    }
    Value::Object(cells)
}

/// The SLO block of a provider's section, read from the DOM.
const SLO_SNAPSHOT: &str = r#"
const box = document.querySelector('section.provider[data-provider="' + arguments[0] + '"] div.slo');
if (!box) return null;
const num = (v) => v === undefined ? null : Number(v);
const cell = (td) => ({text: td.textContent, bucket: num(td.dataset.bucket), lo: num(td.dataset.lo), hi: num(td.dataset.hi)});
const out = {error: box.dataset.error || null, strip: {}, rep: {}, score: null, stats: {}, breaches: {}, latency: {}};
for (const c of box.querySelectorAll('.strip .cell')) out.strip[c.dataset.window] = c.dataset.status;
for (const g of box.querySelectorAll('svg[data-chart="reputation"] g.bar'))
  out.rep[g.dataset.window] = {ppm: num(g.dataset.ppm), status: g.dataset.status,
    label: g.querySelector('text.value').textContent, height: Number(g.querySelector('rect').getAttribute('height'))};
for (const st of box.querySelectorAll('.stat')) out.stats[st.dataset.field] = st.querySelector('.value').textContent;
const sc = box.querySelector('.stat[data-field="score_ppm"]');
out.score = sc ? num(sc.dataset.ppm) : null;
for (const b of box.querySelectorAll('.breach')) {
  const x = {reasons: [...b.querySelectorAll('li[data-reason]')].map((li) => li.dataset.reason), classes: {}, routes: []};
  for (const td of b.querySelectorAll('table.classes td[data-field]')) x.classes[td.dataset.field] = td.textContent;
  for (const tr of b.querySelectorAll('table.breach-routes tbody tr')) {
    const r = {model: tr.dataset.model, route: tr.dataset.route, fail: num(tr.dataset.fail), cause: tr.classList.contains('cause'), cells: {}};
    for (const td of tr.querySelectorAll('td[data-field]')) r.cells[td.dataset.field] = cell(td);
    x.routes.push(r);
  }
  out.breaches[b.dataset.window] = x;
}
for (const t of box.querySelectorAll('table.latency')) {
  const rows = [];
  for (const tr of t.querySelectorAll('tbody tr')) {
    const r = {scope: tr.dataset.scope, model: tr.dataset.model || null, route: tr.dataset.route || null, cells: {}};
    for (const td of tr.querySelectorAll('td[data-field]')) r.cells[td.dataset.field] = cell(td);
    rows.push(r);
  }
  out.latency[t.dataset.window] = rows;
}
return out;
"#;

fn sleep_until(unix: u64) {
    std::thread::sleep(Duration::from_secs(unix.saturating_sub(now())));
}

/// Validator 0's answer to `path` (JSON), or `None` for code 22.
fn node_value(f: &Net, path: &str) -> Result<Option<Value>> {
    let a = f.net.rpc(0).abci_query(path)?;
    if a.code == 22 {
        return Ok(None);
    }
    ensure!(a.code == 0, "{path}: code {} {}", a.code, a.log);
    Ok(Some(serde_json::from_slice(&a.value)?))
}

/// Polls `path` on validator 0 until `ok` holds for its answer (at most
/// `secs`); that answer.
fn wait_value(f: &Net, path: &str, secs: u64, ok: impl Fn(&Value) -> bool) -> Result<Value> {
    let start = Instant::now();
    loop {
        let v = node_value(f, path)?;
        if let Some(v) = v.filter(|v| ok(v)) {
            return Ok(v);
        }
        ensure!(
            start.elapsed() < Duration::from_secs(secs),
            "{path} not as expected after {secs} s: {}\n{}",
            node_value(f, path)?.unwrap_or(Value::Null),
            f.net.logs_tail()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Sets [`SLO_POLICY`] for [`PROV_SLO`] from a future window, makes the
/// provider breach it in that window, and checks the page explains it:
/// the window's cell in the verdict strip says breached (the window before
/// it, with calls and no policy, says so), the breach's failure classes
/// and its routes (most failures first, the causing ones marked), the
/// reputation (each verdict's `reputation_ppm` and the node's score), and
/// the latency percentiles per route equal to `/latency`, itself checked
/// against the test's own nearest-rank percentiles of what it sent.
fn a_breach_is_explained(f: &mut Net) -> Result<()> {
    let balance = f.net.balance(0, SLO_USER)?;
    let before = send_records(f, PROV_SLO, slo_records(SLO_BEFORE))?;
    // The policy from the next window, or the one after if this one ends
    // before the proposal can pass (three transactions).
    let w = if (before + 1) * WINDOW_SECS >= now() + 12 {
        before + 1
    } else {
        before + 2
    };
    let ws = w.to_string();
    let mut args = vec!["tx", "slo", "propose", "--from-window", &ws];
    args.extend(["--provider", PROV_SLO]);
    let values: Vec<(&str, String)> = SLO_POLICY
        .iter()
        .map(|(k, v)| (*k, v.to_string()))
        .collect();
    for (k, v) in &values {
        args.extend([*k, v.as_str()]);
    }
    let proposal = f.net.pass_proposal(&args)?;
    let path = format!("/slo/policy/{PROV_SLO}");
    wait_value(f, &path, 10, |v| v["scheduled"]["from_window"] == w)
        .with_context(|| format!("the proposal {proposal}"))?;
    // In force from the first block of window w.
    sleep_until(w * WINDOW_SECS + 1);
    let policy = wait_value(f, &path, 15, |v| v["since_window"] == w)?;
    let landed = send_records(f, PROV_SLO, slo_records(SLO_BREACH))?;
    ensure!(landed == w, "the breach landed in window {landed}, not {w}");
    // Judged in the first block of a later window; the conversion credits.
    sleep_until((w + 1) * WINDOW_SECS + 1);
    let want = want_verdict(SLO_BREACH, w);
    let verdict = wait_value(f, &format!("/slo/verdict/{PROV_SLO}/{w}"), 30, |v| {
        v["credited"] == want["credited"]
    })?;
    for (k, v) in want.as_object().context("want")? {
        ensure!(
            verdict[k] == *v,
            "verdict {k}: {} want {v}\n{verdict}",
            verdict[k]
        );
    }
    ensure!(
        verdict["policy"] == policy["policy"],
        "{verdict} / {policy}"
    );
    let rep = node_value(f, &format!("/slo/reputation/{PROV_SLO}"))?.context("reputation")?;
    ensure!(
        rep == json!({"provider": PROV_SLO, "score_ppm": FIRST_BREACH_PPM, "judged": 1, "breached": 1, "last_window": w}),
        "{rep}"
    );
    let latency = node_value(f, &format!("/latency/{PROV_SLO}/{w}"))?.context("latency")?;
    ensure!(
        latency == want_latency(SLO_BREACH, w),
        "/latency {latency}\nwant {}",
        want_latency(SLO_BREACH, w)
    );
    let after = f.net.balance(0, SLO_USER)?;
    ensure!(
        after == balance,
        "{SLO_USER}: {after}, {balance} before the credited breach"
    );

    f.open(&format!("/?provider={PROV_SLO}"))?;
    let page = f.browser.execute(SLO_SNAPSHOT, json!([PROV_SLO]))?;
    ensure!(page["error"].is_null(), "the SLO block: {}", page["error"]);
    check_slo_page(&page, before, w, &verdict, &rep, &latency)?;
    slo_screenshot(f)
}

/// Compares the SLO block (`page`, [`SLO_SNAPSHOT`]) with the node's answers.
fn check_slo_page(
    page: &Value,
    before: u64,
    w: u64,
    verdict: &Value,
    rep: &Value,
    latency: &Value,
) -> Result<()> {
    let (b, ws) = (before.to_string(), w.to_string());
    ensure!(
        page["strip"][&b] == "none" && page["strip"][&ws] == "breached",
        "verdict strip {}",
        page["strip"]
    );
    let bars = page["rep"].as_object().context("no reputation chart")?;
    ensure!(bars.len() == 1, "reputation bars {bars:?}");
    let bar = &page["rep"][&ws];
    ensure!(
        bar["ppm"] == verdict["reputation_ppm"]
            && bar["status"] == "breached"
            && text_is(&bar["label"], ppm_pct(FIRST_BREACH_PPM))
            && close(bar["height"].as_f64().unwrap_or(-1.0), 140.0 * 0.9375, 0.01),
        "reputation bar {bar}"
    );
    ensure!(page["score"] == rep["score_ppm"], "score {}", page["score"]);
    let st = &page["stats"];
    for (field, want) in [
        ("score_ppm", ppm_pct(FIRST_BREACH_PPM)),
        ("judged", "1".into()),
        ("breached", "1".into()),
        ("last_window", ws.clone()),
        ("max_fail_ppm", ppm_pct(SLO_POLICY[0].1)),
        ("min_requests", SLO_POLICY[1].1.to_string()),
        ("p95_latency_ms", format!("under {} ms", SLO_POLICY[2].1)),
        ("p95_ttft_ms", format!("under {} ms", SLO_POLICY[3].1)),
        ("credit_ppm", ppm_pct(SLO_POLICY[4].1)),
        ("since_window", ws.clone()),
    ] {
        ensure!(
            st[field] == want.as_str(),
            "{field}: {} want {want}",
            st[field]
        );
    }
    let breach = &page["breaches"][&ws];
    ensure!(breach["reasons"] == verdict["reasons"], "reasons {breach}");
    for field in [
        "requests",
        "judged",
        "rate_limit",
        "auth",
        "transient",
        "unknown",
        "fail_count",
        "charged",
        "credited",
        "credited_users",
    ] {
        ensure!(
            text_is(&breach["classes"][field], &verdict[field]),
            "breach {field}: {} want {}",
            breach["classes"][field],
            verdict[field]
        );
    }
    let fail_ppm = verdict["fail_ppm"].as_u64().context("fail_ppm")?;
    ensure!(
        breach["classes"]["fail_ppm"] == ppm_pct(fail_ppm).as_str(),
        "{breach}"
    );
    check_breach_routes(breach, latency)?;
    // The latency table of the window equals /latency, row for row.
    let mut want_rows = vec![json!({"scope": "provider", "model": null, "route": null,
        "cells": latency_cells(latency)})];
    for r in latency["routes"].as_array().context("routes")? {
        want_rows.push(
            json!({"scope": "route", "model": r["model"], "route": r["route"],
            "cells": latency_cells(r)}),
        );
    }
    ensure!(
        page["latency"][&ws] == Value::Array(want_rows.clone()),
        "latency table {}\nwant {}",
        page["latency"][&ws],
        Value::Array(want_rows)
    );
    // Nothing was measured before the policy: no table for that window.
    ensure!(page["latency"][&b].is_null(), "{}", page["latency"]);
    Ok(())
}

/// The breach's routes: every route of the window, most failures first,
/// the ones with failures (the fail rate) or a p95 at or over the ceiling
/// (the latency) marked as causes, with their p95s from `/latency`.
fn check_breach_routes(breach: &Value, latency: &Value) -> Result<()> {
    let mut want: Vec<(u64, &str, &str)> = Vec::new();
    for &(model, route, outcome, count, ..) in SLO_BREACH {
        let fails = u64::from(matches!(
            outcome,
            Outcome::RateLimit | Outcome::Auth | Outcome::Transient | Outcome::Unknown
        )) * count;
        match want.iter_mut().find(|x| (x.1, x.2) == (model, route)) {
            Some(x) => x.0 += fails,
            None => want.push((fails, model, route)),
        }
    }
    want.sort_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    let rows = breach["routes"].as_array().context("no breach routes")?;
    let shown: Vec<(u64, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["fail"].as_u64().unwrap_or(u64::MAX),
                r["model"].as_str().unwrap_or(""),
                r["route"].as_str().unwrap_or(""),
            )
        })
        .collect();
    ensure!(shown == want, "breach routes {shown:?}, want {want:?}");
    for r in rows {
        let lat = latency["routes"]
            .as_array()
            .and_then(|rs| {
                rs.iter()
                    .find(|x| x["model"] == r["model"] && x["route"] == r["route"])
            })
            .context("a route without latency")?;
        let p95 = &lat["latency"]["p95"];
        let slow = p95["lo_ms"]
            .as_u64()
            .is_some_and(|lo| lo >= SLO_POLICY[2].1);
        let cause = r["fail"].as_u64() > Some(0) || slow;
        ensure!(r["cause"] == cause, "route {r}: cause should be {cause}");
        ensure!(
            r["cells"]["latency_p95"] == est_cell(p95)
                && r["cells"]["ttft_p95"] == est_cell(&lat["ttft"]["p95"]),
            "route {r}: p95s {lat}"
        );
    }
    ensure!(
        rows.first()
            .is_some_and(|r| r["route"] == CHAT && r["cause"] == true)
            && rows
                .last()
                .is_some_and(|r| r["route"] == COMPLETE && r["cause"] == false),
        "{rows:?}"
    );
    Ok(())
}

/// The SLO page, full height, in `$CARGO_TARGET_DIR/test-artifacts/explorer-slo.png`.
fn slo_screenshot(f: &Net) -> Result<()> {
    let height = f
        .browser
        .execute("return document.documentElement.scrollHeight;", json!([]))?
        .as_u64()
        .context("no page height")?;
    f.browser
        .set_window_size(1400, (height as u32 + 120).clamp(600, 8000))?;
    let png = f.browser.screenshot();
    f.browser.set_window_size(1400, 1000)?;
    let png = png?;
    let path = webdriver::artifacts_dir()?.join("explorer-slo.png");
    std::fs::write(&path, &png).with_context(|| format!("writing {}", path.display()))?;
    println!("screenshot: {}", path.display());
    Ok(())
}
