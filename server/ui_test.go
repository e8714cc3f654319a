package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/model/train"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// dashboardFixture is a server with its dashboard on, a fleet and a DP
// task that has run to completion, and tokens for two roles.
type dashboardFixture struct {
	h                 *servertest.Harness
	url               string
	task              *pb.Task
	rounds            []*pb.RoundSummary
	operator, auditor string
}

// newDashboardFixture runs a three-round central-DP task on four agents
// with the dashboard served over TLS.
func newDashboardFixture(t *testing.T) *dashboardFixture {
	t.Helper()
	h := servertest.New(t, servertest.WithPace(50*time.Millisecond),
		servertest.WithConfig(func(c *server.Config) { c.UIAddr = "127.0.0.1:0" }))
	init, _ := train.InitMLP([]int{8, 3}, 1)
	version := h.ImportModel(t, "synthetic", init)
	module := h.RegisterModule(t, "softmax", wasmtest.Build(t, wasmtest.Softmax))
	startFleet(t, h, 4, func(i int) *data.Dataset { return datatest.Synthetic(120, 8, 3, uint64(i+1)) })
	task := baseTask("dashboard", version, module, 3)
	task.CohortTarget, task.OverSelection, task.ReportGoal = 3, 0, 3
	task.SelectionTimeout = durationpb.New(10 * time.Second)
	evalDir := filepath.Join(t.TempDir(), "eval")
	if err := data.WriteDir(evalDir, datatest.Synthetic(300, 8, 3, 99), "heldout"); err != nil {
		t.Fatal(err)
	}
	task.ServerEvalDataset = evalDir
	task.Dp = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 5, NoiseMultiplier: 0.5,
		TargetEpsilon: 500, Delta: 1e-5}
	created := h.CreateTask(t, task)
	done := h.WaitTask(t, created.Id, 2*time.Minute, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED,
		pb.TaskState_TASK_STATE_STOPPED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	// The entry page proves inclusion in the latest checkpoint, which the
	// server signs every second while the log grows: wait for one that
	// covers entry 0, the one the tests open.
	audits := apiv1.NewAuditServiceClient(h.Conn)
	for {
		cp, err := audits.GetCheckpoint(t.Context(), &pb.GetCheckpointRequest{})
		if err == nil && checkpointSize(t, cp.GetCheckpoint().GetNote()) > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	f := &dashboardFixture{h: h, url: h.UIURL(), task: done, rounds: h.Rounds(t, done.Id)}
	var err error
	if f.operator, err = h.MintToken("olga", []identity.Role{identity.RoleOperator}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if f.auditor, err = h.MintToken("ada", []identity.Role{identity.RoleAuditor}, time.Hour); err != nil {
		t.Fatal(err)
	}
	return f
}

// checkpointSize reads a checkpoint note's tree size (its second line)
// without verifying it: the pages under test do that.
func checkpointSize(t *testing.T, note []byte) uint64 {
	lines := strings.SplitN(string(note), "\n", 3)
	if len(lines) < 2 {
		return 0
	}
	n, err := strconv.ParseUint(lines[1], 10, 64)
	if err != nil {
		t.Fatalf("checkpoint note %q", note)
	}
	return n
}

// committed returns the task's committed rounds and the last one's
// accuracy and ε, as the API states them.
func (f *dashboardFixture) committed(t *testing.T) (n int, accuracy, epsilon float64) {
	t.Helper()
	for _, r := range f.rounds {
		if r.State == pb.RoundState_ROUND_STATE_COMMITTED {
			n++
			accuracy = r.Metrics.GetValues()["server_accuracy"]
		}
		if r.EpsilonSpent > 0 {
			epsilon = r.EpsilonSpent
		}
	}
	if n == 0 || epsilon == 0 {
		t.Fatalf("fixture: %d committed rounds, ε %v", n, epsilon)
	}
	return n, accuracy, epsilon
}

// browser is an HTTP client with a cookie jar that trusts the server's CA
// and sends Origin as a browser does.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newBrowser(t *testing.T, f *dashboardFixture) *browser {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(f.h.CACertPEM()) {
		t.Fatal("CA")
	}
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: f.url, c: &http.Client{Jar: jar,
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *browser) do(method, path string, form url.Values, hdr map[string]string) (*http.Response, string) {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", b.base)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	s, _ := io.ReadAll(resp.Body)
	return resp, string(s)
}

func (b *browser) get(path string) (int, string) {
	b.t.Helper()
	resp, body := b.do("GET", path, nil, nil)
	return resp.StatusCode, body
}

func (b *browser) login(token string) {
	b.t.Helper()
	resp, body := b.do("POST", "/login", url.Values{"token": {token}}, nil)
	if resp.StatusCode != http.StatusSeeOther {
		b.t.Fatalf("login: %d %s", resp.StatusCode, body)
	}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// TestDashboard: pages drawn from a running server agree with its API,
// roles decide what each viewer sees and may do, and forged requests are
// refused.
func TestDashboard(t *testing.T) {
	f := newDashboardFixture(t)
	n, accuracy, epsilon := f.committed(t)

	t.Run("operator", func(t *testing.T) {
		b := newBrowser(t, f)
		b.login(f.operator)
		resp, body := b.do("GET", "/", nil, nil)
		if resp.StatusCode != 200 || !strings.Contains(body, f.task.Id) {
			t.Fatalf("overview: %d\n%s", resp.StatusCode, body)
		}
		for _, h := range []string{"Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options", "Strict-Transport-Security"} {
			if resp.Header.Get(h) == "" {
				t.Errorf("overview lacks %s", h)
			}
		}
		if !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
			t.Errorf("CSP %q", resp.Header.Get("Content-Security-Policy"))
		}
		if !strings.Contains(body, `id="fleet-enrolled">4<`) {
			t.Errorf("overview does not count 4 enrolled devices")
		}
		code, body := b.get("/tasks/" + f.task.Id)
		if code != 200 {
			t.Fatalf("task page: %d %s", code, body)
		}
		if want := fmt.Sprintf(`data-metric="server_accuracy" data-points="%d"`, n); !strings.Contains(body, want) {
			t.Errorf("task page lacks %s", want)
		}
		if want := fmt.Sprintf(`id="epsilon" data-value="%v"`, epsilon); !strings.Contains(body, want) {
			t.Errorf("task page lacks %s", want)
		}
		if want := fmt.Sprintf(`data-value="%v"`, accuracy); !strings.Contains(body, want) {
			t.Errorf("task page lacks the last accuracy %s", want)
		}
		code, svg := b.get("/tasks/" + f.task.Id + "/charts/server_accuracy")
		if code != 200 || !strings.HasPrefix(svg, "<?xml") {
			t.Fatalf("chart: %d %.200s", code, svg)
		}
		if got := strings.Count(strings.ToUpper(svg), "FILL:#1F6FB4"); got != n {
			t.Errorf("accuracy chart has %d points, want %d", got, n)
		}
		code, body = b.get("/devices")
		if code != 200 || strings.Count(body, `action="/devices/`) != 4 {
			t.Errorf("operator's fleet page: %d, %d revoke forms", code, strings.Count(body, `action="/devices/`))
		}
		// Operators read checkpoints, not entries.
		code, body = b.get("/audit")
		if code != 200 || !strings.Contains(body, "Not shown to your roles") || !strings.Contains(body, "signature verified") {
			t.Errorf("operator's audit page: %d\n%s", code, body)
		}
		code, body = b.get("/tasks/" + f.task.Id + "/rounds/1")
		if code != 200 || !strings.Contains(body, "Selection") {
			t.Errorf("round page: %d", code)
		}
	})

	t.Run("auditor", func(t *testing.T) {
		b := newBrowser(t, f)
		b.login(f.auditor)
		code, body := b.get("/devices")
		if code != 200 || strings.Contains(body, "Revoke") {
			t.Fatalf("auditor's fleet page: %d, offers revocation: %v", code, strings.Contains(body, "Revoke"))
		}
		code, body = b.get("/audit?task=" + f.task.Id + "&type=round.opened")
		if code != 200 || strings.Count(body, `data-type="round.opened"`) < n {
			t.Fatalf("auditor's audit page: %d\n%s", code, body)
		}
		code, body = b.get("/audit/entries/0")
		if code != 200 || !strings.Contains(body, "proved in checkpoint") {
			t.Fatalf("entry page: %d\n%s", code, body)
		}
		code, body = b.get("/tasks/" + f.task.Id + "/rounds/1")
		if code != 200 || !strings.Contains(body, `data-type="round.opened"`) {
			t.Errorf("auditor's round timeline lacks the audit events: %d", code)
		}
		// A hand-made form post with the auditor's own session token is
		// refused by the API, and the device stays enrolled.
		_, page := b.get("/")
		m := csrfField.FindStringSubmatch(page)
		if m == nil {
			t.Fatal("no form token on the auditor's overview")
		}
		resp, body := b.do("POST", "/devices/dev-000/revoke", url.Values{"csrf": {m[1]}}, nil)
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("auditor's revoke: %d %s", resp.StatusCode, body)
		}
		devs, err := f.h.Devices.ListDevices(t.Context(), &pb.ListDevicesRequest{})
		if err != nil || len(devs.Devices) != 4 {
			t.Fatalf("devices after the auditor's attempt: %v %v", len(devs.GetDevices()), err)
		}
	})

	t.Run("forgery", func(t *testing.T) {
		b := newBrowser(t, f)
		resp, _ := b.do("GET", "/tasks/"+f.task.Id, nil, nil)
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
			t.Fatalf("no session: %d %s", resp.StatusCode, resp.Header.Get("Location"))
		}
		if code, _ := b.get("/tasks/" + f.task.Id + "/events"); code != http.StatusUnauthorized {
			t.Errorf("event stream without a session: %d", code)
		}
		resp, body := b.do("POST", "/login", url.Values{"token": {"not-a-token"}}, nil)
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "refused") {
			t.Errorf("bad token: %d", resp.StatusCode)
		}
		resp, _ = b.do("POST", "/login", url.Values{"token": {f.operator}, "next": {"//evil.example/"}}, nil)
		if loc := resp.Header.Get("Location"); loc != "/" {
			t.Errorf("open redirect after sign-in: %q", loc)
		}
		code, page := b.get("/devices")
		m := csrfField.FindStringSubmatch(page)
		if code != 200 || m == nil {
			t.Fatalf("operator's fleet page has no form token: %d", code)
		}
		resp, _ = b.do("POST", "/devices/dev-001/revoke", url.Values{"csrf": {m[1]}}, map[string]string{"Origin": "https://evil.example"})
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("cross-origin revoke: %d", resp.StatusCode)
		}
		resp, _ = b.do("POST", "/devices/dev-001/revoke", url.Values{"csrf": {"forged"}}, nil)
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("revoke with a forged form token: %d", resp.StatusCode)
		}
		if code, _ := b.get("/tasks/" + f.task.Id + "/charts/" + url.PathEscape("<script>")); code != http.StatusBadRequest {
			t.Errorf("chart of a hostile metric name: %d", code)
		}
		if code, _ := b.get("/tasks/no-such-task"); code != http.StatusNotFound {
			t.Errorf("unknown task: %d", code)
		}
		if code, _ := b.get("/audit/entries/" + strconv.Itoa(1<<30)); code != http.StatusForbidden && code != http.StatusNotFound {
			t.Errorf("entry beyond the log: %d", code)
		}
		devs, err := f.h.Devices.ListDevices(t.Context(), &pb.ListDevicesRequest{})
		if err != nil || len(devs.Devices) != 4 {
			t.Fatalf("devices after forged requests: %v %v", len(devs.GetDevices()), err)
		}
		// The genuine form works.
		resp, body = b.do("POST", "/devices/dev-003/revoke", url.Values{"csrf": {m[1]}, "reason": {"lost"}}, nil)
		if resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("operator's revoke: %d %s", resp.StatusCode, body)
		}
		if _, body := b.get("/devices"); !strings.Contains(body, `id="fleet-revoked">1<`) {
			t.Errorf("the fleet page does not show the revocation")
		}
	})
}

// TestDashboardConfig: a plaintext dashboard is refused off loopback.
func TestDashboardConfig(t *testing.T) {
	_, err := server.New(server.Config{DataDir: t.TempDir(), UIAddr: "0.0.0.0:8443", UIInsecure: true})
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("plaintext dashboard on every interface: %v", err)
	}
	if _, err := server.New(server.Config{DataDir: t.TempDir(), UIAddr: "127.0.0.1:0", UIInsecure: true}); err != nil {
		t.Fatalf("plaintext dashboard on loopback: %v", err)
	}
}

// TestDashboardStreamShares: against a real server, a pool-worker token
// (any job script can read one) signed in to the dashboard cannot hold its
// live streams: past its own four it is refused with 429 and Retry-After,
// the refusal is counted, and the operator's pages stay live.
func TestDashboardStreamShares(t *testing.T) {
	h := servertest.New(t, servertest.WithConfig(func(c *server.Config) { c.UIAddr = "127.0.0.1:0" }))
	f := &dashboardFixture{h: h, url: h.UIURL()}
	worker, err := h.MintToken("job-7", []identity.Role{identity.RolePoolWorker}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	operator, err := h.MintToken("olga", []identity.Role{identity.RoleOperator}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var cancels []func()
	// Streams end before the server stops, also when the test stops early.
	t.Cleanup(func() {
		for _, c := range cancels {
			c()
		}
	})
	stream := func(b *browser) *http.Response {
		t.Helper()
		ctx, cancel := context.WithCancel(t.Context())
		req, _ := http.NewRequestWithContext(ctx, "GET", b.base+"/events", nil)
		resp, err := b.c.Do(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		cancels = append(cancels, func() { cancel(); resp.Body.Close() })
		return resp
	}
	viewer := newBrowser(t, f)
	viewer.login(worker)
	for i := range 4 {
		if resp := stream(viewer); resp.StatusCode != http.StatusOK {
			t.Fatalf("viewer's stream %d: %s", i+1, resp.Status)
		}
	}
	for range 3 {
		resp := stream(viewer)
		msg, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
			!strings.Contains(string(msg), "4 live dashboard pages open") {
			t.Fatalf("viewer's stream past its share: %s, Retry-After %q: %s", resp.Status, resp.Header.Get("Retry-After"), msg)
		}
	}
	op := newBrowser(t, f)
	op.login(operator)
	if resp := stream(op); resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("operator's stream beside the viewer's: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	m := scrape(t, h)
	if got := series(t, m, `fleetlearn_ui_stream_refusals_total{reason="principal"}`); got != 3 {
		t.Errorf("refusals for the viewer's share counted %v, want 3", got)
	}
	if got := series(t, m, `fleetlearn_ui_stream_refusals_total{reason="reserved"}`); got != 0 {
		t.Errorf("refusals for the reserve counted %v, want 0", got)
	}
}
