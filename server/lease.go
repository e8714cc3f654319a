package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/sqldb"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// LeaseName is the lease under which an aggregator runs rounds and pool
// jobs: of the replicas sharing a PostgreSQL store, the one that holds it.
const LeaseName = "coordinator"

// DefaultLeaseTTL is the default Config.LeaseTTL.
const DefaultLeaseTTL = 10 * time.Second

// ReplicaSecrets are the files and folders of a data directory that every
// replica of a replicated aggregator must hold the same copies of, as a
// deployment mounts them from one secret: the TLS CA (each replica issues
// its own server certificate from it), the API and enrollment token keys,
// the admin token, the NATS authority's keys and the audit log's keys.
// Everything else in a data directory is the replica's own.
var ReplicaSecrets = []string{
	filepath.Join(TLSDir, identity.CACertFile), filepath.Join(TLSDir, identity.CAKeyFile),
	KeysDir, AdminTokenFile, NATSAuthDir, audit.KeysFile,
}

// replicated reports whether the store is shared by replicas (PostgreSQL)
// rather than an SQLite file of this aggregator's own.
func (c *Config) replicated() bool { return sqldb.IsPostgresURL(c.Store) }

// storeTarget is what store.Open opens: the PostgreSQL URL, or the SQLite
// file in the data directory.
func (c *Config) storeTarget() string {
	if c.Store != "" {
		return c.Store
	}
	return StoreFile(c.DataDir)
}

// checkStoreConfig refuses a store the server cannot run on, before
// anything is created.
func checkStoreConfig(cfg *Config) error {
	if cfg.Store != "" && !cfg.replicated() {
		return fmt.Errorf("server: store %q: give a PostgreSQL URL (postgres://user@host:5432/db), or nothing for the SQLite file in the data directory", cfg.Store)
	}
	if !cfg.replicated() {
		return nil
	}
	if cfg.NATSURL == "" {
		return errors.New("server: a PostgreSQL store is for replicated aggregators, which share an external NATS cluster: give NATSURL (--nats-url) too")
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.LeaseTTL < store.MinLeaseTTL {
		return fmt.Errorf("server: lease ttl %v is below %v", cfg.LeaseTTL, store.MinLeaseTTL)
	}
	if a := cfg.APIAdvertise; a != "" {
		h, p, err := net.SplitHostPort(a)
		ip := net.ParseIP(h)
		if err != nil || p == "" || p == "0" || ip == nil && !isDNSName(h) || ip != nil && ip.IsUnspecified() {
			return fmt.Errorf("server: API advertise address %q: give host:port that the other replicas reach this one's gRPC API at", a)
		}
		cfg.TLSHosts = append(slices.Clone(cfg.TLSHosts), h)
	}
	if cfg.ReplicaName == "" {
		host, _ := os.Hostname()
		cfg.ReplicaName = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	return nil
}

// standby is what a replica waiting for the lease knows of the leader:
// its name and API address, for /readyz and for forwarding the API, or
// why the lease could not be read.
type standby struct{ holder, address, err string }

// lead waits until this replica holds the lease; meanwhile it is a
// standby and /readyz says who leads. It tries again every quarter ttl,
// so a standby takes over within about that of the database freeing the
// lease (a leader's death frees it when its connection closes; a
// leader's silence, after the ttl).
func (s *Server) lead(ctx context.Context) (*store.Leadership, error) {
	ttl := s.cfg.LeaseTTL
	logged := ""
	for {
		l, err := s.store.TryLead(ctx, LeaseName, s.cfg.ReplicaName, s.grpcAdvertise(), ttl, s.o.now())
		if err != nil {
			s.o.log.WarnContext(ctx, "standby: cannot reach the lease; trying again", "err", err)
			s.standby.Store(&standby{err: err.Error()})
		} else if l != nil {
			s.standby.Store(nil)
			f := l.Fence()
			s.o.log.InfoContext(ctx, "leading: this replica runs the rounds", "replica", f.Holder, "epoch", f.Epoch)
			return l, nil
		} else if cur, err := s.store.Lease(ctx, LeaseName); err == nil || errors.Is(err, backend.ErrNotFound) {
			s.standby.Store(&standby{holder: cur.Holder, address: cur.Address})
			if cur.Holder != logged {
				s.o.log.InfoContext(ctx, "standby: another replica leads; waiting for the lease", "leader", cur.Holder, "epoch", cur.Epoch)
				logged = cur.Holder
			}
		}
		if !clock.Sleep(s.o.clock, ttl/4, ctx.Done()) {
			return nil, fmt.Errorf("server: waiting for the lease: %w", ctx.Err())
		}
	}
}

// keepLease renews the lease every quarter ttl until Shutdown. A failed
// renewal ends the leadership: the server stops its rounds and pool jobs
// at once (a newer leader's epoch would fence their writes anyway) and
// reports the loss on Lost, for the program to exit and be restarted as a
// standby.
func (s *Server) keepLease(l *store.Leadership) {
	ttl := s.cfg.LeaseTTL
	s.leaseStop, s.leaseDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.leaseDone)
		t := s.o.clock.NewTicker(ttl / 4)
		defer t.Stop()
		for {
			select {
			case <-s.leaseStop:
				return
			case <-t.C():
			}
			ctx, cancel := context.WithTimeout(context.Background(), ttl/2)
			err := l.Renew(ctx)
			cancel()
			if err != nil {
				s.loseLease(l, err)
				return
			}
		}
	}()
}

func (s *Server) loseLease(l *store.Leadership, err error) {
	s.o.log.Error("lost the lease: this replica stops running rounds; restart it to rejoin as a standby", "err", err)
	s.deposed.Store(true)
	s.runMu.Lock() // a Start in progress finishes (or stops) first
	c, p := s.coord, s.pool
	s.runMu.Unlock()
	if c != nil {
		c.Shutdown()
	}
	if p != nil {
		p.Shutdown()
	}
	l.Release()
	s.lost <- fmt.Errorf("server: lost the lease %s (epoch %d): %w", LeaseName, l.Fence().Epoch, err)
}

// Lost delivers an error when this replica has lost its lease and stopped
// running rounds: the program should shut the server down and exit, to be
// restarted as a standby. Only a replicated server (PostgreSQL store)
// ever loses one.
func (s *Server) Lost() <-chan error { return s.lost }

// stopLease ends the renewals and gives the lease up, so that a standby
// takes over at once rather than after the ttl.
func (s *Server) stopLease() {
	if s.leaseStop != nil {
		close(s.leaseStop)
		<-s.leaseDone
	}
	if s.leadership != nil {
		s.leadership.Release()
	}
}

// grpcAdvertise is where the other replicas reach this one's API
// (Config.APIAdvertise, or its default).
func (s *Server) grpcAdvertise() string {
	if s.cfg.APIAdvertise != "" {
		return s.cfg.APIAdvertise
	}
	if s.grpcLn == nil {
		return ""
	}
	h, p, err := net.SplitHostPort(s.grpcLn.Addr().String())
	if err != nil {
		return ""
	}
	if everyInterface(h) {
		// The host's own name, which the certificate covers (tlsHosts),
		// not PublicHost: replicas share that one, and it may lead back
		// to the standby.
		if h = machineName(); h == "" {
			return ""
		}
	}
	return net.JoinHostPort(h, p)
}
