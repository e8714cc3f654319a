// Package natsx runs the aggregator's embedded NATS server (JetStream on disk)
// and sets up the streams and buckets the round protocol needs. Pointed at an
// external cluster instead, the same setup runs against it unchanged.
package natsx

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// Embedded is an in-process nats-server.
type Embedded struct {
	ns *server.Server
}

// StartEmbedded starts a nats-server listening on listen ("host:port"; port 0
// picks a free one) with JetStream storing under storeDir. configure, when
// not nil, adjusts the options first (authorization).
func StartEmbedded(listen, storeDir string, maxPayload int32, log *slog.Logger, configure func(*server.Options) error) (*Embedded, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("nats: listen address %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("nats: listen port %q: %w", portStr, err)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{
		ServerName: "fleetlearn",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   storeDir,
		MaxPayload: maxPayload,
		// Large cohorts reconnect at once after a restart.
		MaxPending: 64 << 20,
		NoSigs:     true, // only cmd/ handles signals
	}
	if configure != nil {
		if err := configure(opts); err != nil {
			return nil, fmt.Errorf("nats: configure: %w", err)
		}
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats: new server: %w", err)
	}
	// nats-server reports a start that cannot succeed (its port taken, its
	// monitoring port taken) only to its logger, and would leave the wait
	// below to run out: the first fatal message ends the wait instead.
	fatal := make(chan string, 1)
	ns.SetLoggerV2(slogLogger{l: log, fatal: fatal}, false, false, false)
	go ns.Start()
	for waited := time.Duration(0); !ns.ReadyForConnections(readyPoll); waited += readyPoll {
		select {
		case msg := <-fatal:
			ns.Shutdown()
			return nil, fmt.Errorf("nats: embedded server on %s could not start: %s", listen, msg)
		default:
		}
		if waited >= readyTimeout {
			ns.Shutdown()
			return nil, fmt.Errorf("nats: embedded server on %s did not become ready in %v; the server log says why", listen, readyTimeout)
		}
	}
	return &Embedded{ns: ns}, nil
}

// The embedded server's start is checked every readyPoll for a fatal
// error, for at most readyTimeout: JetStream recovers its store before it
// listens, which takes a while on a slow disk.
const (
	readyPoll    = 100 * time.Millisecond
	readyTimeout = 30 * time.Second
)

// ClientURL is the URL clients use to reach the embedded server.
func (e *Embedded) ClientURL() string { return e.ns.ClientURL() }

// Shutdown stops the server and waits for it; safe to call twice.
func (e *Embedded) Shutdown() {
	e.ns.Shutdown()
	e.ns.WaitForShutdown()
}

// slogLogger passes nats-server's log to slog, and its first fatal message
// to fatal.
type slogLogger struct {
	l     *slog.Logger
	fatal chan<- string
}

func (s slogLogger) Noticef(format string, v ...any) { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s slogLogger) Warnf(format string, v ...any)   { s.l.Warn(fmt.Sprintf(format, v...)) }
func (s slogLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	s.l.Error(msg)
	select {
	case s.fatal <- msg:
	default:
	}
}
func (s slogLogger) Errorf(format string, v ...any) { s.l.Error(fmt.Sprintf(format, v...)) }
func (s slogLogger) Debugf(format string, v ...any) { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s slogLogger) Tracef(format string, v ...any) {}

// MaxStore is the most the embedded server's JetStream may store on disk
// (nats-server's default: three quarters of the free space at start).
func (e *Embedded) MaxStore() int64 { return e.ns.JetStreamConfig().MaxStore }

// Setup creates (or updates) the reports stream and the blob bucket with the
// given number of replicas (1 for the embedded server; 3 on a 3-node cluster
// keeps reports and blobs through the loss of a node). The reports stream
// keeps at most maxBytes (-1: no limit) and, once full, refuses new
// reports rather than dropping stored ones: devices retry, and no report
// the server counted can be pushed out by another's.
func Setup(ctx context.Context, js jetstream.JetStream, maxMsg int32, replicas int, maxBytes int64) (jetstream.Stream, jetstream.ObjectStore, error) {
	replicas = max(replicas, 1)
	if maxBytes <= 0 {
		maxBytes = -1
	}
	st, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        wire.StreamReports,
		Description: "Fleetlearn update and evaluation reports, kept until their round commits",
		Subjects:    wire.StreamSubjects,
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      7 * 24 * time.Hour,
		MaxBytes:    maxBytes,
		MaxMsgSize:  maxMsg,
		Duplicates:  time.Hour, // a device re-sending a report after a reconnect is dropped here
		Discard:     jetstream.DiscardNew,
		Replicas:    replicas,
		// Headers-only notices of stored reports let the server refuse
		// reports for closed rounds without receiving every payload twice.
		RePublish: &jetstream.RePublish{Source: ">", Destination: wire.SubjectStoredPrefix + ">", HeadersOnly: true},
		// The server reads chunks by sequence, twice per report: a direct
		// get answers with the message as it is, where the API get wraps it
		// in base64 inside JSON. On a cluster a direct get may be answered
		// by a replica that has not stored the chunk yet, so there the
		// leader answers through the API.
		AllowDirect: replicas == 1,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("nats: reports stream (at most %d bytes; lower --report-store-bytes if JetStream has less storage): %w", maxBytes, err)
	}
	obs, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      wire.BlobBucket,
		Description: "Fleetlearn model and module blobs by sha256",
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("nats: blob bucket: %w", err)
	}
	return st, obs, nil
}

// Connect dials url with reconnects that never give up: the aggregator and
// agents keep working through NATS restarts.
func Connect(url, name string, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	opts := append([]nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		nats.RetryOnFailedConnect(true),
		// A node that went silent (a partition, a host gone) is given up
		// after three unanswered pings, 15 to 20 s, and the connection
		// moves to another node; nats.go's default takes four minutes or
		// more, while rounds wait.
		nats.PingInterval(5 * time.Second),
		nats.MaxPingsOutstanding(3),
		// A write blocked on a node that is gone holds back the pings
		// too; nats.go's default gives it a minute.
		nats.FlusherTimeout(10 * time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", c.ConnectedUrl()) }),
	}, extra...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("nats: connect %s: %w", url, err)
	}
	return nc, nil
}
