// Command fleetlearn-edge is the Fleetlearn device agent: it joins federated
// rounds over NATS and trains WASM update modules on the local dataset in
// --dataset (format: docs/DATASET.md). SIGTERM stops it cleanly.
//
//	fleetlearn-edge enroll --api HOST:PORT --ca ca.pem --token TOKEN --data-dir DIR
//	fleetlearn-edge --data-dir DIR --dataset DATA
//
// enroll presents a one-time token from an operator and stores the device's
// NATS credentials, NATS URL and trusted module publishers in DIR.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/fleetlearn/fleetlearn/edge"
)

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func main() {
	// Heap profiling samples every 512 KB allocated and keeps a 1.4 MB table of
	// stacks; the agent serves no profiles, and its model-sized buffers would be
	// sampled almost every round.
	runtime.MemProfileRate = 0
	if len(os.Args) > 1 && os.Args[1] == "enroll" {
		os.Exit(enroll(os.Args[2:]))
	}
	var cfg edge.Config
	var tasks, level, publishers string
	var procs int
	flag.StringVar(&cfg.NATSURL, "nats-url", "", "NATS URL of the aggregator (default: the one enrollment stored, else nats://127.0.0.1:4222)")
	flag.StringVar(&cfg.Credentials, "creds", "", "NATS creds file (default: the one enrollment stored in --data-dir)")
	flag.StringVar(&publishers, "module-publishers", "", "JWKS file of trusted module publishers (default: the one enrollment stored)")
	flag.StringVar(&cfg.DataDir, "data-dir", "fleetlearn-edge", "directory for the device id and caches")
	flag.StringVar(&cfg.DatasetDir, "dataset", "", "local dataset directory (required)")
	flag.StringVar(&cfg.DeviceID, "device-id", "", "pseudonymous device id (default: generated once and kept in --data-dir)")
	flag.StringVar(&tasks, "tasks", "", "comma-separated task ids to join (default: any)")
	flag.StringVar(&cfg.DeviceClass, "device-class", "", "device class reported at check-in")
	flag.BoolVar(&cfg.Charging, "charging", true, "report the device as charging")
	flag.BoolVar(&cfg.Idle, "idle", true, "report the device as idle")
	flag.BoolVar(&cfg.Unmetered, "unmetered", true, "report the network as unmetered")
	flag.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	flag.IntVar(&procs, "max-procs", 1, "threads running the agent's Go code at once (GOMAXPROCS; 0: one per core, or $GOMAXPROCS)")
	flag.Parse()
	// The agent trains one step at a time on single-threaded kernels; more Ps
	// only add scheduler and collector overhead and take the owner's cores.
	if procs > 0 && !flagSet("max-procs") && os.Getenv("GOMAXPROCS") != "" {
		procs = 0 // an explicit environment wins over the default
	}
	if procs > 0 {
		runtime.GOMAXPROCS(procs)
	}
	if tasks != "" {
		cfg.TaskIDs = strings.Split(tasks, ",")
	}
	if cfg.NATSURL == "" {
		cfg.NATSURL = edge.SavedNATSURL(cfg.DataDir)
	}
	if cfg.NATSURL == "" {
		cfg.NATSURL = "nats://127.0.0.1:4222"
	}
	if publishers != "" {
		b, err := os.ReadFile(publishers)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleetlearn-edge:", err)
			os.Exit(1)
		}
		cfg.ModulePublishers = b
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil || cfg.DatasetDir == "" || procs < 0 {
		fmt.Fprintln(os.Stderr, "usage: fleetlearn-edge -dataset DIR [flags]; see -help")
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
	a, err := edge.New(cfg, edge.WithLogger(log))
	if err != nil {
		log.Error("start failed", "err", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := a.Run(ctx); err != nil {
		log.Error("agent stopped", "err", err)
		os.Exit(1)
	}
	log.Info("agent stopped", "stats", fmt.Sprintf("%+v", a.Stats()))
}

// enroll runs the enroll subcommand and returns the exit status.
func enroll(args []string) int {
	fs := flag.NewFlagSet("enroll", flag.ContinueOnError)
	var cfg edge.EnrollConfig
	var ca string
	fs.StringVar(&cfg.API, "api", "", "aggregator gRPC address (host:port)")
	fs.StringVar(&ca, "ca", "", "the aggregator's CA certificate (PEM), from its data directory's tls/ca.pem")
	fs.StringVar(&cfg.Token, "token", "", "one-time enrollment token from 'fleetlearn device token'")
	fs.StringVar(&cfg.DataDir, "data-dir", "fleetlearn-edge", "directory for the device key, credentials and caches")
	fs.StringVar(&cfg.DeviceID, "device-id", "", "requested device id (default: the server assigns one)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.API == "" || ca == "" || cfg.Token == "" {
		fmt.Fprintln(os.Stderr, "usage: fleetlearn-edge enroll --api HOST:PORT --ca FILE --token TOKEN [--data-dir DIR]")
		return 2
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetlearn-edge enroll:", err)
		return 1
	}
	cfg.CAPEM = pem
	e, err := edge.Enroll(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetlearn-edge enroll:", err)
		return 1
	}
	fmt.Printf("enrolled as %s (key %s)", e.DeviceID, e.KeyID)
	if e.NATSURL != "" {
		fmt.Printf(", NATS %s", e.NATSURL)
	}
	fmt.Printf("; credentials in %s\n", cfg.DataDir)
	return 0
}
