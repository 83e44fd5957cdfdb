package conveyor_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

type order struct {
	Customer string `json:"customer"`
	Item     string `json:"item"`
	Note     string `json:"note"`
}

func (order) Kind() string { return "order" }

// TestUniqueUnderConcurrency: 50 goroutines across 3 clients enqueue the
// same unique job at once, a third outside transactions, a third in
// transactions that commit, a third in transactions that roll back:
// exactly one job exists, and every caller whose enqueue stands was told
// its id.
func TestUniqueUnderConcurrency(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		prefix := testdb.Prefix()
		clients := []*conveyor.Client[any]{openDropped(t, dsn, fast(prefix)), open(t, dsn, fast(prefix)), open(t, dsn, fast(prefix))}
		opts := &conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{ByArgs: true, ArgsFields: []string{"customer", "item"}}}
		const n = 50
		type told struct {
			id         int64
			rolledBack bool
		}
		results := make([]told, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := clients[g%3]
				args := order{Customer: "ada", Item: "tea", Note: strings.Repeat("x", g)} // Note is not in the key
				<-start
				if g%3 == 0 {
					results[g].id, errs[g] = c.Enqueue(ctx, args, opts)
					return
				}
				for try := 0; ; try++ {
					tx, commit, rollback, done, err := openTx(ctx, dsn)
					if err != nil {
						errs[g] = err
						return
					}
					id, err := c.EnqueueTx(ctx, tx, args, opts)
					if err == nil && g%3 == 1 {
						err = commit()
					} else {
						rollback()
					}
					done()
					// On MySQL a transaction that raced another for the key
					// is told to run again (ErrUniqueRace), and InnoDB may
					// roll back one of two transactions waiting for the same
					// key (deadlock): an application retries the
					// transaction, and so does this caller.
					if err != nil && (errors.Is(err, conveyor.ErrUniqueRace) || strings.Contains(err.Error(), "Deadlock")) && try < 50 {
						continue
					}
					results[g], errs[g] = told{id: id, rolledBack: g%3 == 2}, err
					return
				}
			}()
		}
		close(start)
		wg.Wait()
		for g, err := range errs {
			if err != nil {
				t.Fatalf("caller %d: %v", g, err)
			}
		}
		jobs, err := clients[1].Jobs(ctx, conveyor.JobFilter{Kind: "order"})
		if err != nil {
			t.Fatal(err)
		}
		if len(jobs) != 1 {
			t.Fatalf("%d jobs exist, want exactly 1", len(jobs))
		}
		want := jobs[0].ID
		for g, r := range results {
			if !r.rolledBack && r.id != want {
				t.Errorf("caller %d was told job %d, the job is %d", g, r.id, want)
			}
		}
	})
}

// TestUniqueOptions: what goes into the key, the result's duplicate flag,
// kept states, and bad options.
func TestUniqueOptions(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		c := openDropped(t, dsn, fast(testdb.Prefix()))
		byArgs := &conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{ByArgs: true}}
		rs, err := c.EnqueueMany(ctx, []conveyor.EnqueueItem{
			{Args: order{"a", "tea", ""}, Opts: byArgs},
			{Args: order{"a", "tea", ""}, Opts: byArgs},     // same batch, same key
			{Args: order{"a", "tea", "note"}, Opts: byArgs}, // all args: another key
			{Args: order{"a", "tea", ""}},                   // not unique
			{Args: order{"a", "tea", ""}, Opts: &conveyor.EnqueueOpts{Queue: "other", Unique: &conveyor.UniqueOpts{ByArgs: true}}}, // queue not in key
		})
		if err != nil {
			t.Fatal(err)
		}
		if rs[0].Duplicate || !rs[1].Duplicate || rs[1].ID != rs[0].ID || rs[2].Duplicate || rs[2].ID == rs[0].ID ||
			rs[3].Duplicate || !rs[4].Duplicate || rs[4].ID != rs[0].ID {
			t.Fatalf("results %+v", rs)
		}
		// ByQueue puts the queue in the key.
		q1, _ := c.EnqueueMany(ctx, []conveyor.EnqueueItem{
			{Args: order{"b", "", ""}, Opts: &conveyor.EnqueueOpts{Queue: "q1", Unique: &conveyor.UniqueOpts{ByQueue: true}}},
			{Args: order{"c", "", ""}, Opts: &conveyor.EnqueueOpts{Queue: "q2", Unique: &conveyor.UniqueOpts{ByQueue: true}}},
			{Args: order{"d", "", ""}, Opts: &conveyor.EnqueueOpts{Queue: "q1", Unique: &conveyor.UniqueOpts{ByQueue: true}}},
		})
		if q1[0].Duplicate || q1[1].Duplicate || !q1[2].Duplicate {
			t.Fatalf("by queue: %+v", q1)
		}
		// ByPeriod: one per window of the due time.
		hour := time.Now().Truncate(time.Hour).Add(2 * time.Hour)
		per := func(at time.Time) *conveyor.EnqueueOpts {
			return &conveyor.EnqueueOpts{RunAt: at, Unique: &conveyor.UniqueOpts{ByPeriod: time.Hour}}
		}
		p, err := c.EnqueueMany(ctx, []conveyor.EnqueueItem{
			{Args: order{"p", "", ""}, Opts: per(hour.Add(time.Minute))},
			{Args: order{"p", "", ""}, Opts: per(hour.Add(59 * time.Minute))},
			{Args: order{"p", "", ""}, Opts: per(hour.Add(61 * time.Minute))},
		})
		if err != nil || p[0].Duplicate || !p[1].Duplicate || p[2].Duplicate {
			t.Fatalf("by period: %+v %v", p, err)
		}
		// A job cancelled by hand frees its key unless its states keep it.
		keep := &conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{ByArgs: true, States: append(conveyor.JobStates()[:4:4], conveyor.JobStateCancelled)}}
		k1, err := c.Enqueue(ctx, order{"k", "", ""}, keep)
		if err != nil {
			t.Fatal(err)
		}
		free1, _ := c.Enqueue(ctx, order{"f", "", ""}, byArgs)
		for _, id := range []int64{k1, free1} {
			if _, err := c.Cancel(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		if again, _ := c.Enqueue(ctx, order{"k", "", ""}, keep); again != k1 {
			t.Errorf("a cancelled job that keeps its key in cancelled: enqueue again gave %d, want %d", again, k1)
		}
		if again, _ := c.Enqueue(ctx, order{"f", "", ""}, byArgs); again == free1 {
			t.Errorf("a cancelled job kept its key")
		}
		// Bad options are refused before anything is written.
		for _, u := range []*conveyor.UniqueOpts{
			{States: []conveyor.JobState{conveyor.JobStateAvailable}},
			{States: append(conveyor.JobStates(), "bogus")},
			{ByPeriod: -time.Second},
		} {
			if _, err := c.Enqueue(ctx, order{"bad", "", ""}, &conveyor.EnqueueOpts{Unique: u}); !errors.Is(err, conveyor.ErrInvalidOpts) {
				t.Errorf("unique %+v: err %v, want ErrInvalidOpts", u, err)
			}
		}
		if _, err := c.Enqueue(ctx, conveyor.RawArgs{KindName: "raw", JSON: []byte(`[1,2]`)},
			&conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{ArgsFields: []string{"a"}}}); !errors.Is(err, conveyor.ErrInvalidOpts) {
			t.Errorf("ArgsFields on an array: %v, want ErrInvalidOpts", err)
		}
	})
}

// TestRetryUniqueKeyHeld: retrying by hand a finished unique job whose key
// another job took meanwhile is refused with ErrUniqueConflict, naming the
// job, the holder and the key, and changes nothing; a finished job that
// still holds its own key (a kept state) is retried as usual.
func TestRetryUniqueKeyHeld(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		c := openDropped(t, dsn, fast(testdb.Prefix()))
		byArgs := &conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{ByArgs: true}}
		first, err := c.Enqueue(ctx, order{"r", "", ""}, byArgs)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Cancel(ctx, first); err != nil { // frees the key
			t.Fatal(err)
		}
		holder, err := c.Enqueue(ctx, order{"r", "", ""}, byArgs)
		if err != nil || holder == first {
			t.Fatalf("second job %d (%v), want a new one", holder, err)
		}
		_, err = c.Retry(ctx, first)
		var conflict *conveyor.UniqueConflictError
		if !errors.Is(err, conveyor.ErrUniqueConflict) || !errors.As(err, &conflict) {
			t.Fatalf("retry of job %d whose key job %d holds: %v; want ErrUniqueConflict", first, holder, err)
		}
		if conflict.JobID != first || conflict.HolderID != holder || len(conflict.Key) != 32 {
			t.Fatalf("conflict %+v; want job %d, holder %d, a 32-byte key", conflict, first, holder)
		}
		for _, want := range []string{fmt.Sprintf("job %d", first), fmt.Sprintf("held by job %d", holder), fmt.Sprintf("%x", conflict.Key)} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
		if j := jobState(t, c, first); j.State != conveyor.JobStateCancelled {
			t.Errorf("refused retry left job %d %s, want cancelled", first, j.State)
		}
		if j := jobState(t, c, holder); j.State != conveyor.JobStateAvailable {
			t.Errorf("holder %d is %s, want available", holder, j.State)
		}
		// Once the holder finishes, the retry goes through and takes the
		// key back: an enqueue is its duplicate.
		if _, err := c.Cancel(ctx, holder); err != nil {
			t.Fatal(err)
		}
		if j, err := c.Retry(ctx, first); err != nil || j.State != conveyor.JobStateAvailable {
			t.Fatalf("retry with the key free: %v, %v", j, err)
		}
		if again, err := c.Enqueue(ctx, order{"r", "", ""}, byArgs); err != nil || again != first {
			t.Fatalf("enqueue after the retry: %d, %v; want the retried job %d, which holds the key", again, err, first)
		}
		// A job kept in cancelled holds its key there: its retry is no
		// conflict with itself.
		keep := &conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{ByArgs: true, States: append(conveyor.JobStates()[:4:4], conveyor.JobStateCancelled)}}
		kept, err := c.Enqueue(ctx, order{"k", "", ""}, keep)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Cancel(ctx, kept); err != nil {
			t.Fatal(err)
		}
		if j, err := c.Retry(ctx, kept); err != nil || j.State != conveyor.JobStateAvailable {
			t.Fatalf("retry of a job that kept its key: %v, %v", j, err)
		}
		if again, err := c.Enqueue(ctx, order{"k", "", ""}, keep); err != nil || again != kept {
			t.Fatalf("enqueue after retrying the kept job: %d, %v; want %d", again, err, kept)
		}
	})
}

// waitBlocked waits until a statement on the tables of prefix waits for a
// lock another transaction holds (PostgreSQL, MySQL); on SQLite, where a
// writer waits for the database's one write lock before it begins, it
// returns at once.
func waitBlocked(t *testing.T, dsn, prefix string) {
	t.Helper()
	ctx := context.Background()
	var count func() (int, error)
	switch {
	case strings.HasPrefix(dsn, "postgres://"):
		conn, err := pgx.Connect(ctx, appDSN(dsn))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		count = func() (n int, err error) {
			err = conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0", prefix).Scan(&n)
			return n, err
		}
	case strings.HasPrefix(dsn, "mysql://"):
		u, _ := url.Parse(dsn)
		db, err := sql.Open("mysql", fmt.Sprintf("%s@tcp(%s)%s", u.User.String(), u.Host, u.Path))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		count = func() (n int, err error) {
			// InnoDB refreshes the table's cache only when it was not
			// read for 100ms.
			time.Sleep(150 * time.Millisecond)
			err = db.QueryRowContext(ctx, "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT' AND LOCATE(?, trx_query) > 0", prefix).Scan(&n)
			return n, err
		}
	default:
		return
	}
	waitFor(t, "an enqueue waiting for the key's lock", 30*time.Second, func() bool {
		n, err := count()
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
}

// TestUniqueRaceForced forces the race for a unique key: a transaction
// has inserted the key and not committed when another enqueue of the key
// reaches the database, and then commits or rolls back. The documented
// outcomes, on every backend:
//   - an enqueue in the application's transaction: on MySQL/MariaDB
//     ErrUniqueRace (the transaction run again is told the holder); on
//     PostgreSQL it waits and is told the holder; on SQLite it cannot
//     begin before the holder's transaction ends, and is told the holder;
//   - an enqueue outside transactions waits and is told the holder;
//   - when the holder's transaction rolls back, the waiting enqueue
//     inserts its job.
func TestUniqueRaceForced(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		prefix := testdb.Prefix()
		c := openDropped(t, dsn, fast(prefix))
		byArgs := &conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{ByArgs: true}}
		mysql := strings.HasPrefix(dsn, "mysql://")
		type result struct {
			id  int64
			err error
		}
		// holdKey inserts a unique job in a transaction of its own and
		// leaves it open.
		holdKey := func(key string) (int64, func() error, func() error) {
			tx, commit, rollback := beginTx(t, dsn)
			t.Cleanup(func() { _ = rollback() }) // before the tables are dropped, if the test fails
			id, err := c.EnqueueTx(ctx, tx, order{key, "", ""}, byArgs)
			if err != nil {
				t.Fatal(err)
			}
			return id, commit, rollback
		}
		jobsOf := func(key string) []int64 {
			js, err := c.Jobs(ctx, conveyor.JobFilter{Kind: "order"})
			if err != nil {
				t.Fatal(err)
			}
			var ids []int64
			for _, j := range js {
				if strings.Contains(string(j.EncodedArgs), `"customer":"`+key+`"`) {
					ids = append(ids, j.ID)
				}
			}
			return ids
		}

		// In the application's transaction.
		held, commit, _ := holdKey("app")
		done := make(chan result, 1)
		go func() {
			tx, commit, rollback, closeTx, err := openTx(ctx, dsn)
			if err != nil {
				done <- result{err: err}
				return
			}
			defer closeTx()
			id, err := c.EnqueueTx(ctx, tx, order{"app", "", ""}, byArgs)
			if err != nil {
				rollback()
				done <- result{err: err}
				return
			}
			done <- result{id, commit()}
		}()
		waitBlocked(t, dsn, prefix)
		if err := commit(); err != nil {
			t.Fatal(err)
		}
		r := <-done
		switch {
		case mysql && !errors.Is(r.err, conveyor.ErrUniqueRace):
			t.Fatalf("MySQL, in the application's transaction: %d, %v; want ErrUniqueRace", r.id, r.err)
		case mysql:
			// Run again, as the error says: the holder is seen.
			tx, commit, _ := beginTx(t, dsn)
			if r.id, r.err = c.EnqueueTx(ctx, tx, order{"app", "", ""}, byArgs); r.err == nil {
				r.err = commit()
			}
			fallthrough
		default:
			if r.err != nil || r.id != held {
				t.Fatalf("in the application's transaction: %d, %v; want the holder %d", r.id, r.err, held)
			}
		}
		if ids := jobsOf("app"); len(ids) != 1 || ids[0] != held {
			t.Fatalf("jobs of the key: %v, want [%d]", ids, held)
		}

		// Outside transactions (conveyor's own, through the inserter).
		held, commit, _ = holdKey("own")
		go func() {
			id, err := c.Enqueue(ctx, order{"own", "", ""}, byArgs)
			done <- result{id, err}
		}()
		waitBlocked(t, dsn, prefix)
		if err := commit(); err != nil {
			t.Fatal(err)
		}
		if r := <-done; r.err != nil || r.id != held {
			t.Fatalf("outside transactions: %d, %v; want the holder %d", r.id, r.err, held)
		}
		if ids := jobsOf("own"); len(ids) != 1 || ids[0] != held {
			t.Fatalf("jobs of the key: %v, want [%d]", ids, held)
		}

		// The holder rolls back: the waiting enqueue inserts its job.
		_, _, rollback := holdKey("gone")
		go func() {
			id, err := c.Enqueue(ctx, order{"gone", "", ""}, byArgs)
			done <- result{id, err}
		}()
		waitBlocked(t, dsn, prefix)
		if err := rollback(); err != nil {
			t.Fatal(err)
		}
		if r = <-done; r.err != nil {
			t.Fatalf("after the holder rolled back: %v; want a job of its own", r.err)
		}
		if ids := jobsOf("gone"); len(ids) != 1 || ids[0] != r.id {
			t.Fatalf("jobs of the key: %v, want [%d]", ids, r.id)
		}
	})
}

// TestUniqueDeadlockWithAppTx: an application's transaction enqueues two
// unique jobs, one after the other, while conveyor's own transaction
// (Enqueue outside transactions) inserts the same two keys, in key order:
// when the application's order is the other one, each waits for the other
// (a deadlock the database breaks by rolling one back). Either outcome is
// documented for the application's transaction (roll back, run again);
// conveyor's own enqueue must not fail for it: it is run again and tells
// its caller the holders, or inserts the jobs once the application's
// transaction rolled back. Run with both orders of the application's
// enqueues, since which one is the other order depends on the keys.
func TestUniqueDeadlockWithAppTx(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		prefix := testdb.Prefix()
		c := openDropped(t, dsn, fast(prefix))
		byArgs := &conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{ByArgs: true}}
		keyOf := func(o order) []byte {
			args, _ := json.Marshal(o)
			k, err := conveyor.UniqueKeyForTest("order", conveyor.DefaultQueue, args, byArgs.Unique)
			if err != nil {
				t.Fatal(err)
			}
			return k
		}
		for round := range 2 {
			first, second := order{fmt.Sprint("x", round), "", ""}, order{fmt.Sprint("y", round), "", ""}
			if bytes.Compare(keyOf(first), keyOf(second)) < 0 {
				// The application's transaction goes against the key order:
				// conveyor's first key is its second.
				first, second = second, first
			}
			tx, commit, rollback := beginTx(t, dsn)
			held, err := c.EnqueueTx(ctx, tx, first, byArgs)
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				rs  []conveyor.EnqueueResult
				err error
			}
			own := make(chan result, 1)
			go func() {
				rs, err := c.EnqueueMany(ctx, []conveyor.EnqueueItem{{Args: first, Opts: byArgs}, {Args: second, Opts: byArgs}})
				own <- result{rs, err}
			}()
			waitBlocked(t, dsn, prefix)
			held2, err := c.EnqueueTx(ctx, tx, second, byArgs)
			committed := err == nil
			if committed {
				err = commit()
				committed = err == nil
			} else {
				t.Logf("round %d: the application's transaction: %v (rolled back)", round, err)
				_ = rollback()
			}
			r := <-own
			if r.err != nil {
				t.Fatalf("round %d: conveyor's own enqueue: %v; want it run again, not failed", round, r.err)
			}
			if committed && (!r.rs[0].Duplicate || r.rs[0].ID != held || !r.rs[1].Duplicate || r.rs[1].ID != held2) {
				t.Fatalf("round %d: own enqueue told %+v; want the application's jobs %d and %d as holders", round, r.rs, held, held2)
			}
			if !committed && (r.rs[0].Duplicate || r.rs[1].Duplicate) {
				t.Fatalf("round %d: own enqueue told %+v; the application's transaction rolled back, want new jobs", round, r.rs)
			}
		}
	})
}

// TestUniqueWaitLetsPlainEnqueuesThrough: an enqueue of a unique key that
// an application's open transaction holds waits for that transaction;
// meanwhile plain enqueues of the process are written all the same (the
// goroutine holding the transaction may itself enqueue before committing).
// Once the transaction commits, the waiting enqueue is told the holder.
// SQLite is left out: there the application's transaction holds the
// database's write lock, which every write waits for, plain ones included.
func TestUniqueWaitLetsPlainEnqueuesThrough(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "mysql://") {
			t.Skip("SQLite: the application's transaction holds the write lock that every enqueue waits for")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		prefix := testdb.Prefix()
		c := openDropped(t, dsn, fast(prefix))
		byArgs := &conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{ByArgs: true}}
		keyOf := func(o order) []byte {
			args, _ := json.Marshal(o)
			k, err := conveyor.UniqueKeyForTest("order", conveyor.DefaultQueue, args, byArgs.Unique)
			if err != nil {
				t.Fatal(err)
			}
			return k
		}
		// On MySQL/MariaDB a plain job's row goes in the unique index (as
		// NULL, before every key), in the gap before the lowest key, which
		// the waiting insert of that key locks: a lower key, committed,
		// keeps that gap away from the key waited for, so that what is
		// tested is the process's writers, not the database's locks.
		low, key := order{"a", "", ""}, order{"b", "", ""}
		if bytes.Compare(keyOf(low), keyOf(key)) > 0 {
			low, key = key, low
		}
		if _, err := c.Enqueue(ctx, low, byArgs); err != nil {
			t.Fatal(err)
		}
		tx, commit, rollback := beginTx(t, dsn)
		t.Cleanup(func() { _ = rollback() })
		held, err := c.EnqueueTx(ctx, tx, key, byArgs)
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			id  int64
			err error
		}
		waiting := make(chan result, 1)
		go func() {
			id, err := c.Enqueue(ctx, key, byArgs)
			waiting <- result{id, err}
		}()
		waitBlocked(t, dsn, prefix)
		// The plain enqueue must return while the transaction is still
		// open: it is awaited before the commit below. Its deadline only
		// bounds the failure, shorter than the writer's own bound on a
		// write (30s) after which the stalled unique write gives up.
		plainCtx, plainCancel := context.WithTimeout(ctx, 20*time.Second)
		defer plainCancel()
		plain := make(chan result, 1)
		go func() {
			id, err := c.Enqueue(plainCtx, tagged{"plain"}, nil)
			plain <- result{id, err}
		}()
		if p := <-plain; p.err != nil {
			t.Fatalf("a plain enqueue while a unique one waits for the application's transaction: %v; want it written", p.err)
		}
		select {
		case w := <-waiting:
			t.Fatalf("the unique enqueue returned %d, %v before the holder's transaction ended", w.id, w.err)
		default:
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}
		if w := <-waiting; w.err != nil || w.id != held {
			t.Fatalf("the unique enqueue: %d, %v; want the holder %d", w.id, w.err, held)
		}
	})
}

// A unique enqueue waiting for an application's open transaction that
// holds its key does not hold up a unique enqueue of another key from
// the same process (a lane of its own): it is written while the
// transaction is still open.
func TestUniqueWaitLetsOtherKeysThrough(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "mysql://") {
			t.Skip("SQLite: the application's transaction holds the write lock that every enqueue waits for")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		prefix := testdb.Prefix()
		c := openDropped(t, dsn, fast(prefix))
		byArgs := &conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{ByArgs: true}}
		keyOf := func(o order) []byte {
			args, _ := json.Marshal(o)
			k, err := conveyor.UniqueKeyForTest("order", conveyor.DefaultQueue, args, byArgs.Unique)
			if err != nil {
				t.Fatal(err)
			}
			return k
		}
		// In key order: low (committed, see
		// TestUniqueWaitLetsPlainEnqueuesThrough), key (held by the
		// application's transaction and waited for), other (after key:
		// outside the gap the waiting insert locks on MySQL/MariaDB).
		ords := []order{{"a", "", ""}, {"b", "", ""}, {"c", "", ""}}
		slices.SortFunc(ords, func(x, y order) int { return bytes.Compare(keyOf(x), keyOf(y)) })
		low, key, other := ords[0], ords[1], ords[2]
		if _, err := c.Enqueue(ctx, low, byArgs); err != nil {
			t.Fatal(err)
		}
		tx, commit, rollback := beginTx(t, dsn)
		t.Cleanup(func() { _ = rollback() })
		held, err := c.EnqueueTx(ctx, tx, key, byArgs)
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			id  int64
			err error
		}
		waiting := make(chan result, 1)
		go func() {
			id, err := c.Enqueue(ctx, key, byArgs)
			waiting <- result{id, err}
		}()
		waitBlocked(t, dsn, prefix)
		// Calls go to another lane once the blocked write has taken
		// longer than a write takes (a tenth of a second): from then on.
		time.Sleep(300 * time.Millisecond)
		// Its deadline only bounds the failure, shorter than the bound on
		// a write (30s) after which the stalled write gives up.
		otherCtx, otherCancel := context.WithTimeout(ctx, 20*time.Second)
		defer otherCancel()
		id, err := c.Enqueue(otherCtx, other, byArgs)
		if err != nil {
			t.Fatalf("a unique enqueue of another key while one waits for the application's transaction: %v; want it written", err)
		}
		if id == held {
			t.Fatalf("the other key's enqueue returned the holder %d", held)
		}
		select {
		case w := <-waiting:
			t.Fatalf("the unique enqueue returned %d, %v before the holder's transaction ended", w.id, w.err)
		default:
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}
		if w := <-waiting; w.err != nil || w.id != held {
			t.Fatalf("the unique enqueue: %d, %v; want the holder %d", w.id, w.err, held)
		}
		if j, err := c.Job(ctx, id); err != nil || j.Kind != "order" {
			t.Fatalf("the other key's job %d: %+v, %v", id, j, err)
		}
	})
}
