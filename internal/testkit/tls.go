package testkit

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TLSProxy terminates TLS in front of a plain TCP service: a real handshake
// against a certificate of a test CA, and a client certificate required,
// with the real service behind it. Its files are PEM, in the test's temp
// directory.
type TLSProxy struct {
	Addr string
	// CAFile holds the test CA that signs the proxy's and the client's
	// certificates; OtherCAFile a CA that signs neither.
	CAFile, OtherCAFile string
	// CertFile and KeyFile are a client certificate the proxy accepts.
	CertFile, KeyFile string
}

// NewTLSProxy starts a TLS proxy to upstream (host:port) for 127.0.0.1 and
// localhost, stopped when the test ends.
func NewTLSProxy(t testing.TB, upstream string) *TLSProxy {
	t.Helper()
	dir := t.TempDir()
	ca, caKey := newCA(t, "outboxrelay test CA")
	other, _ := newCA(t, "outboxrelay other CA")
	server := issue(t, ca, caKey, x509.ExtKeyUsageServerAuth)
	client := issue(t, ca, caKey, x509.ExtKeyUsageClientAuth)
	p := &TLSProxy{
		CAFile:      writePEM(t, dir, "ca.pem", "CERTIFICATE", ca.Raw),
		OtherCAFile: writePEM(t, dir, "other-ca.pem", "CERTIFICATE", other.Raw),
		CertFile:    writePEM(t, dir, "client.pem", "CERTIFICATE", client.Certificate[0]),
		KeyFile:     writeKey(t, dir, "client-key.pem", client.PrivateKey.(*ecdsa.PrivateKey)),
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{server},
		ClientCAs:    roots,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	})
	if err != nil {
		t.Fatalf("testkit: TLS listen: %v", err)
	}
	p.Addr = ln.Addr().String()

	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			wg.Go(func() {
				up, err := net.Dial("tcp", upstream)
				if err != nil {
					c.Close()
					return
				}
				track(up)
				var pipe sync.WaitGroup
				pipe.Go(func() { io.Copy(up, c); up.Close() })
				pipe.Go(func() { io.Copy(c, up); c.Close() })
				pipe.Wait()
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return p
}

func newCA(t testing.TB, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testkit: CA key: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testkit: CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testkit: CA certificate: %v", err)
	}
	return cert, key
}

func issue(t testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testkit: key: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatalf("testkit: certificate: %v", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func writePEM(t testing.TB, dir, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("testkit: write %s: %v", name, err)
	}
	return path
}

func writeKey(t testing.TB, dir, name string, key *ecdsa.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatalf("testkit: key: %v", err)
	}
	return writePEM(t, dir, name, "EC PRIVATE KEY", der)
}

// NewCAFile writes the certificate of a fresh CA, one that signs nothing,
// as PEM into the test's temp directory and returns its path.
func NewCAFile(t testing.TB) string {
	t.Helper()
	ca, _ := newCA(t, "outboxrelay unrelated CA")
	return writePEM(t, t.TempDir(), "unrelated-ca.pem", "CERTIFICATE", ca.Raw)
}
