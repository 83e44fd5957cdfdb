package bench

import (
	"strings"
	"testing"
)

// TestKeyShares: the starts counted are those up to the last claim of
// the key that ran out first; the ratio is the heaviest key's over the
// lightest's, and a ratio off the weights' by more than a third fails.
func TestKeyShares(t *testing.T) {
	got := sharesWhileAll(map[string][]int64{
		"heavy": {1, 1, 1, 2, 2, 2, 3, 3, 3},
		"light": {1, 2, 3, 4, 5, 6},
	})
	if got["heavy"] != 9 || got["light"] != 3 {
		t.Errorf("shares %v, want heavy 9, light 3", got)
	}
	w := map[string]int{"heavy": 3, "light": 1}
	if r := shareRatio(got, w); r != 3 {
		t.Errorf("ratio %.2f, want 3", r)
	}
	if r := shareRatio(map[string]int64{"heavy": 5}, w); r != 0 {
		t.Errorf("ratio without light starts %.2f, want 0", r)
	}
	for ratio, ok := range map[float64]bool{3: true, 2: true, 4: true, 1.9: false, 4.1: false, 0: false} {
		r := &Result{Workload: "keys", Phase: "fair-weights", KeyWeights: w, KeyShares: map[string]int64{"heavy": 1, "light": 1}, ShareRatio: ratio}
		if err := checkShares(r); (err == nil) != ok {
			t.Errorf("ratio %.2f: %v, want ok %v", ratio, err, ok)
		} else if err != nil && !strings.Contains(err.Error(), "keys/fair-weights") {
			t.Errorf("ratio %.2f: %v does not name the phase", ratio, err)
		}
	}
	if err := checkShares(&Result{}); err != nil {
		t.Errorf("a run without weights: %v", err)
	}
}
