package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/internal/smallfile"
	"github.com/fleetlearn/fleetlearn/server/internal/natsembed"
	"github.com/fleetlearn/fleetlearn/server/internal/natsx"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// NATSAuthDir is where a server keeps its NATS operator, account and user
// keys, below its data directory.
const NATSAuthDir = "nats-auth"

// natsAuthority is NATS decentralized authorization run by the server: the
// operator and account keys sign an account JWT (with the registry's
// revocations) and a user JWT per enrolled device that lets it use only its
// own subjects; the server connects as its own service user, and pushes
// account updates as a system user so that a revocation cuts live
// connections.
type natsAuthority struct {
	s       *Server
	auth    *identity.Authority
	service *identity.UserKey
	system  *identity.UserKey

	mu  sync.Mutex
	sys *nats.Conn // system account connection, for account updates
}

// loadNATSAuthority loads (creating on first start) the keys under the data
// directory.
func (s *Server) loadNATSAuthority() (*natsAuthority, error) {
	dir := filepath.Join(s.cfg.DataDir, NATSAuthDir)
	if s.cfg.NATSAuthFrom != "" {
		if err := importNATSAuth("--nats-auth-from", s.cfg.NATSAuthFrom, dir); err != nil {
			return nil, err
		}
	}
	auth, err := identity.LoadOrCreateAuthority("fleetlearn", dir)
	if err != nil {
		return nil, fmt.Errorf("server: nats authority: %w", err)
	}
	service, err := identity.LoadOrCreateUserKey(filepath.Join(dir, "service-user.nk"))
	if err != nil {
		return nil, fmt.Errorf("server: nats service key: %w", err)
	}
	system, err := identity.LoadOrCreateUserKey(filepath.Join(dir, "system-user.nk"))
	if err != nil {
		return nil, fmt.Errorf("server: nats system key: %w", err)
	}
	return &natsAuthority{s: s, auth: auth, service: service, system: system}, nil
}

// accountJWT is the FLEET account's JWT with every revocation in the registry.
func (n *natsAuthority) accountJWT(ctx context.Context) (string, error) {
	revs, err := n.s.store.Revocations(ctx)
	if err != nil {
		return "", err
	}
	return n.auth.AccountJWT(revs)
}

// configure sets an embedded server's operator-mode options.
func (n *natsAuthority) configure(ctx context.Context) (func(*natsserver.Options) error, error) {
	acct, err := n.accountJWT(ctx)
	if err != nil {
		return nil, err
	}
	return func(o *natsserver.Options) error { return natsembed.Configure(o, n.auth, acct) }, nil
}

// userOption authenticates a connection as key with userJWT.
func userOption(userJWT string, key *identity.UserKey) nats.Option {
	return nats.UserJWT(func() (string, error) { return userJWT, nil }, key.Sign)
}

// serviceOption authenticates a connection as the aggregator's own user.
func (n *natsAuthority) serviceOption() (nats.Option, error) {
	jwt, err := n.auth.ServiceUserJWT("fleetlearn-server", n.service.ID(), time.Time{})
	if err != nil {
		return nil, err
	}
	return userOption(jwt, n.service), nil
}

// natsTLSOptions make a connection to the embedded NATS server insist on TLS
// and trust the server's CA, with Config.NATSTLS; none otherwise.
func (s *Server) natsTLSOptions() []nats.Option {
	if !s.cfg.NATSTLS {
		return nil
	}
	return []nats.Option{nats.Secure(&tls.Config{RootCAs: s.tlsCA.CAPool(), MinVersion: tls.VersionTLS12})}
}

// connectSystem opens the system-account connection used to push account
// updates.
func (n *natsAuthority) connectSystem(url string) error {
	jwt, err := n.auth.SystemUserJWT("fleetlearn-server-system", n.system.ID(), time.Time{})
	if err != nil {
		return err
	}
	opts := append(n.s.natsTLSOptions(), userOption(jwt, n.system))
	nc, err := natsx.Connect(url, "fleetlearn-server-system", n.s.o.log, opts...)
	if err != nil {
		return fmt.Errorf("server: nats system connection: %w", err)
	}
	n.mu.Lock()
	n.sys = nc
	n.mu.Unlock()
	return nil
}

// DeviceUserJWT issues an enrolled device's NATS user JWT.
func (n *natsAuthority) DeviceUserJWT(device, userKey string, expires time.Time) (string, error) {
	return n.auth.DeviceUserJWT(device, userKey, expires)
}

// Revoke re-issues the account JWT with the registry's revocations (the
// caller has recorded the new one) and pushes it, which closes the revoked
// device's connections.
func (n *natsAuthority) Revoke(ctx context.Context, _ string) error {
	acct, err := n.accountJWT(ctx)
	if err != nil {
		return err
	}
	n.mu.Lock()
	sys := n.sys
	n.mu.Unlock()
	if sys == nil {
		return fmt.Errorf("server: nats: no system connection")
	}
	return natsembed.PushAccount(ctx, sys, acct)
}

func (n *natsAuthority) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sys != nil {
		n.sys.Close()
		n.sys = nil
	}
}

// ServiceNATSOptions are the NATS connection options of the aggregator's own
// service user, for in-process tools that act on the server's behalf (load
// generators, tests): the TLS options with Config.NATSTLS, and the service
// user unless NATS authorization is off.
func (s *Server) ServiceNATSOptions() []nats.Option {
	opts := s.natsTLSOptions()
	if s.natsAuthority == nil {
		return opts
	}
	user, err := s.natsAuthority.serviceOption()
	if err != nil {
		return nil
	}
	return append(opts, user)
}

// NATSResolverConfig is the nats-server.conf fragment that makes an
// external NATS server or cluster trust the authority in dataDir (created
// there, with the directory, if missing): the operator, the system account
// and a directory resolver preloaded with the FLEET account, holding the
// revocations the registry in dataDir knows of. resolverDir is the
// resolver's JWT directory on the NATS servers, which they must be able to
// write: pushed revocations are kept there. Run the aggregator against that
// cluster with Config.NATSURL and the same data directory, or with
// Config.NATSAuthFrom naming a copy of its nats-auth directory.
func NATSResolverConfig(ctx context.Context, dataDir, resolverDir string) ([]byte, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("server: data dir: %w", err)
	}
	s := &Server{cfg: Config{DataDir: dataDir}}
	st, err := store.Open(ctx, filepath.Join(dataDir, "fleetlearn.db"))
	if err != nil {
		return nil, err
	}
	defer st.Close()
	s.store = st
	n, err := s.loadNATSAuthority()
	if err != nil {
		return nil, err
	}
	acct, err := n.accountJWT(ctx)
	if err != nil {
		return nil, err
	}
	sys, err := n.auth.SystemAccountJWT()
	if err != nil {
		return nil, err
	}
	conf, err := n.auth.ResolverConfig(resolverDir, acct, sys)
	if err != nil {
		return nil, err
	}
	return []byte(conf), nil
}

// WriteNATSResolverConfig writes NATSResolverConfig to path.
func WriteNATSResolverConfig(ctx context.Context, dataDir, resolverDir, path string) error {
	conf, err := NATSResolverConfig(ctx, dataDir, resolverDir)
	if err != nil {
		return err
	}
	// Whole or not at all: a NATS server reloading it must not read half.
	return atomicfile.WriteFile(path, conf, 0o600)
}

// natsAuthFiles are the key files of a NATS authority directory: the
// operator, FLEET and system account seeds, and the aggregator's own
// service and system user seeds.
var natsAuthFiles = []string{identity.OperatorSeedFile, identity.AccountSeedFile, identity.SystemSeedFile,
	"service-user.nk", "system-user.nk"}

// importNATSAuth copies the authority in from (a Kubernetes Secret volume,
// say) into dir: a key missing in dir is written there with mode 0600, one
// already there must be the same key. from's files are read whatever their
// mode, because Secret volumes are group-readable by design; the three
// account seeds must be there, the user seeds may be created later. flag
// names the option that asked for it, in errors.
func importNATSAuth(flag, from, dir string) error {
	op := "server: " + flag
	// Every key is read and compared before any is written: a refused
	// import leaves dir as it was, not half another authority's.
	type copyKey struct {
		dst string
		b   []byte
	}
	var missing []copyKey
	for i, name := range natsAuthFiles {
		src := filepath.Join(from, name)
		b, err := smallfile.Read(src, 64<<10)
		if errors.Is(err, fs.ErrNotExist) && i >= 3 {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %w (write the directory with --write-nats-config)", op, err)
		}
		dst := filepath.Join(dir, name)
		have, err := smallfile.Read(dst, 64<<10)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			missing = append(missing, copyKey{dst, b})
		case err != nil:
			return fmt.Errorf("%s: %w", op, err)
		case !bytes.Equal(bytes.TrimSpace(have), bytes.TrimSpace(b)):
			return fmt.Errorf("%s: %s differs from %s: the data directory already belongs to another NATS authority; "+
				"remove %s to take the one in %s", op, dst, src, dir, from)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	for _, k := range missing {
		if err := atomicfile.WriteNew(k.dst, k.b, 0o600); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	return nil
}
