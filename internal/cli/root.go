package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Defaults for the global flags.
const (
	DefaultServer  = "127.0.0.1:7070"
	DefaultTimeout = 30 * time.Second
	// ServerEnv overrides DefaultServer when set.
	ServerEnv = "FLEETLEARN_SERVER"
)

// Option configures NewRootCommand.
type Option func(*app)

// WithGetenv sets how environment variables are read; the default is
// os.Getenv.
func WithGetenv(getenv func(string) string) Option {
	return func(a *app) { a.getenv = getenv }
}

// WithTerminal says whether standard output is an interactive terminal,
// instead of detecting it. Only a terminal gets redrawn progress lines and
// ANSI escapes.
func WithTerminal(isTerminal bool) Option {
	return func(a *app) { a.terminal = &isTerminal }
}

// app is the state shared by all commands: the global flags and injected
// dependencies. Command groups take it in their constructors.
type app struct {
	getenv   func(string) string
	terminal *bool

	server  string
	timeout time.Duration
}

// NewRootCommand returns the fleetlearn command with every command group.
// Errors are returned from Execute, not printed; the caller prints them and
// sets the exit status.
//
// A new command group goes in its own file as a constructor
// func(*app) *cobra.Command, added to the AddCommand call below.
func NewRootCommand(opts ...Option) *cobra.Command {
	a := &app{getenv: os.Getenv}
	for _, o := range opts {
		if o != nil {
			o(a)
		}
	}
	server := DefaultServer
	if v := a.getenv(ServerEnv); v != "" {
		server = v
	}

	root := &cobra.Command{
		Use:   "fleetlearn",
		Short: "Operate a Fleetlearn federated training service",
		Long: "fleetlearn talks to a Fleetlearn aggregator over gRPC to create and watch\n" +
			"federated training tasks, manage model versions and register WASM update modules.",
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.PersistentFlags().StringVar(&a.server, "server", server,
		"aggregator gRPC address; $"+ServerEnv+" sets the default")
	root.PersistentFlags().DurationVar(&a.timeout, "timeout", DefaultTimeout,
		"deadline for a command's calls; transfers and watch are unbounded unless this is set")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%w\nRun '%s --help' for usage", err, c.CommandPath())
	})

	root.AddCommand(
		newTaskCommand(a),
		newModelCommand(a),
		newModuleCommand(a),
		newDemoCommand(a),
		newDPCommand(a),
		newAuditCommand(a),
	)
	return root
}

// dial connects to the aggregator. It is the one place that decides the
// transport; connections are made lazily, so errors surface on the first call.
func (a *app) dial() (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(a.server, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("server %q: %w", a.server, err)
	}
	return conn, nil
}

// call dials the server and runs fn under the command's deadline. A long
// call (a transfer or a watch) has no deadline unless --timeout was given.
func (a *app) call(cmd *cobra.Command, long bool, fn func(ctx context.Context, conn *grpc.ClientConn) error) error {
	conn, err := a.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	if f := cmd.Flag("timeout"); a.timeout > 0 && (!long || f != nil && f.Changed) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, a.timeout)
		defer cancel()
	}
	return a.rpcError(fn(ctx, conn))
}

// isTerminal reports whether w is an interactive terminal.
func (a *app) isTerminal(w io.Writer) bool {
	if a.terminal != nil {
		return *a.terminal
	}
	f, ok := w.(*os.File)
	if !ok || a.getenv("TERM") == "dumb" {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
