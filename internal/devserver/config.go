package devserver

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	uiserver "github.com/temporalio/ui-server/v2/server"
	uiconfig "github.com/temporalio/ui-server/v2/server/config"
	uiserveroptions "github.com/temporalio/ui-server/v2/server/server_options"
	"go.temporal.io/server/common/authorization"
	"go.temporal.io/server/common/cluster"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/dynamicconfig"
	"go.temporal.io/server/common/membership/static"
	sqliteplugin "go.temporal.io/server/common/persistence/sql/sqlplugin/sqlite"
	"go.temporal.io/server/common/primitives"
	sqliteschema "go.temporal.io/server/schema/sqlite"
	"go.temporal.io/server/temporal"
	"google.golang.org/protobuf/types/known/durationpb"
)

const (
	// clusterName names the single local cluster. It is persisted in the
	// database's cluster metadata on the first start, so it must never
	// change for an existing DataDir.
	clusterName = "active"
	// storeName is the persistence DataStores key for the SQLite store.
	storeName = "sqlite-default"
	// internalHost is where history, matching and worker listen: they are
	// only ever dialled from inside this process.
	internalHost = "127.0.0.1"
)

// ports are the TCP ports a server instance uses.
type ports struct {
	frontend, ui              int // ui is 0 when the UI is disabled
	frontendHTTP              int // the frontend's HTTP API (and Nexus)
	history, matching, worker int
}

// reservePorts resolves FreePort values and checks that explicit ports are
// free, holding every port in res until the caller releases it.
func (r *resolved) reservePorts(res *portReservation) (ports, error) {
	var p ports
	var err error
	pick := func(service, host string, port int) int {
		if err != nil {
			return 0
		}
		if port == FreePort {
			port = 0
		}
		var got int
		got, err = res.reserve(service, host, port)
		return got
	}
	p.frontend = pick("frontend", r.bindHost, r.FrontendPort)
	if !r.DisableUI {
		p.ui = pick("UI", r.bindHost, r.UIPort)
	}
	// The HTTP API gets a free port rather than a conventional one: durallm
	// does not use it, but enabling it serves Nexus and curl users and
	// stops the server warning on every start that it is off.
	p.frontendHTTP = pick("frontend HTTP", r.bindHost, 0)
	p.history = pick("history", internalHost, 0)
	p.matching = pick("matching", internalHost, 0)
	p.worker = pick("worker", internalHost, 0)
	return p, err
}

// sqlConfig describes the SQLite database. WAL with synchronous=NORMAL
// turns each of the server's many small transactions into one sequential
// append instead of several fsyncs, which is what makes a file-backed dev
// server feel as quick as an in-memory one; a power cut can lose the last
// transactions but never corrupts the file, a fair trade for a dev box.
func (r *resolved) sqlConfig() *config.SQL {
	attrs := map[string]string{
		"mode":         "rwc",
		"journal_mode": "wal",
		"synchronous":  "normal",
	}
	for k, v := range r.SQLitePragmas {
		if v == "" {
			delete(attrs, k)
			continue
		}
		attrs[k] = v
	}
	return &config.SQL{PluginName: sqliteplugin.PluginName, DatabaseName: r.dbPath, ConnectAttributes: attrs}
}

// prepareDatabase creates DataDir and the schema (first start only) and
// registers the namespace if it is missing. The namespace is written
// straight into the database before the server starts, as the temporal CLI
// does, so that every service's namespace cache sees it (and its search
// attributes) from the first moment, with no propagation delay.
func (r *resolved) prepareDatabase() (*config.SQL, error) {
	if err := ensureDir(r.DataDir); err != nil {
		return nil, err
	}
	conf := r.sqlConfig()

	// An empty file counts as new: SQLite itself creates one when it is
	// opened, so a previous run that died before creating the schema may
	// have left one behind.
	fi, err := os.Stat(r.dbPath)
	switch {
	case os.IsNotExist(err) || (err == nil && fi.Size() == 0):
		r.Progress(fmt.Sprintf("creating Temporal schema in %s (first start)", r.dbPath))
		if err := sqliteschema.SetupSchema(conf); err != nil {
			// The file is new, so removing it loses nothing and lets the
			// next start retry from scratch instead of tripping over a
			// half-built schema.
			_ = os.Remove(r.dbPath)
			_ = os.Remove(r.dbPath + "-wal")
			_ = os.Remove(r.dbPath + "-shm")
			return nil, fmt.Errorf("devserver: creating schema in %s: %w", r.dbPath, err)
		}
	case err != nil:
		return nil, fmt.Errorf("devserver: checking database %s: %w", r.dbPath, err)
	case fi.IsDir():
		return nil, fmt.Errorf("devserver: database path %s is a directory", r.dbPath)
	}

	ns, err := sqliteschema.NewNamespaceConfig(clusterName, r.Namespace, false, r.SearchAttributes)
	if err != nil {
		return nil, fmt.Errorf("devserver: preparing namespace %q: %w", r.Namespace, err)
	}
	ns.Detail.Config.Retention = durationpb.New(r.Retention)
	// CreateNamespaces leaves an existing namespace untouched, which is
	// what makes restarts idempotent.
	if err := sqliteschema.CreateNamespaces(conf, ns); err != nil {
		return nil, fmt.Errorf("devserver: registering namespace %q: %w", r.Namespace, err)
	}
	return conf, nil
}

// buildServerConfig mirrors the temporal CLI's dev server configuration:
// one history shard, no archival, a single local cluster, static hosts.
func (r *resolved) buildServerConfig(sqlConf *config.SQL, p ports) *config.Config {
	frontendAddr := net.JoinHostPort(r.dialHost, strconv.Itoa(p.frontend))

	var conf config.Config
	conf.Global.Membership.MaxJoinDuration = 30 * time.Second
	conf.Global.Membership.BroadcastAddress = r.dialHost

	conf.Persistence.DefaultStore = storeName
	conf.Persistence.VisibilityStore = storeName
	// One shard is plenty for one developer and keeps SQLite's single
	// writer uncontended.
	conf.Persistence.NumHistoryShards = 1
	conf.Persistence.DataStores = map[string]config.DataStore{storeName: {SQL: sqlConf}}

	conf.ClusterMetadata = &cluster.Config{
		EnableGlobalNamespace:    false,
		FailoverVersionIncrement: 10,
		MasterClusterName:        clusterName,
		CurrentClusterName:       clusterName,
		ClusterInformation: map[string]cluster.ClusterInformation{
			clusterName: {
				Enabled:                true,
				InitialFailoverVersion: 1,
				RPCAddress:             frontendAddr,
				HTTPAddress:            net.JoinHostPort(r.dialHost, strconv.Itoa(p.frontendHTTP)),
			},
		},
	}
	conf.DCRedirectionPolicy.Policy = "noop"

	service := func(host string, port int) config.Service {
		return config.Service{RPC: config.RPC{GRPCPort: port, BindOnIP: host}}
	}
	frontend := service(r.bindHost, p.frontend)
	frontend.RPC.HTTPPort = p.frontendHTTP
	conf.Services = map[string]config.Service{
		string(primitives.FrontendService): frontend,
		string(primitives.HistoryService):  service(internalHost, p.history),
		string(primitives.MatchingService): service(internalHost, p.matching),
		string(primitives.WorkerService):   service(internalHost, p.worker),
	}

	conf.Archival.History.State = "disabled"
	conf.Archival.Visibility.State = "disabled"
	conf.NamespaceDefaults.Archival.History.State = "disabled"
	conf.NamespaceDefaults.Archival.Visibility.State = "disabled"
	// The server's own worker service (system workflows) dials the
	// frontend through this address.
	conf.PublicClient.HostPort = frontendAddr
	return &conf
}

// buildServerOptions turns the config into temporal.ServerOptions, with the
// log adapter and dynamic config tuned for a dev machine.
func (r *resolved) buildServerOptions(conf *config.Config, p ports) ([]temporal.ServerOption, error) {
	logger := serverLogger{l: r.logger}
	authorizer, err := authorization.GetAuthorizerFromConfig(&conf.Global.Authorization)
	if err != nil {
		return nil, fmt.Errorf("devserver: creating authorizer: %w", err)
	}
	claimMapper, err := authorization.GetClaimMapperFromConfig(&conf.Global.Authorization, logger)
	if err != nil {
		return nil, fmt.Errorf("devserver: creating claim mapper: %w", err)
	}

	host := func(addr string, port int) static.Hosts {
		return static.SingleLocalHost(net.JoinHostPort(addr, strconv.Itoa(port)))
	}
	return []temporal.ServerOption{
		temporal.WithConfig(conf),
		temporal.ForServices(temporal.DefaultServices),
		// Static hosts instead of ringpop membership: nothing to gossip
		// in a single process, and it saves the membership join at start.
		temporal.WithStaticHosts(map[primitives.ServiceName]static.Hosts{
			primitives.FrontendService: host(r.dialHost, p.frontend),
			primitives.HistoryService:  host(internalHost, p.history),
			primitives.MatchingService: host(internalHost, p.matching),
			primitives.WorkerService:   host(internalHost, p.worker),
		}),
		temporal.WithLogger(logger),
		temporal.WithAuthorizer(authorizer),
		temporal.WithClaimMapper(func(*config.Config) authorization.ClaimMapper { return claimMapper }),
		temporal.WithDynamicConfigClient(r.dynamicConfig()),
	}, nil
}

// transferReadsPerSecond is the history shard's transfer-queue read rate
// every server the project starts uses; see devDynamicConfig.
const transferReadsPerSecond = 1000

// longPollInterval bounds every history long poll of the embedded server
// (history.longPollExpirationInterval; the server's default is 20 s):
// how long a caller waiting for an action's result sleeps when the
// server lost its wakeup (TestTheServerLosesALongPollWakeupWhenTwoArrive-
// BeforeItIsRead), before it asks again and finds the action closed.
// Each waiting caller then asks once per interval, a read of cached
// mutable state.
const longPollInterval = 2 * time.Second

// TemporaltestOption is the server option a
// go.temporal.io/server/temporaltest server needs for the same latency as
// the embedded default (pass it with temporaltest.WithBaseServerOptions):
// temporaltest's own dynamic config (it refreshes the search-attribute
// cache on read), plus the transfer-queue read rate of devDynamicConfig,
// without which each workflow task waits up to 50 ms once a burst of 20
// is spent, and its short history long poll (longPollInterval).
func TemporaltestOption() temporal.ServerOption {
	return temporal.WithDynamicConfigClient(dynamicconfig.StaticClient{
		dynamicconfig.ForceSearchAttributesCacheRefreshOnRead.Key(): []dynamicconfig.ConstrainedValue{{Value: true}},
		dynamicconfig.TransferProcessorMaxPollRPS.Key():             []dynamicconfig.ConstrainedValue{{Value: transferReadsPerSecond}},
		dynamicconfig.HistoryLongPollExpirationInterval.Key():       []dynamicconfig.ConstrainedValue{{Value: longPollInterval}},
	})
}

// devDynamicConfig holds the dynamic config overrides for a dev server on a
// small machine. Updates (frontend.enableUpdateWorkflowExecution) and
// SQL-visibility search attribute queries are on by default in server
// v1.32, so they are only pinned here to document that durallm relies on
// them.
func devDynamicConfig() dynamicconfig.StaticClient {
	return dynamicconfig.StaticClient{
		// The server's 128k-entry mutable state cache is sized for
		// production hosts; 8k (the CLI's value) keeps memory modest.
		dynamicconfig.HistoryCacheHostLevelMaxSize.Key(): 8096,
		// Every workflow task (and every activity not dispatched eagerly)
		// reaches matching through the history shard's transfer queue,
		// whose reader takes a token from a per-shard limiter before each
		// read (service/history/queues: ReaderImpl.loadAndSubmitTasks,
		// newShardReaderRateLimiter). The server's default of 20 reads/s
		// with a burst of 20 is sized for clusters of hundreds of shards;
		// with our one shard, one caller drains the burst in about eight
		// actions and from then on each workflow task waits for the next
		// 50 ms token: a steady 100 ms per one-activity action, two or
		// three times what the first eight took. 1000 bounds
		// the wait at 1 ms; the reader still reads only when new tasks
		// were notified, up to history.transferTaskBatchSize (100) at a
		// time. BenchmarkSequentialLatency, docs/performance.md.
		dynamicconfig.TransferProcessorMaxPollRPS.Key(): transferReadsPerSecond,
		// A caller waiting for an action's result whose wakeup the server
		// lost (it drops one when two updates arrive before the waiter
		// reads the first, which on 2 busy cores happens about once in a
		// thousand actions) slept out the whole 20 s long poll; see
		// longPollInterval.
		dynamicconfig.HistoryLongPollExpirationInterval.Key(): longPollInterval,
		// Every history write walks the new events' payloads to add up
		// the size of those stored externally (SDK external storage),
		// and the visibility record then carries the totals; durallm
		// stores nothing externally, and the walk is 2.5% of the
		// process's CPU per action on the embedded default (workflow.
		// CalculateExternalPayloadSize, docs/performance.md "Where the
		// CPU of an action goes").
		dynamicconfig.ExternalPayloadsEnabled.Key(): false,
		// The UI polls visibility for every open page; the default of 10
		// RPS per namespace throttles even a single user with two tabs.
		dynamicconfig.FrontendMaxNamespaceVisibilityRPSPerInstance.Key():       100,
		dynamicconfig.FrontendEnableUpdateWorkflowExecution.Key():              true,
		dynamicconfig.FrontendEnableUpdateWorkflowExecutionAsyncAccepted.Key(): true,
	}
}

// dynamicConfig is devDynamicConfig with Options.DynamicConfig applied.
func (r *resolved) dynamicConfig() dynamicconfig.StaticClient {
	dc := devDynamicConfig()
	for k, v := range r.DynamicConfig {
		if v == nil {
			delete(dc, dynamicconfig.MakeKey(k))
			continue
		}
		dc[dynamicconfig.MakeKey(k)] = v
	}
	return dc
}

// buildUIServer configures the Web UI to proxy to the frontend.
func (r *resolved) buildUIServer(frontendHostPort string, port int) *uiserver.Server {
	return uiserver.NewServer(uiserveroptions.WithConfigProvider(UIConfig(r.bindHost, port, frontendHostPort, r.Namespace, r.CodecEndpoint)))
}

// UIConfig is the Web UI's configuration: served on host:port, proxying to
// the frontend at frontendHostPort, opening on namespace, asking the codec
// server at codecEndpoint (may be empty) to decode payloads. The cluster
// harness (internal/cluster) serves the same UI in front of its cluster.
func UIConfig(host string, port int, frontendHostPort, namespace, codecEndpoint string) *uiconfig.Config {
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		// The UI server formats its listen address as "%s:%d".
		host = "[" + host + "]"
	}
	return &uiconfig.Config{
		Host:                host,
		Port:                port,
		TemporalGRPCAddress: frontendHostPort,
		EnableUI:            true,
		DefaultNamespace:    namespace,
		// Plain HTTP on loopback: the CSRF cookie must not demand HTTPS.
		CORS:     uiconfig.CORS{CookieInsecure: true},
		HideLogs: true,
		// A local tool should not make the browser fetch temporal.io news.
		DisableNewsFetch: true,
		Codec:            uiconfig.Codec{Endpoint: codecEndpoint},
	}
}
