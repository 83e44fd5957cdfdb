package drivertest

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// inserts runs the suite's tests of the insert paths: metadata through each
// of them, and bulk inserts.
func inserts(t *testing.T, s suite) {
	ctx := context.Background()

	// Metadata (the meta column) goes in through every insert path and
	// comes back from every statement that returns jobs; a job without
	// any has none.
	t.Run("Metadata", func(t *testing.T) {
		d := s.setup(t)
		metaOf := func(r *driver.JobRow) map[string]string {
			t.Helper()
			if r.Meta == nil {
				return nil
			}
			var m map[string]string
			if err := json.Unmarshal(r.Meta, &m); err != nil {
				t.Fatalf("job %d: meta %q does not decode: %v", r.ID, r.Meta, err)
			}
			return m
		}
		withMeta := func(queue, v string) driver.InsertParams {
			j := job(queue, 0)
			j.Meta = json.RawMessage(`{"traceparent":"` + v + `","q\"uote":"\\ é"}`)
			return j
		}
		check := func(what string, r *driver.JobRow, v string) {
			t.Helper()
			m := metaOf(r)
			if v == "" {
				if r.Meta != nil {
					t.Fatalf("%s: job %d has meta %s, want none", what, r.ID, r.Meta)
				}
				return
			}
			if len(m) != 2 || m["traceparent"] != v || m[`q"uote`] != `\ é` {
				t.Fatalf("%s: job %d meta %v (%s), want traceparent %q and the quoted key", what, r.ID, m, r.Meta, v)
			}
		}
		// Insert: a batch mixing jobs with and without metadata, and one
		// without any.
		ids, err := d.Insert(ctx, []driver.InsertParams{withMeta("m", "a"), job("m", 0), withMeta("m", "c")})
		if err != nil {
			t.Fatal(err)
		}
		plain, err := d.Insert(ctx, []driver.InsertParams{job("m", 0)})
		if err != nil {
			t.Fatal(err)
		}
		want := map[int64]string{ids[0]: "a", ids[1]: "", ids[2]: "c", plain[0]: ""}
		for id, v := range want {
			j, err := d.GetJob(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			check("get", j, v)
		}
		list, err := d.ListJobs(ctx, driver.JobFilter{Queue: "m"})
		if err != nil || len(list) != 4 {
			t.Fatalf("list: %d jobs, %v", len(list), err)
		}
		for _, j := range list {
			check("list", j, want[j.ID])
		}
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "m", Limit: 10, Lease: time.Minute, Worker: "w"})
		if err != nil || len(rows) != 4 {
			t.Fatalf("claim: %d rows, %v", len(rows), err)
		}
		for _, r := range rows {
			check("claim", r, want[r.ID])
		}
		c, err := d.Cancel(ctx, ids[0])
		if err != nil {
			t.Fatal(err)
		}
		check("cancel", c, "a")
		r, err := d.Retry(ctx, ids[0])
		if err != nil {
			t.Fatal(err)
		}
		check("retry", r, "a")
		cj, err := d.ClaimJob(ctx, ids[0], time.Minute, "w")
		if err != nil {
			t.Fatal(err)
		}
		check("claim job", cj, "a")

		// In the caller's transaction.
		tx, rollback := beginTx(t, d)
		txIDs, err := d.InsertTx(ctx, tx, []driver.InsertParams{job("tx", 0), withMeta("tx", "t")})
		if err != nil {
			rollback()
			t.Fatal(err)
		}
		inTx, err := d.ListJobsTx(ctx, tx, driver.JobFilter{Queue: "tx"})
		if err != nil || len(inTx) != 2 {
			rollback()
			t.Fatalf("list in tx: %d jobs, %v", len(inTx), err)
		}
		check("list in tx", inTx[0], "")
		check("list in tx", inTx[1], "t")
		rollback()
		_ = txIDs

		// Unique jobs: the inserted one keeps its metadata; a duplicate's
		// is not stored (the holder's stays).
		u := withMeta("u", "u1")
		u.UniqueKey = []byte("meta-key")
		u2 := job("u", 0)
		u2.UniqueKey = []byte("meta-key2")
		uids, dup, err := d.InsertUnique(ctx, nil, []driver.InsertParams{u, u2})
		if err != nil || dup[0] || dup[1] {
			t.Fatalf("insert unique: %v %v", dup, err)
		}
		again := withMeta("u", "u2")
		again.UniqueKey = []byte("meta-key")
		if got, dup, err := d.InsertUnique(ctx, nil, []driver.InsertParams{again}); err != nil || !dup[0] || got[0] != uids[0] {
			t.Fatalf("duplicate: %v %v %v", got, dup, err)
		}
		urows, err := d.Claim(ctx, driver.ClaimParams{Queue: "u", Limit: 10, Lease: time.Minute, Worker: "w"})
		if err != nil || len(urows) != 2 {
			t.Fatalf("claim unique: %d, %v", len(urows), err)
		}
		for _, r := range urows {
			if r.ID == uids[0] {
				check("claim unique", r, "u1")
			} else {
				check("claim unique", r, "")
			}
		}

		// Bulk insert (COPY on PostgreSQL).
		bulk := make([]driver.InsertParams, 50)
		for i := range bulk {
			if i%2 == 0 {
				bulk[i] = withMeta("bulk", fmt.Sprint(i))
			} else {
				bulk[i] = job("bulk", 0)
			}
		}
		if n, err := d.BulkInsert(ctx, bulk); err != nil || n != 50 {
			t.Fatalf("bulk insert: %d, %v", n, err)
		}
		brows, err := d.Claim(ctx, driver.ClaimParams{Queue: "bulk", Limit: 100, Lease: time.Minute, Worker: "w"})
		if err != nil || len(brows) != 50 {
			t.Fatalf("claim bulk: %d, %v", len(brows), err)
		}
		sort.Slice(brows, func(i, j int) bool { return brows[i].ID < brows[j].ID })
		for i, r := range brows {
			if i%2 == 0 {
				check("claim bulk", r, fmt.Sprint(i))
			} else {
				check("claim bulk", r, "")
			}
		}
	})

	t.Run("BulkInsert", func(t *testing.T) {
		d := s.setup(t)
		in := make([]driver.InsertParams, 2500)
		for i := range in {
			in[i] = job("bulk", 0)
		}
		in[0].Delay = time.Hour
		n, err := d.BulkInsert(ctx, in)
		if err != nil || n != int64(len(in)) {
			t.Fatalf("bulk insert %d err %v", n, err)
		}
		st, _ := d.Stats(ctx)
		for _, s := range st {
			if s.Queue == "bulk" && (s.Counts[driver.StateAvailable] != 2499 || s.Counts[driver.StateScheduled] != 1) {
				t.Fatalf("bulk counts %v", s.Counts)
			}
		}
	})
}
