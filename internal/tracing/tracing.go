// Package tracing sets up OpenTelemetry tracing for Fleetlearn's programs
// and carries W3C trace context in NATS headers, so that one federated
// round is one trace across the aggregator and its devices
// (docs/TRACING.md). With nothing to export to, Setup returns the no-op
// provider: instrumented code then records nothing and allocates nothing
// for it.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Config says where spans go; the zero value exports nothing.
type Config struct {
	// ServiceName is the service.name resource attribute of every span.
	ServiceName string
	// File appends spans to this file, one JSON object per line (the
	// OpenTelemetry stdout exporter's format).
	File string
	// OTLPEndpoint exports spans over OTLP/gRPC to host:port, over TLS
	// unless OTLPInsecure is set.
	OTLPEndpoint string
	OTLPInsecure bool
	// OTLPFromEnv exports over OTLP/gRPC where the standard
	// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
	// variable says, when OTLPEndpoint is empty; the exporter then reads
	// the other OTEL_EXPORTER_OTLP_* variables too.
	OTLPFromEnv bool
}

// AddFlags registers --trace-file, --otlp-endpoint and --otlp-insecure on
// fs, filling c.
func AddFlags(fs *pflag.FlagSet, c *Config) {
	fs.StringVar(&c.File, "trace-file", c.File, "append OpenTelemetry spans of rounds, one JSON object per line, to `PATH`")
	fs.StringVar(&c.OTLPEndpoint, "otlp-endpoint", c.OTLPEndpoint,
		"export OpenTelemetry spans over OTLP/gRPC to `HOST:PORT` (default: $OTEL_EXPORTER_OTLP_ENDPOINT when set)")
	fs.BoolVar(&c.OTLPInsecure, "otlp-insecure", c.OTLPInsecure, "with --otlp-endpoint, connect in plaintext instead of TLS")
}

func (c Config) otlpFromEnv() bool {
	return c.OTLPFromEnv && c.OTLPEndpoint == "" &&
		(os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "")
}

// Enabled reports whether c exports spans anywhere.
func (c Config) Enabled() bool { return c.File != "" || c.OTLPEndpoint != "" || c.otlpFromEnv() }

// Setup returns the tracer provider c describes and the function that
// flushes and stops it, which the caller runs on shutdown. Without a file or
// an endpoint it is the no-op provider, and shutdown does nothing.
func Setup(ctx context.Context, c Config) (trace.TracerProvider, func(context.Context) error, error) {
	if c.OTLPInsecure && c.OTLPEndpoint == "" && !c.otlpFromEnv() {
		return nil, nil, fmt.Errorf("tracing: %w", ErrInsecureWithoutEndpoint)
	}
	if !c.Enabled() {
		return noop.NewTracerProvider(), func(context.Context) error { return nil }, nil
	}
	var closers []func(context.Context) error
	var opts []sdktrace.TracerProviderOption
	fail := func(err error) (trace.TracerProvider, func(context.Context) error, error) {
		for _, f := range closers {
			f(ctx)
		}
		return nil, nil, err
	}
	if c.File != "" {
		f, err := os.OpenFile(c.File, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return fail(fmt.Errorf("tracing: trace file: %w", err))
		}
		closers = append(closers, func(context.Context) error { return f.Close() })
		// The exporter writes a batch with one Encode per span; the lock
		// keeps lines whole if the provider is shared by many goroutines.
		exp, err := stdouttrace.New(stdouttrace.WithWriter(&lockedWriter{w: f}))
		if err != nil {
			return fail(fmt.Errorf("tracing: trace file: %w", err))
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	if c.OTLPEndpoint != "" || c.otlpFromEnv() {
		var o []otlptracegrpc.Option
		if c.OTLPEndpoint != "" {
			o = append(o, otlptracegrpc.WithEndpoint(c.OTLPEndpoint))
		}
		if c.OTLPInsecure {
			o = append(o, otlptracegrpc.WithInsecure())
		}
		// The client connects lazily: an unreachable collector costs
		// dropped spans, never a program that does not start.
		exp, err := otlptracegrpc.New(ctx, o...)
		if err != nil {
			return fail(fmt.Errorf("tracing: OTLP exporter: %w", err))
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	name := c.ServiceName
	if name == "" {
		name = "fleetlearn"
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", name)))
	if err != nil {
		return fail(fmt.Errorf("tracing: resource: %w", err))
	}
	tp := sdktrace.NewTracerProvider(append(opts, sdktrace.WithResource(res))...)
	return tp, func(ctx context.Context) error {
		// Flushes every exporter's batch, then closes the file behind it.
		errs := []error{tp.Shutdown(ctx)}
		for _, f := range closers {
			errs = append(errs, f(ctx))
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("tracing: shutdown: %w", err)
		}
		return nil
	}, nil
}

// lockedWriter serializes writes to the trace file.
type lockedWriter struct {
	mu sync.Mutex
	w  *os.File
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// The W3C trace-context header names, as NATS carries them: NATS headers
// are case-sensitive, so the names are the lower-case ones the W3C
// specification writes.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

var propagator = propagation.TraceContext{}

// Or is tp, or the no-op provider when tp is nil: a collaborator given no
// provider records nothing.
func Or(tp trace.TracerProvider) trace.TracerProvider {
	if tp == nil {
		return noop.NewTracerProvider()
	}
	return tp
}

// Header returns a header holding the trace context of ctx, or nil when
// there is none, so that an untraced message stays without headers.
func Header(ctx context.Context) nats.Header {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	h := nats.Header{}
	propagator.Inject(ctx, natsCarrier(h))
	return h
}

// Extract returns ctx with the remote span context h carries, if any.
func Extract(ctx context.Context, h nats.Header) context.Context {
	if len(h) == 0 {
		return ctx
	}
	return propagator.Extract(ctx, natsCarrier(h))
}

// Remote returns the span context h carries; it is invalid when h holds none.
func Remote(h nats.Header) trace.SpanContext {
	return trace.SpanContextFromContext(Extract(context.Background(), h))
}

// natsCarrier adapts a nats.Header to the propagator. Unlike
// propagation.HeaderCarrier over http.Header, it keeps the names as given
// (NATS does not canonicalize them); Get also accepts the canonical
// "Traceparent" that an HTTP-minded publisher would write.
type natsCarrier nats.Header

func (c natsCarrier) Get(key string) string {
	if v := nats.Header(c).Get(key); v != "" {
		return v
	}
	return nats.Header(c).Get(canonical(key))
}

func (c natsCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }

func (c natsCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

func canonical(key string) string {
	if key == "" || key[0] < 'a' || key[0] > 'z' {
		return key
	}
	return string(key[0]-'a'+'A') + key[1:]
}

// Attribute keys common to the server's and the devices' spans. They name
// things (task, round, device), never data.
const (
	AttrTask   = attribute.Key("fleetlearn.task.id")
	AttrRound  = attribute.Key("fleetlearn.round")
	AttrKind   = attribute.Key("fleetlearn.round.kind")
	AttrDevice = attribute.Key("fleetlearn.device.id")
)
