package conveyor

import (
	"math/rand"
	"strings"
	"testing"
)

// validName is the byte loop that stands for nameRE and kindRE on every
// enqueue: it must accept exactly what they accept. Checked on names
// built from the edges of the rules (lengths 0, 1, 127, 128, 129; every
// byte value at the first and a later position; multi-byte runes) and on
// random names drawn from the allowed characters and a few others.
func TestValidNameAgreesWithTheRules(t *testing.T) {
	check := func(s string) {
		t.Helper()
		if got, want := validName(s, false), nameRE.MatchString(s); got != want {
			t.Fatalf("queue rule, %q: loop says %v, nameRE says %v", s, got, want)
		}
		if got, want := validName(s, true), kindRE.MatchString(s); got != want {
			t.Fatalf("kind rule, %q: loop says %v, kindRE says %v", s, got, want)
		}
	}
	for _, n := range []int{0, 1, 2, 127, 128, 129, 300} {
		check(strings.Repeat("a", n))
		check(strings.Repeat("_", n))
		if n > 0 {
			check("a" + strings.Repeat("/", n-1))
			check("9" + strings.Repeat("-", n-1))
		}
	}
	for c := 0; c < 256; c++ {
		b := string([]byte{byte(c)})
		check(b)
		check("a" + b)
		check("a" + b + "z")
		check(b + "a")
	}
	for _, s := range []string{"é", "aé", "a\n", "a\x00", "a b", "ü/x", "a/b:c.d-e_f", "\u212a", "a\u212a"} {
		check(s)
	}
	alphabet := "aZ09_.:-/ \n\x00é\xff*"
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 20000; i++ {
		var b strings.Builder
		n := rng.Intn(140)
		for j := 0; j < n; j++ {
			if rng.Intn(4) == 0 {
				b.WriteByte(alphabet[rng.Intn(len(alphabet))])
			} else {
				b.WriteByte("abcXYZ019_.:-/"[rng.Intn(14)])
			}
		}
		check(b.String())
	}
}
