// Command fleetlearn-server is the Fleetlearn cloud aggregator service. By
// default it embeds a NATS server with JetStream and keeps all state under
// --data-dir; --nats-url points it at an external NATS cluster instead.
//
// The gRPC API serves TLS from a CA the server creates in
// <data-dir>/tls (clients trust tls/ca.crt) and requires bearer tokens; on
// first start the server writes an admin token to <data-dir>/admin.token.
// --module-publishers names the JWK Set of the publisher keys whose modules
// it accepts.
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
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/server"
)

func main() {
	var cfg server.Config
	var level string
	flag.StringVar(&cfg.DataDir, "data-dir", "fleetlearn-data", "directory for SQLite, JetStream and caches")
	flag.StringVar(&cfg.NATSURL, "nats-url", "", "external NATS cluster URL (default: embedded server)")
	flag.StringVar(&cfg.NATSListen, "nats-listen", "127.0.0.1:4222", "embedded NATS client address")
	flag.StringVar(&cfg.GRPCAddr, "grpc-addr", "127.0.0.1:7070", "gRPC API address")
	flag.StringVar(&cfg.MetricsAddr, "metrics-addr", "127.0.0.1:9464", `Prometheus /metrics address, or "off"`)
	flag.DurationVar(&cfg.PaceWindow, "pace-window", 2*time.Second, "spread of the check-ins of devices not selected")
	flag.IntVar(&cfg.Replicas, "replicas", 1, "JetStream replicas of reports and blobs on an external cluster")
	flag.BoolVar(&cfg.NATSTLS, "nats-tls", false, "serve the embedded NATS server over TLS with the server's CA")
	flag.BoolVar(&cfg.InsecureNATS, "insecure-nats", false, "run NATS without authorization: any client may use any subject, devices need no enrollment")
	flag.StringVar(&cfg.AuditOrigin, "audit-origin", audit.DefaultOrigin, `name of the audit log, first line of its checkpoints (e.g. "fleetlearn.example.com/audit")`)
	flag.Func("audit-witness", "verifier key of a witness whose cosignatures of audit checkpoints to accept and serve (fleetlearn audit witness init prints it); repeatable",
		func(v string) error { cfg.AuditWitnesses = append(cfg.AuditWitnesses, v); return nil })
	flag.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	flag.StringVar(&cfg.Fleet, "fleet", server.DefaultFleet, "fleet that devices enroll into")
	flag.BoolVar(&cfg.GRPCInsecure, "grpc-insecure", false, "serve the gRPC API without TLS (local experiments only)")
	tlsHosts := flag.String("tls-hosts", "", "extra comma-separated DNS names or IPs for the server certificate")
	publishers := flag.String("module-publishers", "", "JWK Set file of the module publisher keys to trust (fleetlearn module publisher-jwks)")
	writeNATS := flag.String("write-nats-config", "", "write the nats-server.conf fragment that makes an external NATS cluster trust this server's operator to FILE, and exit")
	resolverDir := flag.String("nats-resolver-dir", "/var/lib/nats/jwt", "with -write-nats-config: the resolver's JWT directory on the NATS servers")
	flag.Parse()
	if *writeNATS != "" {
		if err := server.WriteNATSResolverConfig(context.Background(), cfg.DataDir, *resolverDir, *writeNATS); err != nil {
			fmt.Fprintln(os.Stderr, "fleetlearn-server: -write-nats-config:", err)
			os.Exit(1)
		}
		fmt.Printf("wrote %s: include it in each NATS server's configuration, then run the aggregator with -nats-url and -data-dir %s\n",
			*writeNATS, cfg.DataDir)
		return
	}
	if *tlsHosts != "" {
		cfg.TLSHosts = strings.Split(*tlsHosts, ",")
	}
	if *publishers != "" {
		b, err := os.ReadFile(*publishers)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleetlearn-server: -module-publishers:", err)
			os.Exit(2)
		}
		cfg.ModulePublishersJWKS = b
	}

	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		fmt.Fprintln(os.Stderr, "fleetlearn-server: -log-level:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := server.New(cfg, server.WithLogger(log))
	if err == nil {
		err = s.Start(ctx)
	}
	if err != nil {
		log.Error("start failed", "err", err)
		os.Exit(1)
	}
	<-ctx.Done()
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Shutdown(sctx); err != nil {
		log.Error("shutdown", "err", err)
		os.Exit(1)
	}
}
