package identity_test

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/identity"
)

// serveOnce accepts one TLS connection, echoes one line and reports the
// client certificate's common name.
func serveOnce(t *testing.T, cfg *tls.Config) (string, <-chan string) {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	cn := make(chan string, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			cn <- "accept: " + err.Error()
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			cn <- "handshake: " + err.Error()
			return
		}
		name := ""
		if pc := tc.ConnectionState().PeerCertificates; len(pc) > 0 {
			name = pc[0].Subject.CommonName
		}
		_, _ = io.Copy(c, io.LimitReader(c, 5))
		cn <- name
	}()
	return lis.Addr().String(), cn
}

func dial(addr string, cfg *tls.Config) error {
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello")); err != nil {
		return err
	}
	b := make([]byte, 5)
	if _, err := io.ReadFull(c, b); err != nil {
		return err
	}
	if string(b) != "hello" {
		return errors.New("bad echo")
	}
	return nil
}

func TestTLS(t *testing.T) {
	dir := t.TempDir()
	bundle, err := identity.LoadOrCreateTLS(dir, []string{"127.0.0.1", "fleetlearn.local"})
	if err != nil {
		t.Fatal(err)
	}
	for f, mode := range map[string]os.FileMode{identity.CAKeyFile: 0o600, identity.ServerKeyFile: 0o600, identity.CACertFile: 0o644, identity.ServerCertFile: 0o644} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm() != mode {
			t.Fatalf("%s: %v %v", f, err, st)
		}
	}
	// Server-only TLS, verified against the CA.
	addr, _ := serveOnce(t, bundle.ServerConfig(false))
	cc, err := identity.ClientConfig(bundle.CAPEM(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := dial(addr, cc); err != nil {
		t.Fatal(err)
	}
	// Mutual TLS: a CA-issued client certificate is required.
	addr, cn := serveOnce(t, bundle.ServerConfig(true))
	certPEM, keyPEM, err := bundle.IssueClientCert("edge-17", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	mc, err := identity.ClientConfig(bundle.CAPEM(), certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if err := dial(addr, mc); err != nil {
		t.Fatal(err)
	}
	if got := <-cn; got != "edge-17" {
		t.Fatalf("server saw %q", got)
	}
	addr, cn = serveOnce(t, bundle.ServerConfig(true))
	if err := dial(addr, cc); err == nil {
		t.Fatal("mTLS server accepted a client without a certificate")
	}
	<-cn

	// Reloading keeps the CA and the server certificate.
	again, err := identity.LoadOrCreateTLS(dir, []string{"fleetlearn.local"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.CAPEM(), bundle.CAPEM()) || !bytes.Equal(again.ServerCertificate().Certificate[0], bundle.ServerCertificate().Certificate[0]) {
		t.Fatal("reload replaced the CA or the server certificate")
	}
	// A new host, or a near expiry, re-issues the server certificate under the same CA.
	more, err := identity.LoadOrCreateTLS(dir, []string{"127.0.0.1", "fleetlearn.local", "agg.example.org"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(more.CAPEM(), bundle.CAPEM()) || bytes.Equal(more.ServerCertificate().Certificate[0], bundle.ServerCertificate().Certificate[0]) {
		t.Fatal("new host did not re-issue the server certificate under the same CA")
	}
	late := func() time.Time { return time.Now().Add(340 * 24 * time.Hour) }
	renewed, err := identity.LoadOrCreateTLS(dir, []string{"127.0.0.1"}, identity.WithClock(late))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(renewed.ServerCertificate().Certificate[0], more.ServerCertificate().Certificate[0]) {
		t.Fatal("certificate expiring within 30 days was kept")
	}
	// Another CA's client certificate is refused.
	other, err := identity.LoadOrCreateTLS(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	oc, ok, err := other.IssueClientCert("mallory", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := identity.ClientConfig(bundle.CAPEM(), oc, ok)
	if err != nil {
		t.Fatal(err)
	}
	addr, cn = serveOnce(t, renewed.ServerConfig(true))
	if err := dial(addr, foreign); err == nil {
		t.Fatal("client certificate from another CA accepted")
	}
	<-cn
}

func TestTLSRefuses(t *testing.T) {
	if _, err := identity.LoadOrCreateTLS(t.TempDir(), nil); !errors.Is(err, identity.ErrBadInput) {
		t.Errorf("no hosts: %v", err)
	}
	if _, err := identity.LoadOrCreateTLS(t.TempDir(), []string{"bad host"}); !errors.Is(err, identity.ErrBadInput) {
		t.Errorf("bad host: %v", err)
	}
	dir := t.TempDir()
	b, err := identity.LoadOrCreateTLS(dir, []string{"localhost"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		ttl  time.Duration
	}{{"", time.Hour}, {"x", 0}, {"x", identity.MaxClientCertTTL + time.Hour}} {
		if _, _, err := b.IssueClientCert(c.name, c.ttl); !errors.Is(err, identity.ErrBadInput) {
			t.Errorf("IssueClientCert(%q, %v): %v", c.name, c.ttl, err)
		}
	}
	// A CA certificate without its key is not silently replaced.
	if err := os.Remove(filepath.Join(dir, identity.CAKeyFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := identity.LoadOrCreateTLS(dir, []string{"localhost"}); err == nil {
		t.Error("CA without key accepted")
	}
	if _, err := identity.ClientConfig([]byte("nope"), nil, nil); !errors.Is(err, identity.ErrBadKey) {
		t.Errorf("bad CA PEM: %v", err)
	}
}
