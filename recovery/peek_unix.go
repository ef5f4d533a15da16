//go:build unix

package recovery

import (
	"errors"
	"net"
	"syscall"
)

// peekIdle looks at an idle socket without reading from it (MSG_PEEK,
// non-blocking): ok is true only when nothing at all is waiting, so the
// server has neither closed nor reset the connection nor sent anything.
// known is false when c is not a socket the engine can peek at.
func peekIdle(c net.Conn) (ok, known bool) {
	sc, isSock := c.(syscall.Conn)
	if !isSock {
		return false, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false, false
	}
	var perr error
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, perr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // one look, never a wait
	})
	switch {
	case err != nil:
		return false, true // closed on our side
	case errors.Is(perr, syscall.EAGAIN) || errors.Is(perr, syscall.EWOULDBLOCK):
		return true, true // nothing waiting: still open
	default:
		// n > 0: unsolicited bytes (a 408, a TLS close_notify); n == 0:
		// the server's FIN; an error: a reset.
		return false, true
	}
}
