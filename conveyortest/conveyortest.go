// Package conveyortest helps an application test its use of conveyor on a
// real database, SQLite by default:
//
//	func TestOrder(t *testing.T) {
//		db := conveyortest.OpenSQLite(t, nil) // a fresh, migrated file in t.TempDir()
//		app := NewApp(db.DB, db.Client)       // registers its workers
//
//		tx, _ := db.Driver.BeginTx(ctx, nil)
//		app.PlaceOrder(ctx, tx, 1250)          // enqueues an Invoice in tx
//		conveyortest.RequireEnqueuedTx(t, db.Client, tx, &conveyortest.Filter[Invoice]{Args: `{"cents": 1250}`})
//		conveyortest.RequireNotEnqueued[Invoice](t, db.Client, nil) // not before the commit
//		tx.Commit()
//
//		job := conveyortest.RequireEnqueued[Invoice](t, db.Client, nil)[0]
//		res := conveyortest.Work(t, db.Client, job.ID) // the registered worker, synchronously
//		if res.Job.State != conveyor.JobStateCompleted { ... }
//	}
//
// Assertions read the jobs table through the client, the committed jobs
// (Enqueued, RequireEnqueued, RequireNotEnqueued), or inside a
// transaction before it commits (the ...Tx variants, with the
// transaction EnqueueTx was given: a *sql.Tx, or a pgx.Tx on PostgreSQL;
// this package does not import pgx).
//
// Work runs one job through the client's registered worker in the test's
// goroutine, the way a started client runs it: the job is claimed by id
// (fenced, with a lease that is renewed while it runs), the handler runs
// with its timeout and panic recovery, and its outcome (completed,
// retryable with the error and the kind's backoff, cancelled, discarded)
// is written to the database before Work returns. Nothing sleeps; the
// client need not be started.
//
// OpenSQLite gives a test its own database. On PostgreSQL or MySQL, pass
// the test's own client (conveyor.New on the test database) to the same
// functions.
package conveyortest
