// Package seam lets conveyor's own tools (the command, the bench, the
// torture suite and tests) reach what a public Client does not offer
// applications, without methods on the Client: the driver under it, and
// through it destructive calls such as dropping every table.
package seam

import (
	"context"

	"github.com/conveyorq/conveyor/internal/driver"
)

// DriverOf returns the driver under a *conveyor.Client; package conveyor
// sets it when it is initialised.
var DriverOf func(client any) driver.Driver

// DropTables drops every conveyor table under the client's prefix, with
// every job in it.
func DropTables(ctx context.Context, client any) error {
	return DriverOf(client).DropAll(ctx)
}
