package torture

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/internal/testdb"
	"github.com/conveyorq/conveyor/lab"
)

// TestMissedByStats: a job unfinished in two readings of the tables, with
// Stats counting none in between, is one Stats missed; a job seen only in
// the later reading may have been committed after Stats read, and one seen
// only in the earlier may have finished meanwhile.
func TestMissedByStats(t *testing.T) {
	prev := map[int64]string{12: "running at attempt 2", 14: "available at attempt 0"}
	cur := map[int64]string{12: "running at attempt 2", 13: "available at attempt 0", 9: "retryable at attempt 1"}
	if got, want := missedByStats(prev, cur), []string{"job 12 running at attempt 2"}; !slices.Equal(got, want) {
		t.Fatalf("missed %q, want %q", got, want)
	}
	if got := missedByStats(nil, cur); len(got) != 0 {
		t.Fatalf("missed %q with no earlier reading", got)
	}
}

// TestUnfinishedSegRows: the orchestrator's own reading of a segments
// prefix finds its unfinished jobs in whichever phase they are (ready,
// waiting, running), with their state and attempt, and not the finished
// ones; asked for every job, it finds the finished ones too.
func TestUnfinishedSegRows(t *testing.T) {
	ctx := context.Background()
	dsn := testdb.Postgres(t)
	prefix := testdb.Prefix()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := openMigrated(ctx, dsn, &conveyor.Config{TablePrefix: prefix, Logger: quiet}, connect.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer func() { _ = lab.DropTables(context.WithoutCancel(ctx), c) }()
	adm, err := openAdmin(ctx, dsn, prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.close()

	claimed := make(chan struct{})
	done := make(chan struct{})
	conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[workJob]) error {
		if j.Args.Tok == "running" {
			close(claimed)
			<-done
		}
		return nil
	}))
	enqueue := func(tok string, opts *conveyor.EnqueueOpts) int64 {
		t.Helper()
		id, err := c.Enqueue(ctx, workJob{payload{Tok: tok}}, opts)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	completed := enqueue("completed", nil)
	if _, err := lab.WorkOne(ctx, c, completed); err != nil {
		t.Fatal(err)
	}
	cancelled := enqueue("cancelled", nil)
	if _, err := c.Cancel(ctx, cancelled); err != nil {
		t.Fatal(err)
	}
	later := enqueue("later", &conveyor.EnqueueOpts{Delay: time.Hour})
	ready := enqueue("ready", nil)
	running := enqueue("running", nil)
	worked := make(chan error, 1)
	go func() { _, err := lab.WorkOne(ctx, c, running); worked <- err }()
	<-claimed
	got, err := adm.unfinishedSegRows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	all, err := adm.segRows(ctx, false)
	close(done)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-worked; err != nil {
		t.Fatal(err)
	}
	want := map[int64]string{later: "scheduled at attempt 0", ready: "available at attempt 0", running: "running at attempt 1"}
	if !maps.Equal(got, want) {
		t.Fatalf("unfinished %v, want %v (completed %d, cancelled %d)", got, want, completed, cancelled)
	}
	want[completed], want[cancelled] = "completed at attempt 1", "cancelled at attempt 0"
	if !maps.Equal(all, want) {
		t.Fatalf("all rows %v, want %v", all, want)
	}
}

// TestDrainGoesOnWhileTablesHoldAJob replays the poison phase's failure:
// the client's Stats counted no unfinished job (its view of the segments
// was stale) while the hang job 12 was running; the drain ended, the
// workers were stopped, and the job was left available at attempt 2. The
// drain now ends only once the tables hold no unfinished job either, and
// reports the job Stats missed, once, naming when that Stats was called.
func TestDrainGoesOnWhileTablesHoldAJob(t *testing.T) {
	ctx := context.Background()
	statsCalls, tableReads := 0, 0
	var calls []time.Time
	stats := func(context.Context) (int64, error) {
		statsCalls++
		calls = append(calls, time.Now())
		return 0, nil // stale: job 12 is not counted
	}
	tables := func(context.Context) (map[int64]string, error) {
		tableReads++
		if tableReads <= 3 {
			return map[int64]string{12: "running at attempt 2"}, nil
		}
		return map[int64]string{}, nil // discarded at last
	}
	var reports [][]string
	var reportedAt []time.Time
	left, err := drainQueue(ctx, time.Now().Add(time.Minute), time.Millisecond, stats, tables, func(at time.Time, jobs []string) {
		reports = append(reports, jobs)
		reportedAt = append(reportedAt, at)
	})
	if err != nil || left != 0 {
		t.Fatalf("drain: %d left, %v", left, err)
	}
	if statsCalls != 4 || tableReads != 4 {
		t.Fatalf("drain ended after %d Stats and %d readings of the tables, want 4 and 4: it must go on while the tables hold job 12", statsCalls, tableReads)
	}
	if len(reports) != 1 || !slices.Equal(reports[0], []string{"job 12 running at attempt 2"}) || reportedAt[0].After(calls[1]) || !reportedAt[0].After(calls[0]) {
		t.Fatalf("reports %q at %v, want one naming job 12 at the second Stats call (%v)", reports, reportedAt, calls)
	}

	// Without a reading of the tables (other backends), or
	// when they agree, the drain ends on the first Stats that counts none.
	statsCalls, tableReads = 0, 3
	if left, err := drainQueue(ctx, time.Now().Add(time.Minute), time.Millisecond, stats, nil, nil); err != nil || left != 0 || statsCalls != 1 {
		t.Fatalf("without tables: %d left, %v, after %d Stats", left, err, statsCalls)
	}
	statsCalls = 0
	if left, err := drainQueue(ctx, time.Now().Add(time.Minute), time.Millisecond, stats, tables, nil); err != nil || left != 0 || statsCalls != 1 {
		t.Fatalf("tables empty: %d left, %v, after %d Stats", left, err, statsCalls)
	}
}

// TestFinalReadDiff: the final read is checked job by job against the
// tables: a job the client's Jobs left out (the smallpool phase's "lost"
// job 510, completed in a done segment made current after the reading
// client's view of the registry), one in another state or at another
// attempt, and one the tables do not hold are each named; agreeing reads
// give nothing.
func TestFinalReadDiff(t *testing.T) {
	jobs := map[int64]*FinalJob{
		1: {ID: 1, State: "completed", Attempt: 1},
		2: {ID: 2, State: "available", Attempt: 1},
		4: {ID: 4, State: "discarded", Attempt: 3},
	}
	rows := map[int64]string{1: "completed at attempt 1", 2: "completed at attempt 2", 3: "completed at attempt 1"}
	want := []string{
		"job 2 available at attempt 1 (completed at attempt 2 in the tables)",
		"job 3 missing (completed at attempt 1 in the tables)",
		"job 4 discarded at attempt 3 (not in the tables)",
	}
	if got := finalReadDiff(jobs, rows); !slices.Equal(got, want) {
		t.Fatalf("diff %q, want %q", got, want)
	}
	delete(jobs, 4)
	rows[2] = "available at attempt 1"
	jobs[3] = &FinalJob{ID: 3, State: "completed", Attempt: 1}
	if got := finalReadDiff(jobs, rows); len(got) != 0 {
		t.Fatalf("diff %q for agreeing reads", got)
	}
}
