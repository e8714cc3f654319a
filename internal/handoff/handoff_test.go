package handoff_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/handoff"
)

// TestHandOver serves a port with one http.Server, stops it, and serves
// the same port with another: the socket never closes, and each request
// reaches the server serving at its time.
func TestHandOver(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := handoff.New(ln)
	t.Cleanup(func() { h.Close() })
	url := "http://" + h.Addr().String()
	get := func() string {
		t.Helper()
		// A fresh connection each time: keep-alive would stay with the
		// server that accepted it.
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		res, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
	serve := func(name string) (*http.Server, chan error) {
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name) })}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(h.Lend()) }()
		return srv, done
	}

	first, done := serve("standby")
	if got := get(); got != "standby" {
		t.Fatalf("first server: %q", got)
	}
	first.Close() // closes its lent listener only
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("first Serve: %v", err)
	}
	// Between the two servers the socket still accepts: the request waits
	// for the next server rather than being refused.
	got := make(chan string, 1)
	go func() { got <- get() }()
	second, done := serve("leader")
	if g := <-got; g != "leader" {
		t.Fatalf("request made between the servers: %q", g)
	}
	if g := get(); g != "leader" {
		t.Fatalf("second server: %q", g)
	}
	second.Close()
	<-done
}

// TestCloseEndsLent: closing the socket fails every lent listener's Accept.
func TestCloseEndsLent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := handoff.New(ln)
	l := h.Lend()
	errc := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		errc <- err
	}()
	h.Close()
	h.Close()
	if err := <-errc; err == nil {
		t.Fatal("Accept after Close succeeded")
	}
	if _, err := net.Dial("tcp", h.Addr().String()); err == nil {
		t.Fatal("the socket still accepts after Close")
	}
	// A closed lent listener refuses at once, too.
	l2 := h.Lend()
	l2.Close()
	if _, err := l2.Accept(); !errors.Is(err, handoff.ErrClosed) {
		t.Fatalf("Accept on a closed lent listener: %v", err)
	}
}
