package mysql

import (
	"context"
	"errors"

	"github.com/conveyorq/conveyor/internal/driver"
)

var errLimitsTODO = errors.New("conveyor/mysql: queue limits are not implemented yet")

// ClaimLimited claims a queue's jobs within its limits.
func (d *Driver) ClaimLimited(ctx context.Context, p driver.ClaimParams) (driver.ClaimResult, error) {
	return driver.ClaimResult{}, errLimitsTODO
}

// SetQueueLimits stores a queue's limits.
func (d *Driver) SetQueueLimits(ctx context.Context, queue string, l driver.QueueLimits) error {
	return errLimitsTODO
}

// QueueLimits returns the limits of every limited queue.
func (d *Driver) QueueLimits(ctx context.Context) (map[string]driver.QueueLimits, error) {
	return nil, errLimitsTODO
}

// LimitUsage returns every limited queue's limits and their use.
func (d *Driver) LimitUsage(ctx context.Context) (map[string]driver.LimitUsage, error) {
	return nil, errLimitsTODO
}
