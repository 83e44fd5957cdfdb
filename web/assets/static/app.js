// conveyor dashboard: live updates by polling the JSON API. Job data is
// only ever put in the page as text (textContent, text nodes) or in
// attributes built here; never parsed as HTML.
"use strict";
(function () {
  const body = document.body;
  const base = body.dataset.base || "";
  const admin = body.dataset.admin === "true";
  const SVG = "http://www.w3.org/2000/svg";

  // el builds an element; string children become text nodes.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== null && v !== undefined && v !== false) e.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    }
    return e;
  }

  // ---- Times ------------------------------------------------------------
  // Times are shown relative to now ("3 min ago", "in 20 s"), as the
  // server renders them (relativeTime in dashboard.go), with the absolute
  // time in the title: the server writes it in UTC, the script in the
  // browser's time zone. "Now" is the server's: the page carries its
  // clock (data-now), so a browser whose clock is off still reads right.
  const skew = (Number(body.dataset.now) || Date.now()) - Date.now();
  const now = () => Date.now() + skew;

  // human is a duration to one unit, rounded down (humanDuration in
  // dashboard.go).
  function human(ms) {
    if (ms < 1000) return Math.floor(ms) + " ms";
    if (ms < 60e3) return Math.floor(ms / 1e3) + " s";
    if (ms < 3600e3) return Math.floor(ms / 60e3) + " min";
    if (ms < 48 * 3600e3) return Math.floor(ms / 3600e3) + " h";
    return Math.floor(ms / 86400e3) + " d";
  }
  function relText(ms) {
    const d = ms - now();
    if (Math.abs(d) < 1000) return "now";
    return d > 0 ? "in " + human(d) : human(-d) + " ago";
  }
  const pad = (n, w) => String(n).padStart(w || 2, "0");
  // absText is a time in the browser's zone, to the millisecond, with
  // the zone's offset.
  function absText(ms) {
    const t = new Date(ms);
    const off = -t.getTimezoneOffset();
    const zone = off === 0 ? "UTC" : "UTC" + (off > 0 ? "+" : "-") + pad(Math.floor(Math.abs(off) / 60)) + ":" + pad(Math.abs(off) % 60);
    return t.getFullYear() + "-" + pad(t.getMonth() + 1) + "-" + pad(t.getDate()) + " " + pad(t.getHours()) + ":" + pad(t.getMinutes()) + ":" + pad(t.getSeconds()) + "." + pad(t.getMilliseconds(), 3) + " " + zone;
  }
  // parseTime reads an API time (RFC 3339, microseconds) as ms.
  function parseTime(iso) {
    return Date.parse(String(iso).replace(/(\.\d{3})\d+/, "$1"));
  }
  // timeEl is the <time> element of an API time, or "–".
  function timeEl(iso) {
    if (!iso) return "–";
    const ms = parseTime(iso);
    if (isNaN(ms)) return String(iso);
    return el("time", { class: "rel", datetime: new Date(ms).toISOString(), title: absText(ms), "data-local": "1" }, relText(ms));
  }
  // tickTimes brings every relative time of the page up to date, and
  // gives the server's UTC titles the browser's zone.
  function tickTimes() {
    for (const t of document.querySelectorAll("time.rel")) {
      const ms = parseTime(t.getAttribute("datetime"));
      if (isNaN(ms)) continue;
      const text = relText(ms);
      if (t.textContent !== text) t.textContent = text;
      if (!t.dataset.local) { t.title = absText(ms); t.dataset.local = "1"; }
    }
  }
  tickTimes();
  setInterval(() => { if (!document.hidden) tickTimes(); }, 1000);

  // setLive writes the footer: "live · updated 2 s ago", the time
  // ticking on, or what failed.
  function setLive(what, iso) {
    const l = document.getElementById("live");
    if (!l) return;
    if (iso === undefined) { l.textContent = what; return; }
    l.replaceChildren("live · " + what + " ", timeEl(iso));
  }

  // getJSON fetches a live refresh. The header marks it as one: the
  // server logs a live refresh that succeeds at Debug, not Info.
  async function getJSON(url) {
    const r = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json", "X-Conveyor-Refresh": "live" } });
    if (r.status === 401) { location.reload(); throw new Error("logged out"); }
    if (!r.ok) throw new Error(url + ": " + r.status);
    return r.json();
  }

  // every runs f now and every ms while the page is visible.
  function every(ms, f) {
    let busy = false;
    const tick = async () => {
      if (busy || document.hidden) return;
      busy = true;
      try { await f(); } catch (e) { setLive("live update failed: " + e.message); } finally { busy = false; }
    };
    tick();
    setInterval(tick, ms);
  }

  function postForm(action, label, cls) {
    return el("form", { method: "post", action: action }, el("button", { type: "submit", class: cls }, label));
  }

  // ---- Queues page -------------------------------------------------------
  // limitLines is a queue's limits with their use, one line each, as
  // dashboard.go's limitLines says them.
  function limitLines(q) {
    const l = q.limits, u = q.limit_use || { running: 0, started: 0 };
    if (!l) return [];
    const out = [];
    if (l.max_running > 0) out.push(u.running + "/" + l.max_running + " running");
    if (l.rate > 0) out.push("rate " + u.started + "/" + l.rate + " per " + l.rate_period);
    const n = u.keys_running || 0, keys = n === 1 ? "1 key running" : n + " keys running";
    if (l.ordered && l.ordered_move_on) out.push("ordered by key, moving on: " + keys);
    else if (l.ordered) out.push("ordered by key: " + keys);
    else if (l.key_max_running > 0) out.push(l.key_max_running + " per key: " + keys);
    if (l.key_rate > 0) {
      const r = u.keys_rated || 0;
      out.push(l.key_rate + " per key per " + l.key_rate_period + ": " + (r === 1 ? "1 key at its rate" : r + " keys at their rate"));
    }
    if (l.fair) {
      const w = q.weighted_keys || 0;
      out.push(w === 0 ? "fair" : w === 1 ? "fair: 1 weighted key" : "fair: " + w + " weighted keys");
    }
    if ((l.ordered || l.key_max_running > 0 || l.key_rate > 0) && u.key_held > 0) out.push(u.key_held + " waiting for their key");
    return out;
  }

  function queueRow(q, states) {
    const enc = encodeURIComponent(q.queue);
    const tr = el("tr", { "data-queue": q.queue },
      el("td", { class: "name" }, el("a", { href: base + "/jobs?queue=" + enc }, q.queue)));
    for (const st of states) {
      tr.append(el("td", { class: "num st-" + st, "data-label": st },
        el("a", { href: base + "/jobs?queue=" + enc + "&state=" + encodeURIComponent(st) }, String(q.counts[st] || 0))));
    }
    tr.append(el("td", { "data-label": "oldest" }, q.oldest_available_ms === null ? "–" : human(q.oldest_available_ms)));
    tr.append(el("td", { class: "num procs", "data-label": "processes" }, q.unworked
      ? el("span", { class: "badge unworked", title: "jobs are available but no alive process works this queue" }, "⚠ no process")
      : String(q.processes)));
    const lines = limitLines(q);
    tr.append(el("td", { "data-label": "limits", class: "limits" }, ...(lines.length ? lines.map((l) => el("div", {}, l)) : ["–"])));
    const status = el("td", { "data-label": "status" }, q.paused ? el("span", { class: "badge paused" }, "paused") : el("span", { class: "badge active" }, "active"));
    if (q.held) status.append(" ", el("span", { class: "badge held held-" + q.held, title: "available jobs wait: " + q.held }, "held: " + q.held));
    if (q.awaiting_dependencies > 0) {
      status.append(" ", el("span", { class: "badge deps", title: "jobs not enqueued yet: they wait for the jobs they depend on to finish" }, q.awaiting_dependencies + " awaiting dependencies"));
    }
    tr.append(status);
    if (admin) {
      tr.append(el("td", {}, q.paused
        ? postForm(base + "/queues/" + enc + "/resume", "Resume", "resume")
        : postForm(base + "/queues/" + enc + "/pause", "Pause", "pause")));
    }
    return tr;
  }

  async function refreshQueues() {
    const d = await getJSON(base + "/api/v1/queues");
    const table = document.getElementById("queues");
    const states = [...table.querySelectorAll("thead th[data-state]")].map((th) => th.dataset.state);
    const rows = d.queues.map((q) => queueRow(q, states));
    if (!rows.length) rows.push(el("tr", { class: "empty" }, el("td", { colspan: "13" }, "No unfinished jobs, none finished in the last " + Math.round(d.finished_window_s / 60) + " min, no paused queue.")));
    table.tBodies[0].replaceChildren(...rows);
    const unworked = d.queues.filter((q) => q.unworked).map((q) => q.queue);
    document.getElementById("unworked-list").textContent = unworked.join(", ");
    document.getElementById("unworked").hidden = unworked.length === 0;
    await refreshProcesses();
    setLive("counts read", d.read_at);
  }

  function processRow(p) {
    const host = p.host + (p.pid === null ? "" : " · pid " + p.pid);
    const qs = el("span", { class: "qs" });
    for (const name of Object.keys(p.queues).sort()) {
      qs.append(el("a", { href: base + "/jobs?queue=" + encodeURIComponent(name) }, name),
        p.queues[name] ? " ×" + p.queues[name] + " " : " ");
    }
    if (!Object.keys(p.queues).length) qs.append(el("span", { class: "muted" }, "none (maintenance only)"));
    const name = el("td", { class: "name" }, p.id);
    if (p.self) name.append(" ", el("span", { class: "muted small" }, "(this server)"));
    return el("tr", { "data-process": p.id, class: p.alive ? null : "gone" },
      name,
      el("td", { "data-label": "kind" }, p.kind),
      el("td", { "data-label": "host" }, host),
      el("td", { "data-label": "queues" }, qs),
      el("td", { "data-label": "version" }, p.version === null ? "–" : p.version),
      el("td", { "data-label": "started" }, timeEl(p.started_at)),
      el("td", { "data-label": "heartbeat" }, timeEl(p.heartbeat_at)),
      el("td", { "data-label": "status" }, p.alive ? el("span", { class: "badge active" }, "alive") : el("span", { class: "badge gone" }, "gone")));
  }

  async function refreshProcesses() {
    const d = await getJSON(base + "/api/v1/processes");
    const rows = d.processes.map(processRow);
    if (!rows.length) rows.push(el("tr", { class: "empty" }, el("td", { colspan: "8" }, "No process works any queue: start a client (Client.Start) or an HTTP worker.")));
    document.getElementById("processes").tBodies[0].replaceChildren(...rows);
  }

  // ---- Charts -----------------------------------------------------------
  // Each chart has a time axis (the browser's clock time) and a value
  // axis with its unit, drawn at the SVG's size in pixels so that the
  // labels are not stretched; a line breaks where no sample was taken.
  function svgEl(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = text;
    return e;
  }
  // niceStep is a round step (1, 2, 2.5 or 5 times a power of ten) that
  // covers max in about n steps.
  function niceStep(max, n) {
    const raw = max / n;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }
  function fmtNum(v) {
    if (v >= 1e6) return +(v / 1e6).toFixed(1) + "M";
    if (v >= 1e4) return +(v / 1e3).toFixed(1) + "k";
    return String(+v.toFixed(2));
  }
  const timeSteps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200].map((s) => s * 1000);

  // drawChart draws lines (each {cls, values}, values[i] at times[i],
  // null for none) with axes: yTitle names the value axis and its unit.
  // gap is the spacing beyond which two samples are not joined.
  function drawChart(svg, note, times, lines, yTitle, gap) {
    const W = Math.max(240, Math.round(svg.clientWidth || 600));
    const H = Math.max(120, Math.round(svg.clientHeight || 180));
    const m = { l: 52, r: 12, t: 10, b: 36 };
    const pw = W - m.l - m.r, ph = H - m.t - m.b;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    let maxY = 0, points = 0;
    for (const l of lines) for (const v of l.values) if (v !== null && v !== undefined) { maxY = Math.max(maxY, v); points++; }
    const step = niceStep(maxY > 0 ? maxY : 1, 4);
    const top = Math.max(step, Math.ceil(maxY / step - 1e-9) * step);
    const y = (v) => m.t + ph - (v / top) * ph;
    const t1 = times.length ? times[times.length - 1] : now();
    const t0 = times.length > 1 ? times[0] : t1 - 60e3;
    const span = Math.max(1, t1 - t0);
    const x = (t) => m.l + ((t - t0) / span) * pw;
    const kids = [];

    const ay = svgEl("g", { class: "axis axis-y" });
    for (let v = 0; v <= top + step / 2; v += step) {
      ay.append(svgEl("line", { class: "grid", x1: m.l, x2: W - m.r, y1: y(v), y2: y(v) }),
        svgEl("text", { class: "tick", x: m.l - 6, y: y(v) + 4, "text-anchor": "end" }, fmtNum(v)));
    }
    ay.append(svgEl("line", { class: "domain", x1: m.l, x2: m.l, y1: m.t, y2: m.t + ph }),
      svgEl("text", { class: "axis-title", x: 12, y: m.t + ph / 2, "text-anchor": "middle", transform: "rotate(-90 12 " + (m.t + ph / 2) + ")" }, yTitle));
    kids.push(ay);

    const ax = svgEl("g", { class: "axis axis-x" });
    ax.append(svgEl("line", { class: "domain", x1: m.l, x2: W - m.r, y1: m.t + ph, y2: m.t + ph }));
    if (times.length > 1) {
      const want = Math.max(2, Math.floor(pw / 90));
      const ts = timeSteps.find((s) => span / s <= want) || 3600e3 * Math.ceil(span / want / 3600e3);
      for (let t = Math.ceil(t0 / ts) * ts; t <= t1; t += ts) {
        const d = new Date(t);
        const label = pad(d.getHours()) + ":" + pad(d.getMinutes()) + (ts < 60e3 ? ":" + pad(d.getSeconds()) : "");
        ax.append(svgEl("line", { class: "tick-mark", x1: x(t), x2: x(t), y1: m.t + ph, y2: m.t + ph + 4 }),
          svgEl("text", { class: "tick", x: x(t), y: m.t + ph + 16, "text-anchor": "middle" }, label));
      }
    }
    ax.append(svgEl("text", { class: "axis-title", x: m.l + pw / 2, y: H - 4, "text-anchor": "middle" }, "time (your clock)"));
    kids.push(ax);

    if (points < 2) {
      kids.push(svgEl("text", { class: "empty", x: m.l + pw / 2, y: m.t + ph / 2, "text-anchor": "middle" }, "collecting samples while this page is open…"));
      note.textContent = "";
    } else {
      for (const l of lines) {
        let pts = [], prev = null;
        const flush = () => { if (pts.length) kids.push(svgEl("polyline", { points: pts.join(" "), class: l.cls })); pts = []; };
        l.values.forEach((v, i) => {
          if (v === null || v === undefined) { flush(); prev = null; return; }
          if (prev !== null && times[i] - prev > gap) flush();
          pts.push(x(times[i]).toFixed(1) + "," + y(v).toFixed(1));
          prev = times[i];
        });
        flush();
      }
      note.textContent = "max " + fmtNum(maxY) + " · " + times.length + " samples";
    }
    svg.replaceChildren(...kids);
  }

  let lastSeries = null;
  function drawSeries(d) {
    lastSeries = d;
    const s = d.samples;
    const times = s.map((x) => parseTime(x.t));
    // Samples are taken every interval_ms while someone looks: a longer
    // gap means nobody did.
    const gap = Math.max(3 * (d.interval_ms || 5000), 10e3);
    const byID = (id) => document.getElementById(id);
    drawChart(byID("chart-depth"), byID("note-depth"), times, [
      { cls: "s-available", values: s.map((x) => x.available) },
      { cls: "s-running", values: s.map((x) => x.running) },
      { cls: "s-waiting", values: s.map((x) => x.waiting) },
    ], "jobs", gap);
    drawChart(byID("chart-rate"), byID("note-rate"), times, [
      { cls: "s-rate", values: s.map((x) => x.finished_per_s) },
    ], "jobs/s", gap);
    // The wait in seconds, minutes or hours, whichever reads best.
    const maxWait = Math.max(0, ...s.map((x) => x.oldest_available_ms));
    const [div, unit] = maxWait >= 2 * 3600e3 ? [3600e3, "h"] : maxWait >= 120e3 ? [60e3, "min"] : [1e3, "s"];
    drawChart(byID("chart-wait"), byID("note-wait"), times, [
      { cls: "s-wait", values: s.map((x) => x.oldest_available_ms / div) },
    ], "wait (" + unit + ")", gap);
    const last = s.length ? s[s.length - 1].finished_per_s : null;
    byID("rate-now").textContent = last === null || last === undefined ? "" : "now " + last.toFixed(1) + "/s";
  }

  async function refreshSeries() {
    drawSeries(await getJSON(base + "/api/v1/series"));
  }

  // ---- Jobs page ---------------------------------------------------------
  function jobRow(j, checked) {
    const tr = el("tr", { "data-id": String(j.id) });
    if (admin) {
      tr.append(el("td", { class: "sel" }, el("input", { type: "checkbox", name: "id", value: String(j.id), form: "bulk", "aria-label": "select job " + j.id, checked: checked.has(String(j.id)) })));
    }
    tr.append(
      el("td", {}, el("a", { href: base + "/jobs/" + encodeURIComponent(String(j.id)) }, String(j.id))),
      el("td", { "data-label": "queue" }, j.queue),
      el("td", { "data-label": "kind" }, j.kind),
      el("td", { class: "args-preview", "data-label": "args" }, j.args_preview),
      el("td", { "data-label": "state" }, el("span", { class: "badge st-" + j.state }, j.state)),
      el("td", { class: "num", "data-label": "attempt" }, j.attempt + "/" + j.max_attempts),
      el("td", { "data-label": "created" }, timeEl(j.created_at)),
      el("td", { "data-label": "scheduled" }, timeEl(j.scheduled_at)),
      el("td", { class: "err", "data-label": "error" }, j.last_error || ""));
    return tr;
  }

  // checkedIDs are the ids ticked for a bulk action, kept across redraws.
  function checkedIDs() {
    return new Set([...document.querySelectorAll('#jobs input[name="id"]:checked')].map((c) => c.value));
  }

  // listURL is the job list's address with filters and a cursor, as
  // the server links it (pageJobs), without a bulk action's message.
  function listURL(cursor, id) {
    const q = new URLSearchParams(location.search);
    for (const k of ["after", "before", "order", "bulk", "done", "refused"]) q.delete(k);
    if (cursor) q.set(cursor, String(id));
    const s = q.toString();
    return base + "/jobs" + (s ? "?" + s : "");
  }

  async function refreshJobs() {
    // The page as the server read it: newest first from before= (or
    // from the top), or, with after=, the newer page read in id order
    // and shown newest first. Summary rows: a preview of the arguments
    // and the last error's first line, whatever the jobs hold.
    const page = new URLSearchParams(location.search);
    const newer = Number(page.get("after") || 0) > 0;
    const q = new URLSearchParams(page);
    q.set("view", "summary");
    q.set("order", newer ? "asc" : "desc");
    const d = await getJSON(base + "/api/v1/jobs?" + q.toString());
    const jobs = newer ? d.jobs.slice().reverse() : d.jobs;
    const checked = checkedIDs();
    const rows = jobs.map((j) => jobRow(j, checked));
    if (!rows.length) rows.push(el("tr", { class: "empty" }, el("td", { colspan: "10" }, "No jobs match.")));
    document.getElementById("jobs").tBodies[0].replaceChildren(...rows);
    // Newest first, the older page starts below the last job shown now:
    // on the newest page, new jobs push jobs down past the bottom, and
    // the Older link follows, so that none is skipped.
    const older = document.getElementById("older-page");
    if (older && !newer) {
      older.hidden = d.next_before === null;
      if (d.next_before !== null) older.href = listURL("before", d.next_before);
    }
    setLive("updated", new Date(now()).toISOString());
  }

  // ---- Job page ----------------------------------------------------------
  const retryable = ["discarded", "cancelled", "completed", "retryable", "scheduled"];
  const stoppable = ["available", "scheduled", "running", "retryable"];

  async function refreshJob() {
    const id = document.getElementById("job-id").textContent;
    const j = await getJSON(base + "/api/v1/jobs/" + encodeURIComponent(id));
    const st = document.getElementById("job-state");
    st.textContent = j.state;
    st.className = "badge st-" + j.state;
    const set = (f, v) => { const e = document.querySelector('[data-field="' + f + '"]'); if (e) e.replaceChildren(v); };
    set("attempt", j.attempt + " of " + j.max_attempts);
    for (const f of ["created_at", "scheduled_at", "attempted_at", "lease_expires_at", "finalized_at"]) set(f, timeEl(j[f]));
    set("attempted_by", j.attempted_by || "–");
    const errs = j.errors.map((e) => {
      const li = el("li", {}, el("div", { class: "meta" }, "attempt " + e.attempt + " · ", timeEl(e.at)), el("pre", { class: "error-text" }, e.error));
      if (e.trace) li.append(el("details", {}, el("summary", {}, "stack trace"), el("pre", { class: "trace" }, e.trace)));
      return li;
    });
    if (!errs.length) errs.push(el("li", { class: "none muted" }, "none"));
    document.getElementById("errors").replaceChildren(...errs);
    document.getElementById("err-count").textContent = String(j.errors.length);
    // A result appears when the job completes while the page is open.
    const res = document.getElementById("job-result");
    if (res && res.hidden && j.result !== null && j.result !== undefined) {
      res.textContent = JSON.stringify(j.result, null, 2);
      res.hidden = false;
      const none = document.getElementById("job-result-none");
      if (none) none.hidden = true;
    }
    for (const f of document.querySelectorAll("#actions form")) {
      const a = f.dataset.action;
      f.hidden = !(a === "retry" ? retryable.includes(j.state) : stoppable.includes(j.state));
    }
    setLive("updated", new Date(now()).toISOString());
  }

  switch (body.dataset.page) {
    case "queues": {
      every(2000, refreshQueues);
      every(5000, refreshSeries);
      // The charts are drawn at their size in pixels: again when it
      // changes.
      let pending = 0;
      window.addEventListener("resize", () => {
        clearTimeout(pending);
        pending = setTimeout(() => { if (lastSeries) drawSeries(lastSeries); }, 150);
      });
      break;
    }
    case "jobs": {
      const all = document.getElementById("select-all");
      if (all) {
        all.addEventListener("change", () => {
          for (const c of document.querySelectorAll('#jobs input[name="id"]')) c.checked = all.checked;
        });
      }
      // A search of the arguments reads up to thousands of rows: it is
      // not repeated in the background.
      if (!new URLSearchParams(location.search).get("q")) every(3000, refreshJobs);
      break;
    }
    case "job":
      every(2000, refreshJob);
      break;
  }
})();
