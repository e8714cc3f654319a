//go:build linux

package kubetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// pki is the control plane's credentials, in dir: a CA, one serving
// certificate for 127.0.0.1 that every server uses (the API server, the
// controller managers, the webhooks), the service account signing key and
// the administrator's bearer token.
type pki struct {
	dir   string
	caPEM []byte
	// caFile is caPEM; certFile and keyFile are named as controller-runtime
	// expects them in a certificate directory (tls.crt, tls.key), so that
	// dir serves as one.
	caFile, certFile, keyFile string
	saPub, saKey              string
	token                     string
}

func newPKI(t testing.TB, parent string) *pki {
	t.Helper()
	p := &pki{dir: filepath.Join(parent, "pki")}
	if err := os.Mkdir(p.dir, 0o700); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	fail := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("kubetest: %s: %v", what, err)
		}
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	fail("CA key", err)
	now := time.Now()
	// Valid from an hour ago, for clocks a little apart, to well beyond
	// any test.
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubetest-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	fail("CA certificate", err)
	caCert, err := x509.ParseCertificate(caDER)
	fail("CA certificate", err)
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	fail("serving key", err)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kubetest"},
		NotBefore: ca.NotBefore, NotAfter: ca.NotAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	fail("serving certificate", err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	fail("serving key", err)

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	fail("service account key", err)
	saPubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	fail("service account key", err)

	token := make([]byte, 24)
	_, err = rand.Read(token)
	fail("token", err)
	p.token = hex.EncodeToString(token)

	write := func(name, typ string, der []byte) string {
		t.Helper()
		path := filepath.Join(p.dir, name)
		fail("write "+name, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return path
	}
	p.caFile = write("ca.crt", "CERTIFICATE", caDER)
	p.certFile = write("tls.crt", "CERTIFICATE", leafDER)
	p.keyFile = write("tls.key", "PRIVATE KEY", keyDER)
	p.saPub = write("sa.pub", "PUBLIC KEY", saPubDER)
	p.saKey = write("sa.key", "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey))
	return p
}
