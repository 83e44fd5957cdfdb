package sqlite

import (
	"strings"
	"testing"

	"github.com/conveyorq/conveyor/internal/driver"
)

// TestQueryPlans checks that the hot statements use the indexes they were
// designed around: claims walk the partial claim index in order (no sort),
// batch statements look jobs up by id, maintenance uses its partial index.
func TestQueryPlans(t *testing.T) {
	d := migrated(t)
	for _, tc := range []struct {
		name    string
		query   string
		args    []any
		want    []string
		wantNot []string
	}{
		{"claim", d.q.Claim, []any{"q", 10, 1, "w"}, []string{"INDEX conveyor_jobs_claim (queue=?)", "INTEGER PRIMARY KEY (rowid=?)"}, []string{"TEMP B-TREE", "SCAN conveyor_jobs"}},
		{"complete", d.q.Complete, []any{"[]"}, []string{"INTEGER PRIMARY KEY (rowid=?)"}, []string{"SCAN conveyor_jobs"}},
		{"heartbeat", d.q.Heartbeat, []any{"[]", 1}, []string{"INTEGER PRIMARY KEY (rowid=?)"}, []string{"SCAN conveyor_jobs"}},
		{"release", d.q.Release, []any{"[]"}, []string{"INTEGER PRIMARY KEY (rowid=?)"}, []string{"SCAN conveyor_jobs"}},
		{"rescue", d.q.Rescue, []any{1}, []string{"INDEX conveyor_jobs_lease (lease_expires_at<?)"}, []string{"SCAN conveyor_jobs"}},
		{"promote", d.q.Promote, []any{1}, []string{"INDEX conveyor_jobs_due (scheduled_at<?)"}, []string{"SCAN conveyor_jobs"}},
		{"prune", d.q.Prune, []any{1, 1, 1}, []string{"INDEX conveyor_jobs_finalized (finalized_at<?)"}, []string{"SCAN conveyor_jobs"}},
		{"insert", d.q.Insert, []any{"[]"}, nil, []string{"SCAN conveyor_jobs", "TEMP B-TREE"}},
		// An insert that claims probes each job's queue for a pause by
		// the queues' primary key.
		{"insert claim", d.q.InsertClaim, []any{"[]", "", 1, "w"}, []string{"conveyor_queues_1 (name=?)"}, []string{"SCAN conveyor_jobs", "SCAN q", "TEMP B-TREE"}},
		// Queue limits: a limited claim counts its queue's running jobs
		// in jobs_running (migration 16), index entries only, less those
		// of the owners of its blocks, one probe each (migration 18),
		// and reads its blocks and its rate slots by key, in slot order;
		// so does the usage.
		{"limits of", d.q.LimitsOf, []any{"q", 0}, []string{"COVERING INDEX conveyor_jobs_running (queue=?)", "COVERING INDEX conveyor_jobs_running (queue=? AND attempted_by=?)", "PRIMARY KEY (queue=? AND type=? AND lkey=?)"}, []string{"SCAN conveyor_jobs", "jobs_lease", "jobs_queue_list", "SCAN conveyor_limit_slots"}},
		{"limit usage", d.q.LimitUsage, nil, []string{"COVERING INDEX conveyor_jobs_running (queue=?)", "COVERING INDEX conveyor_jobs_running (queue=? AND attempted_by=?)"}, []string{"SCAN conveyor_jobs", "jobs_lease", "jobs_queue_list", "SCAN conveyor_limit_slots"}},
		// Blocks (migration 18): an owner's slots of a queue by key, in
		// slot order, and whether the queue has a limit by its name; the
		// slots in use as limits_of counts them; Rescue reads the expired
		// blocks by limit_slots_blocks, one probe of jobs_running each.
		{"block give back", d.q.BlockGiveBack, []any{"q", "o", 3}, []string{"PRIMARY KEY (queue=? AND type=? AND lkey=?)", "conveyor_queues_1 (name=?)"}, []string{"SCAN conveyor_limit_slots", "SCAN conveyor_queues", "TEMP B-TREE"}},
		{"block renew", d.q.BlockRenew, []any{"q", "o", 1}, []string{"PRIMARY KEY (queue=? AND type=? AND lkey=?)"}, []string{"SCAN conveyor_limit_slots"}},
		{"block room", d.q.BlockRoom, []any{"q"}, []string{"COVERING INDEX conveyor_jobs_running (queue=?)", "COVERING INDEX conveyor_jobs_running (queue=? AND attempted_by=?)"}, []string{"SCAN conveyor_jobs", "SCAN conveyor_limit_slots"}},
		{"block take", d.q.BlockTake, []any{"q", "o", 1, 5, 2}, []string{"PRIMARY KEY (queue=? AND type=? AND lkey=?)"}, []string{"SCAN conveyor_limit_slots", "TEMP B-TREE"}},
		{"sweep blocks", d.q.SweepBlocks, nil, []string{"INDEX conveyor_limit_slots_blocks (expires_at<?)", "COVERING INDEX conveyor_jobs_running (queue=? AND attempted_by=?)"}, []string{"SCAN conveyor_limit_slots", "SCAN conveyor_jobs"}},
		{"free rate slots", d.q.FreeRateSlots, []any{"q", 5, 1, 5}, []string{"PRIMARY KEY (queue=? AND type=? AND lkey=? AND n<?)"}, []string{"SCAN conveyor_limit_slots", "TEMP B-TREE"}},
		{"take rate slot", d.q.TakeRateSlot, []any{"q", 1, 1}, []string{"PRIMARY KEY (queue=? AND type=? AND lkey=? AND n=?)"}, nil},
		// Key limits: a keyed claim probes the keys of due jobs and a
		// key's next jobs in jobs_key (jobs_key_order by id), index
		// entries only, in order; its jobs without a key within
		// jobs_claim, which carries the key; the ends of attempts find
		// a key's slots by primary key.
		{"next keys", d.q.NextKeys, []any{"q", "a", 5}, []string{"COVERING INDEX conveyor_jobs_key (queue=? AND lkey>?)"}, []string{"TEMP B-TREE"}},
		{"next keys heads", d.q.NextKeysHeads, []any{"q", "a", 5}, []string{"COVERING INDEX conveyor_jobs_key (queue=? AND lkey>?)", "COVERING INDEX conveyor_jobs_key (queue=? AND lkey=?)", "PRIMARY KEY (queue=? AND lkey=? AND n=?)"}, []string{"SCAN conveyor_key_slots", "SCAN conveyor_jobs\n"}},
		{"next keys heads ordered", d.q.NextKeysHeadsOrd, []any{"q", "a", 5}, []string{"COVERING INDEX conveyor_jobs_key (queue=? AND lkey>?)", "COVERING INDEX conveyor_jobs_key_order (queue=? AND lkey=?)", "PRIMARY KEY (queue=? AND lkey=? AND n=?)"}, []string{"SCAN conveyor_key_slots", "SCAN conveyor_jobs\n"}},
		{"key jobs", d.q.KeyJobs, []any{"q", "a", 3}, []string{"COVERING INDEX conveyor_jobs_key (queue=? AND lkey=?)"}, []string{"TEMP B-TREE"}},
		{"key jobs ordered", d.q.KeyJobsOrdered, []any{"q", "a", 3}, []string{"COVERING INDEX conveyor_jobs_key_order (queue=? AND lkey=?)"}, []string{"TEMP B-TREE"}},
		{"claim unkeyed", d.q.ClaimUnkeyed, []any{"q", 10, 1, "w"}, []string{"COVERING INDEX conveyor_jobs_claim (queue=?)", "INTEGER PRIMARY KEY (rowid=?)"}, []string{"TEMP B-TREE", "SCAN conveyor_jobs"}},
		{"claim ids", d.q.ClaimIDs, []any{"[1]", 1, "w"}, []string{"INTEGER PRIMARY KEY (rowid=?)"}, []string{"SCAN conveyor_jobs"}},
		{"open key slots", d.q.OpenKeySlots, []any{"q", "a", 2}, []string{"PRIMARY KEY (queue=? AND lkey=? AND n>?)"}, []string{"SCAN conveyor_key_slots", "TEMP B-TREE"}},
		{"key rate slots", d.q.KeyRateSlots, []any{"q", "a", 2}, []string{"PRIMARY KEY (queue=? AND lkey=? AND n>? AND n<?)"}, []string{"SCAN conveyor_key_slots", "TEMP B-TREE"}},
		{"take key rate slot", d.q.TakeKeyRateSlot, []any{"q", "a", -1, 1}, []string{"PRIMARY KEY (queue=? AND lkey=? AND n=?)"}, nil},
		{"take key slots", d.q.TakeKeySlots, []any{"q", `[["a",0,1,1,1]]`}, nil, []string{"SCAN conveyor_key_slots"}},
		{"free key slots", d.q.FreeKeySlots, []any{"[]"}, []string{"PRIMARY KEY (queue=? AND lkey=?)"}, []string{"SCAN s", "SCAN conveyor_key_slots"}},
		// The jobs awaiting dependencies: the open batches' index alone.
		{"awaiting dependencies", d.q.AwaitingDeps, nil, []string{"INDEX conveyor_batches_open"}, []string{"SCAN conveyor_batches\n"}},
		// A job's batch: one probe of each index of migration 15.
		{"job batch", d.q.JobBatch, []any{1}, []string{"COVERING INDEX conveyor_batch_jobs_job (job_id=?)", "INDEX conveyor_batches_callback (callback_id=?)", "COVERING INDEX conveyor_batch_deps_dep (dep_batch_id=?)"}, []string{"SCAN conveyor_batch_jobs", "SCAN conveyor_batches", "SCAN conveyor_batch_deps"}},
		// Fired batches to prune: by fired_at, each probing its callback
		// by id and the batches waiting for it in batch_deps_dep
		// (migration 17).
		{"prune batches", d.q.PruneBatches, []any{1, 1}, []string{"INDEX conveyor_batches_fired (fired_at", "INTEGER PRIMARY KEY (rowid=?)", "COVERING INDEX conveyor_batch_deps_dep (dep_batch_id=?)"}, []string{"SCAN conveyor_batch_deps", "SCAN d", "SCAN j"}},
		// The dashboard's overview: every arm on its partial index, none
		// on the table (SCAN conveyor_jobs USING ... INDEX is an index).
		{"overview", d.q.Overview, []any{1}, []string{"USING COVERING INDEX conveyor_jobs_claim", "INDEX conveyor_jobs_due", "INDEX conveyor_jobs_lease", "INDEX conveyor_jobs_finalized (finalized_at>?)"}, []string{"SCAN conveyor_jobs\n", "jobs_queue_list", "USING INTEGER PRIMARY KEY"}},
	} {
		rows, err := d.DB().Query("EXPLAIN QUERY PLAN "+tc.query, tc.args...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		all := strings.Join(plan, "\n") + "\n" // a table scan ends its line
		for _, w := range tc.want {
			if !strings.Contains(all, w) {
				t.Errorf("%s: plan lacks %q:\n%s", tc.name, w, all)
			}
		}
		for _, w := range tc.wantNot {
			if strings.Contains(all, w) {
				t.Errorf("%s: plan has %q:\n%s", tc.name, w, all)
			}
		}
	}
}

// TestListPlans checks that a job list filtered by a queue or a kind
// walks its list index (migration 8) in id order, and one filtered by
// state the table in id order, either way (Desc): no sort. (There is no state list index on
// SQLite: see migration 8.)
func TestListPlans(t *testing.T) {
	d := migrated(t)
	for _, tc := range []struct {
		f    driver.JobFilter
		want string
	}{
		{driver.JobFilter{States: []string{"running"}, AfterID: 5, Limit: 50}, "SEARCH conveyor_jobs USING INTEGER PRIMARY KEY (rowid>?)"},
		{driver.JobFilter{Queue: "q", Limit: 50}, "INDEX conveyor_jobs_queue_list (queue=? AND id>?)"},
		{driver.JobFilter{Kind: "k", Limit: 50}, "INDEX conveyor_jobs_kind_list (kind=? AND id>?)"},
		{driver.JobFilter{Limit: 50}, "SEARCH conveyor_jobs USING INTEGER PRIMARY KEY (rowid>?)"},
		// Newest first, paged back by BeforeID: the same walks, backwards.
		{driver.JobFilter{Desc: true, BeforeID: 90, Limit: 50}, "SEARCH conveyor_jobs USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)"},
		{driver.JobFilter{States: []string{"running"}, Desc: true, Limit: 50}, "SEARCH conveyor_jobs USING INTEGER PRIMARY KEY (rowid>?)"},
		{driver.JobFilter{Queue: "q", Desc: true, BeforeID: 90, Limit: 50}, "INDEX conveyor_jobs_queue_list (queue=? AND id>? AND id<?)"},
		{driver.JobFilter{Kind: "k", Desc: true, Limit: 50}, "INDEX conveyor_jobs_kind_list (kind=? AND id>?)"},
	} {
		q, args := d.listQuery(tc.f)
		rows, err := d.DB().Query("EXPLAIN QUERY PLAN "+q, args...)
		if err != nil {
			t.Fatalf("%+v: %v", tc.f, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		all := strings.Join(plan, "\n")
		if !strings.Contains(all, tc.want) || strings.Contains(all, "TEMP B-TREE") {
			t.Errorf("%+v: plan is not %q without a sort:\n%s", tc.f, tc.want, all)
		}
	}
}
