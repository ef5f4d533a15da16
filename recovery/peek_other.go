//go:build !unix

package recovery

import "net"

// peekIdle cannot look at a socket here; h1Conn.alive falls back to a
// read that times out at once.
func peekIdle(net.Conn) (ok, known bool) { return false, false }
