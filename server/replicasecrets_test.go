package server_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/natstest"
	"github.com/fleetlearn/fleetlearn/internal/pgtest"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
)

// replicaSecretPaths are the files the replicated Kubernetes overlay's
// Secret lays out for --secrets-from, by path below the mount, and the
// mode the data directory must keep each with.
var replicaSecretPaths = map[string]fs.FileMode{
	"tls/" + identity.CACertFile:   0o644,
	"tls/" + identity.CAKeyFile:    0o600,
	"keys/" + server.APIKeyFile:    0o600,
	"keys/" + server.EnrollKeyFile: 0o600,
	server.AdminTokenFile:          0o600,
	audit.KeysFile:                 0o600,
}

// secretPaths are the paths of replicaSecretPaths.
func secretPaths() []string {
	var ps []string
	for p := range replicaSecretPaths {
		ps = append(ps, p)
	}
	return ps
}

// localConfig is a server on an embedded NATS, every listener on a free
// loopback port.
func localConfig(t *testing.T, dataDir string) server.Config {
	cfg := externalConfig(t, dataDir, "")
	cfg.NATSListen = servertest.FreeAddr(t)
	return cfg
}

// secretItemsVolume lays out the files paths of dir (relative, possibly in
// subdirectories) as the kubelet mounts a Secret whose items name those
// paths: the files, group-readable, in a timestamped directory behind
// ..data, and each top-level name a link through ..data.
func secretItemsVolume(t *testing.T, dir string, paths []string) string {
	t.Helper()
	vol := t.TempDir()
	ts := "..2025_01_02_03_04_05.123456789"
	top := map[string]bool{}
	for _, p := range paths {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(vol, ts, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dst, 0o640); err != nil { // past the umask
			t.Fatal(err)
		}
		top[strings.Split(p, "/")[0]] = true
	}
	for name := range top {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(vol, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(ts, filepath.Join(vol, "..data")); err != nil {
		t.Fatal(err)
	}
	return vol
}

// secretFiles reads every regular file below the entries of
// server.ReplicaSecrets in dataDir, by path relative to it; entries not
// there are left out.
func secretFiles(t *testing.T, dataDir string) map[string]authFile {
	t.Helper()
	out := map[string]authFile{}
	for _, entry := range server.ReplicaSecrets {
		root := filepath.Join(dataDir, entry)
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if p == root && errors.Is(err, fs.ErrNotExist) {
				return nil // absent: the caller compares what is there
			}
			if err != nil || d.IsDir() {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dataDir, p)
			out[filepath.ToSlash(rel)] = authFile{b, fi.Mode()}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", entry, err)
		}
	}
	return out
}

// writeReplicaSecrets makes the offline copy of the documented step.
func writeReplicaSecrets(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "fleetlearn-replica")
	if err := server.WriteReplicaSecrets(context.Background(), src); err != nil {
		t.Fatal(err)
	}
	return src
}

// TestWriteReplicaSecrets: the offline step creates every entry of
// server.ReplicaSecrets, and a second run keeps what the first made.
func TestWriteReplicaSecrets(t *testing.T) {
	src := writeReplicaSecrets(t)
	for _, entry := range server.ReplicaSecrets {
		fi, err := os.Stat(filepath.Join(src, entry))
		if err != nil {
			t.Errorf("%s: %v", entry, err)
		} else if fi.IsDir() {
			if es, _ := os.ReadDir(filepath.Join(src, entry)); len(es) == 0 {
				t.Errorf("%s is empty", entry)
			}
		}
	}
	if fi, err := os.Stat(src); err != nil || fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("%s: %v, want a private directory", src, err)
	}
	before := secretFiles(t, src)
	if err := server.WriteReplicaSecrets(context.Background(), src); err != nil {
		t.Fatal(err)
	}
	after := secretFiles(t, src)
	if len(after) != len(before) {
		t.Errorf("%d files after the second run, %d before", len(after), len(before))
	}
	for name, f := range before {
		if !bytes.Equal(after[name].data, f.data) {
			t.Errorf("%s changed in the second run", name)
		}
	}
}

// TestSecretsFrom: an aggregator on a fresh data directory takes the
// replica secrets from a Secret volume laid out by items (nested paths,
// group-readable, behind links), keeps private copies, and serves with
// them: the CA and admin token are the copy's.
func TestSecretsFrom(t *testing.T) {
	src := writeReplicaSecrets(t)
	vol := secretItemsVolume(t, src, secretPaths())
	dataDir := filepath.Join(t.TempDir(), "fresh")
	h := servertest.New(t, servertest.WithDataDir(dataDir), servertest.WithConfig(func(c *server.Config) { c.SecretsFrom = vol }))

	want := secretFiles(t, src)
	got := secretFiles(t, dataDir)
	for _, p := range secretPaths() {
		f, ok := got[p]
		switch {
		case !ok:
			t.Errorf("%s was not copied into %s", p, dataDir)
		case !f.mode.IsRegular() || f.mode.Perm() != replicaSecretPaths[p]:
			t.Errorf("%s has mode %v, want a regular file with %v", p, f.mode, replicaSecretPaths[p])
		case !bytes.Equal(f.data, want[p].data):
			t.Errorf("%s differs from the Secret's", p)
		}
	}
	if !bytes.Equal(h.CACertPEM(), want["tls/"+identity.CACertFile].data) {
		t.Error("the server's CA is not the Secret's")
	}
	if h.AdminToken() != strings.TrimSpace(string(want[server.AdminTokenFile].data)) {
		t.Error("the server's admin token is not the Secret's")
	}
	own, err := os.ReadFile(filepath.Join(dataDir, server.TLSDir, identity.ServerCertFile))
	if err != nil {
		t.Fatal(err)
	}
	if other, _ := os.ReadFile(filepath.Join(src, server.TLSDir, identity.ServerCertFile)); bytes.Equal(own, other) {
		t.Error("the server certificate was copied: each replica issues its own")
	}

	// The first replica's whole data directory as the copy: every entry of
	// server.ReplicaSecrets, nats-auth included, arrives as it is there.
	t.Run("data directory", func(t *testing.T) {
		dataDir := filepath.Join(t.TempDir(), "second")
		servertest.New(t, servertest.WithDataDir(dataDir), servertest.WithConfig(func(c *server.Config) { c.SecretsFrom = h.Dir }))
		want, got := secretFiles(t, h.Dir), secretFiles(t, dataDir)
		if len(want) == 0 {
			t.Fatal("no secret files in the first data directory")
		}
		for p, f := range want {
			if g, ok := got[p]; !ok || !bytes.Equal(g.data, f.data) {
				t.Errorf("%s: not copied, or not as in the first data directory", p)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%d secret files in the second data directory, %d in the first", len(got), len(want))
		}
	})
}

// TestSecretsFromOtherDeployment: a data directory that holds other keys
// is not overwritten: Start fails naming both files, and nothing in the
// data directory changes.
func TestSecretsFromOtherDeployment(t *testing.T) {
	vol := secretItemsVolume(t, writeReplicaSecrets(t), secretPaths())
	dataDir := writeReplicaSecrets(t)
	before := secretFiles(t, dataDir)

	cfg := localConfig(t, dataDir)
	cfg.SecretsFrom = vol
	err := startFails(t, cfg)
	ca := filepath.Join(server.TLSDir, identity.CACertFile)
	wantErrContains(t, err, "--secrets-from", filepath.Join(dataDir, ca), filepath.Join(vol, ca))
	after := secretFiles(t, dataDir)
	if len(after) != len(before) {
		t.Errorf("%d files after the refused import, %d before", len(after), len(before))
	}
	for name, b := range before {
		if a, ok := after[name]; !ok || !bytes.Equal(a.data, b.data) || a.mode != b.mode {
			t.Errorf("%s changed in the refused import", name)
		}
	}
}

// TestSecretsFromRenewedAdminToken: a replica's own admin token (one it
// renewed) is replaced by the Secret's, not refused: tokens are minted
// again from the shared API key, and refusing would stop every replica
// once it had renewed its token.
func TestSecretsFromRenewedAdminToken(t *testing.T) {
	src := writeReplicaSecrets(t)
	vol := secretItemsVolume(t, src, secretPaths())
	dataDir := t.TempDir()
	for _, p := range secretPaths() {
		if p == server.AdminTokenFile {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, p))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dataDir, p)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dataDir, p), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Same keys, a token of its own.
	if err := server.WriteReplicaSecrets(context.Background(), dataDir); err != nil {
		t.Fatal(err)
	}
	own, err := os.ReadFile(server.AdminTokenPath(dataDir))
	if err != nil {
		t.Fatal(err)
	}
	shared, err := os.ReadFile(server.AdminTokenPath(src))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(own, shared) {
		t.Fatal("the data directory's admin token is the Secret's already")
	}
	s := servertest.New(t, servertest.WithDataDir(dataDir), servertest.WithConfig(func(c *server.Config) { c.SecretsFrom = vol }))
	if s.AdminToken() != strings.TrimSpace(string(shared)) {
		t.Error("the server's admin token is not the Secret's")
	}
	if b, err := os.ReadFile(server.AdminTokenPath(dataDir)); err != nil || !bytes.Equal(b, shared) {
		t.Errorf("%s: %v; want the Secret's token", server.AdminTokenPath(dataDir), err)
	}
}

// TestSecretsFromIncomplete: a copy without the enrollment key is refused
// with the missing file and how to write the copy, and nothing is
// imported.
func TestSecretsFromIncomplete(t *testing.T) {
	src := writeReplicaSecrets(t)
	var paths []string
	for _, p := range secretPaths() {
		if p != "keys/"+server.EnrollKeyFile {
			paths = append(paths, p)
		}
	}
	vol := secretItemsVolume(t, src, paths)
	dataDir := t.TempDir()
	cfg := localConfig(t, dataDir)
	cfg.SecretsFrom = vol
	err := startFails(t, cfg)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Start: %v, want fs.ErrNotExist", err)
	}
	wantErrContains(t, err, filepath.Join(vol, server.KeysDir, server.EnrollKeyFile), "--secrets-from", "replica-secrets")
	if got := secretFiles(t, dataDir); len(got) != 0 {
		t.Errorf("the refused import left %d files: %v", len(got), got)
	}
}

// TestSecretsFromReplicas: two replicas on PostgreSQL started from one
// copy of the secrets; when the leader stops, the standby that takes over
// serves with the same CA and the same admin token, so clients notice
// nothing but a reconnection.
func TestSecretsFromReplicas(t *testing.T) {
	pg, ns := pgtest.Database(t), natstest.Start(t)
	vol := secretItemsVolume(t, writeReplicaSecrets(t), secretPaths())
	start := func(name string) (*server.Server, <-chan error) {
		s, err := server.New(server.Config{DataDir: t.TempDir(), Store: pg, ReplicaName: name, LeaseTTL: 2 * time.Second,
			NATSURL: ns.ClientURL(), InsecureNATS: true, GRPCAddr: "127.0.0.1:0", MetricsAddr: "off", SecretsFrom: vol},
			server.WithLogger(testLogger()))
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan error, 1)
		ctx, cancel := context.WithCancel(context.Background())
		go func() { started <- s.Start(ctx) }()
		t.Cleanup(func() {
			cancel()
			s.Shutdown(context.Background())
		})
		return s, started
	}
	a, aStarted := start("agg-a")
	if err := <-aStarted; err != nil {
		t.Fatal(err)
	}
	b, bStarted := start("agg-b")
	for {
		err := b.Ready(context.Background())
		if err != nil && strings.Contains(err.Error(), "standby: replica agg-a leads") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	caA, tokenA := a.CACertPEM(), a.AdminToken()
	if err := a.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-bStarted; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.CACertPEM(), caA) {
		t.Error("the new leader's CA is not the old leader's")
	}
	if b.AdminToken() != tokenA {
		t.Error("the new leader's admin token is not the old leader's")
	}
}
