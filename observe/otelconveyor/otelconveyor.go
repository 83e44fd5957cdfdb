// Package otelconveyor traces conveyor jobs with OpenTelemetry, from the
// enqueue into the job's run, and optionally records OpenTelemetry
// metrics of the runs.
//
// The trace context travels in the job's metadata (conveyor's
// EnqueueOpts.Metadata, stored with the job): EnqueueMiddleware starts a
// producer span for the enqueue call and injects its context (W3C
// traceparent and tracestate, and baggage, by default) into every job's
// metadata; WorkMiddleware extracts it from the job's metadata and runs
// the attempt in a consumer span whose parent is that enqueue span, in
// whatever process runs it:
//
//	t, err := otelconveyor.New(otelconveyor.Options{}) // the global TracerProvider
//	cfg := &conveyor.Config{
//		EnqueueMiddleware: []conveyor.EnqueueMiddleware{t.EnqueueMiddleware},
//		WorkMiddleware:    []conveyor.WorkMiddleware{t.WorkMiddleware},
//	}
//
// The package is in the module github.com/conveyorq/conveyor/observe, so
// that the library's own go.mod requires no OpenTelemetry code.
package otelconveyor

import (
	"context"
	"maps"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/conveyorq/conveyor"
	"github.com/conveyorq/conveyor/observe/internal/outcome"
)

// ScopeName is the instrumentation scope of the tracer and meter.
const ScopeName = "github.com/conveyorq/conveyor/observe/otelconveyor"

// Attribute keys set on spans and metrics.
const (
	AttrJobID       = attribute.Key("conveyor.job.id")
	AttrJobKind     = attribute.Key("conveyor.job.kind")
	AttrJobQueue    = attribute.Key("conveyor.job.queue")
	AttrJobAttempt  = attribute.Key("conveyor.job.attempt")
	AttrMaxAttempts = attribute.Key("conveyor.job.max_attempts")
	AttrOutcome     = attribute.Key("conveyor.job.outcome")
	AttrBatchSize   = attribute.Key("conveyor.enqueue.jobs")
)

// Options configure the middleware. Zero fields take the defaults.
type Options struct {
	// TracerProvider makes the spans; default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator carries the context in job metadata; default W3C trace
	// context and baggage (not the global propagator, which is a no-op
	// until an application sets one).
	Propagator propagation.TextMapPropagator
	// MeterProvider, when set, records metrics of the runs:
	// conveyor.job.attempts (a counter by kind, queue and outcome) and
	// conveyor.job.duration (a histogram of run time, in seconds). Nil
	// records none.
	MeterProvider metric.MeterProvider
	// NoEnqueueSpan injects the caller's own span context into the jobs
	// instead of starting a producer span for each enqueue call.
	NoEnqueueSpan bool
}

// Middleware holds the tracer and instruments; its methods are
// conveyor.EnqueueMiddleware and conveyor.WorkMiddleware.
type Middleware struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	noSpan   bool
	attempts metric.Int64Counter
	duration metric.Float64Histogram
}

// New returns the middleware.
func New(o Options) (*Middleware, error) {
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	if o.Propagator == nil {
		o.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	m := &Middleware{tracer: o.TracerProvider.Tracer(ScopeName), prop: o.Propagator, noSpan: o.NoEnqueueSpan}
	if o.MeterProvider != nil {
		meter := o.MeterProvider.Meter(ScopeName)
		var err error
		if m.attempts, err = meter.Int64Counter("conveyor.job.attempts",
			metric.WithDescription("Job attempts run, by kind, queue and outcome (completed, failed, discarded, cancelled, snoozed)."),
			metric.WithUnit("{attempt}")); err != nil {
			return nil, err
		}
		if m.duration, err = meter.Float64Histogram("conveyor.job.duration",
			metric.WithDescription("Run time of job attempts."), metric.WithUnit("s")); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// EnqueueMiddleware starts a producer span around the enqueue call (unless
// Options.NoEnqueueSpan) and injects the current trace context into the
// metadata of every job. It copies each item's options and metadata
// before changing them; keys the caller set win over the propagator's.
// Nothing is injected without a valid span context (no tracing).
func (m *Middleware) EnqueueMiddleware(ctx context.Context, items []conveyor.EnqueueItem, next func(context.Context, []conveyor.EnqueueItem) error) error {
	var span trace.Span
	if !m.noSpan {
		name := "conveyor.enqueue"
		attrs := []attribute.KeyValue{AttrBatchSize.Int(len(items))}
		if len(items) == 1 && items[0].Args != nil {
			name += " " + items[0].Args.Kind()
			attrs = append(attrs, AttrJobKind.String(items[0].Args.Kind()))
		}
		ctx, span = m.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
		defer span.End()
	}
	carrier := propagation.MapCarrier{}
	m.prop.Inject(ctx, carrier)
	if len(carrier) > 0 {
		for i := range items {
			var o conveyor.EnqueueOpts
			if items[i].Opts != nil {
				o = *items[i].Opts
			}
			md := maps.Clone(carrier)
			maps.Copy(md, o.Metadata)
			o.Metadata = md
			items[i].Opts = &o
		}
	}
	err := next(ctx, items)
	if err != nil && span != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// WorkMiddleware extracts the trace context from the job's metadata and
// runs the rest of the chain in a consumer span ("conveyor.run KIND")
// whose parent is the enqueue's span (a new trace when the job carries
// none), with the job's id, kind, queue and attempt as attributes. An
// attempt that fails, is cancelled or discarded, or panics ends the span
// with status Error; a snooze does not. With a MeterProvider it also
// records the attempt's outcome and run time.
func (m *Middleware) WorkMiddleware(ctx context.Context, job *conveyor.JobInfo, next func(context.Context) error) (err error) {
	if len(job.Metadata) > 0 {
		ctx = m.prop.Extract(ctx, propagation.MapCarrier(job.Metadata))
	}
	ctx, span := m.tracer.Start(ctx, "conveyor.run "+job.Kind,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			AttrJobID.Int64(job.ID), AttrJobKind.String(job.Kind), AttrJobQueue.String(job.Queue),
			AttrJobAttempt.Int(job.Attempt), AttrMaxAttempts.Int(job.MaxAttempts),
		))
	start := time.Now()
	panicked := true
	defer func() {
		if panicked {
			r := recover()
			m.end(ctx, span, job, outcome.Panicked(r), start)
			panic(r)
		}
	}()
	err = next(ctx)
	panicked = false
	m.end(ctx, span, job, err, start)
	return err
}

func (m *Middleware) end(ctx context.Context, span trace.Span, job *conveyor.JobInfo, err error, start time.Time) {
	out := outcome.Of(job, err)
	span.SetAttributes(AttrOutcome.String(out))
	if err != nil && out != "snoozed" {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	if m.attempts != nil {
		attrs := metric.WithAttributes(AttrJobKind.String(job.Kind), AttrJobQueue.String(job.Queue), AttrOutcome.String(out))
		m.attempts.Add(ctx, 1, attrs)
		m.duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(AttrJobKind.String(job.Kind), AttrJobQueue.String(job.Queue)))
	}
}
