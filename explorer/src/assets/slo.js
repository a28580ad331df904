// Tally SLA explorer: a provider's service-level objectives (ADR 0021).
// Its policy, one verdict per window (met, breached, not judged), what a
// breach was made of (failure classes and the routes behind them), latency
// and TTFT percentiles per route, and the reputation after each verdict.
// Loaded after app.js, whose helpers (h, s, q, enc, frame, gridLines, ...)
// it uses. Reads only this server's /api.
'use strict';

const SLO_WINDOWS = 24;      // newest windows in the strip and the reputation chart
const SLO_SPAN = 999;        // verdicts are read from this many windows before the newest on
const VERDICT_PAGES = 10;    // /slo/verdicts pages read (100 verdicts each: the whole span)
const BREACHES_SHOWN = 3;    // newest breached windows explained
const LATENCY_WINDOWS = 3;   // newest windows with a latency table
const PPM = 1000000;
const STATUS_TEXT = {
  met: 'met', breached: 'breached', not_judged: 'not judged',
  pending: 'not yet judged', none: 'no policy',
};
const REASON_TEXT = {
  fail_rate: 'fail rate over the ceiling',
  latency: 'p95 latency at or over the ceiling',
  ttft: 'p95 time to first token at or over the ceiling',
};

// ---- formatting --------------------------------------------------------

// 937500 -> "93.75%": ppm as a percentage, trailing zeros dropped.
function ppmPct(ppm) {
  return (Number(ppm) / 10000).toFixed(2).replace(/\.?0+$/, '') + '%';
}
// A percentile estimate (the bucket holding it) as its bounds.
function estText(e) {
  if (!e) return '—';
  return e.hi_ms === null || e.hi_ms === undefined ? '≥ ' + e.lo_ms + ' ms' : e.lo_ms + '–' + e.hi_ms + ' ms';
}
const ceilingText = (ms) => (ms ? 'under ' + ms + ' ms' : 'none');

// ---- loading -----------------------------------------------------------

// A window's records of provider `p`, summed per route (users added up),
// most failures first.
async function windowRoutes(p, w) {
  let records = [];
  let cursor = null;
  let truncated = false;
  for (let i = 0; ; i++) {
    if (i === MAX_PAGES) { truncated = true; break; }
    const page = await q('/sla/provider/' + enc(p) + '/' + w + '?limit=' + PAGE + (cursor ? '&cursor=' + enc(cursor) : ''));
    records = records.concat(page.records || []);
    cursor = page.next_cursor;
    if (!cursor) break;
  }
  const routes = new Map();
  for (const r of records) {
    const key = r.model + '\u0000' + r.route;
    if (!routes.has(key)) routes.set(key, { model: r.model, route: r.route, c: zero(), users: new Set() });
    add(routes.get(key).c, r);
    routes.get(key).users.add(r.user);
  }
  const list = [...routes.values()].sort((a, b) => failCount(b.c) - failCount(a.c) ||
    (a.model < b.model ? -1 : a.model > b.model ? 1 : a.route < b.route ? -1 : a.route > b.route ? 1 : 0));
  return { routes: list, truncated };
}

// Everything the SLO part of a provider's section shows; `{error}` if the
// node does not answer the SLO queries (the rest of the page still works).
async function loadSlo(p, agg) {
  try {
    const policy = await q('/slo/policy/' + enc(p));
    const reputation = await q('/slo/reputation/' + enc(p));
    const newest = Math.max(reputation.last_window || 0, agg.windows.length ? agg.windows[agg.windows.length - 1] : 0);
    let from = Math.max(1, newest - SLO_SPAN);
    let verdicts = [];
    for (let i = 0; i < VERDICT_PAGES && from !== null && from !== undefined; i++) {
      const page = await q('/slo/verdicts/' + enc(p) + '?from=' + from);
      verdicts = verdicts.concat(page.verdicts || []);
      from = page.next_from;
    }
    verdicts = verdicts.slice(-SLO_WINDOWS);
    const byWindow = new Map(verdicts.map((v) => [v.window, v]));
    const windows = [...new Set([...agg.windows, ...byWindow.keys()])].sort((a, b) => a - b).slice(-SLO_WINDOWS);
    const latency = new Map();
    const latencyOf = async (w) => {
      if (!latency.has(w)) latency.set(w, await q('/latency/' + enc(p) + '/' + w));
      return latency.get(w);
    };
    for (const w of windows.slice(-LATENCY_WINDOWS).reverse()) await latencyOf(w);
    const breaches = [];
    for (const v of verdicts.filter((x) => x.status === 'breached').slice(-BREACHES_SHOWN).reverse()) {
      breaches.push({ verdict: v, records: await windowRoutes(p, v.window), latency: await latencyOf(v.window) });
    }
    return { policy, reputation, verdicts, byWindow, windows, latency, breaches };
  } catch (e) {
    return { error: e.message };
  }
}

// ---- drawing -----------------------------------------------------------

// A window without a verdict: not judged yet if a policy governs it (the
// window is still open), else no policy.
function noVerdict(slo, w) {
  const f = slo.policy;
  return f.policy && f.since_window !== null && w >= f.since_window ? 'pending' : 'none';
}

function windowLabel(agg, w) {
  return agg.starts.has(w) ? hhmmss(agg.starts.get(w)) : String(w);
}

function policyStats(f) {
  const pol = f.policy;
  if (!pol) {
    return h('p', { class: 'hint', 'data-field': 'policy' }, 'No objectives in force for this provider' +
      (f.scheduled ? '; some are scheduled from window ' + f.scheduled.from_window + '.' : '.'));
  }
  const box = h('div', { class: 'stats policy', 'data-field': 'policy' },
    stat('max_fail_ppm', 'Fail-rate ceiling', ppmPct(pol.max_fail_ppm)),
    stat('min_requests', 'Judged from (calls)', pol.min_requests),
    stat('p95_latency_ms', 'p95 latency', ceilingText(pol.p95_latency_ms), true),
    stat('p95_ttft_ms', 'p95 TTFT', ceilingText(pol.p95_ttft_ms), true),
    stat('credit_ppm', 'Credit on breach', ppmPct(pol.credit_ppm)),
    stat('since_window', 'In force since window', f.since_window, true));
  if (f.scheduled) {
    box.append(stat('scheduled', 'Change from window', f.scheduled.from_window + (f.scheduled.policy ? '' : ' (removal)'), true));
  }
  return box;
}

function reputationStats(r) {
  const score = stat('score_ppm', 'Reputation', ppmPct(r.score_ppm));
  score.setAttribute('data-ppm', r.score_ppm);
  return h('div', { class: 'stats reputation' }, score,
    stat('judged', 'Windows judged', r.judged),
    stat('breached', 'Windows breached', r.breached),
    stat('last_window', 'Last judged window', r.judged > 0 ? r.last_window : '—', true));
}

function verdictStrip(slo, agg) {
  const strip = h('div', { class: 'strip', 'data-chart': 'verdicts' });
  for (const w of slo.windows) {
    const v = slo.byWindow.get(w);
    const status = v ? v.status : noVerdict(slo, w);
    const title = 'window ' + w + ': ' + STATUS_TEXT[status] + (v ? ' (' + v.fail_count + ' failed of ' + v.judged +
      ' judged' + (v.reasons.length ? '; ' + v.reasons.join(', ') : '') + ')' : '');
    strip.append(h('span', { class: 'cell v-' + status, 'data-window': w, 'data-status': status, title },
      h('b', {}, STATUS_TEXT[status]), h('small', {}, windowLabel(agg, w))));
  }
  return strip;
}

function reputationChart(slo, agg) {
  const vs = slo.verdicts;
  const svg = frame(vs.length, 'reputation', 'Reputation after each verdict');
  gridLines(svg, vs.length, [[0, '0%'], [0.5, '50%'], [1, '100%']]);
  const tops = [];
  vs.forEach((v, i) => {
    const x = 44 + i * SLOT + (SLOT - BAR) / 2;
    const hgt = PLOT_H * v.reputation_ppm / PPM;
    const g = s('g', { class: 'bar', 'data-window': v.window, 'data-ppm': v.reputation_ppm, 'data-status': v.status });
    const rect = s('rect', { class: 'rep rep-' + v.status, x, y: plotY(0) - hgt, width: BAR, height: hgt });
    rect.append(s('title', {}, 'window ' + v.window + ': ' + STATUS_TEXT[v.status] + ', reputation ' + v.reputation_ppm + ' ppm'));
    g.append(rect);
    g.append(s('text', { class: 'value', x: x + BAR / 2, y: plotY(0) - hgt - 4, 'text-anchor': 'middle' }, ppmPct(v.reputation_ppm)));
    g.append(s('text', { class: 'xlabel', x: x + BAR / 2, y: plotY(0) + 14, 'text-anchor': 'middle' }, windowLabel(agg, v.window)));
    svg.append(g);
    tops.push((x + BAR / 2) + ',' + (plotY(0) - hgt));
  });
  if (tops.length > 1) svg.append(s('polyline', { class: 'rep-line', points: tops.join(' ') }));
  return svg;
}

function estCell(field, e, ceiling) {
  const slow = Boolean(e && ceiling && e.lo_ms >= ceiling);
  return h('td', {
    'data-field': field, 'data-bucket': e ? e.bucket : null, 'data-lo': e ? e.lo_ms : null,
    'data-hi': e && e.hi_ms !== null ? e.hi_ms : null, class: slow ? 'slow' : null,
  }, estText(e));
}

function latencyCells(row, pol) {
  const cells = [];
  for (const [kind, ceiling] of [['latency', pol ? pol.p95_latency_ms : 0], ['ttft', pol ? pol.p95_ttft_ms : 0]]) {
    const pc = row[kind];
    cells.push(h('td', { 'data-field': kind + '_measured' }, pc ? pc.measured : 0));
    for (const p of ['p50', 'p95', 'p99']) cells.push(estCell(kind + '_' + p, pc && pc[p], p === 'p95' ? ceiling : 0));
  }
  return cells;
}

function latencyTable(w, lat, pol, agg) {
  const head = h('tr', {}, h('th', {}, 'Model'), h('th', {}, 'Route'),
    h('th', {}, 'Latency measured'), h('th', {}, 'p50'), h('th', {}, 'p95'), h('th', {}, 'p99'),
    h('th', {}, 'TTFT measured'), h('th', {}, 'p50'), h('th', {}, 'p95'), h('th', {}, 'p99'));
  const rows = [h('tr', { class: 'total', 'data-scope': 'provider' },
    h('td', {}, 'All routes'), h('td', {}, ''), ...latencyCells(lat, pol))];
  for (const r of lat.routes || []) {
    rows.push(h('tr', { 'data-scope': 'route', 'data-model': r.model, 'data-route': r.route },
      h('td', {}, r.model), h('td', {}, r.route), ...latencyCells(r, pol)));
  }
  return h('div', { class: 'latency-window' },
    h('h4', {}, 'Latency and time to first token, window ' + windowLabel(agg, w) + ' (' + w + ')' + (lat.more ? ' (first 1000 routes)' : '')),
    h('table', { class: 'latency', 'data-window': w }, h('thead', {}, head), h('tbody', {}, ...rows)));
}

function reasonText(v, r) {
  const pol = v.policy;
  if (r === 'fail_rate') {
    return v.fail_count + ' failed of ' + v.judged + ' judged = ' + ppmPct(v.fail_ppm) + ', ceiling ' + ppmPct(pol.max_fail_ppm);
  }
  const [slow, measured, ceiling] = r === 'latency' ? [v.slow_latency, v.measured_latency, pol.p95_latency_ms]
    : [v.slow_ttft, v.measured_ttft, pol.p95_ttft_ms];
  return slow + ' of ' + measured + ' measured calls took ' + ceiling + ' ms or more (over 5%)';
}

function breachDetail(b, slo, agg) {
  const v = b.verdict;
  const pol = v.policy;
  const td = (field, val, cls) => h('td', { 'data-field': field, class: cls }, val);
  const classes = h('table', { class: 'classes' },
    h('thead', {}, h('tr', {}, h('th', {}, 'Requests'), h('th', {}, 'Judged'),
      ...FAIL.map((k) => h('th', { class: 'fail' }, LABEL[k])), h('th', { class: 'fail' }, 'Fail count'),
      h('th', { class: 'fail' }, 'Fail rate'), h('th', {}, 'Charged'), h('th', {}, 'Credited'), h('th', {}, 'Users credited'))),
    h('tbody', {}, h('tr', {}, td('requests', v.requests), td('judged', v.judged),
      ...FAIL.map((k) => td(k, v[k], 'fail')), td('fail_count', v.fail_count, 'fail'),
      td('fail_ppm', ppmPct(v.fail_ppm), 'fail'), td('charged', v.charged), td('credited', v.credited),
      td('credited_users', v.credited_users))));
  const routeLat = new Map((b.latency.routes || []).map((r) => [r.model + '\u0000' + r.route, r]));
  const head = h('tr', {}, h('th', {}, 'Model'), h('th', {}, 'Route'), h('th', {}, 'Requests'),
    ...FAIL.map((k) => h('th', { class: 'fail' }, LABEL[k])), h('th', { class: 'fail' }, 'Fail count'),
    h('th', { class: 'fail' }, 'Fail rate'), h('th', {}, 'p95 latency'), h('th', {}, 'p95 TTFT'));
  const rows = b.records.routes.map((r) => {
    const lat = routeLat.get(r.model + '\u0000' + r.route) || {};
    const p95l = lat.latency ? lat.latency.p95 : null;
    const p95t = lat.ttft ? lat.ttft.p95 : null;
    const slow = (e, c) => Boolean(e && c && e.lo_ms >= c);
    const fails = failCount(r.c);
    const cause = (fails > 0 && v.reasons.includes('fail_rate')) ||
      (v.reasons.includes('latency') && slow(p95l, pol.p95_latency_ms)) ||
      (v.reasons.includes('ttft') && slow(p95t, pol.p95_ttft_ms));
    return h('tr', { 'data-model': r.model, 'data-route': r.route, 'data-fail': fails, class: cause ? 'cause' : null },
      h('td', {}, r.model), h('td', {}, r.route), td('requests', r.c.requests),
      ...FAIL.map((k) => td(k, r.c[k], 'fail')), td('fail_count', fails, 'fail'),
      td('fail_rate', pct(fails, rateBase(r.c)), 'fail'),
      estCell('latency_p95', p95l, pol.p95_latency_ms), estCell('ttft_p95', p95t, pol.p95_ttft_ms));
  });
  return h('div', { class: 'breach', 'data-window': v.window },
    h('h4', {}, 'Breached: window ' + windowLabel(agg, v.window) + ' (' + v.window + ')'),
    h('ul', { class: 'reasons' }, ...v.reasons.map((r) => h('li', { 'data-reason': r },
      h('b', {}, REASON_TEXT[r] || r), ': ' + reasonText(v, r)))),
    classes,
    h('p', { class: 'note' }, 'Routes in this window, most failures first' +
      (b.records.truncated ? ' (first ' + PAGE * MAX_PAGES + ' records)' : '') + '; highlighted: the routes behind the breach.'),
    h('table', { class: 'breach-routes' }, h('thead', {}, head), h('tbody', {}, ...rows)));
}

// The SLO block of provider `p`'s section.
function sloSection(p, slo, agg) {
  const box = h('div', { class: 'slo', 'data-provider': p }, h('h3', {}, 'Service-level objectives'));
  if (slo.error) {
    box.setAttribute('data-error', slo.error);
    box.append(h('p', { class: 'hint' }, 'The node did not answer the SLO queries: ' + slo.error));
    return box;
  }
  const pol = slo.policy.policy;
  // Never had objectives: one line (and the latency, if measured).
  const quiet = !pol && !slo.policy.scheduled && slo.verdicts.length === 0 && slo.reputation.judged === 0;
  if (quiet) {
    box.append(h('p', { class: 'hint', 'data-field': 'policy' }, 'No objectives for this provider; never judged.'));
  } else {
    box.append(policyStats(slo.policy), reputationStats(slo.reputation));
  }
  if (slo.windows.length > 0 && !quiet) {
    box.append(h('figure', { class: 'chart' }, h('figcaption', {}, 'Verdict per window'), verdictStrip(slo, agg)));
  }
  if (slo.verdicts.length > 0) {
    box.append(h('figure', { class: 'chart' }, h('figcaption', {}, 'Reputation after each verdict'), reputationChart(slo, agg)));
  }
  for (const b of slo.breaches) box.append(breachDetail(b, slo, agg));
  for (const [w, lat] of [...slo.latency.entries()].sort((a, b) => b[0] - a[0])) {
    if (lat.latency || lat.ttft) box.append(latencyTable(w, lat, pol, agg));
  }
  if (!quiet && ![...slo.latency.values()].some((l) => l.latency || l.ttft)) {
    box.append(h('p', { class: 'hint' }, 'No latency measured in the newest windows.'));
  }
  return box;
}
