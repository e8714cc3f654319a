// Package handoff passes one listening socket from server to server: a
// standby's forwarding API serves a port until the replica leads, then the
// real API serves the same port, with no moment in which the port is
// closed and a client would be refused.
//
// grpc.Server and http.Server close the listener they serve when they
// stop; each server here gets a lent listener whose Close ends only that
// server's share, while the socket stays open for the next.
package handoff

import (
	"errors"
	"net"
	"sync"
)

// ErrClosed is what a lent listener's Accept returns after its Close.
var ErrClosed = net.ErrClosed

// Listener owns a listening socket and lends it out.
type Listener struct {
	l     net.Listener
	conns chan net.Conn
	done  chan struct{} // closed when the socket's Accept fails for good
	err   error         // that failure, set before done closes
	stop  chan struct{} // closed by Close
	once  sync.Once
}

// New takes over l: one goroutine accepts from it until it is closed
// (Close, or its owner's Close of l) and hands each connection to the
// lent listener that asks for it first.
func New(l net.Listener) *Listener {
	h := &Listener{l: l, conns: make(chan net.Conn), done: make(chan struct{}), stop: make(chan struct{})}
	go h.accept()
	return h
}

func (h *Listener) accept() {
	for {
		c, err := h.l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			h.err = err
			close(h.done)
			return
		}
		select {
		case h.conns <- c:
		case <-h.stop:
			// Nobody will serve it: the client sees the close at once.
			c.Close()
		}
	}
}

// Close closes the socket; every lent listener's Accept fails, and a
// connection accepted while none was lent is closed. Safe to call twice.
func (h *Listener) Close() error {
	h.once.Do(func() { close(h.stop) })
	return h.l.Close()
}

// Addr is the socket's address.
func (h *Listener) Addr() net.Addr { return h.l.Addr() }

// Lend returns a listener that accepts the socket's connections until its
// own Close. Lend a new one only after the last is closed: two open at
// once share the connections between them.
func (h *Listener) Lend() net.Listener {
	return &lent{h: h, closed: make(chan struct{})}
}

type lent struct {
	h      *Listener
	closed chan struct{}
	once   sync.Once
}

func (l *lent) Accept() (net.Conn, error) {
	// A closed lent listener never takes a connection meant for the next.
	select {
	case <-l.closed:
		return nil, ErrClosed
	default:
	}
	select {
	case c := <-l.h.conns:
		return c, nil
	case <-l.closed:
		return nil, ErrClosed
	case <-l.h.done:
		return nil, l.h.err
	}
}

func (l *lent) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *lent) Addr() net.Addr { return l.h.l.Addr() }
