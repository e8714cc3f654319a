package client_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/identity"
)

// tlsServer serves health over TLS from a fresh CA and reports each call's
// authorization header.
func tlsServer(t *testing.T) (addr string, ca []byte, auth chan string) {
	t.Helper()
	tl, err := identity.LoadOrCreateTLS(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	auth = make(chan string, 8)
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(tl.ServerConfig(false))),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			auth <- firstOr(md.Get("authorization"))
			return h(ctx, req)
		}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), tl.CAPEM(), auth
}

func firstOr(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

func check(conn *grpc.ClientConn) error {
	_, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	return err
}

func TestDialTLSWithToken(t *testing.T) {
	addr, ca, auth := tlsServer(t)
	conn, err := client.Dial(addr, client.WithCA(ca), client.WithToken(" tok.en \n"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := check(conn); err != nil {
		t.Fatal(err)
	}
	if got := <-auth; got != "Bearer tok.en" {
		t.Errorf("authorization %q", got)
	}

	// Another CA, or the system roots, do not vouch for the server.
	other, err := identity.LoadOrCreateTLS(t.TempDir(), []string{"localhost"})
	if err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]client.DialOption{
		"other CA":     {client.WithCA(other.CAPEM())},
		"system roots": nil,
		"plaintext":    {client.WithInsecure()},
	} {
		c, err := client.Dial(addr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := check(c); status.Code(err) != codes.Unavailable {
			t.Errorf("%s: %v", name, err)
		}
		c.Close()
	}
}

func TestDialRefusesBadSettings(t *testing.T) {
	if _, err := client.Dial("127.0.0.1:1", client.WithCA([]byte("not pem"))); !errors.Is(err, client.ErrConfig) {
		t.Errorf("bad CA: %v", err)
	}
	if _, err := client.Dial("127.0.0.1:1", client.WithInsecure(), client.WithCA([]byte("x"))); !errors.Is(err, client.ErrConfig) {
		t.Errorf("insecure with CA: %v", err)
	}
}

// A token is never sent in the clear unless WithInsecure says so.
func TestTokenNeedsTLSUnlessInsecure(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	auth := make(chan string, 1)
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		auth <- firstOr(md.Get("authorization"))
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := client.Dial(lis.Addr().String(), client.WithInsecure(), client.WithToken("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := check(conn); err != nil {
		t.Fatal(err)
	}
	if got := <-auth; got != "Bearer t" {
		t.Errorf("authorization %q", got)
	}
}

func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if tok, err := client.ReadToken(write("ok", "abc.def.ghi\n")); err != nil || tok != "abc.def.ghi" {
		t.Errorf("ReadToken = %q, %v", tok, err)
	}
	for name, content := range map[string]string{"empty": "\n", "two": "a b\n"} {
		if _, err := client.ReadToken(write(name, content)); !errors.Is(err, client.ErrConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := client.ReadToken(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing file read")
	}
}

// A program talking to a server started with --data-dir /var/lib/fleetlearn.
func ExampleDial() {
	ca, err := os.ReadFile("/var/lib/fleetlearn/tls/ca.crt")
	if err != nil {
		return
	}
	token, err := client.ReadToken("/var/lib/fleetlearn/admin.token")
	if err != nil {
		return
	}
	conn, err := client.Dial("fleetlearn.example.com:7070", client.WithCA(ca), client.WithToken(token))
	if err != nil {
		return
	}
	defer conn.Close()
}
