package drivertest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// listNewestFirst checks ListJobs with Desc and BeforeID: newest first,
// bounded on both sides, across every state (on PostgreSQL's segments,
// across the phases' tables), and paged back by BeforeID without a job
// skipped or repeated while jobs are inserted between the pages.
func listNewestFirst(t *testing.T, d driver.Driver) {
	ctx := context.Background()
	// Ten jobs: queues a and b in turn, job 7 of kind other; then
	// jobs 0 and 1 running, job 0 completed, job 2 cancelled, job 9
	// scheduled.
	in := make([]driver.InsertParams, 10)
	for i := range in {
		in[i] = job([]string{"a", "b"}[i%2], 0)
	}
	in[7].Kind = "other"
	in[9].Delay = time.Hour
	ids, err := d.Insert(ctx, in)
	if err != nil || len(ids) != 10 {
		t.Fatalf("insert: %v %v", ids, err)
	}
	ra, err := d.Claim(ctx, driver.ClaimParams{Queue: "a", Limit: 1, Lease: time.Minute, Worker: "w"})
	if err != nil || len(ra) != 1 || ra[0].ID != ids[0] {
		t.Fatalf("claim a: %v %v", ra, err)
	}
	rb, err := d.Claim(ctx, driver.ClaimParams{Queue: "b", Limit: 1, Lease: time.Minute, Worker: "w"})
	if err != nil || len(rb) != 1 || rb[0].ID != ids[1] {
		t.Fatalf("claim b: %v %v", rb, err)
	}
	done, err := d.Complete(ctx, []driver.Outcome{{ID: ids[0], Fence: ra[0].Fence, Attempt: 1, State: driver.StateCompleted}})
	if err != nil || len(done) != 1 {
		t.Fatalf("complete: %v %v", done, err)
	}
	if _, err := d.Cancel(ctx, ids[2]); err != nil {
		t.Fatal(err)
	}
	rev := func(xs ...int64) []int64 { out := slices.Clone(xs); slices.Reverse(out); return out }
	pick := func(is ...int) []int64 {
		var out []int64
		for _, i := range is {
			out = append(out, ids[i])
		}
		return out
	}
	list := func(f driver.JobFilter) []int64 {
		t.Helper()
		got, err := d.ListJobs(ctx, f)
		if err != nil {
			t.Fatalf("list %+v: %v", f, err)
		}
		var out []int64
		for _, j := range got {
			out = append(out, j.ID)
		}
		return out
	}
	for _, c := range []struct {
		f    driver.JobFilter
		want []int64
	}{
		{driver.JobFilter{Desc: true}, rev(ids...)},
		{driver.JobFilter{Desc: true, Limit: 3}, pick(9, 8, 7)},
		{driver.JobFilter{Desc: true, BeforeID: ids[5], Limit: 2}, pick(4, 3)},
		{driver.JobFilter{Desc: true, BeforeID: ids[5]}, pick(4, 3, 2, 1, 0)},
		{driver.JobFilter{Desc: true, AfterID: ids[2], BeforeID: ids[6]}, pick(5, 4, 3)},
		{driver.JobFilter{AfterID: ids[2], BeforeID: ids[6]}, pick(3, 4, 5)},
		{driver.JobFilter{BeforeID: ids[3], Limit: 2}, pick(0, 1)},
		{driver.JobFilter{Desc: true, Queue: "a", BeforeID: ids[8]}, pick(6, 4, 2, 0)},
		{driver.JobFilter{Desc: true, Kind: "other"}, pick(7)},
		{driver.JobFilter{Desc: true, States: []string{driver.StateAvailable}, Limit: 4}, pick(8, 7, 6, 5)},
		{driver.JobFilter{Desc: true, States: []string{driver.StateCompleted, driver.StateCancelled, driver.StateRunning}}, pick(2, 1, 0)},
		{driver.JobFilter{Desc: true, States: []string{driver.StateScheduled, driver.StateCompleted}, BeforeID: ids[9]}, pick(0)},
		{driver.JobFilter{Desc: true, BeforeID: ids[0]}, nil},
	} {
		if got := list(c.f); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("list %+v: %v, want %v", c.f, got, c.want)
		}
	}

	// Paged back three at a time, with jobs inserted between the pages:
	// the pages hold every job that existed at the first, once each, in
	// descending order; the new ones are above the first page.
	var seen []int64
	f := driver.JobFilter{Desc: true, Limit: 3}
	for page := 0; ; page++ {
		got := list(f)
		seen = append(seen, got...)
		if len(got) < f.Limit {
			break
		}
		if page > 10 {
			t.Fatalf("paging does not end: %v", seen)
		}
		if _, err := d.Insert(ctx, []driver.InsertParams{job("a", 0), job("b", 0)}); err != nil {
			t.Fatal(err)
		}
		f.BeforeID = got[len(got)-1]
	}
	if fmt.Sprint(seen) != fmt.Sprint(rev(ids...)) {
		t.Errorf("pages newest first while inserting: %v, want %v", seen, rev(ids...))
	}
	// The jobs inserted meanwhile (two after each of the three full
	// pages) are the newer ones above the first page: an ascending read
	// after it.
	newer := list(driver.JobFilter{AfterID: ids[9]})
	if len(newer) != 6 || !slices.IsSorted(newer) || newer[0] <= ids[9] {
		t.Errorf("jobs inserted while paging, read after the first page: %v", newer)
	}

	// The same in the caller's transaction.
	tx, rollback := beginTx(t, d)
	defer rollback()
	got, err := d.ListJobsTx(ctx, tx, driver.JobFilter{Desc: true, Queue: "b", BeforeID: ids[9], Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != ids[7] || got[1].ID != ids[5] {
		t.Errorf("list newest first in a transaction: %d jobs, want %v", len(got), pick(7, 5))
	}
}
