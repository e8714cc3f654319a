package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fleetlearn/fleetlearn/identity/internal/keyfile"
)

// Files of the directory LoadOrCreateTLS manages. Keys are 0600,
// certificates 0644.
const (
	CACertFile     = "ca.crt"
	CAKeyFile      = "ca.key"
	ServerCertFile = "server.crt"
	ServerKeyFile  = "server.key"
)

// Certificate lifetimes.
const (
	caValidity     = 10 * 365 * 24 * time.Hour
	serverValidity = 365 * 24 * time.Hour
	// renewBefore is how close to expiry a server certificate is replaced.
	renewBefore = 30 * 24 * time.Hour
	// MaxClientCertTTL bounds client certificates.
	MaxClientCertTTL = 2 * 365 * 24 * time.Hour
)

// TLS is a private CA and the server certificate it issued: enough for the
// gRPC API (and NATS) to serve TLS with no outside PKI, and to verify
// client certificates it issues for mutual TLS.
type TLS struct {
	ca     *x509.Certificate
	caPEM  []byte
	caKey  crypto.Signer
	server tls.Certificate
	cfg    config
}

// LoadOrCreateTLS loads the CA and server certificate in dir, creating
// what is missing: a self-signed ECDSA P-256 CA on first use, and a server
// certificate for hosts (DNS names or IP addresses) whenever there is none,
// it does not cover every host, or it expires within 30 days. The CA is
// never replaced: clients trust it. Options: WithClock.
func LoadOrCreateTLS(dir string, hosts []string, opts ...Option) (*TLS, error) {
	const op = "identity: tls"
	cfg, err := newConfig(op, DefaultAPIMaxTTL, opts)
	if err != nil {
		return nil, err
	}
	dns, ips, err := splitHosts(hosts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	t := &TLS{cfg: cfg}
	if err := t.loadOrCreateCA(dir); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	certPath, keyPath := filepath.Join(dir, ServerCertFile), filepath.Join(dir, ServerKeyFile)
	if cert, ok := t.loadServer(certPath, keyPath, dns, ips); ok {
		t.server = cert
		return t, nil
	}
	certPEM, keyPEM, err := t.issue(pkix.Name{CommonName: firstOf(dns, ips)}, dns, ips, serverValidity, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return nil, fmt.Errorf("%s: server certificate: %w", op, err)
	}
	if err := keyfile.Replace(keyPath, keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if err := keyfile.Replace(certPath, certPEM, 0o644); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if t.server, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return t, nil
}

func firstOf(dns []string, ips []net.IP) string {
	if len(dns) > 0 {
		return dns[0]
	}
	return ips[0].String()
}

func splitHosts(hosts []string) ([]string, []net.IP, error) {
	if len(hosts) == 0 {
		return nil, nil, fmt.Errorf("%w: no hosts for the server certificate", ErrBadInput)
	}
	var dns []string
	var ips []net.IP
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
			continue
		}
		if h == "" || len(h) > 253 || strings.ContainsFunc(h, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '*')
		}) {
			return nil, nil, fmt.Errorf("%w: host %q is neither an IP address nor a DNS name", ErrBadInput, h)
		}
		dns = append(dns, strings.ToLower(h))
	}
	return dns, ips, nil
}

func (t *TLS) loadOrCreateCA(dir string) error {
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	certPEM, certErr := os.ReadFile(certPath)
	keyPEM, keyErr := keyfile.Read(keyPath)
	switch {
	case errors.Is(certErr, fs.ErrNotExist) && errors.Is(keyErr, fs.ErrNotExist):
		return t.createCA(certPath, keyPath)
	case certErr != nil:
		return certErr
	case keyErr != nil:
		return keyErr // keyfile's errors name the file
	}
	blk, _ := pem.Decode(certPEM)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return fmt.Errorf("%w: %s holds no PEM certificate", ErrBadKey, certPath)
	}
	ca, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrBadKey, certPath, err)
	}
	key, err := parseSigner(keyPEM)
	if err != nil {
		return fmt.Errorf("%s: %w", keyPath, err)
	}
	if !publicEqual(ca.PublicKey, key.Public()) {
		return fmt.Errorf("%w: %s does not belong to %s", ErrBadKey, keyPath, certPath)
	}
	t.ca, t.caPEM, t.caKey = ca, certPEM, key
	return nil
}

func (t *TLS) createCA(certPath, keyPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := t.cfg.now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "Fleetlearn CA", Organization: []string{"Fleetlearn"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		SubjectKeyId:          ski(&key.PublicKey),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := keyfile.Create(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return err
	}
	if err := keyfile.Replace(certPath, certPEM, 0o644); err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return err
	}
	t.ca, t.caPEM, t.caKey = ca, certPEM, key
	return nil
}

// loadServer returns the stored server certificate if it is usable as is.
func (t *TLS) loadServer(certPath, keyPath string, dns []string, ips []net.IP) (tls.Certificate, bool) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return tls.Certificate{}, false
	}
	keyPEM, err := keyfile.Read(keyPath)
	if err != nil {
		return tls.Certificate{}, false
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, false
	}
	leaf := cert.Leaf
	now := t.cfg.now()
	if leaf == nil || now.Add(renewBefore).After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return tls.Certificate{}, false
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: t.CAPool(), CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return tls.Certificate{}, false
	}
	for _, d := range dns {
		if !slices.Contains(leaf.DNSNames, d) {
			return tls.Certificate{}, false
		}
	}
	for _, ip := range ips {
		if !slices.ContainsFunc(leaf.IPAddresses, ip.Equal) {
			return tls.Certificate{}, false
		}
	}
	return cert, true
}

// issue makes a leaf certificate signed by the CA, returning PEM cert and key.
func (t *TLS) issue(subject pkix.Name, dns []string, ips []net.IP, validity time.Duration, usage x509.ExtKeyUsage) ([]byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := t.cfg.now()
	notAfter := now.Add(validity)
	if notAfter.After(t.ca.NotAfter) {
		notAfter = t.ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:   serial(),
		Subject:        subject,
		NotBefore:      now.Add(-time.Hour),
		NotAfter:       notAfter,
		KeyUsage:       x509.KeyUsageDigitalSignature,
		ExtKeyUsage:    []x509.ExtKeyUsage{usage},
		DNSNames:       dns,
		IPAddresses:    ips,
		SubjectKeyId:   ski(&key.PublicKey),
		AuthorityKeyId: t.ca.SubjectKeyId,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, t.ca, &key.PublicKey, t.caKey)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// IssueClientCert makes a client certificate for name (its CommonName, as
// the server will see it) valid for ttl, for mutual TLS. It returns PEM
// certificate and key; the key is a secret.
func (t *TLS) IssueClientCert(name string, ttl time.Duration) (certPEM, keyPEM []byte, err error) {
	const op = "identity: client certificate"
	if err := checkSubject(name); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	if err := checkTTL(op, ttl, MaxClientCertTTL); err != nil {
		return nil, nil, err
	}
	certPEM, keyPEM, err = t.issue(pkix.Name{CommonName: name}, nil, nil, ttl, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	return certPEM, keyPEM, nil
}

// CAPEM is the CA certificate clients must trust.
func (t *TLS) CAPEM() []byte { return slices.Clone(t.caPEM) }

// CAPool is a pool holding only the CA.
func (t *TLS) CAPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(t.ca)
	return p
}

// ServerCertificate is the current server certificate and key.
func (t *TLS) ServerCertificate() tls.Certificate { return t.server }

// ServerConfig serves TLS 1.2+ with the server certificate. With
// requireClientCert, clients must present a certificate the CA issued.
func (t *TLS) ServerConfig(requireClientCert bool) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{t.server}}
	if requireClientCert {
		c.ClientAuth = tls.RequireAndVerifyClientCert
		c.ClientCAs = t.CAPool()
	}
	return c
}

// ClientConfig trusts only the CA in caPEM and, when certPEM and keyPEM are
// given, presents that client certificate.
func ClientConfig(caPEM, certPEM, keyPEM []byte) (*tls.Config, error) {
	const op = "identity: client tls"
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s: %w: no CA certificate in PEM", op, ErrBadKey)
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	if len(certPEM) > 0 || len(keyPEM) > 0 {
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("%s: %w: %w", op, ErrBadKey, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

func parseSigner(keyPEM []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(keyPEM)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%w: no PEM PRIVATE KEY block", ErrBadKey)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadKey, err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%w: %T cannot sign", ErrBadKey, k)
	}
	return s, nil
}

func publicEqual(a, b crypto.PublicKey) bool {
	x, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && x.Equal(b)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

func ski(pub *ecdsa.PublicKey) []byte {
	b, err := pub.Bytes()
	if err != nil {
		panic(err) // a generated P-256 key always encodes
	}
	sum := sha256.Sum256(b)
	return sum[:20]
}
