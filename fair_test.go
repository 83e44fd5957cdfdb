package conveyor_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// startOrder returns the executions in the order they started.
func startOrder(xs []execution) []execution {
	xs = slices.Clone(xs)
	slices.SortFunc(xs, func(a, b execution) int { return a.start.Compare(b.start) })
	return xs
}

// A fair queue serves its keys in turns across processes and protocols:
// one key's 150 jobs, enqueued first, do not delay 10 small keys, whose 30
// jobs all start among the first 80 starts (by arrival they would start
// after the 150), with two in-process clients and an HTTP worker (11
// workers) claiming; every job runs once.
func TestFairFloodAcrossClients(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		r := newLimitRig(t, dsn, conveyor.QueueLimits{Fair: true}, 5*time.Millisecond)
		var keys []string
		for i := 0; i < 150; i++ {
			keys = append(keys, "flood")
		}
		for i := 0; i < 3; i++ {
			for _, k := range []string{"s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9"} {
				keys = append(keys, k)
			}
		}
		ids, keyOf := r.enqueueKeyed(keys)
		r.start()
		xs := startOrder(r.waitAll(ids, 2*time.Minute))
		last := -1
		for i, x := range xs {
			if keyOf[x.id] != "flood" {
				last = i
			}
		}
		if last >= 80 {
			var b strings.Builder
			for _, x := range xs[:last+1] {
				b.WriteString(keyOf[x.id] + " ")
			}
			t.Fatalf("the small keys' last job was start %d of %d; want within the first 80 (the flood takes one turn among 11 keys). Order: %s", last+1, len(xs), b.String())
		}
		t.Logf("the small keys' last job was start %d of %d", last+1, len(xs))
	})
}

// Key weights hold across processes and protocols, whatever the size of
// each process's claims: of two deep keys weighed 3 and 1, in the first
// 60 starts the heavier key starts 2 to 6 times as many jobs (3 as set;
// each process's rotation is its own, so each may be part way through a
// turn), and the lighter one is not starved.
func TestFairWeightsAcrossClients(t *testing.T) {
	forEachBackend(t, func(t *testing.T, dsn string) {
		r := newLimitRig(t, dsn, conveyor.QueueLimits{Fair: true}, 5*time.Millisecond)
		if err := r.a.SetKeyWeights(context.Background(), r.queue, map[string]int{"vip": 3}); err != nil {
			t.Fatal(err)
		}
		var keys []string
		for i := 0; i < 60; i++ {
			keys = append(keys, "std", "vip")
		}
		ids, keyOf := r.enqueueKeyed(keys)
		r.start()
		xs := startOrder(r.waitAll(ids, 2*time.Minute))
		by := map[string]int{}
		for _, x := range xs[:60] {
			by[keyOf[x.id]]++
		}
		if by["std"] < 5 || by["vip"] < 2*by["std"] || by["vip"] > 6*by["std"] {
			t.Fatalf("first 60 starts: %v; want vip 2 to 6 times std (weights 3 and 1), std at least 5", by)
		}
		t.Logf("first 60 starts: %v", by)
		w, err := r.b.KeyWeights(context.Background())
		if err != nil || w[r.queue]["vip"] != 3 || len(w[r.queue]) != 1 {
			t.Fatalf("key weights read by another client: %v, %v", w, err)
		}
	})
}

// Key weights are checked before anything is stored, the error naming
// the bad key or weight.
func TestKeyWeightsInput(t *testing.T) {
	c := openDropped(t, backends[0].dsn(t), fast(testdb.Prefix()))
	ctx := context.Background()
	many := map[string]int{}
	for i := 0; i <= conveyor.MaxKeyWeights; i++ {
		many[strings.Repeat("k", 1+i%200)+string(rune('a'+i%26))+string(rune('a'+i/26%26))] = 1
	}
	for _, tc := range []struct {
		w    map[string]int
		want string
	}{
		{map[string]int{"a": 0}, `weight 0 of key "a"`},
		{map[string]int{"a": conveyor.MaxKeyWeight + 1}, "out of range"},
		{map[string]int{"": 2}, "empty key"},
		{map[string]int{"a\x00b": 2}, "NUL"},
		{map[string]int{strings.Repeat("x", conveyor.MaxKeyBytes+1): 2}, "bytes"},
		{many, "keys weighed"},
	} {
		err := c.SetKeyWeights(ctx, "q", tc.w)
		if !errors.Is(err, conveyor.ErrInvalidOpts) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("weights with %q: %v; want ErrInvalidOpts naming %q", tc.want, err, tc.want)
		}
	}
	if err := c.SetKeyWeights(ctx, "bad queue", map[string]int{"a": 2}); err == nil || !strings.Contains(err.Error(), "bad queue") {
		t.Fatalf("bad queue name: %v", err)
	}
	if w, err := c.KeyWeights(ctx); err != nil || len(w) != 0 {
		t.Fatalf("weights after refused calls: %v, %v; want none stored", w, err)
	}
}
