package e2e_test

import (
	"os"
	"testing"
)

// TestMain stops the servers the sweep tests share once every test ran.
func TestMain(m *testing.M) {
	code := m.Run()
	stopSweepServers()
	os.Exit(code)
}
