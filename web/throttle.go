package web

import (
	"context"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync"
	"time"
)

// Bounds of the failed-login throttle.
const (
	// freeFailures are the failures an address may make before it waits.
	freeFailures = 5
	// firstBlock is the wait after the first failure beyond freeFailures;
	// each further failure doubles it, up to maxBlock.
	firstBlock, maxBlock = time.Second, 5 * time.Minute
	// forgetAfter is how long after its last failure an address starts
	// afresh.
	forgetAfter = 15 * time.Minute
	// maxThrottled bounds the addresses remembered; beyond it, new
	// addresses share one entry (see loginThrottle).
	maxThrottled = 10000
	// failLogBurst and failLogEvery bound the warnings about failed
	// logins: a burst of failLogBurst lines, then one per failLogEvery.
	failLogBurst, failLogEvery = 20, time.Second
	// maxLoggedName caps the user name written to the log.
	maxLoggedName = 64
)

// loginThrottle slows down credential guessing. Failed logins (a wrong
// bearer token, basic-auth user or password, or login form) are counted
// per client address (an IPv6 address by its /64, which one host usually
// holds whole): the first freeFailures are free, then each failure makes
// the address wait firstBlock, doubling up to maxBlock. While it waits,
// every request of that address that carries credentials is answered 429
// with Retry-After, without looking at them, so that a correct guess
// cannot be told from a wrong one; the counts fall back to zero
// forgetAfter after the last failure. A success does not reset the count
// (a valid read-only credential would otherwise let its holder guess the
// admin's at full speed). At most maxThrottled addresses are remembered:
// when the table is full, the addresses not in it share one overflow
// entry, so that many addresses slow each other down rather than escape.
//
// Each failure is logged at Warn (address, method, user name, never the
// secret), at most failLogBurst lines at once and then one per
// failLogEvery; the next line logged says how many were left out.
type loginThrottle struct {
	mu       sync.Mutex
	now      func() time.Time
	max      int
	addrs    map[string]*failures
	overflow failures
	swept    time.Time

	logTokens  float64
	logAt      time.Time
	suppressed int
}

// failures are one address's recent failed logins.
type failures struct {
	n     int
	last  time.Time // the last failure
	until time.Time // no credential is looked at before then
}

func newLoginThrottle() *loginThrottle {
	return &loginThrottle{now: time.Now, max: maxThrottled, addrs: map[string]*failures{}, logTokens: failLogBurst}
}

// throttleKey is the address a remote address is counted under: the IP,
// or for IPv6 its /64.
func throttleKey(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if ip4 := ip.To4(); ip4 != nil {
		return ip4.String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// entry returns the failures of key, or nil when it has none. Call with
// mu held.
func (t *loginThrottle) entry(key string) *failures {
	if f, ok := t.addrs[key]; ok {
		return f
	}
	if len(t.addrs) >= t.max {
		return &t.overflow
	}
	return nil
}

// wait returns how long the address must wait before its credentials are
// looked at again; 0 when they may be now.
func (t *loginThrottle) wait(remoteAddr string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.entry(throttleKey(remoteAddr))
	if f == nil {
		return 0
	}
	return max(0, f.until.Sub(t.now()))
}

// fail records a failed login of remoteAddr and logs it. method says
// which credential failed ("bearer", "basic", "login form"), user is the
// user name given (empty for a token).
func (t *loginThrottle) fail(ctx context.Context, log *slog.Logger, remoteAddr, method, user string) {
	now := t.now()
	key := throttleKey(remoteAddr)
	t.mu.Lock()
	f, ok := t.addrs[key]
	if !ok {
		if len(t.addrs) >= t.max && now.Sub(t.swept) > time.Minute {
			t.sweep(now)
		}
		if len(t.addrs) < t.max {
			f = &failures{}
			t.addrs[key] = f
		} else {
			f = &t.overflow
		}
	}
	if now.Sub(f.last) > forgetAfter {
		f.n = 0
	}
	f.n++
	f.last = now
	var block time.Duration
	if over := f.n - freeFailures; over > 0 {
		block = maxBlock
		if over <= 20 {
			block = min(maxBlock, firstBlock<<(over-1))
		}
		f.until = now.Add(block)
	}
	n := f.n
	logIt, suppressed := t.mayLog(now)
	t.mu.Unlock()
	if !logIt {
		return
	}
	attrs := []slog.Attr{slog.String("remote", remoteAddr), slog.String("method", method)}
	if user != "" {
		attrs = append(attrs, slog.String("user", loggedName(user)))
	}
	attrs = append(attrs, slog.Int("failures", n))
	if block > 0 {
		attrs = append(attrs, slog.Duration("blocked_for", block))
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("not_logged_before", suppressed))
	}
	log.LogAttrs(ctx, slog.LevelWarn, "conveyor web: failed login", attrs...)
}

// mayLog takes a token of the log's bucket: whether to log this failure,
// and how many were left out since the last line. Call with mu held.
func (t *loginThrottle) mayLog(now time.Time) (bool, int) {
	if !t.logAt.IsZero() {
		t.logTokens = math.Min(failLogBurst, t.logTokens+float64(now.Sub(t.logAt))/float64(failLogEvery))
	}
	t.logAt = now
	if t.logTokens < 1 {
		t.suppressed++
		return false, 0
	}
	t.logTokens--
	s := t.suppressed
	t.suppressed = 0
	return true, s
}

// sweep forgets the addresses that wait no more and failed longer than
// forgetAfter ago; it runs when a new address fails while the table is
// full, at most once a minute. Call with mu held.
func (t *loginThrottle) sweep(now time.Time) {
	t.swept = now
	for k, f := range t.addrs {
		if now.Sub(f.last) > forgetAfter && !now.Before(f.until) {
			delete(t.addrs, k)
		}
	}
}

// loggedName is a user name as logged: valid UTF-8, at most
// maxLoggedName bytes.
func loggedName(s string) string {
	if len(s) > maxLoggedName {
		s = s[:maxLoggedName] + "..."
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// retryAfter is the Retry-After value for a wait: whole seconds, at
// least 1.
func retryAfter(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}
