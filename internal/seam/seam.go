// Package seam is the bridge from package conveyor to the packages that
// reach what a public Client does not offer applications, without
// methods on the Client: package lab (the hooks of conveyor's tests and
// of the command's bench and torture suite) and package conveyortest
// (running one job synchronously), and the library's own tests that must
// not link every backend through lab. Package conveyor fills its
// variables when it is initialised.
package seam

import (
	"context"

	"github.com/conveyorq/conveyor/internal/driver"
	"github.com/conveyorq/conveyor/internal/engine"
)

// DriverOf returns the driver under a *conveyor.Client; package conveyor
// sets it when it is initialised.
var DriverOf func(client any) driver.Driver

// EngineOf returns the engine of a *conveyor.Client; package conveyor
// sets it when it is initialised.
var EngineOf func(client any) *engine.Engine

// WorkOne claims job id on a *conveyor.Client and runs it through the
// client's registered worker in the calling goroutine, writing its
// outcome before it returns (engine.Engine.WorkOne); package conveyor
// sets it when it is initialised.
var WorkOne func(ctx context.Context, client any, id int64) (*engine.Worked, error)

// DropTables drops every conveyor table under the client's prefix, with
// every job in it: lab.DropTables, for the library's own tests that must
// not link every backend through package lab (an application's example
// on one driver checks what it links).
func DropTables(ctx context.Context, client any) error {
	return DriverOf(client).DropAll(ctx)
}
