package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/conveyorq/conveyor"
)

// enqueueCmd enqueues one job and prints its id.
func enqueueCmd(e *env, args []string) error {
	f := e.flags("enqueue", "enqueue --kind K [--args JSON|@FILE|-] [--queue Q] [--priority N] [--delay D] [--max-attempts N]", dbHelp)
	kind := f.String("kind", "", "job `kind` (required)")
	js := f.String("args", "{}", "job arguments: `JSON`, @FILE to read them from a file, or - (or @-) to read them from standard input")
	queue := f.String("queue", "", "`queue` (default \"default\")")
	prio := f.Int("priority", 0, "priority: smaller runs first")
	delay := f.Duration("delay", 0, "run after this delay (e.g. 30s)")
	attempts := f.Int("max-attempts", 0, "maximum attempts (default 25)")
	if err := e.parseNoArgs(f, args, false); err != nil {
		return err
	}
	if *kind == "" {
		return usageError("enqueue", "--kind is required")
	}
	raw, err := readArgs(*js, e.stdin)
	if err != nil {
		return err
	}
	c, err := e.open(false)
	if err != nil {
		return err
	}
	defer c.Close()
	id, err := c.Enqueue(e.ctx, conveyor.RawArgs{KindName: *kind, JSON: raw},
		&conveyor.EnqueueOpts{Queue: *queue, Priority: *prio, Delay: *delay, MaxAttempts: *attempts})
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, id)
	return nil
}

// readArgs returns the JSON given to --args: the value itself, the
// contents of the file after "@", or standard input for "-" or "@-".
func readArgs(v string, stdin io.Reader) (json.RawMessage, error) {
	var b []byte
	var err error
	from := ""
	switch {
	case v == "-" || v == "@-":
		from = "standard input"
		b, err = io.ReadAll(stdin)
	case strings.HasPrefix(v, "@"):
		from = v[1:]
		b, err = os.ReadFile(from)
	default:
		b = []byte(v)
	}
	if err != nil {
		return nil, fmt.Errorf("enqueue: --args: %w", err)
	}
	var x any
	if err := json.Unmarshal(b, &x); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			err = fmt.Errorf("%w at byte %d", err, se.Offset)
		}
		if from != "" {
			return nil, fmt.Errorf("enqueue: --args: %s is not valid JSON: %v", from, err)
		}
		return nil, fmt.Errorf("enqueue: --args is not valid JSON: %v", err)
	}
	return bytes.TrimSpace(b), nil
}
