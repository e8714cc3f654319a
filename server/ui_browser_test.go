package server_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"image/png"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/identity"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// browserGuard bounds each step against a hung browser; no step needs
// anywhere near it.
const browserGuard = 2 * time.Minute

// findChromium returns the browser's path, or skips the test without one
// (outside CI, which installs it).
func findChromium(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed; CI installs it (.ci/run)")
	}
	t.Skip("chromium is not installed: the dashboard's in-browser test needs it (apt-get install chromium)")
	return ""
}

// serverSPKI is the base64 SHA-256 of the dashboard's leaf certificate's
// public key, the pin Chromium's ignore-certificate-errors-spki-list takes:
// the browser trusts that one key and nothing else it would not already.
func serverSPKI(t *testing.T, f *dashboardFixture) string {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(f.h.CACertPEM()) {
		t.Fatal("server CA: no certificate in PEM")
	}
	host, _, err := net.SplitHostPort(strings.TrimPrefix(f.url, "https://"))
	if err != nil {
		t.Fatalf("dashboard URL %q: %v", f.url, err)
	}
	conn, err := tls.Dial("tcp", strings.TrimPrefix(f.url, "https://"), &tls.Config{RootCAs: pool, ServerName: host})
	if err != nil {
		t.Fatalf("dial the dashboard: %v", err)
	}
	defer conn.Close()
	leaf := conn.ConnectionState().PeerCertificates[0]
	sum := sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
	return base64.StdEncoding.EncodeToString(sum[:])
}

// artifactDir is where the screenshots go, for a person (or CI's artifact
// upload) to look at.
func artifactDir(t *testing.T) string {
	t.Helper()
	root := os.Getenv("FLEETLEARN_ARTIFACTS")
	if root == "" {
		root = filepath.Join(os.TempDir(), "fleetlearn-artifacts")
	}
	dir := filepath.Join(root, "ui")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tab is one signed-in viewer's page, in a browser context of its own (its
// own cookie jar), with what its console reported.
type tab struct {
	t    *testing.T
	ctx  context.Context
	base string
	shot string // screenshot directory
	role string

	mu       sync.Mutex
	problems []string // CSP violations and uncaught exceptions
	console  []string // everything else of level error or warning
}

func newTab(t *testing.T, browser context.Context, base, shot, role string) *tab {
	tb := &tab{t: t, base: base, shot: shot, role: role}
	ctx, cancel := chromedp.NewContext(browser, chromedp.WithNewBrowserContext(), chromedp.WithListener(tb.listen))
	t.Cleanup(cancel)
	// The tab lives as long as the context of its first Run: no timeout
	// on that one.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("%s: open a tab: %v", role, err)
	}
	tb.ctx = ctx
	return tb
}

// listen runs on the tab's message loop: it only records.
func (tb *tab) listen(ev any) {
	var problem, other string
	switch ev := ev.(type) {
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		msg := d.Text
		if d.Exception != nil && d.Exception.Description != "" {
			msg += " " + d.Exception.Description
		}
		problem = fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber, msg)
	case *log.EventEntryAdded:
		e := ev.Entry
		line := fmt.Sprintf("log %s/%s %s: %s", e.Source, e.Level, e.URL, e.Text)
		if strings.Contains(e.Text, "Content Security Policy") {
			problem = line
		} else if e.Level == log.EntryLevelError || e.Level == log.EntryLevelWarning {
			other = line
		}
	case *runtime.EventConsoleAPICalled:
		var parts []string
		for _, a := range ev.Args {
			if a.Description != "" {
				parts = append(parts, a.Description)
			} else {
				parts = append(parts, string(a.Value))
			}
		}
		line := fmt.Sprintf("console.%s: %s", ev.Type, strings.Join(parts, " "))
		if strings.Contains(line, "Content Security Policy") {
			problem = line
		} else if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeWarning {
			other = line
		}
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if problem != "" {
		tb.problems = append(tb.problems, problem)
	}
	if other != "" {
		tb.console = append(tb.console, other)
	}
}

// takeProblems returns and clears what the console reported so far.
func (tb *tab) takeProblems() []string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	p := tb.problems
	tb.problems = nil
	return p
}

func (tb *tab) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, browserGuard)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		tb.t.Fatalf("%s: %s: %v", tb.role, what, err)
	}
}

// eval evaluates a JavaScript expression in the page, awaiting a promise.
func eval[T any](tb *tab, expr string) T {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, browserGuard)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		tb.t.Fatalf("%s: evaluate %s: %v", tb.role, expr, err)
	}
	return v
}

// open loads a dashboard page and checks the document's status and that
// the session held (no detour to the login page).
func (tb *tab) open(path string, status int64) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, browserGuard)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, chromedp.Navigate(tb.base+path))
	if err != nil {
		tb.t.Fatalf("%s: open %s: %v", tb.role, path, err)
	}
	if resp.Status != status {
		tb.t.Errorf("%s: %s: status %d, want %d", tb.role, path, resp.Status, status)
	}
	if u, err := url.Parse(resp.URL); err != nil || u.Path != strings.SplitN(path, "?", 2)[0] {
		tb.t.Fatalf("%s: %s ended at %s", tb.role, path, resp.URL)
	}
}

// signIn follows a sign-in link: app.js posts the token from the fragment.
func (tb *tab) signIn(token string) {
	tb.t.Helper()
	tb.do("open the sign-in link", chromedp.Navigate(tb.base+"/login#token="+url.PathEscape(token)))
	ctx, cancel := context.WithTimeout(tb.ctx, browserGuard)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("#fleet-enrolled"))); err != nil {
		tb.t.Fatalf("%s: sign in: %v; the page %s shows:\n%s", tb.role, err, eval[string](tb, `location.href`),
			eval[string](tb, `document.body ? document.body.innerText : ""`))
	}
	if loc := eval[string](tb, `location.hash`); loc != "" {
		tb.t.Errorf("%s: the token stayed in the address bar: %q", tb.role, loc)
	}
}

// screenshot saves the whole page as a PNG and checks that it is one.
func (tb *tab) screenshot(name string) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, browserGuard)
	defer cancel()
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		tb.t.Fatalf("%s: screenshot %s: %v", tb.role, name, err)
	}
	img, err := png.Decode(bytes.NewReader(buf))
	if err != nil {
		tb.t.Fatalf("%s: screenshot %s is not a PNG: %v", tb.role, name, err)
	}
	if b := img.Bounds(); b.Dx() == 0 || b.Dy() == 0 {
		tb.t.Fatalf("%s: screenshot %s is empty", tb.role, name)
	}
	p := filepath.Join(tb.shot, tb.role+"-"+name+".png")
	if err := os.WriteFile(p, buf, 0o644); err != nil {
		tb.t.Fatal(err)
	}
	tb.t.Logf("screenshot: %s (%dx%d)", p, img.Bounds().Dx(), img.Bounds().Dy())
}

// sameFloat compares a value a page printed with the API's: as Go's %v
// prints it, or within rounding of it.
func sameFloat(got string, want float64) bool {
	if got == fmt.Sprintf("%v", want) {
		return true
	}
	v, err := strconv.ParseFloat(got, 64)
	return err == nil && math.Abs(v-want) <= 1e-12*math.Max(math.Abs(want), math.SmallestNonzeroFloat64)
}

// actionForms lists the forms on the page that would stop a task, revoke a
// device or cancel a job, and the buttons or links that say Revoke.
const actionForms = `(() => {
  const acts = /^\/(devices\/[^/]+\/revoke|tasks\/[^/]+\/stop|pool\/jobs\/[^/]+\/cancel)$/;
  const forms = [...document.querySelectorAll("form[action]")].map(f => f.getAttribute("action")).filter(a => acts.test(a));
  const words = /\bRevoke\b/.test(document.body.innerText) ? ["Revoke"] : [];
  return forms.concat(words);
})()`

// TestDashboardInBrowser: the dashboard in a real Chromium, trusting only
// the server's own certificate: sign-in by link, pages that agree with the
// API, charts that load, role-dependent actions, a CSP that the pages keep,
// live updates without a reload, and screenshots of every page.
func TestDashboardInBrowser(t *testing.T) {
	chrome := findChromium(t)
	f := newDashboardFixture(t)
	n, accuracy, epsilon := f.committed(t)
	shots := artifactDir(t)
	started := time.Now()

	alloc, cancelAlloc := chromedp.NewExecAllocator(t.Context(),
		chromedp.ExecPath(chrome),
		chromedp.Headless,
		chromedp.NoSandbox, // tests run as root in CI containers
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("ignore-certificate-errors-spki-list", serverSPKI(t, f)),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	// The first Run starts the browser, which lives as long as this
	// context: no timeout on it.
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	taskPath := "/tasks/" + f.task.Id

	t.Run("operator", func(t *testing.T) {
		op := newTab(t, browser, f.url, shots, "operator")
		op.signIn(f.operator)
		if !eval[bool](op, fmt.Sprintf(`!!document.querySelector('#tasks tr[data-task=%q]')`, f.task.Id)) {
			t.Errorf("overview does not list task %s", f.task.Id)
		}
		if got := eval[string](op, `document.getElementById("fleet-enrolled").textContent`); got != "4" {
			t.Errorf("overview: %q enrolled, want 4", got)
		}
		op.screenshot("overview")

		op.open(taskPath, 200)
		op.screenshot("task")
		// The held-out accuracy the server measures on its evaluation set
		// after each committed round: the chart the page draws first.
		const fig = `document.querySelector('figure.chart[data-metric="server_accuracy"]')`
		if got := eval[string](op, fig+`.getAttribute("data-points")`); got != strconv.Itoa(n) {
			t.Errorf("accuracy figure: data-points %s, want %d", got, n)
		}
		// Navigate returns on the load event, after the images.
		if w := eval[int](op, fig+`.querySelector("img").naturalWidth`); w <= 0 {
			t.Errorf("accuracy chart did not load: naturalWidth %d", w)
		}
		svg := eval[string](op, `fetch(`+fig+`.querySelector("img").src).then(r => r.text())`)
		if got := strings.Count(strings.ToUpper(svg), "FILL:#1F6FB4"); got != n {
			t.Errorf("accuracy chart, as the page fetches it: %d points, want %d", got, n)
		}
		if got := eval[string](op, fig+`.querySelector("table.chart-data tbody tr:last-child").getAttribute("data-value")`); !sameFloat(got, accuracy) {
			t.Errorf("last accuracy on the page %s, the API's %v", got, accuracy)
		}
		if got := eval[string](op, `document.getElementById("epsilon").getAttribute("data-value")`); !sameFloat(got, epsilon) {
			t.Errorf("ε on the page %s, the API's %v", got, epsilon)
		}

		op.open(taskPath+"/rounds/1", 200)
		if !strings.Contains(eval[string](op, `document.getElementById("timeline").innerText`), "Selection") {
			t.Errorf("round page has no selection step")
		}
		op.screenshot("round")

		op.open("/devices", 200)
		if got := eval[int](op, `[...document.querySelectorAll('form[action$="/revoke"] button')].filter(b => b.textContent.trim() === "Revoke").length`); got != 4 {
			t.Errorf("operator's fleet page: %d Revoke buttons, want 4", got)
		}
		op.screenshot("devices")

		op.open("/audit", 200)
		op.screenshot("audit")
		// Operators read checkpoints, not entries: the page says so.
		op.open("/audit/entries/0", 403)
		op.screenshot("entry")
		op.open("/pool", 200)
		op.screenshot("pool")

		for _, p := range op.takeProblems() {
			t.Errorf("operator's console: %s", p)
		}
		op.mu.Lock()
		for _, c := range op.console {
			t.Logf("operator's console: %s", c)
		}
		op.mu.Unlock()

		// The console check would catch a violation: a foreign image is
		// refused, and the refusal is reported.
		op.do("load a foreign image", chromedp.Evaluate[chromedp.Void](`(() => {
			const i = document.createElement("img"); i.src = "https://example.invalid/x.png"; document.body.append(i); })()`))
		deadline := time.Now().Add(browserGuard)
		for {
			if p := op.takeProblems(); len(p) > 0 {
				if !strings.Contains(strings.Join(p, "\n"), "Content Security Policy") {
					t.Errorf("a foreign image was reported as %q, not as a CSP violation", p)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("a foreign image under the CSP was not reported: the console check sees nothing")
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	t.Run("auditor", func(t *testing.T) {
		au := newTab(t, browser, f.url, shots, "auditor")
		au.signIn(f.auditor)
		for _, p := range []string{"/devices", taskPath, "/pool"} {
			au.open(p, 200)
			if got := eval[[]string](au, actionForms); len(got) > 0 {
				t.Errorf("auditor's %s offers actions: %q", p, got)
			}
		}
		au.open("/audit", 200)
		if got := eval[int](au, `document.querySelectorAll("#entries tbody tr").length`); got == 0 {
			t.Fatal("auditor's audit page lists no entries")
		}
		au.screenshot("audit")
		entry := eval[string](au, `document.querySelector("#entries tbody tr a").getAttribute("href")`)
		au.open(entry, 200)
		if got := eval[string](au, `document.getElementById("inclusion").textContent`); !strings.Contains(got, "proved") {
			t.Errorf("entry %s: inclusion %q", entry, got)
		}
		au.screenshot("entry")
		for _, p := range au.takeProblems() {
			t.Errorf("auditor's console: %s", p)
		}
	})

	t.Run("refused", func(t *testing.T) {
		// Another client of the same operator holds all four of its
		// streams: the page cannot be live, says why, and becomes live
		// when told to ask again after they are given back.
		tok, err := f.h.MintToken("oscar", []identity.Role{identity.RoleOperator}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		other := newBrowser(t, f)
		other.login(tok)
		var release []func()
		defer func() {
			for _, r := range release {
				r()
			}
		}()
		for i := range 4 {
			ctx, cancel := context.WithCancel(t.Context())
			req, _ := http.NewRequestWithContext(ctx, "GET", other.base+"/events", nil)
			resp, err := other.c.Do(req)
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			release = append(release, func() { cancel(); resp.Body.Close() })
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("other client's stream %d: %s", i+1, resp.Status)
			}
		}
		op := newTab(t, browser, f.url, shots, "refused")
		op.signIn(tok)
		ctx, cancel := context.WithTimeout(op.ctx, browserGuard)
		defer cancel()
		msg, err := chromedp.Run(ctx, chromedp.Poll[string](
			`(el => !el.hidden && el.textContent)(document.getElementById("live-status"))`, chromedp.WithPollingTimeout(browserGuard)))
		if err != nil {
			t.Fatalf("the refused page says nothing: %v", err)
		}
		if !strings.Contains(msg, "4 live dashboard pages open") {
			t.Errorf("the refused page says %q", msg)
		}
		op.screenshot("refused")
		for _, r := range release {
			r()
		}
		release = nil
		// The page asks again after Retry-After (30 s) and goes live.
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("live-status").hidden`,
			chromedp.WithPollingTimeout(browserGuard))); err != nil {
			t.Errorf("the page did not go live once the streams were given back: %v", err)
		}
		for _, p := range op.takeProblems() {
			t.Errorf("refused page's console: %s", p)
		}
	})

	t.Run("live", func(t *testing.T) {
		op := newTab(t, browser, f.url, shots, "live")
		op.signIn(f.operator)
		task := baseTask("live", f.task.GetModel().GetVersion(), f.task.GetModule().GetSha256(), 4)
		task.CohortTarget, task.OverSelection, task.ReportGoal = 3, 0, 3
		task.SelectionTimeout = durationpb.New(10 * time.Second)
		created := f.h.CreateTask(t, task)
		op.open("/tasks/"+created.Id, 200)
		// A marker on the window survives a redraw of #main but not a
		// navigation.
		before := eval[string](op, `window.__stay = 1, document.getElementById("task-round").textContent`)
		ctx, cancel := context.WithTimeout(op.ctx, browserGuard)
		defer cancel()
		after, err := chromedp.Run(ctx, chromedp.Poll[string](fmt.Sprintf(
			`window.__stay === 1 && document.getElementById("task-round").textContent !== %q && document.getElementById("task-round").textContent`, before),
			chromedp.WithPollingTimeout(browserGuard)))
		if err != nil {
			t.Fatalf("#task-round stayed %q: %v", before, err)
		}
		t.Logf("task page went from round %q to %q without a reload", before, after)
		done := f.h.WaitTask(t, created.Id, browserGuard, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED,
			pb.TaskState_TASK_STATE_STOPPED)
		if done.State != pb.TaskState_TASK_STATE_COMPLETED {
			t.Fatalf("live task %v: %s", done.State, done.StateReason)
		}
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](
			`window.__stay === 1 && document.getElementById("task-state").textContent.trim() === "completed"`,
			chromedp.WithPollingTimeout(browserGuard))); err != nil {
			t.Errorf("the open task page never showed the task completed: %v", err)
		}
		for _, p := range op.takeProblems() {
			t.Errorf("live page's console: %s", p)
		}
	})
	t.Logf("browser part: %v", time.Since(started).Round(time.Millisecond))
}
