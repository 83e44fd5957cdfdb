package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

// gateAndOther returns the gate of a new database file, a second
// descriptor of its side file standing for another process (OFD locks
// conflict between descriptors exactly as between processes), and the
// file's path. Both are closed when the test ends.
func gateAndOther(t *testing.T) (*gate, *intentFile, string) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("cross-process lease priority is Linux only")
	}
	path := filepath.Join(t.TempDir(), "x.db")
	g, drop := gateFor(path)
	t.Cleanup(drop)
	if g.side == nil {
		t.Fatalf("no side file: %v", g.sideErr)
	}
	other, err := openIntentFile(gateKey(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.close() })
	return g, other, path
}

// TestIntentAcrossDescriptors checks the cross-process half of the gate.
func TestIntentAcrossDescriptors(t *testing.T) {
	g, other, _ := gateAndOther(t)

	if other.othersPending(leaseByte) {
		t.Fatal("a renewal is reported pending before any was announced")
	}
	// Completions and releases (across=false) stay within the process.
	g.leaseBegin(false)
	if other.othersPending(leaseByte) {
		t.Fatal("a completion was announced to other processes")
	}
	g.leaseEnd(false)
	// Two overlapping heartbeats: announced until the last one ends.
	g.leaseBegin(true)
	g.leaseBegin(true)
	if !other.othersPending(leaseByte) {
		t.Fatal("a pending heartbeat is not seen by another process")
	}
	g.leaseEnd(true)
	if !other.othersPending(leaseByte) {
		t.Fatal("the announcement ended while a heartbeat was still pending")
	}
	g.leaseEnd(true)
	if other.othersPending(leaseByte) {
		t.Fatal("the announcement outlived the heartbeats")
	}
}

// TestYieldIsBounded checks that an announcement nobody withdraws (its
// process stopped mid-renewal) holds writes back for maxYield, then not
// again for stuckFor or until it is seen gone, whichever comes first.
func TestYieldIsBounded(t *testing.T) {
	g, stopped, path := gateAndOther(t)
	if err := stopped.announce(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := time.Now()
	g.yield(ctx, false) // returns after maxYield
	if time.Since(start) < maxYield {
		t.Fatalf("a yield to a pending announcement returned after %v, before maxYield", time.Since(start))
	}
	first := g.stuckUntil.Load()
	if first == 0 {
		t.Fatal("a yield that ran out did not mark the announcement stuck")
	}
	g.yield(ctx, false) // returns at once while stuck
	if g.stuckUntil.Load() != first {
		t.Fatal("a yield while stuck waited again and ran out")
	}
	// Past stuckFor, writes yield again (and, the announcement still
	// there, run out again).
	g.stuckUntil.Store(time.Now().Add(-time.Millisecond).UnixNano())
	g.yield(ctx, false)
	if again := g.stuckUntil.Load(); again <= first {
		t.Fatal("writes did not yield again once stuckFor had passed")
	}
	if err := stopped.withdraw(); err != nil {
		t.Fatal(err)
	}
	g.yield(ctx, false)
	if g.stuckUntil.Load() != 0 {
		t.Fatal("stuck not cleared once the announcement was gone")
	}
	// YieldToLeases on a file no client of this process has open returns.
	if err := YieldToLeases(ctx, filepath.Join(t.TempDir(), "none.db")); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	g.leaseBegin(false)
	defer g.leaseEnd(false)
	if err := YieldToLeases(cctx, path); err == nil {
		t.Fatal("YieldToLeases ignored its cancelled context while a renewal of this process was pending")
	}
}

// TestStarvedWrites checks the second byte of the side file: an ordinary
// write that waited for SQLite's lock longer than writeBusyTimeoutMS is
// marked starved for other processes until it ends; other processes'
// ordinary writes yield to the mark, and starved writes (and heartbeats'
// checks) do not.
func TestStarvedWrites(t *testing.T) {
	g, other, path := gateAndOther(t)
	d := openT(t, path, "s_")
	if d.gate != g {
		t.Fatal("the driver does not share the file's gate")
	}
	ctx := context.Background()
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	foreign, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()
	conn, err := foreign.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	inserted := make(chan error, 1)
	go func() {
		_, err := d.Insert(ctx, []driver.InsertParams{{Queue: "s", Kind: "k"}})
		inserted <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !other.othersPending(starvedByte) {
		if time.Now().After(deadline) {
			t.Fatal("an insert waiting for a foreign lock was never marked starved")
		}
		time.Sleep(time.Millisecond)
	}
	if other.othersPending(leaseByte) {
		t.Fatal("a starved write is reported as a pending lease renewal")
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if err := <-inserted; err != nil {
		t.Fatalf("insert after the foreign lock: %v", err)
	}
	if other.othersPending(starvedByte) {
		t.Fatal("the starved mark outlived its write")
	}
	if n := d.Counters()["starved_writes"]; n != 1 {
		t.Fatalf("starved_writes = %d, want 1", n)
	}

	// Another process's starved write: this process's ordinary writes
	// yield to it (and, nobody withdrawing it, run out and mark it
	// stuck); a starved write of this process does not.
	if err := other.starve(); err != nil {
		t.Fatal(err)
	}
	g.yield(ctx, true)
	if g.starvedStuckUntil.Load() != 0 {
		t.Fatal("a starved write yielded to another starved write")
	}
	g.yield(ctx, false)
	if g.starvedStuckUntil.Load() == 0 {
		t.Fatal("an ordinary write did not yield to another process's starved write")
	}
	if g.stuckUntil.Load() != 0 {
		t.Fatal("a starved write that is not withdrawn stopped yields to heartbeats too")
	}
	if err := other.unstarve(); err != nil {
		t.Fatal(err)
	}
	g.yield(ctx, false)
	if g.starvedStuckUntil.Load() != 0 {
		t.Fatal("stuck not cleared once the starved mark was gone")
	}
}
