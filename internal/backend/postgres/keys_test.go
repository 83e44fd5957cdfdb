package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// TestMigrateKeysOnSegments applies migration 15 to a prefix whose jobs
// are already in segment tables (one converted by a release before key
// limits): every registered segment gets the lkey column, the ready ones
// the keyed claim's indexes, and the jobs already there keep working
// beside new keyed ones.
func TestMigrateKeysOnSegments(t *testing.T) {
	ctx := context.Background()
	d := open(t, driver.Options{})
	ids, err := d.Insert(ctx, []driver.InsertParams{pj("mk"), pj("mk")})
	if err != nil {
		t.Fatal(err)
	}
	// Back to version 14: what migration 15 adds, removed.
	var tbls []string
	rows, err := d.pool.Query(ctx, "SELECT tbl FROM "+d.prefix+"segments")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var tbl string
		if err := rows.Scan(&tbl); err != nil {
			t.Fatal(err)
		}
		tbls = append(tbls, tbl)
	}
	rows.Close()
	if len(tbls) == 0 {
		t.Fatal("no segment tables")
	}
	undo := []string{
		"DROP TABLE " + d.prefix + "key_slots",
		"ALTER TABLE " + d.prefix + "queues DROP COLUMN key_max_running, DROP COLUMN key_order",
		"DELETE FROM " + d.prefix + "schema_migrations WHERE version = 15",
	}
	for _, tbl := range tbls {
		undo = append(undo, "ALTER TABLE "+tbl+" DROP COLUMN lkey")
	}
	for _, q := range undo {
		if _, err := d.pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if v, _, err := d.SchemaVersion(ctx); err != nil || v != 14 {
		t.Fatalf("version %d, %v; want 14", v, err)
	}
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tbl := range tbls {
		var n int
		if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM information_schema.columns WHERE table_name = $1 AND column_name = 'lkey'", tbl).Scan(&n); err != nil || n != 1 {
			t.Fatalf("%s: lkey columns %d, %v", tbl, n, err)
		}
	}
	var idx int
	if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM pg_indexes WHERE indexname LIKE $1", d.prefix+"ready_%_key%idx").Scan(&idx); err != nil || idx == 0 {
		t.Fatalf("key indexes of the ready segments: %d, %v", idx, err)
	}
	// A process started after the migration (the statements this one
	// prepared name the tables as they were).
	o := openOther(t, d)
	keyed := pj("mk")
	keyed.Key = "tenant"
	more, err := o.Insert(ctx, []driver.InsertParams{keyed, keyed})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.SetQueueLimits(ctx, "mk", driver.QueueLimits{KeyMaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	r, err := o.ClaimLimited(ctx, driver.ClaimParams{Queue: "mk", Limit: 10, Lease: time.Minute, Worker: "w"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]string{}
	for _, row := range r.Rows {
		got[row.ID] = row.Key
	}
	if len(r.Rows) != 3 || got[ids[0]] != "" || got[ids[1]] != "" || got[more[0]] != "tenant" || !r.Held {
		t.Fatalf("claimed %v (held %v), want the 2 jobs from before and the key's first job", got, r.Held)
	}
}
