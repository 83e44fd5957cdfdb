package bench

import (
	"context"
	"errors"
	"fmt"
)

// sweep repeats o.Of (latency, drain or flow) for each worker count in
// o.Counts, each on fresh tables, and returns one result per count. A run
// with lost or duplicated jobs does not stop the sweep; its error is
// returned at the end with the others'.
func sweep(ctx context.Context, o Options) ([]*Result, error) {
	switch o.Of {
	case "latency", "drain", "flow":
	default:
		return nil, fmt.Errorf("bench: sweep of %q: want latency, drain or flow", o.Of)
	}
	var rs []*Result
	var errs []error
	for _, n := range o.Counts {
		if n < 1 {
			return rs, fmt.Errorf("bench: sweep: worker count %d: must be positive", n)
		}
		ro := o
		ro.Workload, ro.Workers = o.Of, n
		ro.label = fmt.Sprintf("sweep %s workers=%d", o.Of, n)
		ro.Emit = nil
		ro.defaults()
		r, err := Run(ctx, ro)
		if r == nil {
			return rs, errors.Join(append(errs, err)...)
		}
		r.Workload, r.Of = "sweep", o.Of
		o.emit(r)
		rs = append(rs, r)
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
	}
	return rs, errors.Join(errs...)
}
