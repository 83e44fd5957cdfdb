package conveyor

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// PeriodicJob is a job enqueued once for every slot of a schedule.
//
// Every started client that has the periodic job enqueues each slot when
// its clock reaches it; the slot is part of the job's unique key, so the
// database keeps exactly one job per slot however many processes try, and
// whichever of them are running, restarted or replaced. A slot that passed
// while no process of the schedule was running is missed: on start it is
// skipped, or run once (the latest missed slot only) when RunMissed is
// set. Slots that a running process reached late (a stalled machine) are
// all enqueued, in order, when it catches up, except those another
// process went past more than half the shorter retention
// (Config.CompletedRetention, DiscardedRetention) ago: their jobs may
// have been pruned, and they are skipped rather than run twice.
//
// Each schedule has a row in the database (its latest slot, listed by
// Client.Schedules). A started client marks the rows of the schedules it
// has as in use at start and every hour, however far apart their slots;
// the maintenance leader deletes a row that no process recorded or
// marked for 30 days: a schedule removed from every process's code.
// During a rolling deploy the processes that still have a schedule keep
// its row. A schedule added again after its row was deleted starts as a
// new one (RunMissed has no missed slot to run).
type PeriodicJob struct {
	// Name identifies the schedule in the database, across processes and
	// restarts: the same rules as queue names. Two schedules of one
	// database must not share a name.
	Name string
	// Schedule gives the slots: Every(d) or Cron(spec, loc).
	Schedule Schedule
	// Args are the arguments of every slot's job; the handler reads the
	// slot from Job.ScheduledAt.
	Args JobArgs
	// Opts are the jobs' options (queue, priority, attempts, timeout).
	// RunAt, Delay and Unique must be zero: the schedule sets them. Nil
	// takes the defaults.
	Opts *EnqueueOpts
	// RunMissed enqueues, on start, the latest slot that passed while no
	// process of the schedule was running; by default such slots are
	// skipped.
	RunMissed bool
}

// ScheduleInfo is a periodic schedule as listed by Client.Schedules.
type ScheduleInfo struct {
	// Name and Spec identify and describe the schedule.
	Name, Spec string
	// Last is the latest slot a job was made for (zero if none yet) and
	// LastJobID that job's id.
	Last      time.Time
	LastJobID int64
	// Next is the next slot.
	Next time.Time
	// Registered is set for the schedules added to this client with
	// AddPeriodic; the others were recorded by other processes.
	Registered bool
}

// maxCatchUp bounds the slots one wake of the periodic loop enqueues
// after a stall; beyond it the oldest are skipped.
const maxCatchUp = 1000

// periodicState is what the periodic loop keeps per schedule.
type periodicState struct {
	PeriodicJob
	next time.Time
	// batch is the most slots the next insert of this schedule takes:
	// slotsPerInsert, halved after an insert that failed (down to one)
	// and doubled back after one that succeeded, so that on a database
	// too slow for a full batch within its deadline the slots still go in.
	batch int
}

// periodic runs the client's periodic jobs while it is started.
type periodic struct {
	mu     sync.Mutex
	jobs   []*periodicState
	cancel context.CancelFunc
	done   chan struct{}
	// recorded is the last read of the schedules' records, at recordedAt
	// (this process's clock); only the periodic loop uses them (see
	// periodicWake).
	recorded   map[string]driver.ScheduleRow
	recordedAt time.Time
}

// AddPeriodic registers a periodic job on c. Call it before Start; the
// job's kind needs a worker somewhere (on this client unless
// Config.AllowUnregisteredKinds).
func (c *Client[TTx]) AddPeriodic(p PeriodicJob) error {
	if err := checkQueue(p.Name); err != nil {
		return fmt.Errorf("conveyor: periodic job name: %w", err)
	}
	if p.Schedule == nil {
		return fmt.Errorf("%w: periodic job %q has no schedule", ErrInvalidOpts, p.Name)
	}
	if e, ok := p.Schedule.(every); ok {
		if err := checkEvery(time.Duration(e)); err != nil {
			return fmt.Errorf("%w: periodic job %q: %v", ErrInvalidOpts, p.Name, err)
		}
	}
	if p.Args == nil {
		return fmt.Errorf("%w: periodic job %q has nil args", ErrInvalidArgs, p.Name)
	}
	if o := p.Opts; o != nil && (!o.RunAt.IsZero() || o.Delay != 0 || o.Unique != nil) {
		return fmt.Errorf("%w: periodic job %q: RunAt, Delay and Unique are set by the schedule", ErrInvalidOpts, p.Name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return errors.New("conveyor: AddPeriodic after Start")
	}
	for _, j := range c.periodic.jobs {
		if j.Name == p.Name {
			return fmt.Errorf("conveyor: a periodic job named %q is already registered", p.Name)
		}
	}
	// Check the options now rather than at the first slot.
	if _, err := c.param(p.Args, p.Opts, false); err != nil {
		return fmt.Errorf("conveyor: periodic job %q: %w", p.Name, err)
	}
	c.periodic.jobs = append(c.periodic.jobs, &periodicState{PeriodicJob: p})
	return nil
}

// startPeriodic starts the periodic loop if there are periodic jobs.
func (c *Client[TTx]) startPeriodic() {
	p := &c.periodic
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.jobs) == 0 || p.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	p.cancel, p.done = cancel, done
	go func() {
		defer close(done)
		c.periodicLoop(ctx)
	}()
}

// stopPeriodic stops the periodic loop and waits for it.
func (c *Client[TTx]) stopPeriodic() {
	p := &c.periodic
	p.mu.Lock()
	cancel, done := p.cancel, p.done
	p.cancel, p.done = nil, nil
	p.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

func (c *Client[TTx]) periodicLoop(ctx context.Context) {
	jobs := c.periodic.jobs
	recorded := map[string]driver.ScheduleRow{}
	for try := 0; ; try++ {
		rows, err := c.drv.Schedules(ctx)
		if err == nil {
			for _, r := range rows {
				recorded[r.Name] = r
			}
			break
		}
		if ctx.Err() != nil {
			return
		}
		c.cfg.Logger.Warn("conveyor: reading the periodic schedules failed (retrying)", "error", err)
		if !sleepCtx(ctx, min(time.Second<<min(try, 5), 30*time.Second)) {
			return
		}
	}
	now := time.Now()
	for _, j := range jobs {
		j.next = j.Schedule.Next(now)
		if j.next.IsZero() {
			// A schedule of the application's own that has ended (or
			// never had a slot): said once, not refused, so that a
			// process restarted after its end still starts.
			c.cfg.Logger.Warn("conveyor: periodic job has no slot to come; it enqueues nothing", "name", j.Name, "schedule", j.Schedule.String())
		}
		r, ok := recorded[j.Name]
		if !j.RunMissed || !ok || r.LastSlot.IsZero() {
			continue // missed slots are skipped; a new schedule missed none
		}
		// The latest slot in (last recorded, now], if any, was missed.
		if missed := latestSlot(j.Schedule, r.LastSlot, now); !missed.IsZero() {
			c.enqueueSlot(ctx, j, missed)
		}
	}
	// The schedules' rows are touched now and every
	// scheduleTouchInterval while the client runs, whatever their slots:
	// the maintenance leader deletes rows no process touched or recorded
	// for schedulePruneAge (a schedule removed from every process).
	names := make([]string, len(jobs))
	for i, j := range jobs {
		names[i] = j.Name
	}
	touchAt := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		if !time.Now().Before(touchAt) {
			touchAt = time.Now().Add(scheduleTouchInterval)
			if err := c.drv.TouchSchedules(ctx, names); err != nil {
				if ctx.Err() != nil {
					return
				}
				c.cfg.Logger.Warn("conveyor: marking the periodic schedules as in use failed (retrying in a minute)", "error", err)
				touchAt = time.Now().Add(time.Minute)
			}
		}
		wake := touchAt
		for _, j := range jobs {
			if !j.next.IsZero() && j.next.Before(wake) {
				wake = j.next
			}
		}
		timer.Reset(time.Until(wake))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		c.periodicWake(ctx, jobs, time.Now())
	}
}

// periodicWake enqueues the slots of jobs due at now (this process's
// clock), in order; a slot that failed is tried again at the next wake,
// as are all of them if the schedules could not be read.
//
// The schedules' records (read to leave out slots other processes went
// past long ago, see slotPassed) are read again only when the last read
// is older than recordsFresh: a slot another process went past since
// that read is at most that old by the database's clock, younger than
// any retention could prune its job at, so its job still holds the
// slot's key and refuses a second one.
func (c *Client[TTx]) periodicWake(ctx context.Context, jobs []*periodicState, now time.Time) {
	recorded := c.periodic.recorded
	fresh := min(recordsFresh, min(c.cfg.CompletedRetention, c.cfg.DiscardedRetention)/4)
	if recorded != nil && time.Since(c.periodic.recordedAt) > fresh {
		recorded = nil
	}
	for _, j := range jobs {
		var due []time.Time
		for s := j.next; !s.IsZero() && !s.After(now); s = j.Schedule.Next(s) {
			due = append(due, s)
			if len(due) > maxCatchUp {
				due = due[1:]
			}
		}
		if len(due) == 0 {
			continue
		}
		if recorded == nil {
			rows, err := c.drv.Schedules(ctx)
			if err != nil {
				if ctx.Err() == nil {
					c.cfg.Logger.Warn("conveyor: reading the periodic schedules failed (retrying)", "error", err)
					sleepCtx(ctx, time.Second)
				}
				return
			}
			recorded = make(map[string]driver.ScheduleRow, len(rows))
			for _, r := range rows {
				recorded[r.Name] = r
			}
			c.periodic.recorded, c.periodic.recordedAt = recorded, time.Now()
		}
		var skipped, todo []time.Time
		for _, s := range due {
			if c.slotPassed(recorded[j.Name], s, now) {
				skipped = append(skipped, s)
				if len(todo) == 0 {
					j.next = j.Schedule.Next(s)
				}
				continue
			}
			todo = append(todo, s)
		}
		// A process that reached its slots late enqueues them in a few
		// writes rather than two per slot: on a busy database (a SQLite
		// file shared by stalled writers) catching up one slot at a
		// time could take longer than the slots come.
		for len(todo) > 0 {
			if j.batch <= 0 {
				j.batch = slotsPerInsert
			}
			n := min(len(todo), j.batch)
			if !c.enqueueSlots(ctx, j, todo[:n]) {
				// A batch that did not go in within its deadline (a
				// write lock held behind stalled writers, a slow disk)
				// would not the next time either: retried smaller.
				j.batch = max(n/2, 1)
				break // retried from this slot at the next wake
			}
			j.batch = min(j.batch*2, slotsPerInsert)
			j.next = j.Schedule.Next(todo[n-1])
			todo = todo[n:]
		}
		if len(skipped) > 0 {
			c.cfg.Logger.Warn("conveyor: periodic slots reached late, after other processes had gone past them, skipped (their jobs may have been pruned: enqueued again they would run twice)",
				"schedule", j.Name, "slots", len(skipped), "first", skipped[0], "last", skipped[len(skipped)-1])
		}
	}
}

// recordsFresh bounds how long the periodic loop goes by one read of
// the schedules' records (at most a quarter of the shorter retention).
const recordsFresh = time.Minute

// slotPassed reports whether slot s, which this process reaches only now,
// must not be enqueued: another process recorded a slot at or after it
// (so it made s's job, or started after s), and s is older than half the
// shorter retention, by this process's clock or by the database's (the
// record's update time), so that its job may have finished and been
// pruned, which would free its unique key. A stalled process (a machine
// suspended, a virtual machine restored) or one whose clock is behind
// the database's would otherwise run such slots a second time.
func (c *Client[TTx]) slotPassed(r driver.ScheduleRow, s, now time.Time) bool {
	if r.LastSlot.IsZero() || r.LastSlot.Before(s) {
		return false // no process has gone past s: its job, if any, is unfinished or kept
	}
	late := now.Sub(s)
	if db := r.UpdatedAt.Sub(s); db > late {
		late = db
	}
	return late >= min(c.cfg.CompletedRetention, c.cfg.DiscardedRetention)/2
}

// latestSlot returns the latest slot of sched in (after, now], zero if
// there is none. It looks back from now over a window that doubles, so
// that a long gap of short slots (a month of Every(time.Second)) is not
// walked from its start.
func latestSlot(sched Schedule, after, now time.Time) time.Time {
	for w := time.Second; ; w *= 2 {
		from := now.Add(-w)
		if !from.After(after) || w > 100*365*24*time.Hour {
			from = after
		}
		var latest time.Time
		for s := sched.Next(from); !s.IsZero() && !s.After(now); s = sched.Next(s) {
			latest = s
		}
		if !latest.IsZero() || from.Equal(after) {
			return latest
		}
	}
}

// slotsPerInsert bounds the slots of one schedule a catching-up wake
// enqueues in one insert (one transaction).
const slotsPerInsert = 100

// enqueueSlot enqueues (or finds enqueued) the job of slot s and records
// it; false if that failed and should be tried again.
func (c *Client[TTx]) enqueueSlot(ctx context.Context, j *periodicState, s time.Time) bool {
	return c.enqueueSlots(ctx, j, []time.Time{s})
}

// enqueueSlots enqueues (or finds enqueued) the jobs of slots, in order,
// in one insert, and records the last; false if that failed and all
// should be tried again.
func (c *Client[TTx]) enqueueSlots(ctx context.Context, j *periodicState, slots []time.Time) bool {
	// Slots begun are finished even when Stop comes meanwhile, so that
	// their jobs and their record go together (bounded: Stop waits for
	// it).
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	ps := make([]driver.InsertParams, 0, len(slots))
	var err error
	for _, s := range slots {
		opts := EnqueueOpts{}
		if j.Opts != nil {
			opts = *j.Opts
		}
		opts.RunAt = s
		var p driver.InsertParams
		if p, err = c.param(j.Args, &opts, false); err != nil {
			break
		}
		p.UniqueKey, p.UniqueKeep = slotKey(j.Name, s), driver.KeepCompleted|driver.KeepDiscarded|driver.KeepCancelled
		ps = append(ps, p)
	}
	last := slots[len(slots)-1]
	if err == nil {
		var ids []int64
		if ids, _, err = c.eng.Insert(wctx, ps); err == nil {
			err = c.drv.RecordSchedule(wctx, driver.ScheduleRow{
				Name: j.Name, Spec: j.Schedule.String(), LastSlot: last, LastJob: ids[len(ids)-1], NextSlot: j.Schedule.Next(last),
			})
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			c.cfg.Logger.Warn("conveyor: enqueueing a periodic job failed (retrying)", "schedule", j.Name, "slot", slots[0], "slots", len(slots), "error", err)
			sleepCtx(ctx, time.Second)
		}
		return false
	}
	return true
}

// slotKey is the unique key of schedule name's job for slot s: the same
// in every process, so the database keeps one job per slot.
func slotKey(name string, s time.Time) []byte {
	sum := sha256.Sum256([]byte("conveyor/periodic/v1\x00" + name + "\x00" + strconv.FormatInt(s.UnixNano(), 10)))
	return sum[:]
}

// Schedules lists the periodic schedules: those added to this client, with
// their next slot as this client computes it, and those other processes
// recorded in the database, with the next slot they recorded.
func (c *Client[TTx]) Schedules(ctx context.Context) ([]ScheduleInfo, error) {
	if err := c.ready(ctx); err != nil {
		return nil, err
	}
	rows, err := c.drv.Schedules(ctx)
	if err != nil {
		return nil, err
	}
	byName := map[string]*ScheduleInfo{}
	var out []*ScheduleInfo
	for _, r := range rows {
		s := &ScheduleInfo{Name: r.Name, Spec: r.Spec, Last: r.LastSlot, LastJobID: r.LastJob, Next: r.NextSlot}
		byName[r.Name] = s
		out = append(out, s)
	}
	c.mu.Lock()
	jobs := c.periodic.jobs
	c.mu.Unlock()
	now := time.Now()
	for _, j := range jobs {
		s := byName[j.Name]
		if s == nil {
			s = &ScheduleInfo{Name: j.Name}
			out = append(out, s)
		}
		s.Spec, s.Registered = j.Schedule.String(), true
		from := now
		if s.Last.After(now) {
			from = s.Last
		}
		s.Next = j.Schedule.Next(from)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	res := make([]ScheduleInfo, len(out))
	for i, s := range out {
		res[i] = *s
	}
	return res, nil
}

// sleepCtx waits d or until ctx ends; false if ctx ended.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
