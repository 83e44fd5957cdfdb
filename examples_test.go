package conveyor_test

import (
	"context"
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
