package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/conveyorq/conveyor"
)

// pauseCmd pauses or resumes (cmd names which) one queue for every process
// working it on the database.
//
// A queue exists, for the command, when the database holds a job of it
// (in any state), a live process works it (a started client that
// registered it, or an HTTP worker that claimed from it within the last
// 30s), or it is paused. Pausing a queue that does not exist is refused
// unless --allow-unknown-queue (to pause a queue before its first job):
// a typo would otherwise leave the real queue running. Resuming a queue
// that is not paused changes nothing and says so; it is an error when
// the queue does not exist either (a typo: the real queue stays paused).
func pauseCmd(e *env, cmd string, args []string) error {
	f := e.flags(cmd, cmd+" QUEUE", dbHelp)
	allow := false
	if cmd == "pause" {
		f.BoolVar(&allow, "allow-unknown-queue", false, "pause a queue that has no job, no live process and no pause yet (before its first use)")
		f.about = "A queue exists when the database holds a job of it, a live process works it, or it is\npaused; pausing one that does not exist is refused without --allow-unknown-queue."
	}
	pos, err := e.parse(f, args)
	if err != nil {
		return err
	}
	switch len(pos) {
	case 0:
		return usageError(cmd, "queue name required")
	case 1:
	default:
		return usageError(cmd, fmt.Sprintf("unexpected argument %q after the queue name", pos[1]))
	}
	queue := pos[0]
	// Checked before the command looks the queue up, so that a bad name
	// is reported as such (PauseQueue refuses it with the same message).
	if err := conveyor.ValidQueueName(queue); err != nil {
		return fmt.Errorf("%s queue %q: %w", cmd, queue, err)
	}
	c, err := e.open(false)
	if err != nil {
		return err
	}
	defer c.Close()
	paused, err := c.PausedQueues(e.ctx)
	if err != nil {
		return err
	}
	since, isPaused := paused[queue]
	exists := isPaused
	if !exists {
		if exists, err = queueInUse(e, c, queue); err != nil {
			return err
		}
	}
	switch {
	case cmd == "pause" && isPaused:
		fmt.Fprintf(e.stdout, "queue %s was already paused, since %s (conveyor resume %s)\n", queue, since.UTC().Format(time.RFC3339), queue)
		return nil
	case cmd == "pause" && !exists && !allow:
		return fmt.Errorf("pause: queue %q is unknown: it has no job, no live process works it and it is not paused (a typo? --allow-unknown-queue pauses it before its first use)", queue)
	case cmd == "resume" && !isPaused && !exists:
		return fmt.Errorf("resume: queue %q is unknown and not paused: nothing to resume (%s)", queue, pausedList(paused))
	case cmd == "resume" && !isPaused:
		fmt.Fprintf(e.stdout, "queue %s is not paused: nothing changed\n", queue)
		return nil
	}
	if cmd == "pause" {
		err = c.PauseQueue(e.ctx, queue)
	} else {
		err = c.ResumeQueue(e.ctx, queue)
	}
	if err != nil {
		return err
	}
	switch {
	case cmd == "resume":
		fmt.Fprintf(e.stdout, "queue %s is resumed\n", queue)
	case !exists:
		fmt.Fprintf(e.stdout, "queue %s is paused, before its first use: no job is in it and no live process works it yet (conveyor resume %s)\n", queue, queue)
	default:
		fmt.Fprintf(e.stdout, "queue %s is paused in every process (running jobs finish; conveyor resume %s)\n", queue, queue)
	}
	return nil
}

// queueInUse reports whether the database holds a job of queue (one row
// of the queue's index) or a live process works it.
func queueInUse(e *env, c *conveyor.Client[any], queue string) (bool, error) {
	jobs, err := c.Jobs(e.ctx, conveyor.JobFilter{Queue: queue, Limit: 1})
	if err != nil || len(jobs) > 0 {
		return len(jobs) > 0, err
	}
	procs, err := c.Processes(e.ctx)
	if err != nil {
		return false, err
	}
	for _, p := range procs {
		if _, ok := p.Queues[queue]; ok && p.Alive {
			return true, nil
		}
	}
	return false, nil
}

// pausedList names the paused queues, for an error about another one.
func pausedList(paused map[string]time.Time) string {
	if len(paused) == 0 {
		return "no queue is paused"
	}
	names := make([]string, 0, len(paused))
	for q := range paused {
		names = append(names, q)
	}
	sort.Strings(names)
	return "paused queues: " + strings.Join(names, ", ")
}
