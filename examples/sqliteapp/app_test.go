package sqliteapp

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/conveyorq/conveyor"
)

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
