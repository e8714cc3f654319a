// Package healthcheck is the client side of the binaries' plain-HTTP health
// endpoints: the "health" subcommands of fleetlearn-server and
// fleetlearn-edge, which run where only a program can probe (Docker's
// HEALTHCHECK in an image without a shell, exec probes).
package healthcheck

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/internal/cliflags"
)

// Timeout bounds one check: the endpoints answer from memory.
const Timeout = 5 * time.Second

// ErrUnhealthy is returned when the endpoint answers anything but 200.
var ErrUnhealthy = errors.New("unhealthy")

// Get asks http://addr/path and copies the answer's first line to out. A
// host left empty (":9464") or unspecified ("0.0.0.0:9464") means this
// host's loopback, where a listener on every interface also answers.
func Get(ctx context.Context, addr, path string, out io.Writer) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("health: address %q: want host:port", addr)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	u := "http://" + net.JoinHostPort(host, port) + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("health: %w (is the process running with that address for its health endpoints?)", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("health: %s: %w: %s %s", u, ErrUnhealthy, resp.Status, line)
	}
	fmt.Fprintln(out, line)
	return nil
}

// The endpoints both binaries serve.
const (
	// Healthz answers 200 while the process serves: a liveness probe.
	Healthz = "/healthz"
	// Readyz answers 200 when ready says nil, 503 with its reason
	// otherwise: a readiness probe.
	Readyz = "/readyz"
)

// Register adds Healthz and Readyz to mux. They say "ok" or why the
// process is not ready, nothing more: they are unauthenticated.
func Register(mux *http.ServeMux, ready func(context.Context) error) {
	mux.HandleFunc("GET "+Healthz, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET "+Readyz, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := ready(r.Context()); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready:", err)
			return
		}
		fmt.Fprintln(w, "ok")
	})
}

// Command is the "health" subcommand both binaries have: GET Readyz (or
// Healthz with --live) at --addr, exit 0 on 200. defaultAddr "" makes
// --addr required; what and ready say what the checks mean for the
// program.
func Command(short, defaultAddr, addrUsage, ready, live string) *cobra.Command {
	var addr string
	var asLive bool
	cmd := &cobra.Command{
		Use:   "health",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if addr == "" {
				return cliflags.Usage("health: --addr is required: %s", addrUsage)
			}
			path := Readyz
			if asLive {
				path = Healthz
			}
			return Get(cmd.Context(), addr, path, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&addr, "addr", defaultAddr, addrUsage)
	cmd.Flags().BoolVar(&asLive, "live", false, "ask "+Healthz+" ("+live+") instead of "+Readyz+" ("+ready+")")
	return cmd
}
