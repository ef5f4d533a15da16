package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/durallm/durallm/activities"
)

// RemoteStreams reads an action's stream from the worker that runs its
// attempt in another process: the worker names its stream endpoint in its
// Temporal identity, which Temporal records when the attempt starts
// (attempt.StreamIdentity), and in the attempt's heartbeats
// (attempt.Progress.StreamURL); the gateway reads either with
// durallm.Client.Describe and then the worker's replay log (GET
// {url}/v1/streams/{id}?starting_after=N), from the first event or
// wherever the caller resumes.
type RemoteStreams struct {
	// Token is the bearer token the workers' stream endpoints require
	// (their DURALLM_STREAM_TOKEN). Empty means none.
	Token string
	// Self is the stream URL this process's own worker advertises, whose
	// attempts stream through Options.Streams instead. Empty means none.
	Self string
	// HTTP sends the requests. Nil means a client without an overall
	// timeout (a stream lasts as long as its answer).
	HTTP *http.Client
	// Poll is the wait between looks for the attempt's stream URL for
	// the first 100ms; then it doubles up to MaxPoll. Zero means 2ms: the
	// URL is there as soon as the attempt starts, and a doubling wait from
	// the start measured 5 ms more to the first token than a steady one
	// (docs/performance.md).
	Poll time.Duration
	// MaxPoll bounds the wait between looks. Zero means 250ms.
	MaxPoll time.Duration
}

func (r *RemoteStreams) client() *http.Client {
	if r.HTTP != nil {
		return r.HTTP
	}
	return http.DefaultClient
}

// remoteDelay is how long a gateway that has its own worker waits for the
// attempt to stream through its hub before it looks for another worker's:
// with eager start, the first attempt runs here.
const remoteDelay = 100 * time.Millisecond

// source numbers where a stream's events come from.
type source int

const (
	fromLocal source = iota + 1
	fromRemote
)

// merger hands on the events of the first source that streams content;
// only one attempt of an action ever does (docs/contract.md section 6.2).
type merger struct {
	mu    sync.Mutex
	owner source
	out   chan<- activities.StreamEvent
}

// emit hands ev on unless another source owns the stream; it reports
// false when the caller should stop.
func (m *merger) emit(ctx context.Context, from source, ev activities.StreamEvent) bool {
	m.mu.Lock()
	if m.owner == 0 && content(ev) {
		m.owner = from
	}
	mine := m.owner == 0 || m.owner == from
	m.mu.Unlock()
	if !mine {
		return false
	}
	select {
	case m.out <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

func (m *merger) ownedBy(from source) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.owner == from
}

// followRemote reads the action's stream from the workers running its
// attempts until an end event, ctx ending, the action closing, or another
// source owning the stream.
func (g *Gateway) followRemote(ctx context.Context, id string, after uint64, m *merger, delay time.Duration) {
	r := g.o.Remote
	if delay > 0 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
	var skip string   // an attempt that ended without streaming here
	pause := r.poll() // before reading a broken stream again
	for ctx.Err() == nil && !m.ownedBy(fromLocal) {
		url, attemptID, ok := g.discover(ctx, id, skip, m)
		if !ok {
			return
		}
		last, ended, err := g.readRemote(ctx, url, id, after, attemptID, m)
		if last > after {
			pause = r.poll()
		}
		after = max(after, last)
		if ended || ctx.Err() != nil {
			return
		}
		if errors.Is(err, errAttemptMoved) {
			skip = attemptID
			continue
		}
		// The connection to the worker broke, or its stream stopped
		// short: read the attempt again, after the last event read, once
		// it is still the one running.
		skip = ""
		g.log.Debug("gateway: a worker's stream broke; reading it again", "action_id", id, "error", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, r.maxPoll())
	}
}

func (r *RemoteStreams) poll() time.Duration {
	if r.Poll > 0 {
		return r.Poll
	}
	return 2 * time.Millisecond
}

func (r *RemoteStreams) maxPoll() time.Duration {
	if r.MaxPoll > 0 {
		return r.MaxPoll
	}
	return 250 * time.Millisecond
}

// discover waits for a running attempt of the action whose worker
// advertises its stream, other than this process's own and other than
// skip (an attempt already read). It reports false when the action closed,
// ctx ended or this process's hub owns the stream.
func (g *Gateway) discover(ctx context.Context, id, skip string, m *merger) (url, attemptID string, ok bool) {
	r := g.o.Remote
	wait := r.poll()
	start := time.Now()
	for {
		if m.ownedBy(fromLocal) {
			return "", "", false
		}
		d, err := g.c.Describe(ctx, id)
		if err == nil && !d.Running {
			return "", "", false
		}
		if err == nil {
			for i := len(d.Attempts) - 1; i >= 0; i-- {
				a := d.Attempts[i]
				if a.StreamURL != "" && a.StreamURL != r.Self && a.ActivityID != skip {
					return a.StreamURL, a.ActivityID, true
				}
				if a.Started {
					// Running here, or on a worker that serves no stream:
					// nothing to read elsewhere until another attempt
					// starts, so look again only now and then.
					wait = r.maxPoll()
				}
			}
		}
		select {
		case <-ctx.Done():
			return "", "", false
		case <-time.After(wait):
		}
		if time.Since(start) > steadyLook {
			wait = min(2*wait, r.maxPoll())
		}
	}
}

// steadyLook is how long the look for an attempt's stream URL keeps its
// first, short interval.
const steadyLook = 100 * time.Millisecond

// errAttemptMoved ends a read of a worker's stream whose attempt ended
// without content while another attempt runs.
var errAttemptMoved = errors.New("gateway: the attempt moved")

// readRemote reads one worker's log of the action after sequence number
// after. It returns the last sequence number read and whether the end
// event came. While nothing has come it watches the action, and gives up
// on this worker once its attempt is no longer the running one.
func (g *Gateway) readRemote(ctx context.Context, base, id string, after uint64, attemptID string, m *merger) (last uint64, ended bool, err error) {
	r := g.o.Remote
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, base+"/v1/streams/"+url.PathEscape(id)+"?starting_after="+strconv.FormatUint(after, 10), nil)
	if err != nil {
		return after, false, err
	}
	if r.Token != "" {
		req.Header.Set("Authorization", "Bearer "+r.Token)
	}
	resp, err := r.client().Do(req)
	if err != nil {
		return after, false, fmt.Errorf("open %s: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return after, false, fmt.Errorf("open %s: status %d", base, resp.StatusCode)
	}
	got := make(chan struct{})
	var once sync.Once
	go func() {
		// Until the first event: is the attempt still the one running?
		t := time.NewTicker(r.maxPoll())
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-got:
				return
			case <-t.C:
			}
			d, err := g.c.Describe(rctx, id)
			if err != nil {
				continue
			}
			running := false
			for _, a := range d.Attempts {
				running = running || a.ActivityID == attemptID
			}
			if !d.Running || !running {
				cancel(errAttemptMoved)
				return
			}
		}
	}()
	last = after
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 2<<20)
	var data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
		case line == "" && data != "":
			var ev activities.StreamEvent
			if json.Unmarshal([]byte(data), &ev) != nil {
				return last, false, errors.New("a worker's stream sent an event that is not JSON")
			}
			data = ""
			once.Do(func() { close(got) })
			ev.ActionRef = id
			last = ev.Seq
			if !m.emit(ctx, fromRemote, ev) {
				return last, true, nil
			}
			if ev.Kind == activities.EventEnd {
				return last, true, nil
			}
		}
	}
	if cause := context.Cause(rctx); cause != nil {
		return last, false, cause
	}
	if err := sc.Err(); err != nil {
		return last, false, err
	}
	return last, false, errors.New("a worker's stream ended before its end event")
}
