package ui

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/clock"
)

// TestRefreshStream: the refresh tick follows the injected clock, and
// streams beyond the limit are turned away with 204 (EventSource stops
// retrying) rather than held open.
func TestRefreshStream(t *testing.T) {
	// The refresh stream makes no API call: a connection that is never
	// dialled will do.
	conn, err := grpc.NewClient("passthrough:///unused", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	h, err := New(Config{API: conn, Authenticate: func(tok string) (identity.Principal, error) {
		return identity.Principal{Subject: "ada", Roles: []identity.Role{identity.RoleAuditor}}, nil
	}}, WithClock(fake), WithMaxStreams(1), WithRefresh(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func() *http.Response {
		req, _ := http.NewRequest("GET", srv.URL+"/events", nil)
		req.AddCookie(&http.Cookie{Name: cookieName, Value: "tok"})
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	first := get()
	defer first.Body.Close()
	if first.StatusCode != 200 || first.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("first stream: %d %s", first.StatusCode, first.Header.Get("Content-Type"))
	}
	second := get()
	second.Body.Close()
	if second.StatusCode != http.StatusNoContent {
		t.Fatalf("stream beyond the limit: %d", second.StatusCode)
	}
	// The ticker exists once the handler runs; advance until it fires.
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(first.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	for fake.Pending() == 0 {
		time.Sleep(time.Millisecond)
	}
	fake.Advance(time.Second)
	if l := <-lines; !strings.HasPrefix(l, "event: refresh") {
		t.Fatalf("first line %q", l)
	}
	if code := func() int { r, _ := http.Get(srv.URL + "/events"); r.Body.Close(); return r.StatusCode }(); code != http.StatusUnauthorized {
		t.Fatalf("stream without a session: %d", code)
	}
}
