// Package natstest starts a real embedded nats-server with JetStream for
// tests: on a random loopback port, storing in a test's temp dir, shut down
// when the test ends.
package natstest

import (
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Options are a test server's defaults: JetStream on, a random loopback
// port, storage in the test's temp dir, no logging and no signal handling.
func Options(t testing.TB) *natsserver.Options {
	return &natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true}
}

// Start runs a nats-server with Options and returns it once it accepts
// connections.
func Start(t testing.TB) *natsserver.Server {
	t.Helper()
	return Run(t, Options(t))
}

// Run runs a nats-server with opts and returns it once it accepts
// connections; it is shut down, and waited for, when the test ends.
func Run(t testing.TB, opts *natsserver.Options) *natsserver.Server {
	t.Helper()
	ns, err := natsserver.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

// JetStream starts a server and returns a JetStream context on a connection
// to it that closes with the test.
func JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	_, js := Connect(t, Start(t))
	return js
}

// Connect opens a connection to ns, closed when the test ends, and a
// JetStream context on it.
func Connect(t testing.TB, ns *natsserver.Server, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}
