// Command fleetlearn-server is the Fleetlearn cloud aggregator service. By
// default it embeds a NATS server with JetStream and keeps all state under
// --data-dir; --nats-url points it at an external NATS cluster instead.
//
// The gRPC API serves TLS from a CA the server creates in
// <data-dir>/tls (clients trust tls/ca.crt) and requires bearer tokens; on
// first start the server writes an admin token to <data-dir>/admin.token.
// --public-host opens the API and NATS to other hosts. --module-publishers
// names the JWK Set of the publisher keys whose modules it accepts. Run
// "fleetlearn-server --help" for every flag.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetlearn/fleetlearn/cmd/internal/servercmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := servercmd.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
