package tracing_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go"

	"github.com/fleetlearn/fleetlearn/internal/tracing"
)

// A service sets tracing up from its flags, puts the trace context of a
// span into the headers of a NATS message, and flushes the spans when it
// stops.
func ExampleSetup() {
	dir, _ := os.MkdirTemp("", "tracing")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	tp, shutdown, err := tracing.Setup(ctx, tracing.Config{ServiceName: "fleetlearn-server", File: filepath.Join(dir, "trace.jsonl")})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer shutdown(ctx)

	ctx, span := tp.Tracer("example").Start(ctx, "round")
	defer span.End()
	msg := &nats.Msg{Subject: "example", Header: tracing.Header(ctx)}
	fmt.Println(len(msg.Header.Get(tracing.HeaderTraceparent)))
	// Output: 55
}
