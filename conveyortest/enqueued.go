package conveyortest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/conveyorq/conveyor"
)

// Filter narrows the jobs of kind T that an assertion considers. A nil
// *Filter, or the zero value, takes every job of the kind.
type Filter[T conveyor.JobArgs] struct {
	// Args, when set, must be contained in the job's arguments, compared
	// as JSON: JSON text (a string, []byte or json.RawMessage) or any
	// other value, encoded with encoding/json. Every key of an object must
	// be present in the job's with a value that contains it in turn
	// (objects recursively; arrays element by element, of the same length;
	// numbers, strings, booleans and null equal), so `{"to":
	// "a@example.com"}` matches arguments with that "to" whatever their
	// other keys. A struct is encoded with all its fields (zero ones
	// included, unless omitempty): give a map or JSON text to match a few.
	Args any
	// Match, when set, must return true for the job, whose Args are
	// decoded into T.
	Match func(job *conveyor.Job[T]) bool
	// Queue, when set, is the queue the job must be in.
	Queue string
	// States, when set, lists the states the job may be in; empty means
	// any state.
	States []conveyor.JobState
}

// Enqueued returns the committed jobs of T's kind that match f, oldest
// first, decoded. It fails t if the jobs cannot be read or f is invalid.
func Enqueued[T conveyor.JobArgs, TTx any](t testing.TB, c *conveyor.Client[TTx], f *Filter[T]) []*conveyor.Job[T] {
	t.Helper()
	m, _ := find(t, f, c.Jobs)
	return m
}

// EnqueuedTx returns the jobs of T's kind that match f as seen inside tx
// (the jobs it enqueued, before it commits, and the committed ones),
// oldest first, decoded. tx is of a type the client's EnqueueTx accepts:
// a *sql.Tx, or on PostgreSQL a pgx.Tx.
func EnqueuedTx[T conveyor.JobArgs, TTx any](t testing.TB, c *conveyor.Client[TTx], tx TTx, f *Filter[T]) []*conveyor.Job[T] {
	t.Helper()
	m, _ := find(t, f, inTx(c, tx))
	return m
}

// RequireEnqueued fails t unless at least one committed job of T's kind
// matches f, and returns the jobs that match, oldest first.
func RequireEnqueued[T conveyor.JobArgs, TTx any](t testing.TB, c *conveyor.Client[TTx], f *Filter[T]) []*conveyor.Job[T] {
	t.Helper()
	m, all := find(t, f, c.Jobs)
	if len(m) == 0 {
		t.Fatalf("conveyortest: no job of kind %q%s was enqueued (committed); %s", kindOf[T](), f.describe(), summary(all))
	}
	return m
}

// RequireEnqueuedTx fails t unless at least one job of T's kind that
// matches f is seen inside tx (before it commits), and returns the jobs
// that match, oldest first.
func RequireEnqueuedTx[T conveyor.JobArgs, TTx any](t testing.TB, c *conveyor.Client[TTx], tx TTx, f *Filter[T]) []*conveyor.Job[T] {
	t.Helper()
	m, all := find(t, f, inTx(c, tx))
	if len(m) == 0 {
		t.Fatalf("conveyortest: no job of kind %q%s was enqueued in the transaction; %s", kindOf[T](), f.describe(), summary(all))
	}
	return m
}

// RequireNotEnqueued fails t if any committed job of T's kind matches f.
func RequireNotEnqueued[T conveyor.JobArgs, TTx any](t testing.TB, c *conveyor.Client[TTx], f *Filter[T]) {
	t.Helper()
	if m, _ := find(t, f, c.Jobs); len(m) > 0 {
		t.Fatalf("conveyortest: %d jobs of kind %q%s were enqueued (committed), want none: %s", len(m), kindOf[T](), f.describe(), list(m))
	}
}

// RequireNotEnqueuedTx fails t if any job of T's kind that matches f is
// seen inside tx.
func RequireNotEnqueuedTx[T conveyor.JobArgs, TTx any](t testing.TB, c *conveyor.Client[TTx], tx TTx, f *Filter[T]) {
	t.Helper()
	if m, _ := find(t, f, inTx(c, tx)); len(m) > 0 {
		t.Fatalf("conveyortest: %d jobs of kind %q%s are in the transaction, want none: %s", len(m), kindOf[T](), f.describe(), list(m))
	}
}

// lister reads one page of jobs.
type lister func(ctx context.Context, f conveyor.JobFilter) ([]*conveyor.JobInfo, error)

// inTx is the lister of c's jobs inside tx.
func inTx[TTx any](c *conveyor.Client[TTx], tx TTx) lister {
	return func(ctx context.Context, f conveyor.JobFilter) ([]*conveyor.JobInfo, error) {
		return c.JobsTx(ctx, tx, f)
	}
}

// page is how many jobs one read lists.
const page = 1000

// find returns the jobs of T's kind that match f and every job of the
// kind read (for failure messages), failing t on an error.
func find[T conveyor.JobArgs](t testing.TB, f *Filter[T], ls lister) (matched []*conveyor.Job[T], all []*conveyor.JobInfo) {
	t.Helper()
	if f == nil {
		f = &Filter[T]{}
	}
	want, err := f.args()
	if err != nil {
		t.Fatalf("conveyortest: Filter.Args: %v", err)
	}
	jf := conveyor.JobFilter{Kind: kindOf[T](), Queue: f.Queue, States: f.States, Limit: page}
	for {
		jobs, err := ls(t.Context(), jf)
		if err != nil {
			t.Fatalf("conveyortest: listing jobs of kind %q: %v", jf.Kind, err)
		}
		for _, info := range jobs {
			all = append(all, info)
			if want != nil {
				var got any
				if err := decodeJSON(info.EncodedArgs, &got); err != nil {
					t.Fatalf("conveyortest: job %d: arguments %s: %v", info.ID, info.EncodedArgs, err)
				}
				if !contains(want, got) {
					continue
				}
			}
			job := &conveyor.Job[T]{JobInfo: info}
			if err := json.Unmarshal(info.EncodedArgs, &job.Args); err != nil {
				t.Fatalf("conveyortest: job %d: decoding its arguments %s into %T: %v", info.ID, info.EncodedArgs, job.Args, err)
			}
			if f.Match != nil && !f.Match(job) {
				continue
			}
			matched = append(matched, job)
		}
		if len(jobs) < page {
			return matched, all
		}
		jf.AfterID = jobs[len(jobs)-1].ID
	}
}

// kindOf is T's kind.
func kindOf[T conveyor.JobArgs]() string {
	var zero T
	return zero.Kind()
}

// args returns Filter.Args decoded as generic JSON, nil when unset.
func (f *Filter[T]) args() (any, error) {
	if f == nil || f.Args == nil {
		return nil, nil
	}
	var text []byte
	switch a := f.Args.(type) {
	case string:
		text = []byte(a)
	case []byte:
		text = a
	case json.RawMessage:
		text = a
	default:
		b, err := json.Marshal(a)
		if err != nil {
			return nil, err
		}
		text = b
	}
	var v any
	if err := decodeJSON(text, &v); err != nil {
		return nil, fmt.Errorf("%q is not JSON: %w", text, err)
	}
	return v, nil
}

// describe renders the filter for failure messages.
func (f *Filter[T]) describe() string {
	if f == nil {
		return ""
	}
	var parts []string
	if f.Args != nil {
		a, _ := f.args()
		b, _ := json.Marshal(a)
		parts = append(parts, "arguments containing "+string(b))
	}
	if f.Match != nil {
		parts = append(parts, "accepted by Match")
	}
	if f.Queue != "" {
		parts = append(parts, fmt.Sprintf("in queue %q", f.Queue))
	}
	if len(f.States) > 0 {
		parts = append(parts, fmt.Sprintf("in state %v", f.States))
	}
	if len(parts) == 0 {
		return ""
	}
	return " with " + strings.Join(parts, ", ")
}

// decodeJSON decodes text keeping numbers as json.Number, so that large
// integers compare exactly.
func decodeJSON(text []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(text))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return fmt.Errorf("trailing data after the JSON value")
	}
	return nil
}

// contains reports whether got contains want (see Filter.Args).
func contains(want, got any) bool {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return false
		}
		for k, wv := range w {
			gv, ok := g[k]
			if !ok || !contains(wv, gv) {
				return false
			}
		}
		return true
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if !contains(w[i], g[i]) {
				return false
			}
		}
		return true
	case json.Number:
		g, ok := got.(json.Number)
		if !ok {
			return false
		}
		if w == g {
			return true
		}
		wf, err1 := w.Float64()
		gf, err2 := g.Float64()
		return err1 == nil && err2 == nil && wf == gf
	default:
		return want == got
	}
}

// summary describes the jobs of the kind that exist, for a failure.
func summary(all []*conveyor.JobInfo) string {
	if len(all) == 0 {
		return "there is no job of the kind at all"
	}
	const show = 10
	var b strings.Builder
	fmt.Fprintf(&b, "%d jobs of the kind exist:", len(all))
	for i, j := range all {
		if i == show {
			fmt.Fprintf(&b, "\n\t... and %d more", len(all)-show)
			break
		}
		fmt.Fprintf(&b, "\n\tjob %d: queue %q, %s, arguments %s", j.ID, j.Queue, j.State, j.EncodedArgs)
	}
	return b.String()
}

// list describes matched jobs, for a failure.
func list[T conveyor.JobArgs](jobs []*conveyor.Job[T]) string {
	infos := make([]*conveyor.JobInfo, len(jobs))
	for i, j := range jobs {
		infos[i] = j.JobInfo
	}
	s := summary(infos)
	return s[strings.Index(s, ":")+1:]
}
