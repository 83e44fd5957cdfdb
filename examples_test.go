package conveyor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
)

// SendEmail is an example job kind.
type SendEmail struct {
	To string `json:"to"`
}

func (SendEmail) Kind() string { return "send_email" }

// Define a job kind, register a worker, enqueue, and wait for the result.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "conveyor-example-")
	defer os.RemoveAll(dir)

	client, err := connect.Open(ctx, filepath.Join(dir, "app.db"), nil)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	if _, err := client.Migrate(ctx); err != nil {
		panic(err)
	}
	done := make(chan string, 1)
	conveyor.AddWorker(client, conveyor.WorkFunc(func(ctx context.Context, job *conveyor.Job[SendEmail]) error {
		done <- job.Args.To
		return nil
	}))
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	if _, err := client.Enqueue(ctx, SendEmail{To: "ada@example.com"}, nil); err != nil {
		panic(err)
	}
	select {
	case to := <-done:
		fmt.Println("sent to", to)
	case <-time.After(10 * time.Second):
		fmt.Println("timed out")
	}
	// Output: sent to ada@example.com
}

// Limit a queue for every process working it: at most 2 of its jobs run
// at once, and at most 100 start per minute, whichever process or HTTP
// worker claims them. Jobs over a limit wait in the queue without
// spending an attempt.
func ExampleClient_SetQueueLimits() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "conveyor-example-")
	defer os.RemoveAll(dir)

	client, err := connect.Open(ctx, filepath.Join(dir, "app.db"), &conveyor.Config{
		Queues: map[string]conveyor.QueueConfig{"mail": {MaxWorkers: 10}},
	})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	if _, err := client.Migrate(ctx); err != nil {
		panic(err)
	}
	err = client.SetQueueLimits(ctx, "mail", conveyor.QueueLimits{MaxRunning: 2, Rate: 100, RatePeriod: time.Minute})
	if err != nil {
		panic(err)
	}
	limits, err := client.QueueLimits(ctx)
	if err != nil {
		panic(err)
	}
	l := limits["mail"]
	fmt.Printf("mail: %d at once, %d per %v\n", l.MaxRunning, l.Rate, l.RatePeriod)

	// Out of range: refused, naming the field.
	err = client.SetQueueLimits(ctx, "mail", conveyor.QueueLimits{MaxRunning: -1})
	fmt.Println(errors.Is(err, conveyor.ErrInvalidOpts))
	// Output:
	// mail: 2 at once, 100 per 1m0s
	// true
}
