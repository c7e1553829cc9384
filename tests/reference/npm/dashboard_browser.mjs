// Drives Debian's Chromium (headless, through playwright-core) against a
// Troupe dashboard, for the e2e dashboard test and the dashboard benchmark.
//
//   node dashboard_browser.mjs live URL --actors a,b,c [--chart reward] [--grow 3]
//        [--screenshot PNG] [--timeout S]
//     waits until the actors table lists every named actor as ready, reads the
//     chart's points (data-points), then waits until it has gained --grow more
//     while the job runs; screenshot at the end.
//   node dashboard_browser.mjs finished URL [--screenshot PNG] [--viewport WxH] [--timeout S]
//     a finished run's page: state, actors table, charts with points, the
//     rollout viewer's cards and a log's text.
//   node dashboard_browser.mjs watch URL --seconds S
//     keeps the page open (polling like a user's tab) until the job ends, at most S seconds.
// Prints one JSON object with what it saw; exits 1 (JSON with "error") when
// a wait runs out or the page logs an error.
import { chromium } from "playwright-core";

const [mode, url, ...rest] = process.argv.slice(2);
const opt = {};
for (let i = 0; i < rest.length; i += 2) opt[rest[i].replace(/^--/, "")] = rest[i + 1];
const timeoutMs = Number(opt.timeout || 120) * 1000;
const out = { mode, url: url && url.replace(/token=[^&]+/, "token=…"), console_errors: [] };

function fail(msg) {
  out.error = msg;
  console.log(JSON.stringify(out));
  process.exit(1);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  // No network but the dashboard's: these stop Chromium's own background connections.
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
});
const done = async (code) => { await browser.close(); process.exit(code); };
try {
  const [vw, vh] = (opt.viewport || "1400x1000").split("x").map(Number);
  const page = await browser.newPage({ viewport: { width: vw, height: vh } });
  page.setDefaultTimeout(timeoutMs);
  page.on("console", m => { if (m.type() === "error") out.console_errors.push(m.text()); });
  page.on("pageerror", e => out.console_errors.push(String(e)));
  await page.goto(url, { waitUntil: "load" });
  const points = id => page.$eval(`#chart-${id}`, e => Number(e.dataset.points));
  const rows = () => page.$$eval("#actors tbody tr.actor", trs => trs.map(tr => ({
    id: tr.cells[0].textContent, role: tr.cells[1].textContent, state: tr.cells[4].textContent,
    heartbeat: tr.cells[7].textContent })));

  if (mode === "live") {
    const want = (opt.actors || "").split(",").filter(Boolean);
    await page.waitForFunction(w => {
      const ready = [...document.querySelectorAll("#actors tbody tr.actor")]
        .filter(tr => tr.cells[4].textContent === "ready").map(tr => tr.cells[0].textContent);
      return w.every(a => ready.includes(a));
    }, want, { timeout: timeoutMs });
    out.actors = await rows();
    const chart = opt.chart || "reward";
    await page.waitForFunction(c => Number(document.querySelector(`#chart-${c}`).dataset.points) > 0, chart);
    out.points_before = await points(chart);
    const grow = Number(opt.grow || 3);
    await page.waitForFunction(([c, n]) => Number(document.querySelector(`#chart-${c}`).dataset.points) >= n,
                               [chart, out.points_before + grow]);
    out.points_after = await points(chart);
    out.state = await page.textContent("#job-state");
    out.progress = await page.textContent("#progress");
    out.canvases = await page.$$eval("#charts-step canvas, #charts-time canvas", c => c.length);
  } else if (mode === "finished") {
    await page.waitForFunction(() => ["finished", "stopped", "failed"].includes(
      document.querySelector("#job-state").textContent));
    await page.waitForFunction(() => document.querySelectorAll("#actors tbody tr.actor").length > 0);
    await page.waitForFunction(() => Number(document.querySelector("#chart-accuracy").dataset.points) > 0 &&
                                     Number(document.querySelector("#chart-loss").dataset.points) > 0);
    out.state = await page.textContent("#job-state");
    out.actors = await rows();
    out.points = {};
    for (const c of ["accuracy", "reward", "loss", "laghist", "gen", "credits"]) out.points[c] = await points(c);
    out.summary = await page.textContent("#summary");
    if (opt.screenshot) await page.screenshot({ path: opt.screenshot, fullPage: false });
    await page.click("button[data-tab=rollouts]");
    await page.waitForSelector("#rollouts .rollout");
    out.rollout_cards = await page.$$eval("#rollouts .rollout", c => c.length);
    out.rollout_info = await page.textContent("#rollout-info");
    out.first_rollout = await page.textContent("#rollouts .rollout");
    if (opt.screenshot) await page.screenshot({ path: opt.screenshot.replace(/\.png$/, "-rollouts.png") });
    // A filter the viewer applies: only reward >= 1.
    await page.fill("input[name=reward_min]", "1");
    await page.click("#rollout-filter button[type=submit]");
    await page.waitForFunction(before => document.querySelector("#rollout-info").textContent !== before,
                               out.rollout_info);
    out.filtered_info = await page.textContent("#rollout-info");
    out.filtered_rewards = await page.$$eval("#rollouts .rollout", cs => cs.map(c =>
      Number((c.querySelector(".meta span:nth-child(3) b") || {}).textContent)));
    await page.click("button[data-tab=logs]");
    await page.waitForFunction(() => document.querySelector("#log-text").textContent.length > 0);
    out.log_actor = await page.inputValue("#log-actor");
    out.log_chars = (await page.textContent("#log-text")).length;
    opt.screenshot = opt.screenshot && opt.screenshot.replace(/\.png$/, "-logs.png");
  } else if (mode === "watch") {
    // Until the job ends (its state leaves "running", or its head stops answering) or --seconds.
    const until = Date.now() + Number(opt.seconds || 60) * 1000;
    let gone = 0;
    while (Date.now() < until) {
      await page.waitForTimeout(1000);
      const st = await page.textContent("#job-state");
      const banner = await page.$eval("#banner", b => (b.hidden ? "" : b.textContent));
      gone = /fetch|Failed/.test(banner) ? gone + 1 : 0;
      if (["finished", "stopped", "failed"].includes(st) || gone >= 3) break;
      out.points = await points("reward");
    }
    out.state = await page.textContent("#job-state");
    out.console_errors = [];  // a head that went away fails the page's last fetches: expected here
  } else {
    fail("mode must be live, finished or watch");
  }
  if (opt.screenshot) await page.screenshot({ path: opt.screenshot, fullPage: false });
  const errors = out.console_errors.filter(e => !/favicon/.test(e));
  if (errors.length) { out.error = "the page logged errors"; console.log(JSON.stringify(out)); await done(1); }
  console.log(JSON.stringify(out));
  await done(0);
} catch (e) {
  out.error = String(e && e.message || e).split("\n")[0];
  try { out.actors = out.actors || []; } catch (e2) { /* ignore */ }
  console.log(JSON.stringify(out));
  await done(1);
}
