package edge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetlearn/fleetlearn/internal/backoff"
	"github.com/fleetlearn/fleetlearn/internal/clock"
)

// Connection timing.
const (
	// connectBackoff and connectBackoffMax space the attempts to reach a
	// NATS server that is not there yet (the aggregator down, or the
	// network): a fleet waiting out an outage does not hammer it.
	connectBackoff, connectBackoffMax = time.Second, time.Minute
	// warnEvery bounds how often a warning about an unreachable server is
	// repeated; the attempts in between are logged at debug level.
	warnEvery = 5 * time.Minute
	// dialTimeout bounds one TCP dial to the NATS server.
	dialTimeout = 5 * time.Second
)

// stopper ends an agent's run and keeps the first reason given.
type stopper struct {
	cancel context.CancelFunc
	mu     sync.Mutex
	fatal  error
}

func newStopper(parent context.Context) (context.Context, *stopper) {
	ctx, cancel := context.WithCancel(parent)
	return ctx, &stopper{cancel: cancel}
}

// stop ends the run for err.
func (s *stopper) stop(err error) {
	s.mu.Lock()
	if s.fatal == nil {
		s.fatal = err
	}
	s.mu.Unlock()
	s.cancel()
}

// err is why the run was stopped, nil when its context ended.
func (s *stopper) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fatal
}

// agentPingInterval is how often an agent pings its NATS server when the
// connection is otherwise quiet: a few bytes each way, four times a
// minute, buy noticing a silent server within 30 to 45 s.
const agentPingInterval = 15 * time.Second

// agentWriteTimeout bounds a write to the NATS server (see Run).
const agentWriteTimeout = 20 * time.Second

// connect dials the NATS server until it answers, waiting between attempts
// with back-off on the agent's clock. It returns (nil, nil) when ctx ends
// first, and an error when the server refuses the agent's credentials:
// waiting would not change that. The connection it returns reconnects on
// its own, and its handlers stop the run through st when NATS revokes the
// credentials or gives up on them.
func (a *Agent) connect(ctx context.Context, st *stopper, opts []nats.Option) (*nats.Conn, error) {
	dialer := &recordingDialer{d: net.Dialer{Timeout: dialTimeout}}
	warn := &warnLimiter{clk: a.o.clock, every: warnEvery}
	opts = append(opts, nats.SetCustomDialer(dialer), a.handlers(ctx, st, dialer, warn))
	b := backoff.New(connectBackoff, connectBackoffMax, a.jitter)
	start := a.o.clock.Now()
	for {
		dialer.reset()
		nc, err := nats.Connect(a.cfg.NATSURL, opts...)
		if err == nil {
			warn.reset()
			if n := b.Attempts(); n > 0 {
				a.o.log.Info("connected to the aggregator's NATS server", "url", a.cfg.NATSURL, "attempts", n+1,
					"after", a.o.clock.Now().Sub(start).Round(time.Second))
			}
			return nc, nil
		}
		if refused := a.refusal(err); refused != nil {
			return nil, refused
		}
		wait := b.Next()
		a.unreachable(warn, "cannot reach the aggregator's NATS server; retrying", dialer.cause(err),
			"attempt", b.Attempts(), "retry_in", wait.Round(time.Millisecond))
		if !clock.Sleep(a.o.clock, wait, ctx.Done()) {
			return nil, st.err()
		}
	}
}

// handlers turns what the NATS connection reports into log lines an
// operator can act on, and stops the run when the credentials are gone.
// Without them nats.go would print its errors raw to standard error.
func (a *Agent) handlers(ctx context.Context, st *stopper, dialer *recordingDialer, warn *warnLimiter) nats.Option {
	return func(o *nats.Options) error {
		o.AsyncErrorCB = func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				a.o.log.Warn("NATS subscription error", "subject", sub.Subject, "err", err)
				return
			}
			// A revocation is final at once. An authorization violation
			// is final only when it repeats, and nats.go then closes the
			// connection (the closed handler below).
			if errors.Is(err, nats.ErrAuthRevoked) {
				st.stop(a.refusal(err))
				return
			}
			a.o.log.Warn("NATS error", "url", a.cfg.NATSURL, "err", err)
		}
		o.DisconnectedErrCB = func(_ *nats.Conn, err error) {
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				err = errors.New("connection closed by the server")
			}
			a.unreachable(warn, "lost the connection to the aggregator's NATS server; reconnecting", err)
		}
		o.ReconnectErrCB = func(_ *nats.Conn, err error) {
			if ctx.Err() == nil {
				a.unreachable(warn, "cannot reach the aggregator's NATS server; retrying", dialer.cause(err))
			}
		}
		o.ReconnectedCB = func(*nats.Conn) {
			warn.reset()
			a.o.log.Info("reconnected to the aggregator's NATS server", "url", a.cfg.NATSURL)
		}
		o.ClosedCB = func(nc *nats.Conn) {
			if ctx.Err() != nil {
				return // the agent closed it
			}
			err := a.refusal(nc.LastError())
			if err == nil {
				err = fmt.Errorf("edge: the NATS connection to %s closed: %v", a.cfg.NATSURL, nc.LastError())
			}
			st.stop(err)
		}
		return nil
	}
}

// unreachable logs a failed attempt to reach the NATS server: as a warning
// that says what to check, at most once per warnEvery, else at debug level.
func (a *Agent) unreachable(warn *warnLimiter, msg string, err error, attrs ...any) {
	ok, held := warn.allow()
	if !ok {
		a.o.log.Debug(msg, append([]any{"url", a.cfg.NATSURL, "err", err}, attrs...)...)
		return
	}
	check := "is the aggregator (fleetlearn-server) running, and its NATS port reachable from this device " +
		"(for devices on other hosts the server needs --public-host)? The URL comes from enrollment (" +
		filepath.Join(a.cfg.DataDir, NATSURLFile) + ") or --nats-url"
	if s := err.Error(); strings.Contains(s, "x509") || strings.Contains(s, "tls:") {
		check = "the NATS server's TLS certificate must chain to the CA stored at enrollment (" +
			filepath.Join(a.cfg.DataDir, CAFile) + ") and name the URL's host"
	}
	attrs = append([]any{"url", a.cfg.NATSURL, "err", err}, attrs...)
	if held > 0 {
		attrs = append(attrs, "not_shown", held, "repeats_every", warnEvery)
	}
	a.o.log.Warn(msg, append(attrs, "check", check)...)
}

// refusal is the error that stops the agent when err says NATS will not
// take its credentials, else nil.
func (a *Agent) refusal(err error) error {
	if err == nil {
		return nil
	}
	e := strings.ToLower(err.Error())
	switch {
	case errors.Is(err, nats.ErrAuthRevoked) || strings.Contains(e, nats.AUTHENTICATION_REVOKED_ERR):
		// The reason the operator gave stays on the server: NATS closes
		// the connection before anything else could be said on it.
		return fmt.Errorf("%w: NATS at %s ended the device's connection (user authentication revoked)", ErrRevoked, a.cfg.NATSURL)
	case errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		strings.Contains(e, nats.AUTHORIZATION_ERR) || strings.Contains(e, nats.AUTHENTICATION_EXPIRED_ERR):
		if a.creds == "" {
			return fmt.Errorf("%w: NATS at %s requires credentials", ErrNotEnrolled, a.cfg.NATSURL)
		}
		return fmt.Errorf("%w (or the device enrolled with another server): NATS at %s refuses the credentials in %s (%v)",
			ErrRevoked, a.cfg.NATSURL, a.creds, err)
	}
	return nil
}

// recordingDialer keeps the last dial error: nats.go reports a server it
// could not dial only as "no servers available", which names no cause.
type recordingDialer struct {
	d   net.Dialer
	mu  sync.Mutex
	err error
}

func (r *recordingDialer) Dial(network, address string) (net.Conn, error) {
	c, err := r.d.Dial(network, address)
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
	return c, err
}

func (r *recordingDialer) reset() {
	r.mu.Lock()
	r.err = nil
	r.mu.Unlock()
}

// cause is the dial error behind err, when err is nats.go's "no servers".
func (r *recordingDialer) cause(err error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil && (err == nil || errors.Is(err, nats.ErrNoServers)) {
		return r.err
	}
	if err == nil {
		return errors.New("unknown error")
	}
	return err
}

// warnLimiter lets a repeated warning through at most once per every, and
// counts the ones it held back.
type warnLimiter struct {
	clk   clock.Clock
	every time.Duration

	mu   sync.Mutex
	last time.Time // zero: none shown since the last reset
	held int
}

func (l *warnLimiter) allow() (ok bool, held int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		l.held++
		return false, 0
	}
	l.last, held, l.held = now, l.held, 0
	return true, held
}

// reset lets the next warning through: the trouble ended.
func (l *warnLimiter) reset() {
	l.mu.Lock()
	l.last, l.held = time.Time{}, 0
	l.mu.Unlock()
}
