package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// AMQPTLS are the certificate settings of an amqps:// connection. The
// server's certificate is always verified, against the system's roots
// unless --amqp-ca names others; the server name is the URL's host.
// (PostgreSQL's TLS settings go in DATABASE_URL: sslmode=verify-full,
// sslrootcert, sslcert, sslkey.)
type AMQPTLS struct {
	CA   string `name:"amqp-ca" env:"AMQP_CA_FILE" group:"RabbitMQ TLS (amqps://)" help:"PEM file of the CA certificates that sign RabbitMQ's certificate (default: the system's)."`
	Cert string `name:"amqp-cert" env:"AMQP_CERT_FILE" group:"RabbitMQ TLS (amqps://)" help:"PEM client certificate, for brokers that require one (with --amqp-key)."`
	Key  string `name:"amqp-key" env:"AMQP_KEY_FILE" group:"RabbitMQ TLS (amqps://)" help:"PEM private key of --amqp-cert."`
}

// config returns the TLS configuration for amqpURL: nil when no setting is
// given (amqp091's default: the system's roots), an error naming the flag
// when a file is unreadable or settings are given for a plain amqp:// URL.
func (t AMQPTLS) config(amqpURL string) (*tls.Config, error) {
	if t.CA == "" && t.Cert == "" && t.Key == "" {
		return nil, nil
	}
	secure := false
	for _, raw := range strings.Split(amqpURL, ",") {
		u, err := url.Parse(strings.TrimSpace(raw))
		secure = secure || err != nil || u.Scheme == "amqps"
	}
	if !secure {
		return nil, errors.New("--amqp-ca, --amqp-cert and --amqp-key need an amqps:// URL in --amqp-url / AMQP_URL")
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("--amqp-ca / AMQP_CA_FILE: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--amqp-ca / AMQP_CA_FILE %s: no PEM certificate in it", t.CA)
		}
	}
	switch {
	case t.Cert == "" && t.Key == "":
	case t.Cert == "" || t.Key == "":
		return nil, errors.New("--amqp-cert and --amqp-key go together: give both or neither")
	default:
		pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("--amqp-cert / --amqp-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
