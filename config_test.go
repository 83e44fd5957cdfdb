package conveyor_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
)

// TestConfigRefused: every Config and QueueConfig value that makes no
// sense is refused when the client is created, with ErrInvalidConfig and
// an error of one line that names the field, before anything is opened
// (the SQLite file is not created).
func TestConfigRefused(t *testing.T) {
	mw := func(ctx context.Context, _ *conveyor.JobInfo, next func(context.Context) error) error {
		return next(ctx)
	}
	for _, tc := range []struct {
		field string
		set   func(c *conveyor.Config)
	}{
		{"NoQueues", func(c *conveyor.Config) { c.NoQueues, c.Queues = true, map[string]conveyor.QueueConfig{"a": {}} }},
		{`Queues: "bad queue!"`, func(c *conveyor.Config) { c.Queues = map[string]conveyor.QueueConfig{"bad queue!": {}} }},
		{`Queues["a"].MaxWorkers -1`, func(c *conveyor.Config) { c.Queues = map[string]conveyor.QueueConfig{"a": {MaxWorkers: -1}} }},
		{`Queues["a"].MaxWorkers 10001`, func(c *conveyor.Config) { c.Queues = map[string]conveyor.QueueConfig{"a": {MaxWorkers: 10001}} }},
		{"TablePrefix", func(c *conveyor.Config) { c.TablePrefix = "Bad-Prefix" }},
		{"ClaimBatch -1", func(c *conveyor.Config) { c.ClaimBatch = -1 }},
		{"ClaimBatch 10001", func(c *conveyor.Config) { c.ClaimBatch = 10001 }},
		{"CompleteBatch -5", func(c *conveyor.Config) { c.CompleteBatch = -5 }},
		{"CompleteBatch 100001", func(c *conveyor.Config) { c.CompleteBatch = 100001 }},
		{"InsertBatch -1", func(c *conveyor.Config) { c.InsertBatch = -1 }},
		{"InsertBatch 1000000", func(c *conveyor.Config) { c.InsertBatch = 1000000 }},
		{"Lease -1s", func(c *conveyor.Config) { c.Lease = -time.Second }},
		{"Lease 50ms", func(c *conveyor.Config) { c.Lease = 50 * time.Millisecond }},
		{"HeartbeatInterval -1s", func(c *conveyor.Config) { c.HeartbeatInterval = -time.Second }},
		{"HeartbeatInterval 20s", func(c *conveyor.Config) { c.Lease, c.HeartbeatInterval = 30*time.Second, 20*time.Second }},
		{"HeartbeatInterval 1µs", func(c *conveyor.Config) { c.HeartbeatInterval = time.Microsecond }},
		{"JobTimeout 744h0m0s", func(c *conveyor.Config) { c.JobTimeout = 31 * 24 * time.Hour }},
		{"MaxAttempts -3", func(c *conveyor.Config) { c.MaxAttempts = -3 }},
		{"MaxAttempts 1001", func(c *conveyor.Config) { c.MaxAttempts = 1001 }},
		{"PollMin -10ms", func(c *conveyor.Config) { c.PollMin = -10 * time.Millisecond }},
		{"PollMax -1s", func(c *conveyor.Config) { c.PollMax = -time.Second }},
		{"PollMax 10ms is shorter than PollMin 20ms", func(c *conveyor.Config) { c.PollMin, c.PollMax = 20*time.Millisecond, 10*time.Millisecond }},
		{"ListenPoll -2s", func(c *conveyor.Config) { c.ListenPoll = -2 * time.Second }},
		{"PromoteInterval -1ms", func(c *conveyor.Config) { c.PromoteInterval = -time.Millisecond }},
		{"PromoteInterval 1ns", func(c *conveyor.Config) { c.PromoteInterval = time.Nanosecond }},
		{"RescueInterval -5s", func(c *conveyor.Config) { c.RescueInterval = -5 * time.Second }},
		{"PruneInterval -1m0s", func(c *conveyor.Config) { c.PruneInterval = -time.Minute }},
		{"CompletedRetention -1h0m0s", func(c *conveyor.Config) { c.CompletedRetention = -time.Hour }},
		{"DiscardedRetention -1ns", func(c *conveyor.Config) { c.DiscardedRetention = -1 }},
		{"ShutdownTimeout -1s", func(c *conveyor.Config) { c.ShutdownTimeout = -time.Second }},
		{"MaxArgsBytes -1", func(c *conveyor.Config) { c.MaxArgsBytes = -1 }},
		{"MaxArgsBytes 1", func(c *conveyor.Config) { c.MaxArgsBytes = 1 }},
		{"WorkMiddleware[1] is nil", func(c *conveyor.Config) { c.WorkMiddleware = []conveyor.WorkMiddleware{mw, nil} }},
		{"EnqueueMiddleware[0] is nil", func(c *conveyor.Config) { c.EnqueueMiddleware = []conveyor.EnqueueMiddleware{nil} }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			cfg := &conveyor.Config{}
			tc.set(cfg)
			path := filepath.Join(t.TempDir(), "c.db")
			c, err := connect.Open(context.Background(), path, cfg)
			if err == nil {
				c.Close()
				t.Fatalf("accepted; want a refusal naming %s", tc.field)
			}
			if !errors.Is(err, conveyor.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("err = %q; want one line wrapping ErrInvalidConfig and naming %s", err, tc.field)
			}
			if _, serr := os.Stat(path); !errors.Is(serr, os.ErrNotExist) {
				t.Fatalf("the refused client left %s behind (%v)", path, serr)
			}
		})
	}
}

// TestConfigDefaults: zero takes each field's default, and values that
// make sense but look unusual are kept.
func TestConfigDefaults(t *testing.T) {
	open := func(cfg *conveyor.Config) conveyor.Config {
		t.Helper()
		c, err := connect.Open(context.Background(), filepath.Join(t.TempDir(), "c.db"), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.Config()
	}
	got := open(nil)
	want := conveyor.Config{
		ClaimBatch: 1000, CompleteBatch: 2000, InsertBatch: 1000, Lease: 30 * time.Second, HeartbeatInterval: 6 * time.Second,
		JobTimeout: time.Minute, MaxAttempts: 25, PollMin: 10 * time.Millisecond, PollMax: 500 * time.Millisecond,
		ListenPoll: 2 * time.Second, PromoteInterval: 250 * time.Millisecond, RescueInterval: 5 * time.Second,
		PruneInterval: time.Minute, CompletedRetention: 24 * time.Hour, DiscardedRetention: 7 * 24 * time.Hour,
		ShutdownTimeout: 10 * time.Second, MaxArgsBytes: 1 << 20, TablePrefix: "conveyor_",
	}
	if got.ClaimBatch != want.ClaimBatch || got.CompleteBatch != want.CompleteBatch || got.InsertBatch != want.InsertBatch ||
		got.Lease != want.Lease || got.HeartbeatInterval != want.HeartbeatInterval || got.JobTimeout != want.JobTimeout ||
		got.MaxAttempts != want.MaxAttempts || got.PollMin != want.PollMin || got.PollMax != want.PollMax ||
		got.ListenPoll != want.ListenPoll || got.PromoteInterval != want.PromoteInterval || got.RescueInterval != want.RescueInterval ||
		got.PruneInterval != want.PruneInterval || got.CompletedRetention != want.CompletedRetention ||
		got.DiscardedRetention != want.DiscardedRetention || got.ShutdownTimeout != want.ShutdownTimeout ||
		got.MaxArgsBytes != want.MaxArgsBytes || got.TablePrefix != want.TablePrefix || got.Backoff == nil || got.Logger == nil ||
		got.FailedAttemptLevel == nil || got.Queues[conveyor.DefaultQueue].MaxWorkers != 100 || len(got.Queues) != 1 {
		t.Fatalf("defaults: got %+v", got)
	}
	// A PollMin above PollMax's default raises the default; a negative
	// JobTimeout means none; a tiny retention prunes at the next pass.
	got = open(&conveyor.Config{PollMin: time.Second, JobTimeout: -1, CompletedRetention: time.Nanosecond, Lease: time.Second})
	if got.PollMax != time.Second || got.JobTimeout != -1 || got.CompletedRetention != time.Nanosecond || got.HeartbeatInterval != 200*time.Millisecond {
		t.Fatalf("PollMax %v JobTimeout %v CompletedRetention %v HeartbeatInterval %v", got.PollMax, got.JobTimeout, got.CompletedRetention, got.HeartbeatInterval)
	}
}
