package web

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/conveyorq/conveyor"
)

// limitsJSON are a queue's flow limits (conveyor.QueueLimits), as the
// API answers them and as PUT /api/v1/queues/{queue}/limits takes them.
type limitsJSON struct {
	// MaxRunning is the most jobs of the queue running at once across
	// every process; 0 for no limit.
	MaxRunning int `json:"max_running"`
	// Rate is the most jobs started per RatePeriod; 0 for no limit.
	Rate int `json:"rate"`
	// RatePeriod is Rate's window as a Go duration ("1m", "500ms"); ""
	// without a Rate.
	RatePeriod string `json:"rate_period"`
	// RatePeriodMS is RatePeriod in milliseconds; 0 without a Rate.
	RatePeriodMS int64 `json:"rate_period_ms"`
	// KeyMaxRunning is the most jobs with the same key running at once
	// across every process; 0 for no limit per key. 1 when Ordered.
	KeyMaxRunning int `json:"key_max_running"`
	// Ordered runs each key's jobs one at a time in enqueue order.
	Ordered bool `json:"ordered"`
	// OrderedMoveOn, with Ordered, lets a key's next job start while a
	// failed job of the key waits for its retry.
	OrderedMoveOn bool `json:"ordered_move_on"`
	// KeyRate is the most jobs with the same key started per
	// KeyRatePeriod; 0 for no rate per key.
	KeyRate int `json:"key_rate"`
	// KeyRatePeriod is KeyRate's window as a Go duration ("1h"); ""
	// without a KeyRate.
	KeyRatePeriod string `json:"key_rate_period"`
	// KeyRatePeriodMS is KeyRatePeriod in milliseconds; 0 without a
	// KeyRate.
	KeyRatePeriodMS int64 `json:"key_rate_period_ms"`
	// Fair serves the queue's keys in turns, each taking up to its
	// weight (PUT /api/v1/queues/{queue}/weights) of a claim per turn.
	Fair bool `json:"fair"`
}

// limitUseJSON is how much of a queue's limits is in use
// (conveyor.LimitUse).
type limitUseJSON struct {
	// Running is how many jobs hold the queue's concurrency slots.
	Running int `json:"running"`
	// Started is how many jobs started within the last rate period.
	Started int `json:"started"`
	// NextStartMS, when Started has reached the rate, is how long until
	// the window has room again; 0 otherwise.
	NextStartMS int64 `json:"next_start_ms"`
	// KeysRunning is how many keys hold at least one of their slots
	// (key_max_running, ordered); 0 without key limits.
	KeysRunning int `json:"keys_running"`
	// KeyHeld is how many due available jobs wait because their key has
	// no slot free for them; 0 without key limits.
	KeyHeld int64 `json:"key_held"`
	// KeysRated is how many keys have used their whole key_rate in its
	// window; 0 without a rate per key.
	KeysRated int `json:"keys_rated"`
}

// limitsRequest is the body of PUT /api/v1/queues/{queue}/limits. Every
// field is optional; one left out is no limit (PUT replaces the queue's
// limits whole).
type limitsRequest struct {
	MaxRunning int `json:"max_running"`
	Rate       int `json:"rate"`
	// RatePeriod is a Go duration string ("1m", "1h30m", "250ms").
	RatePeriod *string `json:"rate_period"`
	// RatePeriodMS is the period in milliseconds, instead of RatePeriod
	// (or with it, when both say the same).
	RatePeriodMS *int64 `json:"rate_period_ms"`
	// KeyMaxRunning is the most jobs with the same key running at once,
	// 0 to 100000 (0 or 1 with Ordered).
	KeyMaxRunning int  `json:"key_max_running"`
	Ordered       bool `json:"ordered"`
	// OrderedMoveOn needs Ordered.
	OrderedMoveOn bool `json:"ordered_move_on"`
	// KeyRate is the most jobs with the same key started per
	// KeyRatePeriod, 0 to 100000.
	KeyRate int `json:"key_rate"`
	// KeyRatePeriod is a Go duration string, as RatePeriod.
	KeyRatePeriod *string `json:"key_rate_period"`
	// KeyRatePeriodMS is the period in milliseconds, instead of
	// KeyRatePeriod (or with it, when both say the same).
	KeyRatePeriodMS *int64 `json:"key_rate_period_ms"`
	// Fair serves the queue's keys in turns, by their weights.
	Fair bool `json:"fair"`
}

// limits converts the request, refusing a period that is not a
// duration, naming the field; the range checks are the client's
// (conveyor.ErrInvalidOpts).
func (in limitsRequest) limits() (conveyor.QueueLimits, error) {
	l := conveyor.QueueLimits{MaxRunning: in.MaxRunning, Rate: in.Rate,
		KeyMaxRunning: in.KeyMaxRunning, Ordered: in.Ordered, OrderedMoveOn: in.OrderedMoveOn, KeyRate: in.KeyRate, Fair: in.Fair}
	var err error
	if l.RatePeriod, err = period("rate_period", in.RatePeriod, in.RatePeriodMS); err != nil {
		return l, err
	}
	if l.KeyRatePeriod, err = period("key_rate_period", in.KeyRatePeriod, in.KeyRatePeriodMS); err != nil {
		return l, err
	}
	return l, nil
}

// period reads a rate's window given as a duration string (field name),
// in milliseconds (name_ms), or both when they say the same; 0 when
// neither is given.
func period(name string, s *string, ms *int64) (time.Duration, error) {
	var d time.Duration
	if s != nil && *s != "" {
		var err error
		if d, err = time.ParseDuration(*s); err != nil {
			return 0, fmt.Errorf("%s %q is not a duration: write it as Go does, such as 1m, 30s or 250ms", name, *s)
		}
	}
	if ms != nil {
		if *ms < 0 || *ms > int64(maxRatePeriodMS) {
			return 0, fmt.Errorf("%s_ms %d: must be 1 to %d", name, *ms, maxRatePeriodMS)
		}
		m := time.Duration(*ms) * time.Millisecond
		if s != nil && *s != "" && m != d {
			return 0, fmt.Errorf("%s %q and %s_ms %d differ: send one", name, *s, name, *ms)
		}
		d = m
	}
	return d, nil
}

// maxRatePeriodMS bounds rate_period_ms before it is converted (the
// client refuses a period over 30 days; a larger number would wrap
// around).
const maxRatePeriodMS = 30 * 24 * 3600 * 1000

// toLimitsJSON converts limits; nil for none.
func toLimitsJSON(l *conveyor.QueueLimits) *limitsJSON {
	if l == nil || l.IsZero() {
		return nil
	}
	out := &limitsJSON{MaxRunning: l.MaxRunning, Rate: l.Rate,
		KeyMaxRunning: l.KeyMaxRunning, Ordered: l.Ordered, OrderedMoveOn: l.OrderedMoveOn, Fair: l.Fair}
	if l.Ordered {
		out.KeyMaxRunning = 1 // what Ordered implies, whether stored or not
	}
	if l.Rate > 0 {
		out.RatePeriod = shortDuration(l.RatePeriod)
		out.RatePeriodMS = l.RatePeriod.Milliseconds()
	}
	if l.KeyRate > 0 {
		out.KeyRate = l.KeyRate
		out.KeyRatePeriod = shortDuration(l.KeyRatePeriod)
		out.KeyRatePeriodMS = l.KeyRatePeriod.Milliseconds()
	}
	return out
}

func toLimitUseJSON(u *conveyor.LimitUse) *limitUseJSON {
	if u == nil {
		return nil
	}
	return &limitUseJSON{Running: u.Running, Started: u.Started, NextStartMS: u.NextStart.Milliseconds(),
		KeysRunning: u.KeysRunning, KeyHeld: u.KeyHeld, KeysRated: u.KeysRated}
}

// shortDuration is d as time.ParseDuration reads it, without the zero
// units time.Duration.String leaves: "1m", "1h", "1h30m", "250ms".
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

// queueLimitsJSON is the answer of the limits endpoints: the queue and
// its limits, null when it has none.
type queueLimitsJSON struct {
	Queue  string      `json:"queue"`
	Limits *limitsJSON `json:"limits"`
}

// queueLimits reads queue's limits; nil when it has none.
func (h *Handler) queueLimits(r *http.Request, queue string) (*conveyor.QueueLimits, error) {
	if err := checkQueueName(queue); err != nil {
		return nil, err
	}
	all, err := h.c.QueueLimits(r.Context())
	if err != nil {
		return nil, err
	}
	if l, ok := all[queue]; ok && !l.IsZero() {
		return &l, nil
	}
	return nil, nil
}

// setLimits sets queue's limits (the zero value clears them) and makes
// the next reading of the counts fresh.
func (h *Handler) setLimits(r *http.Request, queue string, l conveyor.QueueLimits) error {
	err := h.c.SetQueueLimits(r.Context(), queue, l)
	h.stats.invalidate()
	return err
}

func (h *Handler) apiGetLimits(w http.ResponseWriter, r *http.Request, _ principal) {
	q := r.PathValue("queue")
	l, err := h.queueLimits(r, q)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, queueLimitsJSON{Queue: q, Limits: toLimitsJSON(l)})
}

func (h *Handler) apiPutLimits(w http.ResponseWriter, r *http.Request, _ principal) {
	q := r.PathValue("queue")
	var in limitsRequest
	if !h.decode(w, r, &in) {
		return
	}
	l, err := in.limits()
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := h.setLimits(r, q, l); err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, queueLimitsJSON{Queue: q, Limits: toLimitsJSON(&l)})
}

func (h *Handler) apiDeleteLimits(w http.ResponseWriter, r *http.Request, _ principal) {
	q := r.PathValue("queue")
	if err := h.setLimits(r, q, conveyor.QueueLimits{}); err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, queueLimitsJSON{Queue: q})
}

// keyWeightsJSON is the answer of the key weights endpoints, and the
// body of PUT /api/v1/queues/{queue}/weights (Queue is then left out).
type keyWeightsJSON struct {
	Queue string `json:"queue,omitempty"`
	// KeyWeights maps a key to its weight, 1 to conveyor.MaxKeyWeight;
	// a key left out weighs 1. {} when the queue has none.
	KeyWeights map[string]int `json:"key_weights"`
}

func (h *Handler) apiGetWeights(w http.ResponseWriter, r *http.Request, _ principal) {
	q := r.PathValue("queue")
	if err := checkQueueName(q); err != nil {
		h.fail(w, r, err)
		return
	}
	all, err := h.c.KeyWeights(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toKeyWeightsJSON(q, all[q]))
}

func (h *Handler) apiPutWeights(w http.ResponseWriter, r *http.Request, _ principal) {
	q := r.PathValue("queue")
	var in keyWeightsJSON
	if !h.decode(w, r, &in) {
		return
	}
	if in.Queue != "" && in.Queue != q {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("queue %q in the body is not the queue of the path, %q: leave it out", in.Queue, q))
		return
	}
	if in.KeyWeights == nil {
		writeError(w, http.StatusBadRequest, `key_weights: give the keys' weights, such as {"key_weights": {"acme": 3}} ({} or DELETE removes them)`)
		return
	}
	h.setWeights(w, r, q, in.KeyWeights)
}

func (h *Handler) apiDeleteWeights(w http.ResponseWriter, r *http.Request, _ principal) {
	h.setWeights(w, r, r.PathValue("queue"), nil)
}

// setWeights replaces queue's key weights (nil removes them) and answers
// them.
func (h *Handler) setWeights(w http.ResponseWriter, r *http.Request, queue string, weights map[string]int) {
	if err := h.c.SetKeyWeights(r.Context(), queue, weights); err != nil {
		h.fail(w, r, err)
		return
	}
	h.stats.invalidate()
	writeJSON(w, http.StatusOK, toKeyWeightsJSON(queue, weights))
}

func toKeyWeightsJSON(queue string, w map[string]int) keyWeightsJSON {
	if w == nil {
		w = map[string]int{}
	}
	return keyWeightsJSON{Queue: queue, KeyWeights: w}
}
