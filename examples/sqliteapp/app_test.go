package sqliteapp

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/conveyortest"
)

// TestOrderEnqueuesItsInvoice tests the application's use of conveyor
// with package conveyortest, without starting a client or sleeping: the
// invoice is enqueued inside the order's transaction (and seen nowhere
// else before the commit), and the job, run synchronously through the
// registered handler, issues the invoice and is completed in the
// database.
func TestOrderEnqueuesItsInvoice(t *testing.T) {
	ctx := context.Background()
	app, err := Open(ctx, filepath.Join(t.TempDir(), "shop.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()

	tx, err := app.Driver.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := app.OrderTx(ctx, tx, 1250)
	if err != nil {
		t.Fatal(err)
	}
	want := &conveyortest.Filter[Invoice]{Args: map[string]any{"order_id": id, "cents": 1250}}
	conveyortest.RequireEnqueuedTx(t, app.Client, tx, want)
	conveyortest.RequireNotEnqueued(t, app.Client, want) // not before the commit
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	jobs := conveyortest.RequireEnqueued(t, app.Client, want)
	if len(jobs) != 1 {
		t.Fatalf("%d invoice jobs for one order", len(jobs))
	}

	res := conveyortest.Work(t, app.Client, jobs[0].ID)
	if res.Err != nil || res.Job.State != conveyor.JobStateCompleted {
		t.Fatalf("the invoice job ended %s (handler error %v), want completed", res.Job.State, res.Err)
	}
	select {
	case inv := <-app.Issued:
		if inv != (Invoice{OrderID: id, Cents: 1250}) {
			t.Fatalf("issued %+v, want order %d of 1250 cents", inv, id)
		}
	default:
		t.Fatal("the job completed but issued no invoice")
	}

	// A refused order (the CHECK fails) enqueues nothing.
	if _, err := app.Order(ctx, -5); err == nil {
		t.Fatal("an order of -5 cents was accepted")
	}
	conveyortest.RequireNotEnqueued(t, app.Client, &conveyortest.Filter[Invoice]{Args: `{"cents": -5}`})
}

// TestOrderOnTheApplicationsHandle runs the application on its own
// *sql.DB: an order's invoice job commits with the order, a refused order
// (the CHECK fails) leaves no job, and the handler issues the invoice.
func TestOrderOnTheApplicationsHandle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	app, err := Open(ctx, filepath.Join(t.TempDir(), "shop.db"))
	if err != nil {
		t.Fatal(err)
	}
	id, err := app.Order(ctx, 1250)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := app.Order(ctx, -5); err == nil {
		t.Fatal("an order of -5 cents was accepted")
	}
	jobs, err := app.Client.Jobs(ctx, conveyor.JobFilter{Kind: Invoice{}.Kind()})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 1 {
		t.Fatalf("%d invoice jobs after one order and one refused, want 1", len(jobs))
	}
	if err := app.Client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case inv := <-app.Issued:
		if inv.OrderID != id || inv.Cents != 1250 {
			t.Fatalf("issued %+v, want order %d of 1250 cents", inv, id)
		}
	case <-ctx.Done():
		t.Fatal("the invoice was never issued")
	}
	if err := app.Client.Close(); err != nil {
		t.Fatal(err)
	}
	// The handle is the application's: it outlives the client.
	var n int
	if err := app.DB.QueryRowContext(ctx, "SELECT count(*) FROM orders").Scan(&n); err != nil || n != 1 {
		t.Fatalf("orders after the client closed: %d, %v; want 1, nil", n, err)
	}
	app.DB.Close()
}
