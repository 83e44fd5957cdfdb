package conveyor_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// poison is a job kind the database refuses, once refusePoison has
// installed a trigger for it: a row that passes conveyor's checks but that
// the database will not take, as a bad row in a batch would be.
type poison struct {
	N int `json:"n"`
}

func (poison) Kind() string { return "poison" }

// refusePoison installs, on the jobs tables of prefix, a trigger that
// refuses every row of kind "poison" (on PostgreSQL, on every segment
// table).
func refusePoison(t *testing.T, dsn, prefix string) {
	t.Helper()
	ctx := context.Background()
	switch {
	case strings.HasPrefix(dsn, "postgres://"):
		conn, err := pgx.Connect(ctx, appDSN(dsn))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		fn := prefix + "poison"
		if _, err := conn.Exec(ctx, "CREATE FUNCTION "+fn+"() RETURNS trigger LANGUAGE plpgsql AS "+
			"$$BEGIN IF NEW.kind = 'poison' THEN RAISE EXCEPTION 'poison row refused'; END IF; RETURN NEW; END$$"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { // before the tables go: the function is not one of them
			conn, err := pgx.Connect(ctx, appDSN(dsn))
			if err == nil {
				_, err = conn.Exec(ctx, "DROP FUNCTION "+fn+"() CASCADE")
				conn.Close(ctx)
			}
			if err != nil {
				t.Errorf("drop the trigger function: %v", err)
			}
		})
		// The segment tables.
		rows, err := conn.Query(ctx, "SELECT tbl FROM "+prefix+"segments")
		if err != nil {
			t.Fatal(err)
		}
		tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(tables) == 0 {
			t.Fatalf("the jobs tables: %v %v", tables, err)
		}
		for _, tbl := range tables {
			if _, err := conn.Exec(ctx, "CREATE TRIGGER "+fn+" BEFORE INSERT ON "+tbl+" FOR EACH ROW EXECUTE FUNCTION "+fn+"()"); err != nil {
				t.Fatal(err)
			}
		}
	case strings.HasPrefix(dsn, "mysql://"):
		u, _ := url.Parse(dsn)
		db, err := sql.Open("mysql", fmt.Sprintf("%s@tcp(%s)%s", u.User.String(), u.Host, u.Path))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.ExecContext(ctx, "CREATE TRIGGER `"+prefix+"poison` BEFORE INSERT ON `"+prefix+"jobs` FOR EACH ROW "+
			"BEGIN IF NEW.kind = 'poison' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'poison row refused'; END IF; END"); err != nil {
			t.Fatal(err)
		}
	default:
		db, err := sql.Open("sqlite", "file:"+dsn+"?_pragma=busy_timeout(10000)")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.ExecContext(ctx, "CREATE TRIGGER "+prefix+"poison BEFORE INSERT ON "+prefix+"jobs "+
			"WHEN NEW.kind = 'poison' BEGIN SELECT RAISE(ABORT, 'poison row refused'); END"); err != nil {
			t.Fatal(err)
		}
	}
}

// told is what one enqueue call was told.
type told struct {
	ids []int64
	err error
}

// lineUp makes the calls reach the group-commit writers together, the
// plain calls one batch, the calls with unique jobs another: it holds the
// writer of unique jobs with an enqueue of a unique key that an open
// transaction of the application holds (on SQLite, that transaction holds
// the database's write lock), and the writer of plain jobs with a plain
// enqueue (a job of kind noop) that it keeps from being written; it starts
// every call and waits until each waits for its writer, then lets the
// held plain enqueue go and commits that transaction, so that each writer
// takes its calls all as one batch, and calls released (if not nil) once
// the blocked unique enqueue returned. It returns what each call was told,
// in order.
func lineUp(t *testing.T, ctx context.Context, c *conveyor.Client[any], dsn, key string, released func(), calls ...func() ([]int64, error)) []told {
	t.Helper()
	byArgs := &conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{ByArgs: true}}
	tx, commit, rollback := beginTx(t, dsn)
	t.Cleanup(func() { _ = rollback() })
	held, err := c.EnqueueTx(ctx, tx, order{key, "", ""}, byArgs)
	if err != nil {
		t.Fatal(err)
	}
	conveyor.OneUniqueLaneForTest(c) // the calls line up behind the blocked one
	queued, taken := conveyor.InserterForTest(c)
	if queued != 0 {
		t.Fatalf("%d enqueues already wait for the writers", queued)
	}
	release := conveyor.HoldPlainWriterForTest(c)
	t.Cleanup(release)
	plainBlocker := make(chan error, 1)
	go func() {
		_, err := c.Enqueue(ctx, noop{}, nil)
		plainBlocker <- err
	}()
	waitFor(t, "the plain writer taking the held enqueue", 30*time.Second, func() bool {
		_, n := conveyor.InserterForTest(c)
		return n == taken+1
	})
	blocker := make(chan told, 1)
	go func() {
		id, err := c.Enqueue(ctx, order{key, "", ""}, byArgs)
		blocker <- told{[]int64{id}, err}
	}()
	waitFor(t, "the unique writer taking the blocked enqueue", 30*time.Second, func() bool {
		_, n := conveyor.InserterForTest(c)
		return n == taken+2
	})
	out := make([]told, len(calls))
	dones := make([]chan struct{}, len(calls))
	for i, call := range calls {
		dones[i] = make(chan struct{})
		go func() {
			defer close(dones[i])
			out[i].ids, out[i].err = call()
		}()
		waitFor(t, fmt.Sprintf("call %d waiting for its writer", i), 30*time.Second, func() bool {
			q, _ := conveyor.InserterForTest(c)
			return q == i+1
		})
	}
	release()
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-plainBlocker; err != nil {
		t.Fatalf("the held plain enqueue: %v", err)
	}
	if b := <-blocker; b.err != nil || b.ids[0] != held {
		t.Fatalf("the blocked enqueue: %v, %v; want the holder %d", b.ids, b.err, held)
	}
	if released != nil {
		released()
	}
	for _, d := range dones {
		<-d
	}
	return out
}

// one adapts Enqueue to the calls of lineUp.
func one(ctx context.Context, c *conveyor.Client[any], args conveyor.JobArgs, opts *conveyor.EnqueueOpts) func() ([]int64, error) {
	return func() ([]int64, error) {
		id, err := c.Enqueue(ctx, args, opts)
		if err != nil {
			return nil, err
		}
		return []int64{id}, nil
	}
}

// many adapts EnqueueMany to the calls of lineUp.
func many(ctx context.Context, c *conveyor.Client[any], items ...conveyor.EnqueueItem) func() ([]int64, error) {
	return func() ([]int64, error) {
		rs, err := c.EnqueueMany(ctx, items)
		if err != nil {
			return nil, err
		}
		ids := make([]int64, len(rs))
		for i, r := range rs {
			ids[i] = r.ID
		}
		return ids, nil
	}
}

// allIDs lists the ids of every job.
func allIDs(t *testing.T, c *conveyor.Client[any]) []int64 {
	t.Helper()
	js, err := c.Jobs(context.Background(), conveyor.JobFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int64, len(js))
	for i, j := range js {
		ids[i] = j.ID
	}
	return ids
}

// tagsOf lists the tags of the jobs of kind tagged, and the customers of
// the jobs of kind order.
func tagsOf(t *testing.T, c *conveyor.Client[any]) []string {
	t.Helper()
	js, err := c.Jobs(context.Background(), conveyor.JobFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, j := range js {
		switch j.Kind {
		case "tagged":
			var a tagged
			_ = json.Unmarshal(j.EncodedArgs, &a)
			out = append(out, a.Tag)
		case "order":
			var a order
			_ = json.Unmarshal(j.EncodedArgs, &a)
			out = append(out, "order:"+a.Customer)
		case "poison":
			out = append(out, "poison")
		}
	}
	slices.Sort(out)
	return out
}

// TestGroupCommitTellsEachCaller: enqueue calls coalesced into one batch
// are each told what happened to their own jobs, when one of them holds a
// row the database refuses: the others' jobs are committed and they get
// their ids; the call with the bad row gets the error and none of its
// jobs exists. A call mixing plain and unique jobs commits whole or not at
// all, coalesced or not, and so does EnqueueBulk.
func TestGroupCommitTellsEachCaller(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		prefix := testdb.Prefix()
		c := openDropped(t, dsn, fast(prefix))
		refusePoison(t, dsn, prefix)
		byArgs := &conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{ByArgs: true}}

		// A plain call beside a call of unique jobs that fails.
		r := lineUp(t, ctx, c, dsn, "block1", nil,
			one(ctx, c, tagged{"p1"}, nil),
			many(ctx, c, conveyor.EnqueueItem{Args: order{"u1", "", ""}, Opts: byArgs}, conveyor.EnqueueItem{Args: tagged{"u1-plain"}}),
			many(ctx, c, conveyor.EnqueueItem{Args: tagged{"u3-plain"}}, conveyor.EnqueueItem{Args: poison{3}, Opts: byArgs}),
		)
		if r[0].err != nil || len(r[0].ids) != 1 {
			t.Fatalf("the plain call: %v, %v; want its job", r[0].ids, r[0].err)
		}
		if r[1].err != nil || len(r[1].ids) != 2 {
			t.Fatalf("the good unique call: %v, %v; want its 2 jobs", r[1].ids, r[1].err)
		}
		if r[2].err == nil || !strings.Contains(r[2].err.Error(), "poison row refused") || !strings.Contains(r[2].err.Error(), "none was inserted") {
			t.Fatalf("the call with the bad row: %v, %v; want the database's refusal, saying none was inserted", r[2].ids, r[2].err)
		}
		ids := allIDs(t, c)
		for _, id := range append(r[0].ids, r[1].ids...) {
			if !slices.Contains(ids, id) {
				t.Errorf("job %d, of a call told it succeeded, does not exist", id)
			}
		}
		if got, want := tagsOf(t, c), []string{"order:block1", "order:u1", "p1", "u1-plain"}; !slices.Equal(got, want) {
			t.Fatalf("jobs %v, want %v", got, want)
		}

		// A bad plain row among plain calls, and in a call of unique jobs.
		r = lineUp(t, ctx, c, dsn, "block2", nil,
			one(ctx, c, tagged{"p2"}, nil),
			one(ctx, c, poison{1}, nil),
			one(ctx, c, tagged{"p3"}, nil),
			many(ctx, c, conveyor.EnqueueItem{Args: order{"u2", "", ""}, Opts: byArgs}, conveyor.EnqueueItem{Args: poison{2}}),
		)
		for i, want := range []bool{true, false, true, false} {
			if ok := r[i].err == nil; ok != want {
				t.Errorf("call %d: %v, %v; want success %v", i, r[i].ids, r[i].err, want)
			}
		}
		if got, want := tagsOf(t, c), []string{"order:block1", "order:block2", "order:u1", "p1", "p2", "p3", "u1-plain"}; !slices.Equal(got, want) {
			t.Fatalf("jobs %v, want %v", got, want)
		}

		// Not coalesced: a call mixing plain and unique jobs, and a bulk.
		if _, err := c.EnqueueMany(ctx, []conveyor.EnqueueItem{{Args: tagged{"m1"}}, {Args: poison{4}, Opts: byArgs}}); err == nil {
			t.Fatal("EnqueueMany with a refused unique row succeeded")
		}
		if _, err := c.EnqueueMany(ctx, []conveyor.EnqueueItem{{Args: order{"m2", "", ""}, Opts: byArgs}, {Args: poison{5}}}); err == nil {
			t.Fatal("EnqueueMany with a refused plain row succeeded")
		}
		if n, err := c.EnqueueBulk(ctx, []conveyor.EnqueueItem{{Args: tagged{"b1"}}, {Args: tagged{"b2"}}, {Args: poison{6}, Opts: byArgs}}); err == nil || n != 0 {
			t.Fatalf("EnqueueBulk with a refused unique row: %d, %v; want an error and 0", n, err)
		}
		if got, want := tagsOf(t, c), []string{"order:block1", "order:block2", "order:u1", "p1", "p2", "p3", "u1-plain"}; !slices.Equal(got, want) {
			t.Fatalf("jobs %v, want %v: a failed call left some of its jobs", got, want)
		}

		// In the application's transaction, plain and unique jobs of one
		// call go in together.
		tx, commit, _ := beginTx(t, dsn)
		rs, err := c.EnqueueManyTx(ctx, tx, []conveyor.EnqueueItem{{Args: tagged{"t1"}}, {Args: order{"t2", "", ""}, Opts: byArgs}, {Args: order{"u1", "", ""}, Opts: byArgs}})
		if err != nil || len(rs) != 3 || rs[0].Duplicate || rs[1].Duplicate || !rs[2].Duplicate {
			t.Fatalf("EnqueueManyTx: %+v, %v", rs, err)
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}
		if got, want := tagsOf(t, c), []string{"order:block1", "order:block2", "order:t2", "order:u1", "p1", "p2", "p3", "t1", "u1-plain"}; !slices.Equal(got, want) {
			t.Fatalf("jobs %v, want %v", got, want)
		}
	})
}

// killWaiters terminates, until stop is closed or n were killed, the
// database connections whose statement waits for a lock that the
// transaction of connection blocker holds, each once, and returns how many
// it killed.
func killWaiters(ctx context.Context, t *testing.T, dsn string, blocker int64, n int, stop <-chan struct{}) <-chan int {
	out := make(chan int, 1)
	var waiting func() ([]int64, error)
	var kill func(id int64) error
	var closeDB func()
	switch {
	case strings.HasPrefix(dsn, "postgres://"):
		conn, err := pgx.Connect(ctx, appDSN(dsn))
		if err != nil {
			t.Fatal(err)
		}
		closeDB = func() { conn.Close(context.Background()) }
		waiting = func() ([]int64, error) {
			rows, err := conn.Query(ctx, "SELECT pid::bigint FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid))", blocker)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, pgx.RowTo[int64])
		}
		kill = func(id int64) error {
			_, err := conn.Exec(ctx, "SELECT pg_terminate_backend($1)", id)
			return err
		}
	default:
		u, _ := url.Parse(dsn)
		db, err := sql.Open("mysql", fmt.Sprintf("%s@tcp(%s)%s", u.User.String(), u.Host, u.Path))
		if err != nil {
			t.Fatal(err)
		}
		closeDB = func() { db.Close() }
		waiting = func() ([]int64, error) {
			time.Sleep(150 * time.Millisecond) // see waitBlocked
			rows, err := db.QueryContext(ctx, "SELECT r.trx_mysql_thread_id FROM information_schema.innodb_lock_waits w "+
				"JOIN information_schema.innodb_trx r ON r.trx_id = w.requesting_trx_id "+
				"JOIN information_schema.innodb_trx b ON b.trx_id = w.blocking_trx_id WHERE b.trx_mysql_thread_id = ?", blocker)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			var ids []int64
			for rows.Next() {
				var id int64
				if err := rows.Scan(&id); err != nil {
					return nil, err
				}
				ids = append(ids, id)
			}
			return ids, rows.Err()
		}
		kill = func(id int64) error {
			_, err := db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id))
			return err
		}
	}
	go func() {
		defer closeDB()
		killed := map[int64]bool{} // a killed connection may still show, waiting, for a moment
		for len(killed) < n {
			select {
			case <-stop:
				out <- len(killed)
				return
			case <-ctx.Done():
				out <- len(killed)
				return
			default:
			}
			ids, err := waiting()
			for _, id := range ids {
				if err == nil && !killed[id] {
					killed[id] = true
					err = kill(id)
				}
			}
			if err != nil {
				t.Errorf("kill: %v", err)
				out <- len(killed)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		out <- len(killed)
	}()
	return out
}

// TestGroupCommitConnectionKilled: the database connection of a batch is
// killed while the batch waits, before its commit. The calls coalesced
// with it are each told what happened to their own jobs: the plain one,
// written in its own transaction, succeeded; the calls of the killed
// transaction committed nothing, and are written again one by one; the
// one whose connection is killed again gets the error, and none of its
// jobs exists. Bounded by the test's context.
func TestGroupCommitConnectionKilled(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "mysql://") {
			t.Skip("SQLite runs in the process: there is no connection to lose")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		prefix := testdb.Prefix()
		c := openDropped(t, dsn, fast(prefix))
		byArgs := &conveyor.EnqueueOpts{Unique: &conveyor.UniqueOpts{ByArgs: true}}
		// An open transaction holds "k2": the batch's unique insert waits
		// for it, and is killed while it waits.
		tx, _, rollback := beginTx(t, dsn)
		t.Cleanup(func() { _ = rollback() })
		if _, err := c.EnqueueTx(ctx, tx, order{"k2", "", ""}, byArgs); err != nil {
			t.Fatal(err)
		}
		var holder int64 // its connection, whose waiters are killed
		switch tx := tx.(type) {
		case pgx.Tx:
			// The server's process id, not the connection's (through
			// PgBouncer they differ).
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&holder); err != nil {
				t.Fatal(err)
			}
		case *sql.Tx:
			if err := tx.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&holder); err != nil {
				t.Fatal(err)
			}
		}
		stop := make(chan struct{})
		var killed <-chan int
		// The killer starts once the enqueue that held the writer
		// returned: it kills the batch's connection, then the last call's
		// on its own.
		start := func() { killed = killWaiters(ctx, t, dsn, holder, 2, stop) }
		r := lineUp(t, ctx, c, dsn, "block", start,
			one(ctx, c, tagged{"plain"}, nil),
			many(ctx, c, conveyor.EnqueueItem{Args: order{"k1", "", ""}, Opts: byArgs}, conveyor.EnqueueItem{Args: tagged{"k1-plain"}}),
			many(ctx, c, conveyor.EnqueueItem{Args: order{"k2", "", ""}, Opts: byArgs}, conveyor.EnqueueItem{Args: tagged{"k2-plain"}}),
		)
		close(stop)
		n := <-killed
		if r[0].err != nil || len(r[0].ids) != 1 {
			t.Fatalf("the plain call: %v, %v; want its job", r[0].ids, r[0].err)
		}
		if r[1].err != nil || len(r[1].ids) != 2 {
			t.Fatalf("the unique call whose key was free: %v, %v; want its 2 jobs", r[1].ids, r[1].err)
		}
		if r[2].err == nil || !strings.Contains(r[2].err.Error(), "none was inserted") {
			t.Fatalf("the call whose connection was killed: %v, %v; want an error saying none was inserted", r[2].ids, r[2].err)
		}
		if n != 2 {
			t.Fatalf("%d connections killed, want 2 (the batch's, then the last call's alone)", n)
		}
		if err := rollback(); err != nil {
			t.Fatal(err)
		}
		if got, want := tagsOf(t, c), []string{"k1-plain", "order:block", "order:k1", "plain"}; !slices.Equal(got, want) {
			t.Fatalf("jobs %v, want %v", got, want)
		}
		if errors.Is(r[2].err, context.DeadlineExceeded) {
			t.Fatalf("the call timed out: %v", r[2].err)
		}
	})
}
