package sqlite

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/conveyorq/conveyor/internal/driver"
)

// bufPool recycles the buffers batches are encoded into.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) > 4<<20 {
		return // do not keep huge buffers
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}

// appendJSONString appends s as a JSON string literal.
func appendJSONString(b []byte, s []byte) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

func appendJSONStr(b []byte, s string) []byte {
	// The conversion does not allocate when the compiler can prove the
	// slice does not escape; appendJSONString only reads it.
	return appendJSONString(b, []byte(s))
}

// checkInsert validates what the schema would reject with a less helpful
// message.
func checkInsert(i int, j *driver.InsertParams) error {
	if j.Queue == "" || utf8.RuneCountInString(j.Queue) > 128 {
		return fmt.Errorf("job %d: queue %q must have 1 to 128 characters", i, j.Queue)
	}
	if utf8.RuneCountInString(j.Kind) > 128 {
		return fmt.Errorf("job %d: kind %q is longer than 128 characters", i, j.Kind)
	}
	if len(j.Meta) > maxArgsBytes {
		return fmt.Errorf("job %d: metadata of %d bytes exceeds the SQLite backend's limit of %d", i, len(j.Meta), maxArgsBytes)
	}
	if len(j.Args) > maxArgsBytes {
		return fmt.Errorf("job %d: args of %d bytes exceed the SQLite backend's limit of %d", i, len(j.Args), maxArgsBytes)
	}
	if j.Key != "" {
		if len(j.Key) > driver.MaxKeyBytes || !utf8.ValidString(j.Key) || strings.IndexByte(j.Key, 0) >= 0 {
			return fmt.Errorf("job %d: limit key %q must be 1 to %d bytes of UTF-8 without NUL", i, j.Key, driver.MaxKeyBytes)
		}
	}
	return nil
}

// appendInsertRow appends one job as the JSON array the insert queries
// read: [queue, kind, args (as a string, so its bytes are kept exactly),
// priority, max_attempts, timeout_ms, run_at_us or null, delay_us, meta
// (as a string) or null, limit key or null]. A job without metadata and
// key ends at delay_us, one without a key at meta: the query reads a
// missing element as NULL, so it costs the hot path nothing.
func appendInsertRow(b []byte, j *driver.InsertParams) []byte {
	b = append(b, '[')
	b = appendJSONStr(b, j.Queue)
	b = append(b, ',')
	b = appendJSONStr(b, j.Kind)
	b = append(b, ',')
	if len(j.Args) == 0 {
		b = append(b, `"{}"`...)
	} else {
		b = appendJSONString(b, j.Args)
	}
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(j.Priority), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(j.MaxAttempts), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, j.TimeoutMS, 10)
	b = append(b, ',')
	if j.RunAt.IsZero() {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, j.RunAt.UnixMicro(), 10)
	}
	b = append(b, ',')
	b = strconv.AppendInt(b, us(j.Delay), 10)
	if len(j.Meta) > 0 {
		b = append(b, ',')
		b = appendJSONString(b, j.Meta)
	} else if j.Key != "" {
		b = append(b, ",null"...)
	}
	if j.Key != "" {
		b = append(b, ',')
		b = appendJSONStr(b, j.Key)
	}
	return append(b, ']')
}

// insertChunks encodes jobs into JSON arrays of at most insertChunkBytes
// (or maxRows rows, when maxRows > 0) and calls fn for each in order.
func insertChunks(jobs []driver.InsertParams, maxRows int, fn func(chunk string, rows int) error) error {
	bp := getBuf()
	defer putBuf(bp)
	b := (*bp)[:0]
	rows := 0
	flush := func() error {
		if rows == 0 {
			return nil
		}
		b = append(b, ']')
		err := fn(string(b), rows)
		b, rows = b[:0], 0
		return err
	}
	for i := range jobs {
		j := &jobs[i]
		if err := checkInsert(i, j); err != nil {
			return err
		}
		if rows > 0 && (len(b) >= insertChunkBytes || (maxRows > 0 && rows >= maxRows)) {
			if err := flush(); err != nil {
				return err
			}
		}
		if rows == 0 {
			b = append(b, '[')
		} else {
			b = append(b, ',')
		}
		b = appendInsertRow(b, j)
		rows++
	}
	err := flush()
	*bp = b
	return err
}

// encodeLeases encodes [[id, fence], ...].
func encodeLeases(b []byte, leases []driver.Lease) []byte {
	b = append(b, '[')
	for i, l := range leases {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = strconv.AppendInt(b, l.ID, 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, l.Fence, 10)
		b = append(b, ']')
	}
	return append(b, ']')
}

// encodeOutcomes encodes [[id, fence, state, retry_in_us, error or null], ...].
func encodeOutcomes(b []byte, outcomes []driver.Outcome) ([]byte, error) {
	b = append(b, '[')
	for i := range outcomes {
		o := &outcomes[i]
		switch o.State {
		case driver.StateCompleted, driver.StateRetryable, driver.StateDiscarded, driver.StateCancelled, driver.StateScheduled:
		default:
			return b, fmt.Errorf("outcome for job %d: invalid state %q (want completed, retryable, discarded, cancelled or scheduled)", o.ID, o.State)
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = strconv.AppendInt(b, o.ID, 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, o.Fence, 10)
		b = append(b, ",\""...)
		b = append(b, o.State...)
		b = append(b, "\","...)
		b = strconv.AppendInt(b, us(o.RetryIn), 10)
		b = append(b, ',')
		if o.Err == nil {
			b = append(b, "null"...)
		} else {
			e := *o.Err
			if e.Attempt == 0 {
				e.Attempt = o.Attempt
			}
			ej, err := json.Marshal(e)
			if err != nil {
				return b, fmt.Errorf("outcome for job %d: encoding error: %w", o.ID, err)
			}
			b = append(b, ej...)
		}
		b = append(b, ']')
	}
	return append(b, ']'), nil
}

// scanner is *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }

// scanJob reads the columns of the job_columns block.
func scanJob(s scanner) (*driver.JobRow, error) {
	var (
		j                                 driver.JobRow
		args, errs                        string
		scheduled, created                int64
		attemptedAt, finalizedAt, leaseAt sql.NullInt64
		attemptedBy                       sql.NullString
		meta                              []byte // NULL scans as nil, without allocating
		lkey                              sql.NullString
	)
	if err := s.Scan(&j.ID, &j.Queue, &j.Kind, &args, &j.State, &j.Priority, &j.Attempt,
		&j.MaxAttempts, &j.TimeoutMS, &scheduled, &created, &attemptedAt, &finalizedAt,
		&leaseAt, &attemptedBy, &errs, &j.Fence, &meta, &lkey); err != nil {
		return nil, err
	}
	if len(meta) > 0 {
		j.Meta = json.RawMessage(meta)
	}
	j.Args = json.RawMessage(args)
	j.ScheduledAt = fromUS(scheduled)
	j.CreatedAt = fromUS(created)
	if attemptedAt.Valid {
		j.AttemptedAt = fromUS(attemptedAt.Int64)
	}
	if finalizedAt.Valid {
		j.FinalizedAt = fromUS(finalizedAt.Int64)
	}
	if leaseAt.Valid {
		j.LeaseExpiresAt = fromUS(leaseAt.Int64)
	}
	j.AttemptedBy = attemptedBy.String
	j.Key = lkey.String
	if errs != "" && errs != "[]" {
		if err := json.Unmarshal([]byte(errs), &j.Errors); err != nil {
			return nil, fmt.Errorf("job %d: decoding errors column: %w", j.ID, err)
		}
	}
	return &j, nil
}

// fromUS converts unix microseconds to a UTC time.
func fromUS(v int64) time.Time { return time.UnixMicro(v).UTC() }

// hasResults reports whether an outcome of outcomes completes its job
// with a result.
func hasResults(outcomes []driver.Outcome) bool {
	for i := range outcomes {
		if outcomes[i].State == driver.StateCompleted && len(outcomes[i].Result) > 0 {
			return true
		}
	}
	return false
}

// encodeResults encodes [[id, fence, result], ...] for the outcomes that complete
// their job with a result and whose id is in applied; "" when none.
func encodeResults(outcomes []driver.Outcome, applied []int64) string {
	in := make(map[int64]bool, len(applied))
	for _, id := range applied {
		in[id] = true
	}
	var b []byte
	for i := range outcomes {
		o := &outcomes[i]
		if o.State != driver.StateCompleted || len(o.Result) == 0 || !in[o.ID] {
			continue
		}
		if b == nil {
			b = append(b, '[')
		} else {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = strconv.AppendInt(b, o.ID, 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, o.Fence, 10)
		b = append(b, ',')
		b = append(b, o.Result...)
		b = append(b, ']')
	}
	if b == nil {
		return ""
	}
	return string(append(b, ']'))
}
