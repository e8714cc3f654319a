package fleetlearn_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/cmd/cmdtest"
	"github.com/fleetlearn/fleetlearn/internal/freeport"
)

// TestMain lets the test binary run as the programs that
// TestReleaseBinariesEndToEnd starts.
func TestMain(m *testing.M) {
	cmdtest.Main()
	m.Run()
}

// TestReleaseBinariesEndToEnd follows README.md's "Running it for real" with
// the programs alone, as separate processes: the test binary standing in
// for each (cmd/cmdtest, the same code as cmd/'s mains, so that no build
// runs inside the test), started with a PATH that holds them and the system
// directories but no Go toolchain, an empty HOME and a working directory
// outside the source tree. Only the ports differ from the README (free
// ones instead of 7070/4222, no /metrics), and the task runs 2 rounds
// instead of 5 to stay short.
func TestReleaseBinariesEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("trains a model with the programs as separate processes")
	}
	bin := cmdtest.Dir(t)

	e := newE2E(t, bin)
	grpcAddr, natsAddr := freeAddrs(t)
	dataDir := t.TempDir() // the README's /var/lib/fleetlearn

	e.run("keygen", "publishers.jwks", "fleetlearn", "module", "keygen", "publisher.pem")
	server := e.start("server", "fleetlearn-server", "--data-dir", dataDir, "--public-host", "127.0.0.1",
		"--module-publishers", "publishers.jwks", "--grpc-addr", grpcAddr, "--nats-listen", natsAddr, "--metrics-addr", "off")
	ca := filepath.Join(dataDir, "tls", "ca.crt")
	e.env = append(e.env, "FLEETLEARN_SERVER="+grpcAddr, "FLEETLEARN_CA="+ca,
		"FLEETLEARN_TOKEN_FILE="+filepath.Join(dataDir, "admin.token"))
	e.waitAPI(server, filepath.Join(dataDir, "admin.token"), ca)

	e.run("data", "", "fleetlearn", "data", "mnist", "--devices", "3", "--alpha", "0.5", "--out", "datasets",
		"--train-examples", "6000")
	e.run("model-init", "", "fleetlearn", "model", "init", "--arch", "mlp:784,128,10", "-o", "base.safetensors")
	e.run("module-example", "", "fleetlearn", "module", "example", "mlp", "-o", "mlp.wasm")
	module := sha256Line(t, "module register", e.run("module-register", "", "fleetlearn", "module", "register", "mlp.wasm",
		"--name", "mlp", "--signing-key", "publisher.pem"))
	sha256Line(t, "model import", e.run("model-import", "", "fleetlearn", "model", "import", "base.safetensors", "--name", "mnist"))

	var agents []*proc
	for k := range 3 {
		token := fmt.Sprintf("token-%d", k)
		edgeDir := fmt.Sprintf("edge-%d", k)
		e.run("device-token-"+fmt.Sprint(k), token, "fleetlearn", "device", "token", "--ttl", "1h")
		e.run("enroll-"+fmt.Sprint(k), "", "fleetlearn-edge", "enroll", "--api", grpcAddr, "--ca", ca,
			"--token-file", token, "--data-dir", edgeDir)
		agents = append(agents, e.start("agent-"+fmt.Sprint(k), "fleetlearn-edge", "--data-dir", edgeDir,
			"--dataset", fmt.Sprintf("datasets/device-%d", k)))
	}

	created := e.run("task-create", "", "fleetlearn", "task", "create", "--name", "ft", "--model", "mnist", "--module", module,
		"--cohort", "3", "--report-goal", "3", "--rounds", "2", "--server-eval-dataset", filepath.Join(e.work, "datasets", "eval"))
	task := tableField(created, "ID")
	if task == "" {
		t.Fatalf("task create printed no ID row:\n%s", created)
	}
	if warn := e.stderr("task-create"); warn != "" {
		t.Logf("task create warned:\n%s", warn)
	}

	watched := e.watch(task)
	if !strings.Contains(watched, "completed after 2/2 training rounds") {
		t.Fatalf("task watch did not report the task completed after 2/2 training rounds:\n%s", watched)
	}
	final := lineWithPrefix(watched, "final model ")
	if !strings.Contains(final, "server_accuracy=") {
		t.Fatalf("task watch printed no final model line with server_accuracy:\n%s", watched)
	}
	if acc := metric(final, "server_accuracy"); acc <= 0.5 {
		t.Errorf("final server_accuracy %g after 2 rounds, want above 0.5 (chance is 0.1):\n%s", acc, watched)
	}
	// Before and after: the base model measured before round 1, and the
	// final model compared with it.
	if base := lineWithPrefix(watched, "base model "); !strings.Contains(base, "server_accuracy=") || !strings.Contains(final, "(base ") {
		t.Errorf("task watch shows no before/after (base line %q, final line %q):\n%s", base, final, watched)
	}
	t.Logf("task watch:\n%s", watched)

	rounds := e.run("task-rounds", "", "fleetlearn", "task", "rounds", task)
	if n := strings.Count(rounds, "committed"); n < 2 {
		t.Errorf("task rounds shows %d committed rounds, want 2:\n%s", n, rounds)
	}
	e.run("model-export", "", "fleetlearn", "model", "export", "ft", "-o", "ft.safetensors")
	if fi, err := os.Stat(filepath.Join(e.work, "ft.safetensors")); err != nil || fi.Size() == 0 {
		t.Errorf("model export ft wrote no model: %v", err)
	}

	e.auditVerify(server, task)

	// Agents first, so that none is left retrying a server that is gone.
	for _, a := range agents {
		if err := a.stop(); err != nil {
			t.Errorf("%s: %v on SIGTERM, want exit status 0", a.name, err)
		}
	}
	if err := server.stop(); err != nil {
		t.Errorf("server: %v on SIGTERM, want exit status 0", err)
	}
}

// e2e runs the binaries as an operator would, in a working directory of
// its own, and keeps every command's output in a file of logs: the tails
// of them all are printed when the test fails.
type e2e struct {
	t    *testing.T
	work string   // the operator's working directory, outside the source tree
	logs string   // one file per command and stream
	env  []string // the whole environment of every command
	seq  int
	// exited hears of background processes that end, so that a command
	// waiting on them (task watch) is not left waiting on the dead.
	exited chan *proc
}

func newE2E(t *testing.T, bin string) *e2e {
	e := &e2e{t: t, logs: t.TempDir(), exited: make(chan *proc, 16)}
	// Registered before any process starts, so it runs after they have
	// all been stopped and their logs are complete.
	t.Cleanup(e.printLogs)
	home := t.TempDir()
	e.work = t.TempDir()
	path := bin + string(os.PathListSeparator) + "/usr/bin" + string(os.PathListSeparator) + "/bin"
	// exec.Command looks commands up in this process's PATH; the
	// environment below is the children's, built from nothing so that no
	// GOPATH, GOMODCACHE, GOFLAGS or GOROOT reaches them.
	t.Setenv("PATH", path)
	if p, err := exec.LookPath("go"); err == nil {
		t.Fatalf("go is on the binaries' PATH at %s: the test would not show they run without it", p)
	}
	for _, name := range []string{"fleetlearn", "fleetlearn-server", "fleetlearn-edge"} {
		if p, err := exec.LookPath(name); err != nil || p != filepath.Join(bin, name) {
			t.Fatalf("%s on PATH: %q, %v; want the one just built", name, p, err)
		}
	}
	e.env = []string{"PATH=" + path, "HOME=" + home}
	return e
}

// logFile names the file of one stream of one command; commands are
// numbered in the order they ran.
func (e *e2e) logFile(name, stream string) string {
	return filepath.Join(e.logs, fmt.Sprintf("%02d-%s.%s", e.seq, name, stream))
}

func (e *e2e) command(args ...string) *exec.Cmd {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir, cmd.Env = e.work, e.env
	return cmd
}

func create(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// run runs one command to its end and returns its standard output, which
// also goes to redirect (relative to the working directory) when that is
// set, as the README's "> FILE" does. A command that fails ends the test.
func (e *e2e) run(name, redirect string, args ...string) string {
	e.t.Helper()
	e.seq++
	outPath := e.logFile(name, "out")
	if redirect != "" {
		outPath = filepath.Join(e.work, redirect)
	}
	stdout, stderr := create(e.t, outPath), create(e.t, e.logFile(name, "err"))
	cmd := e.command(args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err := cmd.Run()
	stdout.Close()
	stderr.Close()
	out, _ := os.ReadFile(outPath)
	if err != nil {
		msg, _ := os.ReadFile(stderr.Name())
		e.t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, tail(string(out), 4000), tail(string(msg), 4000))
	}
	return string(out)
}

// stderr returns what the last command called name wrote to standard
// error.
func (e *e2e) stderr(name string) string {
	matches, _ := filepath.Glob(filepath.Join(e.logs, "*-"+name+".err"))
	if len(matches) == 0 {
		return ""
	}
	slices.Sort(matches)
	b, _ := os.ReadFile(matches[len(matches)-1])
	return strings.TrimSpace(string(b))
}

// proc is a command running in the background, as the README's "&" starts
// it; t.Cleanup stops it.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once it exited; err is then its status
	err  error
}

func (e *e2e) start(name string, args ...string) *proc {
	e.t.Helper()
	e.seq++
	log := create(e.t, e.logFile(name, "log"))
	cmd := e.command(args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		e.t.Fatalf("%s: %v", strings.Join(args, " "), err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
		select {
		case e.exited <- p:
		default:
		}
	}()
	e.t.Cleanup(func() { p.stop() })
	return p
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stopGrace is how long a process has to stop on SIGTERM before it is
// killed: more than the server's 30 s of shutdown.
const stopGrace = 45 * time.Second

// stop ends the process with SIGTERM, as an operator or systemd would, and
// returns how it exited.
func (p *proc) stop() error {
	if p.running() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(stopGrace):
			p.cmd.Process.Kill()
			<-p.done
			return fmt.Errorf("still running %v after SIGTERM, killed", stopGrace)
		}
	}
	return p.err
}

// apiAttempts bounds the wait for the server's API. An attempt is a whole
// CLI call, and attempts go on only while the server runs: a server that
// exits ends the wait at once.
const apiAttempts = 300

// waitAPI waits until the server has written its admin token and CA and
// its API answers fleetlearn task list.
func (e *e2e) waitAPI(server *proc, token, ca string) {
	e.t.Helper()
	var last string
	for range apiAttempts {
		if !server.running() {
			e.t.Fatalf("fleetlearn-server exited before its API answered: %v", server.err)
		}
		if fileExists(token) && fileExists(ca) {
			out, err := e.command("fleetlearn", "task", "list").CombinedOutput()
			if err == nil {
				return
			}
			last = fmt.Sprintf("%v: %s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.t.Fatalf("the server's API did not answer fleetlearn task list after %d attempts (token and CA written: %t, %t); last: %s",
		apiAttempts, fileExists(token), fileExists(ca), last)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// watch runs fleetlearn task watch to its end and returns its output. It
// needs the server and agents: if any of them exits first, the watch is
// killed and the test fails, rather than waiting on a round no one runs.
func (e *e2e) watch(task string) string {
	e.t.Helper()
	e.seq++
	outPath := e.logFile("task-watch", "out")
	out := create(e.t, outPath)
	defer out.Close()
	cmd := e.command("fleetlearn", "task", "watch", task)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	watchDone := make(chan struct{})
	dead := make(chan *proc, 1)
	guard := make(chan struct{})
	go func() {
		defer close(guard)
		select {
		case p := <-e.exited:
			dead <- p
			cmd.Process.Kill()
		case <-watchDone:
		}
	}()
	err := cmd.Wait()
	close(watchDone)
	<-guard
	b, _ := os.ReadFile(outPath)
	select {
	case p := <-dead:
		e.t.Fatalf("%s exited (%v) while task watch ran:\n%s", p.name, p.err, b)
	default:
	}
	if err != nil {
		e.t.Fatalf("fleetlearn task watch %s: %v\n%s", task, err, b)
	}
	return string(b)
}

// auditAttempts bounds how often the audit log is exported again while the
// server's next checkpoint (signed every second) does not yet cover the
// last round.
const auditAttempts = 40

// auditVerify exports the log with proofs and verifies it offline against
// the keys pinned beforehand, until the verified export covers both
// committed rounds of task.
func (e *e2e) auditVerify(server *proc, task string) {
	e.t.Helper()
	e.run("audit-keys", "", "fleetlearn", "audit", "keys", "-o", "audit.pin")
	var report string
	for range auditAttempts {
		if !server.running() {
			e.t.Fatalf("fleetlearn-server exited: %v", server.err)
		}
		e.run("audit-export", "", "fleetlearn", "audit", "export", "--proofs", "-o", "audit.jsonl")
		report = e.run("audit-verify", "", "fleetlearn", "audit", "verify", "audit.jsonl", "--pin", "audit.pin")
		if strings.Contains(tableField(report, "rounds:"), "2 committed") {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	rounds := tableField(report, "rounds:")
	if !strings.Contains(rounds, "2 committed") || !strings.Contains(rounds, task+": 2") {
		e.t.Fatalf("audit verify does not report 2 committed rounds of %s:\n%s", task, report)
	}
	if n, _, _ := strings.Cut(tableField(report, "proofs:"), " "); n == "" || n == "0" {
		e.t.Errorf("audit verify checked no proofs of an export with --proofs:\n%s", report)
	}
	for _, key := range []string{"entry key:", "verifier key:"} {
		if line := lineWithPrefix(report, key); !strings.Contains(line, "(pinned)") {
			e.t.Errorf("audit verify --pin did not use the pinned %s\n%s", key, report)
		}
	}
	e.t.Logf("audit verify:\n%s", report)
}

// printLogs prints the tail of every command's output when the test failed.
func (e *e2e) printLogs() {
	if !e.t.Failed() {
		return
	}
	files, _ := filepath.Glob(filepath.Join(e.logs, "*"))
	slices.Sort(files)
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if len(b) > 0 {
			e.t.Logf("--- %s (tail):\n%s", filepath.Base(f), tail(string(b), 3000))
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// freeAddrs returns two distinct loopback addresses with free ports.
func freeAddrs(t *testing.T) (string, string) {
	t.Helper()
	a := freeport.Addr(t)
	for {
		if b := freeport.Addr(t); b != a {
			return a, b
		}
	}
}

var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// sha256Line returns the SHA-256 a command printed as its only line.
func sha256Line(t *testing.T, what, out string) string {
	t.Helper()
	s := strings.TrimSpace(out)
	if !sha256RE.MatchString(s) {
		t.Fatalf("%s printed %q, want a SHA-256", what, s)
	}
	return s
}

// tableField returns the rest of the first line whose first column is
// key, as the CLI's key-value tables print them.
func tableField(out, key string) string {
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), key); ok && (rest == "" || rest[0] == ' ' || rest[0] == '\t') {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

func lineWithPrefix(out, prefix string) string {
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, prefix) {
			return line
		}
	}
	return ""
}

// metric returns the value of name=VALUE in a metrics line, or -1.
func metric(line, name string) float64 {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			if x, err := strconv.ParseFloat(v, 64); err == nil {
				return x
			}
		}
	}
	return -1
}
