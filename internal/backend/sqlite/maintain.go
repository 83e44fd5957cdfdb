package sqlite

import "context"

// Maintain does nothing: the jobs stay in one table, which needs no
// upkeep beyond Prune and the database's own.
func (d *Driver) Maintain(context.Context) (map[string]int, error) { return nil, nil }
