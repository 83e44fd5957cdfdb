package mysql

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// TestOptimisticClaimKeepsWhatItTook: an optimistic claim's UPDATE
// commits the rows it takes at once, so a claim that fails after one
// (its context ends before the rows are read back, or before a further
// round after a conflict) still hands them out; before, it returned the
// error and the rows stayed running with an attempt used and no worker,
// until their lease expired (and a job on its last attempt was then
// discarded without having run).
func TestOptimisticClaimKeepsWhatItTook(t *testing.T) {
	for _, c := range []struct {
		name     string
		conflict bool // another claimer takes the first job between the window read and the UPDATE
	}{{"read back", false}, {"second round", true}} {
		t.Run(c.name, func(t *testing.T) {
			d := migrated(t, driver.Options{ClaimStrategy: "optimistic"}, nil)
			bg := context.Background()
			jobs := make([]driver.InsertParams, 3)
			for i := range jobs {
				jobs[i] = driver.InsertParams{Queue: "o", Kind: "k", Args: json.RawMessage(`{}`), MaxAttempts: 1}
			}
			ids, err := d.Insert(bg, jobs)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			windows, taken := 0, 0
			d.claimStep = func(step string) {
				switch step {
				case "window":
					windows++
					if c.conflict && windows == 1 {
						if _, err := d.ClaimJob(bg, ids[0], time.Minute, "other"); err != nil {
							t.Errorf("claim job: %v", err)
						}
					}
				case "taken":
					taken++
					if taken == 1 {
						cancel() // the caller goes away once the first UPDATE committed
					}
				}
			}
			rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "o", Limit: 3, Lease: time.Minute, Worker: "w"})
			d.claimStep = nil
			if taken == 0 {
				t.Fatalf("no UPDATE took rows (err %v)", err)
			}
			want := 3
			if c.conflict {
				want = 2
			}
			// Every running job of the claimer's is one it was handed.
			handed := map[int64]bool{}
			for _, r := range rows {
				handed[r.ID] = true
			}
			running := 0
			for _, id := range ids {
				j, gerr := d.GetJob(bg, id)
				if gerr != nil {
					t.Fatal(gerr)
				}
				if j.State == driver.StateRunning && j.AttemptedBy == "w" {
					running++
					if !handed[id] {
						t.Errorf("job %d is running for the claimer, which was not handed it (claim error: %v)", id, err)
					}
				}
			}
			if running != want || len(rows) != want || err != nil {
				t.Fatalf("claim returned %d rows, err %v; %d jobs running for it, want %d", len(rows), err, running, want)
			}
		})
	}
}
