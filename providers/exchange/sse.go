package exchange

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// MaxSSELineBytes bounds one server-sent-event line, and the data of one
// event (its data lines joined), so a provider that sends one endless line
// cannot make the adapter buffer it: 1 MiB.
const MaxSSELineBytes = 1 << 20

// sseReadBuffer is the bufio buffer under the line reader. Lines longer
// than it are assembled in sseDecoder.line, up to MaxSSELineBytes.
const sseReadBuffer = 32 << 10

// ErrLineTooLong is returned when an SSE line passes MaxSSELineBytes.
var ErrLineTooLong = errors.New("exchange: SSE line too long")

// ErrEventTooLarge is returned when one SSE event's data passes
// MaxSSELineBytes.
var ErrEventTooLarge = errors.New("exchange: SSE event too large")

// sseDecoder reads server-sent events (the WHATWG event-stream format)
// incrementally with bounded memory: lines end in LF, CRLF or a lone CR;
// "data:" lines of one event are joined with "\n"; comment lines (":")
// are skipped; a blank line ends an event. Only the "event" and "data"
// fields matter to an LLM stream; "id" and "retry" are ignored.
type sseDecoder struct {
	r        *bufio.Reader
	maxLine  int
	line     []byte // the line being assembled, reused
	data     []byte // the event's data, reused
	event    string // the event's type, "" for the default "message"
	hasData  bool   // a data field was seen since the last dispatch
	skipLF   bool   // the previous line ended in CR: an LF right after belongs to it
	eof      bool
	maxEvent int
}

func newSSEDecoder(r io.Reader) *sseDecoder {
	return &sseDecoder{r: bufio.NewReaderSize(r, sseReadBuffer), maxLine: MaxSSELineBytes, maxEvent: MaxSSELineBytes}
}

// next returns the next event's type and data. The data slice is valid
// until the following call. At the end of the stream a pending event
// without its closing blank line is still returned (providers do end with
// "data: [DONE]" and no blank line), then io.EOF. Other errors are the
// reader's, ErrLineTooLong or ErrEventTooLarge.
func (d *sseDecoder) next() (event string, data []byte, err error) {
	for {
		if d.eof {
			return "", nil, io.EOF
		}
		line, err := d.readLine()
		if errors.Is(err, io.EOF) {
			d.eof = true
			if len(line) > 0 {
				if err := d.field(line); err != nil {
					return "", nil, err
				}
			}
			if d.hasData {
				return d.dispatch()
			}
			return "", nil, io.EOF
		}
		if err != nil {
			return "", nil, err
		}
		if len(line) == 0 {
			if d.hasData {
				return d.dispatch()
			}
			d.event = ""
			continue
		}
		if err := d.field(line); err != nil {
			return "", nil, err
		}
	}
}

// unterminated reports that the event next just returned had no closing
// blank line: the body ended inside it.
func (d *sseDecoder) unterminated() bool { return d.eof }

func (d *sseDecoder) dispatch() (string, []byte, error) {
	ev := d.event
	d.event, d.hasData = "", false
	data := d.data
	d.data = d.data[:0]
	return ev, data, nil
}

// field applies one non-blank line to the pending event.
func (d *sseDecoder) field(line []byte) error {
	if line[0] == ':' {
		return nil // comment, e.g. ": keep-alive"
	}
	name, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		name, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(name) {
	case "data":
		extra := len(value)
		if d.hasData {
			extra++
		}
		if len(d.data)+extra > d.maxEvent {
			return fmt.Errorf("%w (limit %d bytes)", ErrEventTooLarge, d.maxEvent)
		}
		if d.hasData {
			d.data = append(d.data, '\n')
		}
		d.data = append(d.data, value...)
		d.hasData = true
	case "event":
		d.event = string(value)
	}
	return nil
}

// readLine returns the next line without its terminator. At the end of the
// stream it returns the unterminated remainder (possibly empty) with
// io.EOF.
func (d *sseDecoder) readLine() ([]byte, error) {
	d.line = d.line[:0]
	if d.skipLF {
		d.skipLF = false
		b, err := d.r.ReadByte()
		if err != nil {
			return nil, err
		}
		if b != '\n' {
			_ = d.r.UnreadByte()
		}
	}
	for {
		// Peek at whatever is buffered (filling the buffer if it is empty)
		// so a lone CR can end a line without consuming what follows it.
		if d.r.Buffered() == 0 {
			if _, err := d.r.Peek(1); err != nil {
				return d.line, err
			}
		}
		buf, _ := d.r.Peek(d.r.Buffered())
		i := bytes.IndexAny(buf, "\r\n")
		n := len(buf)
		if i >= 0 {
			n = i
		}
		if len(d.line)+n > d.maxLine {
			return nil, fmt.Errorf("%w (limit %d bytes)", ErrLineTooLong, d.maxLine)
		}
		d.line = append(d.line, buf[:n]...)
		if i < 0 {
			_, _ = d.r.Discard(n)
			continue
		}
		d.skipLF = buf[i] == '\r'
		_, _ = d.r.Discard(i + 1)
		return d.line, nil
	}
}
