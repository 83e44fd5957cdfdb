package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/conveyorq/conveyor"
)

// Bounds of the limits flags: the library's (conveyor.QueueLimits),
// checked here so that an error names the flag.
const (
	maxLimitSlots = 100000
	maxRatePeriod = 30 * 24 * time.Hour
)

const limitsSynopsis = "limits [--json] | limits set QUEUE [--max-running N] [--rate N --per DURATION] [--key-max-running N] [--ordered[=false]] [--ordered-move-on[=false]] [--key-rate N --key-rate-period DURATION] [--fair[=false]] [--allow-unknown-queue] | limits weights QUEUE [KEY=WEIGHT ...] [--clear] [--allow-unknown-queue] | limits clear QUEUE"

// limitsFlags are the flags of limits and its subcommands, parsed in one
// set so that they may come before or after the subcommand.
type limitsFlags struct {
	asJSON, allow bool
	maxRunning    int
	rate          int
	per           time.Duration
	keyMaxRunning int
	ordered       bool
	moveOn        bool
	keyRate       int
	keyPer        time.Duration
	fair          bool
	clear         bool
	set           map[string]bool // the flags given
}

// limitsCmd lists the limited queues (no subcommand), sets a queue's
// limits (set), its key weights (weights) or clears its limits (clear).
func limitsCmd(e *env, args []string) error {
	f := e.flags("limits", limitsSynopsis, dbHelp)
	f.about = "limits: the limited queues, with their use and what holds their jobs.\n" +
		"limits set: limits QUEUE in every process working it on the database: at most N jobs running\n" +
		"at once (--max-running), at most N jobs started per DURATION (--rate with --per), at most N\n" +
		"jobs with the same key (enqueue --key) running at once (--key-max-running), each key's jobs\n" +
		"one at a time in enqueue order, a failed job holding its key until its retry ends (--ordered),\n" +
		"or letting the key's next job start meanwhile (--ordered-move-on, which implies --ordered),\n" +
		"at most N jobs with the same key started per DURATION (--key-rate with --key-rate-period),\n" +
		"keys served in turns so that a key with many waiting jobs does not delay the others (--fair).\n" +
		"Only the limits given change; 0 (or =false) removes one. Jobs over a limit wait in the queue;\n" +
		"running jobs go on.\n" +
		"A queue exists when the database holds a job of it, a live process works it, or it is paused\n" +
		"or limited; limiting one that does not exist is refused without --allow-unknown-queue.\n" +
		"limits weights: replaces QUEUE's key weights: under --fair a key of weight 3 takes up to 3 jobs\n" +
		"per turn where a key not weighed takes 1 (KEY=WEIGHT, weights 1 to 1000, at most 1000 keys);\n" +
		"--clear removes them; without KEY=WEIGHT it prints them. Weights wait for --fair and stay when\n" +
		"the limits change.\n" +
		"limits clear: removes QUEUE's limits (its key weights stay: limits weights QUEUE --clear)."
	var o limitsFlags
	f.BoolVar(&o.asJSON, "json", false, "limits: print JSON, the queues as in stats --json")
	f.IntVar(&o.maxRunning, "max-running", 0, "set: most jobs of the queue running at once across every process, 0 for no limit (0 to 100000)")
	f.IntVar(&o.rate, "rate", 0, "set: most jobs of the queue started per --per, 0 for no rate limit (0 to 100000)")
	f.DurationVar(&o.per, "per", 0, "set: the rate's `window`, such as 1s, 1m or 1h (1ms to 720h); with --rate")
	f.IntVar(&o.keyMaxRunning, "key-max-running", 0, "set: most jobs with the same key running at once across every process, 0 for no limit per key (0 to 100000; 0 or 1 with --ordered)")
	f.BoolVar(&o.ordered, "ordered", false, "set: run each key's jobs one at a time in enqueue order; a failed job waiting for its retry holds its key (--ordered=false removes it, and the one job per key it implies)")
	f.BoolVar(&o.moveOn, "ordered-move-on", false, "set: with --ordered (implied), let a key's next job start while a failed job of the key waits for its retry")
	f.IntVar(&o.keyRate, "key-rate", 0, "set: most jobs with the same key started per --key-rate-period, 0 for no rate per key (0 to 100000)")
	f.DurationVar(&o.keyPer, "key-rate-period", 0, "set: the rate per key's `window`, such as 1s, 1m or 1h (1ms to 720h); with --key-rate")
	f.BoolVar(&o.fair, "fair", false, "set: serve the queue's keys in turns, each taking up to its weight (limits weights) of a claim per turn, so that a key with many waiting jobs does not delay the others (--fair=false removes it)")
	f.BoolVar(&o.clear, "clear", false, "weights: remove the queue's key weights")
	f.BoolVar(&o.allow, "allow-unknown-queue", false, "set, weights: limit a queue that has no job, no live process, no pause and no limits yet (before its first use)")
	pos, err := e.parse(f, args)
	if err != nil {
		return err
	}
	o.set = map[string]bool{}
	f.Visit(func(fl *flag.Flag) { o.set[fl.Name] = true })
	sub := ""
	if len(pos) > 0 {
		sub, pos = pos[0], pos[1:]
	}
	only := func(cmd string, allowed ...string) error {
		for name := range o.set {
			if name != "db" && name != "prefix" && name != "connect-timeout" && !slices.Contains(allowed, name) {
				return usageError(cmd, fmt.Sprintf("--%s does not apply to %s", name, cmd))
			}
		}
		return nil
	}
	switch sub {
	case "":
		if err := only("limits", "json"); err != nil {
			return err
		}
		return limitsList(e, o)
	case "set":
		if err := only("limits set", "max-running", "rate", "per", "key-max-running", "ordered", "ordered-move-on", "key-rate", "key-rate-period", "fair", "allow-unknown-queue"); err != nil {
			return err
		}
		return limitsSet(e, o, pos)
	case "weights":
		if err := only("limits weights", "clear", "allow-unknown-queue"); err != nil {
			return err
		}
		return limitsWeights(e, o, pos)
	case "clear":
		if err := only("limits clear"); err != nil {
			return err
		}
		return limitsClear(e, pos)
	}
	return usageError("limits", fmt.Sprintf("unknown subcommand %q: set, weights or clear", sub))
}

// limitsList prints the limited queues.
func limitsList(e *env, o limitsFlags) error {
	c, err := e.open(false)
	if err != nil {
		return err
	}
	defer c.Close()
	// Overview since now counts the unfinished jobs exactly, through their
	// indexes, and no finished one: what holds a queue needs no more.
	s, err := c.Overview(e.ctx, time.Now())
	if err != nil {
		return err
	}
	var limited []conveyor.QueueStats
	for _, q := range s.Queues {
		if q.Limits != nil {
			limited = append(limited, q)
		}
	}
	sort.Slice(limited, func(i, j int) bool { return limited[i].Queue < limited[j].Queue })
	weights, err := c.KeyWeights(e.ctx)
	if err != nil {
		return err
	}
	if o.asJSON {
		out := struct {
			Backend string           `json:"backend"`
			Queues  []queueStatsJSON `json:"queues"`
		}{Backend: c.Backend(), Queues: []queueStatsJSON{}}
		for _, x := range limited {
			q := toQueueStatsJSON(x)
			q.KeyWeights = weights[x.Queue]
			out.Queues = append(out.Queues, q)
		}
		// Weighed queues without limits: their weights wait for Fair.
		for _, q := range sortedKeys(weights) {
			if !slices.ContainsFunc(limited, func(x conveyor.QueueStats) bool { return x.Queue == q }) {
				out.Queues = append(out.Queues, queueStatsJSON{Queue: q, Counts: map[conveyor.JobState]int64{}, KeyWeights: weights[q]})
			}
		}
		return json.NewEncoder(e.stdout).Encode(out)
	}
	if len(limited) == 0 {
		fmt.Fprintln(e.stdout, "no queue has limits (conveyor limits set QUEUE --max-running N | --rate N --per DURATION | --key-max-running N | --ordered | --key-rate N --key-rate-period DURATION | --fair)")
	} else {
		w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "QUEUE\tRUNNING\tSTARTED\tKEYS\tAVAILABLE\tHELD")
		for _, x := range limited {
			run, rate := limitUseText(x)
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", x.Queue, dash(run), dash(rate), dash(keyUseWeightedText(x, len(weights[x.Queue]))), x.Counts[conveyor.JobStateAvailable], dash(x.Held))
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	for _, q := range sortedKeys(weights) {
		fmt.Fprintf(e.stdout, "key weights of %s: %s\n", q, weightsText(weights[q], maxWeightsShown))
	}
	return nil
}

// maxWeightsShown is how many key weights of a queue the limits listing
// prints; limits weights QUEUE prints them all.
const maxWeightsShown = 10

// weightsText is a queue's key weights, heaviest first then by key:
// "acme=3 globex=2"; past max of them, how many more there are.
func weightsText(w map[string]int, max int) string {
	keys := sortedKeys(w)
	sort.SliceStable(keys, func(i, j int) bool { return w[keys[i]] > w[keys[j]] })
	var parts []string
	for i, k := range keys {
		if max > 0 && i == max {
			parts = append(parts, fmt.Sprintf("and %d more", len(keys)-max))
			break
		}
		parts = append(parts, fmt.Sprintf("%s=%d", k, w[k]))
	}
	return strings.Join(parts, " ")
}

// sortedKeys is m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// parseKeyWeights reads KEY=WEIGHT arguments, naming the one at fault.
func parseKeyWeights(cmd string, args []string) (map[string]int, error) {
	w := make(map[string]int, len(args))
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		switch {
		case !ok:
			return nil, usageError(cmd, fmt.Sprintf("%q: give KEY=WEIGHT, such as acme=3", a))
		case k == "":
			return nil, usageError(cmd, fmt.Sprintf("%q: the key is empty (KEY=WEIGHT)", a))
		}
		n, err := strconv.Atoi(v)
		switch {
		case err != nil:
			return nil, usageError(cmd, fmt.Sprintf("%q: weight %q is not a whole number (1 to %d)", a, v, conveyor.MaxKeyWeight))
		case n < 1 || n > conveyor.MaxKeyWeight:
			return nil, usageError(cmd, fmt.Sprintf("%q: weight %d is out of range (1 to %d; --clear removes every weight)", a, n, conveyor.MaxKeyWeight))
		}
		if _, dup := w[k]; dup {
			return nil, usageError(cmd, fmt.Sprintf("%q: key %q is given twice", a, k))
		}
		w[k] = n
	}
	if len(w) > conveyor.MaxKeyWeights {
		return nil, usageError(cmd, fmt.Sprintf("%d keys weighed: at most %d", len(w), conveyor.MaxKeyWeights))
	}
	return w, nil
}

// limitsWeights replaces (KEY=WEIGHT ...), removes (--clear) or prints
// (neither) a queue's key weights.
func limitsWeights(e *env, o limitsFlags, pos []string) error {
	const cmd = "limits weights"
	if len(pos) == 0 {
		return usageError(cmd, "queue name required")
	}
	queue, args := pos[0], pos[1:]
	if err := conveyor.ValidQueueName(queue); err != nil {
		return fmt.Errorf("%s: queue %q: %w", cmd, queue, err)
	}
	if o.clear && len(args) > 0 {
		return usageError(cmd, fmt.Sprintf("--clear removes every weight: drop %q, or --clear", args[0]))
	}
	w, err := parseKeyWeights(cmd, args)
	if err != nil {
		return err
	}
	c, err := e.open(false)
	if err != nil {
		return err
	}
	defer c.Close()
	all, err := c.KeyWeights(e.ctx)
	if err != nil {
		return err
	}
	if !o.clear && len(w) == 0 {
		if len(all[queue]) == 0 {
			fmt.Fprintf(e.stdout, "queue %s has no key weights (each key weighs 1)\n", queue)
			return nil
		}
		fmt.Fprintf(e.stdout, "key weights of %s: %s\n", queue, weightsText(all[queue], 0))
		return nil
	}
	if o.clear && len(all[queue]) == 0 {
		fmt.Fprintf(e.stdout, "queue %s has no key weights: nothing changed\n", queue)
		return nil
	}
	limits, err := c.QueueLimits(e.ctx)
	if err != nil {
		return err
	}
	l, limited := limits[queue]
	if !limited && len(all[queue]) == 0 && !o.allow {
		exists, err := queueKnown(e, c, queue)
		if err != nil {
			return err
		}
		if !exists {
			return fmt.Errorf("%s: queue %q is unknown: it has no job, no live process works it and it is neither paused nor limited (a typo? --allow-unknown-queue weighs its keys before its first use)", cmd, queue)
		}
	}
	if err := c.SetKeyWeights(e.ctx, queue, w); err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	if len(w) == 0 {
		fmt.Fprintf(e.stdout, "queue %s has no key weights now (each key weighs 1)\n", queue)
		return nil
	}
	msg := fmt.Sprintf("key weights of %s: %s", queue, weightsText(w, 0))
	if !l.Fair {
		msg += fmt.Sprintf(" (they apply once the queue is fair: conveyor limits set %s --fair)", queue)
	}
	fmt.Fprintln(e.stdout, msg)
	return nil
}

// limitsSet sets a queue's limits. Only the limits given change:
// --max-running alone keeps the queue's rate, and 0 removes a limit.
func limitsSet(e *env, o limitsFlags, pos []string) error {
	const cmd = "limits set"
	queue, err := limitsQueue(cmd, pos)
	if err != nil {
		return err
	}
	set := o.set
	switch {
	case set["per"] && !set["rate"]:
		return usageError(cmd, "--per is the window of --rate: give --rate N with it")
	case set["key-rate-period"] && !set["key-rate"]:
		return usageError(cmd, "--key-rate-period is the window of --key-rate: give --key-rate N with it")
	case !set["max-running"] && !set["rate"] && !set["key-max-running"] && !set["ordered"] && !set["ordered-move-on"] && !set["key-rate"] && !set["fair"]:
		return usageError(cmd, "give --max-running N, or --rate N with --per DURATION, or --key-max-running N, --ordered, --ordered-move-on, --key-rate N with --key-rate-period DURATION, or --fair (limits clear removes every limit)")
	case set["key-max-running"] && (o.keyMaxRunning < 0 || o.keyMaxRunning > maxLimitSlots):
		return usageError(cmd, fmt.Sprintf("--key-max-running %d: must be 0 (no limit) to %d", o.keyMaxRunning, maxLimitSlots))
	case set["ordered"] && !o.ordered && set["ordered-move-on"] && o.moveOn:
		return usageError(cmd, "--ordered-move-on needs --ordered: drop --ordered=false")
	case (o.ordered || o.moveOn) && o.keyMaxRunning > 1:
		return usageError(cmd, fmt.Sprintf("--key-max-running %d with --ordered: an ordered key runs one job at a time (0 or 1)", o.keyMaxRunning))
	case set["max-running"] && (o.maxRunning < 0 || o.maxRunning > maxLimitSlots):
		return usageError(cmd, fmt.Sprintf("--max-running %d: must be 0 (no limit) to %d", o.maxRunning, maxLimitSlots))
	case set["rate"] && (o.rate < 0 || o.rate > maxLimitSlots):
		return usageError(cmd, fmt.Sprintf("--rate %d: must be 0 (no limit) to %d", o.rate, maxLimitSlots))
	case o.rate > 0 && !set["per"]:
		return usageError(cmd, fmt.Sprintf("--rate %d needs --per DURATION, its window (such as --per 1m)", o.rate))
	case set["rate"] && o.rate == 0 && set["per"]:
		return usageError(cmd, "--per is for --rate N above 0 (--rate 0 removes the rate limit)")
	case set["per"] && (o.per < time.Millisecond || o.per > maxRatePeriod):
		return usageError(cmd, fmt.Sprintf("--per %v: must be 1ms to %s", o.per, shortDuration(maxRatePeriod)))
	case set["key-rate"] && (o.keyRate < 0 || o.keyRate > maxLimitSlots):
		return usageError(cmd, fmt.Sprintf("--key-rate %d: must be 0 (no rate per key) to %d", o.keyRate, maxLimitSlots))
	case o.keyRate > 0 && !set["key-rate-period"]:
		return usageError(cmd, fmt.Sprintf("--key-rate %d needs --key-rate-period DURATION, its window (such as --key-rate-period 1h)", o.keyRate))
	case set["key-rate"] && o.keyRate == 0 && set["key-rate-period"]:
		return usageError(cmd, "--key-rate-period is for --key-rate N above 0 (--key-rate 0 removes the rate per key)")
	case set["key-rate-period"] && (o.keyPer < time.Millisecond || o.keyPer > maxRatePeriod):
		return usageError(cmd, fmt.Sprintf("--key-rate-period %v: must be 1ms to %s", o.keyPer, shortDuration(maxRatePeriod)))
	}
	c, err := e.open(false)
	if err != nil {
		return err
	}
	defer c.Close()
	all, err := c.QueueLimits(e.ctx)
	if err != nil {
		return err
	}
	l, limited := all[queue]
	if !limited && !o.allow {
		exists, err := queueKnown(e, c, queue)
		if err != nil {
			return err
		}
		if !exists {
			return fmt.Errorf("%s: queue %q is unknown: it has no job, no live process works it and it is neither paused nor limited (a typo? --allow-unknown-queue limits it before its first use)", cmd, queue)
		}
	}
	if set["max-running"] {
		l.MaxRunning = o.maxRunning
	}
	if set["rate"] {
		l.Rate, l.RatePeriod = o.rate, o.per
	}
	if set["key-rate"] {
		l.KeyRate, l.KeyRatePeriod = o.keyRate, o.keyPer
	}
	if l.Ordered {
		// An ordered queue's key limit is the 1 that Ordered implies (a
		// backend may store it or not), not a limit of its own: it goes
		// with --ordered=false.
		l.KeyMaxRunning = 0
	}
	if set["key-max-running"] {
		l.KeyMaxRunning = o.keyMaxRunning
	}
	if set["ordered"] {
		l.Ordered = o.ordered
		if !o.ordered {
			l.OrderedMoveOn = false
		}
	}
	if set["ordered-move-on"] {
		l.OrderedMoveOn = o.moveOn
		if o.moveOn {
			l.Ordered = true
		}
	}
	if set["fair"] {
		l.Fair = o.fair
	}
	if l.Ordered && l.KeyMaxRunning > 1 {
		return fmt.Errorf("%s: queue %s has --key-max-running %d, and an ordered key runs one job at a time: give --key-max-running 0 or 1 with --ordered", cmd, queue, l.KeyMaxRunning)
	}
	if err := c.SetQueueLimits(e.ctx, queue, l); err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	if l.IsZero() {
		fmt.Fprintf(e.stdout, "queue %s has no limits now\n", queue)
		return nil
	}
	fmt.Fprintf(e.stdout, "queue %s is limited in every process: %s (conveyor limits clear %s removes the limits)\n", queue, limitsText(l), queue)
	return nil
}

// limitsClear removes a queue's limits.
func limitsClear(e *env, pos []string) error {
	const cmd = "limits clear"
	queue, err := limitsQueue(cmd, pos)
	if err != nil {
		return err
	}
	c, err := e.open(false)
	if err != nil {
		return err
	}
	defer c.Close()
	all, err := c.QueueLimits(e.ctx)
	if err != nil {
		return err
	}
	if _, ok := all[queue]; !ok {
		exists, err := queueKnown(e, c, queue)
		if err != nil {
			return err
		}
		if !exists {
			return fmt.Errorf("%s: queue %q is unknown and has no limits: nothing to clear (%s)", cmd, queue, limitedList(all))
		}
		fmt.Fprintf(e.stdout, "queue %s has no limits: nothing changed\n", queue)
		return nil
	}
	if err := c.SetQueueLimits(e.ctx, queue, conveyor.QueueLimits{}); err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	fmt.Fprintf(e.stdout, "queue %s has no limits now\n", queue)
	return nil
}

// limitsQueue returns the one positional argument, a queue name.
func limitsQueue(cmd string, pos []string) (string, error) {
	switch len(pos) {
	case 0:
		return "", usageError(cmd, "queue name required")
	case 1:
	default:
		return "", usageError(cmd, fmt.Sprintf("unexpected argument %q after the queue name", pos[1]))
	}
	if err := conveyor.ValidQueueName(pos[0]); err != nil {
		return "", fmt.Errorf("%s: queue %q: %w", cmd, pos[0], err)
	}
	return pos[0], nil
}

// queueKnown reports whether queue has a job, a live process working it,
// or a pause.
func queueKnown(e *env, c *conveyor.Client[any], queue string) (bool, error) {
	paused, err := c.PausedQueues(e.ctx)
	if err != nil {
		return false, err
	}
	if _, ok := paused[queue]; ok {
		return true, nil
	}
	return queueInUse(e, c, queue)
}

// limitedList names the limited queues, for an error about another one.
func limitedList(all map[string]conveyor.QueueLimits) string {
	if len(all) == 0 {
		return "no queue has limits"
	}
	names := make([]string, 0, len(all))
	for q := range all {
		names = append(names, q)
	}
	sort.Strings(names)
	return "limited queues: " + strings.Join(names, ", ")
}

// limitsText says what l allows: "at most 5 running, at most 100
// started per 1m".
func limitsText(l conveyor.QueueLimits) string {
	var parts []string
	if l.MaxRunning > 0 {
		parts = append(parts, fmt.Sprintf("at most %d running", l.MaxRunning))
	}
	if l.Rate > 0 {
		parts = append(parts, fmt.Sprintf("at most %d started per %s", l.Rate, shortDuration(l.RatePeriod)))
	}
	switch {
	case l.Ordered && l.OrderedMoveOn:
		parts = append(parts, "each key's jobs one at a time in enqueue order, moving on past a failed job waiting for its retry")
	case l.Ordered:
		parts = append(parts, "each key's jobs one at a time in enqueue order")
	case l.KeyMaxRunning > 0:
		parts = append(parts, fmt.Sprintf("at most %d running per key", l.KeyMaxRunning))
	}
	if l.KeyRate > 0 {
		parts = append(parts, fmt.Sprintf("at most %d started per key per %s", l.KeyRate, shortDuration(l.KeyRatePeriod)))
	}
	if l.Fair {
		parts = append(parts, "keys served in turns by weight (fair)")
	}
	return strings.Join(parts, ", ")
}

// limitUseText is a queue's use of its limits: "3/5" jobs running of
// MaxRunning, and "8/10 per 1m" started of the rate (with the wait for
// room when the window is full); "" for a limit the queue does not have.
func limitUseText(q conveyor.QueueStats) (running, rate string) {
	if q.Limits == nil || q.LimitUse == nil {
		return "", ""
	}
	l, u := q.Limits, q.LimitUse
	if l.MaxRunning > 0 {
		running = fmt.Sprintf("%d/%d", u.Running, l.MaxRunning)
	}
	if l.Rate > 0 {
		rate = fmt.Sprintf("%d/%d per %s", u.Started, l.Rate, shortDuration(l.RatePeriod))
		if u.NextStart > 0 {
			rate += fmt.Sprintf(" (room in %v)", u.NextStart.Round(time.Millisecond))
		}
	}
	return running, rate
}

// keyUseText is a queue's use of its key limits: "2 per key: 3 keys
// running", "ordered by key: 1 key running", "5 per key per 1h: 2 keys
// at their rate", "fair" (joined by ", " when the queue has several),
// with ", 4 waiting for their key" when jobs wait for their key; "" without key
// limits.
func keyUseText(q conveyor.QueueStats) string { return keyUseWeightedText(q, 0) }

// keyUseWeightedText is keyUseText, saying the number of weighted keys
// of a fair queue: "fair (3 weighted keys)".
func keyUseWeightedText(q conveyor.QueueStats, weighted int) string {
	if q.Limits == nil {
		return ""
	}
	l, u := q.Limits, q.LimitUse
	if u == nil {
		u = &conveyor.LimitUse{}
	}
	keys := fmt.Sprintf("%d keys running", u.KeysRunning)
	if u.KeysRunning == 1 {
		keys = "1 key running"
	}
	var parts []string
	switch {
	case l.Ordered && l.OrderedMoveOn:
		parts = append(parts, "ordered by key, moving on: "+keys)
	case l.Ordered:
		parts = append(parts, "ordered by key: "+keys)
	case l.KeyMaxRunning > 0:
		parts = append(parts, fmt.Sprintf("%d per key: %s", l.KeyMaxRunning, keys))
	}
	if l.KeyRate > 0 {
		rated := fmt.Sprintf("%d keys at their rate", u.KeysRated)
		if u.KeysRated == 1 {
			rated = "1 key at its rate"
		}
		parts = append(parts, fmt.Sprintf("%d per key per %s: %s", l.KeyRate, shortDuration(l.KeyRatePeriod), rated))
	}
	switch {
	case l.Fair && weighted == 1:
		parts = append(parts, "fair (1 weighted key)")
	case l.Fair && weighted > 1:
		parts = append(parts, fmt.Sprintf("fair (%d weighted keys)", weighted))
	case l.Fair:
		parts = append(parts, "fair")
	}
	if len(parts) == 0 {
		return ""
	}
	s := strings.Join(parts, ", ")
	if u.KeyHeld > 0 {
		s += fmt.Sprintf(", %d waiting for their key", u.KeyHeld)
	}
	return s
}

// dash is s, or "-" for "".
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// shortDuration is d as --per reads it, without the zero units
// time.Duration.String leaves: "1m", "1h", "1h30m", "250ms".
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// limitsJSON are a queue's limits in the JSON of stats and limits, as
// the HTTP API writes them.
type limitsJSON struct {
	MaxRunning int `json:"max_running"`
	Rate       int `json:"rate"`
	// RatePeriod is a Go duration ("1m"); "" without a rate.
	RatePeriod   string `json:"rate_period"`
	RatePeriodMS int64  `json:"rate_period_ms"`
	// KeyMaxRunning is the most jobs with the same key running at once;
	// 1 with Ordered.
	KeyMaxRunning int  `json:"key_max_running"`
	Ordered       bool `json:"ordered"`
	OrderedMoveOn bool `json:"ordered_move_on"`
	// KeyRate is the most jobs with the same key started per
	// KeyRatePeriod (a Go duration, "" without a rate per key).
	KeyRate         int    `json:"key_rate"`
	KeyRatePeriod   string `json:"key_rate_period"`
	KeyRatePeriodMS int64  `json:"key_rate_period_ms"`
	// Fair serves the queue's keys in turns, each up to its weight.
	Fair bool `json:"fair"`
}

// limitUseJSON is a queue's use of its limits.
type limitUseJSON struct {
	Running     int   `json:"running"`
	Started     int   `json:"started"`
	NextStartMS int64 `json:"next_start_ms"`
	// KeysRunning is how many keys hold a slot; KeyHeld how many due
	// available jobs wait for their key.
	KeysRunning int   `json:"keys_running"`
	KeyHeld     int64 `json:"key_held"`
	// KeysRated is how many keys have used their whole KeyRate in its
	// window.
	KeysRated int `json:"keys_rated"`
}

// queueStatsJSON is one queue of stats --json and limits --json.
type queueStatsJSON struct {
	Queue  string                      `json:"queue"`
	Counts map[conveyor.JobState]int64 `json:"counts"`
	// OldestAvailableMS is null when no job is available.
	OldestAvailableMS *int64 `json:"oldest_available_ms"`
	// PausedAt is null when the queue is not paused.
	PausedAt *time.Time `json:"paused_at"`
	// Limits and LimitUse are null when the queue has no limits.
	Limits   *limitsJSON   `json:"limits"`
	LimitUse *limitUseJSON `json:"limit_use"`
	// Held is why available jobs wait ("paused", "concurrency",
	// "rate", "key"); null when nothing holds them.
	Held *string `json:"held"`
	// AwaitingDependencies is how many jobs of the queue wait for their
	// dependencies (batch callbacks and workflow jobs not enqueued yet).
	AwaitingDependencies int64 `json:"awaiting_dependencies"`
	// KeyWeights are the queue's key weights (limits weights), in
	// limits --json only; left out when it has none.
	KeyWeights map[string]int `json:"key_weights,omitempty"`
}

func toQueueStatsJSON(x conveyor.QueueStats) queueStatsJSON {
	q := queueStatsJSON{Queue: x.Queue, Counts: x.Counts, AwaitingDependencies: x.AwaitingDependencies}
	if x.Counts[conveyor.JobStateAvailable] > 0 {
		q.OldestAvailableMS = ptr(x.OldestAvailable.Milliseconds())
	}
	if !x.PausedAt.IsZero() {
		q.PausedAt = ptr(x.PausedAt.UTC())
	}
	if l := x.Limits; l != nil {
		q.Limits = &limitsJSON{MaxRunning: l.MaxRunning, Rate: l.Rate,
			KeyMaxRunning: l.KeyMaxRunning, Ordered: l.Ordered, OrderedMoveOn: l.OrderedMoveOn, Fair: l.Fair}
		if l.Ordered {
			q.Limits.KeyMaxRunning = 1 // what Ordered implies, whether stored or not
		}
		if l.Rate > 0 {
			q.Limits.RatePeriod, q.Limits.RatePeriodMS = shortDuration(l.RatePeriod), l.RatePeriod.Milliseconds()
		}
		if l.KeyRate > 0 {
			q.Limits.KeyRate = l.KeyRate
			q.Limits.KeyRatePeriod, q.Limits.KeyRatePeriodMS = shortDuration(l.KeyRatePeriod), l.KeyRatePeriod.Milliseconds()
		}
	}
	if u := x.LimitUse; u != nil {
		q.LimitUse = &limitUseJSON{Running: u.Running, Started: u.Started, NextStartMS: u.NextStart.Milliseconds(),
			KeysRunning: u.KeysRunning, KeyHeld: u.KeyHeld, KeysRated: u.KeysRated}
	}
	if x.Held != "" {
		q.Held = ptr(x.Held)
	}
	return q
}
