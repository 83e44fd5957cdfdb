package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// fileSize is the size of path, 0 when it does not exist.
func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// autocheckpoint is the wal_autocheckpoint of db's connection.
func autocheckpoint(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(context.Background(), "PRAGMA wal_autocheckpoint").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// flowJobs inserts n jobs of about 2 KB each, claims and completes them,
// in transactions of 50.
func flowJobs(t *testing.T, d *Driver, n int) {
	t.Helper()
	ctx := context.Background()
	args := json.RawMessage(`{"pad":"` + strings.Repeat("x", 2000) + `"}`)
	batch := make([]driver.InsertParams, 50)
	for i := range batch {
		batch[i] = driver.InsertParams{Queue: "q", Kind: "k", Args: args}
	}
	for done := 0; done < n; done += len(batch) {
		if _, err := d.Insert(ctx, batch); err != nil {
			t.Fatal(err)
		}
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "q", Limit: len(batch), Lease: time.Minute, Worker: "w"})
		if err != nil {
			t.Fatal(err)
		}
		out := make([]driver.Outcome, len(rows))
		for i, r := range rows {
			out[i] = driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted}
		}
		if applied, err := d.Complete(ctx, out); err != nil || len(applied) != len(out) {
			t.Fatalf("complete: %d of %d applied, %v", len(applied), len(out), err)
		}
	}
}

// TestCommitsDoNotCheckpoint: with the checkpointer's loop stopped, writes
// well past SQLite's automatic checkpoint threshold (1000 pages) leave the
// database file as it was and every frame in the WAL, because no commit of
// the driver runs a checkpoint (wal_autocheckpoint is 0 on its write
// connections); one round of the checkpointer, on its own connection, then
// copies them into the file.
func TestCommitsDoNotCheckpoint(t *testing.T) {
	old := checkpointInterval
	checkpointInterval = 0 // no loop: only the test runs rounds
	defer func() { checkpointInterval = old }()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ckpt.db")
	d := openT(t, path, "c_")
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for name, db := range map[string]*sql.DB{"write": d.w, "lease": d.lw} {
		if n := autocheckpoint(t, db); n != 0 {
			t.Errorf("the %s connection's wal_autocheckpoint is %d, want 0", name, n)
		}
	}
	if info, err := d.ServerInfo(ctx); err != nil || !strings.Contains(info["checkpoints"], "never in a commit") {
		t.Errorf("server info checkpoints = %q (%v), want it to say commits never checkpoint", info["checkpoints"], err)
	}
	d.cp.round(ctx) // the migrations' frames
	before := fileSize(t, path)
	flowJobs(t, d, 2000) // about 4 MB of job rows, inserted, claimed, completed
	if wal := fileSize(t, path+"-wal"); wal < 1000*4096 {
		t.Fatalf("WAL is %d bytes, want it past the 1000 pages of an automatic checkpoint", wal)
	}
	if after := fileSize(t, path); after != before {
		t.Fatalf("database file went from %d to %d bytes with no checkpointer running: a commit checkpointed", before, after)
	}
	passes := d.cp.passes.Load()
	d.cp.round(ctx)
	if d.cp.passes.Load() == passes {
		t.Fatal("the checkpointer's round ran no checkpoint")
	}
	if after := fileSize(t, path); after <= before {
		t.Fatalf("database file is %d bytes after the checkpointer's round, was %d: nothing copied", after, before)
	}
	var busy, log, ckpt int64
	if err := d.cp.db.QueryRowContext(ctx, d.q.CheckpointPassive).Scan(&busy, &log, &ckpt); err != nil {
		t.Fatal(err)
	}
	if ckpt != log {
		t.Fatalf("after the round %d of %d WAL frames are copied, want all", ckpt, log)
	}
}

// TestCheckpointAfterLongReader: jobs flow while a reader holds a snapshot,
// so the WAL grows (no checkpoint can pass the reader); once the reader
// ends, the checkpointer's loop copies the backlog and the WAL starts over
// (its file truncated back to the limit), although no writer connection
// checkpoints (wal_autocheckpoint 0 on both).
func TestCheckpointAfterLongReader(t *testing.T) {
	oldLimit, oldInterval := walSizeLimit, checkpointInterval
	walSizeLimit = 256 << 10
	checkpointInterval = 5 * time.Millisecond
	defer func() { walSizeLimit, checkpointInterval = oldLimit, oldInterval }()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "reader.db")
	d := openT(t, path, "c_")
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for name, db := range map[string]*sql.DB{"write": d.w, "lease": d.lw} {
		if n := autocheckpoint(t, db); n != 0 {
			t.Fatalf("the %s connection's wal_autocheckpoint is %d, want 0", name, n)
		}
	}
	rdb, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	tx, err := rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM c_jobs").Scan(&n); err != nil {
		t.Fatal(err)
	}
	flowJobs(t, d, 2000)
	held := fileSize(t, path+"-wal")
	if held <= 4*walSizeLimit {
		t.Fatalf("WAL is %d bytes with a snapshot held, want it grown well past %d", held, walSizeLimit)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	passes, restarts := d.cp.passes.Load(), d.cp.restarts.Load()
	// Jobs keep flowing; the file shrinks once the checkpointer has copied
	// the backlog and the WAL started over (by the checkpointer's RESTART
	// or the next commit after a complete PASSIVE pass), the first commit
	// into it truncating the file to the limit. The deadline only bounds a
	// broken run.
	// The file grows again from the limit with each commit into the new
	// WAL, so the size to look for is the smallest seen after a commit.
	args := json.RawMessage(`{"pad":"` + strings.Repeat("x", 200) + `"}`)
	smallest := held
	for deadline := time.Now().Add(time.Minute); smallest > walSizeLimit && time.Now().Before(deadline); {
		if _, err := d.Insert(ctx, []driver.InsertParams{{Queue: "q", Kind: "k", Args: args}}); err != nil {
			t.Fatal(err)
		}
		smallest = min(smallest, fileSize(t, path+"-wal"))
	}
	if smallest > walSizeLimit {
		t.Fatalf("WAL never fell below %d bytes after the reader ended (was %d while held), want at most %d", smallest, held, walSizeLimit)
	}
	if d.cp.passes.Load() == passes {
		t.Fatal("the WAL started over without a pass of the checkpointer: something else checkpointed")
	}
	if d.cp.cuts.Load() == 0 {
		t.Fatal("the WAL file shrank without a cut of the checkpointer: a commit truncated it")
	}
	for name, db := range map[string]*sql.DB{"write": d.w, "lease": d.lw} {
		var limit int64
		if err := db.QueryRowContext(ctx, "PRAGMA journal_size_limit").Scan(&limit); err != nil || limit != -1 {
			t.Errorf("the %s connection's journal_size_limit is %d (%v), want -1: the checkpointer cuts the file", name, limit, err)
		}
	}
	t.Logf("checkpointer: %d passes, %d restarts, %d cuts after the reader ended", d.cp.passes.Load()-passes, d.cp.restarts.Load()-restarts, d.cp.cuts.Load())
	// The cuts never took frames in use: a new handle (reading the WAL
	// from the file) finds the database whole and every job there.
	check, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close()
	var ok string
	if err := check.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&ok); err != nil || ok != "ok" {
		t.Fatalf("integrity_check after the cuts: %q (%v)", ok, err)
	}
	var jobs, viaDriver int
	if err := check.QueryRowContext(ctx, "SELECT count(*) FROM c_jobs").Scan(&jobs); err != nil {
		t.Fatal(err)
	}
	if err := d.w.QueryRowContext(ctx, "SELECT count(*) FROM c_jobs").Scan(&viaDriver); err != nil {
		t.Fatal(err)
	}
	if jobs != viaDriver || jobs < 2000 {
		t.Fatalf("a new handle counts %d jobs, the driver %d (want the same, at least 2000)", jobs, viaDriver)
	}
}

// TestNewCheckpointer: on the application's handle the lease connection
// does not checkpoint either, and the checkpointer copies what the
// handle's commits wrote when the handle turned its automatic checkpoints
// off; Close stops the loop.
func TestNewCheckpointer(t *testing.T) {
	old := checkpointInterval
	checkpointInterval = 0
	defer func() { checkpointInterval = old }()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "own.db")
	db, err := sql.Open("sqlite", path+"?_pragma=journal_mode(WAL)&_pragma=wal_autocheckpoint(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	d, err := New(ctx, db, driver.Options{Prefix: "c_"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if n := autocheckpoint(t, d.lw); n != 0 {
		t.Errorf("the lease connection's wal_autocheckpoint is %d, want 0", n)
	}
	if info, err := d.ServerInfo(ctx); err != nil || !strings.Contains(info["checkpoints"], "never in a commit") {
		t.Errorf("server info checkpoints = %q (%v), want it to say commits never checkpoint", info["checkpoints"], err)
	}
	before := fileSize(t, path)
	flowJobs(t, d, 1000)
	if after := fileSize(t, path); after != before {
		t.Fatalf("database file went from %d to %d bytes with no checkpointer running", before, after)
	}
	d.cp.round(ctx)
	if after := fileSize(t, path); after <= before {
		t.Fatalf("database file is %d bytes after the checkpointer's round, was %d: nothing copied", after, before)
	}
}

// TestSymlinkedFile: SQLite follows a symbolic link named as the
// database to the file it points to, and keeps its WAL and shared memory
// next to that file. The driver's checkpointer cuts that WAL back (not
// the link's name with -wal appended, which does not exist), and drivers
// of one process on the file share one gate whichever name they opened.
func TestSymlinkedFile(t *testing.T) {
	oldLimit, oldInterval := walSizeLimit, checkpointInterval
	walSizeLimit = 256 << 10
	checkpointInterval = 0 // no loop: only the test runs rounds
	defer func() { walSizeLimit, checkpointInterval = oldLimit, oldInterval }()
	ctx := context.Background()
	dir := t.TempDir()
	real, link := filepath.Join(dir, "real.db"), filepath.Join(dir, "link.db")
	if err := os.Symlink("real.db", link); err != nil {
		t.Skip("no symbolic links here:", err)
	}
	d := openT(t, link, "c_")
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(real); err != nil {
		t.Fatalf("SQLite did not create the file the link points to: %v", err)
	}
	other := openT(t, real, "c_")
	if other.gate != d.gate {
		t.Error("a driver on the link and one on the file it points to have a gate each")
	}
	flowJobs(t, d, 600) // no checkpoint runs: the WAL grows to megabytes
	grown := fileSize(t, real+"-wal")
	if grown <= 4*walSizeLimit {
		t.Fatalf("WAL is %d bytes, want it grown well past %d", grown, walSizeLimit)
	}
	// A round copies every frame and starts the WAL over (RESTART); the
	// next commit writes from its beginning; the cuts then take the file
	// back to the limit, a few MiB per call.
	d.cp.round(ctx)
	if d.cp.restarts.Load() == 0 {
		t.Fatal("the round did not start the WAL over")
	}
	if _, err := d.Insert(ctx, []driver.InsertParams{{Queue: "q", Kind: "k", Args: json.RawMessage(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		d.cp.shrink(ctx)
	}
	if size := fileSize(t, real+"-wal"); size > walSizeLimit {
		t.Fatalf("WAL of the file the link points to is still %d bytes (was %d), want it cut back to %d", size, grown, walSizeLimit)
	}
}
