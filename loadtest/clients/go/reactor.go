package main

// Open connections are read by an epoll loop of the client's own, not by a goroutine each.
// A goroutine per connection costs a wake-up through Go's scheduler per frame, and a second
// read that finds nothing (Go's poller is edge-triggered): at 10,000 connections and a frame
// per connection now and then, that doubled the client's CPU per frame. Here one epoll_wait
// hands over every connection that has bytes, and each gets one read: what is left is the
// kernel's work for the frame.

import (
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gobwas/ws"
)

const readChunk = 64 << 10

type reactor struct {
	epfd    int
	mu      sync.Mutex
	conns   map[int32]*conn
	buf     []byte
	stopped chan struct{}
	wakes   atomic.Int64 // epoll_waits that returned sockets: the fewer per frame, the more each one carried
	reads   atomic.Int64
}

func newReactor() (*reactor, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	return &reactor{epfd: epfd, conns: map[int32]*conn{}, buf: make([]byte, readChunk),
		stopped: make(chan struct{})}, nil
}

// run reads until stop is closed; it looks at stop at least every 100 ms.
func (r *reactor) run(stop <-chan struct{}) {
	defer close(r.stopped)
	events := make([]syscall.EpollEvent, 512)
	for {
		select {
		case <-stop:
			return
		default:
		}
		n, err := syscall.EpollWait(r.epfd, events, 100)
		if err != nil && !errors.Is(err, syscall.EINTR) {
			return
		}
		if n > 0 {
			r.wakes.Add(1)
		}
		for i := 0; i < n; i++ {
			r.mu.Lock()
			c := r.conns[events[i].Fd]
			r.mu.Unlock()
			if c != nil {
				r.readable(c)
			}
		}
	}
}

func (r *reactor) readable(c *conn) {
	r.reads.Add(1)
	n, err := syscall.Read(c.fd, r.buf)
	if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
		return // a stale event: the descriptor was reused, or another read took the bytes
	}
	if n <= 0 {
		if c.code == "" {
			c.code = "none" // gone without a close frame
		}
		r.drop(c)
		return
	}
	if c.consume(r.buf[:n], time.Now()) != nil {
		r.drop(c)
	}
}

func (r *reactor) add(c *conn) error {
	r.mu.Lock()
	r.conns[int32(c.fd)] = c
	r.mu.Unlock()
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(c.fd)}
	if err := syscall.EpollCtl(r.epfd, syscall.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
		r.mu.Lock()
		delete(r.conns, int32(c.fd))
		r.mu.Unlock()
		return err
	}
	return nil
}

func (r *reactor) drop(c *conn) {
	r.mu.Lock()
	if r.conns[int32(c.fd)] == c {
		delete(r.conns, int32(c.fd))
	}
	r.mu.Unlock()
	c.end() // closing the descriptor takes it out of the epoll set
}

// handOver moves an open connection from Go's poller to reactor r: its descriptor duplicated
// (Go's poller forgets the original when it is closed) and made non-blocking; what the
// opening read beyond its last frame is kept and read first.
func (c *conn) handOver(r *reactor) error {
	if n := c.r.Buffered(); n > 0 {
		rest, _ := c.r.Peek(n)
		if c.consume(rest, time.Now()) != nil {
			return errClosed
		}
	}
	sc, ok := c.nc.(syscall.Conn)
	if !ok {
		return errors.New("not a socket")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	fd := -1
	var dupErr error
	if err := raw.Control(func(orig uintptr) { fd, dupErr = syscall.Dup(int(orig)) }); err != nil {
		return err
	}
	if dupErr != nil {
		return dupErr
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return err
	}
	syscall.CloseOnExec(fd)
	c.cl.mu.Lock()
	defer c.cl.mu.Unlock()
	if c.cl.stopping {
		syscall.Close(fd)
		return errClosed
	}
	c.nc.Close()
	// What only the opening used goes: a million connections each keeping them held 4 KB apiece.
	c.fd, c.r, c.nc, c.payload = fd, nil, nil, nil
	// Live before the reactor can see it: an end it finds from then on dials the device again.
	c.live = true
	if err := r.add(c); err != nil {
		c.live = false
		return err
	}
	c.cl.opened(c.d)
	return nil
}

// consume reads the whole frames in data, after what an earlier read left unfinished.
func (c *conn) consume(data []byte, now time.Time) error {
	buf := data
	if len(c.pending) > 0 {
		c.pending = append(c.pending, data...)
		buf = c.pending
	}
	pos := 0
	for {
		h, head, ok := parseHeader(buf[pos:])
		if !ok {
			break
		}
		if h.Length > maxPayload {
			c.code = "too-big"
			return errors.New("frame too big")
		}
		if int64(len(buf)-pos-head) < h.Length {
			break
		}
		p := buf[pos+head : pos+head+int(h.Length)]
		pos += head + int(h.Length)
		if err := c.frame(h, p, now); err != nil {
			return err
		}
	}
	// copy, not keep: data is the reactor's buffer (append moves overlapping bytes safely)
	c.pending = append(c.pending[:0], buf[pos:]...)
	return nil
}

// parseHeader reads a frame's head from b: the header, its length, and whether b held it whole.
func parseHeader(b []byte) (ws.Header, int, bool) {
	var h ws.Header
	if len(b) < 2 {
		return h, 0, false
	}
	h.Fin, h.Rsv, h.OpCode = b[0]&0x80 != 0, (b[0]>>4)&0x07, ws.OpCode(b[0]&0x0f)
	h.Masked = b[1]&0x80 != 0
	n, length := 2, int64(b[1]&0x7f)
	switch length {
	case 126:
		if len(b) < 4 {
			return h, 0, false
		}
		length, n = int64(binary.BigEndian.Uint16(b[2:4])), 4
	case 127:
		if len(b) < 10 {
			return h, 0, false
		}
		length, n = int64(binary.BigEndian.Uint64(b[2:10])&(1<<63-1)), 10
	}
	if h.Masked {
		if len(b) < n+4 {
			return h, 0, false
		}
		copy(h.Mask[:], b[n:n+4])
		n += 4
	}
	h.Length = length
	return h, n, true
}

// writeAll writes a small client frame on a non-blocking socket; a full send buffer (a pong
// or an answer to a ping that cannot go) ends the connection rather than wait.
func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := syscall.Write(fd, b)
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			return err
		}
		b = b[n:]
	}
	return nil
}
