package main

import (
	"testing"

	"go.temporal.io/sdk/client"
)

// TestUncompressedOnLoopback: a client of a server on this machine sends
// uncompressed gRPC; any other keeps the SDK's gzip, and a compression
// already chosen is kept.
func TestUncompressedOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr string
		off  bool
	}{
		{"", true}, // client.DefaultHostPort, localhost:7233
		{"127.0.0.1:7233", true},
		{"localhost:7233", true},
		{"[::1]:7233", true},
		{"127.0.0.2:7233", true},
		{"temporal.example.com:7233", false},
		{"10.0.0.5:7233", false},
		{"no-port", false},
	} {
		o := client.Options{HostPort: tc.addr}
		uncompressedOnLoopback(&o)
		_, off := o.ConnectionOptions.GrpcCompression.(*client.GrpcCompressionNone)
		if off != tc.off {
			t.Errorf("%q: compression off = %v, want %v", tc.addr, off, tc.off)
		}
	}
	gz := &client.GrpcCompressionGzip{}
	o := client.Options{HostPort: "127.0.0.1:7233", ConnectionOptions: client.ConnectionOptions{GrpcCompression: gz}}
	uncompressedOnLoopback(&o)
	if o.ConnectionOptions.GrpcCompression != gz {
		t.Errorf("an explicit gzip was replaced by %T", o.ConnectionOptions.GrpcCompression)
	}
}
