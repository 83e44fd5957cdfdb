package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conveyorq/conveyor/internal/driver"
)

// The segment tables (docs/postgres-storage.md): every job lives in
// exactly one table of its phase, each phase is a series of segment
// tables listed in the registry {p}segments, and the maintenance leader
// seals, drains and truncates whole segments (Maintain), so that the
// cost of a job does not depend on how long vacuum has been held back.

// Phases, in the registry's spelling.
const (
	phReady   = "ready"
	phRunning = "running"
	phWaiting = "waiting"
	phDone    = "done"
	phDead    = "dead"
)

var phases = []string{phReady, phRunning, phWaiting, phDone, phDead}

// segCols is every column of a segment table, in table order.
const segCols = "pos, id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms, " +
	"scheduled_at, created_at, attempted_at, finalized_at, lease_expires_at, attempted_by, errors, " +
	"fence, unique_key, unique_keep, meta, lkey"

// segJobCols are the columns of a job row, in scanJob's order.
const segJobCols = "id, queue, kind, args, state, priority, attempt, max_attempts, timeout_ms, " +
	"scheduled_at, created_at, attempted_at, finalized_at, lease_expires_at, " +
	"attempted_by, errors, fence, meta, lkey"

// segRefreshEvery bounds the age of a process's view of the registry.
const segRefreshEvery = time.Second

// segTuning holds the thresholds of rotation and reclaim (variables of a
// store so that tests can rotate often).
type segTuning struct {
	// sealBytes is the size at which the current segment of a ready,
	// running or waiting phase is sealed; finishedBytes the same for done
	// and dead.
	sealBytes, finishedBytes int64
	// leftovers is the most rows a sealed segment may still hold for its
	// reclaim to move them into the current segment.
	leftovers int64
	// grace is how long a sealed segment waits before its first reclaim
	// attempt, so that writers with a view older than the seal finish.
	grace time.Duration
	// ring is the number of free tables a phase keeps; extra free tables
	// are dropped once no transaction holds them.
	ring int
	// lateWrites is how long after a segment is sealed a row may still
	// enter it, from a process whose view of the registry predates the
	// seal (views are refreshed every second and on the seal's
	// notification): the overview reads a finished segment sealed up to
	// this long before the time it counts from.
	lateWrites time.Duration
}

var defaultTuning = segTuning{
	sealBytes:     1 << 20,
	finishedBytes: 64 << 20,
	leftovers:     1000,
	grace:         2 * time.Second,
	ring:          2,
	lateWrites:    time.Minute,
}

// segRef is one segment table and the incarnation this process knows.
type segRef struct {
	tbl string
	inc int64
}

// segView is a process's view of the registry.
type segView struct {
	cur  map[string]segRef   // phase -> current segment
	live map[string][]string // phase -> sealed segments (oldest first), then the current one
	// sealedAt is when each sealed segment was sealed: no row enters a
	// segment later than tuning.lateWrites after that.
	sealedAt map[string]time.Time
	inc      map[string]int64 // live segment -> incarnation
	at       time.Time
	// readAt is when the registry query that made the view was sent: the
	// registry's snapshot is no older.
	readAt time.Time
	// sig is the registry as read; stmts caches the statements built for
	// it (name and sources -> text), shared by the views of an unchanged
	// registry and dropped with them once it changes, so that the cache
	// never outgrows the live segments.
	sig   string
	stmts *sync.Map
}

// segStore is a driver's view of the segment tables of its prefix and
// their maintenance.
type segStore struct {
	d    *Driver
	tune segTuning

	mu   sync.Mutex // serialises refreshes
	view atomic.Pointer[segView]

	// counters, for tests and reports
	sealed, reclaims, drained, refusals, created, dropped, counted, stale, synced atomic.Int64

	lastMaint time.Time // maintenance rate limit (leader only; under maintMu)
	maintMu   sync.Mutex
	analyzed  map[string]int64 // size of each current segment and the key slots at their last ANALYZE (under maintMu)
	hints     claimHints       // where each queue's next claim starts

	// placed remembers the running segment each job this process claimed
	// was claimed into (see place), so that its outcome and heartbeats
	// name that segment alone.
	placeMu sync.Mutex
	placed  map[int64]string

	// reg is the registry's own connection: a refresh is needed while the
	// caller holds a pooled connection (a transactional enqueue), so it
	// must never wait for one.
	regOnce sync.Once
	reg     *pgxpool.Pool
	regErr  error
	regOpen atomic.Pointer[pgxpool.Pool] // reg once made, for regIfOpen
}

// regPool returns the registry's pool of one connection, made on first
// use from the driver pool's configuration, on the direct connection's
// when the driver has one (see DirectDSNParam).
func (s *segStore) regPool(ctx context.Context) (*pgxpool.Pool, error) {
	s.regOnce.Do(func() {
		cfg := s.d.pool.Config()
		if s.d.direct != nil {
			cfg.ConnConfig = s.d.direct.Copy()
		}
		cfg.MaxConns, cfg.MinConns = 1, 0
		closeOnReadOnly(cfg.ConnConfig.OnPgError, &cfg.ConnConfig.Config)
		s.reg, s.regErr = pgxpool.NewWithConfig(ctx, cfg)
		if s.regErr == nil {
			s.regOpen.Store(s.reg)
		}
	})
	if s.regErr != nil {
		return nil, s.regErr
	}
	return s.reg, nil
}

// regIfOpen returns the registry's pool, or nil before its first use.
func (s *segStore) regIfOpen() *pgxpool.Pool { return s.regOpen.Load() }

// close closes the registry's connection.
func (s *segStore) close() {
	if s.reg != nil {
		s.reg.Close()
	}
}

func newSegStore(d *Driver) *segStore {
	return &segStore{d: d, tune: defaultTuning}
}

// SealSegmentsAt makes the maintenance of d, a PostgreSQL driver, seal a
// current ready, running or waiting segment once it takes bytes on disk,
// and a done or dead one at four times that, instead of the defaults
// (1 MiB and 64 MiB). conveyor's torture suite uses it so that
// a run of seconds rotates and reclaims segments many times. Call it
// before the client works. It reports whether d is a PostgreSQL driver.
func SealSegmentsAt(d driver.Driver, bytes int64) bool {
	pd, ok := d.(*Driver)
	if !ok || bytes <= 0 {
		return false
	}
	s := pd.seg
	s.maintMu.Lock()
	s.tune.sealBytes, s.tune.finishedBytes = bytes, 4*bytes
	s.maintMu.Unlock()
	return true
}

// viewNow returns a view of the registry no older than segRefreshEvery.
func (s *segStore) viewNow(ctx context.Context) (*segView, error) {
	if v := s.view.Load(); v != nil && time.Since(v.at) < segRefreshEvery {
		return v, nil
	}
	return s.refresh(ctx, time.Time{})
}

// refresh reads the registry, unless another goroutine began reading it
// after the time given (zero: always read). A caller whose statement the
// registry made fail passes the time it saw the failure: a view read
// before then may predate the reclaim that made it fail, and would make
// it fail again. (Before, any view other than the caller's was reused: a
// view merely invalidated by the leader's notification, or read just
// before the reclaim, made a heartbeat miss a job that a reclaim had
// moved, twice, and the job's live worker lost its lease.)
func (s *segStore) refresh(ctx context.Context, after time.Time) (*segView, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.view.Load(); v != nil && !after.IsZero() && v.readAt.After(after) {
		return v, nil
	}
	reg, err := s.regPool(ctx)
	if err != nil {
		return nil, err
	}
	readAt := time.Now()
	rows, err := reg.Query(ctx, s.d.q.SegRegistry)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	v := &segView{at: time.Now(), readAt: readAt}
	for rows.Next() {
		var tbl, phase, status string
		var inc int64
		var sealedAt *time.Time
		if err := rows.Scan(&tbl, &phase, &status, &inc, &sealedAt); err != nil {
			return nil, err
		}
		if err := v.add(tbl, phase, status, inc, sealedAt); err != nil {
			return nil, err
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if err := v.finish(); err != nil {
		return nil, err
	}
	if old := s.view.Load(); old != nil && old.sig == v.sig {
		v.stmts = old.stmts
		s.view.Store(v)
		return v, nil
	}
	v.stmts = new(sync.Map)
	s.view.Store(v)
	s.forgetGone(v)
	return v, nil
}

// readRounds bounds the rounds of a read whose registry changed while it
// ran: each round follows a rotation or reclaim (a few a second at most).
const readRounds = 10

// read runs f, which reads the live segments of the view it is given in
// one statement on a connection of its own (each statement in its own
// snapshot), until the registry is seen unchanged from the view's read,
// before f's statement, to a read sent after f returned. The registry
// only moves forward (a table's status and incarnation never come back
// to an earlier pair, and new tables have new names), so the statement's
// snapshot then saw exactly the view's live segments, every job
// committed before it is in one of them, and the statement's locks,
// taken before its snapshot, kept a reclaim from truncating one under it.
// A view is up to segRefreshEvery old, and a rotation or reclaim by
// another process since would otherwise make the read omit a segment
// created meanwhile: a job that exists reported missing, a list or a
// count short by whole segments.
func (s *segStore) read(ctx context.Context, f func(v *segView) error) error {
	v, err := s.viewNow(ctx)
	if err != nil {
		return err
	}
	for round := 0; ; round++ {
		ferr := f(v)
		if ferr != nil && !s.goneSegment(ferr) {
			return ferr
		}
		now, err := s.refresh(ctx, time.Now())
		if err != nil {
			return err
		}
		if ferr == nil && now.sig == v.sig {
			return nil
		}
		s.stale.Add(1)
		if round == readRounds {
			return fmt.Errorf("the segment registry changed during each of %d reads in a row", readRounds+1)
		}
		v = now
	}
}

// errSnapshotReclaimed is a read in a caller's transaction whose snapshot
// predates the reclaim of a segment it would read.
var errSnapshotReclaimed = errors.New("a segment this transaction's snapshot reads was reclaimed since the snapshot was taken (TRUNCATE is not MVCC-safe: its rows would look missing); run the transaction again")

// readIn is read inside the caller's transaction q. Its view is read
// from the registry in the transaction, so that it names the segments
// the transaction's snapshot sees. In READ COMMITTED (each statement a
// snapshot of its own) the read is verified as read verifies it, and
// runs again on a change. In REPEATABLE READ or SERIALIZABLE the
// snapshot is the transaction's, possibly older than the read: the
// segments of its registry must all still hold the incarnation they had
// then (no reclaim truncated one since, which that snapshot would see
// empty), else the read fails with errSnapshotReclaimed rather than
// omit their jobs.
func (s *segStore) readIn(ctx context.Context, q querier, f func(v *segView) error) error {
	for round := 0; ; round++ {
		var v *segView
		var iso string
		err := q(ctx, s.d.q.SegRegistryTx, nil, func(scan func(...any) error) error {
			if v == nil {
				v = &segView{at: time.Now()}
			}
			var tbl, phase, status string
			var inc int64
			var sealedAt *time.Time
			if err := scan(&tbl, &phase, &status, &inc, &sealedAt, &iso); err != nil {
				return err
			}
			return v.add(tbl, phase, status, inc, sealedAt)
		})
		if err == nil {
			if v == nil {
				v = &segView{}
			}
			err = v.finish()
		}
		if err != nil {
			return err
		}
		if err := f(v); err != nil {
			return err
		}
		now, err := s.refresh(ctx, time.Now())
		if err != nil {
			return err
		}
		if iso != "read committed" && iso != "read uncommitted" {
			if !v.incarnationsIn(now) {
				return errSnapshotReclaimed
			}
			return nil
		}
		if now.sig == v.sig {
			return nil
		}
		s.stale.Add(1)
		if round == readRounds {
			return fmt.Errorf("the segment registry changed during each of %d reads in a row", readRounds+1)
		}
	}
}

// incarnationsIn reports whether every live segment of v is live in now
// under the same incarnation: none was reclaimed (truncated) between
// the two reads of the registry.
func (v *segView) incarnationsIn(now *segView) bool {
	for _, ph := range phases {
		for _, tbl := range v.live[ph] {
			if v.inc[tbl] != now.inc[tbl] || now.inc[tbl] == 0 {
				return false
			}
		}
	}
	return true
}

// add records one row of the registry (seg_registry's columns, in its
// order).
func (v *segView) add(tbl, phase, status string, inc int64, sealedAt *time.Time) error {
	if v.cur == nil {
		v.cur, v.live, v.sealedAt, v.inc = map[string]segRef{}, map[string][]string{}, map[string]time.Time{}, map[string]int64{}
	}
	if sealedAt != nil {
		v.sealedAt[tbl] = *sealedAt
	}
	v.inc[tbl] = inc
	v.sig += tbl + " " + status + " " + strconv.FormatInt(inc, 10) + ";"
	if status == "current" {
		v.cur[phase] = segRef{tbl, inc}
	} else {
		v.live[phase] = append(v.live[phase], tbl)
	}
	return nil
}

// finish completes a view whose registry rows were added: every phase
// has a current segment, last in its live list. An empty registry is a
// prefix that an earlier version kept on its one jobs table, which
// Migrate converts.
func (v *segView) finish() error {
	if len(v.cur) == 0 {
		return fmt.Errorf("the prefix has no segment tables (an earlier version kept its jobs in one table): %w", driver.ErrSchemaOutdated)
	}
	for _, ph := range phases {
		c, ok := v.cur[ph]
		if !ok {
			return fmt.Errorf("the segment registry has no current %s segment", ph)
		}
		v.live[ph] = append(v.live[ph], c.tbl)
	}
	return nil
}

// placedMax bounds the jobs whose running segment a process remembers;
// past it (outcomes that never came: an HTTP worker that went away) the
// memory is cleared, and outcomes look in every live segment.
const placedMax = 1 << 20

// place records that jobs were claimed into the running segment tbl.
//
// Outcomes and heartbeats then name that segment alone instead of every
// live running segment. Naming all of them made each statement of the
// lease path lock every sealed running segment, so that the leader's
// NOWAIT reclaim was refused for as long as workers were busy: in a
// drain of 100,000 jobs sealed running segments piled up to 15, and each
// completion scanned all of them.
func (s *segStore) place(tbl string, jobs []*driver.JobRow) {
	s.placeMu.Lock()
	defer s.placeMu.Unlock()
	if s.placed == nil || len(s.placed) > placedMax {
		s.placed = make(map[int64]string, len(jobs))
	}
	for _, j := range jobs {
		s.placed[j.ID] = tbl
	}
}

// placedIn returns the live running segments of v that hold the jobs ids
// as far as this process knows, in v's order: every live running
// segment when it does not know where one of them is, or knows a
// segment no longer live (a reclaim moved the job).
func (s *segStore) placedIn(v *segView, ids []int64) []string {
	live := v.live[phRunning]
	if len(live) == 1 {
		return live
	}
	in := make(map[string]bool, 2)
	s.placeMu.Lock()
	for _, id := range ids {
		tbl, ok := s.placed[id]
		if !ok {
			s.placeMu.Unlock()
			return live
		}
		in[tbl] = true
	}
	s.placeMu.Unlock()
	out := make([]string, 0, len(in))
	for _, tbl := range live {
		if in[tbl] {
			out = append(out, tbl)
		}
	}
	if len(out) < len(in) {
		return live
	}
	return out
}

// forget drops what place recorded of jobs whose attempt ended here.
func (s *segStore) forget(ids []int64) {
	s.placeMu.Lock()
	defer s.placeMu.Unlock()
	for _, id := range ids {
		delete(s.placed, id)
	}
}

// forgetGone drops what place recorded of segments no longer live in v:
// their jobs were moved, and outcomes would look everywhere for them.
func (s *segStore) forgetGone(v *segView) {
	live := map[string]bool{}
	for _, tbl := range v.live[phRunning] {
		live[tbl] = true
	}
	s.placeMu.Lock()
	defer s.placeMu.Unlock()
	for id, tbl := range s.placed {
		if !live[tbl] {
			delete(s.placed, id)
		}
	}
}

// invalidate makes the next use read the registry again (a notification
// from the maintenance leader).
func (s *segStore) invalidate() {
	if v := s.view.Load(); v != nil {
		cp := *v
		cp.at = time.Time{}
		s.view.Store(&cp)
	}
}

// stmtKey names a statement built by stmt: its template (a field of the
// driver's queries) and the tables it was built for.
type stmtKey struct {
	tpl    *string
	tables string
}

// stmt builds the template tpl, a field of the driver's queries, for the
// given source segments, with the current segments and incarnations of
// v, and caches it in v.
func (s *segStore) stmt(tpl *string, v *segView, srcs []string, guarded ...string) string {
	var key strings.Builder
	for _, t := range srcs {
		key.WriteString(t)
		key.WriteByte(' ')
	}
	key.WriteString("|")
	for _, ph := range guarded {
		key.WriteByte(' ')
		key.WriteString(ph)
	}
	k := stmtKey{tpl, key.String()}
	if v.stmts != nil {
		if q, ok := v.stmts.Load(k); ok {
			return q.(string)
		}
	}
	q := expandEach(*tpl, srcs)
	guard := "true"
	if len(guarded) > 0 {
		parts := make([]string, len(guarded))
		for i, ph := range guarded {
			c := v.cur[ph]
			parts[i] = "(SELECT last_value FROM " + c.tbl + "_inc) = " + strconv.FormatInt(c.inc, 10)
		}
		guard = strings.Join(parts, " AND ")
	}
	r := strings.NewReplacer("{guard}", guard, "{cols}", segCols, "{jobcols}", segJobCols,
		"{ready}", v.cur[phReady].tbl, "{running}", v.cur[phRunning].tbl, "{waiting}", v.cur[phWaiting].tbl,
		"{done}", v.cur[phDone].tbl, "{dead}", v.cur[phDead].tbl)
	q = r.Replace(q)
	if v.stmts != nil {
		v.stmts.Store(k, q)
	}
	return q
}

// table fills {t} (and {dst}) of a maintenance template tpl.
func (s *segStore) table(tpl, t, dst string) string {
	return strings.NewReplacer("{t}", t, "{dst}", dst, "{cols}", segCols).Replace(tpl)
}

// expandEach repeats every {each}X{sep}Y{end} block once per source,
// with {src} and {i} filled in, joined by Y.
func expandEach(q string, srcs []string) string {
	var b strings.Builder
	for {
		i := strings.Index(q, "{each}")
		if i < 0 {
			b.WriteString(q)
			return b.String()
		}
		b.WriteString(q[:i])
		rest := q[i+len("{each}"):]
		j := strings.Index(rest, "{sep}")
		k := strings.Index(rest, "{end}")
		if j < 0 || k < j {
			panic("postgres: segments.sql: {each} without {sep}...{end}")
		}
		body, sep := rest[:j], rest[j+len("{sep}"):k]
		for n, src := range srcs {
			if n > 0 {
				b.WriteString(sep)
			}
			b.WriteString(strings.NewReplacer("{src}", src, "{i}", strconv.Itoa(n)).Replace(body))
		}
		q = rest[k+len("{end}"):]
	}
}

// errStale is a statement refused by the incarnation guard.
var errStale = errors.New("segment view is stale")

// segRounds bounds the retries of a statement refused by the guard: each
// follows a refresh, and a segment is reclaimed at most once per grace.
const segRounds = 5

// withView runs f with a view of the registry, again with a fresh view
// each time f reports errStale.
func (s *segStore) withView(ctx context.Context, f func(v *segView) error) error {
	v, err := s.viewNow(ctx)
	if err != nil {
		return err
	}
	for round := 0; ; round++ {
		err := f(v)
		if s.goneSegment(err) {
			// A view older than a reclaim and a drop of the table
			// (the leader drops free tables beyond the ring): the
			// statement named a table that no longer exists, and
			// nothing ran. Like a guard refusal: read the registry.
			err = errStale
		}
		if !errors.Is(err, errStale) {
			return err
		}
		s.stale.Add(1)
		if round == segRounds {
			return fmt.Errorf("the segments this process knows were reclaimed %d times in a row", segRounds)
		}
		if v, err = s.refresh(ctx, time.Now()); err != nil {
			return err
		}
	}
}

// goneSegment reports whether err says that a segment table (or its
// incarnation sequence) of this prefix does not exist.
func (s *segStore) goneSegment(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42P01" {
		return false
	}
	for _, ph := range phases {
		if strings.Contains(pe.Message, `"`+s.d.prefix+ph+"_") {
			return true
		}
	}
	return false
}

// srcs returns the live segments of the given phases.
func (v *segView) srcs(phs ...string) []string {
	var out []string
	for _, ph := range phs {
		out = append(out, v.live[ph]...)
	}
	return out
}

// createSegment creates a segment table of phase in tx and registers it
// with status, returning its name and incarnation.
func (s *segStore) createSegment(ctx context.Context, tx pgx.Tx, phase, status string) (string, int64, error) {
	var n int64
	q := &s.d.q
	if err := tx.QueryRow(ctx, q.SegNewName).Scan(&n); err != nil {
		return "", 0, err
	}
	tbl := s.d.prefix + phase + "_" + strconv.FormatInt(n, 10)
	ddl := []string{q.SegTable}
	switch phase {
	case phReady:
		ddl = append(ddl, q.SegIndexReady)
	case phWaiting:
		ddl = append(ddl, q.SegIndexWaiting)
	}
	for _, tpl := range ddl {
		if _, err := tx.Exec(ctx, s.table(tpl, tbl, "")); err != nil {
			return "", 0, err
		}
	}
	if _, err := tx.Exec(ctx, q.SegRegister, tbl, phase, status, int64(1)); err != nil {
		return "", 0, err
	}
	s.created.Add(1)
	return tbl, 1, nil
}

// Conversion lock attempts: each waits in the lock queue of {p}jobs for
// at most convertLockWait (the workers behind it wait as long), then
// gives the queue back for convertLockPause, until convertLockFor.
const (
	convertLockWait  = 200 * time.Millisecond
	convertLockPause = 800 * time.Millisecond
)

// convertLockFor bounds the attempts (a variable for the tests).
var convertLockFor = 30 * time.Second

// lockForConvert takes the ACCESS EXCLUSIVE lock of {p}jobs in tx. A
// transaction that holds a lock on the table for long (a pg_dump) would
// keep a plain LOCK waiting, and every worker queued behind it: each
// attempt waits convertLockWait at most, inside a savepoint (a pgx
// nested transaction) so that a refused one leaves tx usable.
func (s *segStore) lockForConvert(ctx context.Context, tx pgx.Tx) error {
	q := &s.d.q
	if _, err := tx.Exec(ctx, q.SegConvertLockTimeout, strconv.FormatInt(convertLockWait.Milliseconds(), 10)+"ms"); err != nil {
		return err
	}
	deadline := time.Now().Add(convertLockFor)
	for {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		_, err = sp.Exec(ctx, q.SegConvertLock)
		if err == nil {
			if err := sp.Commit(ctx); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, q.SegConvertLockReset)
			return err
		}
		if pgCode(err) != "55P03" || time.Now().After(deadline) {
			return fmt.Errorf("lock the jobs table: another transaction held a lock on it through every attempt for %v (a pg_dump or a long transaction?); run Migrate again when it ends: %w", convertLockFor, err)
		}
		if err := sp.Rollback(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(convertLockPause):
		}
	}
}

// convert moves the prefix from the one jobs table of earlier versions
// to the segment tables in tx (under the migration lock): it creates the
// sequences, the unique keys table and one current segment per phase,
// moves every job of {p}jobs into its phase (running jobs keep attempt,
// fence and lease) and drops {p}jobs. It returns the number of jobs
// moved.
func (s *segStore) convert(ctx context.Context, tx pgx.Tx) (int64, error) {
	if err := s.lockForConvert(ctx, tx); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, s.d.q.SegConvertSetup); err != nil {
		return 0, err
	}
	v := &segView{cur: map[string]segRef{}, live: map[string][]string{}}
	for _, ph := range phases {
		tbl, inc, err := s.createSegment(ctx, tx, ph, "current")
		if err != nil {
			return 0, err
		}
		v.cur[ph] = segRef{tbl, inc}
		v.live[ph] = []string{tbl}
	}
	var n int64
	if err := tx.QueryRow(ctx, s.stmt(&s.d.q.SegConvertMove, v, nil)).Scan(&n); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, s.d.q.SegConvertDrop); err != nil {
		return 0, err
	}
	return n, nil
}

// segTables lists every segment table of the prefix (none when it has no
// registry).
func (d *Driver) segTables(ctx context.Context) ([]string, error) {
	rows, err := d.pool.Query(ctx, d.q.SegTables)
	if pgCode(err) == "42P01" {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if pgCode(err) == "42P01" {
		return nil, nil
	}
	return ts, err
}

// segNotice is the payload on the wake channel that tells every process
// the registry changed (no queue name can be it).
const segNotice = "!segments"

// segmentsChanged handles segNotice: the next statement reads the
// registry again.
func (d *Driver) segmentsChanged() {
	d.seg.invalidate()
	// A reclaim may have moved jobs into the current ready segment (see
	// claimHints).
	d.seg.hints.wakeAll()
}
