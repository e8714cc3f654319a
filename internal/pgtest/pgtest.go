// Package pgtest runs a real, throwaway PostgreSQL server for tests: one
// per test binary, in a temporary directory, on a free loopback port, with
// a fresh database for each test that asks.
//
// A package that uses it runs its tests through Main:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
// The server's programs come from $FLEETLEARN_PG_BIN, else from PATH, else
// from Debian's /usr/lib/postgresql/<version>/bin. Without them a test that
// asks for a database skips, saying how to install them; under CI (CI set
// in the environment) it fails, since .ci/run installs them.
package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/freeport"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
)

// EnvBin names a directory that holds initdb, pg_ctl and postgres.
const EnvBin = "FLEETLEARN_PG_BIN"

// Install is what a person runs to get the programs on Debian.
const Install = "apt-get install postgresql"

// user is the database superuser that tests connect as.
const superuser = "fleetlearn"

var (
	mu      sync.Mutex
	inMain  bool
	running *Server
	failed  error
	dbSeq   atomic.Int64
)

// Main runs the package's tests and then stops the server, if one was
// started. It returns m.Run's exit code.
func Main(m *testing.M) int {
	mu.Lock()
	inMain = true
	mu.Unlock()
	code := m.Run()
	mu.Lock()
	defer mu.Unlock()
	if running != nil {
		running.stop()
		running = nil
	}
	return code
}

// Server is a running PostgreSQL server.
type Server struct {
	dir    string // owns data/, the socket and the log
	port   int
	listen string // an address besides loopback, or ""
	bin    string
	cred   *syscall.Credential // the postgres user's, when tests run as root
	cmd    *exec.Cmd
	exited chan error
}

// URL is the address of database db on the server, as a
// postgres:// URL for pgx.
func (s *Server) URL(db string) string { return s.URLAt("127.0.0.1", db) }

// URLAt is URL for clients that reach the server at host.
func (s *Server) URLAt(host, db string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", superuser, net.JoinHostPort(host, strconv.Itoa(s.port)), db)
}

// Port is the server's TCP port on 127.0.0.1.
func (s *Server) Port() int { return s.port }

// Database creates an empty database for t on the test binary's server,
// starting the server on first use, and returns its URL. The database is
// dropped when t ends.
func Database(t testing.TB) string {
	t.Helper()
	return shared(t).Database(t)
}

// Database creates an empty database for t on s and returns its URL
// (on loopback); it is dropped when t ends.
func (s *Server) Database(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), dbSeq.Add(1))
	admin, err := sql.Open("pgx", s.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx := context.Background()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() {
		admin, err := sql.Open("pgx", s.URL("postgres"))
		if err != nil {
			return
		}
		defer admin.Close()
		admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	return s.URL(name)
}

func shared(t testing.TB) *Server {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if !inMain {
		t.Fatal("pgtest: the package's TestMain must run its tests through pgtest.Main, which stops the server at the end")
	}
	if running != nil {
		return running
	}
	if failed != nil {
		t.Fatalf("pgtest: %v", failed)
	}
	bin := binOrSkip(t)
	s, err := start(bin, "", "")
	if err != nil {
		failed = err
		t.Fatalf("pgtest: %v", err)
	}
	running = s
	return s
}

// Start starts a server for t alone, stopped when t ends, that listens on
// listen (an IP address of this machine) as well as loopback and lets in
// clients from the network trust (a CIDR) without a password, as it does
// those on loopback: for tests whose clients run on other hosts, such as
// network namespaces on a bridge that leads nowhere else.
func Start(t testing.TB, listen, trust string) *Server {
	t.Helper()
	if net.ParseIP(listen) == nil {
		t.Fatalf("pgtest: listen address %q is not an IP address", listen)
	}
	if _, _, err := net.ParseCIDR(trust); err != nil {
		t.Fatalf("pgtest: trusted network: %v", err)
	}
	s, err := start(binOrSkip(t), listen, trust)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(s.stop)
	return s
}

// binOrSkip finds the server's programs, or skips t (fails it under CI).
func binOrSkip(t testing.TB) string {
	t.Helper()
	bin, err := findBin()
	if err != nil {
		msg := fmt.Sprintf("needs PostgreSQL's server programs (initdb, pg_ctl): %v; install them (%s) or set %s to their directory", err, Install, EnvBin)
		if os.Getenv("CI") != "" {
			t.Fatal(msg + " (CI is set: .ci/run installs them)")
		}
		t.Skip(msg)
	}
	return bin
}

func findBin() (string, error) {
	if d := os.Getenv(EnvBin); d != "" {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err != nil {
			return "", fmt.Errorf("%s=%s: %w", EnvBin, d, err)
		}
		return d, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return versionOf(b) - versionOf(a) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no initdb on PATH or in /usr/lib/postgresql/*/bin")
}

func versionOf(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// start initializes a cluster in a new temporary directory and starts it.
// PostgreSQL refuses to run as root, so as root (CI's containers) the
// programs run as the postgres user, in a directory it owns.
func start(bin, listen, trust string) (*Server, error) {
	dir, err := os.MkdirTemp("", "fleetlearn-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, bin: bin, listen: listen}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root needs the postgres user to run the server (it comes with %s): %w", Install, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	data := filepath.Join(dir, "data")
	if out, err := s.run("initdb", "-D", data, "-A", "trust", "-U", superuser, "--no-sync", "-E", "UTF8", "--locale", "C"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	if trust != "" {
		hba, err := os.OpenFile(filepath.Join(data, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
		if err == nil {
			_, err = fmt.Fprintf(hba, "host all all %s trust\n", trust)
			if cerr := hba.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pg_hba.conf: %w", err)
		}
	}
	// A port is free when asked and may be taken before postgres binds it:
	// try a few.
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s.port = port
		if lastErr = s.launch(); lastErr == nil {
			return s, nil
		}
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// launch runs postgres in the foreground of a child process, so that the
// server dies with the test binary's process group if the binary is killed,
// and waits until it accepts connections.
func (s *Server) launch() error {
	listen := "127.0.0.1"
	if s.listen != "" {
		listen += "," + s.listen
	}
	args := []string{"-D", filepath.Join(s.dir, "data"), "-k", s.dir, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=" + listen, "-c", "fsync=off", "-c", "synchronous_commit=off",
		"-c", "full_page_writes=off", "-c", "max_connections=300", "-c", "log_min_messages=warning"}
	logf, err := os.Create(filepath.Join(s.dir, "log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: s.cred}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	db, err := sql.Open("pgx", s.URL("postgres"))
	if err != nil {
		cmd.Process.Kill()
		return err
	}
	defer db.Close()
	for {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
			return fmt.Errorf("postgres exited: %v\n%s", err, log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := db.PingContext(ctx)
		cancel()
		if err == nil {
			s.cmd, s.exited = cmd, exited
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *Server) run(prog string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(s.bin, prog), args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	return cmd.CombinedOutput()
}

// stop ends the server (a fast shutdown: it is throwaway) and removes its
// directory.
func (s *Server) stop() {
	if s.cmd != nil {
		s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			s.cmd.Process.Kill()
			<-s.exited
		}
	}
	os.RemoveAll(s.dir)
}

func freePort() (int, error) { return freeport.Get() }

// EndLockSession ends, from a connection of its own, the one session of
// the database at url that holds an advisory lock, as the server does for
// a client that died or went silent, and waits (up to 10 s) until it is
// gone. It fails t unless exactly one session held one.
func EndLockSession(t testing.TB, url string) {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	err = db.QueryRow(`SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_locks WHERE locktype = 'advisory' AND granted`).Scan(&n)
	if err != nil || n != 1 {
		t.Fatalf("pgtest: ending the session that holds an advisory lock: %d sessions, %v", n, err)
	}
}
