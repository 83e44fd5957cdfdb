package sqlite

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/driver"
)

const helperEnv = "CONVEYOR_SQLITE_HELPER_DB"

// TestHelperWorker is not a test: it is the child process of
// TestMultiProcess. It claims and completes jobs of queue "mp" until the
// queue stays empty, inserting a few jobs of its own on the way, and
// prints every id it completed.
func TestHelperWorker(t *testing.T) {
	path := os.Getenv(helperEnv)
	if path == "" {
		t.Skip("helper process for TestMultiProcess")
	}
	if err := worker(path, os.Getenv("CONVEYOR_SQLITE_HELPER_NAME"), func(id int64) { fmt.Println("done", id) }); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// worker drains queue "mp" of the database at path with its own Driver.
func worker(path, name string, done func(int64)) error {
	ctx := context.Background()
	d, err := Open(ctx, path, driver.Options{Prefix: "mp_"})
	if err != nil {
		return err
	}
	defer d.Close()
	if _, err := d.Migrate(ctx); err != nil {
		return err
	}
	empty := 0
	for i := 0; empty < 20; i++ {
		if i%10 == 0 && i < 200 {
			extra := make([]driver.InsertParams, 10)
			for k := range extra {
				extra[k] = driver.InsertParams{Queue: "mp", Kind: name, Args: json.RawMessage(`{}`), MaxAttempts: 3}
			}
			if _, err := d.Insert(ctx, extra); err != nil {
				return err
			}
		}
		rows, err := d.Claim(ctx, driver.ClaimParams{Queue: "mp", Limit: 50, Lease: time.Minute, Worker: name})
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			empty++
			time.Sleep(5 * time.Millisecond)
			continue
		}
		empty = 0
		out := make([]driver.Outcome, len(rows))
		leases := make([]driver.Lease, len(rows))
		for k, r := range rows {
			out[k] = driver.Outcome{ID: r.ID, Fence: r.Fence, Attempt: r.Attempt, State: driver.StateCompleted}
			leases[k] = driver.Lease{ID: r.ID, Fence: r.Fence}
		}
		if owned, err := d.Heartbeat(ctx, leases, time.Minute); err != nil || len(owned) != len(rows) {
			return fmt.Errorf("heartbeat: %d of %d owned, %v", len(owned), len(rows), err)
		}
		applied, err := d.Complete(ctx, out)
		if err != nil {
			return err
		}
		if len(applied) != len(out) {
			return fmt.Errorf("%d of %d outcomes applied", len(applied), len(out))
		}
		for _, id := range applied {
			done(id)
		}
		if _, err := d.TryLead(ctx, name, time.Second); err != nil {
			return err
		}
	}
	return nil
}

// TestMultiProcess runs three child processes and this one against one
// file: all write concurrently, nobody sees "database is locked", and
// every job is completed exactly once. Under -short (the test command)
// it drains fewer jobs: the processes still write side by side all along,
// for a few seconds instead of tens under -race.
func TestMultiProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mp.db")
	ctx := context.Background()
	d := openT(t, path, "mp_")
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	n := 20000
	switch {
	case testing.Short():
		n = 1000
	case raceEnabled:
		n = 4000
	}
	in := make([]driver.InsertParams, n)
	for i := range in {
		in[i] = driver.InsertParams{Queue: "mp", Kind: "parent", Args: json.RawMessage(`{}`), MaxAttempts: 3}
	}
	if _, err := d.BulkInsert(ctx, in); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	seen := map[int64]int{}
	record := func(id int64) {
		mu.Lock()
		seen[id]++
		mu.Unlock()
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for c := 0; c < 3; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWorker$", "-test.count=1")
			cmd.Env = append(os.Environ(), helperEnv+"="+path, "CONVEYOR_SQLITE_HELPER_NAME=child"+strconv.Itoa(c))
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				errs <- err
				return
			}
			if err := cmd.Start(); err != nil {
				errs <- err
				return
			}
			sc := bufio.NewScanner(out)
			var other []string
			for sc.Scan() {
				if id, ok := strings.CutPrefix(sc.Text(), "done "); ok {
					v, _ := strconv.ParseInt(id, 10, 64)
					record(v)
				} else {
					other = append(other, sc.Text())
				}
			}
			if err := cmd.Wait(); err != nil {
				errs <- fmt.Errorf("child %d: %v: %s", c, err, strings.Join(other, "\n"))
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := worker(path, "parent", record); err != nil {
			errs <- fmt.Errorf("parent: %v", err)
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	var total int
	if err := d.DB().QueryRow(`SELECT count(*) FROM mp_jobs`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if len(seen) != total || total < n {
		t.Fatalf("completed %d distinct jobs of %d", len(seen), total)
	}
	for id, c := range seen {
		if c != 1 {
			t.Fatalf("job %d completed %d times", id, c)
		}
	}
	st, _ := d.Stats(ctx)
	if len(st) != 1 || st[0].Counts[driver.StateCompleted] != int64(total) {
		t.Fatalf("stats after drain: %+v", st)
	}
	t.Logf("4 processes drained %d jobs in %v", total, time.Since(start).Round(time.Millisecond))
}
