package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// What can be checked of Temporal Cloud's settings without a Cloud
// namespace (none is reachable from these machines): the standard
// environment (envconfig) that every durallm command and the worker read
// turns TEMPORAL_API_KEY into a bearer token sent over TLS only, and
// TEMPORAL_TLS_CLIENT_CERT_PATH/KEY_PATH into a client certificate shown
// in the handshake; a server that does not speak TLS gets a TLS
// handshake, never a plaintext request; a server whose certificate is not
// trusted gets no request at all. The server here is a real gRPC server
// over TLS that records what reaches it and refuses every call as
// Unauthenticated, as Cloud does for a wrong key.

// testPKI is a CA, a server certificate for 127.0.0.1 and a client
// certificate, written as PEM files.
type testPKI struct {
	dir                       string
	caPath                    string
	serverCert                tls.Certificate
	clientCertPath, clientKey string
	caPool                    *x509.CertPool
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "durallm test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP) ([]byte, []byte, tls.Certificate) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage},
			KeyUsage: x509.KeyUsageDigitalSignature, IPAddresses: ips}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(key)
		certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return certPEM, keyPEM, pair
	}
	p := &testPKI{dir: dir, caPath: filepath.Join(dir, "ca.pem"), caPool: x509.NewCertPool()}
	p.caPool.AddCert(ca)
	_, _, p.serverCert = issue(2, "127.0.0.1", x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	clientPEM, clientKeyPEM, _ := issue(3, "durallm-test-client", x509.ExtKeyUsageClientAuth, nil)
	p.clientCertPath, p.clientKey = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key")
	for path, b := range map[string][]byte{p.caPath: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), p.clientCertPath: clientPEM, p.clientKey: clientKeyPEM} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// recordingServer is a gRPC server over TLS that records each call's
// authorization header and client certificate, and refuses the call.
type recordingServer struct {
	addr string
	mu   sync.Mutex
	auth []string
	cns  []string
}

func startRecordingServer(t *testing.T, pki *testPKI) *recordingServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recordingServer{addr: ln.Addr().String()}
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pki.serverCert}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: pki.caPool, MinVersion: tls.VersionTLS12})
	srv := grpc.NewServer(grpc.Creds(creds), grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		ctx := stream.Context()
		md, _ := metadata.FromIncomingContext(ctx)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.auth = append(r.auth, md.Get("authorization")...)
		if p, ok := peer.FromContext(ctx); ok {
			if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
				r.cns = append(r.cns, ti.State.PeerCertificates[0].Subject.CommonName)
			}
		}
		return status.Error(codes.Unauthenticated, "recording server: refused")
	}))
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return r
}

func (r *recordingServer) seen() (auth, cns []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.auth...), append([]string(nil), r.cns...)
}

// cloudEnv clears the Temporal client environment and sets env.
func cloudEnv(t *testing.T, env map[string]string) {
	t.Helper()
	for _, k := range []string{"TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_API_KEY", "TEMPORAL_TLS", "TEMPORAL_TLS_CLIENT_CERT_PATH",
		"TEMPORAL_TLS_CLIENT_KEY_PATH", "TEMPORAL_TLS_SERVER_CA_CERT_PATH", "TEMPORAL_TLS_SERVER_NAME", "TEMPORAL_TLS_DISABLE_HOST_VERIFICATION", "TEMPORAL_PROFILE"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("TEMPORAL_CONFIG_FILE", filepath.Join(t.TempDir(), "absent.toml"))
	os.Unsetenv("TEMPORAL_CONFIG_FILE")
	for k, v := range env {
		t.Setenv(k, v)
	}
}

func dialForTest(t *testing.T) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cf := connFlags{stderr: io.Discard}
	tc, err := cf.dialWith(ctx, nil, nil)
	if err == nil {
		tc.Close()
	}
	return err
}

func TestTemporalCloudAPIKeyTravelsOverTLSOnly(t *testing.T) {
	pki := newTestPKI(t)
	srv := startRecordingServer(t, pki)
	cloudEnv(t, map[string]string{"TEMPORAL_ADDRESS": srv.addr, "TEMPORAL_NAMESPACE": "ns.acct", "TEMPORAL_API_KEY": "test-api-key", "TEMPORAL_TLS_SERVER_CA_CERT_PATH": pki.caPath})
	err := dialForTest(t)
	if !isUnauthenticated(err) {
		t.Fatalf("dial: %v; want the server's Unauthenticated", err)
	}
	auth, _ := srv.seen()
	if len(auth) == 0 || auth[0] != "Bearer test-api-key" {
		t.Fatalf("authorization headers seen by the TLS server: %q; want the API key as a bearer token", auth)
	}
	// A refused credential is not waited for: the worker exits at once.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := dialUntilReachable(ctx, &connFlags{stderr: io.Discard}, nil, nil, slog.New(slog.DiscardHandler)); err == nil || ctx.Err() != nil {
		t.Fatalf("dialUntilReachable = %v after %s; want the refusal, at once", err, time.Since(start))
	}
}

func isUnauthenticated(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if status.Code(e) == codes.Unauthenticated {
			return true
		}
		if s, ok := e.(interface{ GRPCStatus() *status.Status }); ok && s.GRPCStatus().Code() == codes.Unauthenticated {
			return true
		}
	}
	return false
}

func TestTemporalCloudMTLSShowsTheClientCertificate(t *testing.T) {
	pki := newTestPKI(t)
	srv := startRecordingServer(t, pki)
	cloudEnv(t, map[string]string{"TEMPORAL_ADDRESS": srv.addr, "TEMPORAL_NAMESPACE": "ns.acct",
		"TEMPORAL_TLS_CLIENT_CERT_PATH": pki.clientCertPath, "TEMPORAL_TLS_CLIENT_KEY_PATH": pki.clientKey, "TEMPORAL_TLS_SERVER_CA_CERT_PATH": pki.caPath})
	if err := dialForTest(t); !isUnauthenticated(err) {
		t.Fatalf("dial: %v; want the server's Unauthenticated", err)
	}
	if _, cns := srv.seen(); len(cns) == 0 || cns[0] != "durallm-test-client" {
		t.Fatalf("client certificates seen: %q; want durallm-test-client", cns)
	}
}

// TestTemporalCloudAPIKeyNeverFallsBackToPlaintext points an API key at a
// server that speaks no TLS: what reaches it must be a TLS handshake
// (record type 22), never a plaintext HTTP/2 preface with the key in it.
func TestTemporalCloudAPIKeyNeverFallsBackToPlaintext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	first := make(chan []byte, 16)
	// Every connection's reader must be done before first is closed: the
	// client may still be connecting (a retry) when the dial returns.
	var readers sync.WaitGroup
	readers.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			readers.Go(func() {
				defer c.Close()
				b := make([]byte, 24)
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				n, _ := io.ReadAtLeast(c, b, 1)
				first <- b[:n]
			})
		}
	})
	cloudEnv(t, map[string]string{"TEMPORAL_ADDRESS": ln.Addr().String(), "TEMPORAL_API_KEY": "test-api-key"})
	if err := dialForTest(t); err == nil {
		t.Fatal("dial succeeded against a server that speaks no TLS")
	}
	_ = ln.Close()
	readers.Wait()
	close(first)
	n := 0
	for b := range first {
		n++
		if len(b) == 0 || b[0] != 22 {
			t.Fatalf("the client's first bytes were %q, not a TLS handshake", b)
		}
	}
	if n == 0 {
		t.Fatal("the client never connected")
	}
}

// TestTemporalCloudUntrustedServerGetsNoRequest: with verification on
// (the default), a server whose certificate no trusted CA signed sees no
// call, so no key.
func TestTemporalCloudUntrustedServerGetsNoRequest(t *testing.T) {
	pki := newTestPKI(t)
	srv := startRecordingServer(t, pki)
	cloudEnv(t, map[string]string{"TEMPORAL_ADDRESS": srv.addr, "TEMPORAL_API_KEY": "test-api-key"})
	if err := dialForTest(t); err == nil || isUnauthenticated(err) {
		t.Fatalf("dial: %v; want a certificate verification failure", err)
	}
	if auth, _ := srv.seen(); len(auth) != 0 {
		t.Fatalf("the untrusted server received %q", auth)
	}
}
