package main

import (
	"math"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"
)

// discard is a connection whose writes go nowhere (the close frame's answer).
type discard struct{ net.Conn }

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func TestFieldSkipsNestedValuesAndStrings(t *testing.T) {
	doc := []byte(`{"body":"say \"id\":9 {", "meta": {"id": 8, "x": [1, {"id": 7}]}, "id": 42, "cursor":"1.0.42"}`)
	if got := string(field(doc, "id")); got != "42" {
		t.Fatalf("id = %q", got)
	}
	if got := string(unquote(field(doc, "cursor"))); got != "1.0.42" {
		t.Fatalf("cursor = %q", got)
	}
	if field(doc, "absent") != nil {
		t.Fatal("an absent key was found")
	}
	if field([]byte(`{"id":`), "id") != nil {
		t.Fatal("a cut frame gave a value")
	}
}

func TestCentrifugoPublicationData(t *testing.T) {
	line := []byte(`{"push":{"channel":"#p3","pub":{"data":{"id":17,"t":1700000000.25,"body":"x"}}}}`)
	data := path(line, "push", "pub", "data")
	if n, ok := asInt(field(data, "id")); !ok || n != 17 {
		t.Fatalf("id = %d %v", n, ok)
	}
	if f, ok := asFloat(field(data, "t")); !ok || f != 1700000000.25 {
		t.Fatalf("t = %v %v", f, ok)
	}
}

func TestLeadingFloatOfOurBody(t *testing.T) {
	if f, ok := leadingFloat([]byte("1700000000.123456 feed")); !ok || math.Abs(f-1700000000.123456) > 1e-6 {
		t.Fatalf("%v %v", f, ok)
	}
	if _, ok := leadingFloat([]byte("hello there")); ok {
		t.Fatal("a body without a time gave one")
	}
}

func TestBucketsCoverEveryValueWithinTheirBounds(t *testing.T) {
	prev := -1
	for us := uint64(0); us < 1<<20; us++ {
		b := bucketOf(us)
		if b < prev || b > prev+1 || us > upperOf(b) || (b > 0 && us <= upperOf(b-1)) {
			t.Fatalf("%d µs in bucket %d (upper %d)", us, b, upperOf(b))
		}
		prev = b
	}
}

func TestRecordCountsDuplicatesAndCompletion(t *testing.T) {
	cl := &client{keepTally: true, complete: make(chan struct{})}
	d := &device{owed: 2}
	cl.incomplete.Store(1)
	c := &conn{cl: cl, d: d}
	now := time.Now()
	c.record(5, 0, false, now)
	c.record(5, 0, false, now)
	c.record(3, 0, false, now)
	c.record(9, float64(now.UnixNano())/1e9-0.010, true, now)
	if d.received != 2 || d.duplicated != 2 || len(d.ids) != 2 || !math.IsNaN(float64(d.lat[0])) {
		t.Fatalf("received %d duplicated %d ids %v lat %v", d.received, d.duplicated, d.ids, d.lat)
	}
	select {
	case <-cl.complete:
	default:
		t.Fatal("a device with all it was owed did not complete the run")
	}
	if q := cl.hist.quantile(0.5).(float64); q < 9.9 || q > 10.7 {
		t.Fatalf("p50 %v ms", q)
	}
}

// serverFrame is an unmasked frame as a server sends it.
func serverFrame(op byte, fin bool, payload string) []byte {
	first := op
	if fin {
		first |= 0x80
	}
	out := []byte{first}
	switch n := len(payload); {
	case n < 126:
		out = append(out, byte(n))
	case n < 1<<16:
		out = append(out, 126, byte(n>>8), byte(n))
	default:
		out = append(out, 127, 0, 0, 0, 0, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return append(out, payload...)
}

func TestConsumeReadsFramesCutAnywhereAndFragmented(t *testing.T) {
	cl := &client{proto: protoOurs, keepTally: true, complete: make(chan struct{})}
	d := &device{owed: -1}
	c := &conn{cl: cl, d: d, fd: -1}
	long := `{"id":3,"body":"` + strings.Repeat("x", 70000) + `"}`
	var stream []byte
	stream = append(stream, serverFrame(0x1, true, `{"id":1,"body":"1.5 a"}`)...)
	stream = append(stream, serverFrame(0x1, false, `{"id":2,`)...)
	stream = append(stream, serverFrame(0x0, true, `"body":"2.5 b"}`)...)
	stream = append(stream, serverFrame(0x1, true, long)...)
	stream = append(stream, serverFrame(0x1, true, `{"id":3,"body":"x"}`)...) // a repeat
	for _, cut := range []int{1, 2, 3, 7, 100, len(stream)} {
		*d = device{owed: -1}
		c.pending = nil
		for at := 0; at < len(stream); at += cut {
			if err := c.consume(stream[at:min(at+cut, len(stream))], time.Now()); err != nil {
				t.Fatal(err)
			}
		}
		if d.received != 3 || d.duplicated != 1 || len(c.pending) != 0 || d.since != "3" {
			t.Fatalf("cut %d: received %d duplicated %d pending %d since %q", cut, d.received, d.duplicated,
				len(c.pending), d.since)
		}
	}
}

func TestAServersCloseFrameEndsTheConnectionWithItsCode(t *testing.T) {
	c := &conn{cl: &client{proto: protoOurs}, d: &device{owed: -1}, fd: -1, nc: discard{}}
	if err := c.consume(serverFrame(0x8, true, "\x03\xe9bye"), time.Now()); err != errClosed || c.code != "1001" {
		t.Fatalf("err %v code %q", err, c.code)
	}
}

func TestOurQuotedIdBecomesTheResumeCursorWithoutItsQuotes(t *testing.T) {
	cl := &client{proto: protoOurs, complete: make(chan struct{})}
	d := &device{owed: -1, since: "12"}
	c := &conn{cl: cl, d: d, fd: -1}
	if err := c.consume(serverFrame(0x1, true, `{"id":"224","from":"a","body":"1.5 x"}`), time.Now()); err != nil {
		t.Fatal(err)
	}
	if d.since != "224" || d.last != 224 {
		t.Fatalf("since %q last %d", d.since, d.last)
	}
}

func TestAResumedHelloKeepsTheCursorAndAnUnrecoveredOneTakesTheServers(t *testing.T) {
	d := &device{owed: -1, since: "224"}
	c := &conn{cl: &client{proto: protoOurs}, d: d, fd: -1}
	c.oursText([]byte(`{"type":"hello","recovered":true,"cursor":"505","user":"u"}`), time.Now())
	if d.since != "224" || !c.ok {
		t.Fatalf("recovered: since %q", d.since)
	}
	c = &conn{cl: c.cl, d: d, fd: -1}
	c.oursText([]byte(`{"type":"hello","recovered":false,"cursor":"505","user":"u"}`), time.Now())
	if d.since != "505" {
		t.Fatalf("not recovered: since %q", d.since)
	}
}

func TestFramesOutKeepsRepeatsPerDevice(t *testing.T) {
	cl := &client{proto: protoOurs, complete: make(chan struct{}), cfg: config{framesOut: "x"}}
	d := &device{owed: -1}
	c := &conn{cl: cl, d: d, fd: -1}
	for _, id := range []int64{4, 4, 7} {
		c.record(id, 0, false, time.Now())
	}
	if len(d.frames) != 3 || d.frames[1] != 4 || d.duplicated != 1 {
		t.Fatalf("frames %v duplicated %d", d.frames, d.duplicated)
	}
}

func TestCommandsAndPauses(t *testing.T) {
	cmd, err := parseCommand([]byte(`{"target": 16000}`))
	if err != nil || cmd.Target == nil || *cmd.Target != 16000 || cmd.Mark != nil {
		t.Fatalf("%+v %v", cmd, err)
	}
	if cmd, err = parseCommand([]byte(`{"mark": 1700000000.5}`)); err != nil || cmd.Mark == nil || cmd.Target != nil {
		t.Fatalf("%+v %v", cmd, err)
	}
	if _, err = parseCommand([]byte(`target=3`)); err == nil {
		t.Fatal("a line that is no JSON object was taken")
	}
	got := 0
	for cmd := range readCommands(strings.NewReader("{\"target\": 2}\n\nnot json\n{\"mark\": 1}\n")) {
		got++
		_ = cmd
	}
	if got != 2 {
		t.Fatalf("%d commands", got)
	}
	rng := rand.New(rand.NewPCG(1, 7))
	for range 100 {
		if p := retryPause(100*time.Millisecond, 2*time.Second, 0, rng); p < 0.05 || p > 0.15 {
			t.Fatalf("first pause %v", p)
		}
		if p := retryPause(100*time.Millisecond, 2*time.Second, 9, rng); p < 1.0 || p > 3.0 {
			t.Fatalf("ninth pause %v", p)
		}
	}
}

func TestRandomPortsStayInTheEphemeralRange(t *testing.T) {
	p := ephemeralPorts()
	if p.lo <= 0 || p.hi <= p.lo || p.hi > 65535 {
		t.Fatalf("range %+v", p)
	}
	rng := rand.New(rand.NewPCG(3, 7))
	seen := map[int]bool{}
	for range 1000 {
		port := p.pick(rng)
		if port < p.lo || port > p.hi {
			t.Fatalf("port %d outside %+v", port, p)
		}
		seen[port] = true
	}
	if len(seen) < 900 { // spread, not the same few ports again
		t.Fatalf("%d distinct ports of 1000", len(seen))
	}
}
