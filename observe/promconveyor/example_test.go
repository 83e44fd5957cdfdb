package promconveyor_test

import (
	"context"
	"log"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/connect"
	"github.com/conveyorq/conveyor/observe/promconveyor"
)

// A process that enqueues and works jobs, with its metrics on /metrics.
func Example() {
	ctx := context.Background()
	m := promconveyor.New(promconveyor.Options{})
	cfg := &conveyor.Config{
		WorkMiddleware:    []conveyor.WorkMiddleware{m.WorkMiddleware},
		EnqueueMiddleware: []conveyor.EnqueueMiddleware{m.EnqueueMiddleware},
	}
	client, err := connect.Open(ctx, "./app.db", cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m, promconveyor.NewClientCollector(client, promconveyor.ClientOptions{}))
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// ... AddWorker, client.Start(ctx), http.ListenAndServe(addr, nil)
}
