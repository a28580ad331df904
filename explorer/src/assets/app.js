// Tally SLA explorer. Reads only this server's /api (never the node
// directly) and draws its charts as plain SVG. No libraries.
'use strict';

const SVG_NS = 'http://www.w3.org/2000/svg';
// FailCount = rate_limit + auth + transient + unknown (cancel and client
// are counted apart and never in the fail rate).
const FAIL = ['rate_limit', 'auth', 'transient', 'unknown'];
const APART = ['cancel', 'client'];
// Stacking order of the volume chart, bottom up.
const STACK = ['ok', 'rate_limit', 'auth', 'transient', 'unknown', 'client', 'cancel'];
const LABEL = {
  ok: 'OK', rate_limit: 'Rate limit', auth: 'Auth', transient: 'Transient',
  unknown: 'Unknown', cancel: 'Cancel', client: 'Client',
};
const PAGE = 1000;        // records per request (the node's maximum)
const MAX_PAGES = 10;     // records read per provider: at most 10,000
const MAX_USERS = 50;     // balances shown
const MAX_WINDOWS = 24;   // newest windows per chart
const PLOT_H = 140;       // chart plot height, px
const SLOT = 60;          // px per window
const BAR = 32;           // bar width, px

let generation = 0;
let timer = null;

// ---- DOM helpers -------------------------------------------------------

function build(doc, ns, tag, attrs, children) {
  const e = ns ? doc.createElementNS(ns, tag) : doc.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    e.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}
const h = (tag, attrs, ...children) => build(document, null, tag, attrs, children);
const s = (tag, attrs, ...children) => build(document, SVG_NS, tag, attrs, children);

// ---- API ---------------------------------------------------------------

async function api(path) {
  const r = await fetch(path, { cache: 'no-store' });
  let body = null;
  try { body = await r.json(); } catch (_) { /* not JSON */ }
  if (!r.ok) {
    const e = new Error((body && body.error) || ('HTTP ' + r.status + ' for ' + path));
    e.status = r.status;
    throw e;
  }
  return body;
}
const enc = encodeURIComponent;
const q = async (path) => (await api('/api/q' + path)).value;
const qOr = async (path, dflt) => {
  try { return await q(path); } catch (e) { if (e.status === 404) return dflt; throw e; }
};

// ---- arithmetic --------------------------------------------------------

function zero() {
  const c = { requests: 0, units: 0, amount: 0 };
  for (const k of STACK) c[k] = 0;
  return c;
}
function add(into, r) {
  for (const k of Object.keys(into)) into[k] += Number(r[k] || 0);
}
const failCount = (c) => FAIL.reduce((n, k) => n + c[k], 0);
// The fail rate's denominator: requests that were neither cancelled nor the
// client's mistake.
const rateBase = (c) => c.requests - c.cancel - c.client;
function pct(f, b) {
  return b > 0 ? (100 * f / b).toFixed(1) + '%' : 'n/a';
}
function hhmmss(rfc) {
  const m = /T(\d\d:\d\d:\d\d)/.exec(rfc || '');
  return m ? m[1] : String(rfc || '');
}
function unixTime(secs) {
  return new Date(secs * 1000).toISOString().replace('.000Z', 'Z');
}

// Route records of a provider, grouped by (model, route) and window; users
// summed.
function aggregate(records) {
  const routes = new Map();
  const windows = new Map();
  for (const r of records) {
    const key = r.model + '\u0000' + r.route;
    if (!routes.has(key)) routes.set(key, { model: r.model, route: r.route, byWindow: new Map() });
    const byWindow = routes.get(key).byWindow;
    if (!byWindow.has(r.window)) byWindow.set(r.window, zero());
    add(byWindow.get(r.window), r);
    windows.set(r.window, r.window_start);
  }
  const sorted = [...routes.values()].sort((a, b) =>
    a.model < b.model ? -1 : a.model > b.model ? 1 : a.route < b.route ? -1 : a.route > b.route ? 1 : 0);
  const ws = [...windows.keys()].sort((a, b) => a - b).slice(-MAX_WINDOWS);
  return { routes: sorted, windows: ws, starts: windows };
}

async function providerRecords(p) {
  let records = [];
  let cursor = null;
  for (let i = 0; i < MAX_PAGES; i++) {
    const page = await q('/sla/provider/' + enc(p) + '?limit=' + PAGE + (cursor ? '&cursor=' + enc(cursor) : ''));
    records = records.concat(page.records || []);
    cursor = page.next_cursor;
    if (!cursor) return { records, truncated: false };
  }
  return { records, truncated: true };
}

// ---- charts ------------------------------------------------------------

function frame(n, kind, title) {
  const width = 44 + Math.max(n, 4) * SLOT;
  const height = PLOT_H + 48;
  return s('svg', {
    class: 'chart-svg', width, height, viewBox: '0 0 ' + width + ' ' + height,
    role: 'img', 'aria-label': title, 'data-chart': kind, 'data-plot-height': PLOT_H,
  });
}
const plotY = (frac) => 16 + PLOT_H * (1 - frac);

function gridLines(svg, n, labels) {
  for (const [frac, text] of labels) {
    const y = plotY(frac);
    svg.append(s('line', { class: 'grid', x1: 40, x2: 44 + Math.max(n, 4) * SLOT, y1: y, y2: y }));
    svg.append(s('text', { class: 'axis', x: 36, y: y + 3, 'text-anchor': 'end' }, text));
  }
}

function failRateChart(route, agg) {
  const n = agg.windows.length;
  const svg = frame(n, 'fail-rate', 'Fail rate per window');
  gridLines(svg, n, [[0, '0%'], [0.5, '50%'], [1, '100%']]);
  agg.windows.forEach((w, i) => {
    const c = route.byWindow.get(w);
    const x = 44 + i * SLOT + (SLOT - BAR) / 2;
    const g = s('g', { class: 'bar', 'data-window': w });
    if (c) {
      const f = failCount(c), b = rateBase(c);
      g.setAttribute('data-fail', f);
      g.setAttribute('data-base', b);
      g.setAttribute('data-requests', c.requests);
      if (b > 0) {
        const hgt = PLOT_H * f / b;
        g.append(s('rect', { class: 'rate', x, y: plotY(0) - hgt, width: BAR, height: hgt }));
        g.append(s('title', {}, f + ' failed of ' + b + ' (' + c.cancel + ' cancel, ' + c.client + ' client not counted)'));
      }
      g.append(s('text', { class: 'value', x: x + BAR / 2, y: plotY(b > 0 ? f / b : 0) - 4, 'text-anchor': 'middle' }, pct(f, b)));
    }
    g.append(s('text', { class: 'xlabel', x: x + BAR / 2, y: plotY(0) + 14, 'text-anchor': 'middle' }, hhmmss(agg.starts.get(w))));
    svg.append(g);
  });
  return svg;
}

function volumeChart(route, agg) {
  const n = agg.windows.length;
  const svg = frame(n, 'volume', 'Requests per window');
  let max = 0;
  for (const w of agg.windows) {
    const c = route.byWindow.get(w);
    if (c && c.requests > max) max = c.requests;
  }
  gridLines(svg, n, max > 0 ? [[0, '0'], [0.5, String(Math.round(max / 2))], [1, String(max)]] : [[0, '0']]);
  svg.setAttribute('data-max', max);
  agg.windows.forEach((w, i) => {
    const c = route.byWindow.get(w);
    const x = 44 + i * SLOT + (SLOT - BAR) / 2;
    const g = s('g', { class: 'bar', 'data-window': w });
    if (c) {
      g.setAttribute('data-requests', c.requests);
      let below = 0;
      for (const k of STACK) {
        if (!c[k]) continue;
        const hgt = PLOT_H * c[k] / max;
        const seg = s('rect', {
          class: 'seg seg-' + k, 'data-class': k, 'data-value': c[k],
          x, y: plotY(0) - below - hgt, width: BAR, height: hgt,
        });
        seg.append(s('title', {}, LABEL[k] + ': ' + c[k]));
        g.append(seg);
        below += hgt;
      }
      g.append(s('text', { class: 'value', x: x + BAR / 2, y: plotY(0) - below - 4, 'text-anchor': 'middle' }, c.requests));
    }
    g.append(s('text', { class: 'xlabel', x: x + BAR / 2, y: plotY(0) + 14, 'text-anchor': 'middle' }, hhmmss(agg.starts.get(w))));
    svg.append(g);
  });
  return svg;
}

function legend() {
  return h('div', { class: 'legend' }, ...STACK.map((k) =>
    h('span', {}, h('i', { class: 'k-' + k }), LABEL[k] + (APART.includes(k) ? ' (not a failure)' : ''))));
}

// ---- tables ------------------------------------------------------------

function breakdownRow(label, window, c) {
  const td = (field, v, cls) => h('td', { 'data-field': field, class: cls }, v);
  return h('tr', { 'data-window': window, class: window === 'total' ? 'total' : null },
    h('td', {}, label),
    td('requests', c.requests),
    td('ok', c.ok),
    ...FAIL.map((k) => td(k, c[k], 'fail')),
    td('fail_count', failCount(c), 'fail'),
    td('fail_rate', pct(failCount(c), rateBase(c)), 'fail'),
    ...APART.map((k) => td(k, c[k], 'apart')),
    td('units', c.units),
    td('amount', c.amount));
}

function breakdown(route, agg) {
  const head = h('tr', {},
    h('th', {}, 'Window'), h('th', {}, 'Requests'), h('th', {}, 'OK'),
    ...FAIL.map((k) => h('th', { class: 'fail' }, LABEL[k])),
    h('th', { class: 'fail' }, 'Fail count'), h('th', { class: 'fail' }, 'Fail rate'),
    ...APART.map((k) => h('th', { class: 'apart', title: 'not a failure, not in the fail rate' }, LABEL[k])),
    h('th', {}, 'Units'), h('th', {}, 'Amount'));
  const rows = [];
  const total = zero();
  for (const w of agg.windows) {
    const c = route.byWindow.get(w);
    if (!c) continue;
    add(total, c);
    rows.push(breakdownRow(hhmmss(agg.starts.get(w)) + ' (' + w + ')', w, c));
  }
  rows.push(breakdownRow('Total', 'total', total));
  return h('table', { class: 'breakdown' }, h('thead', {}, head), h('tbody', {}, ...rows));
}

// ---- sections ----------------------------------------------------------

function providerSection(p, data) {
  const agg = aggregate(data.records);
  const sec = h('section', { class: 'provider', 'data-provider': p },
    h('h2', {}, 'Provider ', h('code', {}, p)),
    h('p', { class: 'sub' },
      agg.routes.length + ' route(s), ' + agg.windows.length + ' window(s) shown, ' +
      data.records.length + ' record(s)' + (data.truncated ? ' (first ' + PAGE * MAX_PAGES + ' only)' : '')),
    sloSection(p, data.slo, agg));
  if (agg.routes.length === 0) {
    sec.append(h('p', { class: 'hint' }, 'No SLA records for this provider.'));
    return sec;
  }
  const list = h('div', { class: 'routes' });
  for (const route of agg.routes) {
    list.append(h('article', { class: 'route', 'data-model': route.model, 'data-route': route.route },
      h('h3', {}, route.model, h('span', { class: 'r' }, route.route)),
      h('div', { class: 'charts' },
        h('figure', { class: 'chart' }, h('figcaption', {}, 'Fail rate per window'), failRateChart(route, agg)),
        h('figure', { class: 'chart' }, h('figcaption', {}, 'Requests per window, by class'), volumeChart(route, agg))),
      legend(),
      breakdown(route, agg)));
  }
  sec.append(list);
  return sec;
}

function stat(field, label, value, small) {
  return h('div', { class: 'stat', 'data-field': field },
    h('span', { class: 'label' }, label),
    h('span', { class: 'value' + (small ? ' small' : '') }, value));
}

function nextAttempt(sync) {
  const t = sync.next_attempt_not_before;
  if (t === null || t === undefined) return '—';
  const now = Math.floor(Date.now() / 1000);
  const rel = t > now ? 'in ' + (t - now) + ' s' : 'due';
  return unixTime(t) + ' (' + rel + ')';
}

function pipelineSection(chain, sync, batch, batchKind, calls) {
  const sec = h('section', { id: 'pipeline', 'data-chain': chain },
    h('h2', {}, 'Settlement pipeline ', h('code', {}, chain)),
    h('p', { class: 'sub' }, 'Closed windows become hub calls; the oldest pending calls form a batch, the validators sign it, a relay submits it to the hub.'));
  const stage = (text, active) => h('span', { class: 'stage' + (active ? ' active' : '') }, text);
  const arrow = () => h('span', { class: 'arrow' }, '→');
  sec.append(h('div', { class: 'stages' },
    stage(sync.pending_calls + ' pending call(s)', sync.pending_calls > 0), arrow(),
    stage(batch ? 'batch #' + batch.nonce + ' ' + batch.status : 'no batch', batch && batch.status !== 'settled'), arrow(),
    stage(sync.running ? 'attempt ' + sync.attempt + ' running' : 'idle', sync.running), arrow(),
    stage(sync.settled_batches + ' settled', false)));
  sec.append(h('div', { class: 'stats' },
    stat('pending_calls', 'Pending calls', sync.pending_calls),
    stat('running', 'Sync running', sync.running ? 'yes' : 'no'),
    stat('attempt', 'Attempt (current batch)', sync.attempt),
    stat('attempts', 'Attempts (total)', sync.attempts),
    stat('failures', 'Failed attempts', sync.failures),
    stat('settled_batches', 'Settled batches', sync.settled_batches),
    stat('next_nonce', 'Next nonce', sync.next_nonce),
    stat('next_attempt', 'Next attempt not before', nextAttempt(sync), true),
    stat('last_sync', 'Last sync', sync.last_sync_time || '—', true),
    stat('last_error', 'Last error', sync.last_error || '—', true)));
  if (batch) {
    sec.append(h('h3', {}, batchKind === 'current' ? 'Current batch' : 'Last batch'));
    sec.append(h('div', { class: 'stats', id: 'batch', 'data-kind': batchKind },
      stat('batch_nonce', 'Nonce', batch.nonce),
      stat('batch_status', 'Status', batch.status),
      stat('batch_calls', 'Calls', (batch.calls || []).length),
      stat('batch_total', 'Total credits', batch.total),
      stat('batch_formed_height', 'Formed at height', batch.formed_height),
      stat('batch_digest', 'Digest', batch.digest ? String(batch.digest).slice(0, 16) + '…' : '—', true)));
  }
  if (calls.length > 0) {
    sec.append(h('h3', {}, 'Pending calls (oldest first)'));
    sec.append(h('table', { id: 'pending-calls' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Call'), h('th', {}, 'User'), h('th', {}, 'Provider'), h('th', {}, 'Amount'), h('th', {}, 'Window'))),
      h('tbody', {}, ...calls.map((c) => h('tr', { 'data-call': c.id },
        h('td', {}, c.id), h('td', {}, c.user), h('td', {}, c.provider), h('td', {}, c.amount), h('td', {}, c.window))))));
  }
  return sec;
}

function balancesSection(users, balances) {
  const sec = h('section', { id: 'balances' },
    h('h2', {}, 'Balances'),
    h('p', { class: 'sub' }, 'Users in the shown providers\' records' + (users.length > MAX_USERS ? ' (first ' + MAX_USERS + ')' : '') + '.'));
  if (balances.length === 0) {
    sec.append(h('p', { class: 'hint' }, 'No users.'));
    return sec;
  }
  sec.append(h('table', {},
    h('thead', {}, h('tr', {}, h('th', {}, 'User'), h('th', {}, 'Balance (credits)'))),
    h('tbody', {}, ...balances.map((b) => h('tr', { 'data-user': b.user },
      h('td', {}, b.user), h('td', { 'data-field': 'balance' }, b.balance))))));
  return sec;
}

// ---- page --------------------------------------------------------------

function wanted(cfg) {
  const params = new URLSearchParams(location.search);
  let providers = params.getAll('provider').flatMap((p) => p.split(',')).map((p) => p.trim()).filter(Boolean);
  if (providers.length === 0) providers = cfg.providers || [];
  return { providers: [...new Set(providers)], chain: params.get('chain') || cfg.chain };
}

async function load() {
  const errBox = document.getElementById('error');
  try {
    const cfg = await api('/api/config');
    const want = wanted(cfg);
    const input = document.getElementById('provider-input');
    if (document.activeElement !== input) input.value = want.providers.join(',');
    const status = await api('/api/status');
    const params = await q('/params');
    const chain = want.chain || params.hub_chain;
    const sync = await q('/sync/' + enc(chain));
    let batch = null, batchKind = null;
    if (sync.nonce !== null && sync.nonce !== undefined) {
      batch = await qOr('/batch/' + enc(chain) + '/' + sync.nonce, null);
      batchKind = 'current';
    } else if (sync.next_nonce > 1) {
      batch = await qOr('/batch/' + enc(chain) + '/' + (sync.next_nonce - 1), null);
      batchKind = 'last';
    }
    const calls = sync.pending_calls > 0 ? (await q('/hubcalls/' + enc(chain) + '?limit=20')).calls || [] : [];
    const data = [];
    for (const p of want.providers) {
      const d = await providerRecords(p);
      d.slo = await loadSlo(p, aggregate(d.records));  // slo.js
      data.push([p, d]);
    }
    const users = [...new Set(data.flatMap(([, d]) => d.records.map((r) => r.user)))].sort();
    const balances = [];
    for (const u of users.slice(0, MAX_USERS)) balances.push(await q('/balance/' + enc(u)));

    const node = document.getElementById('node');
    node.replaceChildren('chain ', h('b', {}, status.chain_id), ' · height ', h('b', { id: 'height' }, status.height),
      status.catching_up ? ' · catching up' : '', ' · node ', status.node,
      ' · updated ', new Date().toISOString().slice(11, 19) + 'Z');
    const main = document.getElementById('main');
    const parts = [pipelineSection(chain, sync, batch, batchKind, calls)];
    if (want.providers.length === 0) {
      parts.push(h('section', {}, h('h2', {}, 'Providers'),
        h('p', { class: 'hint' }, 'Name a provider above (or start tallyd explorer with --provider) to see its routes.')));
    }
    for (const [p, d] of data) parts.push(providerSection(p, d));
    if (want.providers.length > 0) parts.push(balancesSection(users, balances));
    main.replaceChildren(...parts);
    errBox.hidden = true;
    generation += 1;
    document.body.dataset.generation = String(generation);
    document.body.dataset.state = 'ready';
    schedule(cfg.refresh_secs);
  } catch (e) {
    errBox.textContent = 'Could not read the node: ' + e.message;
    errBox.hidden = false;
    document.body.dataset.state = 'error';
    document.body.dataset.error = e.message;
    schedule(10);
  }
}

function schedule(secs) {
  if (timer) clearTimeout(timer);
  timer = secs > 0 ? setTimeout(load, secs * 1000) : null;
}

document.addEventListener('DOMContentLoaded', load);
