package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"sync"
)

// stmts holds the hot path's statements prepared once on the write handle.
// SQLite compiles a statement's text on every unprepared call, and for
// the claim, insert and complete statements that compilation was about a
// quarter of the CPU of a busy queue, all of it on the one writer's turn.
// A statement prepared on the handle is compiled once per connection and
// reused (database/sql prepares it again by itself on a connection that
// has not seen it, and Tx.StmtContext reuses the connection's copy inside
// a transaction).
type stmts struct {
	mu sync.Mutex
	db *sql.DB
	m  map[string]*sql.Stmt // by query text
}

// get returns query prepared, preparing it on first use.
func (s *stmts) get(ctx context.Context, query string) (*sql.Stmt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.m[query]; st != nil {
		return st, nil
	}
	st, err := s.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if s.m == nil {
		s.m = map[string]*sql.Stmt{}
	}
	s.m[query] = st
	return st, nil
}

// close closes every prepared statement (on a borrowed handle the
// application keeps using the connections).
func (s *stmts) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, st := range s.m {
		errs = append(errs, st.Close())
	}
	s.m = nil
	return errors.Join(errs...)
}

// prepared returns query, one of the driver's queries, prepared on the
// write handle.
func (d *Driver) prepared(ctx context.Context, query string) (*sql.Stmt, error) {
	return d.stmts.get(ctx, query)
}
