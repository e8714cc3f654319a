package identity

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"time"

	natsjwt "github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/fleetlearn/fleetlearn/identity/internal/keyfile"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// Account names in the NATS JWTs.
const (
	// FleetAccount holds every Fleetlearn subject, stream and bucket.
	FleetAccount = "FLEET"
	// SystemAccountName is the account nats-server uses for its own
	// monitoring and for account JWT updates.
	SystemAccountName = "SYS"
)

// Authority is the root of NATS decentralized authorization for one
// deployment: an operator key signs the account JWTs, the FLEET account key
// signs user JWTs for the aggregator and the devices, and a system account
// exists because nats-server in operator mode requires one.
//
// It holds no state besides its keys: revocations live with the caller
// (the server's database), which passes them to AccountJWT.
type Authority struct {
	name     string
	operator nkeys.KeyPair
	account  nkeys.KeyPair
	system   nkeys.KeyPair
	cfg      config
}

// Authority key files inside the directory LoadOrCreateAuthority manages.
const (
	OperatorSeedFile = "operator.nk"
	AccountSeedFile  = "account.nk"
	SystemSeedFile   = "system.nk"
)

// NewAuthority uses the given operator, account and system account seeds
// ("SO...", "SA...", "SA..."). name labels the operator JWT. Options:
// WithClock, for the expiry checks of user JWTs; the nats jwt library
// stamps every JWT's issue time from the system clock, and nats-server
// compares revocations with it.
func NewAuthority(name string, operatorSeed, accountSeed, systemSeed []byte, opts ...Option) (*Authority, error) {
	const op = "identity: nats authority"
	cfg, err := newConfig(op, DefaultAPIMaxTTL, opts)
	if err != nil {
		return nil, err
	}
	if err := wire.CheckToken("operator name", name); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", op, ErrBadInput, err)
	}
	a := &Authority{name: name, cfg: cfg}
	for _, k := range []struct {
		seed   []byte
		want   nkeys.PrefixByte
		target *nkeys.KeyPair
		what   string
	}{
		{operatorSeed, nkeys.PrefixByteOperator, &a.operator, "operator"},
		{accountSeed, nkeys.PrefixByteAccount, &a.account, "account"},
		{systemSeed, nkeys.PrefixByteAccount, &a.system, "system account"},
	} {
		seed := bytes.TrimSpace(k.seed)
		prefix, _, err := nkeys.DecodeSeed(seed)
		if err != nil {
			return nil, fmt.Errorf("%s: %w: %s seed: %w", op, ErrBadKey, k.what, err)
		}
		if prefix != k.want {
			return nil, fmt.Errorf("%s: %w: %s seed is for a %s key", op, ErrBadKey, k.what, prefix)
		}
		if *k.target, err = nkeys.FromSeed(seed); err != nil {
			return nil, fmt.Errorf("%s: %w: %s seed: %w", op, ErrBadKey, k.what, err)
		}
	}
	if a.AccountPublicKey() == a.SystemAccountPublicKey() {
		return nil, fmt.Errorf("%s: %w: the system account must differ from %s", op, ErrBadKey, FleetAccount)
	}
	return a, nil
}

// LoadOrCreateAuthority keeps the three seeds in dir (files
// OperatorSeedFile, AccountSeedFile, SystemSeedFile, mode 0600), creating
// the missing ones from the WithRand source.
func LoadOrCreateAuthority(name, dir string, opts ...Option) (*Authority, error) {
	cfg, err := newConfig("identity: nats authority", DefaultAPIMaxTTL, opts)
	if err != nil {
		return nil, err
	}
	var seeds [3][]byte
	for i, f := range []struct {
		file   string
		prefix nkeys.PrefixByte
	}{{OperatorSeedFile, nkeys.PrefixByteOperator}, {AccountSeedFile, nkeys.PrefixByteAccount}, {SystemSeedFile, nkeys.PrefixByteAccount}} {
		path := filepath.Join(dir, f.file)
		b, err := keyfile.Read(path)
		if errors.Is(err, fs.ErrNotExist) {
			kp, gerr := nkeys.CreatePairWithRand(f.prefix, cfg.rand)
			if gerr != nil {
				return nil, fmt.Errorf("identity: nats authority: %s: %w", path, gerr)
			}
			seed, _ := kp.Seed()
			if werr := keyfile.Create(path, append(seed, '\n'), 0o600); werr != nil && !errors.Is(werr, fs.ErrExist) {
				return nil, fmt.Errorf("identity: nats authority: %s: %w", path, werr)
			}
			b, err = keyfile.Read(path)
		}
		if err != nil {
			return nil, fmt.Errorf("identity: nats authority: %w", err) // keyfile's errors name the file
		}
		seeds[i] = b
	}
	return NewAuthority(name, seeds[0], seeds[1], seeds[2], opts...)
}

func mustPublic(kp nkeys.KeyPair) string {
	pub, err := kp.PublicKey()
	if err != nil {
		// A key pair made from a valid seed always has a public key.
		panic(err)
	}
	return pub
}

// OperatorPublicKey is the operator's nkey ("O...").
func (a *Authority) OperatorPublicKey() string { return mustPublic(a.operator) }

// AccountPublicKey is the FLEET account's nkey ("A..."): what clients'
// user JWTs name as issuer and what nats-server knows the account by.
func (a *Authority) AccountPublicKey() string { return mustPublic(a.account) }

// SystemAccountPublicKey is the system account's nkey, nats-server's
// system_account.
func (a *Authority) SystemAccountPublicKey() string { return mustPublic(a.system) }

// OperatorJWT is the operator JWT nats-server trusts (operator: in the
// config file, Options.TrustedOperators embedded).
func (a *Authority) OperatorJWT() (string, error) {
	oc := natsjwt.NewOperatorClaims(a.OperatorPublicKey())
	oc.Name = a.name
	oc.SystemAccount = a.SystemAccountPublicKey()
	s, err := oc.Encode(a.operator)
	if err != nil {
		return "", fmt.Errorf("identity: operator jwt: %w", err)
	}
	return s, nil
}

// SystemAccountJWT is the system account's JWT.
func (a *Authority) SystemAccountJWT() (string, error) {
	ac := natsjwt.NewAccountClaims(a.SystemAccountPublicKey())
	ac.Name = SystemAccountName
	s, err := ac.Encode(a.operator)
	if err != nil {
		return "", fmt.Errorf("identity: system account jwt: %w", err)
	}
	return s, nil
}

// Revocation withdraws every user JWT for UserKey issued at or before At.
// Devices are revoked by their key: a device re-enrolls with a new key.
type Revocation struct {
	UserKey string
	At      time.Time
}

// AccountJWT is the FLEET account's JWT: JetStream enabled without limits,
// bearer-only user JWTs refused (every client proves it holds its key),
// and revoked the given user keys. Re-issue it after each revocation and
// push it to the servers (server/internal/natsembed.PushAccount);
// nats-server then drops the revoked users' live connections.
func (a *Authority) AccountJWT(revoked []Revocation) (string, error) {
	const op = "identity: account jwt"
	ac := natsjwt.NewAccountClaims(a.AccountPublicKey())
	ac.Name = FleetAccount
	ac.Limits.JetStreamLimits = natsjwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	ac.Limits.DisallowBearer = true
	for _, r := range revoked {
		if !nkeys.IsValidPublicUserKey(r.UserKey) {
			return "", fmt.Errorf("%s: %w: revoked key %q is not a user key", op, ErrBadKey, r.UserKey)
		}
		if r.At.IsZero() {
			return "", fmt.Errorf("%s: %w: revocation of %s has no time", op, ErrBadInput, r.UserKey)
		}
		ac.RevokeAt(r.UserKey, r.At)
	}
	s, err := ac.Encode(a.operator)
	if err != nil {
		return "", fmt.Errorf("%s: %w", op, err)
	}
	return s, nil
}

// DeviceInboxPrefix is the inbox prefix a device must connect with
// (nats.CustomInboxPrefix): the only reply subjects it may subscribe to.
func DeviceInboxPrefix(device string) string { return "_INBOX_" + device }

// DevicePermissions are exactly what a device may do on NATS: check in on
// its own subject,
// publish its own reports (and their chunks) into FL_REPORTS and its own
// SecAgg messages, read
// blobs with direct gets, and receive announcements, audit checkpoints, its
// own receipts, SecAgg messages and replies.
func DevicePermissions(device string) (natsjwt.Permissions, error) {
	if err := wire.CheckToken("device", device); err != nil {
		return natsjwt.Permissions{}, fmt.Errorf("identity: device permissions: %w: %w", ErrBadInput, err)
	}
	stream := "OBJ_" + wire.BlobBucket
	var p natsjwt.Permissions
	p.Pub.Allow.Add(
		wire.CheckInSubject(device),
		"fl.report.*.*."+device,
		"fl.eval.*.*."+device,
		"fl.chunk.*.*."+device,
		"fl.secagg.up.*.*."+device,
		"fl.failure.*.*."+device,
		// objfetch: ObjectStore() and Stream() read the stream info;
		// GetInfo and chunk reads are direct gets, by last subject and by
		// sequence. Publishing into FL_REPORTS needs no API permission.
		"$JS.API.STREAM.INFO."+stream,
		"$JS.API.DIRECT.GET."+stream,
		"$JS.API.DIRECT.GET."+stream+".>",
	)
	p.Sub.Allow.Add(
		DeviceInboxPrefix(device)+".>",
		wire.SubjectAnnounce,
		wire.SubjectAuditCheckpoint,
		wire.ReceiptSubject(device),
		"fl.secagg.down.*.*."+device,
	)
	return p, nil
}

// DeviceUserJWT certifies that the holder of userKey (a "U..." id) is
// device, with DevicePermissions. expires is when the JWT lapses (zero for
// never: revocation ends it).
func (a *Authority) DeviceUserJWT(device, userKey string, expires time.Time) (string, error) {
	perms, err := DevicePermissions(device)
	if err != nil {
		return "", err
	}
	return a.userJWT("device user jwt", device, userKey, a.account, perms, expires)
}

// ServiceUserJWT certifies the aggregator's key: everything within FLEET.
func (a *Authority) ServiceUserJWT(name, userKey string, expires time.Time) (string, error) {
	return a.userJWT("service user jwt", name, userKey, a.account, natsjwt.Permissions{}, expires)
}

// SystemUserJWT certifies a user of the system account, which pushes
// account JWT updates to the servers.
func (a *Authority) SystemUserJWT(name, userKey string, expires time.Time) (string, error) {
	return a.userJWT("system user jwt", name, userKey, a.system, natsjwt.Permissions{}, expires)
}

func (a *Authority) userJWT(what, name, userKey string, acct nkeys.KeyPair, perms natsjwt.Permissions, expires time.Time) (string, error) {
	op := "identity: " + what
	if err := wire.CheckToken("user name", name); err != nil {
		return "", fmt.Errorf("%s: %w: %w", op, ErrBadInput, err)
	}
	if !nkeys.IsValidPublicUserKey(userKey) {
		return "", fmt.Errorf("%s: %w: %q is not an nkey user public key", op, ErrBadKey, userKey)
	}
	now := a.cfg.now()
	if !expires.IsZero() && !expires.After(now) {
		return "", fmt.Errorf("%s: %w: expiry %v is not in the future", op, ErrBadInput, expires)
	}
	uc := natsjwt.NewUserClaims(userKey)
	uc.Name = name
	if !expires.IsZero() {
		uc.Expires = expires.Unix()
	}
	uc.Permissions = perms
	s, err := uc.Encode(acct)
	if err != nil {
		return "", fmt.Errorf("%s: %w", op, err)
	}
	return s, nil
}

// FormatCreds renders a user JWT and its seed as a NATS creds file, which
// nats.UserCredentials and the nats CLI read. It is a secret: write it 0600.
func FormatCreds(userJWT string, seed []byte) ([]byte, error) {
	b, err := natsjwt.FormatUserConfig(userJWT, seed)
	if err != nil {
		return nil, fmt.Errorf("identity: creds: %w", err)
	}
	return b, nil
}

// ResolverConfig is the nats-server.conf fragment that makes an external
// server or cluster trust this authority: the operator JWT, the system
// account, and a full (directory-backed) resolver preloaded with the given
// account JWTs, so revocations pushed later survive server restarts.
// dir is the resolver's JWT directory on the server.
func (a *Authority) ResolverConfig(dir string, accountJWTs ...string) (string, error) {
	const op = "identity: resolver config"
	if dir == "" || strings.ContainsAny(dir, "\"\\\n") {
		return "", fmt.Errorf("%s: %w: resolver directory %q", op, ErrBadInput, dir)
	}
	opJWT, err := a.OperatorJWT()
	if err != nil {
		return "", err
	}
	sysJWT, err := a.SystemAccountJWT()
	if err != nil {
		return "", err
	}
	pre := map[string]string{a.SystemAccountPublicKey(): sysJWT}
	for _, j := range accountJWTs {
		ac, err := natsjwt.DecodeAccountClaims(j)
		if err != nil {
			return "", fmt.Errorf("%s: %w: %w", op, ErrBadInput, err)
		}
		if ac.Issuer != a.OperatorPublicKey() {
			return "", fmt.Errorf("%s: %w: account %s is signed by %s, not this operator", op, ErrBadKey, ac.Subject, ac.Issuer)
		}
		pre[ac.Subject] = j
	}
	keys := make([]string, 0, len(pre))
	for k := range pre {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "# Fleetlearn NATS authorization (operator %s)\n", a.name)
	fmt.Fprintf(&b, "operator: %s\n", opJWT)
	fmt.Fprintf(&b, "system_account: %s\n", a.SystemAccountPublicKey())
	fmt.Fprintf(&b, "resolver: {\n  type: full\n  dir: %q\n  allow_delete: false\n  interval: \"2m\"\n}\n", dir)
	b.WriteString("resolver_preload: {\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "  %s: %s\n", k, pre[k])
	}
	b.WriteString("}\n")
	return b.String(), nil
}
