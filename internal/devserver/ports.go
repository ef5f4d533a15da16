package devserver

import (
	"errors"
	"fmt"
	"net"
	"strconv"
)

// FreePort, used as Options.FrontendPort or Options.UIPort, asks Start to
// pick a free loopback port. Zero cannot mean that, because zero is the
// "use the default" value of an unset field.
const FreePort = -1

// PortInUseError reports that a port the dev server needs is already bound
// by another process. Callers such as the durallm command can match it
// with errors.As to name their own flag in the message they print.
type PortInUseError struct {
	// Service is "frontend" or "UI".
	Service string
	// Addr is the host:port that could not be bound.
	Addr string
	// Err is the underlying listen error.
	Err error
}

// Error names the port and says how to choose another.
func (e *PortInUseError) Error() string {
	return fmt.Sprintf("devserver: %s port %s is already in use (is another Temporal dev server running?); "+
		"stop that process or choose another port (-1 picks any free one): %v", e.Service, e.Addr, e.Err)
}

// Unwrap returns the listen error.
func (e *PortInUseError) Unwrap() error { return e.Err }

// portReservation holds listeners open while all ports are being chosen, so
// that two FreePort picks (or a pick and an explicit port) never collide.
// The listeners are closed just before the server binds the ports for real;
// the window in between is unavoidable because neither the Temporal server
// nor the UI server accepts a pre-opened listener.
type portReservation struct {
	listeners []net.Listener
}

// reserve binds host:port (port 0 for any free port) and returns the bound
// port. A bind failure on an explicit port becomes a *PortInUseError.
func (r *portReservation) reserve(service, host string, port int) (int, error) {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if port != 0 {
			return 0, &PortInUseError{Service: service, Addr: addr, Err: err}
		}
		return 0, fmt.Errorf("devserver: picking a free %s port on %s: %w", service, host, err)
	}
	r.listeners = append(r.listeners, ln)
	tcpAddr, ok := ln.Addr().(*net.TCPAddr)
	if !ok {
		return 0, fmt.Errorf("devserver: unexpected listener address %v", ln.Addr())
	}
	return tcpAddr.Port, nil
}

// release closes every reserved listener.
func (r *portReservation) release() error {
	var errs []error
	for _, ln := range r.listeners {
		if err := ln.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	r.listeners = nil
	return errors.Join(errs...)
}

// checkPort validates a port option: 0 (default), FreePort, or 1-65535.
func checkPort(name string, p int) error {
	if p == 0 || p == FreePort || (p > 0 && p <= 65535) {
		return nil
	}
	return fmt.Errorf("devserver: %s %d is not a valid port (use 1-65535, 0 for the default, or FreePort (-1) for any free port)", name, p)
}
