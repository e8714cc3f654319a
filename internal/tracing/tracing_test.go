package tracing_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/fleetlearn/fleetlearn/internal/tracing"
)

// roundSpans are the span names of a round's trace, server's and device's.
var roundSpans = []string{"round", "selection", "checkin", "training", "upload", "validation", "aggregation", "commit", "audit"}

// emit records a round-shaped tree of spans through tp: the device's
// spans continue the round's trace through a NATS header, as the plan's
// reply carries it.
func emit(t *testing.T, tp trace.TracerProvider) {
	t.Helper()
	tr := tp.Tracer("test")
	ctx, round := tr.Start(context.Background(), "round")
	h := tracing.Header(ctx)
	dctx, checkin := tr.Start(tracing.Extract(context.Background(), h), "checkin")
	checkin.End()
	for _, name := range []string{"training", "upload"} {
		_, s := tr.Start(dctx, name)
		s.End()
	}
	for _, name := range []string{"selection", "validation", "aggregation", "commit", "audit"} {
		_, s := tr.Start(ctx, name)
		s.End()
	}
	round.End()
}

func TestSetupOffIsNoop(t *testing.T) {
	tp, shutdown, err := tracing.Setup(context.Background(), tracing.Config{ServiceName: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tp.(noop.TracerProvider); !ok {
		t.Fatalf("provider %T, want the no-op provider", tp)
	}
	ctx, span := tp.Tracer("t").Start(context.Background(), "s")
	defer span.End()
	if h := tracing.Header(ctx); h != nil {
		t.Fatalf("an untraced context gave headers %v", h)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestSetupRefusesInsecureWithoutEndpoint(t *testing.T) {
	_, _, err := tracing.Setup(context.Background(), tracing.Config{File: filepath.Join(t.TempDir(), "t.jsonl"), OTLPInsecure: true})
	if !errors.Is(err, tracing.ErrInsecureWithoutEndpoint) {
		t.Fatalf("err %v, want ErrInsecureWithoutEndpoint", err)
	}
}

// TestHeaderCarriesTraceparent: the header is the lower-case W3C one, and
// Extract continues the trace it names, also from the canonical spelling
// an HTTP-minded publisher writes.
func TestHeaderCarriesTraceparent(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5}, TraceFlags: trace.FlagsSampled})
	h := tracing.Header(trace.ContextWithSpanContext(context.Background(), sc))
	want := "00-01020300000000000000000000000000-0405000000000000-01"
	if got := h.Get(tracing.HeaderTraceparent); got != want {
		t.Fatalf("traceparent %q, want %q (header %v)", got, want, h)
	}
	for _, hdr := range []nats.Header{h, {"Traceparent": []string{want}}} {
		got := tracing.Remote(hdr)
		if got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() || !got.IsRemote() {
			t.Fatalf("extracted %v from %v, want %v", got, hdr, sc)
		}
	}
	if tracing.Remote(nil).IsValid() {
		t.Fatal("a span context from no header")
	}
}

// TestFileExporter: spans go to the file as JSON lines, one span each, all
// of one trace.
func TestFileExporter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	tp, shutdown, err := tracing.Setup(context.Background(), tracing.Config{ServiceName: "fleetlearn-test", File: path})
	if err != nil {
		t.Fatal(err)
	}
	emit(t, tp)
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	traces := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var span struct {
			Name        string
			SpanContext struct{ TraceID string }
			Resource    []keyValue
		}
		if err := json.Unmarshal(sc.Bytes(), &span); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		names = append(names, span.Name)
		traces[span.SpanContext.TraceID] = true
		if !slices.Contains(span.Resource, keyValue{Key: "service.name", Value: value{"fleetlearn-test"}}) {
			t.Errorf("span %s lacks service.name: %v", span.Name, span.Resource)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	want := slices.Sorted(slices.Values(roundSpans))
	if !slices.Equal(names, want) || len(traces) != 1 {
		t.Fatalf("spans %v in %d traces, want %v in one", names, len(traces), want)
	}
}

// keyValue is an attribute as the stdout exporter writes it.
type keyValue struct {
	Key   string
	Value value
}

type value struct{ Value any }

// collector is an OTLP/gRPC trace collector that keeps the span names it
// receives.
type collector struct {
	coltrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	names []string
	got   chan struct{}
}

func (c *collector) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				c.names = append(c.names, s.Name)
			}
		}
	}
	select {
	case c.got <- struct{}{}:
	default:
	}
	return &coltrace.ExportTraceServiceResponse{}, nil
}

// TestOTLPExport: spans reach a real OTLP/gRPC collector on loopback,
// flushed by shutdown.
func TestOTLPExport(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{got: make(chan struct{}, 1)}
	srv := grpc.NewServer()
	coltrace.RegisterTraceServiceServer(srv, col)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)

	tp, shutdown, err := tracing.Setup(context.Background(), tracing.Config{ServiceName: "fleetlearn-test",
		OTLPEndpoint: ln.Addr().String(), OTLPInsecure: true})
	if err != nil {
		t.Fatal(err)
	}
	emit(t, tp)
	// A hang guard only: shutdown flushes the batch and returns.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	col.mu.Lock()
	names := slices.Sorted(slices.Values(col.names))
	col.mu.Unlock()
	if want := slices.Sorted(slices.Values(roundSpans)); !slices.Equal(names, want) {
		t.Fatalf("collector got %v, want %v", names, want)
	}
}
