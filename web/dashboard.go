package web

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/conveyorq/conveyor"
)

// page is what every dashboard template gets.
type page struct {
	Base      string
	Page      string // "queues", "jobs", "job", "login", "error"
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
var pageNames = []string{"login", "error", "queues", "jobs", "job"}

// templates maps a page name to its parsed template.
type templates map[string]*template.Template

func parseTemplates() (templates, error) {
	funcs := template.FuncMap{
		"tm": func(t *jsonTime) string {
			if t == nil {
				return "–"
			}
			return time.Time(*t).UTC().Format("2006-01-02 15:04:05.000Z")
		},
		"tmv": func(t jsonTime) string {
			return time.Time(t).UTC().Format("2006-01-02 15:04:05.000Z")
		},
		"ms": func(ms *int64) string {
			if ms == nil {
				return "–"
			}
			return (time.Duration(*ms) * time.Millisecond).Round(time.Millisecond).String()
		},
		"deref": func(s *string) string {
			if s == nil {
				return ""
			}
			return *s
		},
		"lastErr": func(errs []attemptJSON) string {
			if len(errs) == 0 {
				return ""
			}
			s, _, _ := strings.Cut(errs[len(errs)-1].Error, "\n")
			if len(s) > 120 {
				s = strings.ToValidUTF8(s[:120], "") + "…"
			}
			return s
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

// render writes a page with status.
func (h *Handler) render(w http.ResponseWriter, status int, name string, p page) {
	p.Base, p.Page = h.opts.BasePath, name
	var buf bytes.Buffer
	if err := h.tmpl[name].ExecuteTemplate(&buf, "base", p); err != nil {
		h.opts.Logger.Error("conveyor web: rendering a page", "page", name, "err", err)
		http.Error(w, "internal error rendering the page (logged by the server)", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
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
	pg, err := h.listJobs(r, f)
	if err != nil {
		status, msg := h.classify(r, err)
		h.renderError(w, r, p, status, msg)
		return
	}
	link := func(after int64) string {
		v := url.Values{}
		for k, val := range r.URL.Query() {
			if k != "after" && len(val) > 0 && val[0] != "" {
				v[k] = val
			}
		}
		if after > 0 {
			v.Set("after", strconv.FormatInt(after, 10))
		}
		if len(v) == 0 {
			return h.opts.BasePath + "/jobs"
		}
		return h.opts.BasePath + "/jobs?" + v.Encode()
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
		Page      *jobPage
		ScanLimit int
		NextURL   string
		FirstURL  string
	}{Back: backURL(h.opts.BasePath+"/jobs", r.URL.Query()), Query: f, State: state, States: stateNames(), Page: pg, ScanLimit: textScanLimit, FirstURL: link(0)}
	if pg.NextAfter != nil {
		data.NextURL = link(*pg.NextAfter)
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
	jj := toJobJSON(j)
	pg := h.pageFor(p, fmt.Sprintf("Job %d", id), struct {
		Job      jobJSON
		Args     string
		CanRetry bool
		CanStop  bool
	}{jj, prettyArgs(j.EncodedArgs), canRetry(jj.State), canStop(jj.State)})
	pg.Flash = flashes[r.URL.Query().Get("ok")]
	h.render(w, http.StatusOK, "job", pg)
}

// prettyArgs indents arguments for reading, with '<', '>' and '&' as
// themselves rather than the \u003c escapes encoding/json stores (the
// template escapes the text for HTML). Objects' keys come out sorted.
func prettyArgs(raw json.RawMessage) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return string(raw)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if enc.Encode(v) != nil {
		return string(raw)
	}
	return strings.TrimSuffix(b.String(), "\n")
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
	if _, ok := flashes[action]; !ok || action == "pause" || action == "resume" {
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
	v := url.Values{}
	for k, val := range q {
		if k != "bulk" && k != "done" && k != "refused" {
			v[k] = val
		}
	}
	if len(v) == 0 {
		return path
	}
	return path + "?" + v.Encode()
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

// queueRE is conveyor's rule for queue names.
var queueRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)

func checkQueueName(q string) error {
	if !queueRE.MatchString(q) {
		return fmt.Errorf("queue name %q: 1 to 128 letters, digits, '_', '.', ':' or '-', starting with a letter or digit", q)
	}
	return nil
}
