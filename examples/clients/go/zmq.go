package main

// The few libzmq calls a client needs, through cgo. Debian 12 packages no Go
// ZeroMQ binding, so this talks to libzmq (libzmq3-dev) directly; with
// github.com/pebbe/zmq4 instead, main.go stays the same but for these calls.

/*
#cgo pkg-config: libzmq
#include <errno.h>
#include <stdlib.h>
#include <zmq.h>

// cgo cannot take the address of a Go int for a void* option, nor call a macro:
// these small wrappers do it on the C side.
static int set_int(void *s, int option, int value) { return zmq_setsockopt(s, option, &value, sizeof value); }
static int more(void *s) { int m = 0; size_t n = sizeof m; zmq_getsockopt(s, ZMQ_RCVMORE, &m, &n); return m; }
static int readable(void *s, long timeout_ms) {
	zmq_pollitem_t item = {s, 0, ZMQ_POLLIN, 0};
	return zmq_poll(&item, 1, timeout_ms);
}
*/
import "C"

import (
	"errors"
	"syscall"
	"time"
	"unsafe"
)

// ErrTimeout: no message within the socket's receive timeout.
var ErrTimeout = errors.New("timed out")

// Socket is one ZeroMQ socket of its own context.
type Socket struct {
	ctx, sock unsafe.Pointer
}

// errorOf turns the errno a cgo call returned into an error. It is taken from
// the call itself (`r, err := C.f()`): a later C.zmq_errno() may run on another
// OS thread, whose errno is not the failed call's.
func errorOf(err error) error {
	if err == syscall.EAGAIN {
		return ErrTimeout
	}
	if errno, ok := err.(syscall.Errno); ok {
		return errors.New(C.GoString(C.zmq_strerror(C.int(errno))))
	}
	return err
}

// interrupted: the call was cut short by a signal and is to be made again. The
// Go runtime signals its own threads (SIGURG preempts goroutines), so a
// blocking libzmq call sees EINTR now and then in any long-running client.
func interrupted(err error) bool {
	return err == syscall.EINTR
}

// NewDealer opens a DEALER socket with a receive timeout, and LINGER 0 so an
// unsent request does not hold the process at exit.
func NewDealer(timeoutMs int) (*Socket, error) {
	ctx := C.zmq_ctx_new()
	sock, err := C.zmq_socket(ctx, C.ZMQ_DEALER)
	if sock == nil {
		return nil, errorOf(err)
	}
	C.set_int(sock, C.ZMQ_LINGER, 0)
	C.set_int(sock, C.ZMQ_RCVTIMEO, C.int(timeoutMs))
	return &Socket{ctx, sock}, nil
}

// Connect connects to an endpoint such as ipc:///run/infermux/infer.sock.
func (s *Socket) Connect(endpoint string) error {
	c := C.CString(endpoint)
	defer C.free(unsafe.Pointer(c))
	if r, err := C.zmq_connect(s.sock, c); r != 0 {
		return errorOf(err)
	}
	return nil
}

// Send sends the frames as one multipart message (libzmq copies each frame).
func (s *Socket) Send(frames [][]byte) error {
	for i, f := range frames {
		flags := C.int(0)
		if i < len(frames)-1 {
			flags = C.ZMQ_SNDMORE
		}
		var p unsafe.Pointer
		if len(f) > 0 {
			p = unsafe.Pointer(&f[0])
		}
		for {
			r, err := C.zmq_send(s.sock, p, C.size_t(len(f)), flags)
			if r >= 0 {
				break
			}
			if !interrupted(err) { // interrupted: this part was not queued; send it again
				return errorOf(err)
			}
		}
	}
	return nil
}

// Receive returns the frames of the next message, or ErrTimeout.
func (s *Socket) Receive() ([][]byte, error) {
	var frames [][]byte
	for {
		var msg C.zmq_msg_t
		C.zmq_msg_init(&msg)
		if r, err := C.zmq_msg_recv(&msg, s.sock, 0); r < 0 {
			C.zmq_msg_close(&msg)
			if interrupted(err) { // nothing was taken: wait for the part again
				continue
			}
			return nil, errorOf(err)
		}
		frames = append(frames, C.GoBytes(C.zmq_msg_data(&msg), C.int(C.zmq_msg_size(&msg))))
		C.zmq_msg_close(&msg)
		if C.more(s.sock) == 0 {
			return frames, nil
		}
	}
}

// Poll waits up to timeoutMs for a message to receive; whether one is there.
func (s *Socket) Poll(timeoutMs int) (bool, error) {
	deadline := time.Now().Add(time.Duration(timeoutMs) * time.Millisecond)
	for {
		n, err := C.readable(s.sock, C.long(timeoutMs))
		if n >= 0 {
			return n > 0, nil
		}
		if !interrupted(err) {
			return false, errorOf(err)
		}
		if timeoutMs >= 0 { // wait only what is left of the timeout
			timeoutMs = int(time.Until(deadline) / time.Millisecond)
			if timeoutMs < 0 {
				timeoutMs = 0
			}
		}
	}
}

// Close closes the socket and its context.
func (s *Socket) Close() {
	C.zmq_close(s.sock)
	C.zmq_ctx_term(s.ctx)
}
