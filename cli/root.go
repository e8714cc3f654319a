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
	"github.com/fleetlearn/fleetlearn/internal/cliflags"
)

// Defaults for the global flags.
const (
	DefaultServer  = "127.0.0.1:7070"
	DefaultTimeout = 30 * time.Second
	// ServerEnv overrides DefaultServer when set.
	ServerEnv = "FLEETLEARN_SERVER"
	// TokenEnv and TokenFileEnv stand for --token and --token-file when
	// neither is given: the API bearer token, or a file holding it.
	TokenEnv     = "FLEETLEARN_TOKEN"
	TokenFileEnv = "FLEETLEARN_TOKEN_FILE"
	// CAEnv stands for --ca when it is not given: the CA certificate the
	// server's TLS certificate must chain to (the server's
	// <data-dir>/tls/ca.crt).
	CAEnv = "FLEETLEARN_CA"
)

// flagEnv names the environment variable of each flag that has one. A flag
// on the command line overrides its variable, and also a variable that
// stands for a flag it cannot be used with: --token beats
// $FLEETLEARN_TOKEN_FILE, --insecure beats $FLEETLEARN_CA.
var flagEnv = map[string]string{
	"server":     ServerEnv,
	"token":      TokenEnv,
	"token-file": TokenFileEnv,
	"ca":         CAEnv,
	"nats-url":   NATSURLEnv,
	"creds":      NATSCredsEnv,
}

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
	// fromEnv holds the flags whose value came from the environment, with
	// their variables; the others were typed or are defaults.
	fromEnv map[string]string
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
	root := &cobra.Command{
		Use:   "fleetlearn",
		Short: "Operate a Fleetlearn federated training service",
		Long: "fleetlearn talks to a Fleetlearn aggregator over gRPC to create and watch\n" +
			"federated training tasks, manage model versions and register WASM update modules.",
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			set, err := cliflags.FromEnv(cmd.Flags(), a.getenv, flagEnv)
			if err != nil {
				return fmt.Errorf("%w: %v", ErrUsage, err)
			}
			a.fromEnv = set
			return nil
		},
	}
	root.PersistentFlags().StringVar(&a.server, "server", DefaultServer,
		"aggregator gRPC address; $"+ServerEnv+" sets the default")
	root.PersistentFlags().DurationVar(&a.timeout, "timeout", DefaultTimeout,
		"deadline for a command's calls; transfers and watch are unbounded unless this is set")
	root.PersistentFlags().StringVar(&a.token, "token", "",
		"API bearer token; $"+TokenEnv+" sets the default (prefer --token-file: arguments are visible to other users)")
	root.PersistentFlags().StringVar(&a.tokenFile, "token-file", "",
		"file holding the API bearer token, such as the server's <data-dir>/admin.token; $"+TokenFileEnv+" sets the default")
	root.PersistentFlags().StringVar(&a.caFile, "ca", "",
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
	token, tokenFile, err := a.either("token", a.token, "token-file", a.tokenFile)
	if err != nil {
		return nil, err
	}
	switch {
	case tokenFile != "":
		tok, err := client.ReadToken(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrInput, a.source("token-file"), err)
		}
		opts = append(opts, client.WithToken(tok))
	case token != "":
		opts = append(opts, client.WithToken(token))
	}
	insecure := ""
	if a.insecure {
		insecure = "true"
	}
	insecure, caFile, err := a.either("insecure", insecure, "ca", a.caFile)
	if err != nil {
		return nil, err
	}
	switch {
	case insecure != "":
		opts = append(opts, client.WithInsecure())
	case caFile != "":
		ca, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrInput, a.source("ca"), err)
		}
		if !bytes.Contains(ca, []byte("-----BEGIN CERTIFICATE-----")) {
			return nil, fmt.Errorf("%w: %s %s holds no PEM certificate", ErrInput, a.source("ca"), caFile)
		}
		opts = append(opts, client.WithCA(ca))
	}
	return opts, nil
}

// source names where a flag's value came from, for messages: "--ca", or
// "$FLEETLEARN_CA" when the environment set it.
func (a *app) source(flag string) string {
	if v, ok := a.fromEnv[flag]; ok {
		return "$" + v
	}
	return "--" + flag
}

// either keeps one of two settings that cannot be used together (x and y,
// the values of flags nx and ny; "" is unset). One given on the command
// line overrides one from the environment, which is dropped; two from the
// same place are refused, naming both.
func (a *app) either(nx, x, ny, y string) (string, string, error) {
	if x == "" || y == "" {
		return x, y, nil
	}
	_, xEnv := a.fromEnv[nx]
	_, yEnv := a.fromEnv[ny]
	switch {
	case yEnv && !xEnv:
		return x, "", nil
	case xEnv && !yEnv:
		return "", y, nil
	case xEnv:
		return "", "", fmt.Errorf("%w: %s and %s are both set and cannot be used together: unset one, or pick one with --%s or --%s",
			ErrUsage, a.source(nx), a.source(ny), nx, ny)
	}
	return "", "", fmt.Errorf("%w: --%s and --%s cannot be used together: pass one of them", ErrUsage, nx, ny)
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
