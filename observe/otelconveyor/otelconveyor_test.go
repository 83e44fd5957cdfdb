package otelconveyor_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/conveyortest/sqlitetest"
	"github.com/conveyorq/conveyor/observe/otelconveyor"
)

type job struct {
	Do string `json:"do"`
}

func (job) Kind() string { return "job" }

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// TestTraceAcrossTheDatabase: the span of a job's run has the enqueue's
// span as its parent, the trace context having travelled in the job's
// metadata through the database (the client is started with a context
// that carries no span); a failed run's span has status Error; the
// metrics count attempts by outcome.
func TestTraceAcrossTheDatabase(t *testing.T) {
	ctx := context.Background()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer tp.Shutdown(ctx)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	mw, err := otelconveyor.New(otelconveyor.Options{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	db := sqlitetest.Open(t, &conveyor.Config{
		EnqueueMiddleware: []conveyor.EnqueueMiddleware{mw.EnqueueMiddleware},
		WorkMiddleware:    []conveyor.WorkMiddleware{mw.WorkMiddleware},
		PollMax:           20 * time.Millisecond,
	})
	c := db.Client
	var mu sync.Mutex
	inHandler := map[string]trace.SpanContext{}
	done := make(chan struct{}, 4)
	err = conveyor.AddWorker(c, conveyor.WorkFunc(func(ctx context.Context, j *conveyor.Job[job]) error {
		mu.Lock()
		inHandler[j.Args.Do] = trace.SpanContextFromContext(ctx)
		mu.Unlock()
		done <- struct{}{}
		if j.Args.Do == "fail" {
			return errors.New("boom")
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}

	// The application's request span, inside which the jobs are enqueued.
	reqCtx, req := tp.Tracer("app").Start(ctx, "request")
	okID, err := c.Enqueue(reqCtx, job{"ok"}, &conveyor.EnqueueOpts{Metadata: map[string]string{"tenant": "acme"}})
	if err != nil {
		t.Fatal(err)
	}
	failID, err := c.Enqueue(reqCtx, job{"fail"}, &conveyor.EnqueueOpts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	req.End()
	stored, err := c.Job(ctx, okID)
	if err != nil {
		t.Fatal(err)
	}
	if stored.Metadata["traceparent"] == "" || stored.Metadata["tenant"] != "acme" {
		t.Fatalf("stored metadata %v: want a traceparent beside the caller's tenant", stored.Metadata)
	}

	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatal("jobs did not run")
		}
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	var enqueues, runs []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		switch s.Name() {
		case "conveyor.enqueue job":
			enqueues = append(enqueues, s)
		case "conveyor.run job":
			runs = append(runs, s)
		}
	}
	if len(enqueues) != 2 || len(runs) != 2 {
		t.Fatalf("%d enqueue spans and %d run spans, want 2 and 2", len(enqueues), len(runs))
	}
	for _, e := range enqueues {
		if e.SpanKind() != trace.SpanKindProducer || e.Parent().SpanID() != req.SpanContext().SpanID() {
			t.Fatalf("enqueue span %v: kind %v parent %v, want a producer child of the request", e.Name(), e.SpanKind(), e.Parent().SpanID())
		}
	}
	for _, r := range runs {
		id := attr(r, otelconveyor.AttrJobID).AsInt64()
		var parent sdktrace.ReadOnlySpan
		for i, e := range enqueues {
			if e.SpanContext().SpanID() == r.Parent().SpanID() {
				parent = enqueues[i]
			}
		}
		if parent == nil || r.SpanContext().TraceID() != req.SpanContext().TraceID() || !r.Parent().IsRemote() {
			t.Fatalf("run span of job %d: parent %v (remote %v) trace %v; want an enqueue span of the request's trace %v",
				id, r.Parent().SpanID(), r.Parent().IsRemote(), r.SpanContext().TraceID(), req.SpanContext().TraceID())
		}
		if r.SpanKind() != trace.SpanKindConsumer || attr(r, otelconveyor.AttrJobKind).AsString() != "job" ||
			attr(r, otelconveyor.AttrJobQueue).AsString() != "default" || attr(r, otelconveyor.AttrJobAttempt).AsInt64() != 1 {
			t.Fatalf("run span attributes: %v", r.Attributes())
		}
		switch id {
		case okID:
			if r.Status().Code == codes.Error || attr(r, otelconveyor.AttrOutcome).AsString() != "completed" {
				t.Fatalf("completed run: status %v attrs %v", r.Status(), r.Attributes())
			}
		case failID:
			if r.Status().Code != codes.Error || r.Status().Description != "boom" || attr(r, otelconveyor.AttrOutcome).AsString() != "discarded" {
				t.Fatalf("failed run: status %v attrs %v", r.Status(), r.Attributes())
			}
		default:
			t.Fatalf("run span of unknown job %d", id)
		}
	}
	mu.Lock()
	for do, sc := range inHandler {
		if sc.TraceID() != req.SpanContext().TraceID() {
			t.Fatalf("handler of %q ran in trace %v, want %v", do, sc.TraceID(), req.SpanContext().TraceID())
		}
	}
	mu.Unlock()

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	byOutcome := map[string]int64{}
	durations := uint64(0)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name == "conveyor.job.attempts" {
					for _, p := range d.DataPoints {
						o, _ := p.Attributes.Value(otelconveyor.AttrOutcome)
						byOutcome[o.AsString()] += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				if m.Name == "conveyor.job.duration" {
					for _, p := range d.DataPoints {
						durations += p.Count
					}
				}
			}
		}
	}
	if byOutcome["completed"] != 1 || byOutcome["discarded"] != 1 || durations != 2 {
		t.Fatalf("attempts by outcome %v, %d durations; want 1 completed, 1 discarded, 2 durations", byOutcome, durations)
	}
}

// TestNoTracingInjectsNothing: without a valid span context (no-op
// tracer) nothing is added to the jobs' metadata.
func TestNoTracingInjectsNothing(t *testing.T) {
	mw, err := otelconveyor.New(otelconveyor.Options{TracerProvider: noop.NewTracerProvider()})
	if err != nil {
		t.Fatal(err)
	}
	db := sqlitetest.Open(t, &conveyor.Config{EnqueueMiddleware: []conveyor.EnqueueMiddleware{mw.EnqueueMiddleware}})
	id, err := db.Client.Enqueue(context.Background(), job{"ok"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	j, err := db.Client.Job(context.Background(), id)
	if err != nil || j.Metadata != nil {
		t.Fatalf("metadata %v (%v), want none", j.Metadata, err)
	}
}
