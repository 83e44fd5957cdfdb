package mysql

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// Complete writes a batch in several transactions: the completions with
// a result first, then the other outcomes, those without an error and
// those with one a statement each. When a later one fails, the earlier
// ones are committed: Complete reports them applied with its error. It
// reported none, so the completer wrote them again, had them refused by
// their fence, and took its own applied completion for a stale
// attempt's (a remote worker was answered that its lease was lost).
func TestCompletePartlyAppliedReportsTheApplied(t *testing.T) {
	for _, c := range []struct {
		name   string
		result json.RawMessage
	}{
		{"ResultsThenTheRest", json.RawMessage(`{"ok":true}`)},
		{"StatementsOfTheRest", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			d := migrated(t, driver.Options{}, nil)
			jobs := []driver.InsertParams{
				{Queue: "p", Kind: "k", Args: json.RawMessage(`{}`), MaxAttempts: 5},
				{Queue: "p", Kind: "k", Args: json.RawMessage(`{}`), MaxAttempts: 5},
			}
			// Enough other rows that the outcomes' statements reach
			// their jobs by primary key and lock those rows alone.
			for range 2000 {
				jobs = append(jobs, driver.InsertParams{Queue: "other", Kind: "k", Args: json.RawMessage(`{}`), MaxAttempts: 5})
			}
			if _, err := d.Insert(ctx, jobs); err != nil {
				t.Fatal(err)
			}
			if _, err := d.DB().ExecContext(ctx, "ANALYZE TABLE `"+d.prefix+"jobs`"); err != nil {
				t.Fatal(err)
			}
			rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "p", Limit: 2, Lease: time.Minute, Worker: "w"})
			if err != nil || len(rows) != 2 {
				t.Fatalf("claim: %d rows, %v", len(rows), err)
			}
			a, b := rows[0], rows[1]
			// b's row locked by another transaction: the statement of
			// b's outcome (with an error) waits for it until the call's
			// deadline, after a's committed.
			tx, err := d.DB().BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			var id int64
			if err := tx.QueryRowContext(ctx, "SELECT id FROM `"+d.prefix+"jobs` WHERE id = ? FOR UPDATE", b.ID).Scan(&id); err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			applied, err := d.Complete(cctx, []driver.Outcome{
				{ID: a.ID, Fence: a.Fence, Attempt: a.Attempt, State: driver.StateCompleted, Result: c.result},
				{ID: b.ID, Fence: b.Fence, Attempt: b.Attempt, State: driver.StateRetryable, RetryIn: time.Hour,
					Err: &driver.AttemptError{Attempt: b.Attempt, At: time.Now().UTC(), Error: "failed"}},
			})
			if err == nil {
				t.Fatal("complete succeeded with a row it writes locked past its deadline")
			}
			if j, err := d.GetJob(ctx, a.ID); err != nil || j.State != driver.StateCompleted {
				t.Fatalf("job %d: %+v, %v; want completed before the failure", a.ID, j, err)
			}
			if !slices.Equal(applied, []int64{a.ID}) {
				t.Fatalf("applied %v with the error %v; want [%d], whose statement committed", applied, err, a.ID)
			}
		})
	}
}
