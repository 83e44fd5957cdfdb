package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/conveyorq/conveyor"
)

// enqueueCmd enqueues one job and prints its id. It refuses a kind that no
// worker is known to handle (see kinds.go) unless --allow-unknown-kinds.
func enqueueCmd(e *env, args []string) error {
	f := e.flags("enqueue", "enqueue --kind K [--args JSON|@FILE|-] [--queue Q] [--priority N] [--delay D] [--max-attempts N] [--key KEY] [--allow-unknown-kinds]", dbHelp)
	kind := f.String("kind", "", "job `kind` (required)")
	js := f.String("args", "{}", "job arguments, a JSON object: `JSON`, @FILE to read them from a file, or - (or @-) to read them from standard input")
	queue := f.String("queue", "", "`queue` (default \"default\")")
	prio := f.Int("priority", 0, fmt.Sprintf("priority: smaller runs first (%d to %d)", conveyor.MinPriority, conveyor.MaxPriority))
	delay := f.Duration("delay", 0, "run after this delay (e.g. 30s)")
	attempts := f.Int("max-attempts", 0, "maximum attempts, 1 or more (default 25)")
	key := f.String("key", "", fmt.Sprintf("the job's limit `key` (a tenant, an account): the queue's per-key limits (limits set --key-max-running, --ordered) hold each key on its own; 1 to %d bytes without NUL", conveyor.MaxKeyBytes))
	allowUnknown := f.Bool("allow-unknown-kinds", false, "enqueue a kind no job of which has completed on the database (a new kind, or one rarer than the completed jobs' retention)")
	if err := e.parseNoArgs(f, args, false); err != nil {
		return err
	}
	given := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	switch {
	case *kind == "":
		return usageError("enqueue", "--kind is required")
	case given["max-attempts"] && *attempts < 1:
		// 0 is the library's "default": given on the command line it is a
		// mistake, not a request for the default.
		return usageError("enqueue", fmt.Sprintf("--max-attempts %d: must be 1 or more", *attempts))
	case *prio < conveyor.MinPriority || *prio > conveyor.MaxPriority:
		return usageError("enqueue", fmt.Sprintf("--priority %d: must be %d to %d", *prio, conveyor.MinPriority, conveyor.MaxPriority))
	case *delay < 0:
		return usageError("enqueue", fmt.Sprintf("--delay %v: must not be negative", *delay))
	case given["key"] && *key == "":
		return usageError("enqueue", "--key is empty: give the job's key, or leave --key out for none")
	case len(*key) > conveyor.MaxKeyBytes:
		return usageError("enqueue", fmt.Sprintf("--key is %d bytes: at most %d", len(*key), conveyor.MaxKeyBytes))
	case !utf8.ValidString(*key) || strings.ContainsRune(*key, 0):
		return usageError("enqueue", fmt.Sprintf("--key %q: must be UTF-8 without NUL characters", *key))
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
	// A kind that breaks the library's rule is left to enqueue, which
	// refuses it with its own message.
	if !*allowUnknown && conveyor.ValidKindName(*kind) == nil {
		known, err := kindKnown(e.ctx, c, *kind)
		if err != nil {
			return err
		}
		if !known {
			return unknownKind(*kind, "enqueue it anyway with --allow-unknown-kinds")
		}
	}
	id, err := c.Enqueue(e.ctx, conveyor.RawArgs{KindName: *kind, JSON: raw},
		&conveyor.EnqueueOpts{Queue: *queue, Priority: *prio, Delay: *delay, MaxAttempts: *attempts, Key: *key})
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
	if _, ok := x.(map[string]any); !ok {
		what := "--args"
		if from != "" {
			what += ": " + from
		}
		return nil, fmt.Errorf("enqueue: %s must be a JSON object ({...}), not %s", what, jsonKind(x))
	}
	return bytes.TrimSpace(b), nil
}

// jsonKind names the kind of a decoded JSON value, for an error.
func jsonKind(x any) string {
	switch x.(type) {
	case []any:
		return "an array"
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", x)
}
