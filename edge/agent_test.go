package edge_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
)

// The tests in this file run agents against a real aggregator and check
// that each way an agent cannot work is told plainly and acted on: not
// enrolled, revoked, the server away, an enrollment refused.

func tinyDataset() *data.Dataset {
	return &data.Dataset{Dim: 1, NumClasses: 2, Features: []float32{0, 1}, Labels: []uint8{0, 1}}
}

// token mints a single-use enrollment token.
func token(t *testing.T, h *servertest.Harness) string {
	t.Helper()
	tok, err := h.Devices.CreateEnrollmentToken(t.Context(), &pb.CreateEnrollmentTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return tok.GetToken()
}

// enrolled enrolls device id into a fresh data directory and returns it.
func enrolled(t *testing.T, h *servertest.Harness, id string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "edge")
	if _, err := edge.Enroll(t.Context(), edge.EnrollConfig{API: h.GRPCAddr(), CAPEM: h.CACertPEM(), Token: token(t, h),
		DataDir: dir, DeviceID: id}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// logRecord is one line an agent logged.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// logCapture is a slog handler that keeps every record and lets a test wait
// for a message.
type logCapture struct {
	mu      sync.Mutex
	records []logRecord
	waiters map[string]chan struct{}
}

func newLogCapture() *logCapture { return &logCapture{waiters: map[string]chan struct{}{}} }

func (c *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (c *logCapture) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *logCapture) WithGroup(string) slog.Handler            { return c }
func (c *logCapture) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool { rec.attrs[a.Key] = a.Value.String(); return true })
	c.mu.Lock()
	defer c.mu.Unlock()
	c.records = append(c.records, rec)
	if ch, ok := c.waiters[r.Message]; ok {
		close(ch)
		delete(c.waiters, r.Message)
	}
	return nil
}

// logged returns a channel closed once msg has been logged.
func (c *logCapture) logged(msg string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan struct{})
	for _, r := range c.records {
		if r.msg == msg {
			close(ch)
			return ch
		}
	}
	if old, ok := c.waiters[msg]; ok {
		return old
	}
	c.waiters[msg] = ch
	return ch
}

// matching returns the records with msg at level.
func (c *logCapture) matching(level slog.Level, msg string) []logRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []logRecord
	for _, r := range c.records {
		if r.level == level && r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}

// run is an agent running on its own goroutine until the test ends.
type run struct {
	done chan struct{} // closed when Run has returned
	err  error         // what it returned
}

// wait returns Run's error once it has returned.
func (r *run) wait() error {
	<-r.done
	return r.err
}

func start(t *testing.T, a *edge.Agent) *run {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = a.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// TestNotEnrolled: an agent without credentials is refused before it
// writes anything or connects; one allowed to go without them
// (InsecureNATS) is refused by a server that requires them, with the same
// error, instead of retrying.
func TestNotEnrolled(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "edge")
	_, err := edge.New(edge.Config{DataDir: dir, NATSURL: "nats://127.0.0.1:4222"}, edge.WithDataset(tinyDataset()))
	if !errors.Is(err, edge.ErrNotEnrolled) || !strings.Contains(err.Error(), edge.CredsFile) {
		t.Fatalf("New without credentials: err = %v, want ErrNotEnrolled naming %s", err, edge.CredsFile)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused agent created its data directory: %v", err)
	}
	if _, err := edge.New(edge.Config{DataDir: dir, Credentials: filepath.Join(dir, "none.creds")}, edge.WithDataset(tinyDataset())); err == nil ||
		errors.Is(err, edge.ErrNotEnrolled) {
		t.Fatalf("New with a missing --creds file: err = %v, want the file named", err)
	}

	h := servertest.New(t)
	a, err := edge.New(edge.Config{DataDir: dir, NATSURL: h.NATSURL(), InsecureNATS: true, DeviceID: "dev-1"},
		edge.WithDataset(tinyDataset()))
	if err != nil {
		t.Fatal(err)
	}
	if err := start(t, a).wait(); !errors.Is(err, edge.ErrNotEnrolled) || !strings.Contains(err.Error(), "requires credentials") {
		t.Fatalf("Run without credentials against a secured server: err = %v, want ErrNotEnrolled", err)
	}
}

// TestRevoked: a running agent whose device the operator revokes stops
// with ErrRevoked, and so does one started again on the revoked
// credentials, at once, instead of reconnecting for ever.
func TestRevoked(t *testing.T) {
	h := servertest.New(t)
	dir := enrolled(t, h, "dev-1")
	logs := newLogCapture()
	a, err := edge.New(edge.Config{DataDir: dir, NATSURL: edge.SavedNATSURL(dir)}, edge.WithDataset(tinyDataset()),
		edge.WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, a)
	<-logs.logged("edge agent running")
	if _, err := h.Devices.RevokeDevice(t.Context(), &pb.RevokeDeviceRequest{DeviceId: "dev-1", Reason: "lost"}); err != nil {
		t.Fatal(err)
	}
	err = r.wait()
	if !errors.Is(err, edge.ErrRevoked) || !strings.Contains(err.Error(), "revoked by the operator") ||
		!strings.Contains(err.Error(), "user authentication revoked") {
		t.Fatalf("Run after revocation: err = %v, want ErrRevoked", err)
	}

	again, err := edge.New(edge.Config{DataDir: dir, NATSURL: edge.SavedNATSURL(dir)}, edge.WithDataset(tinyDataset()))
	if err != nil {
		t.Fatal(err)
	}
	err = start(t, again).wait()
	if !errors.Is(err, edge.ErrRevoked) || !strings.Contains(err.Error(), filepath.Join(dir, edge.CredsFile)) {
		t.Fatalf("Run on revoked credentials: err = %v, want ErrRevoked naming the creds file", err)
	}
}

// TestServerAway: an agent started while the aggregator is down keeps
// trying, with back-off on its clock and a warning that names the URL and
// what to check, repeated only now and then; it connects once the server is
// back.
func TestServerAway(t *testing.T) {
	h := servertest.New(t)
	dir := enrolled(t, h, "dev-1")
	natsURL := edge.SavedNATSURL(dir)
	u, err := url.Parse(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}

	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	logs := newLogCapture()
	a, err := edge.New(edge.Config{DataDir: dir, NATSURL: natsURL}, edge.WithDataset(tinyDataset()),
		edge.WithLogger(slog.New(logs)), edge.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, a)
	// armed waits until the agent sleeps before its next attempt: the only
	// timer on its clock until it connects.
	armed := func() {
		for {
			changed := clk.Changed()
			if clk.Pending() > 0 {
				return
			}
			select {
			case <-changed:
			case <-r.done:
				t.Fatalf("Run returned while the server was away: %v", r.err)
			}
		}
	}
	const msg = "cannot reach the aggregator's NATS server; retrying"
	attempts := 0
	var waited time.Duration
	for waited < 30*time.Minute {
		armed()
		attempts++
		before := clk.Now()
		clk.AdvanceToNext()
		waited += clk.Now().Sub(before)
	}
	armed()
	warns := logs.matching(slog.LevelWarn, msg)
	debugs := logs.matching(slog.LevelDebug, msg)
	if len(warns) == 0 {
		t.Fatal("no warning while the server was away")
	}
	w := warns[0]
	if w.attrs["url"] != natsURL || !strings.Contains(w.attrs["err"], "refused") || !strings.Contains(w.attrs["check"], "fleetlearn-server") {
		t.Errorf("warning %+v: want the URL, the dial error and what to check", w)
	}
	// Rate-limited: the first, then one per warning interval at most.
	if max := 1 + int(waited/(5*time.Minute)); len(warns) > max || len(warns)+len(debugs) < attempts {
		t.Errorf("%d warnings and %d debug lines over %d attempts in %v: want every attempt logged, at most %d as warnings",
			len(warns), len(debugs), attempts, waited, max)
	}
	// Back-off: 30 minutes of outage take far fewer attempts than one a second.
	if attempts > 60 {
		t.Errorf("%d attempts in %v: no back-off", attempts, waited)
	}

	h2 := servertest.New(t, servertest.WithDataDir(h.Dir), servertest.WithNATSListen(u.Host))
	running := logs.logged("edge agent running")
	clk.AdvanceToNext()
	select {
	case <-running:
	case <-r.done:
		t.Fatalf("Run returned once the server was back: %v", r.err)
	}
	if got := logs.matching(slog.LevelInfo, "connected to the aggregator's NATS server"); len(got) != 1 {
		t.Errorf("connected logs: %+v", got)
	}

	// Away again once connected: the connection reconnects by itself (on
	// nats.go's timers), with one warning for the loss.
	lost := logs.logged("lost the connection to the aggregator's NATS server; reconnecting")
	if err := h2.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-lost
	back := logs.logged("reconnected to the aggregator's NATS server")
	servertest.New(t, servertest.WithDataDir(h.Dir), servertest.WithNATSListen(u.Host))
	select {
	case <-back:
	case <-r.done:
		t.Fatalf("Run returned instead of reconnecting: %v", r.err)
	}
	if lost := logs.matching(slog.LevelWarn, "lost the connection to the aggregator's NATS server; reconnecting"); len(lost) != 1 {
		t.Errorf("%d warnings of the lost connection, want 1", len(lost))
	}
	if w := logs.matching(slog.LevelWarn, msg); len(w) != len(warns) {
		t.Errorf("%d more warnings while reconnecting, want none: the clock stood still", len(w)-len(warns))
	}
}

// TestEnrollRefused: an enrollment the server refuses says why once and
// what to do, and leaves the data directory as it was: absent, empty,
// holding files of its own, or holding the device key.
func TestEnrollRefused(t *testing.T) {
	h := servertest.New(t)
	tok := token(t, h)
	good := filepath.Join(t.TempDir(), "good")
	e, err := edge.Enroll(t.Context(), edge.EnrollConfig{API: h.GRPCAddr(), CAPEM: h.CACertPEM(), Token: tok, DataDir: good})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{edge.CAFile, "device-id", edge.CredsFile, edge.KeyFile, edge.NATSURLFile, edge.PublishersFile}
	if got := listDir(t, good); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("enrolled data directory holds %v, want %v", got, want)
	}
	for _, name := range want {
		if fi, err := os.Stat(filepath.Join(good, name)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v, want 0600", name, err, fi.Mode().Perm())
		}
	}
	if id, _ := os.ReadFile(filepath.Join(good, "device-id")); strings.TrimSpace(string(id)) != e.DeviceID {
		t.Errorf("device-id %q, want %q", id, e.DeviceID)
	}

	absent := filepath.Join(t.TempDir(), "a", "b")
	empty := t.TempDir()
	own := t.TempDir()
	os.WriteFile(filepath.Join(own, "notes"), []byte("mine"), 0o644)
	keyed := t.TempDir()
	if err := os.WriteFile(filepath.Join(keyed, edge.KeyFile), mustRead(t, filepath.Join(good, edge.KeyFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dir           string
		want          error
		cause, remedy string
	}{
		{absent, edge.ErrTokenRefused, "already used", "ask the operator for a new one"},
		{empty, edge.ErrTokenRefused, "already used", "ask the operator for a new one"},
		{own, edge.ErrTokenRefused, "already used", "ask the operator for a new one"},
		// The server looks at the key before it spends the token.
		{keyed, edge.ErrKeyRefused, "already enrolled", "run the agent with this data directory"},
	} {
		before := snapshot(t, c.dir)
		_, err := edge.Enroll(t.Context(), edge.EnrollConfig{API: h.GRPCAddr(), CAPEM: h.CACertPEM(), Token: tok, DataDir: c.dir})
		if !errors.Is(err, c.want) {
			t.Fatalf("enroll into %s: err = %v, want %v", c.dir, err, c.want)
		}
		msg := err.Error()
		if strings.Count(msg, c.cause) != 1 || !strings.Contains(msg, c.remedy) ||
			strings.Contains(msg, "rpc error") || strings.Contains(msg, "identity:") || strings.Count(msg, "enroll:") != 1 {
			t.Errorf("enroll into %s: %q, want the cause (%s) once and what to do", c.dir, msg, c.cause)
		}
		if after := snapshot(t, c.dir); after != before {
			t.Errorf("failed enrollment changed %s:\nbefore %s\nafter  %s", c.dir, before, after)
		}
	}
	if _, err := os.Stat(filepath.Dir(absent)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed enrollment left %s behind", filepath.Dir(absent))
	}

	// A revoked key cannot enroll again; the token it presented stays good.
	if _, err := h.Devices.RevokeDevice(t.Context(), &pb.RevokeDeviceRequest{DeviceId: e.DeviceID, Reason: "lost"}); err != nil {
		t.Fatal(err)
	}
	fresh := token(t, h)
	_, err = edge.Enroll(t.Context(), edge.EnrollConfig{API: h.GRPCAddr(), CAPEM: h.CACertPEM(), Token: fresh, DataDir: keyed})
	if !errors.Is(err, edge.ErrKeyRefused) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("enroll with a revoked key: err = %v, want ErrKeyRefused", err)
	}
	if _, err := edge.Enroll(t.Context(), edge.EnrollConfig{API: h.GRPCAddr(), CAPEM: h.CACertPEM(), Token: fresh, DataDir: t.TempDir()}); err != nil {
		t.Fatalf("the token a revoked key presented: %v", err)
	}

	// Nothing listening: unreachable, and nothing written.
	_, err = edge.Enroll(t.Context(), edge.EnrollConfig{API: "127.0.0.1:1", CAPEM: h.CACertPEM(), Token: tok, DataDir: absent})
	if !errors.Is(err, edge.ErrUnreachable) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("enroll with no server: err = %v, want ErrUnreachable with the dial error", err)
	}
	if _, err := os.Stat(filepath.Dir(absent)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed enrollment left %s behind", filepath.Dir(absent))
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// snapshot describes dir's files, contents and modes ("absent" if missing).
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return "absent"
	}
	var b strings.Builder
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %v", path, fi.Mode())
		if !d.IsDir() {
			c, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %q", c)
		}
		b.WriteString("; ")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
