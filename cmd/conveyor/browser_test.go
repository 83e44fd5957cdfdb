package main

// End-to-end tests of the dashboard in headless Chromium (Debian's
// chromium, driven with chromedp). Locally they skip, saying why, when no
// browser is installed; with CI=true they fail instead. Everything listens
// on 127.0.0.1 and every step is bounded in time.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

const (
	browserAdminToken = "browser-admin-token-0123456789"
	browserROToken    = "browser-read-only-token-012345"
)

// chromium returns the browser to run, or skips (fails with CI=true).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CONVEYOR_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium not installed, and CI=true requires the browser tests: .ci/run installs Debian's chromium")
	}
	t.Skip("chromium not installed: apt-get install chromium (or set CONVEYOR_CHROMIUM) to run the browser tests")
	return ""
}

// browser is one headless Chromium with a fresh profile.
type browser struct {
	t       *testing.T
	ctx     context.Context
	dialogs atomic.Int32 // JavaScript dialogs opened (alert, confirm, prompt)
}

func newBrowser(t *testing.T, width, height int) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-first-run", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
	)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelA() })
	b := &browser{t: t, ctx: ctx}
	// The first call starts the browser: it is bounded by a timer that
	// cancels, not by a deadline on ctx (which would stop the browser).
	started := make(chan error, 1)
	go func() { _, err := chromedp.Run(ctx, chromedp.Evaluate[int](`1`)); started <- err }()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("starting chromium: %v", err)
		}
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatal("chromium did not start in 60s")
	}
	if err := chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			b.dialogs.Add(1)
		}
	}); err != nil {
		t.Fatal(err)
	}
	return b
}

// do runs actions, bounded.
func (b *browser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// eval returns a JavaScript expression's value as JSON.
func (b *browser) eval(js string) (string, error) {
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[[]byte](js, chromedp.EvalAwaitPromise))
	return string(raw), err
}

// waitFor waits up to 45s for a JavaScript condition to be true, across
// navigations.
func (b *browser) waitFor(what, js string) {
	b.t.Helper()
	deadline := time.Now().Add(45 * time.Second) // generous: the suite runs beside every other package
	for {
		v, err := b.eval("!!(" + js + ")")
		if err == nil && v == "true" {
			return
		}
		if time.Now().After(deadline) {
			state, _ := b.eval(`location.href + " :: " + document.body.innerText.slice(0, 600)`)
			b.t.Fatalf("waiting for %s (%s): %v; page: %s", what, js, err, state)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// click clicks the element selector matches, as a user would, in one
// step of the page's own script: the live updates redraw table rows, and a
// node found in one DevTools call can be gone by the next (chromedp's
// Click looks the node up, then clicks it). It waits until the element
// exists.
func (b *browser) click(what, selector string) {
	b.t.Helper()
	sel := jsString(selector)
	b.waitFor(what, "document.querySelector("+sel+")")
	if _, err := b.eval("(document.querySelector(" + sel + ").click(), true)"); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

func (b *browser) navigate(url string) { b.t.Helper(); b.do("navigate "+url, chromedp.Navigate(url)) }

// api calls the server's JSON API with the admin token.
func api(t *testing.T, method, url string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		j, _ := json.Marshal(body)
		rd = bytes.NewReader(j)
	}
	r, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Authorization", "Bearer "+browserAdminToken)
	cl := &http.Client{Timeout: 30 * time.Second}
	res, err := cl.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %d %s", method, url, res.StatusCode, b)
		}
	}
	return res.StatusCode
}

// claimed is a job of a claim's answer.
type claimed struct {
	ID    int64 `json:"id"`
	Fence int64 `json:"fence"`
}

// serveForBrowser starts `conveyor serve` on a fresh SQLite database with
// an admin and a read-only token, and returns its base URL.
func serveForBrowser(t *testing.T, extra ...string) string {
	return serveForBrowserLogging(t, io.Discard, extra...)
}

// serveForBrowserLogging is serveForBrowser with the server's log going
// to stderr.
func serveForBrowserLogging(t *testing.T, stderr io.Writer, extra ...string) string {
	dir := t.TempDir()
	dsn := filepath.Join(dir, "q.db")
	mustCLI(t, "migrate", "--db", dsn)
	os.WriteFile(filepath.Join(dir, "admin"), []byte(browserAdminToken+"\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "ro"), []byte(browserROToken+"\n"), 0o600)
	return serveLogging(t, stderr, append([]string{"--db", dsn, "--token-file", filepath.Join(dir, "admin"), "--read-only-token-file", filepath.Join(dir, "ro")}, extra...)...)
}

// xssPayload goes into a job's arguments and error; it must stay text.
const xssPayload = `<script>alert(1)</script> "><img src=x onerror=alert(1)> '><svg onload=alert(1)>`

func TestBrowserDashboard(t *testing.T) {
	chromium(t)
	base := serveForBrowser(t)
	b := newBrowser(t, 1280, 900)

	// Without credentials only the login is reachable.
	for _, p := range []string{"/", "/jobs", "/jobs/1", "/no-such-page"} {
		b.navigate(base + p)
		b.waitFor("the login on "+p, `document.querySelector("#token") && !document.querySelector("#queues, #jobs, #job-id")`)
	}
	if v, _ := b.eval(`fetch("` + base + `/api/v1/queues").then(r => r.status)`); v != "401" {
		t.Errorf("API without credentials from the browser: %s", v)
	}

	// Log in with the admin token.
	b.navigate(base + "/login")
	b.do("log in", chromedp.SetValue(chromedp.CSS("#token"), browserAdminToken), chromedp.Click(chromedp.CSS("#login-token button")))
	b.waitFor("the queues page", `document.body.dataset.page === "queues"`)

	// A queue fills and drains, seen without reloading the page.
	b.do("mark the page", chromedp.Evaluate[chromedp.Void](`window.__noReload = 1`))
	jobs := make([]map[string]any, 40)
	for i := range jobs {
		jobs[i] = map[string]any{"kind": "resize", "queue": "fill", "args": map[string]int{"n": i}}
	}
	if s := api(t, "POST", base+"/api/v1/jobs/batch", map[string]any{"jobs": jobs}, nil); s != 201 {
		t.Fatalf("batch enqueue: %d", s)
	}
	cell := func(q, st string) string {
		return fmt.Sprintf(`(document.querySelector('tr[data-queue="%s"] td.st-%s') || {}).textContent`, q, st)
	}
	b.waitFor("40 available in fill", cell("fill", "available")+` === "40"`)
	// Nothing works fill: the queue is flagged, in its row and above the
	// table; the serving process is listed, working no queue.
	b.waitFor("fill flagged as unworked", `document.querySelector('tr[data-queue="fill"] .badge.unworked') && document.querySelector('tr[data-queue="fill"] .badge.unworked').textContent.includes("no process")`+
		` && !document.querySelector("#unworked").hidden && document.querySelector("#unworked-list").textContent === "fill"`)
	b.waitFor("the serving process listed", `[...document.querySelectorAll("#processes tr[data-process]")].some(tr => tr.querySelector("td.name").textContent.includes("(this server)")`+
		` && tr.querySelector('td[data-label="queues"]').textContent === "none (maintenance only)" && tr.querySelector(".badge.active").textContent === "alive")`)
	var c struct{ Jobs []claimed }
	api(t, "POST", base+"/api/v1/claim", map[string]any{"queue": "fill", "limit": 40}, &c)
	if len(c.Jobs) != 40 {
		t.Fatalf("claimed %d", len(c.Jobs))
	}
	b.waitFor("40 running in fill", cell("fill", "running")+` === "40"`)
	// The HTTP worker that claimed them is listed as working fill (an
	// unnamed worker is listed by its host), and fill's row counts it.
	b.waitFor("the HTTP worker listed", `document.querySelector('#processes tr[data-process="http:127.0.0.1"]') && document.querySelector('#processes tr[data-process="http:127.0.0.1"]').textContent.includes("fill")`+
		` && document.querySelector('tr[data-queue="fill"] td.procs').textContent === "1" && document.querySelector("#unworked").hidden`+
		` && document.querySelectorAll("#queues thead th").length === document.querySelectorAll('tr[data-queue="fill"] td').length`)
	for _, j := range c.Jobs {
		if s := api(t, "POST", fmt.Sprintf("%s/api/v1/jobs/%d/complete", base, j.ID), map[string]any{"fence": j.Fence}, nil); s != 200 {
			t.Fatalf("complete: %d", s)
		}
	}
	b.waitFor("fill drained", cell("fill", "completed")+` === "40" && `+cell("fill", "available")+` === "0" && `+cell("fill", "running")+` === "0" && window.__noReload === 1`)

	// Pause and resume the queue with the buttons.
	b.click("pause", `tr[data-queue="fill"] button.pause`)
	b.waitFor("fill paused", `document.querySelector('tr[data-queue="fill"] .badge.paused') && document.querySelector(".flash")`)
	var qs struct {
		Queues []struct {
			Queue  string
			Paused bool
		}
	}
	api(t, "GET", base+"/api/v1/queues", nil, &qs)
	if len(qs.Queues) != 1 || !qs.Queues[0].Paused {
		t.Fatalf("after pause: %+v", qs)
	}
	b.click("resume", `tr[data-queue="fill"] button.resume`)
	b.waitFor("fill resumed", `document.querySelector('tr[data-queue="fill"] .badge.active')`)

	// A job fails for good, with markup in its arguments and its error.
	var one struct{ ID int64 }
	api(t, "POST", base+"/api/v1/jobs", map[string]any{"kind": "flaky", "queue": "fill", "max_attempts": 1, "args": map[string]string{"note": xssPayload}}, &one)
	api(t, "POST", base+"/api/v1/claim", map[string]any{"queue": "fill"}, &c)
	if len(c.Jobs) != 1 || c.Jobs[0].ID != one.ID {
		t.Fatalf("claimed %+v", c.Jobs)
	}
	if s := api(t, "POST", fmt.Sprintf("%s/api/v1/jobs/%d/fail", base, one.ID), map[string]any{"fence": c.Jobs[0].Fence, "error": "boom: " + xssPayload, "trace": "trace " + xssPayload}, nil); s != 200 {
		t.Fatalf("fail: %d", s)
	}

	// Filter the job list down to it and open it.
	b.navigate(base + "/jobs")
	b.waitFor("the job list", `document.querySelectorAll("#jobs tbody tr[data-id]").length === 41`)
	b.do("filter", chromedp.SetValue(chromedp.CSS("#f-state"), "discarded"), chromedp.SetValue(chromedp.CSS("#f-kind"), "flaky"), chromedp.Click(chromedp.CSS(`#filters button[type="submit"]`)))
	b.waitFor("the filtered list", `location.search.includes("state=discarded") && document.querySelectorAll("#jobs tbody tr[data-id]").length === 1`)
	b.click("open the job", fmt.Sprintf(`#jobs a[href$="/jobs/%d"]`, one.ID))
	b.waitFor("the job page", `document.body.dataset.page === "job" && document.querySelector("#job-state").textContent === "discarded"`)
	inert := `document.querySelector("#errors pre.error-text").textContent.includes(` + jsString(xssPayload) + `)` +
		` && document.querySelector("#job-args").textContent.includes(` + jsString(`"><img src=x onerror=alert(1)>`) + `)` +
		` && document.querySelectorAll("img, svg:not(.chart), main script").length === 0` +
		` && [...document.scripts].every(s => !s.textContent.includes("alert"))`
	b.waitFor("the payloads shown as text", inert)
	time.Sleep(2500 * time.Millisecond) // the live update redraws the errors
	b.waitFor("the payloads still text after a live update", inert)

	// The job list's live rows (drawn by the script) keep them text too.
	b.navigate(base + "/jobs?kind=flaky")
	time.Sleep(3500 * time.Millisecond)
	b.waitFor("the error in the list as text", `document.querySelector("#jobs td.err").textContent.includes("<script>alert(1)</script>") && document.querySelectorAll("main img").length === 0`)

	// Retry it from its page.
	b.navigate(fmt.Sprintf("%s/jobs/%d", base, one.ID))
	b.click("retry", `#actions form[data-action="retry"] button`)
	b.waitFor("the job retried", `document.querySelector("#job-state").textContent === "available" && document.querySelector(".flash")`)

	// Bulk: tick every completed job of the list and retry them at once.
	b.navigate(base + "/jobs?kind=resize&state=completed")
	b.waitFor("40 completed jobs listed", `document.querySelectorAll('#jobs input[name="id"]').length === 40`)
	b.do("bulk retry", chromedp.Click(chromedp.CSS("#select-all")), chromedp.SetValue(chromedp.CSS("#bulk-action"), "retry"), chromedp.Click(chromedp.CSS("#bulk-go")))
	b.waitFor("the bulk result", `document.querySelector(".flash") && document.querySelector(".flash").textContent.includes("Retried 40 job(s).")`)
	b.navigate(base + "/")
	b.waitFor("40 available again", cell("fill", "available")+` === "41"`)

	// Limit the queue with the form: its row shows the limits and their
	// use; paused, its waiting jobs are marked held by the pause; the
	// form clears the limits again.
	b.do("set limits", chromedp.SetValue(chromedp.CSS("#l-queue"), "fill"), chromedp.SetValue(chromedp.CSS("#l-max"), "5"),
		chromedp.SetValue(chromedp.CSS("#l-rate"), "10"), chromedp.SetValue(chromedp.CSS("#l-per"), "1m"))
	b.click("set limits", "#l-set")
	limits := `document.querySelector('tr[data-queue="fill"] td.limits').innerText`
	b.waitFor("fill limited", `document.querySelector(".flash") && document.querySelector(".flash").textContent.includes("limits are set")`+
		` && `+limits+`.includes("0/5 running") && `+limits+`.includes("rate 0/10 per 1m")`)
	var lim struct {
		Limits *struct {
			MaxRunning int    `json:"max_running"`
			Rate       int    `json:"rate"`
			RatePeriod string `json:"rate_period"`
		} `json:"limits"`
	}
	api(t, "GET", base+"/api/v1/queues/fill/limits", nil, &lim)
	if lim.Limits == nil || lim.Limits.MaxRunning != 5 || lim.Limits.Rate != 10 || lim.Limits.RatePeriod != "1m" {
		t.Fatalf("limits set by the form: %+v", lim.Limits)
	}
	b.click("pause the limited queue", `tr[data-queue="fill"] button.pause`)
	b.waitFor("fill held by the pause", `document.querySelector('tr[data-queue="fill"] .badge.held') && document.querySelector('tr[data-queue="fill"] .badge.held').textContent === "held: paused"`)
	b.click("resume the limited queue", `tr[data-queue="fill"] button.resume`)
	b.waitFor("fill no longer held", `document.querySelector('tr[data-queue="fill"] .badge.active') && !document.querySelector('tr[data-queue="fill"] .badge.held')`)
	// A bad value is refused, naming it, and changes nothing.
	b.do("bad limits", chromedp.SetValue(chromedp.CSS("#l-queue"), "fill"), chromedp.SetValue(chromedp.CSS("#l-rate"), "10"), chromedp.SetValue(chromedp.CSS("#l-per"), "soon"))
	b.click("set bad limits", "#l-set")
	b.waitFor("the refusal", `document.body.innerText.includes('rate period "soon" is not a duration')`)
	b.navigate(base + "/")
	b.do("clear limits", chromedp.SetValue(chromedp.CSS("#l-queue"), "fill"))
	b.click("clear limits", "#l-clear")
	b.waitFor("fill unlimited", `document.querySelector(".flash") && document.querySelector(".flash").textContent.includes("limits are cleared")`+
		` && `+limits+` === "–"`)
	lim.Limits = nil
	api(t, "GET", base+"/api/v1/queues/fill/limits", nil, &lim)
	if lim.Limits != nil {
		t.Fatalf("limits after clearing by the form: %+v", lim.Limits)
	}

	// A form on another origin cannot pause the queue, although the
	// browser holds the session cookie (same site: only the port differs).
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<form id="f" method="post" action="%s/queues/fill/pause"></form><script>document.getElementById("f").submit()</script>`, base)
	}))
	defer evil.Close()
	b.navigate(evil.URL)
	b.waitFor("the refusal", `document.body.innerText.includes("cross-origin request refused")`)
	api(t, "GET", base+"/api/v1/queues", nil, &qs)
	if qs.Queues[0].Paused {
		t.Error("a cross-origin form paused the queue")
	}

	if n := b.dialogs.Load(); n != 0 {
		t.Errorf("%d JavaScript dialogs opened: a payload ran", n)
	}
}

// rowIDs is the script that lists the job list's ids, top to bottom, as
// text: "[9,8,7]".
const rowIDs = `JSON.stringify([...document.querySelectorAll("#jobs tbody tr[data-id]")].map(tr => +tr.dataset.id))`

// The job list reads newest first and pages both ways by id, also while
// jobs are enqueued; times read relative to now with the absolute time
// on hover; every chart has a labelled time axis and a value axis with
// its unit; the page's live refreshes leave the server's log (at Info)
// alone.
func TestBrowserListsTimesCharts(t *testing.T) {
	chromium(t)
	var logs syncBuffer
	base := serveForBrowserLogging(t, &logs, "--sample-interval", "500ms")
	b := newBrowser(t, 1280, 900)
	b.navigate(base + "/login")
	b.do("log in", chromedp.SetValue(chromedp.CSS("#token"), browserROToken), chromedp.Click(chromedp.CSS("#login-token button")))
	b.waitFor("the queues page", `document.body.dataset.page === "queues"`)

	var ids []int64
	for i := range 8 {
		var one struct{ ID int64 }
		api(t, "POST", base+"/api/v1/jobs", map[string]any{"kind": "page", "queue": "pg", "args": map[string]int{"n": i}}, &one)
		ids = append(ids, one.ID)
	}
	list := func(is ...int64) string { b, _ := json.Marshal(is); return string(b) }

	// Newest first, three to a page.
	b.navigate(base + "/jobs?queue=pg&limit=3")
	b.waitFor("the newest three first", rowIDs+` === `+jsString(list(ids[7], ids[6], ids[5]))+` && !document.querySelector("#newer-page") && !document.querySelector("#older-page").hidden`)
	// Older, then Newer: back to the same jobs.
	b.click("Older", "#older-page")
	b.waitFor("the next three", `location.search.includes("before=") && `+rowIDs+` === `+jsString(list(ids[4], ids[3], ids[2])))
	b.click("Older again", "#older-page")
	b.waitFor("the last two", rowIDs+` === `+jsString(list(ids[1], ids[0]))+` && document.querySelector("#older-page").hidden`)
	b.click("Newer", "#newer-page")
	b.waitFor("the middle page again", `location.search.includes("after=") && `+rowIDs+` === `+jsString(list(ids[4], ids[3], ids[2])))
	b.click("Newer again", "#newer-page")
	b.waitFor("the first page again", rowIDs+` === `+jsString(list(ids[7], ids[6], ids[5])))
	b.click("Newest", "#newest-page")
	b.waitFor("the newest page", `!location.search.includes("after=") && !location.search.includes("before=") && `+rowIDs+` === `+jsString(list(ids[7], ids[6], ids[5])))

	// Two jobs arrive while the newest page is open: the live refresh
	// shows them on top, and Older then starts below the last job shown
	// now, so that none is skipped.
	for i := range 2 {
		var one struct{ ID int64 }
		api(t, "POST", base+"/api/v1/jobs", map[string]any{"kind": "page", "queue": "pg", "args": map[string]int{"n": 8 + i}}, &one)
		ids = append(ids, one.ID)
	}
	b.waitFor("the new jobs on top", rowIDs+` === `+jsString(list(ids[9], ids[8], ids[7])))
	b.click("Older after the refresh", "#older-page")
	b.waitFor("the jobs pushed down", rowIDs+` === `+jsString(list(ids[6], ids[5], ids[4])))

	// Relative times with the absolute time on hover, in the browser's
	// zone once the script has run, on the server's rows and on those the
	// live refresh draws.
	absRE := `/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC([+-]\d\d:\d\d)?$/`
	relTimes := `[...document.querySelectorAll("#jobs td[data-label=created] time.rel")]`
	timesOK := relTimes + `.length === 3 && ` + relTimes + `.every(t => /^(now|\d+ s ago|\d+ min ago)$/.test(t.textContent) && ` + absRE + `.test(t.title) && !isNaN(Date.parse(t.getAttribute("datetime"))))`
	b.navigate(base + "/jobs?queue=pg&limit=3")
	b.waitFor("relative created times with absolute titles", timesOK)
	b.do("mark the rows", chromedp.Evaluate[chromedp.Void](`document.querySelector("#jobs tbody tr").dataset.old = "1"`))
	b.waitFor("the rows redrawn by the live refresh", `!document.querySelector("#jobs tbody tr[data-old]") && `+timesOK)
	var later struct{ ID int64 }
	api(t, "POST", base+"/api/v1/jobs", map[string]any{"kind": "later", "queue": "later", "delay_ms": 3_600_000}, &later)
	b.navigate(fmt.Sprintf("%s/jobs/%d", base, later.ID))
	b.waitFor("the job's times", `/^in (59 min|1 h)$/.test(document.querySelector('[data-field="scheduled_at"] time.rel').textContent)`+
		` && `+absRE+`.test(document.querySelector('[data-field="scheduled_at"] time.rel').title)`+
		` && /^(now|\d+ s ago)$/.test(document.querySelector('[data-field="created_at"] time.rel').textContent)`+
		` && document.querySelector('[data-field="finalized_at"]').textContent === "–"`)

	// Charts: every one has its axes' titles from the start, and tick
	// labels on both axes once samples come in.
	b.navigate(base + "/")
	charts := map[string]string{"chart-depth": "jobs", "chart-rate": "jobs/s", "chart-wait": "wait (s)"}
	for id, unit := range charts {
		c := `document.querySelector("#` + id + `")`
		b.waitFor(id+"'s axes", c+`.querySelector(".axis-x .axis-title").textContent === "time (your clock)"`+
			` && `+c+`.querySelector(".axis-y .axis-title").textContent === `+jsString(unit)+
			` && `+c+`.querySelectorAll(".axis-x text.tick").length >= 2`+
			` && [...`+c+`.querySelectorAll(".axis-x text.tick")].every(x => /^\d\d:\d\d(:\d\d)?$/.test(x.textContent))`+
			` && `+c+`.querySelectorAll(".axis-y text.tick").length >= 2 && `+c+`.querySelector(".axis-y text.tick").textContent === "0"`+
			` && `+c+`.querySelectorAll("polyline").length > 0`)
	}
	// The footer says when the counts were read, relative and ticking.
	b.waitFor("the live footer", `/^live · counts read (now|\d+ s ago)$/.test(document.querySelector("#live").textContent)`)

	// The server logged the pages and the login at Info, and none of the
	// dozens of live refreshes made meanwhile.
	log := logs.String()
	if !strings.Contains(log, "path=/jobs status=200") || !strings.Contains(log, "path=/login") {
		t.Errorf("the server's log lacks the pages:\n%s", log)
	}
	for _, p := range []string{"path=/api/v1/queues ", "path=/api/v1/series ", "path=/api/v1/processes ", "path=/api/v1/jobs/"} {
		if strings.Contains(log, p) {
			t.Errorf("a live refresh (%s) logged at Info:\n%s", p, log)
		}
	}
}

// A read-only login sees the dashboard without the buttons, and its
// state changes are refused.
func TestBrowserReadOnly(t *testing.T) {
	chromium(t)
	base := serveForBrowser(t)
	api(t, "POST", base+"/api/v1/jobs", map[string]any{"kind": "k", "queue": "ro"}, nil)
	b := newBrowser(t, 390, 844) // a phone's width
	b.navigate(base + "/login")
	b.do("log in", chromedp.SetValue(chromedp.CSS("#token"), browserROToken), chromedp.Click(chromedp.CSS("#login-token button")))
	b.waitFor("the queues, without buttons", `document.querySelector('tr[data-queue="ro"]') && !document.querySelector("button.pause, button.resume")`)
	b.waitFor("ro flagged as unworked, the processes listed", `document.querySelector('tr[data-queue="ro"] .badge.unworked') && document.querySelector("#processes tr[data-process]")`)
	v, err := b.eval(`fetch("` + base + `/api/v1/queues/ro/pause", {method: "POST"}).then(r => r.status)`)
	if err != nil || v != "403" {
		t.Errorf("read-only pause from the page: %s %v", v, err)
	}
	// Phone width: the table is stacked, nothing overflows sideways.
	b.waitFor("no horizontal overflow", `document.documentElement.scrollWidth <= window.innerWidth + 1`)
}

// jsString quotes s for JavaScript.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// The screenshots of docs/screenshots: run by scripts/screenshots, which
// sets CONVEYOR_SCREENSHOTS to the directory to write.
func TestBrowserScreenshots(t *testing.T) {
	dir := os.Getenv("CONVEYOR_SCREENSHOTS")
	if dir == "" {
		t.Skip("set CONVEYOR_SCREENSHOTS=DIR (scripts/screenshots does) to write the dashboard's screenshots")
	}
	chromium(t)
	base := serveForBrowser(t, "--sample-interval", "500ms")
	// Some history: three queues, jobs in every state, a failed job.
	for q, n := range map[string]int{"default": 120, "email": 45, "reports": 8} {
		jobs := make([]map[string]any, n)
		for i := range jobs {
			jobs[i] = map[string]any{"kind": q + "_job", "queue": q, "args": map[string]any{"n": i, "to": fmt.Sprintf("user%d@example.com", i)}}
		}
		api(t, "POST", base+"/api/v1/jobs/batch", map[string]any{"jobs": jobs}, nil)
	}
	var c struct{ Jobs []claimed }
	api(t, "POST", base+"/api/v1/claim", map[string]any{"queue": "email", "limit": 30}, &c)
	var failed int64
	for i, j := range c.Jobs {
		switch {
		case i < 20:
			api(t, "POST", fmt.Sprintf("%s/api/v1/jobs/%d/complete", base, j.ID), map[string]any{"fence": j.Fence}, nil)
		case i < 24:
			api(t, "POST", fmt.Sprintf("%s/api/v1/jobs/%d/fail", base, j.ID), map[string]any{"fence": j.Fence, "error": "smtp: 451 4.7.1 try again later", "trace": "goroutine 7 [running]:\nmain.send(...)\n\t/app/mail.go:42\nmain.work(...)\n\t/app/worker.go:17", "retry_in_ms": 600000}, nil)
			failed = j.ID
		}
	}
	api(t, "POST", base+"/api/v1/queues/reports/pause", nil, nil)
	for _, w := range []struct {
		name string
		w, h int
	}{{"laptop", 1280, 800}, {"phone", 390, 844}} {
		b := newBrowser(t, w.w, w.h)
		shot := func(name string) {
			png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name+"-"+w.name+".png"), png, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		b.navigate(base + "/login")
		shot("login")
		b.do("log in", chromedp.SetValue(chromedp.CSS("#token"), browserAdminToken), chromedp.Click(chromedp.CSS("#login-token button")))
		b.waitFor("the queues", `document.body.dataset.page === "queues"`)
		// Work through the default queue while the page samples, so that
		// the charts have lines.
		for range 8 {
			api(t, "POST", base+"/api/v1/claim", map[string]any{"queue": "default", "limit": 7}, &c)
			for _, j := range c.Jobs {
				api(t, "POST", fmt.Sprintf("%s/api/v1/jobs/%d/complete", base, j.ID), map[string]any{"fence": j.Fence}, nil)
			}
			time.Sleep(800 * time.Millisecond)
		}
		b.waitFor("chart lines", `document.querySelectorAll("#chart-depth polyline").length > 0`)
		shot("queues")
		b.navigate(base + "/jobs?queue=email&limit=20")
		b.waitFor("the job list and its pager", `document.querySelector("#jobs tbody tr[data-id]") && !document.querySelector("#older-page").hidden`)
		shot("jobs")
		b.navigate(fmt.Sprintf("%s/jobs/%d", base, failed))
		b.waitFor("the job", `document.body.dataset.page === "job"`)
		shot("job")
	}
}

// TestBrowserResultAndBatch: a job's result, markup included, appears on
// its open page as text when an HTTP worker completes it; the workflow
// job that waited for it links its batch, whose page lists the job with
// its state and result.
func TestBrowserResultAndBatch(t *testing.T) {
	chromium(t)
	base := serveForBrowser(t)
	var wf struct {
		JobIDs   map[string]int64 `json:"job_ids"`
		BatchIDs map[string]int64 `json:"batch_ids"`
	}
	if s := api(t, "POST", base+"/api/v1/workflows", map[string]any{"jobs": []any{
		map[string]any{"name": "A", "kind": "fetch", "queue": "wf"},
		map[string]any{"name": "B", "kind": "report", "queue": "wf", "depends_on": []string{"A"}},
	}}, &wf); s != 201 {
		t.Fatalf("enqueue workflow: %d %+v", s, wf)
	}
	a := wf.JobIDs["A"]
	b := newBrowser(t, 1280, 900)
	b.navigate(base + "/login")
	b.do("log in", chromedp.SetValue(chromedp.CSS("#token"), browserAdminToken), chromedp.Click(chromedp.CSS("#login-token button")))
	b.waitFor("the queues page", `document.body.dataset.page === "queues"`)
	b.navigate(fmt.Sprintf("%s/jobs/%d", base, a))
	b.waitFor("A's page without a result or batch", `document.querySelector("#job-result").hidden && document.querySelector("#job-result-none") && !document.querySelector("#job-batch")`)

	var c struct{ Jobs []claimed }
	api(t, "POST", base+"/api/v1/claim", map[string]any{"queue": "wf"}, &c)
	if len(c.Jobs) != 1 || c.Jobs[0].ID != a {
		t.Fatalf("claimed %+v, want A (%d)", c.Jobs, a)
	}
	if s := api(t, "POST", fmt.Sprintf("%s/api/v1/jobs/%d/complete", base, a), map[string]any{"fence": c.Jobs[0].Fence, "result": map[string]any{"rows": 3, "note": xssPayload}}, nil); s != 200 {
		t.Fatalf("complete: %d", s)
	}
	// The result is JSON text: the payload's quote is escaped in it, so
	// its parts around the quote are looked for.
	shown := func(sel string) string {
		return `document.querySelector(` + jsString(sel) + `).textContent.includes("<script>alert(1)</script>")` +
			` && document.querySelector(` + jsString(sel) + `).textContent.includes("><img src=x onerror=alert(1)> '><svg onload=alert(1)>")`
	}
	inert := ` && document.querySelectorAll("img, svg:not(.chart), main script").length === 0` +
		` && [...document.scripts].every(s => !s.textContent.includes("alert"))`
	b.waitFor("A's result shown live, as text", `document.querySelector("#job-state").textContent === "completed" && !document.querySelector("#job-result").hidden`+
		` && `+shown("#job-result")+` && document.querySelector("#job-result-none").hidden`+inert)
	b.navigate(fmt.Sprintf("%s/jobs/%d", base, a))
	b.waitFor("A's result rendered by the server, as text", shown("#job-result")+` && document.querySelector("#job-result").textContent.includes('"rows": 3')`+inert)

	// B is enqueued by the server's maintenance once A has finished.
	var bb struct {
		CallbackID *int64 `json:"callback_id"`
	}
	for end := time.Now().Add(20 * time.Second); bb.CallbackID == nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("B was not enqueued within 20s of A completing")
		}
		api(t, "GET", fmt.Sprintf("%s/api/v1/batches/%d", base, wf.BatchIDs["B"]), nil, &bb)
	}
	b.navigate(fmt.Sprintf("%s/jobs/%d", base, *bb.CallbackID))
	b.waitFor("B's page linking its batch", `document.querySelector("#job-batch") && document.querySelector("#job-result-none")`)
	b.click("open the batch", "#job-batch")
	b.waitFor("the batch page", fmt.Sprintf(`document.body.dataset.page === "batch" && document.querySelector("#batch-id").textContent === "%d"`, wf.BatchIDs["B"])+
		` && document.querySelector("#batch-state").textContent === "finished" && document.querySelector("#batch-progress").textContent === "1 of 1 finished"`+
		fmt.Sprintf(` && document.querySelector('#batch-callback a[href$="/jobs/%d"]')`, *bb.CallbackID)+
		fmt.Sprintf(` && document.querySelector('#batch-jobs tr[data-id="%d"] .badge').textContent === "completed"`, a)+
		` && `+shown(fmt.Sprintf(`#batch-jobs tr[data-id="%d"] pre.result`, a))+inert)
}
