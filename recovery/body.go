package recovery

import (
	"context"
	"io"
	"sync"
)

// body wraps a response body to find the commit boundary and the end of
// the exchange.
type body struct {
	rc   io.ReadCloser
	a    *Attempt
	ctx  context.Context
	auto bool
	// At the end, an HTTP/2 body returns pc to pool; an HTTP/1.1 body
	// calls release. The HTTP/2 path names the connection instead of
	// capturing it in a closure: one allocation less per request.
	pool    *pool
	pc      *pooledConn
	release func()
	once    sync.Once
}

// Read returns io.EOF bare (readers compare it with ==) and any other
// error as an *AttemptError: x/net's GoAwayError prints the peer's debug
// data, and a body read fails with it when a GOAWAY and a close cut the
// response, so a read error is sanitized like RoundTrip's.
func (b *body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.a.delivered(n)
	}
	switch {
	case err == io.EOF:
		b.end(nil)
	case err != nil:
		b.end(err)
		err = &AttemptError{AttemptID: b.a.spec.AttemptID, Err: err}
	}
	return n, err
}

// Close ends the exchange. Closing before the end is the caller's choice,
// not a failure of the stream.
func (b *body) Close() error {
	err := b.rc.Close()
	b.end(nil)
	return err
}

func (b *body) end(err error) {
	b.once.Do(func() {
		b.a.settle(b.ctx, err, b.auto)
		if b.release != nil {
			b.release()
		} else {
			b.pool.release(b.pc)
		}
	})
}
