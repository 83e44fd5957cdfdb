// Package seam lets conveyor's own tools (the command, the bench, the
// torture suite, package conveyortest and tests) reach what a public
// Client does not offer applications, without methods on the Client: the
// driver under it, and through it destructive calls such as dropping
// every table; running one job synchronously.
package seam

import (
	"context"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/engine"
)

// DriverOf returns the driver under a *conveyor.Client; package conveyor
// sets it when it is initialised.
var DriverOf func(client any) driver.Driver

// WorkOne claims job id on a *conveyor.Client and runs it through the
// client's registered worker in the calling goroutine, writing its
// outcome before it returns (engine.Engine.WorkOne); package conveyor
// sets it when it is initialised.
var WorkOne func(ctx context.Context, client any, id int64) (*engine.Worked, error)

// DropTables drops every conveyor table under the client's prefix, with
// every job in it.
func DropTables(ctx context.Context, client any) error {
	return DriverOf(client).DropAll(ctx)
}
