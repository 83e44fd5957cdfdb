package main

import (
	"fmt"

	"github.com/conveyorq/conveyor"
)

// adminCmd retries, cancels or discards one job (cmd names which).
func adminCmd(e *env, cmd string, args []string) error {
	f := e.flags(cmd, cmd+" ID", dbHelp)
	pos, err := e.parse(f, args)
	if err != nil {
		return err
	}
	id, err := parseID(cmd, pos)
	if err != nil {
		return err
	}
	c, err := e.open(false)
	if err != nil {
		return err
	}
	defer c.Close()
	var j *conveyor.JobInfo
	switch cmd {
	case "retry":
		j, err = c.Retry(e.ctx, id)
	case "cancel":
		j, err = c.Cancel(e.ctx, id)
	case "discard":
		j, err = c.Discard(e.ctx, id)
	}
	if err != nil {
		return err // names the operation and the job: "cancel job 7: ..."
	}
	fmt.Fprintf(e.stdout, "job %d is now %s\n", j.ID, j.State)
	return nil
}
