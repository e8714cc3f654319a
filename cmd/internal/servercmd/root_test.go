package servercmd

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/cliflags"
	"github.com/fleetlearn/fleetlearn/server"
)

// result is what one command line did.
type result struct {
	served bool
	cfg    server.Config
	level  slog.Level
	out    string
	err    error
}

// execute runs the command on args as main does, with a serve that only
// records the configuration it was given.
func execute(t *testing.T, args ...string) result {
	t.Helper()
	var r result
	root := newRootCommand(func(_ context.Context, cfg server.Config, log *slog.Logger, _ ...server.Option) error {
		r.served, r.cfg = true, cfg
		for _, l := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
			if log.Enabled(context.Background(), l) {
				r.level = l
				break
			}
		}
		return nil
	})
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(cliflags.SingleDash(root, args))
	r.err = root.ExecuteContext(t.Context())
	r.out = out.String()
	return r
}

// singleDash spells args as the Go flag package took them: "-name value"
// where joined is false, "-name=value" where it is true.
func singleDash(args []string, joined bool) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := strings.TrimPrefix(args[i], "-")
		if joined && !strings.Contains(a, "=") && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			out = append(out, a+"="+args[i+1])
			i++
			continue
		}
		out = append(out, a)
	}
	return out
}

// The Go flag package's spellings and cobra's give the same configuration.
func TestFlagSpellings(t *testing.T) {
	dir := t.TempDir()
	jwks := filepath.Join(dir, "publishers.jwks")
	if err := os.WriteFile(jwks, []byte(`{"keys":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{
		"--data-dir", filepath.Join(dir, "data"), "--nats-url", "nats://a:4222,nats://b:4222",
		"--nats-listen", "10.0.0.1:4333", "--grpc-addr", "10.0.0.1:7171", "--metrics-addr", "off",
		"--pace-window", "750ms", "--replicas", "3", "--nats-tls", "--insecure-nats", "--grpc-insecure",
		"--audit-origin", "fl.example.com/audit", "--audit-witness", "w1+01+AAAA", "--audit-witness", "w2+02+BBBB",
		"--log-level", "warn", "--fleet", "north", "--tls-hosts", "fl.example.com,10.0.0.1",
		"--module-publishers", jwks, "--public-host", "fl.example.com",
		"--nats-advertise", "nats://lb.example.com:4222", "--nats-auth-from", "/etc/fleetlearn/nats-auth",
		"--store", "postgres://fl@db.example.com:5432/fleetlearn", "--replica-name", "agg-1", "--lease-ttl", "6s",
		"--secrets-from", "/etc/fleetlearn/replica", "--api-advertise", "agg-1.example.com:7171",
	}
	want := server.Config{DataDir: filepath.Join(dir, "data"), NATSURL: "nats://a:4222,nats://b:4222",
		NATSListen: "10.0.0.1:4333", GRPCAddr: "10.0.0.1:7171", MetricsAddr: "off", PaceWindow: 750 * time.Millisecond,
		Replicas: 3, NATSTLS: true, InsecureNATS: true, GRPCInsecure: true, AuditOrigin: "fl.example.com/audit",
		AuditWitnesses: []string{"w1+01+AAAA", "w2+02+BBBB"}, Fleet: "north", TLSHosts: []string{"fl.example.com", "10.0.0.1"},
		ModulePublishersJWKS: []byte(`{"keys":[]}`), PublicHost: "fl.example.com",
		NATSAdvertise: "nats://lb.example.com:4222", NATSAuthFrom: "/etc/fleetlearn/nats-auth",
		Store: "postgres://fl@db.example.com:5432/fleetlearn", ReplicaName: "agg-1", LeaseTTL: 6 * time.Second,
		SecretsFrom: "/etc/fleetlearn/replica", APIAdvertise: "agg-1.example.com:7171"}
	for name, a := range map[string][]string{
		"--name value": args,
		"-name value":  singleDash(args, false),
		"-name=value":  singleDash(args, true),
	} {
		r := execute(t, a...)
		if r.err != nil || !r.served {
			t.Fatalf("%s: served %v, err %v", name, r.served, r.err)
		}
		if !reflect.DeepEqual(r.cfg, want) {
			t.Errorf("%s: config\n%+v, want\n%+v", name, r.cfg, want)
		}
		if r.level != slog.LevelWarn {
			t.Errorf("%s: log level %v", name, r.level)
		}
	}
}

// With no flags the server gets the defaults it always had: everything on
// loopback.
func TestDefaults(t *testing.T) {
	r := execute(t)
	if r.err != nil || !r.served {
		t.Fatalf("served %v, err %v", r.served, r.err)
	}
	want := server.Config{DataDir: "fleetlearn-data", NATSListen: "127.0.0.1:4222", GRPCAddr: "127.0.0.1:7070",
		MetricsAddr: "127.0.0.1:9464", PaceWindow: 2 * time.Second, AuditOrigin: audit.DefaultOrigin,
		Fleet: server.DefaultFleet}
	if !reflect.DeepEqual(r.cfg, want) {
		t.Errorf("config\n%+v, want\n%+v", r.cfg, want)
	}
	if r.level != slog.LevelInfo {
		t.Errorf("log level %v", r.level)
	}
}

// --public-host leaves the listen addresses not given to the server, which
// opens them on every interface; those given stay; metrics stay on loopback.
func TestPublicHost(t *testing.T) {
	r := execute(t, "-public-host", "fl.example.com")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.cfg.PublicHost != "fl.example.com" || r.cfg.GRPCAddr != "" || r.cfg.NATSListen != "" || r.cfg.MetricsAddr != "127.0.0.1:9464" {
		t.Errorf("public host %q, grpc %q, nats %q, metrics %q", r.cfg.PublicHost, r.cfg.GRPCAddr, r.cfg.NATSListen, r.cfg.MetricsAddr)
	}
	r = execute(t, "--public-host=fl.example.com", "-grpc-addr=127.0.0.1:7070")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.cfg.GRPCAddr != "127.0.0.1:7070" || r.cfg.NATSListen != "" {
		t.Errorf("grpc %q, nats %q", r.cfg.GRPCAddr, r.cfg.NATSListen)
	}
}

func TestVersion(t *testing.T) {
	want := versionLine() + "\n"
	if !strings.HasPrefix(want, "fleetlearn-server ") || !strings.Contains(want, ", module ABI 1-4") {
		t.Fatalf("version line %q", want)
	}
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}, {"-v"}} {
		r := execute(t, args...)
		if r.err != nil || r.served || r.out != want {
			t.Errorf("%q: printed %q, served %v, err %v; want %q", args, r.out, r.served, r.err, want)
		}
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-help"}, {"-h"}} {
		r := execute(t, args...)
		if r.err != nil || r.served {
			t.Fatalf("%q: served %v, err %v", args, r.served, r.err)
		}
		for _, s := range []string{"tls/ca.crt", "admin.token", "--public-host", "--nats-monitor", "Examples:", "-data-dir DIR"} {
			if !strings.Contains(r.out, s) {
				t.Errorf("%q: help does not mention %q", args, s)
			}
		}
	}
}

// Command lines that cannot work are usage errors (exit status 2), found
// before anything starts.
func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--bogus"},
		{"-data-dir"},
		{"serve"},
		{"--log-level", "loud"},
		{"--replicas", "many"},
		{"--nats-url", "nats://a:4222", "--nats-monitor", "127.0.0.1:8222"},
		{"--module-publishers", filepath.Join(t.TempDir(), "missing.jwks")},
		// A unit whose store variable came out empty: not a replica on
		// SQLite.
		{"--store=", "--replica-name", "agg-1"},
		{"--lease-ttl", "5s"},
		{"--api-advertise", "agg-1.example.com:7070"},
		{"replica-secrets"},
	} {
		r := execute(t, args...)
		if r.served || !isUsage(r.err) {
			t.Errorf("%q: served %v, err %v; want a usage error", args, r.served, r.err)
		}
	}
}

// -write-nats-config writes the external cluster's configuration and exits,
// in both spellings, into a data directory that does not exist yet.
func TestWriteNATSConfig(t *testing.T) {
	for _, args := range [][]string{
		{"-data-dir", "D", "-write-nats-config", "F", "-nats-resolver-dir", "/srv/jwt"},
		{"--data-dir=D", "--write-nats-config=F", "--nats-resolver-dir=/srv/jwt"},
	} {
		dir := t.TempDir()
		data, conf := filepath.Join(dir, "data"), filepath.Join(dir, "nats.conf")
		for i, a := range args {
			args[i] = strings.NewReplacer("=D", "="+data, "=F", "="+conf).Replace(a)
			if a == "D" {
				args[i] = data
			}
			if a == "F" {
				args[i] = conf
			}
		}
		r := execute(t, args...)
		if r.err != nil || r.served {
			t.Fatalf("%q: served %v, err %v", args, r.served, r.err)
		}
		b, err := os.ReadFile(conf)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "operator") || !strings.Contains(string(b), "/srv/jwt") {
			t.Errorf("%q: configuration:\n%s", args, b)
		}
		if !strings.Contains(r.out, "wrote "+conf) {
			t.Errorf("%q: printed %q", args, r.out)
		}
	}
}

// --write-nats-config - prints the configuration alone, for a pipe or a
// Kubernetes Secret.
func TestWriteNATSConfigStdout(t *testing.T) {
	data := filepath.Join(t.TempDir(), "fresh", "data")
	r := execute(t, "--data-dir", data, "--write-nats-config", "-", "--nats-resolver-dir", "/data/jwt")
	if r.err != nil || r.served {
		t.Fatalf("served %v, err %v", r.served, r.err)
	}
	if !strings.HasPrefix(r.out, "operator") && !strings.Contains(r.out, "\noperator") || !strings.Contains(r.out, "/data/jwt") ||
		strings.Contains(r.out, "wrote") {
		t.Fatalf("standard output is not the configuration alone:\n%s", r.out)
	}
	if _, err := os.Stat(filepath.Join(data, server.NATSAuthDir)); err != nil {
		t.Fatalf("the authority was not created: %v", err)
	}
}

// ca prints the CA the server wrote, and says when there is none yet.
func TestCA(t *testing.T) {
	dir := t.TempDir()
	r := execute(t, "ca", "--data-dir", dir)
	if r.err == nil || !strings.Contains(r.err.Error(), "first start") {
		t.Fatalf("no CA yet: %v", r.err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "tls"), 0o700); err != nil {
		t.Fatal(err)
	}
	pem := "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
	if err := os.WriteFile(filepath.Join(dir, "tls", "ca.crt"), []byte(pem), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := execute(t, "ca", "--data-dir", dir); r.err != nil || r.out != pem {
		t.Fatalf("ca: %v, %q", r.err, r.out)
	}
}

// replica-secrets writes every secret the replicas share into a new
// directory, and the secrets a second run finds are kept.
func TestReplicaSecrets(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "fleetlearn-replica")
	r := execute(t, "replica-secrets", "--data-dir", dir)
	if r.err != nil || r.served {
		t.Fatalf("served %v, err %v", r.served, r.err)
	}
	if !strings.Contains(r.out, "--secrets-from "+dir) {
		t.Errorf("printed %q", r.out)
	}
	ca, err := os.ReadFile(server.CAFile(dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, entry := range server.ReplicaSecrets {
		if _, err := os.Stat(filepath.Join(dir, entry)); err != nil {
			t.Errorf("%s: %v", entry, err)
		}
	}
	if r := execute(t, "replica-secrets", "-data-dir", dir); r.err != nil {
		t.Fatal(r.err)
	}
	if again, err := os.ReadFile(server.CAFile(dir)); err != nil || !bytes.Equal(again, ca) {
		t.Errorf("the second run replaced the CA (%v)", err)
	}
}
