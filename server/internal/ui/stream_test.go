package ui

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/clock"
)

// TestRefreshStream: the refresh tick follows the injected clock, and
// streams beyond the limit are turned away with 503 and Retry-After (the
// page says so and asks again later) rather than held open.
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
	if second.StatusCode != http.StatusServiceUnavailable || second.Header.Get("Retry-After") == "" {
		t.Fatalf("stream beyond the limit: %d, Retry-After %q", second.StatusCode, second.Header.Get("Retry-After"))
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

// TestStreamShares: one viewer cannot hold the dashboard's live streams.
// A pool-worker token (any job script can read one) opening stream after
// stream is refused past its own share with 429, viewers together cannot
// take the streams kept for operators and auditors, an operator still gets
// a stream when viewers hold all they may, and streams come back when their
// clients go away, on a refusal's way out and when the API refuses.
func TestStreamShares(t *testing.T) {
	conn, err := grpc.NewClient("passthrough:///unused", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	principals := map[string]identity.Principal{
		"job-a": {Subject: "job-a", Roles: []identity.Role{identity.RolePoolWorker}},
		"job-b": {Subject: "job-b", Roles: []identity.Role{identity.RolePoolWorker}},
		"job-c": {Subject: "job-c", Roles: []identity.Role{identity.RolePoolWorker}},
		"olga":  {Subject: "olga", Roles: []identity.Role{identity.RoleOperator}},
		"audra": {Subject: "audra", Roles: []identity.Role{identity.RoleAuditor}},
	}
	var mu sync.Mutex
	refusals := map[string]int{}
	h, err := New(Config{API: conn, Authenticate: func(tok string) (identity.Principal, error) {
		p, ok := principals[tok]
		if !ok {
			return identity.Principal{}, errors.New("unknown token")
		}
		return p, nil
	}}, WithClock(clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))),
		WithMaxStreams(8), WithStreamsPerPrincipal(3), WithStreamReserve(2),
		WithStreamRefused(func(reason string) { mu.Lock(); refusals[reason]++; mu.Unlock() }))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	type stream struct {
		resp   *http.Response
		cancel context.CancelFunc
	}
	var held []stream
	// Close waits for the streams' handlers: end them first, also when
	// the test stops early.
	t.Cleanup(func() {
		for _, s := range held {
			s.cancel()
			s.resp.Body.Close()
		}
	})
	open := func(tok, path string) *http.Response {
		t.Helper()
		ctx, cancel := context.WithCancel(t.Context())
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+path, nil)
		req.AddCookie(&http.Cookie{Name: cookieName, Value: tok})
		resp, err := srv.Client().Do(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusOK {
			held = append(held, stream{resp, cancel})
		} else {
			resp.Body.Close()
			cancel()
		}
		return resp
	}
	want := func(what string, resp *http.Response, code int) {
		t.Helper()
		if resp.StatusCode != code {
			t.Fatalf("%s: %d, want %d", what, resp.StatusCode, code)
		}
		if code != http.StatusOK && resp.Header.Get("Retry-After") != "30" {
			t.Errorf("%s: Retry-After %q, want 30", what, resp.Header.Get("Retry-After"))
		}
	}
	// Streams are counted before their answer is sent.
	wantHeld := func(streams, principals int) {
		t.Helper()
		if s, p := h.streams.open(); s != streams || p != principals {
			t.Fatalf("%d streams held by %d principals, want %d by %d", s, p, streams, principals)
		}
	}
	wantOpen := func(streams, principals int) {
		t.Helper()
		// A stream is given back when its handler sees the client gone,
		// which the server notices on its own time: wait for it.
		for {
			s, p := h.streams.open()
			if s == streams && p == principals {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}

	// One viewer, stream after stream: its share, then 429.
	for i := range 3 {
		want(fmt.Sprintf("job-a stream %d", i+1), open("job-a", "/events"), http.StatusOK)
	}
	for range 5 {
		want("job-a past its share", open("job-a", "/events"), http.StatusTooManyRequests)
	}
	// Viewers together: up to the reserve, then 503 for every viewer.
	for i := range 3 {
		want(fmt.Sprintf("job-b stream %d", i+1), open("job-b", "/events"), http.StatusOK)
	}
	want("job-c into the reserve", open("job-c", "/events"), http.StatusServiceUnavailable)
	// The operator and the auditor still get theirs, until all are taken.
	want("operator while viewers hold all they may", open("olga", "/events"), http.StatusOK)
	want("auditor while viewers hold all they may", open("audra", "/events"), http.StatusOK)
	want("operator when all are taken", open("olga", "/events"), http.StatusServiceUnavailable)
	wantHeld(8, 4)

	// Clients going away give their streams back: job-a's three.
	for _, s := range held[:3] {
		s.cancel()
		s.resp.Body.Close()
	}
	held = held[3:]
	wantOpen(5, 3)
	want("job-c once job-a has gone", open("job-c", "/events"), http.StatusOK)
	wantHeld(6, 4)

	// A task's stream is admitted before the API is asked; the operator
	// (one stream held) is refused at its share without an API call, and
	// a stream the API then refuses is given back.
	if resp := open("olga", "/tasks/t-1/events"); resp.StatusCode == http.StatusOK || resp.Header.Get("Retry-After") != "" {
		t.Fatalf("operator's task stream, with no API to ask: %d, Retry-After %q; want the API's error", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	wantOpen(6, 4)
	want("operator's second stream", open("olga", "/events"), http.StatusOK)
	want("operator's third stream", open("olga", "/events"), http.StatusOK)
	want("operator's task stream past its share", open("olga", "/tasks/t-1/events"), http.StatusTooManyRequests)

	for _, s := range held {
		s.cancel()
		s.resp.Body.Close()
	}
	held = nil
	wantOpen(0, 0)
	mu.Lock()
	defer mu.Unlock()
	if refusals[StreamRefusedPrincipal] != 6 || refusals[StreamRefusedReserved] != 1 || refusals[StreamRefusedFull] != 1 {
		t.Errorf("refusals counted %v, want 6 principal, 1 reserved, 1 full", refusals)
	}
}
