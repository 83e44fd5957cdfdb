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

  function fmtTime(t) {
    if (!t) return "–";
    return t.replace("T", " ").replace(/(\.\d{3})\d*/, "$1").replace(/\+00:00$|Z$/, "Z");
  }
  function fmtMS(ms) {
    if (ms === null || ms === undefined) return "–";
    if (ms < 1000) return ms + "ms";
    const s = ms / 1000;
    if (s < 60) return s.toFixed(3).replace(/\.?0+$/, "") + "s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + "m" + Math.round(s % 60) + "s";
    return Math.floor(m / 60) + "h" + (m % 60) + "m";
  }

  function setLive(text) {
    const l = document.getElementById("live");
    if (l) l.textContent = text;
  }

  async function getJSON(url) {
    const r = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
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
  function queueRow(q, states) {
    const enc = encodeURIComponent(q.queue);
    const tr = el("tr", { "data-queue": q.queue },
      el("td", { class: "name" }, el("a", { href: base + "/jobs?queue=" + enc }, q.queue)));
    for (const st of states) {
      tr.append(el("td", { class: "num st-" + st, "data-label": st },
        el("a", { href: base + "/jobs?queue=" + enc + "&state=" + encodeURIComponent(st) }, String(q.counts[st] || 0))));
    }
    tr.append(el("td", { "data-label": "oldest" }, q.oldest_available_ms === null ? "–" : fmtMS(q.oldest_available_ms)));
    tr.append(el("td", { class: "num procs", "data-label": "processes" }, q.unworked
      ? el("span", { class: "badge unworked", title: "jobs are available but no alive process works this queue" }, "⚠ no process")
      : String(q.processes)));
    tr.append(el("td", { "data-label": "status" }, q.paused ? el("span", { class: "badge paused" }, "paused") : el("span", { class: "badge active" }, "active")));
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
    if (!rows.length) rows.push(el("tr", { class: "empty" }, el("td", { colspan: "12" }, "No unfinished jobs, none finished in the last " + Math.round(d.finished_window_s / 60) + " min, no paused queue.")));
    table.tBodies[0].replaceChildren(...rows);
    const unworked = d.queues.filter((q) => q.unworked).map((q) => q.queue);
    document.getElementById("unworked-list").textContent = unworked.join(", ");
    document.getElementById("unworked").hidden = unworked.length === 0;
    await refreshProcesses();
    setLive("live · counts read " + fmtTime(d.read_at));
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
      el("td", { "data-label": "started" }, fmtTime(p.started_at)),
      el("td", { "data-label": "heartbeat" }, fmtTime(p.heartbeat_at)),
      el("td", { "data-label": "status" }, p.alive ? el("span", { class: "badge active" }, "alive") : el("span", { class: "badge gone" }, "gone")));
  }

  async function refreshProcesses() {
    const d = await getJSON(base + "/api/v1/processes");
    const rows = d.processes.map(processRow);
    if (!rows.length) rows.push(el("tr", { class: "empty" }, el("td", { colspan: "8" }, "No process works any queue: start a client (Client.Start) or an HTTP worker.")));
    document.getElementById("processes").tBodies[0].replaceChildren(...rows);
  }

  // drawChart draws lines into svg and writes the scale into note (text
  // outside the SVG, which is stretched to its box).
  function drawChart(svg, note, lines, unit) {
    const W = 600, H = 160, pad = 14;
    let maxY = 0, n = 0;
    for (const l of lines) { n = Math.max(n, l.values.length); for (const v of l.values) if (v !== null) maxY = Math.max(maxY, v); }
    if (n < 2) {
      svg.replaceChildren();
      note.textContent = "collecting samples while this page is open…";
      return;
    }
    const top = maxY > 0 ? maxY * 1.1 : 1;
    const kids = [];
    for (const l of lines) {
      const pts = [];
      l.values.forEach((v, i) => {
        if (v === null) return;
        const x = (i / (n - 1)) * W;
        const y = H - pad - (v / top) * (H - 2 * pad);
        pts.push(x.toFixed(1) + "," + y.toFixed(1));
      });
      const p = document.createElementNS(SVG, "polyline");
      p.setAttribute("points", pts.join(" "));
      p.setAttribute("class", l.cls);
      kids.push(p);
    }
    svg.replaceChildren(...kids);
    note.textContent = "max " + (Math.round(maxY * 10) / 10) + unit + " · " + n + " samples";
  }

  async function refreshSeries() {
    const d = await getJSON(base + "/api/v1/series");
    const s = d.samples;
    const note = (id) => document.getElementById(id);
    drawChart(note("chart-depth"), note("note-depth"), [
      { cls: "s-available", values: s.map((x) => x.available) },
      { cls: "s-running", values: s.map((x) => x.running) },
      { cls: "s-waiting", values: s.map((x) => x.waiting) },
    ], " jobs");
    drawChart(note("chart-rate"), note("note-rate"), [
      { cls: "s-rate", values: s.map((x) => x.finished_per_s) },
    ], "/s");
    drawChart(note("chart-wait"), note("note-wait"), [
      { cls: "s-wait", values: s.map((x) => x.oldest_available_ms / 1000) },
    ], "s");
    const last = s.length ? s[s.length - 1].finished_per_s : null;
    document.getElementById("rate-now").textContent = last === null ? "" : "now " + last.toFixed(1) + "/s";
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
      el("td", { "data-label": "scheduled" }, fmtTime(j.scheduled_at)),
      el("td", { class: "err", "data-label": "error" }, j.last_error || ""));
    return tr;
  }

  // checkedIDs are the ids ticked for a bulk action, kept across redraws.
  function checkedIDs() {
    return new Set([...document.querySelectorAll('#jobs input[name="id"]:checked')].map((c) => c.value));
  }

  async function refreshJobs() {
    // Summary rows: a preview of the arguments and the last error's
    // first line, whatever the jobs hold.
    const q = new URLSearchParams(location.search);
    q.set("view", "summary");
    const d = await getJSON(base + "/api/v1/jobs?" + q.toString());
    const checked = checkedIDs();
    const rows = d.jobs.map((j) => jobRow(j, checked));
    if (!rows.length) rows.push(el("tr", { class: "empty" }, el("td", { colspan: "9" }, "No jobs match.")));
    document.getElementById("jobs").tBodies[0].replaceChildren(...rows);
    setLive("live · " + new Date().toISOString().slice(11, 19) + "Z");
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
    const set = (f, v) => { const e = document.querySelector('[data-field="' + f + '"]'); if (e) e.textContent = v; };
    set("attempt", j.attempt + " of " + j.max_attempts);
    for (const f of ["created_at", "scheduled_at", "attempted_at", "lease_expires_at", "finalized_at"]) set(f, fmtTime(j[f]));
    set("attempted_by", j.attempted_by || "–");
    const errs = j.errors.map((e) => {
      const li = el("li", {}, el("div", { class: "meta" }, "attempt " + e.attempt + " · " + fmtTime(e.at)), el("pre", { class: "error-text" }, e.error));
      if (e.trace) li.append(el("details", {}, el("summary", {}, "stack trace"), el("pre", { class: "trace" }, e.trace)));
      return li;
    });
    if (!errs.length) errs.push(el("li", { class: "none muted" }, "none"));
    document.getElementById("errors").replaceChildren(...errs);
    document.getElementById("err-count").textContent = String(j.errors.length);
    for (const f of document.querySelectorAll("#actions form")) {
      const a = f.dataset.action;
      f.hidden = !(a === "retry" ? retryable.includes(j.state) : stoppable.includes(j.state));
    }
    setLive("live · " + new Date().toISOString().slice(11, 19) + "Z");
  }

  switch (body.dataset.page) {
    case "queues":
      every(2000, refreshQueues);
      every(5000, refreshSeries);
      break;
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
