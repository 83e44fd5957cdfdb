package postgres

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/conveyorq/conveyor/internal/driver"
)

// errorsScanner decodes the errors column straight from the driver's
// buffer, skipping the common empty list without allocating.
type errorsScanner struct {
	dst *[]driver.AttemptError
}

// ScanBytes implements pgtype.BytesScanner.
func (s errorsScanner) ScanBytes(b []byte) error {
	*s.dst = nil
	if len(b) == 0 || string(b) == "[]" {
		return nil
	}
	return json.Unmarshal(b, s.dst)
}

// metaScanner reads the meta column (jsonb) as its JSON text; NULL, the
// common case, is nil without allocating.
type metaScanner struct {
	dst *json.RawMessage
}

// ScanBytes implements pgtype.BytesScanner.
func (s metaScanner) ScanBytes(b []byte) error {
	if b == nil {
		*s.dst = nil
		return nil
	}
	*s.dst = append(json.RawMessage(nil), b...)
	return nil
}

// keyScanner reads the lkey column: NULL, the common case, is "" without
// allocating.
type keyScanner struct {
	dst *string
}

// ScanBytes implements pgtype.BytesScanner.
func (s keyScanner) ScanBytes(b []byte) error {
	if b == nil {
		*s.dst = ""
		return nil
	}
	*s.dst = string(b)
	return nil
}

// interner returns a shared string for a byte slice it has seen before, so
// that scanning a batch of jobs of a few kinds does not allocate one string
// per row. It holds at most maxInterned strings.
type interner struct {
	mu sync.RWMutex
	m  map[string]string
}

const maxInterned = 4096

func newInterner() interner { return interner{m: make(map[string]string)} }

func (in *interner) get(b []byte) string {
	in.mu.RLock()
	s, ok := in.m[string(b)]
	in.mu.RUnlock()
	if ok {
		return s
	}
	s = string(b)
	in.mu.Lock()
	if len(in.m) < maxInterned {
		in.m[s] = s
	}
	in.mu.Unlock()
	return s
}

// internScanner scans a text column through an interner.
type internScanner struct {
	in  *interner
	dst *string
}

// ScanBytes implements pgtype.BytesScanner.
func (s internScanner) ScanBytes(b []byte) error {
	*s.dst = s.in.get(b)
	return nil
}

// timeOf returns the time of a nullable timestamp, or the zero time.
func timeOf(t pgtype.Timestamptz) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time
}

// scanJobs reads full job rows (the columns of seg_get_job) from rows and
// closes them.
func scanJobs(rows pgx.Rows) ([]*driver.JobRow, error) {
	defer rows.Close()
	var out []*driver.JobRow
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, j)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// scanJob reads one full job row.
func scanJob(row pgx.Row) (*driver.JobRow, error) {
	j := new(driver.JobRow)
	var (
		priority, attempt, maxAttempts int32
		attemptedAt, finalizedAt       pgtype.Timestamptz
		leaseExpiresAt                 pgtype.Timestamptz
		attemptedBy                    pgtype.Text
		args                           []byte
	)
	err := row.Scan(&j.ID, &j.Queue, &j.Kind, &args, &j.State, &priority, &attempt, &maxAttempts,
		&j.TimeoutMS, &j.ScheduledAt, &j.CreatedAt, &attemptedAt, &finalizedAt, &leaseExpiresAt,
		&attemptedBy, errorsScanner{&j.Errors}, &j.Fence, metaScanner{&j.Meta}, keyScanner{&j.Key})
	if err != nil {
		return nil, err
	}
	j.Args = args
	j.Priority, j.Attempt, j.MaxAttempts = int(priority), int(attempt), int(maxAttempts)
	j.AttemptedAt = timeOf(attemptedAt)
	j.FinalizedAt = timeOf(finalizedAt)
	j.LeaseExpiresAt = timeOf(leaseExpiresAt)
	j.AttemptedBy = attemptedBy.String
	return j, nil
}

// scanFunc is a row's Scan method as a pgx.Row.
type scanFunc func(dest ...any) error

// Scan implements pgx.Row.
func (f scanFunc) Scan(dest ...any) error { return f(dest...) }

// scanJobRow reads one full job row through scan, of the pgx stdlib
// driver (database/sql) when sqlTx is set, else of pgx.
func scanJobRow(scan func(dest ...any) error, sqlTx bool) (*driver.JobRow, error) {
	if !sqlTx {
		return scanJob(scanFunc(scan))
	}
	j := new(driver.JobRow)
	var (
		args, errs, meta                  []byte
		attemptedAt, finalizedAt, leaseAt sql.NullTime
		attemptedBy, key                  sql.NullString
	)
	err := scan(&j.ID, &j.Queue, &j.Kind, &args, &j.State, &j.Priority, &j.Attempt, &j.MaxAttempts,
		&j.TimeoutMS, &j.ScheduledAt, &j.CreatedAt, &attemptedAt, &finalizedAt, &leaseAt,
		&attemptedBy, &errs, &j.Fence, &meta, &key)
	if err != nil {
		return nil, err
	}
	j.Args = args
	if len(meta) > 0 {
		j.Meta = meta
	}
	j.AttemptedAt, j.FinalizedAt, j.LeaseExpiresAt = attemptedAt.Time, finalizedAt.Time, leaseAt.Time
	j.AttemptedBy = attemptedBy.String
	j.Key = key.String
	if len(errs) > 2 {
		if err := json.Unmarshal(errs, &j.Errors); err != nil {
			return nil, fmt.Errorf("job %d: decode errors: %w", j.ID, err)
		}
	}
	return j, nil
}
