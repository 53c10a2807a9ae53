package testkit

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// PostgresTLS returns what a client needs to verify the test server's TLS
// certificate in full (sslmode=verify-full): a root certificate file and
// the host name the certificate is for. It reads the server's own
// certificate (ssl_cert_file) from disk, so the server must be local with
// ssl on, as Debian and Ubuntu install it (a self-signed certificate for
// localhost); the test fails, saying so, otherwise.
func PostgresTLS(t testing.TB) (rootCertFile, host string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, PostgresURL())
	if err != nil {
		t.Fatalf("testkit: connect: %v", redact.Error(err, PostgresURL()))
	}
	defer conn.Close(ctx)
	var on, certFile string
	if err := conn.QueryRow(ctx, `SELECT current_setting('ssl'), current_setting('ssl_cert_file')`).Scan(&on, &certFile); err != nil {
		t.Fatalf("testkit: read the server's TLS settings: %v", err)
	}
	if on != "on" {
		t.Fatalf("testkit: PostgreSQL has ssl = %s: the TLS tests need a server with TLS on (ssl = on, as Debian and Ubuntu install it)", on)
	}
	pemBytes, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatalf("testkit: the TLS tests read the server's certificate (ssl_cert_file) to trust it: %v", err)
	}
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		t.Fatalf("testkit: %s holds no PEM certificate", certFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("testkit: parse %s: %v", certFile, err)
	}
	host = cert.Subject.CommonName
	if len(cert.DNSNames) > 0 {
		host = cert.DNSNames[0]
	}
	if host == "" {
		t.Fatalf("testkit: %s names no host", certFile)
	}
	return certFile, host
}

// WithTLS returns databaseURL reaching the server at host (same port)
// with sslmode=verify-full against rootCertFile.
func WithTLS(t testing.TB, databaseURL, rootCertFile, host string) string {
	t.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatalf("testkit: parse %s: %v", redact.URL(databaseURL), err)
	}
	u.Host = host + ":" + u.Port()
	q := u.Query()
	q.Set("sslmode", "verify-full")
	q.Set("sslrootcert", rootCertFile)
	u.RawQuery = q.Encode()
	return u.String()
}
