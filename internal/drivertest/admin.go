package drivertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// admin runs the suite's tests of the admin operations on one job (cancel,
// discard, retry, get) and the job lists, outside and inside a transaction.
func admin(t *testing.T, s suite) {
	ctx := context.Background()

	t.Run("AdminAndStats", func(t *testing.T) {
		d := s.setup(t)
		ids, _ := d.Insert(ctx, []driver.InsertParams{job("x", 0), job("x", 0), job("y", 0)})
		if _, err := d.Retry(ctx, ids[0]); !errors.Is(err, driver.ErrWrongState) {
			t.Fatalf("retry of available job: %v, want ErrWrongState", err)
		}
		j, err := d.Cancel(ctx, ids[0])
		if err != nil || j.State != driver.StateCancelled {
			t.Fatalf("cancel: %+v %v", j, err)
		}
		if _, err := d.Cancel(ctx, ids[0]); !errors.Is(err, driver.ErrWrongState) {
			t.Fatalf("second cancel: %v", err)
		}
		j, err = d.Discard(ctx, ids[1])
		if err != nil || j.State != driver.StateDiscarded {
			t.Fatalf("discard: %+v %v", j, err)
		}
		j, err = d.Retry(ctx, ids[1])
		if err != nil || j.State != driver.StateAvailable || j.MaxAttempts < j.Attempt+1 {
			t.Fatalf("retry: %+v %v", j, err)
		}
		if _, err := d.GetJob(ctx, 1<<40); !errors.Is(err, driver.ErrNotFound) {
			t.Fatalf("get missing: %v", err)
		}
		list, err := d.ListJobs(ctx, driver.JobFilter{Queue: "x"})
		if err != nil || len(list) != 2 {
			t.Fatalf("list queue x: %d %v", len(list), err)
		}
		list, _ = d.ListJobs(ctx, driver.JobFilter{States: []string{driver.StateCancelled}})
		if len(list) != 1 || list[0].ID != ids[0] {
			t.Fatalf("list cancelled: %v", list)
		}
		st, err := d.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		byQ := map[string]driver.QueueStats{}
		for _, s := range st {
			byQ[s.Queue] = s
		}
		if byQ["x"].Counts[driver.StateAvailable] != 1 || byQ["x"].Counts[driver.StateCancelled] != 1 || byQ["y"].Counts[driver.StateAvailable] != 1 {
			t.Fatalf("stats: %+v", st)
		}
		if _, ok := byQ["x"].Counts[driver.StateDiscarded]; !ok {
			t.Fatalf("stats omit zero states: %+v", byQ["x"].Counts)
		}
	})

	// ListJobsTx reads inside the application's transaction: it sees the
	// jobs that transaction inserted before it commits, which nothing
	// outside sees.
	t.Run("ListJobsTx", func(t *testing.T) {
		d := s.setup(t)
		if _, err := d.ListJobsTx(ctx, "not a transaction", driver.JobFilter{}); !errors.Is(err, driver.ErrTxType) {
			t.Fatalf("list in a string: %v, want ErrTxType", err)
		}
		before, err := d.Insert(ctx, []driver.InsertParams{job("t", 0)})
		if err != nil {
			t.Fatal(err)
		}
		tx, rollback := beginTx(t, d)
		a, b := job("t", 0), job("u", 1)
		b.Kind = "other"
		b.Delay = time.Hour
		ids, err := d.InsertTx(ctx, tx, []driver.InsertParams{a, b})
		if err != nil {
			t.Fatal(err)
		}
		all, err := d.ListJobsTx(ctx, tx, driver.JobFilter{})
		if err != nil || len(all) != 3 || all[0].ID != before[0] || all[1].ID != ids[0] || all[2].ID != ids[1] {
			t.Fatalf("list in the transaction: %d jobs %v, want the committed one and the two inserted", len(all), err)
		}
		if j := all[2]; j.Kind != "other" || j.Queue != "u" || j.State != driver.StateScheduled || j.Priority != 1 || j.Attempt != 0 ||
			time.Until(j.ScheduledAt) < 50*time.Minute || j.CreatedAt.IsZero() || !j.AttemptedAt.IsZero() || j.Errors != nil || string(j.Args) != `{"a":1}` && string(j.Args) != `{"a": 1}` {
			t.Fatalf("job read in the transaction: %+v (args %s)", j, j.Args)
		}
		for _, c := range []struct {
			f    driver.JobFilter
			want []int64
		}{
			{driver.JobFilter{Kind: "other"}, ids[1:]},
			{driver.JobFilter{Queue: "t"}, []int64{before[0], ids[0]}},
			{driver.JobFilter{States: []string{driver.StateScheduled}}, ids[1:]},
			{driver.JobFilter{AfterID: before[0], Limit: 1}, ids[:1]},
		} {
			got, err := d.ListJobsTx(ctx, tx, c.f)
			if err != nil {
				t.Fatal(err)
			}
			var gotIDs []int64
			for _, j := range got {
				gotIDs = append(gotIDs, j.ID)
			}
			if fmt.Sprint(gotIDs) != fmt.Sprint(c.want) {
				t.Fatalf("list %+v in the transaction: %v, want %v", c.f, gotIDs, c.want)
			}
		}
		rollback()
		outside, err := d.ListJobs(ctx, driver.JobFilter{})
		if err != nil || len(outside) != 1 {
			t.Fatalf("after the rollback: %d jobs %v, want only the committed one", len(outside), err)
		}
	})
}
