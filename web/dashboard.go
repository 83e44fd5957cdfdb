package web

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/conveyorq/conveyor"
)

// page is what every dashboard template gets.
type page struct {
	Base      string
	Page      string // "queues", "jobs", "job", "batch", "login", "error"
	Title     string
	Who       string
	Role      Role
	Admin     bool
	CanLogout bool
	Flash     string
	Err       string
	Data      any
}

// pages are the dashboard's templates, each with the base layout.
var pageNames = []string{"login", "error", "queues", "jobs", "job", "batch"}

// templates maps a page name to its parsed template.
type templates map[string]*template.Template

func parseTemplates() (templates, error) {
	funcs := template.FuncMap{
		// at is a time as the "time" template shows it: relative to now,
		// absolute on hover.
		"at": func(t any) timeView {
			switch t := t.(type) {
			case *JSONTime:
				if t != nil {
					return newTimeView(time.Time(*t), time.Now())
				}
			case JSONTime:
				return newTimeView(time.Time(t), time.Now())
			}
			return timeView{}
		},
		"ms": func(ms *int64) string {
			if ms == nil {
				return "–"
			}
			return humanDuration(time.Duration(*ms) * time.Millisecond)
		},
		"nowms": func() int64 { return time.Now().UnixMilli() },
		// limitLines is a queue's limits with their use, one line each:
		// "3/5 running", "rate 8/10 per 1m"; none without limits.
		"limitLines": limitLines,
		"deref64": func(n *int64) int64 {
			if n == nil {
				return 0
			}
			return *n
		},
		"deref": func(s *string) string {
			if s == nil {
				return ""
			}
			return *s
		},
	}
	out := templates{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(assets, "assets/templates/base.html", "assets/templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("web: template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// renderBuffer is how much of a page is kept before it is sent: a page
// is written while its template runs, this much at a time, not built
// whole in memory first.
const renderBuffer = 32 << 10

// render writes a page with status. A template that fails within the
// first renderBuffer bytes answers 500 instead; past them the status is
// sent, so a failure (mostly the client gone) is only logged.
func (h *Handler) render(w http.ResponseWriter, status int, name string, p page) {
	p.Base, p.Page = h.opts.BasePath, name
	sw := &startWriter{w: w, status: status}
	bw := bufio.NewWriterSize(sw, renderBuffer)
	err := h.tmpl[name].ExecuteTemplate(bw, "base", p)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		return
	}
	h.opts.Logger.Error("conveyor web: rendering a page", "page", name, "err", err)
	if !sw.started {
		http.Error(w, "internal error rendering the page (logged by the server)", http.StatusInternalServerError)
	}
}

// startWriter sends an HTML page's header with its status at the first
// write.
type startWriter struct {
	w       http.ResponseWriter
	status  int
	started bool
}

func (s *startWriter) Write(b []byte) (int, error) {
	if !s.started {
		s.started = true
		s.w.Header().Set("Content-Type", "text/html; charset=utf-8")
		s.w.WriteHeader(s.status)
	}
	return s.w.Write(b)
}

// pageFor fills the principal's part of a page.
func (h *Handler) pageFor(p principal, title string, data any) page {
	return page{Title: title, Who: p.name, Role: p.role, Admin: p.role == RoleAdmin, CanLogout: !h.creds.devLB, Data: data}
}

func (h *Handler) renderLogin(w http.ResponseWriter, status int, next, msg string) {
	h.render(w, status, "login", page{Title: "Log in", Err: msg, Data: struct{ Next string }{h.safeNext(next)}})
}

func (h *Handler) renderError(w http.ResponseWriter, _ *http.Request, p principal, status int, msg string) {
	h.render(w, status, "error", h.pageFor(p, http.StatusText(status), msg))
}

func (h *Handler) notFound(w http.ResponseWriter, r *http.Request, p principal) {
	if strings.HasPrefix(r.URL.Path, h.opts.BasePath+"/api/") {
		writeError(w, http.StatusNotFound, "no such API endpoint (see "+h.opts.BasePath+"/api/v1/openapi.json)")
		return
	}
	h.renderError(w, r, p, http.StatusNotFound, "There is no page at this address.")
}

// flashes are the fixed messages a redirect after an action may ask for
// (?ok=NAME); no text from the request is shown.
var flashes = map[string]string{
	"retry":   "The job was retried: it is available again.",
	"cancel":  "The job was cancelled.",
	"discard": "The job was discarded.",
	"pause":   "The queue is paused in every process; running jobs finish.",
	"resume":  "The queue is resumed.",
	"limits":  "The queue's limits are set in every process.",
	"nolimit": "The queue's limits are cleared.",
}

func (h *Handler) pageQueues(w http.ResponseWriter, r *http.Request, p principal) {
	rd, err := h.stats.get(r.Context())
	if err != nil {
		status, msg := h.classify(r, err)
		h.renderError(w, r, p, status, msg)
		return
	}
	q := toQueuesJSON(h.c.Backend(), rd)
	scheds, err := h.schedules(r)
	if err != nil {
		status, msg := h.classify(r, err)
		h.renderError(w, r, p, status, msg)
		return
	}
	var unworked []string
	for _, x := range q.Queues {
		if x.Unworked {
			unworked = append(unworked, x.Queue)
		}
	}
	pg := h.pageFor(p, "Queues", struct {
		queuesJSON
		States    []string
		Schedules []scheduleJSON
		Processes processesJSON
		Unworked  []string
		// Finished marks the states counted over the window only.
		Finished map[string]bool
		Window   string
	}{q, stateNames(), scheds, toProcessesJSON(rd), unworked, finishedStates, windowText})
	pg.Flash = flashes[r.URL.Query().Get("ok")]
	h.render(w, http.StatusOK, "queues", pg)
}

// finishedStates are the states the queues page counts over
// finishedWindow only.
var finishedStates = map[string]bool{
	string(conveyor.JobStateCompleted): true,
	string(conveyor.JobStateDiscarded): true,
	string(conveyor.JobStateCancelled): true,
}

// windowText names finishedWindow in the queues table's headers.
var windowText = fmt.Sprintf("last %d min", int(finishedWindow/time.Minute))

func stateNames() []string {
	var out []string
	for _, s := range conveyor.JobStates() {
		out = append(out, string(s))
	}
	return out
}

func (h *Handler) pageJobs(w http.ResponseWriter, r *http.Request, p principal) {
	f, err := parseJobQuery(r)
	if err != nil {
		h.renderError(w, r, p, http.StatusBadRequest, err.Error())
		return
	}
	// Newest first, paged back by before=; after= is the newer page.
	f.Summary = true
	newer := f.After > 0
	f.Desc = !newer
	jobs, info, err := listJobs(h, r, f, func(j *conveyor.JobInfo) (jobSummaryJSON, int, error) {
		s := toJobSummary(j)
		return s, s.size(), nil
	})
	if err != nil {
		status, msg := h.classify(r, err)
		h.renderError(w, r, p, status, msg)
		return
	}
	// link is this list's address with a cursor: "after" (the newer
	// page) or "before" (the older page), or none (the newest page); a
	// bulk action's message stays on this page only.
	link := func(cursor string, id int64) string {
		v := url.Values{}
		for k, val := range backQuery(r.URL.Query()) {
			if k != "after" && k != "before" && k != "order" && len(val) > 0 && val[0] != "" {
				v[k] = val
			}
		}
		if cursor != "" {
			v.Set(cursor, strconv.FormatInt(id, 10))
		}
		if len(v) == 0 {
			return h.opts.BasePath + "/jobs"
		}
		return h.opts.BasePath + "/jobs?" + v.Encode()
	}
	if newer {
		// Read in id order after the cursor, shown newest first. With
		// nothing newer beyond, this is the newest page: that page is
		// shown instead, whole, so that paging back and forth returns
		// to it however many jobs were enqueued meanwhile.
		if info.NextAfter == nil {
			top := link("", 0)
			if msg := r.URL.Query(); msg.Has("bulk") {
				sep := "?"
				if strings.Contains(top, "?") {
					sep = "&"
				}
				top += sep + url.Values{"bulk": msg["bulk"], "done": msg["done"], "refused": msg["refused"]}.Encode()
			}
			http.Redirect(w, r, top, http.StatusSeeOther)
			return
		}
		slices.Reverse(jobs)
	}
	state := ""
	if len(f.States) == 1 {
		state = string(f.States[0])
	}
	data := struct {
		Back      string
		Query     jobQuery
		State     string
		States    []string
		Jobs      []jobSummaryJSON
		Info      pageInfo
		ScanLimit int
		// NewestURL, NewerURL and OlderURL are the pager's links; ""
		// when there is no such page.
		NewestURL, NewerURL, OlderURL string
	}{Back: backURL(h.opts.BasePath+"/jobs", r.URL.Query()), Query: f, State: state, States: stateNames(), Jobs: jobs, Info: info, ScanLimit: textScanLimit}
	if f.After > 0 || f.Before > 0 {
		data.NewestURL = link("", 0)
		switch {
		case newer:
			data.NewerURL = link("after", *info.NextAfter)
		case len(jobs) > 0:
			data.NewerURL = link("after", jobs[0].ID)
		default:
			data.NewerURL = link("after", f.Before-1)
		}
	}
	switch {
	case info.NextBefore != nil:
		data.OlderURL = link("before", *info.NextBefore)
	case newer && len(jobs) > 0:
		data.OlderURL = link("before", jobs[len(jobs)-1].ID)
	}
	pgd := h.pageFor(p, "Jobs", data)
	pgd.Flash = bulkFlash(r.URL.Query())
	h.render(w, http.StatusOK, "jobs", pgd)
}

func (h *Handler) pageJob(w http.ResponseWriter, r *http.Request, p principal) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		h.renderError(w, r, p, http.StatusBadRequest, "not a job id")
		return
	}
	j, err := h.c.Job(r.Context(), id)
	if err != nil {
		status, msg := h.classify(r, fmt.Errorf("job %d: %w", id, err))
		h.renderError(w, r, p, status, msg)
		return
	}
	jj := NewJobJSON(j)
	var result *argsView
	if len(j.Result) > 0 {
		v := prettyArgs(j.Result)
		result = &v
	}
	// The batch a callback closes, as the batch recorded it; a job
	// whose batch is gone still names it in its metadata.
	callbackOf := j.CallbackOf
	if callbackOf == 0 {
		callbackOf, _ = conveyor.BatchOf(j)
	}
	pg := h.pageFor(p, fmt.Sprintf("Job %d", id), struct {
		Job        JobJSON
		Args       argsView
		Result     *argsView
		CallbackOf int64
		MemberOf   int64
		CanRetry   bool
		CanStop    bool
	}{jj, prettyArgs(j.EncodedArgs), result, callbackOf, j.BatchID, canRetry(jj.State), canStop(jj.State)})
	pg.Flash = flashes[r.URL.Query().Get("ok")]
	h.render(w, http.StatusOK, "job", pg)
}

// batchResultBytes is the most text of each job's result a batch's page
// shows; the job's own page shows more.
const batchResultBytes = 2 << 10

// batchPageJobs is the most jobs a batch's page lists; a link lists the
// next ones (?after=).
const batchPageJobs = maxListLimit

// batchJobView is one job of a batch's page.
type batchJobView struct {
	ID     int64
	State  string
	Result argsView
}

// pageBatch shows a batch: its callback, and its jobs with their states
// and results.
func (h *Handler) pageBatch(w http.ResponseWriter, r *http.Request, p principal) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		h.renderError(w, r, p, http.StatusBadRequest, "not a batch id")
		return
	}
	var after int64
	if v := r.URL.Query().Get("after"); v != "" {
		if after, err = strconv.ParseInt(v, 10, 64); err != nil || after < 0 {
			h.renderError(w, r, p, http.StatusBadRequest, fmt.Sprintf("after=%q is not a job id", v))
			return
		}
	}
	b, err := h.c.Batch(r.Context(), id)
	if err != nil {
		status, msg := h.classify(r, fmt.Errorf("batch %d: %w", id, err))
		h.renderError(w, r, p, status, msg)
		return
	}
	bj := NewBatchJSON(b)
	done := 0
	for _, j := range b.Jobs {
		switch j.State {
		case conveyor.JobStateCompleted, conveyor.JobStateDiscarded, conveyor.JobStateCancelled, "":
			done++
		}
	}
	// One page of the jobs: results are cut to batchResultBytes each, so
	// batchPageJobs bounds the page.
	page, more, _ := batchPage(bj, after, batchPageJobs, math.MaxInt)
	jobs := make([]batchJobView, len(page))
	for i, j := range page {
		jobs[i] = batchJobView{ID: j.ID, State: j.State}
		if len(j.Result) > 0 {
			text, truncated, flattened := formatJSON(j.Result, batchResultBytes, argsIndentDepth)
			jobs[i].Result = argsView{Text: text, Truncated: truncated, Flattened: flattened, Bytes: len(j.Result)}
		}
	}
	var next int64
	if more {
		next = page[len(page)-1].ID
	}
	h.render(w, http.StatusOK, "batch", h.pageFor(p, fmt.Sprintf("Batch %d", id), struct {
		Batch    BatchJSON
		Jobs     []batchJobView
		Finished int
		// Total is how many jobs the batch has; Jobs are those after
		// After, up to batchPageJobs; Next, when more follow, is the
		// after= of the next page (0 on the last).
		Total       int
		After, Next int64
	}{bj, jobs, done, len(b.Jobs), after, next}))
}

// Bounds of the arguments shown on a job's page.
const (
	// argsPageBytes is the most text of a job's arguments its page
	// shows; beyond it the page says so and links the job's raw JSON
	// (GET /api/v1/jobs/{id}).
	argsPageBytes = 256 << 10
	// argsIndentDepth is the deepest nesting the job page indents: a
	// value nested deeper is written on one line, so that the page grows
	// with the arguments' size, not with the square of their depth.
	argsIndentDepth = 32
)

// argsView is a job's arguments as its page shows them.
type argsView struct {
	// Text is the arguments, indented (see formatJSON).
	Text string
	// Truncated is set when Text is only the first argsPageBytes of it.
	Truncated bool
	// Flattened is set when values nested deeper than argsIndentDepth
	// were written on one line.
	Flattened bool
	// Bytes is the size of the arguments as stored.
	Bytes int
	// Limit and Depth are argsPageBytes and argsIndentDepth, for the
	// page's note.
	Limit, Depth int
}

// prettyArgs is the arguments of a job's page: indented up to
// argsIndentDepth, at most argsPageBytes.
func prettyArgs(raw json.RawMessage) argsView {
	text, truncated, flattened := formatJSON(raw, argsPageBytes, argsIndentDepth)
	return argsView{Text: text, Truncated: truncated, Flattened: flattened, Bytes: len(raw), Limit: argsPageBytes, Depth: argsIndentDepth}
}

// formatJSON rewrites JSON text for reading in one pass over its bytes,
// without decoding it into values: containers nested at most depth deep
// are indented two spaces a level (as json.Indent does), deeper ones are
// written on one line, whitespace between tokens is dropped (so depth 0
// gives the compact form), and encoding/json's escapes of '<', '>' and
// '&' (\u003c, \u003e, \u0026) are written as the characters (an HTML
// template escapes the text). Strings and object keys are otherwise
// kept as stored, in the stored order. The output stops once it holds
// max bytes (cut at a character's boundary), and truncated says so; it
// is then at most max plus one indentation (2*depth+1 bytes) long.
// Text that is not JSON comes out rearranged but whole, never refused.
func formatJSON(raw []byte, max, depth int) (text string, truncated, flattened bool) {
	var b strings.Builder
	b.Grow(min(len(raw)+len(raw)/4, max+2*depth+2))
	level := 0 // containers open around the current byte
	newline := func(level int) {
		b.WriteByte('\n')
		for range level {
			b.WriteString("  ")
		}
	}
	inString := false
	for i := 0; i < len(raw); i++ {
		if b.Len() >= max {
			truncated = len(bytes.TrimLeft(raw[i:], " \t\n\r")) > 0
			break
		}
		c := raw[i]
		if inString {
			switch {
			case c == '\\' && i+5 < len(raw) && raw[i+1] == 'u' && raw[i+2] == '0' && raw[i+3] == '0' && htmlEscape(raw[i+4], raw[i+5]) != 0:
				b.WriteByte(htmlEscape(raw[i+4], raw[i+5]))
				i += 5
			case c == '\\' && i+1 < len(raw):
				b.WriteByte(c)
				b.WriteByte(raw[i+1])
				i++
			default:
				b.WriteByte(c)
				inString = c != '"'
			}
			continue
		}
		switch c {
		case ' ', '\t', '\n', '\r':
		case '"':
			inString = true
			b.WriteByte(c)
		case '{', '[':
			j := i + 1
			for j < len(raw) && (raw[j] == ' ' || raw[j] == '\t' || raw[j] == '\n' || raw[j] == '\r') {
				j++
			}
			if j < len(raw) && raw[j] == c+2 { // '{'+2 is '}', '['+2 is ']'
				b.WriteByte(c)
				b.WriteByte(c + 2)
				i = j
				continue
			}
			level++
			b.WriteByte(c)
			if level <= depth {
				newline(level)
			} else {
				flattened = true
			}
		case '}', ']':
			if level > 0 {
				level--
			}
			if level < depth {
				newline(level)
			}
			b.WriteByte(c)
		case ',':
			b.WriteByte(c)
			if level <= depth {
				newline(level)
			}
		case ':':
			b.WriteByte(c)
			if level <= depth {
				b.WriteByte(' ')
			}
		default:
			b.WriteByte(c)
		}
	}
	text = b.String()
	if truncated {
		// Drop a character cut in the middle.
		for k := 0; k < utf8.UTFMax && len(text) > 0; k++ {
			if r, size := utf8.DecodeLastRuneInString(text); r != utf8.RuneError || size != 1 {
				break
			}
			text = text[:len(text)-1]
		}
	}
	return text, truncated, flattened
}

// htmlEscape returns the character encoding/json escapes as \u00XY
// (xy is 3c, 3e or 26: '<', '>' and '&'), or 0.
func htmlEscape(x, y byte) byte {
	switch {
	case x == '3' && y == 'c':
		return '<'
	case x == '3' && y == 'e':
		return '>'
	case x == '2' && y == '6':
		return '&'
	}
	return 0
}

// canRetry and canStop say which actions a job's state allows (the
// dashboard shows only those; the database decides).
func canRetry(state string) bool {
	switch conveyor.JobState(state) {
	case conveyor.JobStateDiscarded, conveyor.JobStateCancelled, conveyor.JobStateCompleted, conveyor.JobStateRetryable, conveyor.JobStateScheduled:
		return true
	}
	return false
}

func canStop(state string) bool {
	switch conveyor.JobState(state) {
	case conveyor.JobStateAvailable, conveyor.JobStateScheduled, conveyor.JobStateRunning, conveyor.JobStateRetryable:
		return true
	}
	return false
}

// formJobAction runs retry, cancel or discard from the dashboard's forms
// and redirects to the job.
func (h *Handler) formJobAction(w http.ResponseWriter, r *http.Request, p principal) {
	action := r.PathValue("action")
	if _, ok := flashes[action]; !ok || action == "pause" || action == "resume" || action == "limits" || action == "nolimit" {
		h.renderError(w, r, p, http.StatusNotFound, "unknown action")
		return
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		h.renderError(w, r, p, http.StatusBadRequest, "not a job id")
		return
	}
	if _, err := h.adminAction(r, action, id); err != nil {
		status, msg := h.classify(r, err)
		h.renderError(w, r, p, status, msg)
		return
	}
	h.stats.invalidate()
	http.Redirect(w, r, fmt.Sprintf("%s/jobs/%d?ok=%s", h.opts.BasePath, id, action), http.StatusSeeOther)
}

// formBulk runs a bulk action from the job list's checkboxes and
// returns to the list with the counts.
func (h *Handler) formBulk(w http.ResponseWriter, r *http.Request, p principal) {
	if err := r.ParseForm(); err != nil {
		h.renderError(w, r, p, bodyStatus(err), "could not read the form: "+err.Error())
		return
	}
	action := r.PostForm.Get("action")
	var ids []int64
	for _, v := range r.PostForm["id"] {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			h.renderError(w, r, p, http.StatusBadRequest, "not a job id")
			return
		}
		ids = append(ids, id)
	}
	if err := checkBulk(action, ids); err != nil {
		h.renderError(w, r, p, http.StatusBadRequest, err.Error())
		return
	}
	res, err := h.bulk(r, action, ids)
	if err != nil {
		status, msg := h.classify(r, err)
		h.renderError(w, r, p, status, msg)
		return
	}
	done := 0
	for _, x := range res {
		if x.Error == nil {
			done++
		}
	}
	back := h.safeNext(r.PostForm.Get("back"))
	sep := "?"
	if strings.Contains(back, "?") {
		sep = "&"
	}
	http.Redirect(w, r, fmt.Sprintf("%s%sbulk=%s&done=%d&refused=%d", back, sep, action, done, len(res)-done), http.StatusSeeOther)
}

// backURL is the job list's address to return to after a bulk action,
// without the previous action's message.
func backURL(path string, q url.Values) string {
	v := backQuery(q)
	if len(v) == 0 {
		return path
	}
	return path + "?" + v.Encode()
}

// backQuery is a job list's query without a bulk action's message.
func backQuery(q url.Values) url.Values {
	v := url.Values{}
	for k, val := range q {
		if k != "bulk" && k != "done" && k != "refused" {
			v[k] = val
		}
	}
	return v
}

// bulkFlash is the message after a bulk action, from the redirect's
// query: a fixed text with two numbers.
func bulkFlash(q url.Values) string {
	verb := map[string]string{"retry": "Retried", "cancel": "Cancelled", "discard": "Discarded"}[q.Get("bulk")]
	if verb == "" {
		return ""
	}
	done, err1 := strconv.Atoi(q.Get("done"))
	refused, err2 := strconv.Atoi(q.Get("refused"))
	if err1 != nil || err2 != nil {
		return ""
	}
	msg := fmt.Sprintf("%s %d job(s).", verb, done)
	if refused > 0 {
		msg += fmt.Sprintf(" %d were in a state that does not allow it (or gone).", refused)
	}
	return msg
}

// formQueueAction pauses or resumes a queue from the dashboard.
func (h *Handler) formQueueAction(w http.ResponseWriter, r *http.Request, p principal) {
	action, queue := r.PathValue("action"), r.PathValue("queue")
	if action != "pause" && action != "resume" {
		h.renderError(w, r, p, http.StatusNotFound, "unknown action")
		return
	}
	if err := h.setPaused(r, queue, action == "pause"); err != nil {
		status, msg := h.classify(r, err)
		h.renderError(w, r, p, status, msg)
		return
	}
	http.Redirect(w, r, h.opts.BasePath+"/?ok="+action, http.StatusSeeOther)
}

// formLimits sets (op=set) or clears (op=clear) a queue's limits from
// the queues page's form: queue, max_running, rate and rate_period (a Go
// duration), key_max_running and key_order ("", "ordered" or "move_on"),
// key_rate and key_rate_period (a Go duration); an empty number is no
// limit.
func (h *Handler) formLimits(w http.ResponseWriter, r *http.Request, p principal) {
	if err := r.ParseForm(); err != nil {
		h.renderError(w, r, p, bodyStatus(err), "could not read the form: "+err.Error())
		return
	}
	queue, op := strings.TrimSpace(r.PostForm.Get("queue")), r.PostForm.Get("op")
	if queue == "" {
		h.renderError(w, r, p, http.StatusBadRequest, "queue: give the queue's name")
		return
	}
	var l conveyor.QueueLimits
	switch op {
	case "clear":
	case "set":
		var err error
		if l, err = formLimitValues(r.PostForm); err != nil {
			h.renderError(w, r, p, http.StatusBadRequest, err.Error())
			return
		}
		if l.IsZero() {
			h.renderError(w, r, p, http.StatusBadRequest, "give max running, or a rate with its period, or a limit or rate per key, or fair (Clear limits removes them)")
			return
		}
	default:
		h.renderError(w, r, p, http.StatusBadRequest, fmt.Sprintf("op %q: set or clear", op))
		return
	}
	if err := h.setLimits(r, queue, l); err != nil {
		status, msg := h.classify(r, err)
		h.renderError(w, r, p, status, msg)
		return
	}
	ok := "limits"
	if op == "clear" {
		ok = "nolimit"
	}
	http.Redirect(w, r, h.opts.BasePath+"/?ok="+ok, http.StatusSeeOther)
}

// formLimitValues reads the limits of the queues page's form, naming the
// field at fault.
func formLimitValues(form url.Values) (conveyor.QueueLimits, error) {
	var l conveyor.QueueLimits
	num := func(field, label string) (int, error) {
		v := strings.TrimSpace(form.Get(field))
		if v == "" {
			return 0, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return 0, fmt.Errorf("%s %q is not a whole number (empty for no limit)", label, v)
		}
		return n, nil
	}
	var err error
	if l.MaxRunning, err = num("max_running", "max running"); err != nil {
		return l, err
	}
	if l.Rate, err = num("rate", "rate"); err != nil {
		return l, err
	}
	if l.KeyMaxRunning, err = num("key_max_running", "per key"); err != nil {
		return l, err
	}
	switch v := form.Get("key_order"); v {
	case "":
	case "ordered":
		l.Ordered = true
	case "move_on":
		l.Ordered, l.OrderedMoveOn = true, true
	default:
		return l, fmt.Errorf("key order %q: empty, ordered or move_on", v)
	}
	if l.KeyRate, err = num("key_rate", "key rate"); err != nil {
		return l, err
	}
	switch v := form.Get("fair"); v {
	case "", "off", "false":
	case "on", "true", "1":
		l.Fair = true
	default:
		return l, fmt.Errorf("fair %q: on or empty", v)
	}
	dur := func(field, label string) (time.Duration, error) {
		v := strings.TrimSpace(form.Get(field))
		if v == "" {
			return 0, nil
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			return 0, fmt.Errorf("%s %q is not a duration: write it as 1m, 30s or 250ms", label, v)
		}
		return d, nil
	}
	if l.RatePeriod, err = dur("rate_period", "rate period"); err != nil {
		return l, err
	}
	if l.KeyRatePeriod, err = dur("key_rate_period", "key rate period"); err != nil {
		return l, err
	}
	return l, nil
}

// limitLines is a queue's limits with their use, one line each, as the
// queues page shows them (app.js's limitLines says the same).
func limitLines(q queueJSON) []string {
	l, u := q.Limits, q.LimitUse
	if l == nil {
		return nil
	}
	if u == nil {
		u = &limitUseJSON{}
	}
	var out []string
	if l.MaxRunning > 0 {
		out = append(out, fmt.Sprintf("%d/%d running", u.Running, l.MaxRunning))
	}
	if l.Rate > 0 {
		out = append(out, fmt.Sprintf("rate %d/%d per %s", u.Started, l.Rate, l.RatePeriod))
	}
	switch {
	case l.Ordered && l.OrderedMoveOn:
		out = append(out, "ordered by key, moving on: "+keysRunning(u.KeysRunning))
	case l.Ordered:
		out = append(out, "ordered by key: "+keysRunning(u.KeysRunning))
	case l.KeyMaxRunning > 0:
		out = append(out, fmt.Sprintf("%d per key: %s", l.KeyMaxRunning, keysRunning(u.KeysRunning)))
	}
	if l.KeyRate > 0 {
		out = append(out, fmt.Sprintf("%d per key per %s: %s", l.KeyRate, l.KeyRatePeriod, keysRated(u.KeysRated)))
	}
	switch {
	case l.Fair && q.WeightedKeys == 1:
		out = append(out, "fair: 1 weighted key")
	case l.Fair && q.WeightedKeys > 1:
		out = append(out, fmt.Sprintf("fair: %d weighted keys", q.WeightedKeys))
	case l.Fair:
		out = append(out, "fair")
	}
	if (l.Ordered || l.KeyMaxRunning > 0 || l.KeyRate > 0) && u.KeyHeld > 0 {
		out = append(out, fmt.Sprintf("%d waiting for their key", u.KeyHeld))
	}
	return out
}

// keysRunning says how many keys run: "1 key running", "3 keys running".
func keysRunning(n int) string {
	if n == 1 {
		return "1 key running"
	}
	return fmt.Sprintf("%d keys running", n)
}

// keysRated says how many keys have used their rate's window: "1 key at
// its rate", "3 keys at their rate".
func keysRated(n int) string {
	if n == 1 {
		return "1 key at its rate"
	}
	return fmt.Sprintf("%d keys at their rate", n)
}

// checkQueueName refuses a queue name that breaks conveyor's rule,
// naming it; the error is conveyor.ErrInvalidOpts for errors.Is.
func checkQueueName(q string) error {
	if err := conveyor.ValidQueueName(q); err != nil {
		return fmt.Errorf("queue %q: %w", q, err)
	}
	return nil
}

// timeView is a time as the dashboard shows it (the "time" template of
// base.html): how long ago or how far ahead, with the absolute time in
// the title and the datetime attribute. The script keeps the relative
// text current and shows the title in the browser's time zone.
type timeView struct {
	// ISO is the time in RFC 3339, UTC, milliseconds; "" for no time.
	ISO string
	// Title is the absolute time for reading: UTC, to the millisecond.
	Title string
	// Rel is the time relative to the page's now ("3 min ago", "in 20 s").
	Rel string
}

func newTimeView(t, now time.Time) timeView {
	if t.IsZero() {
		return timeView{}
	}
	u := t.UTC()
	return timeView{ISO: u.Format("2006-01-02T15:04:05.000Z"), Title: u.Format("2006-01-02 15:04:05.000") + " UTC", Rel: relativeTime(t, now)}
}

// relativeTime says when t is from now, to one unit, rounded down: "now"
// within a second, "45 s ago", "3 min ago", "in 2 h", "in 3 d" (days
// from 48 hours on). app.js's relTime says the same.
func relativeTime(t, now time.Time) string {
	d := t.Sub(now)
	future := d > 0
	if d < 0 {
		d = -d
	}
	if d < time.Second {
		return "now"
	}
	text := humanDuration(d)
	if future {
		return "in " + text
	}
	return text + " ago"
}

// humanDuration is d to one unit, rounded down: "850 ms" (below a
// second), "45 s", "3 min", "5 h", "3 d" (from 48 hours on). app.js's
// human says the same.
func humanDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%d s", int64(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%d min", int64(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h", int64(d/time.Hour))
	}
	return fmt.Sprintf("%d d", int64(d/(24*time.Hour)))
}
