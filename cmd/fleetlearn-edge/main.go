// Command fleetlearn-edge is the Fleetlearn device agent: it joins federated
// rounds over NATS and trains WASM update modules on the local dataset in
// --dataset (format: docs/DATASET.md). SIGTERM stops it cleanly.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/fleetlearn/fleetlearn/edge"
)

func main() {
	var cfg edge.Config
	var tasks, level string
	flag.StringVar(&cfg.NATSURL, "nats-url", "nats://127.0.0.1:4222", "NATS URL of the aggregator")
	flag.StringVar(&cfg.DataDir, "data-dir", "fleetlearn-edge", "directory for the device id and caches")
	flag.StringVar(&cfg.DatasetDir, "dataset", "", "local dataset directory (required)")
	flag.StringVar(&cfg.DeviceID, "device-id", "", "pseudonymous device id (default: generated once and kept in --data-dir)")
	flag.StringVar(&tasks, "tasks", "", "comma-separated task ids to join (default: any)")
	flag.StringVar(&cfg.DeviceClass, "device-class", "", "device class reported at check-in")
	flag.BoolVar(&cfg.Charging, "charging", true, "report the device as charging")
	flag.BoolVar(&cfg.Idle, "idle", true, "report the device as idle")
	flag.BoolVar(&cfg.Unmetered, "unmetered", true, "report the network as unmetered")
	flag.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	flag.Parse()
	if tasks != "" {
		cfg.TaskIDs = strings.Split(tasks, ",")
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil || cfg.DatasetDir == "" {
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
