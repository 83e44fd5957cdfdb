package pgxapp

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/conveyortest"
	"github.com/conveyorq/conveyor/internal/seam"
	"github.com/conveyorq/conveyor/internal/testdb"
)

// TestRegisterEnqueuesTheWelcomeEmail tests the application's use of
// conveyor with package conveyortest, without starting a client or
// sleeping: the email job is enqueued inside the registration's pgx
// transaction (and seen nowhere else before the commit), and the job,
// run synchronously through the registered handler, sends the mail and
// is completed in the database.
func TestRegisterEnqueuesTheWelcomeEmail(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	prefix := testdb.Prefix()
	table := prefix + "users"
	app, err := New(ctx, pool, table, prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		seam.DropTables(context.Background(), app.Client)
		app.Client.Close()
		pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
	}()

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	id, err := app.RegisterTx(ctx, tx, "b@example.com")
	if err != nil {
		t.Fatal(err)
	}
	want := &conveyortest.Filter[WelcomeEmail]{Args: `{"email": "b@example.com"}`}
	got := conveyortest.RequireEnqueuedTx(t, app.Client, tx, want)
	if len(got) != 1 || got[0].Args.UserID != id {
		t.Fatalf("welcome jobs in the transaction: %+v, want one for user %d", got, id)
	}
	conveyortest.RequireNotEnqueued(t, app.Client, want) // not before the commit
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	job := conveyortest.RequireEnqueued(t, app.Client, want)[0]

	res := conveyortest.Work(t, app.Client, job.ID)
	if res.Err != nil || res.Job.State != conveyor.JobStateCompleted {
		t.Fatalf("the welcome job ended %s (handler error %v), want completed", res.Job.State, res.Err)
	}
	select {
	case m := <-app.Sent:
		if m != (WelcomeEmail{UserID: id, Email: "b@example.com"}) {
			t.Fatalf("sent %+v, want user %d b@example.com", m, id)
		}
	default:
		t.Fatal("the job completed but sent no mail")
	}
}

// TestRegisterOnTheApplicationsPool runs the application on its own pool:
// a registration's email job commits with the user, a failed registration
// (duplicate email) leaves no job, and the handler sends the mail.
func TestRegisterOnTheApplicationsPool(t *testing.T) {
	dsn := testdb.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	prefix := testdb.Prefix()
	table := prefix + "users"
	app, err := New(ctx, pool, table, prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())

	id, err := app.Register(ctx, "a@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := app.Register(ctx, "a@example.com"); err == nil {
		t.Fatal("a duplicate registration succeeded")
	}
	jobs, err := app.Client.Jobs(ctx, conveyor.JobFilter{Kind: WelcomeEmail{}.Kind()})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 1 {
		t.Fatalf("%d welcome jobs after one registration and one rolled back, want 1", len(jobs))
	}
	if err := app.Client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-app.Sent:
		if m.UserID != id || m.Email != "a@example.com" {
			t.Fatalf("sent %+v, want user %d a@example.com", m, id)
		}
	case <-ctx.Done():
		t.Fatal("the welcome email was never sent")
	}
	// The pool is the application's: closing the client leaves it open.
	if err := app.Client.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := seam.DropTables(ctx, app.Client); err != nil {
		t.Fatal(err)
	}
	if err := app.Client.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("the application's pool is unusable after the client closed: %v", err)
	}
}

// TestLinksOnlyPostgres checks that an application on the PostgreSQL
// driver links no other backend, no plotting code and nothing of the
// conveyor command (its own module, in cmd/conveyor), in its binary and
// in its test binary (which uses conveyortest).
func TestLinksOnlyPostgres(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-test", ".").CombinedOutput()
	if err != nil {
		testdb.Missing(t, "a working go command (go list -deps): %v: %s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"modernc.org/", "github.com/go-sql-driver/", "gonum.org/", "conveyor/internal/backend/sqlite", "conveyor/internal/backend/mysql", "conveyor/cmd/"} {
			if strings.Contains(dep, banned) {
				t.Errorf("a PostgreSQL-only application links %s", dep)
			}
		}
	}
}

// TestEnqueueTxTypeChecked builds the package wrongtx, which hands a
// *sql.Tx to a client on the PostgreSQL driver, and expects the compiler
// to refuse it.
func TestEnqueueTxTypeChecked(t *testing.T) {
	out, err := exec.Command("go", "build", "-tags", "conveyor_wrongtx", "./wrongtx").CombinedOutput()
	if err == nil {
		t.Fatal("a *sql.Tx passed to Client[pgx.Tx].EnqueueTx compiled")
	}
	if !strings.Contains(string(out), "cannot use tx (variable of type *sql.Tx) as pgx.Tx value") {
		t.Fatalf("the build failed for another reason: %s", out)
	}
}

// TestLibraryModuleRequiresNoPlotting checks the library module on its
// own (GOWORK=off: as an application requiring it sees it): no module of
// its build list is plotting code, which only the command's module needs.
func TestLibraryModuleRequiresNoPlotting(t *testing.T) {
	cmd := exec.Command("go", "list", "-m", "all")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		testdb.Missing(t, "a working go command (go list -m all): %v: %s", err, out)
	}
	for _, mod := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.HasPrefix(mod, "gonum.org/") {
			t.Errorf("the library module requires %s", mod)
		}
	}
}
