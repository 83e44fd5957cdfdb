package conveyor_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// The state constants are the strings stored in the database and printed
// in JSON; changing one is a breaking change of the schema and the CLI.
func TestJobStatesAreTheStoredStrings(t *testing.T) {
	want := []conveyor.JobState{"available", "scheduled", "running", "retryable", "completed", "discarded", "cancelled"}
	if got := conveyor.JobStates(); !slices.Equal(got, want) {
		t.Fatalf("JobStates() = %q, want %q", got, want)
	}
	var stored []conveyor.JobState
	for _, s := range driver.AllStates {
		stored = append(stored, conveyor.JobState(s))
	}
	if !slices.Equal(conveyor.JobStates(), stored) {
		t.Fatalf("JobStates() = %q, the driver stores %q", conveyor.JobStates(), stored)
	}
	conveyor.JobStates()[0] = "changed"
	if conveyor.JobStates()[0] != conveyor.JobStateAvailable {
		t.Fatal("JobStates returns a shared slice")
	}
	b, err := json.Marshal(struct {
		S conveyor.JobState
		C map[conveyor.JobState]int64
	}{conveyor.JobStateRetryable, map[conveyor.JobState]int64{conveyor.JobStateAvailable: 1}})
	if err != nil || string(b) != `{"S":"retryable","C":{"available":1}}` {
		t.Fatalf("JSON %s (%v)", b, err)
	}
}

func TestParseJobState(t *testing.T) {
	for _, s := range conveyor.JobStates() {
		if got, err := conveyor.ParseJobState(string(s)); got != s || err != nil {
			t.Errorf("ParseJobState(%q) = %q, %v", s, got, err)
		}
	}
	for _, bad := range []string{"", "done", "Completed", " running"} {
		_, err := conveyor.ParseJobState(bad)
		const list = "available, scheduled, running, retryable, completed, discarded, cancelled"
		if err == nil || !strings.Contains(err.Error(), `"`+bad+`"`) || !strings.Contains(err.Error(), list) {
			t.Errorf("ParseJobState(%q): error %v, want one naming it and listing %s", bad, err, list)
		}
	}
}

func TestJobsRefusesUnknownState(t *testing.T) {
	c := openDropped(t, backends[0].dsn(t), fast(testdb.Prefix()))
	_, err := c.Jobs(context.Background(), conveyor.JobFilter{States: []conveyor.JobState{conveyor.JobStateRunning, "done"}})
	if err == nil || !strings.Contains(err.Error(), `unknown job state "done"`) || !strings.Contains(err.Error(), "cancelled") {
		t.Fatalf("Jobs with state done: %v", err)
	}
	if _, err := c.Jobs(context.Background(), conveyor.JobFilter{States: conveyor.JobStates()}); err != nil {
		t.Fatalf("Jobs with every state: %v", err)
	}
}

// A queue or kind name that no job can have (enqueue refuses it) is an
// error naming it, not an empty list that hides the typo.
func TestJobsRefusesInvalidNames(t *testing.T) {
	c := openDropped(t, backends[0].dsn(t), fast(testdb.Prefix()))
	ctx := context.Background()
	for _, f := range []struct {
		filter conveyor.JobFilter
		want   string
	}{
		{conveyor.JobFilter{Queue: "bad q"}, `invalid queue name "bad q"`},
		{conveyor.JobFilter{Queue: "-dash"}, `invalid queue name "-dash"`},
		{conveyor.JobFilter{Kind: "bad kind"}, `invalid kind name "bad kind"`},
		{conveyor.JobFilter{Queue: "ok", Kind: strings.Repeat("k", 129)}, "invalid kind name"},
	} {
		_, err := c.Jobs(ctx, f.filter)
		if err == nil || !errors.Is(err, conveyor.ErrInvalidOpts) || !strings.Contains(err.Error(), f.want) {
			t.Errorf("Jobs(%+v): %v, want ErrInvalidOpts with %q", f.filter, err, f.want)
		}
		if _, err := c.JobsTx(ctx, nil, f.filter); err == nil || !strings.Contains(err.Error(), f.want) {
			t.Errorf("JobsTx(%+v): %v, want %q", f.filter, err, f.want)
		}
	}
	if _, err := c.Jobs(ctx, conveyor.JobFilter{Queue: "a.b:c-d_e", Kind: "svc/report.v2"}); err != nil {
		t.Fatalf("Jobs with valid names: %v", err)
	}
}

// Counters keep the JSON keys the map they replaced had; the backend's own
// counters are under "driver", and Map flattens both as before.
func TestCountersJSONAndMap(t *testing.T) {
	engine := []string{"claim_rounds", "claimed", "claimed_at_insert", "outcome_rounds", "insert_rounds", "completed", "failed_attempts", "snoozed", "stale_acks_refused", "leases_lost",
		"lease_deadlines", "released", "rescued", "promoted", "pruned", "db_errors"}
	c := conveyor.Counters{Claimed: 3, Driver: map[string]int64{"busy_retries": 2}}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if want := append(slices.Clone(engine), "driver"); !sameKeys(got, want) {
		t.Fatalf("JSON keys %v, want %v", slices.Sorted(maps.Keys(got)), want)
	}
	if got["claimed"] != 3.0 || got["driver"].(map[string]any)["busy_retries"] != 2.0 {
		t.Fatalf("JSON %s", b)
	}
	m := c.Map()
	if !sameKeys(m, append(slices.Clone(engine), "busy_retries")) || m["claimed"] != 3 || m["busy_retries"] != 2 {
		t.Fatalf("Map() = %v", m)
	}
}

func sameKeys[V any](m map[string]V, keys []string) bool {
	return slices.Equal(slices.Sorted(maps.Keys(m)), slices.Sorted(slices.Values(keys)))
}

// Each backend reports exactly the driver counters Counters.Driver
// documents for it.
func TestDriverCountersAsDocumented(t *testing.T) {
	documented := map[string][]string{
		"sqlite":   {"busy_retries", "starved_writes", "lock_timeouts"},
		"postgres": {"deadlock_retries", "lock_timeouts", "serialization_retries", "listen_reconnects", "server_drops", "notify_lost"},
		"mysql":    {"deadlock_retries", "lock_timeouts", "claim_conflicts"},
	}
	forEachBackend(t, func(t *testing.T, dsn string) {
		c := openDropped(t, dsn, fast(testdb.Prefix()))
		got := c.Counters().Driver
		if want := documented[c.Backend()]; !sameKeys(got, want) {
			t.Fatalf("%s driver counters %v, documented %v", c.Backend(), got, want)
		}
	})
}

type ctxKey struct{}

// Start's context bounds the start only: a context already done refuses
// the start, and cancelling it after Start returned leaves the client
// working. Its values reach the jobs' contexts.
func TestStartContextBoundsStartOnly(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		c := openDropped(t, dsn, fast(testdb.Prefix()))
		type seen struct {
			value   any
			err     error
			args    noop
			encoded json.RawMessage
		}
		ran := make(chan seen, 1)
		conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[noop]) error {
			ran <- seen{ctx.Value(ctxKey{}), ctx.Err(), j.Args, j.EncodedArgs}
			return nil
		}))

		done, cancelDone := context.WithCancel(context.Background())
		cancelDone()
		if err := c.Start(done); !errors.Is(err, context.Canceled) {
			t.Fatalf("Start with a cancelled context: %v, want context.Canceled", err)
		}

		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "from Start"))
		if err := c.Start(ctx); err != nil {
			t.Fatalf("Start after a refused start: %v", err)
		}
		cancel()

		id, err := c.Enqueue(context.Background(), noop{N: 7}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var s seen
		select {
		case s = <-ran:
		case <-time.After(20 * time.Second):
			t.Fatal("the job did not run after Start's context was cancelled")
		}
		if s.value != "from Start" || s.err != nil {
			t.Fatalf("job context: value %v, err %v; want Start's value and no error", s.value, s.err)
		}
		if s.args.N != 7 || !sameJSON(t, []byte(`{"n":7}`), s.encoded) {
			t.Fatalf("job args %+v, encoded %s", s.args, s.encoded)
		}
		waitFor(t, "the job completed", 20*time.Second, func() bool { return jobState(t, c, id).State == conveyor.JobStateCompleted })
	})
}

func TestStartAfterClose(t *testing.T) {
	ctx := context.Background()
	c, err := connect.Open(ctx, backends[0].dsn(t), fast(testdb.Prefix()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); !errors.Is(err, conveyor.ErrClosed) {
		t.Fatalf("Start after Close: %v, want ErrClosed", err)
	}
}
