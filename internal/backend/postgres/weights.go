package postgres

import (
	"context"
	"errors"
)

// SetKeyWeights is not stored by this backend yet.
func (d *Driver) SetKeyWeights(ctx context.Context, queue string, weights map[string]int) error {
	return errors.New("conveyor/postgres: key weights are not stored yet")
}

// KeyWeights is not stored by this backend yet.
func (d *Driver) KeyWeights(ctx context.Context) (map[string]map[string]int, error) {
	return nil, nil
}
