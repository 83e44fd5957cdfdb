package main

import (
	"fmt"
)

// pauseCmd pauses or resumes (cmd names which) one queue for every process
// working it on the database.
func pauseCmd(e *env, cmd string, args []string) error {
	f := e.flags(cmd, cmd+" QUEUE", dbHelp)
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
	c, err := e.open(false)
	if err != nil {
		return err
	}
	defer c.Close()
	queue := pos[0]
	if cmd == "pause" {
		err = c.PauseQueue(e.ctx, queue)
	} else {
		err = c.ResumeQueue(e.ctx, queue)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	if cmd == "pause" {
		fmt.Fprintf(e.stdout, "queue %s is paused in every process (running jobs finish; conveyor resume %s)\n", queue, queue)
	} else {
		fmt.Fprintf(e.stdout, "queue %s is resumed\n", queue)
	}
	return nil
}
