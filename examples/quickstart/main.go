// Command quickstart is the README's first program: it opens a SQLite
// database, registers a worker, starts the client, enqueues a job, waits
// until the job ran and stops gracefully.
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
)

// SendEmail is a job kind: its fields are the job's arguments, stored as JSON.
type SendEmail struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

// Kind names the kind in the database; workers are registered by it.
func (SendEmail) Kind() string { return "send_email" }

func main() {
	ctx := context.Background()
	client, err := connect.Open(ctx, "./app.db", nil) // or "postgres://...", "mysql://..."
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	if _, err := client.Migrate(ctx); err != nil { // or `conveyor migrate`
		log.Fatal(err)
	}

	ran := make(chan int64) // the handler tells main which job it ran
	err = conveyor.AddWorker(client, conveyor.WorkFunc(func(ctx context.Context, job *conveyor.Job[SendEmail]) error {
		fmt.Println("sending to", job.Args.To)
		select {
		case ran <- job.ID:
		case <-ctx.Done(): // cancelled by Stop, a timeout or a lost lease
		}
		return nil // an error retries with backoff; conveyor.JobCancel(err) gives up
	}))
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil { // works the "default" queue until Stop
		log.Fatal(err)
	}

	id, err := client.Enqueue(ctx, SendEmail{To: "a@example.com", Subject: "hello"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	timeout := time.After(30 * time.Second)
	for got := int64(0); got != id; {
		select {
		case got = <-ran:
		case <-timeout:
			log.Fatalf("job %d did not run within 30s", id)
		}
	}
	fmt.Println("job", id, "ran")

	// Stop claims nothing more, waits for running jobs (here, up to 10s),
	// and writes their outcomes before it returns.
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		log.Fatal(err)
	}
}
