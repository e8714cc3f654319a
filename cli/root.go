package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/fleetlearn/fleetlearn/client"
)

// Defaults for the global flags.
const (
	DefaultServer  = "127.0.0.1:7070"
	DefaultTimeout = 30 * time.Second
	// ServerEnv overrides DefaultServer when set.
	ServerEnv = "FLEETLEARN_SERVER"
	// TokenEnv and TokenFileEnv are the defaults of --token and
	// --token-file: the API bearer token, or a file holding it.
	TokenEnv     = "FLEETLEARN_TOKEN"
	TokenFileEnv = "FLEETLEARN_TOKEN_FILE"
	// CAEnv is the default of --ca: the CA certificate the server's TLS
	// certificate must chain to (the server's <data-dir>/tls/ca.crt).
	CAEnv = "FLEETLEARN_CA"
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

	server    string
	timeout   time.Duration
	token     string
	tokenFile string
	caFile    string
	insecure  bool
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
	root.PersistentFlags().StringVar(&a.token, "token", a.getenv(TokenEnv),
		"API bearer token; $"+TokenEnv+" sets the default (prefer --token-file: arguments are visible to other users)")
	root.PersistentFlags().StringVar(&a.tokenFile, "token-file", a.getenv(TokenFileEnv),
		"file holding the API bearer token, such as the server's <data-dir>/admin.token; $"+TokenFileEnv+" sets the default")
	root.PersistentFlags().StringVar(&a.caFile, "ca", a.getenv(CAEnv),
		"CA certificate (PEM) the server's TLS certificate must chain to, such as the server's <data-dir>/tls/ca.crt; "+
			"$"+CAEnv+" sets the default; without it the system roots are used")
	root.PersistentFlags().BoolVar(&a.insecure, "insecure", false,
		"connect without TLS, to a server started with --grpc-insecure")
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
		newDeviceCommand(a),
		newTokenCommand(a),
		newNATSCommand(a),
		newDataCommand(a),
		newPoolCommand(a),
		newVersionCommand(),
	)
	root.Version = versionLine()
	root.SetVersionTemplate("{{.Version}}\n")
	return root
}

// dial connects to the aggregator. It is the one place that decides the
// transport and credentials; connections are made lazily, so errors surface
// on the first call.
func (a *app) dial() (*grpc.ClientConn, error) {
	opts, err := a.dialOptions()
	if err != nil {
		return nil, err
	}
	conn, err := client.Dial(a.server, opts...)
	if err != nil {
		return nil, fmt.Errorf("server %q: %w", a.server, err)
	}
	return conn, nil
}

func (a *app) dialOptions() ([]client.DialOption, error) {
	var opts []client.DialOption
	switch {
	case a.token != "" && a.tokenFile != "":
		return nil, fmt.Errorf("%w: --token and --token-file (or $%s and $%s) cannot be used together", ErrUsage, TokenEnv, TokenFileEnv)
	case a.tokenFile != "":
		tok, err := client.ReadToken(a.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("%w: --token-file: %w", ErrInput, err)
		}
		opts = append(opts, client.WithToken(tok))
	case a.token != "":
		opts = append(opts, client.WithToken(a.token))
	}
	switch {
	case a.insecure && a.caFile != "":
		return nil, fmt.Errorf("%w: --insecure and --ca (or $%s) cannot be used together", ErrUsage, CAEnv)
	case a.insecure:
		opts = append(opts, client.WithInsecure())
	case a.caFile != "":
		ca, err := os.ReadFile(a.caFile)
		if err != nil {
			return nil, fmt.Errorf("%w: --ca: %w", ErrInput, err)
		}
		if !bytes.Contains(ca, []byte("-----BEGIN CERTIFICATE-----")) {
			return nil, fmt.Errorf("%w: --ca %s holds no PEM certificate", ErrInput, a.caFile)
		}
		opts = append(opts, client.WithCA(ca))
	}
	return opts, nil
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
