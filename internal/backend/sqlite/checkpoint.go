package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"os"
	"sync/atomic"
	"time"
)

// Checkpoints. SQLite's default runs a checkpoint inside the commit that
// takes the WAL past 1000 pages (wal_autocheckpoint), on the committing
// connection: the commit returns only once the WAL's frames are copied
// into the database file and the file is synced. That is usually a few
// milliseconds; after a long reader ends (a backup, a report, a held
// snapshot), it is the whole WAL the reader held back, seconds of copying
// during which every write of this process waits behind the one
// connection that writes.
//
// So the driver's write connections run with wal_autocheckpoint(0) and
// never checkpoint, and a checkpointer of its own does it, on a
// connection of its own, every checkpointInterval:
//
//   - a PASSIVE checkpoint, which takes no lock that writers or readers
//     wait for: writers keep appending to the WAL while it copies, and
//     another connection's checkpoint in progress (another process's
//     checkpointer) makes it return at once;
//   - while writers keep adding frames during each pass, PASSIVE never
//     catches up, and the WAL can start over (its next commit writing from
//     the beginning) only once every frame is copied. When the WAL is past
//     restartFrames and a pass leaves at most restartTail frames, a
//     RESTART checkpoint copies those and starts the WAL over. The
//     checkpointer's connection has no busy handler, so RESTART never
//     waits: with a writer in its transaction it does only what PASSIVE
//     does, with a reader on the WAL it does not start the WAL over. Its
//     cost to writers is the time it holds the write lock: copying at most
//     restartTail frames and syncing the file. It runs in this process's
//     turn at the write lock, after pending lease renewals, as ordinary
//     writes do.
//
// Durability is the synchronous mode's, as before: the checkpointer's
// connection has the writers' synchronous setting, so a checkpoint syncs
// the WAL before copying it and the database file after (NORMAL, FULL,
// EXTRA). With NORMAL a commit is on disk against power loss once a
// checkpoint has synced the WAL, now within about checkpointInterval of
// its commit (unless a reader holds checkpoints back) instead of whenever
// the WAL next reached 1000 pages.
//
// Nothing bounds the WAL while a reader holds its snapshot: no checkpoint
// can copy frames the reader may still need. Once the reader ends, the
// checkpointer copies the backlog off the writers' path and, on a file
// the driver opened, cuts the WAL file back to walSizeLimit a few MiB at a
// time (shrink) instead of leaving journal_size_limit to truncate it in a
// commit. Close stops the loop (interrupting a checkpoint in progress);
// SQLite's own checkpoint when the file's last connection closes is
// SQLite's, as before.

// checkpointInterval is the time between the checkpointer's passes. (A
// variable, so that a test can stop it or make it short.)
var checkpointInterval = 200 * time.Millisecond

// restartFrames is the WAL size, in frames, past which the checkpointer
// starts the WAL over itself (RESTART) rather than leaving it to the next
// commit after a pass that copied every frame: SQLite's own automatic
// checkpoint threshold, so that the WAL stays about the size it had when
// commits checkpointed.
const restartFrames = 1000

// restartTail is the most frames a RESTART checkpoint may have left to
// copy while it holds the write lock.
const restartTail = 64

// shrinkStep is the most the checkpointer cuts off the WAL file at a
// time, while it holds the write lock: freeing the blocks of a file of
// gigabytes takes seconds (more on a file system mounted with discard),
// which SQLite's own journal_size_limit spends inside the first commit
// after the WAL starts over. A cut of 4 MiB takes about 2 ms on ext4
// mounted with discard, written back to disk.
const shrinkStep = 4 << 20

// maxShrinkSteps bounds the cuts of one round (each takes and releases
// the write lock in the process's turn), so that cuts hold the lock for a
// small share of the time: 32 MiB a round, a file of 8 GB back to 64 MiB
// in under a minute.
const maxShrinkSteps = 8

// maxPasses bounds the PASSIVE passes of one round: each copies the
// frames written during the previous one, so they shrink while writers
// are slower than the copy.
const maxPasses = 8

// checkpointer runs the driver's checkpoints on a connection of its own.
type checkpointer struct {
	db *sql.DB
	q  *queries
	// turn runs fn in this process's turn at the write lock (Driver.turn):
	// a RESTART and each cut take the lock after pending lease renewals and
	// the writes queued before them, and this process's writers queue
	// behind them in Go instead of polling SQLite's lock.
	turn func(ctx context.Context, fn func() error) error
	// wal is the WAL file's path and limit the size the checkpointer cuts
	// it back to, in steps (shrink); limit < 0: it leaves the file alone.
	wal   string
	limit int64
	// interval is the time between rounds (0: no loop).
	interval time.Duration
	// cancel stops the loop, which closes done when it has returned.
	cancel context.CancelFunc
	done   chan struct{}

	// passes counts checkpoints that ran (PASSIVE, or RESTART whether or
	// not it started the WAL over); restarts, the RESTART checkpoints that
	// started the WAL over; busy, PASSIVE passes refused because another
	// connection's checkpoint was running and RESTARTs that a writer or a
	// reader stopped short; errors, statements that failed (retried at the
	// next interval).
	passes, restarts, busy, errors atomic.Int64
	// cuts counts the WAL file's cuts (shrink).
	cuts atomic.Int64
}

// startCheckpointer opens the checkpointer's connection on dsn (which must
// set busy_timeout(0) and the writers' synchronous mode), for the
// database file at path, and starts its loop. interval 0 or less starts no loop (tests).
func startCheckpointer(dsn, path string, limit int64, turn func(context.Context, func() error) error, q *queries, interval time.Duration) (*checkpointer, error) {
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	ctx, cancel := context.WithCancel(context.Background())
	c := &checkpointer{db: db, q: q, cancel: cancel, done: make(chan struct{}),
		turn: turn,
		wal:  path + "-wal", limit: limit, interval: max(interval, 0)}
	if interval <= 0 {
		close(c.done)
		return c, nil
	}
	go c.loop(ctx, interval)
	return c, nil
}

func (c *checkpointer) loop(ctx context.Context, interval time.Duration) {
	defer close(c.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.round(ctx)
		c.shrink(ctx)
	}
}

// shrink cuts the WAL file back towards limit, shrinkStep at a time, each
// cut under the write lock (taken without waiting: a writer in its
// transaction makes it try again next round) and never below the frames
// in use. It is SQLite's journal_size_limit, off the writers' path.
func (c *checkpointer) shrink(ctx context.Context) {
	if c.limit < 0 {
		return
	}
	for i := 0; i < maxShrinkSteps; i++ {
		fi, err := os.Stat(c.wal)
		if err != nil || fi.Size() <= c.limit {
			return
		}
		var done bool
		if err := c.turn(ctx, func() (err error) {
			done, err = c.cut(ctx, fi.Size())
			return err
		}); err != nil || !done {
			return
		}
	}
}

// cut truncates the WAL file of size bytes by at most shrinkStep, to no
// less than limit and the frames in use, holding the write lock so that
// no frame is appended meanwhile. It reports whether it cut.
func (c *checkpointer) cut(ctx context.Context, size int64) (bool, error) {
	conn, err := c.db.Conn(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return false, nil // busy: a writer holds the lock
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
	used, ok := walUsed(c.wal[:len(c.wal)-len("-wal")] + "-shm")
	if !ok {
		return false, nil
	}
	target := max(c.limit, used, size-shrinkStep)
	if target >= size {
		return false, nil
	}
	if err := os.Truncate(c.wal, target); err != nil {
		c.errors.Add(1)
		return false, err
	}
	c.cuts.Add(1)
	return true, nil
}

// walUsed reads the bytes of the WAL in use (its header and frames up to
// mxFrame) from the wal-index header in the -shm file at shm. The header
// is in native byte order (little-endian on the platforms conveyor
// supports); its two copies are equal and stable while the caller holds
// the write lock. ok is false when the header is not one this reads.
func walUsed(shm string) (used int64, ok bool) {
	f, err := os.Open(shm)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var b [96]byte
	if _, err := f.ReadAt(b[:], 0); err != nil {
		return 0, false
	}
	le := binary.LittleEndian
	if le.Uint32(b[0:]) != 3007000 || b[12] != 1 || !bytes.Equal(b[:48], b[48:96]) { // WALINDEX_MAX_VERSION, isInit
		return 0, false
	}
	sz := int64(le.Uint16(b[14:]))
	pageSize := sz&0xfe00 + (sz&1)<<16
	if pageSize < 512 {
		return 0, false
	}
	return 32 + int64(le.Uint32(b[16:]))*(24+pageSize), true
}

// round runs PASSIVE passes while each copies something and frames
// remain, then a RESTART when the WAL is large and little is left.
func (c *checkpointer) round(ctx context.Context) {
	prev := int64(-1)
	for i := 0; i < maxPasses; i++ {
		busy, log, ckpt, err := c.run(ctx, c.q.CheckpointPassive)
		if err != nil || busy || log <= 0 {
			return
		}
		if log >= restartFrames && log-ckpt <= restartTail {
			c.turn(ctx, func() error {
				if busy, _, _, err := c.run(ctx, c.q.CheckpointRestart); err == nil && !busy {
					c.restarts.Add(1)
				}
				return nil
			})
			return
		}
		if ckpt >= log || ckpt == prev {
			// Everything copied (the next commit starts the WAL over), or
			// a reader's snapshot stops the copy where it is.
			return
		}
		prev = ckpt
	}
}

// run runs one checkpoint statement and reports whether it was refused
// (busy), the WAL's frames and the frames copied.
func (c *checkpointer) run(ctx context.Context, stmt string) (busy bool, log, ckpt int64, err error) {
	var b int
	if err := c.db.QueryRowContext(ctx, stmt).Scan(&b, &log, &ckpt); err != nil {
		c.errors.Add(1)
		return false, 0, 0, err
	}
	if b != 0 {
		// PASSIVE: another connection's checkpoint holds the checkpoint
		// lock. RESTART: a writer or a reader stopped it from finishing.
		c.busy.Add(1)
		if stmt == c.q.CheckpointPassive {
			return true, log, ckpt, nil
		}
	}
	c.passes.Add(1)
	return b != 0, log, ckpt, nil
}

// close stops the loop (interrupting a checkpoint in progress) and closes
// the connection.
func (c *checkpointer) close() error {
	c.cancel()
	<-c.done
	return c.db.Close()
}
