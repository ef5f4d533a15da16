package e2e_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// cpuBuckets are where a CPU profile of the whole stack (server, worker
// and caller in one process) is broken down, in the order reported. Each
// sample goes to exactly one.
var cpuBuckets = []string{
	"sqlite-persistence", // SQLite for history, mutable state, task queues, shard
	"sqlite-visibility",  // SQLite for visibility records (the visibility queue's writes)
	"gzip",               // gRPC's gzip compression, both ends
	"grpc",               // gRPC and HTTP/2 transport, loopback syscalls
	"protobuf",           // protobuf (un)marshalling and payload visiting
	"server-history",     // history service logic
	"server-matching",    // matching service logic
	"server-frontend",    // frontend service logic
	"server-common",      // the server's shared code: interceptors, caches, metrics, persistence glue
	"sdk",                // the Temporal Go SDK: worker, client, workflow runtime
	"durallm",            // this module: workflow, activities, recovery engine, worker
	"provider",           // the providertest provider answering
	"gc",                 // the Go garbage collector's background marking
	"runtime",            // the rest of the Go runtime: scheduler, stack growth, timers
}

// transparentFrame is a frame that says nothing about whose work a sample
// is: the standard library and runtime helpers. A sample goes to the
// first non-transparent frame from its leaf.
var transparentFrame = regexp.MustCompile(`^(runtime\.|internal/|syscall\.|sync\.|sync/|reflect\.|encoding/|fmt\.|strings\.|bytes\.|strconv\.|sort\.|slices\.|maps\.|unicode|math|time\.|context\.|errors\.|io\.|bufio\.|os\.|net\.|net/|crypto/|hash/|container/|log/|regexp|type:|aeshashbody|memeqbody|indexbytebody|gcWriteBarrier|github\.com/google/uuid|go\.uber\.org/|github\.com/golang/|golang\.org/x/exp|go\.opentelemetry\.io/|github\.com/prometheus/|github\.com/uber-go/tally)`)

// bucketOf names the bucket of one sample's stack, leaf first.
func bucketOf(stack []string) string {
	joined := strings.Join(stack, "\n")
	switch {
	case strings.Contains(joined, "modernc.org/") || strings.Contains(joined, "sqlplugin"):
		if strings.Contains(joined, "visibilityQueueTaskExecutor") || strings.Contains(joined, "persistence/visibility") {
			return "sqlite-visibility"
		}
		return "sqlite-persistence"
	case strings.Contains(joined, "compress/flate") || strings.Contains(joined, "compress/gzip") || strings.Contains(joined, "grpc/encoding/gzip"):
		return "gzip"
	case strings.Contains(joined, "runtime.gcBgMarkWorker"):
		return "gc"
	}
	for _, f := range stack {
		switch {
		case transparentFrame.MatchString(f):
			continue
		case strings.HasPrefix(f, "google.golang.org/protobuf"), strings.HasPrefix(f, "go.temporal.io/api/proxy"):
			return "protobuf"
		case strings.HasPrefix(f, "google.golang.org/grpc"), strings.HasPrefix(f, "golang.org/x/net/http2"):
			return "grpc"
		case strings.HasPrefix(f, "github.com/durallm/durallm/testsuite/providertest"):
			return "provider"
		case strings.HasPrefix(f, "github.com/durallm/"):
			return "durallm"
		case strings.HasPrefix(f, "go.temporal.io/sdk"):
			return "sdk"
		case strings.HasPrefix(f, "go.temporal.io/server/service/history"):
			return "server-history"
		case strings.HasPrefix(f, "go.temporal.io/server/service/matching"):
			return "server-matching"
		case strings.HasPrefix(f, "go.temporal.io/server/service/frontend"):
			return "server-frontend"
		case strings.HasPrefix(f, "go.temporal.io/"):
			return "server-common"
		default:
			return "runtime"
		}
	}
	return "runtime"
}

// cpuBreakdown reads the CPU profile at path and adds up its samples by
// bucket.
func cpuBreakdown(path string) (map[string]time.Duration, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return nil, err
	}
	idx := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			idx = i
		}
	}
	out := map[string]time.Duration{}
	if idx < 0 {
		return out, nil
	}
	for _, s := range p.Sample {
		var stack []string
		for _, loc := range s.Location {
			// Line[0] is the innermost of the functions inlined here.
			for _, l := range loc.Line {
				if l.Function != nil {
					stack = append(stack, l.Function.Name)
				}
			}
		}
		out[bucketOf(stack)] += time.Duration(s.Value[idx])
	}
	return out, nil
}

// reportCPUBreakdown reports the profile at path as cpu-<bucket>-ms/op
// metrics, n runs.
func reportCPUBreakdown(b *testing.B, path string, n int) {
	got, err := cpuBreakdown(path)
	if err != nil {
		b.Fatal(err)
	}
	for _, k := range cpuBuckets {
		b.ReportMetric(ms(got[k]/time.Duration(n)), "cpu-"+k+"-ms/op")
	}
}

func TestBucketOf(t *testing.T) {
	for _, tc := range []struct {
		stack []string
		want  string
	}{
		{[]string{"modernc.org/sqlite/lib._sqlite3VdbeExec", "go.temporal.io/server/service/history.(*visibilityQueueTaskExecutor).Execute"}, "sqlite-visibility"},
		{[]string{"modernc.org/sqlite/lib._yy_reduce", "go.temporal.io/server/service/history/shard.(*ContextImpl).UpdateWorkflowExecution"}, "sqlite-persistence"},
		{[]string{"compress/flate.(*compressor).reset", "google.golang.org/grpc.compress"}, "gzip"},
		{[]string{"runtime.mallocgc", "google.golang.org/protobuf/internal/impl.(*MessageInfo).unmarshalPointer", "go.temporal.io/sdk/internal.(*workflowTaskPoller).poll"}, "protobuf"},
		{[]string{"internal/runtime/syscall/linux.Syscall6", "syscall.write", "google.golang.org/grpc/internal/transport.(*bufWriter).Flush"}, "grpc"},
		{[]string{"runtime.scanobject", "runtime.gcDrain", "runtime.gcBgMarkWorker"}, "gc"},
		{[]string{"runtime.newobject", "github.com/durallm/durallm/recovery.(*Engine).Do"}, "durallm"},
		{[]string{"go.temporal.io/server/common/cache.(*lru).Get", "go.temporal.io/server/service/history/workflow/cache.(*cacheImpl).Get"}, "server-common"},
		{[]string{"runtime.schedule", "runtime.mcall"}, "runtime"},
	} {
		if got := bucketOf(tc.stack); got != tc.want {
			t.Errorf("%v: %s, want %s", tc.stack, got, tc.want)
		}
	}
}
