// Troupe dashboard page: polls the head's JSON API (or `troupe dashboard`'s)
// and draws the actors table, curves (uPlot), logs and sampled rollouts.
//
//   /api/job     job name, state, progress, summaries      every 1 s while live
//   /api/actors  the actors table (status --stats figures) every 1 s while live
//   /api/series  metrics.jsonl records from an index on    every 2 s while live
//   /api/logs    one actor's log from a byte offset        every 1 s when following
//   /api/rollouts sampled sequences, filtered, newest first on demand
//
// Tests read `data-points` on each chart (points of its first series) and the
// table's rows; window.troupeDashboard exposes the same figures.
"use strict";

const LIVE_MS = 1000, SERIES_MS = 2000;
const COLORS = ["#2a6fdb", "#d9534f", "#1f8a4c", "#b7791f", "#7b4fd6", "#17a2b8", "#555", "#e377c2", "#8c564b", "#bcbd22"];

// Curves. kinds: which metrics.jsonl records feed the chart; x: "step" (the
// learner's update) or "time" (wall clock, for heartbeat figures).
const CHARTS = [
  { id: "accuracy", title: "Held-out accuracy and reward", kinds: ["warm_start", "eval"], x: "step",
    series: [["eval_accuracy", "accuracy"], ["eval_reward", "reward"]] },
  { id: "reward", title: "Sampled reward", kinds: ["train"], x: "step",
    series: [["reward_mean", "mean"], ["reward_std", "std"]] },
  { id: "loss", title: "Loss", kinds: ["train"], x: "step", series: [["loss", "loss"], ["pg_loss", "policy gradient"]] },
  { id: "kl", title: "KL and entropy", kinds: ["train"], x: "step", series: [["kl", "KL"], ["entropy", "entropy"]] },
  { id: "clip", title: "Clip fraction", kinds: ["train"], x: "step",
    series: [["clip_fraction", "clipped"], ["is_truncated_fraction", "IS truncated"]] },
  { id: "is", title: "Importance weights", kinds: ["train"], x: "step",
    series: [["is_weight_mean", "mean"], ["is_weight_max", "max"]] },
  { id: "lag", title: "Policy lag", kinds: ["train"], x: "step", series: [["lag_mean", "mean"], ["lag_max", "max"]] },
  { id: "laghist", title: "Policy lag histogram (share of batches at lag k)", kinds: ["train"], x: "step",
    histogram: e => Array.isArray(e.lag_histogram) ? { counts: e.lag_histogram, labels: e.lag_histogram.map((_, k) => "lag " + k) } : null },
  { id: "ishist", title: "Importance weights (share of trained tokens by pi/pi_behav)", kinds: ["train"], x: "step",
    histogram: e => {
      const h = e.is_weight_histogram;
      if (!h || !Array.isArray(h.counts) || !Array.isArray(h.edges)) return null;
      const labels = h.counts.map((_, i) => i === 0 ? "≤ " + h.edges[0] : i === h.edges.length ? "> " + h.edges[i - 1]
                                                     : h.edges[i - 1] + "–" + h.edges[i]);
      return { counts: h.counts, labels };
    } },
  { id: "tokens", title: "Tokens/s (learner)", kinds: ["train"], x: "step",
    series: [["train_tokens_per_s", "trained"], ["received_tokens_per_s", "received"]] },
  { id: "broadcast", title: "Update and broadcast time (s)", kinds: ["train"], x: "step",
    series: [["forward_s", "forward"], ["backward_s", "backward"], ["broadcast_s", "broadcast"]] },
  { id: "gen", title: "Tokens/s generated and trained", kinds: ["heartbeat"], x: "time",
    series: [["gen_tokens_per_s", "generated"], ["train_tokens_per_s", "trained"]] },
  { id: "credits", title: "Credits in flight", kinds: ["heartbeat"], x: "time",
    series: [["credits", "rollout credits"], ["credits_granted", "learner granted"], ["in_flight", "sequences in flight"]] },
  { id: "outbox", title: "Outbox depths and queues", kinds: ["heartbeat"], x: "time",
    series: [["outbox_rollout", "rollout outboxes"], ["outbox_reward", "reward outboxes"],
             ["queued_batches", "learner queue"], ["awaiting_learner", "awaiting learner"]] },
  { id: "restarts", title: "Restarts and actors up", kinds: ["heartbeat"], x: "time",
    series: [["restarts", "restarts"], ["actors_up", "actors up"]] },
];

const state = {
  live: true, job: null, seriesNext: 0, charts: {}, pollers: [], tab: "overview",
  log: { actor: "", next: -1, timer: null }, rollouts: { before: null },
  expanded: new Set(),
};

// ------------------------------------------------------------------ helpers

function $(sel, root) { return (root || document).querySelector(sel); }
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const k of kids) if (k != null) e.append(k);
  return e;
}
function fmt(v, digits) {
  if (v == null || Number.isNaN(v)) return "–";
  if (typeof v !== "number") return String(v);
  const a = Math.abs(v);
  if (digits != null) return v.toFixed(digits);
  if (a >= 1e5) return (v / 1e3).toFixed(0) + "k";
  if (a >= 1e3) return (v / 1e3).toFixed(1) + "k";
  if (Number.isInteger(v)) return String(v);
  return a >= 10 ? v.toFixed(1) : v.toFixed(3);
}
async function getJson(url) {
  const r = await fetch(url, { credentials: "same-origin", cache: "no-store" });
  if (!r.ok) {
    let msg = r.status + " " + r.statusText;
    try { msg = (await r.json()).error || msg; } catch (e) { /* not JSON */ }
    throw new Error(url.split("?")[0] + ": " + msg);
  }
  return r.json();
}
function banner(msg) {
  const b = $("#banner");
  b.hidden = !msg;
  b.textContent = msg || "";
}

// ------------------------------------------------------------------ job + actors

function renderJob(job) {
  state.job = job;
  $("#job-name").textContent = job.job || job.run_name || "job";
  document.title = (job.job || "Troupe") + " — Troupe";
  const st = $("#job-state");
  st.textContent = job.state || "unknown";
  st.className = "badge " + (job.state || "");
  $("#job-mode").textContent = job.live ? "live · " + (job.run || "") : "from the run folder · " + (job.run || "");
  const p = job.progress || {};
  const parts = [];
  if (p.step != null) parts.push(["update", fmt(p.step) + (p.max_steps ? " / " + fmt(p.max_steps) : "")]);
  if (p.reward_mean != null) parts.push(["reward", fmt(p.reward_mean, 3)]);
  if (p.eval_accuracy != null) parts.push(["held-out", fmt(p.eval_accuracy, 3)]);
  if (p.lag_mean != null) parts.push(["lag", fmt(p.lag_mean, 2)]);
  if (p.gen_tokens_per_s != null) parts.push(["gen tok/s", fmt(p.gen_tokens_per_s)]);
  if (p.train_tokens_per_s != null) parts.push(["train tok/s", fmt(p.train_tokens_per_s)]);
  if (p.elapsed_s != null) parts.push(["elapsed", fmt(p.elapsed_s, 0) + " s"]);
  const prog = $("#progress");
  prog.replaceChildren(...parts.flatMap(([k, v], i) => [i ? " · " : "", k + " ", el("b", { text: v })]));
  renderSummary(job);
}

function renderSummary(job) {
  const box = $("#summary");
  const js = job.job_summary, s = job.summary;
  if (!js && !s) { box.hidden = true; return; }
  box.hidden = false;
  const kids = [];
  if (s) {
    kids.push(el("div", { text:
      `warm start ${fmt(s.warm_accuracy, 3)} → best ${fmt(s.best_accuracy, 3)}, final ${fmt(s.final_accuracy, 3)}` +
      (s.time_to_target_s >= 0 ? `, target reached after ${fmt(s.time_to_target_s, 1)} s` : "") +
      ` · ${fmt(s.steps)} updates · ${fmt(s.gen_tokens_per_s)} tok/s generated, ${fmt(s.train_tokens_per_s)} trained` }));
  }
  if (js && js.accounting) {
    const a = js.accounting;
    const terms = ["trained", "skipped", "dropped_stale", "dropped_invalid", "dropped_unscored", "in_flight",
                   "lost_with_actor", "lost_with_learner"].filter(t => a[t] != null);
    kids.push(el("div", {},
      `accounting: generated ${fmt(a.generated)} = ` + terms.map(t => `${t} ${fmt(a[t])}`).join(" + ") + " ",
      el("span", { class: js.accounting_holds ? "holds" : "mismatch", text: js.accounting_holds ? "[holds]" : "[MISMATCH]" })));
    if (js.failure) kids.push(el("div", { class: "failure", text: "failure: " + js.failure }));
  }
  box.replaceChildren(...kids);
}

const FIGURES = {
  rollout: ["gen_tokens_per_s", "credits", "groups_generating", "in_flight", "outbox", "generated"],
  reward: ["scored_per_s", "awaiting_learner", "outbox", "scored"],
  learner: ["updates", "train_tokens_per_s", "queued_batches", "credits_granted", "dropped_stale", "duplicates"],
};

function renderActors(data) {
  const body = $("#actors tbody");
  const now = data.time_ns || Date.now() * 1e6;
  const rows = [];
  for (const a of data.actors || []) {
    const age = a.last_heartbeat_ns > 0 ? (now - a.last_heartbeat_ns) / 1e9 : null;
    const stats = a.stats || {};
    const figs = (FIGURES[a.role] || Object.keys(stats).slice(0, 5))
      .filter(k => stats[k] != null).map(k => `${k} ${fmt(stats[k])}`).join(" · ");
    const tr = el("tr", { class: "actor", "data-actor": a.id },
      el("td", { text: a.id }), el("td", { text: a.role }), el("td", { text: a.node || "" }),
      el("td", { text: a.pid || "" }), el("td", { class: "state-" + a.state, text: a.state }),
      el("td", { text: fmt(a.policy_version) }), el("td", { text: fmt(a.restarts) }),
      el("td", { class: age != null && age > 5 && state.live ? "stale" : "", text: age == null ? "never" : fmt(age, 1) + " s ago" }),
      el("td", { class: "figures", text: figs }));
    tr.addEventListener("click", () => {
      if (state.expanded.has(a.id)) state.expanded.delete(a.id); else state.expanded.add(a.id);
      renderActors(data);
    });
    rows.push(tr);
    if (state.expanded.has(a.id)) {
      const grid = el("div", { class: "statgrid" },
        ...Object.keys(stats).sort().map(k => el("span", {}, el("span", { text: k }), el("b", { text: fmt(stats[k]) }))));
      rows.push(el("tr", { class: "stats" }, Object.assign(el("td", {}, grid), { colSpan: 9 })));
    }
  }
  if (!rows.length) rows.push(el("tr", {}, Object.assign(el("td", { class: "muted", text: "no actors yet" }), { colSpan: 9 })));
  body.replaceChildren(...rows);
}

// ------------------------------------------------------------------ charts

function makeChart(def) {
  const box = el("div", { class: "chart", id: "chart-" + def.id, "data-points": "0", "data-testid": "chart-" + def.id },
    el("h3", { text: def.title }), el("div", { class: "empty", text: "no data yet" }));
  $(def.x === "time" ? "#charts-time" : "#charts-step").append(box);
  state.charts[def.id] = { def, box, xs: [], ys: (def.series || []).map(() => []), plot: null, dirty: false,
                           hist: def.histogram ? [] : null };
}

function addRecord(rec) {
  for (const c of Object.values(state.charts)) {
    const def = c.def;
    if (!def.kinds.includes(rec.kind)) continue;
    const x = def.x === "time" ? rec.time_ns / 1e9 : (rec.step || 0);
    if (def.histogram) {
      const h = rec.extra && def.histogram(rec.extra);
      if (!h) continue;
      const total = h.counts.reduce((s, v) => s + v, 0) || 1;
      c.xs.push(x);
      c.hist.push(h.counts.map(v => v / total));
      c.labels = h.labels;
      c.dirty = true;
      continue;
    }
    if (!def.series.some(([k]) => typeof rec[k] === "number")) continue;
    c.xs.push(x);
    def.series.forEach(([k], i) => c.ys[i].push(typeof rec[k] === "number" ? rec[k] : null));
    c.dirty = true;
  }
}

function chartData(c) {
  // uPlot wants x ascending (a resumed learner repeats steps): sort by x, stable.
  const order = c.xs.map((x, i) => i).sort((a, b) => c.xs[a] - c.xs[b] || a - b);
  const xs = order.map(i => c.xs[i]);
  if (c.hist) {
    const k = Math.max(0, ...c.hist.map(h => h.length));
    const names = [];
    const ys = [];
    for (let j = 0; j < k; j++) { names.push((c.labels && c.labels[j]) || "#" + j); ys.push(order.map(i => c.hist[i][j] ?? 0)); }
    return { xs, ys, names };
  }
  return { xs, ys: c.ys.map(col => order.map(i => col[i])), names: c.def.series.map(([k, n]) => n || k) };
}

function drawChart(c) {
  if (!c.dirty) return;
  c.dirty = false;
  const d = chartData(c);
  c.box.setAttribute("data-points", String(d.xs.length));
  if (!d.xs.length) return;
  const width = Math.max(300, c.box.clientWidth - 12);
  const names = d.names.join("|");
  if (!c.plot || c.names !== names) {
    if (c.plot) c.plot.destroy();
    const empty = $(".empty", c.box);
    if (empty) empty.remove();
    c.names = names;
    c.plot = new uPlot({
      width, height: 190,
      scales: { x: { time: c.def.x === "time" } },
      series: [{ label: c.def.x === "time" ? "time" : "update" },
               ...d.names.map((n, i) => ({ label: n, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true,
                                           points: { show: d.xs.length < 40 } }))],
      axes: [{}, { size: 50 }],
      legend: { live: true },
    }, [d.xs, ...d.ys], c.box);
  } else {
    c.plot.setData([d.xs, ...d.ys]);
  }
}

// One fetch at a time: the live loop and the job's end may both ask.
let seriesBusy = null;
function pollSeries() {
  if (!seriesBusy) seriesBusy = fetchSeries().finally(() => { seriesBusy = null; });
  return seriesBusy;
}

async function fetchSeries() {
  // Catch up in pages (a long finished run has many records).
  for (let pages = 0; pages < 50; pages++) {
    const r = await getJson(`api/series?from=${state.seriesNext}&max=5000`);
    if (r.next < state.seriesNext) {  // the file was replaced: start over
      for (const c of Object.values(state.charts)) { c.xs = []; c.ys = c.ys.map(() => []); if (c.hist) c.hist = []; c.dirty = true; }
    }
    for (const rec of r.records) addRecord(rec);
    state.seriesNext = r.next;
    if (r.next >= r.total) break;
  }
  for (const c of Object.values(state.charts)) drawChart(c);
}

// ------------------------------------------------------------------ logs

async function loadLogList() {
  const r = await getJson("api/logs");
  const sel = $("#log-actor");
  const have = new Set([...sel.options].map(o => o.value));
  for (const l of r.logs) if (!have.has(l.actor)) sel.append(el("option", { value: l.actor, text: l.actor }));
  if (!state.log.actor && sel.options.length) {
    const pick = [...sel.options].find(o => o.value.startsWith("learner")) || sel.options[0];
    sel.value = pick.value;
    state.log.actor = pick.value;
  }
}

async function pollLog() {
  if (!state.log.actor) return;
  const pre = $("#log-text");
  const r = await getJson(`api/logs?actor=${encodeURIComponent(state.log.actor)}&offset=${state.log.next}&max=262144`);
  if (state.log.next < 0 || r.offset !== state.log.next) pre.textContent = "";
  const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
  if (r.text) pre.append(r.text);
  // Keep the page light: the last ~2 MB of text.
  if (pre.textContent.length > 2e6) pre.textContent = pre.textContent.slice(-1.5e6);
  state.log.next = r.next;
  $("#log-info").textContent = `${fmt(r.size)} bytes`;
  if (atBottom || r.offset === 0) pre.scrollTop = pre.scrollHeight;
}

function scheduleLog() {
  clearTimeout(state.log.timer);
  if (state.tab !== "logs") return;
  const run = () => pollLog().catch(e => banner(e.message)).finally(() => {
    if (state.tab === "logs" && $("#log-follow").checked) state.log.timer = setTimeout(run, LIVE_MS);
  });
  run();
}

// ------------------------------------------------------------------ rollouts

function segmentsOf(r) {
  if (Array.isArray(r.segments) && r.segments.length) return r.segments;
  return [{ text: r.response_text || "", mask: 1 }];
}

function renderRollout(item, withTokens) {
  const r = item.record;
  const rewardClass = r.reward >= 1 ? "reward-1" : r.reward <= 0 ? "reward-0" : "";
  const meta = el("div", { class: "meta" },
    el("span", {}, "update ", el("b", { text: fmt(r.step) })),
    el("span", {}, "task ", el("b", { text: r.task || "?" })),
    el("span", {}, "reward ", el("b", { class: rewardClass, text: fmt(r.reward, 3) })),
    el("span", {}, "policy version ", el("b", { text: fmt(r.policy_version) }), ` (lag ${fmt(r.lag)})`),
    el("span", { text: "finish " + (r.finish || "?") }),
    el("span", { text: (r.scorer ? "scored by " + r.scorer : "") }),
    el("span", { text: r.prompt_id ? "prompt " + r.prompt_id : "" }),
    el("span", { text: r.batch_id ? "batch " + r.batch_id : "" }));
  const kids = [meta];
  if (r.failure) kids.push(el("div", { class: "failure", text: "scoring failed: " + r.failure }));
  if (r.components && Object.keys(r.components).length)
    kids.push(el("div", { class: "muted", text: "reward parts: " + Object.entries(r.components).map(([k, v]) => `${k} ${fmt(v, 3)}`).join(", ") }));
  kids.push(el("div", { class: "label", text: "prompt" }), el("div", { class: "text", text: r.prompt_text || "" }));
  const resp = el("div", { class: "text" },
    ...segmentsOf(r).map(s => el("span", { class: s.mask ? "seg" : "seg env", title: s.mask ? "model tokens (trained)" : "environment tokens (not trained)", text: s.text })));
  kids.push(el("div", { class: "label", text: "response" }), resp);
  if (r.reference) kids.push(el("div", { class: "label", text: "expected" }), el("div", { class: "text", text: r.reference }));
  if (withTokens && Array.isArray(r.response_tokens)) {
    const toks = el("div", { class: "tokens" });
    r.response_tokens.forEach((t, i) => {
      const env = r.loss_mask && r.loss_mask[i] === 0;
      const v = r.token_versions ? ` v${r.token_versions[i]}` : "";
      toks.append(el("span", { class: env ? "env" : "", title: (env ? "environment token" : "model token") + v, text: String(t) }));
    });
    kids.push(el("div", { class: "label", text: "response tokens (shaded: mask 0)" }), toks);
  }
  return el("div", { class: "rollout", "data-index": String(item.index) }, ...kids);
}

async function loadRollouts(append) {
  const form = $("#rollout-filter");
  const q = new URLSearchParams();
  for (const k of ["step_min", "step_max", "reward_min", "reward_max", "task", "text"]) {
    const v = form.elements[k].value.trim();
    if (v) q.set(k, v);
  }
  q.set("limit", "40");
  if (append && state.rollouts.before != null) q.set("before", state.rollouts.before);
  const r = await getJson("api/rollouts?" + q.toString());
  const sel = form.elements.task;
  const have = new Set([...sel.options].map(o => o.value));
  for (const t of r.tasks) if (t && !have.has(t)) sel.append(el("option", { value: t, text: t }));
  const list = $("#rollouts");
  const cards = r.rollouts.map(it => renderRollout(it, form.elements.tokens.checked));
  if (append) list.append(...cards); else list.replaceChildren(...cards);
  if (r.rollouts.length) state.rollouts.before = r.rollouts[r.rollouts.length - 1].index;
  $("#rollout-more").hidden = !r.rollouts.length || r.matched <= list.children.length;
  $("#rollout-info").textContent = r.total
    ? `${r.matched} of ${r.total} sampled sequences match (updates ${r.step_min}–${r.step_max})`
    : "no sampled sequences yet (rollout_samples.per_update: 0, or no update yet)";
}

// ------------------------------------------------------------------ main loop

async function pollLive() {
  const [job, actors] = await Promise.all([getJson("api/job"), getJson("api/actors")]);
  const was = state.live;
  state.live = !!job.live && (job.state === "running" || job.state === "stopping");
  if (was && !state.live) pollSeries().catch(e => banner(e.message));  // the job's last records
  renderJob(job);
  renderActors(actors);
  banner("");
  return job;
}

function every(ms, fn) {
  let stopped = false;
  const run = async () => {
    if (stopped) return;
    try { await fn(); } catch (e) { banner(e.message); }
    if (!stopped && state.live) setTimeout(run, ms);
  };
  run();
  return () => { stopped = true; };
}

function showTab(name) {
  state.tab = name;
  for (const b of document.querySelectorAll(".tab")) b.classList.toggle("active", b.dataset.tab === name);
  for (const p of document.querySelectorAll(".tab-page")) p.hidden = p.id !== "tab-" + name;
  if (name === "logs") loadLogList().then(scheduleLog).catch(e => banner(e.message));
  if (name === "rollouts") { state.rollouts.before = null; loadRollouts(false).catch(e => banner(e.message)); }
  if (name === "overview") for (const c of Object.values(state.charts)) { c.dirty = true; drawChart(c); }
}

function init() {
  if (typeof uPlot === "undefined") banner("uPlot did not load (run scripts/install-npm-reference.sh and rebuild troupe)");
  CHARTS.forEach(makeChart);
  for (const b of document.querySelectorAll(".tab")) b.addEventListener("click", () => showTab(b.dataset.tab));
  $("#log-actor").addEventListener("change", e => { state.log.actor = e.target.value; state.log.next = -1; scheduleLog(); });
  $("#log-follow").addEventListener("change", scheduleLog);
  $("#rollout-filter").addEventListener("submit", e => { e.preventDefault(); state.rollouts.before = null; loadRollouts(false).catch(er => banner(er.message)); });
  $("#rollout-more").addEventListener("click", () => loadRollouts(true).catch(e => banner(e.message)));
  window.addEventListener("resize", () => {
    for (const c of Object.values(state.charts))
      if (c.plot) c.plot.setSize({ width: Math.max(300, c.box.clientWidth - 12), height: 190 });
  });
  // Live: poll until the job ends; finished: one pass of everything.
  every(LIVE_MS, pollLive);
  every(SERIES_MS, pollSeries);
  window.troupeDashboard = {
    points: id => (state.charts[id] ? state.charts[id].xs.length : -1),
    state,
  };
}

init();
