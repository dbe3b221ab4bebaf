// Command loadclient holds WebSocket connections to one server, ours (/v1/ws) or
// Centrifugo's (its JSON protocol), and counts what each device receives: the
// compiled load client of the peers comparison (loadtest/peers, --client go).
//
// Python clients cost 15-35 µs of CPU per frame, as much as the server they
// measure on the same two cores; this one costs what the kernel does and little
// more, so a comparison measures the servers. Both protocols go through the same
// code (dial, read loop, accounting); they differ only in the upgrade's target,
// what is sent once it is open, and how a frame gives a message's id and send time.
//
//	loadclient -protocol ours -url ws://127.0.0.1:8765 -users users.txt -secret S \
//	    -expect owed.txt -until-complete -ids-out run.ids -lat-out run.lat
//
// Every message id is for one user and reaches each of the user's devices in id
// order, so a device keeps only its last id: one at or below it is a duplicate.
// Lost = what the device was owed (-expect) less what it received. The result is
// one JSON object on stdout at the end (SIGTERM/SIGINT, -until-complete, or
// -max-seconds); a progress line of JSON goes to stderr every -progress-ms.
package main

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/bits"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gobwas/ws"
)

const (
	protoOurs       = "ours"
	protoCentrifugo = "centrifugo"
	centrifugoPing  = "{}" // a server ping, and equally the client's answer
	maxPayload      = 1 << 24
	openTimeout     = 30 * time.Second // the upgrade and the hello (or connect reply)
	anomaliesListed = 100              // devices with loss or duplicates named in the result
)

type config struct {
	protocol      string
	url           string
	path          string
	usersFile     string
	tokensFile    string
	secret        string
	tokenTTL      time.Duration
	sources       []net.IP
	expectFile    string
	untilComplete bool
	maxSeconds    float64
	idsOut        string
	latOut        string
	inFlight      int
	progress      time.Duration
	readBuffer    int
	reactors      int
	perDevice     bool
	control       bool   // devices connect as told on stdin ({"target": n}), not all at the start
	framesOut     string // every message frame, repeats included: (device index, id) as two int64
	retryBase     time.Duration
	retryMax      time.Duration
	reopenMin     time.Duration
	reopenMax     time.Duration
	randomPorts   bool
}

// device is one connection's user and what it has had, across its reconnects.
// One goroutine at a time writes it until the run ends: the one dialing it, then the reactor
// reading its connection, then the one dialing it again.
type device struct {
	user       string
	token      string // from -tokens; else minted at each dial (a million stored cost 200 MB)
	rng        *rand.Rand
	attempt    int  // failed attempts in a row
	seen       bool // connected at least once
	source     net.IP
	since      string // ours: the resume cursor
	last       int64
	received   int64
	duplicated int64
	owed       int64 // -1: not known
	reconnects int
	failures   int
	ids        []int64
	lat        []float32
	frames     []int64 // with -frames-out: every message frame's id, repeats and all
}

type client struct {
	cfg        config
	proto      string
	addr       string
	path       string
	secret     []byte
	devices    []*device
	gate       chan struct{}
	hist       histogram
	keepTally  bool
	connected  atomic.Int64 // devices that connected at least once
	open       atomic.Int64
	frames     atomic.Int64 // message frames, duplicates included
	received   atomic.Int64
	duplicated atomic.Int64
	incomplete atomic.Int64 // devices still owed something (with -expect)
	complete   chan struct{}
	once       sync.Once
	allAt      atomic.Int64 // ns since start when the last device first connected
	started    time.Time
	reactors   []*reactor
	next       atomic.Uint32
	mu         sync.Mutex
	stopping   bool // the run is ending: no connection is handed to a reactor any more
	conns      map[*conn]struct{}
	closeCodes map[string]int
	ctx        context.Context
	ports      portRange
	holds      sync.WaitGroup
	active     int          // devices started (the first `active`); only run's goroutine changes it
	activeN    atomic.Int64 // the same, for the progress line
	tidied     int          // active when the garbage was last given back
	failures   atomic.Int64 // attempts that did not open
	refused    atomic.Int64 // of them, upgrades answered with another status than 101 (503: full, draining)
	closed     atomic.Int64 // open connections that ended (a close frame, or broken) before the run's end
	marked     atomic.Bool  // a mark was given: opens from then on count as back
	back       atomic.Int64 // opens since the mark
	lastBack   atomic.Int64 // wall time of the latest of them, ns since the epoch
}

// conn is one open WebSocket of a device: read by its dialing goroutine until it is open,
// then by a reactor (reactor.go) from its own descriptor fd.
type conn struct {
	cl      *client
	d       *device
	nc      net.Conn
	r       *bufio.Reader
	fd      int    // -1 until handed over
	pending []byte // an unfinished frame the reactor read the start of
	live    bool   // open and the reactor's: its end counts, and the device dials again
	endOnce sync.Once
	payload []byte // the frame being read, reused
	message []byte // a fragmented message's parts so far
	fragOp  ws.OpCode
	out     []byte // a frame being written, reused
	settled bool
	ok      bool
	code    string // the close code the server sent
}

var errRefused = errors.New("refused")

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadclient:", err)
		os.Exit(2)
	}
	cl, err := newClient(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadclient:", err)
		os.Exit(2)
	}
	result := cl.run()
	if err := writeTally(cl, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "loadclient:", err)
		os.Exit(1)
	}
	out, _ := json.Marshal(result)
	os.Stdout.Write(append(out, '\n'))
}

func parseFlags(args []string) (config, error) {
	var cfg config
	var sources string
	fs := flag.NewFlagSet("loadclient", flag.ContinueOnError)
	fs.StringVar(&cfg.protocol, "protocol", protoOurs, "ours or centrifugo")
	fs.StringVar(&cfg.url, "url", "", "the server, ws://HOST:PORT")
	fs.StringVar(&cfg.path, "path", "", "the upgrade's path (default /v1/ws, or /connection/websocket)")
	fs.StringVar(&cfg.usersFile, "users", "", "a user per line, one connection each (a user's devices: its lines)")
	fs.StringVar(&cfg.tokensFile, "tokens", "", "'user token' per line; else tokens are minted with -secret")
	fs.StringVar(&cfg.secret, "secret", "", "the HS256 secret to mint each user's token with")
	fs.DurationVar(&cfg.tokenTTL, "token-ttl", 4*time.Hour, "minted tokens' lifetime: longer than the run")
	fs.StringVar(&sources, "sources", "", "local addresses, comma-separated, dealt out to the connections "+
		"(each has its own ephemeral ports)")
	fs.StringVar(&cfg.expectFile, "expect", "", "'user count' per line: messages owed to each device of the user")
	fs.BoolVar(&cfg.untilComplete, "until-complete", false, "end once every device has what -expect owes it")
	fs.Float64Var(&cfg.maxSeconds, "max-seconds", 0, "end after this long in any case (0: no bound)")
	fs.StringVar(&cfg.idsOut, "ids-out", "", "each first arrival's id, int64 little-endian")
	fs.StringVar(&cfg.latOut, "lat-out", "", "each first arrival's latency in ms, float32 (NaN: no send time)")
	fs.IntVar(&cfg.inFlight, "in-flight", 200, "handshakes under way at once (under the listen backlog)")
	fs.DurationVar(&cfg.progress, "progress", 500*time.Millisecond, "how often a progress line goes to stderr")
	fs.IntVar(&cfg.readBuffer, "read-buffer", 4096, "bytes of read buffer per connection while it opens")
	fs.IntVar(&cfg.reactors, "reactors", 1, "epoll loops reading the open connections")
	fs.BoolVar(&cfg.perDevice, "per-device", false, "every device's counts in the result, not only anomalies")
	fs.BoolVar(&cfg.control, "control", false, `devices connect as stdin says: a JSON object a line, {"target": n} `+
		`(the first n devices hold a connection), {"mark": t} (opens from now on count as back); EOF ends the run`)
	fs.StringVar(&cfg.framesOut, "frames-out", "", "every message frame, repeats included: device index and id, "+
		"two int64 little-endian each")
	fs.DurationVar(&cfg.retryBase, "retry-base", 400*time.Millisecond, "pause after a failed attempt: this, "+
		"doubling per failure, jittered by half either way")
	fs.DurationVar(&cfg.retryMax, "retry-max", 5*time.Second, "the longest pause after failed attempts (before jitter)")
	fs.DurationVar(&cfg.reopenMin, "reopen-min", 100*time.Millisecond, "pause after an open connection ends: "+
		"uniform between these two")
	fs.DurationVar(&cfg.reopenMax, "reopen-max", time.Second, "")
	fs.BoolVar(&cfg.randomPorts, "random-ports", false, "each attempt binds a random local port of the ephemeral "+
		"range (another on EADDRINUSE), not the one connect() picks: with most ports of a source address taken, "+
		"connect() hands out the ones just freed, whose connections a SO_REUSEPORT group sent to the server "+
		"that refused them; a refused client then lands on it again and again")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if cfg.protocol != protoOurs && cfg.protocol != protoCentrifugo {
		return cfg, fmt.Errorf("-protocol is ours or centrifugo, got %q", cfg.protocol)
	}
	if cfg.url == "" || cfg.usersFile == "" {
		return cfg, errors.New("-url and -users are required")
	}
	if cfg.secret == "" && cfg.tokensFile == "" {
		return cfg, errors.New("-secret or -tokens is required")
	}
	if cfg.untilComplete && cfg.expectFile == "" {
		return cfg, errors.New("-until-complete needs -expect")
	}
	if cfg.reopenMax < cfg.reopenMin || cfg.retryBase <= 0 || cfg.retryMax < cfg.retryBase {
		return cfg, errors.New("-reopen-min must be at most -reopen-max, -retry-base over 0 and at most -retry-max")
	}
	if (cfg.idsOut == "") != (cfg.latOut == "") {
		return cfg, errors.New("-ids-out and -lat-out go together")
	}
	for _, s := range strings.Split(sources, ",") {
		if s = strings.TrimSpace(s); s != "" {
			ip := net.ParseIP(s)
			if ip == nil {
				return cfg, fmt.Errorf("-sources: %q is no IP address", s)
			}
			cfg.sources = append(cfg.sources, ip)
		}
	}
	cfg.inFlight, cfg.reactors = max(1, cfg.inFlight), max(1, cfg.reactors)
	return cfg, nil
}

func newClient(cfg config) (*client, error) {
	u, err := url.Parse(cfg.url)
	if err != nil || u.Scheme != "ws" || u.Host == "" {
		return nil, fmt.Errorf("-url must be ws://HOST:PORT, got %q", cfg.url)
	}
	cl := &client{cfg: cfg, proto: cfg.protocol, addr: u.Host, path: cfg.path, secret: []byte(cfg.secret),
		gate: make(chan struct{}, cfg.inFlight), keepTally: cfg.idsOut != "", complete: make(chan struct{}),
		conns: map[*conn]struct{}{}, closeCodes: map[string]int{}, ports: ephemeralPorts()}
	if cl.path == "" {
		cl.path = "/v1/ws"
		if cl.proto == protoCentrifugo {
			cl.path = "/connection/websocket"
		}
	}
	users, err := readLines(cfg.usersFile)
	if err != nil {
		return nil, err
	}
	tokens := map[string]string{}
	if cfg.tokensFile != "" {
		if tokens, err = readPairs(cfg.tokensFile); err != nil {
			return nil, err
		}
	}
	owed := map[string]string{}
	if cfg.expectFile != "" {
		if owed, err = readPairs(cfg.expectFile); err != nil {
			return nil, err
		}
	}
	for i, user := range users {
		d := &device{user: user, owed: -1, rng: rand.New(rand.NewPCG(uint64(i), 7))}
		if t, ok := tokens[user]; ok {
			d.token = t
		} else if cfg.secret == "" {
			return nil, fmt.Errorf("no token for user %q", user)
		}
		if len(cfg.sources) > 0 {
			d.source = cfg.sources[i%len(cfg.sources)]
		}
		if cfg.expectFile != "" {
			n, err := strconv.ParseInt(owed[user], 10, 64)
			if owed[user] == "" {
				n, err = 0, nil // owed nothing: not in the file
			}
			if err != nil {
				return nil, fmt.Errorf("-expect: %q for %s", owed[user], user)
			}
			d.owed = n
			if n > 0 {
				cl.incomplete.Add(1)
			}
		}
		cl.devices = append(cl.devices, d)
	}
	return cl, nil
}

// mint makes an HS256 JWT with sub, iat and exp, as chat.auth.mint does; Centrifugo
// reads the same claims (sub is the user).
func mint(secret []byte, user string, now time.Time, ttl time.Duration) string {
	enc := base64.RawURLEncoding
	head := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	claims, _ := json.Marshal(map[string]any{"sub": user, "iat": now.Unix(), "exp": now.Add(ttl).Unix()})
	signed := head + "." + enc.EncodeToString(claims)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(signed))
	return signed + "." + enc.EncodeToString(mac.Sum(nil))
}

func (cl *client) run() map[string]any {
	cl.started = time.Now()
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	if cl.cfg.untilComplete && cl.incomplete.Load() == 0 {
		cl.once.Do(func() { close(cl.complete) })
	}
	stopReactors := make(chan struct{})
	for range cl.cfg.reactors {
		r, err := newReactor()
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadclient:", err)
			os.Exit(1)
		}
		cl.reactors = append(cl.reactors, r)
		go r.run(stopReactors)
	}
	cl.ctx = ctx
	var commands <-chan command
	if cl.cfg.control {
		commands = readCommands(os.Stdin)
	} else {
		cl.grow(len(cl.devices))
	}
	var limit <-chan time.Time
	if cl.cfg.maxSeconds > 0 {
		limit = time.After(time.Duration(cl.cfg.maxSeconds * float64(time.Second)))
	}
	tick := time.NewTicker(cl.cfg.progress)
	reason := ""
	var complete <-chan struct{}
	if cl.cfg.untilComplete {
		complete = cl.complete // else never ready: a closed channel would be, at every turn
	}
	for reason == "" {
		select {
		case <-ctx.Done():
			reason = "signal"
		case <-complete:
			reason = "complete"
		case <-limit:
			reason = "max-seconds"
		case cmd, ok := <-commands:
			if !ok {
				reason = "stdin closed"
				break
			}
			cl.obey(cmd)
		case <-tick.C:
			cl.tidy()
			cl.report()
		}
	}
	tick.Stop()
	cancel()
	cl.mu.Lock()
	cl.stopping = true
	cl.mu.Unlock()
	close(stopReactors)
	for _, r := range cl.reactors {
		<-r.stopped // no reactor reads a connection while it is closed below
	}
	cl.mu.Lock()
	open := make([]*conn, 0, len(cl.conns))
	for c := range cl.conns {
		open = append(open, c)
	}
	cl.mu.Unlock()
	for _, c := range open {
		c.end()
	}
	cl.holds.Wait()
	cl.report()
	return cl.result(reason)
}

func (cl *client) report() {
	user, system := cpuSeconds()
	line, _ := json.Marshal(map[string]any{
		"t": round(float64(time.Now().UnixNano())/1e9, 3), "seconds": round(time.Since(cl.started).Seconds(), 3),
		"cpu_seconds": round(user+system, 4),
		"connected":   cl.connected.Load(),
		"open":        cl.open.Load(), "frames": cl.frames.Load(), "received": cl.received.Load(),
		"duplicated": cl.duplicated.Load(), "incomplete": cl.incomplete.Load(), "reads": cl.reads(),
		"active": cl.activeN.Load(), "failures": cl.failures.Load(), "refused": cl.refused.Load(),
		"ended": cl.closed.Load(), "back": cl.back.Load(),
		"last_back": round(float64(cl.lastBack.Load())/1e9, 3), "mem_kb": memKB()})
	os.Stderr.Write(append(line, '\n'))
}

// connect dials the device until it is open, a failed attempt tried again after a growing
// jittered pause; then the connection is a reactor's, and this goroutine ends (a parked one
// per connection cost its stack, kilobytes each). When the connection ends, ended starts it
// again after a short jittered pause (a closed server's clients do not all come back at
// once), ours resuming from its cursor.
func (cl *client) connect(d *device) {
	for cl.ctx.Err() == nil {
		_, err := cl.dial(cl.ctx, d)
		if err == nil || cl.ctx.Err() != nil {
			return
		}
		d.failures++
		cl.failures.Add(1)
		if errors.As(err, new(ws.StatusError)) {
			cl.refused.Add(1)
		}
		pause(cl.ctx, retryPause(cl.cfg.retryBase, cl.cfg.retryMax, d.attempt, d.rng))
		d.attempt = min(d.attempt+1, 30)
	}
}

// opened counts a connection that just became a reactor's (under cl.mu).
func (cl *client) opened(d *device) {
	d.attempt = 0
	if cl.marked.Load() {
		cl.back.Add(1)
		cl.lastBack.Store(time.Now().UnixNano())
	}
	if !d.seen {
		d.seen = true
		if cl.connected.Add(1) == int64(len(cl.devices)) {
			cl.allAt.Store(int64(time.Since(cl.started)))
		}
	}
	cl.open.Add(1)
}

// ended counts an open connection gone (the server closed it, the reactor found it broken, or
// the run is ending) and, unless the run is ending, dials its device again.
func (cl *client) ended(c *conn) {
	cl.open.Add(-1)
	cl.mu.Lock()
	delete(cl.conns, c)
	stopping := cl.stopping
	if !stopping {
		cl.closeCodes[c.code]++
		cl.holds.Add(1) // before run waits for them: it sets stopping first
	}
	cl.mu.Unlock()
	if stopping {
		return
	}
	cl.closed.Add(1)
	d := c.d
	d.reconnects++
	go func() {
		defer cl.holds.Done()
		lo, hi := cl.cfg.reopenMin.Seconds(), cl.cfg.reopenMax.Seconds()
		pause(cl.ctx, lo+(hi-lo)*d.rng.Float64())
		cl.connect(d)
	}()
}

// retryPause is the pause after the attempt-th failure in a row (from 0): base doubling to
// at most max, jittered by half either way, so that refused clients do not come back together.
func retryPause(base, most time.Duration, attempt int, rng *rand.Rand) float64 {
	return min(most.Seconds(), base.Seconds()*math.Pow(2, float64(min(attempt, 30)))) * (0.5 + rng.Float64())
}

// grow starts devices up to the first n: each holds a connection from then on.
func (cl *client) grow(n int) {
	for i := cl.active; i < min(n, len(cl.devices)); i++ {
		cl.holds.Add(1)
		go func() {
			defer cl.holds.Done()
			cl.connect(cl.devices[i])
		}()
	}
	cl.active = max(cl.active, min(n, len(cl.devices)))
	cl.activeN.Store(int64(cl.active))
}

// tidy gives the opening's garbage back to the system once every device told to connect is
// open (-control only: once per ramp step). The opening allocates kilobytes per connection
// (buffers, a goroutine's stack) that an idle process would otherwise keep, unused, for
// minutes: at 16,000 connections a process, more than its connections' own state.
func (cl *client) tidy() {
	if !cl.cfg.control || cl.active == cl.tidied || cl.open.Load() < int64(cl.active) {
		return
	}
	cl.tidied = cl.active
	debug.FreeOSMemory()
}

// obey acts on one command read from stdin.
func (cl *client) obey(cmd command) {
	if cmd.Target != nil {
		cl.grow(*cmd.Target)
	}
	if cmd.Mark != nil {
		cl.back.Store(0)
		cl.lastBack.Store(0)
		cl.marked.Store(true)
	}
}

func pause(ctx context.Context, seconds float64) {
	t := time.NewTimer(time.Duration(seconds * float64(time.Second)))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// dial opens the device's WebSocket within the gate, through the upgrade and the
// protocol's opening (ours: the hello; Centrifugo: the reply to the connect command).
func (cl *client) dial(ctx context.Context, d *device) (*conn, error) {
	select {
	case cl.gate <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-cl.gate }()
	target, header := cl.path, ""
	if cl.proto == protoOurs {
		// The token in a header, as the daemons require by default: a URL lands in proxies' logs.
		header = "Authorization: Bearer " + cl.token(d) + "\r\n"
		if d.since != "" {
			target += "?since=" + url.QueryEscape(d.since)
		}
	}
	dialer := ws.Dialer{Timeout: openTimeout, Header: ws.HandshakeHeaderString(header), ReadBufferSize: cl.cfg.readBuffer,
		NetDial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if d.source == nil {
				return (&net.Dialer{KeepAlive: noKeepAlive}).DialContext(ctx, network, addr)
			}
			if !cl.cfg.randomPorts {
				nd := net.Dialer{LocalAddr: &net.TCPAddr{IP: d.source}, Control: bindAddressNoPort, KeepAlive: noKeepAlive}
				return nd.DialContext(ctx, network, addr)
			}
			for try := 0; ; try++ {
				nd := net.Dialer{LocalAddr: &net.TCPAddr{IP: d.source, Port: cl.ports.pick(d.rng)}, KeepAlive: noKeepAlive}
				nc, err := nd.DialContext(ctx, network, addr)
				if !errors.Is(err, syscall.EADDRINUSE) || try == portTries {
					return nc, err
				}
			}
		}}
	nc, br, _, err := dialer.Dial(ctx, "ws://"+cl.addr+target)
	if err != nil {
		return nil, err
	}
	if br == nil {
		br = bufio.NewReaderSize(nc, cl.cfg.readBuffer)
	}
	c := &conn{cl: cl, d: d, nc: nc, r: br, fd: -1}
	if !cl.remember(c, ctx) {
		nc.Close()
		return nil, ctx.Err()
	}
	fail := func(err error) (*conn, error) {
		cl.forget(c)
		c.end()
		return nil, err
	}
	if cl.proto == protoCentrifugo {
		// No subs: the server subscribes the user to its personal channel.
		cmd, _ := json.Marshal(map[string]any{"id": 1, "connect": map[string]string{"token": cl.token(d)}})
		if err := c.send(ws.OpText, cmd); err != nil {
			return fail(err)
		}
	}
	nc.SetReadDeadline(time.Now().Add(openTimeout))
	for !c.settled {
		if err := c.readFrame(); err != nil {
			return fail(err)
		}
	}
	nc.SetReadDeadline(time.Time{})
	if !c.ok {
		return fail(errRefused)
	}
	if err := c.handOver(cl.reactors[int(cl.next.Add(1))%len(cl.reactors)]); err != nil {
		return fail(err)
	}
	return c, nil
}

// end closes the connection once, whoever finds it over first.
func (c *conn) end() {
	c.endOnce.Do(func() {
		if c.fd >= 0 {
			syscall.Close(c.fd)
		} else {
			c.nc.Close()
		}
		if c.live {
			c.cl.ended(c)
		}
	})
}

// token is the device's from -tokens, or one minted now.
func (cl *client) token(d *device) string {
	if d.token != "" {
		return d.token
	}
	return mint(cl.secret, d.user, time.Now(), cl.cfg.tokenTTL)
}

// portRange is where -random-ports picks: the kernel's own range for ephemeral ports, so that
// no port a server may listen on is taken.
type portRange struct{ lo, hi int }

// No TCP keep-alive probes: the WebSocket's own pings are the keep-alive, as in a browser. Go's
// default (a probe every 15 s) sent 40,000 probes a second at 600,000 connections; on a saturated
// loopback the kernel dropped packets by the million, and aborted 300,000 connections whose
// probes went unanswered.
const noKeepAlive = -1

const portTries = 32 // ports tried before a dial fails with EADDRINUSE

func (p portRange) pick(rng *rand.Rand) int { return p.lo + rng.IntN(p.hi-p.lo+1) }

// ephemeralPorts reads net.ipv4.ip_local_port_range (Linux's default if it cannot).
func ephemeralPorts() portRange {
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(data)); len(f) == 2 {
			lo, err1 := strconv.Atoi(f[0])
			hi, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil && 0 < lo && lo < hi {
				return portRange{lo, hi}
			}
		}
	}
	return portRange{32768, 60999}
}

// ipBindAddressNoPort is Linux's IP_BIND_ADDRESS_NO_PORT (not in package syscall).
const ipBindAddressNoPort = 24

// bindAddressNoPort leaves the local port to connect(), which picks it for the 4-tuple: a
// bind to an address with port 0 must pick a port no other socket on that address holds,
// a search that grows with every connection (10,000 from one address cost 22 s of CPU).
func bindAddressNoPort(_, _ string, raw syscall.RawConn) error {
	var err error
	if cerr := raw.Control(func(fd uintptr) {
		err = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, ipBindAddressNoPort, 1)
	}); cerr != nil {
		return cerr
	}
	return err
}

// remember registers an open connection, so that the end of the run can close it.
func (cl *client) remember(c *conn, ctx context.Context) bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if ctx.Err() != nil {
		return false
	}
	cl.conns[c] = struct{}{}
	return true
}

func (cl *client) forget(c *conn) {
	cl.mu.Lock()
	delete(cl.conns, c)
	cl.mu.Unlock()
}

var errClosed = errors.New("closed by the server")

// readFrame reads one frame while the connection opens and acts on it; an error ends the connection.
func (c *conn) readFrame() error {
	h, err := ws.ReadHeader(c.r)
	if err != nil {
		if c.code == "" {
			c.code = "none" // gone without a close frame
		}
		return err
	}
	if h.Length > maxPayload {
		c.code = "too-big"
		return errors.New("frame too big")
	}
	if int64(cap(c.payload)) < h.Length {
		c.payload = make([]byte, h.Length)
	}
	p := c.payload[:h.Length]
	if _, err := io.ReadFull(c.r, p); err != nil {
		c.code = "none"
		return err
	}
	return c.frame(h, p, time.Now())
}

// frame acts on one whole frame, however it was read.
func (c *conn) frame(h ws.Header, p []byte, now time.Time) error {
	if h.Masked { // a server's frames are not masked; undo it if one is
		ws.Cipher(p, h.Mask, 0)
	}
	switch {
	case h.OpCode == ws.OpPing:
		return c.send(ws.OpPong, p)
	case h.OpCode == ws.OpClose:
		c.code = "1005"
		if len(p) >= 2 {
			c.code = strconv.Itoa(int(binary.BigEndian.Uint16(p)))
			c.send(ws.OpClose, p[:2])
		}
		return errClosed
	case h.OpCode.IsControl():
		return nil // a pong
	case h.OpCode == ws.OpContinuation:
		c.message = append(c.message, p...)
		if h.Fin {
			if c.fragOp == ws.OpText {
				c.text(c.message, now)
			}
			c.message = c.message[:0]
		}
		return nil
	case !h.Fin:
		c.fragOp, c.message = h.OpCode, append(c.message[:0], p...)
		return nil
	case h.OpCode == ws.OpText:
		c.text(p, now)
	}
	return nil
}

// text reads one text message: the only code that differs between the protocols after the opening.
func (c *conn) text(p []byte, now time.Time) {
	if c.cl.proto == protoOurs {
		c.oursText(p, now)
	} else {
		c.centrifugoText(p, now)
	}
}

// oursText: a hello ({"type":"hello","recovered":..,"cursor":..}) or a message frame whose
// body starts with the feed's wall-clock time; frames without an id (errors, signals) are not
// positions in the stream.
func (c *conn) oursText(p []byte, now time.Time) {
	id := field(p, "id")
	if id == nil {
		if string(unquote(field(p, "type"))) == "hello" {
			// Keep our own resume point unless the server could not serve it.
			if c.d.since == "" || string(field(p, "recovered")) != "true" {
				c.d.since = string(unquote(field(p, "cursor")))
			}
			c.settle(true)
		}
		return
	}
	n, ok := asInt(id)
	if !ok {
		return
	}
	if cursor := field(p, "cursor"); cursor != nil {
		c.d.since = string(unquote(cursor))
	} else {
		c.d.since = string(unquote(id)) // our ids are JSON strings: the cursor is what is inside
	}
	sent, has := leadingFloat(unquote(field(p, "body")))
	c.record(n, sent, has, now)
}

// centrifugoText: a frame holds one reply per line; a publication's data carries id and t,
// an empty object is a ping, the reply with id 1 answers the connect command.
func (c *conn) centrifugoText(p []byte, now time.Time) {
	for len(p) > 0 {
		line := p
		if k := indexByte(p, '\n'); k >= 0 {
			line, p = p[:k], p[k+1:]
		} else {
			p = nil
		}
		if len(line) == 0 {
			continue
		}
		if string(line) == centrifugoPing {
			c.send(ws.OpText, []byte(centrifugoPing))
			continue
		}
		if data := path(line, "push", "pub", "data"); data != nil {
			if n, ok := asInt(field(data, "id")); ok {
				sent, has := asFloat(field(data, "t"))
				c.record(n, sent, has, now)
			}
			continue
		}
		if string(field(line, "id")) == "1" {
			c.settle(field(line, "connect") != nil && field(line, "error") == nil)
		}
	}
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

func (c *conn) settle(ok bool) {
	if !c.settled {
		c.settled, c.ok = true, ok
	}
}

// record counts one message frame of the device: a first arrival, or a duplicate.
func (c *conn) record(id int64, sent float64, hasSent bool, now time.Time) {
	cl, d := c.cl, c.d
	cl.frames.Add(1)
	if cl.cfg.framesOut != "" {
		d.frames = append(d.frames, id)
	}
	if id <= d.last {
		d.duplicated++
		cl.duplicated.Add(1)
		return
	}
	d.last = id
	d.received++
	cl.received.Add(1)
	lat := math.NaN()
	if hasSent {
		lat = (float64(now.UnixNano())/1e9 - sent) * 1000
		cl.hist.add(lat)
	}
	if cl.keepTally {
		d.ids = append(d.ids, id)
		d.lat = append(d.lat, float32(lat))
	}
	if d.received == d.owed && cl.incomplete.Add(-1) == 0 {
		cl.once.Do(func() { close(cl.complete) })
	}
}

// send writes one masked client frame. The mask key is zero (valid, RFC 6455 section 5.3):
// the payload goes as it is, without a pass over it.
func (c *conn) send(op ws.OpCode, payload []byte) error {
	h := ws.Header{Fin: true, OpCode: op, Masked: true, Length: int64(len(payload))}
	buf := bytesWriter{c.out[:0]}
	if err := ws.WriteHeader(&buf, h); err != nil {
		return err
	}
	c.out = append(buf.b, payload...)
	if c.fd >= 0 {
		return writeAll(c.fd, c.out)
	}
	_, err := c.nc.Write(c.out)
	return err
}

type bytesWriter struct{ b []byte }

func (w *bytesWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

// histogram of latencies in µs: exact below 32, then 16 buckets per power of two (within 6 %).
type histogram struct {
	counts [64 * 16]atomic.Int64
	max    atomic.Int64
	count  atomic.Int64
}

func bucketOf(us uint64) int {
	if us < 32 {
		return int(us)
	}
	s := bits.Len64(us) - 5 // us>>s is in [16, 32)
	return 32 + (s-1)*16 + int(us>>s) - 16
}

// upperOf is the largest value in bucket i.
func upperOf(i int) uint64 {
	if i < 32 {
		return uint64(i)
	}
	k := i - 32
	s, m := k/16+1, uint64(k%16+16)
	return (m+1)<<s - 1
}

func (h *histogram) add(ms float64) {
	us := uint64(0)
	if ms > 0 {
		us = uint64(ms * 1000)
	}
	i := min(bucketOf(us), len(h.counts)-1)
	h.counts[i].Add(1)
	h.count.Add(1)
	for {
		old := h.max.Load()
		if int64(us) <= old || h.max.CompareAndSwap(old, int64(us)) {
			break
		}
	}
}

// quantile is the upper bound (ms) of the bucket holding the q-quantile (nearest rank).
func (h *histogram) quantile(q float64) any {
	n := h.count.Load()
	if n == 0 {
		return nil
	}
	rank := min(n-1, int64(q*float64(n)))
	var seen int64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen > rank {
			return round(float64(upperOf(i))/1000, 3)
		}
	}
	return round(float64(h.max.Load())/1000, 3)
}

func (h *histogram) summary() map[string]any {
	var buckets [][2]float64
	for i := range h.counts {
		if n := h.counts[i].Load(); n > 0 {
			buckets = append(buckets, [2]float64{round(float64(upperOf(i))/1000, 3), float64(n)})
		}
	}
	return map[string]any{"count": h.count.Load(), "p50": h.quantile(0.5), "p90": h.quantile(0.9),
		"p99": h.quantile(0.99), "p999": h.quantile(0.999), "max": round(float64(h.max.Load())/1000, 3),
		"buckets_le_ms": buckets}
}

// reads is how many reads the reactors made of open connections (the opening ones' not counted).
func (cl *client) reads() (n int64) {
	for _, r := range cl.reactors {
		n += r.reads.Load()
	}
	return n
}

func (cl *client) wakes() (n int64) {
	for _, r := range cl.reactors {
		n += r.wakes.Load()
	}
	return n
}

// memKB is where the Go runtime's memory is (KB), read without stopping the world: what a
// connection costs the client, as against what its garbage and free pages do.
func memKB() map[string]uint64 {
	names := map[string]string{"objects": "/memory/classes/heap/objects:bytes",
		"heap_free": "/memory/classes/heap/free:bytes", "heap_unused": "/memory/classes/heap/unused:bytes",
		"released": "/memory/classes/heap/released:bytes", "stacks": "/memory/classes/heap/stacks:bytes",
		"total": "/memory/classes/total:bytes"}
	samples := make([]metrics.Sample, 0, len(names))
	for _, n := range names {
		samples = append(samples, metrics.Sample{Name: n})
	}
	metrics.Read(samples)
	out := make(map[string]uint64, len(names))
	for k, n := range names {
		for _, smp := range samples {
			if smp.Name == n && smp.Value.Kind() == metrics.KindUint64 {
				out[k] = smp.Value.Uint64() >> 10
			}
		}
	}
	return out
}

// cpuSeconds is this process's user and system CPU time so far, every thread's.
func cpuSeconds() (float64, float64) {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Sec) + float64(ru.Utime.Usec)/1e6, float64(ru.Stime.Sec) + float64(ru.Stime.Usec)/1e6
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

func (cl *client) result(reason string) map[string]any {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	user, system := cpuSeconds()
	frames := cl.frames.Load()
	var lost, unexpected, reconnects, failures, lossy, dupes int64
	known := cl.cfg.expectFile != ""
	var listed []map[string]any
	for _, d := range cl.devices {
		reconnects += int64(d.reconnects)
		failures += int64(d.failures)
		dl := int64(0)
		if known {
			dl = max(0, d.owed-d.received)
			lost += dl
			unexpected += max(0, d.received-d.owed)
		}
		if dl > 0 {
			lossy++
		}
		if d.duplicated > 0 {
			dupes++
		}
		if cl.cfg.perDevice || ((dl > 0 || d.duplicated > 0) && len(listed) < anomaliesListed) {
			one := map[string]any{"user": d.user, "received": d.received, "duplicated": d.duplicated,
				"reconnects": d.reconnects, "connect_failures": d.failures}
			if known {
				one["owed"], one["lost"] = d.owed, dl
			}
			listed = append(listed, one)
		}
	}
	cpuPerFrame := any(nil)
	if frames > 0 {
		cpuPerFrame = round((user+system)/float64(frames)*1e6, 2)
	}
	out := map[string]any{
		"client": "go", "protocol": cl.proto, "ended_by": reason, "connections": len(cl.devices),
		"connected": cl.connected.Load(), "open_at_end": cl.open.Load(),
		"frames": frames, "received": cl.received.Load(), "duplicated": cl.duplicated.Load(),
		"lost": nil, "unexpected": nil, "complete": nil,
		"devices_with_loss": lossy, "devices_with_duplicates": dupes,
		"reconnects": reconnects, "connect_failures": failures, "close_codes": cl.closeCodes,
		"cpu_seconds":      map[string]float64{"user": round(user, 3), "system": round(system, 3)},
		"cpu_us_per_frame": cpuPerFrame, "max_rss_kb": ru.Maxrss, "reads": cl.reads(), "wakes": cl.wakes(),
		"wall_seconds": round(time.Since(cl.started).Seconds(), 3), "latency_ms": cl.hist.summary(),
		"devices": listed,
	}
	if at := cl.allAt.Load(); at > 0 {
		out["all_connected_seconds"] = round(time.Duration(at).Seconds(), 3)
	}
	if known {
		out["lost"], out["unexpected"], out["complete"] = lost, unexpected, lost == 0
	}
	return out
}

// writeTally writes every first arrival's id and latency, device after device, in the
// layout Python's array("q") and array("f") read (loadtest.clients.peers.read_tally).
func writeTally(cl *client, cfg config) error {
	if cfg.framesOut != "" {
		var out []byte
		for i, d := range cl.devices {
			for _, id := range d.frames {
				out = binary.LittleEndian.AppendUint64(out, uint64(i))
				out = binary.LittleEndian.AppendUint64(out, uint64(id))
			}
		}
		if err := os.WriteFile(cfg.framesOut, out, 0o644); err != nil {
			return err
		}
	}
	if cfg.idsOut == "" {
		return nil
	}
	var ids, lat []byte
	for _, d := range cl.devices {
		for i, id := range d.ids {
			ids = binary.LittleEndian.AppendUint64(ids, uint64(id))
			lat = binary.LittleEndian.AppendUint32(lat, math.Float32bits(d.lat[i]))
		}
	}
	if err := os.WriteFile(cfg.idsOut, ids, 0o644); err != nil {
		return err
	}
	return os.WriteFile(cfg.latOut, lat, 0o644)
}

func readLines(name string) ([]string, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	return out, nil
}

// readPairs reads 'key value' lines.
func readPairs(name string) (map[string]string, error) {
	lines, err := readLines(name)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(lines))
	for _, line := range lines {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			return nil, fmt.Errorf("%s: %q is not 'key value'", name, line)
		}
		out[k] = strings.TrimSpace(v)
	}
	return out, nil
}
