package torture

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/conveyorq/conveyor/internal/testdb"
)

// fakePatroni is a Patroni REST API on loopback for one node name per
// member, all answering at the same URL: GET /cluster lists a leader and,
// once syncAfter has passed, a streaming synchronous standby; POST
// /switchover makes the standby the leader.
type fakePatroni struct {
	mu        sync.Mutex
	leader    string
	standby   string
	syncAfter time.Time
	syncSeen  time.Time // when /cluster first reported the standby
	url       string
}

func (f *fakePatroni) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/cluster":
		ms := []patroniMember{{Name: f.leader, Role: "leader", State: "running", APIURL: f.url + "/patroni"}}
		if time.Now().After(f.syncAfter) {
			if f.syncSeen.IsZero() {
				f.syncSeen = time.Now()
			}
			ms = append(ms, patroniMember{Name: f.standby, Role: "sync_standby", State: "streaming", Lag: 0.0, APIURL: f.url + "/patroni"})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"members": ms})
	case r.Method == http.MethodPost && r.URL.Path == "/switchover":
		f.leader, f.standby = f.standby, f.leader
		f.syncAfter = time.Now().Add(time.Hour)
	default:
		http.NotFound(w, r)
	}
}

// The figures of a Patroni fault count from the fault itself, not from
// the start of the wait for a synchronous standby that precedes it.
func TestPatroniFaultTimedFromTheFault(t *testing.T) {
	dsn := testdb.Postgres(t) // writable: the "new primary"
	const syncWait = 600 * time.Millisecond
	f := &fakePatroni{leader: "a", standby: "b", syncAfter: time.Now().Add(syncWait)}
	srv := httptest.NewServer(f)
	defer srv.Close()
	f.url = srv.URL
	p := &phase{
		o:   &Options{Patroni: &PatroniCluster{REST: []string{srv.URL}}},
		dsn: dsn,
		sup: &supervisor{},
	}
	p.faultStart = time.Now() // as the phase sets it before inject
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := injectPatroni(ctx, p, EventSwitchover); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	seen := f.syncSeen
	f.mu.Unlock()
	if seen.IsZero() || p.faultStart.Before(seen) {
		t.Fatalf("fault timed from %v, before the cluster had a synchronous standby (%v) and the switchover was asked for",
			p.faultStart.Format(time.StampMicro), seen.Format(time.StampMicro))
	}
	if p.faultEnd.Before(p.faultStart) {
		t.Fatalf("fault ended (%v) before it began (%v)", p.faultEnd, p.faultStart)
	}
	if len(p.sup.events) != 1 || !p.sup.events[0].Start.Equal(p.faultStart) {
		t.Fatalf("events %+v, want one starting at the fault %v", p.sup.events, p.faultStart)
	}
}
