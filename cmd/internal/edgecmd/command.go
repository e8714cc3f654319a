// Package edgecmd is fleetlearn-edge's command line, run by cmd/fleetlearn-edge's
// main and, in tests, by a test binary standing in for the program
// (cmd/cmdtest).
package edgecmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"time"

	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/internal/cliflags"
	"github.com/fleetlearn/fleetlearn/internal/tracing"
)

// Exit statuses.
const (
	exitError = 1
	exitUsage = 2
	// exitOperator says that running the command again will not help until
	// the operator acts: the device is not enrolled, was revoked, or the
	// server refused its enrollment token or key.
	exitOperator = 3
)

// Main runs fleetlearn-edge's command line args until ctx ends and returns
// the exit status, having printed any error to stderr.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return run(ctx, args, stdin, stdout, stderr, runAgent)
}

// run executes the command line args and returns the exit status, having
// printed any error to stderr.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, agent agentFunc) int {
	root := newRootCommand(agent)
	root.SetArgs(cliflags.SingleDash(root, args))
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "fleetlearn-edge:", message(err))
	switch {
	case isUsage(err):
		return exitUsage
	case errors.Is(err, edge.ErrNotEnrolled), errors.Is(err, edge.ErrRevoked),
		errors.Is(err, edge.ErrTokenRefused), errors.Is(err, edge.ErrKeyRefused):
		return exitOperator
	}
	return exitError
}

// message is err as the user reads it: the program's name stands in for
// the agent package's "edge: " prefix, and the errors that need the
// operator say what to do.
func message(err error) string {
	msg := strings.TrimPrefix(err.Error(), "edge: ")
	var e *hinted
	if errors.As(err, &e) {
		msg += "\n" + e.hint
	}
	return msg
}

// hinted is an error with advice for the user, printed on lines of its own.
type hinted struct {
	err  error
	hint string
}

func (h *hinted) Error() string { return h.err.Error() }
func (h *hinted) Unwrap() error { return h.err }

// process is what the command line says about the agent's process rather
// than the agent: its GOMAXPROCS (0: leave it) and where to serve health
// checks ("": nowhere).
type process struct {
	procs      int
	healthAddr string
	trace      tracing.Config // where the agent's spans go
}

// agentFunc runs an agent with cfg until ctx ends.
type agentFunc func(ctx context.Context, cfg edge.Config, p process, log *slog.Logger) error

// runAgent is the agent: it refuses a device that is not enrolled before
// touching its data directory, and stops with an error when it cannot go on.
func runAgent(ctx context.Context, cfg edge.Config, p process, log *slog.Logger) error {
	tp, flush, err := tracing.Setup(ctx, p.trace)
	if err != nil {
		return cliflags.Usage("%v", err)
	}
	defer func() {
		// The spans of the last round are written before the process exits.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := flush(fctx); err != nil {
			log.Warn("flushing traces", "err", err)
		}
	}()
	a, err := edge.New(cfg, edge.WithLogger(log), edge.WithTracerProvider(tp))
	if err != nil {
		return advise(err, cfg.DataDir)
	}
	// Which build runs, and with which engine, is the first thing to know
	// about a device that trains slowly or not at all. (After New: a
	// device that is not enrolled says only that, and what to do.)
	log.Info("starting", "version", versionLine())
	if p.procs > 0 {
		runtime.GOMAXPROCS(p.procs)
	}
	if p.healthAddr != "" {
		stop, err := serveHealth(p.healthAddr, a.Ready)
		if err != nil {
			return err
		}
		defer stop()
	}
	err = a.Run(ctx)
	log.Info("agent stopped", "stats", fmt.Sprintf("%+v", a.Stats()))
	return advise(err, cfg.DataDir)
}

// advise adds what to do to the errors that need the operator.
func advise(err error, dataDir string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, edge.ErrNotEnrolled):
		return &hinted{err, "Enroll this device first, with the server's tls/ca.crt and a token from 'fleetlearn device token':\n" +
			"  " + enrollCommand(dataDir) + "\n" +
			"then start the agent again with the same --data-dir (or name a creds file with --creds; " +
			"a server run with --insecure-nats needs none: --insecure-nats)."}
	case errors.Is(err, edge.ErrRevoked):
		return &hinted{err, "The reason the operator gave is not sent to devices: 'fleetlearn device list --all' shows it.\n" +
			"To rejoin, ask the operator for a new enrollment token and enroll into a new, empty --data-dir " +
			"(a revoked key never enrolls again):\n  " + enrollCommand("NEW_DIR")}
	}
	return err
}

// enrollCommand is the enroll command line for dataDir.
func enrollCommand(dataDir string) string {
	return "fleetlearn-edge enroll --api HOST:7070 --ca ca.crt --token-file FILE --data-dir " + shellQuote(dataDir)
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
