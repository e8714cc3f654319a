package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/smallfile"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// replicaSecretFile is one file of ReplicaSecrets outside nats-auth/, which
// importNATSAuth takes, and the mode a data directory keeps it with.
type replicaSecretFile struct {
	rel  string
	mode fs.FileMode
}

// replicaSecretFiles are the files of ReplicaSecrets that a copy for
// Config.SecretsFrom must hold: every one, since a replica that made its
// own CA or keys would serve certificates and verify tokens the others do
// not.
var replicaSecretFiles = []replicaSecretFile{
	{filepath.Join(TLSDir, identity.CACertFile), 0o644},
	{filepath.Join(TLSDir, identity.CAKeyFile), 0o600},
	{filepath.Join(KeysDir, APIKeyFile), 0o600},
	{filepath.Join(KeysDir, EnrollKeyFile), 0o600},
	{AdminTokenFile, 0o600},
	{audit.KeysFile, 0o600},
}

// maxSecretBytes bounds each file read from a copy of the secrets: keys,
// certificates and tokens are a few kilobytes.
const maxSecretBytes = 64 << 10

// importReplicaSecrets copies the secrets every replica shares from from
// (laid out as in a data directory: a Kubernetes Secret volume whose items
// name the paths, or another replica's data directory) into dataDir. A
// file missing in dataDir is written there; one already there must be the
// same, except the admin token, which a replica renews on its own before
// it expires and which the copy's replaces. from's files are read whatever
// their mode: Secret volumes are group-readable by design. A nats-auth
// directory in from is imported as NATSAuthFrom's would be.
func importReplicaSecrets(from, dataDir string) error {
	const op = "server: --secrets-from"
	// Everything is read and compared before anything is written: a
	// refused import leaves dataDir as it was.
	type write struct {
		dst  string
		b    []byte
		mode fs.FileMode
	}
	var writes []write
	for _, f := range replicaSecretFiles {
		src := filepath.Join(from, f.rel)
		b, err := smallfile.Read(src, maxSecretBytes)
		if err != nil {
			return fmt.Errorf("%s: %w: the directory must hold every file of %v (fleetlearn-server replica-secrets writes them)",
				op, err, replicaSecretNames())
		}
		if len(bytes.TrimSpace(b)) == 0 {
			return fmt.Errorf("%s: %s is empty: copy it from the data directory that made it", op, src)
		}
		dst := filepath.Join(dataDir, f.rel)
		have, err := smallfile.Read(dst, maxSecretBytes)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			writes = append(writes, write{dst, b, f.mode})
		case err != nil:
			return fmt.Errorf("%s: %w", op, err)
		case bytes.Equal(bytes.TrimSpace(have), bytes.TrimSpace(b)):
		case f.rel == AdminTokenFile:
			writes = append(writes, write{dst, b, f.mode})
		default:
			return fmt.Errorf("%s: %s differs from %s: the data directory already holds another deployment's secrets; "+
				"remove %s to take the one in %s", op, dst, src, dst, from)
		}
	}
	natsFrom := filepath.Join(from, NATSAuthDir)
	if fi, err := os.Stat(natsFrom); err == nil && fi.IsDir() {
		if err := importNATSAuth("--secrets-from", natsFrom, filepath.Join(dataDir, NATSAuthDir)); err != nil {
			return err
		}
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w", op, err)
	}
	for _, w := range writes {
		if err := os.MkdirAll(filepath.Dir(w.dst), 0o700); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		if err := atomicfile.WriteFile(w.dst, w.b, w.mode); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	return nil
}

func replicaSecretNames() []string {
	names := make([]string, len(replicaSecretFiles))
	for i, f := range replicaSecretFiles {
		names[i] = filepath.ToSlash(f.rel)
	}
	return names
}

// WriteReplicaSecrets creates in dataDir (and the directory, if missing)
// every file of ReplicaSecrets that is not there yet, as a server's first
// start would, without starting one: the TLS CA, the API and enrollment
// token keys, an admin token, the NATS authority's keys and the audit
// log's keys. Those already there are kept (an admin token near its expiry
// is renewed, as at a start). It makes the copy a replicated deployment
// gives every replica (Config.SecretsFrom) before any has run; keep it
// offline, since whoever reads it can mint any token.
func WriteReplicaSecrets(ctx context.Context, dataDir string) error {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fmt.Errorf("server: replica secrets: %w", err)
	}
	s := &Server{cfg: Config{DataDir: dataDir, Fleet: DefaultFleet},
		o: options{log: slog.New(slog.DiscardHandler), clock: clock.Or(nil)}}
	s.o.now = s.o.clock.Now
	// loadSecurity checks redeemed enrollment tokens against a store; this
	// one is empty, like a first start's.
	st, err := store.Open(ctx, StoreFile(dataDir))
	if err != nil {
		return err
	}
	defer st.Close()
	s.store = st
	if err := s.loadSecurity(); err != nil {
		return err
	}
	if _, err := s.loadNATSAuthority(); err != nil {
		return err
	}
	return createAuditKeys(dataDir)
}

// createAuditKeys writes fresh audit log keys to dir unless a keys file is
// there, which must parse.
func createAuditKeys(dir string) error {
	const op = "server: audit keys"
	path := filepath.Join(dir, audit.KeysFile)
	b, err := smallfile.Read(path, maxSecretBytes)
	if err == nil {
		if _, err := audit.ParseKeys(b); err != nil {
			return fmt.Errorf("%s: %s: %w", op, path, err)
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w", op, err)
	}
	keys, err := audit.GenerateKeys(rand.Reader)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	text, err := keys.MarshalText()
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	// Never over keys someone else wrote meanwhile: what they signed would
	// no longer verify.
	if err := atomicfile.WriteNew(path, text, 0o600); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}
