// A complete infermux client in Go, written from docs/protocol.md: one DEALER
// socket, both sample models asked at once, replies matched by `id`.
//
//	go build -o infermux-client . && ./infermux-client [ENDPOINT]
//	./infermux-client frames [ENDPOINT] [PIPELINE]    # two cameras' frames to a pipeline (frames.go)
//
// ENDPOINT defaults to the packaged daemon's ipc:///run/infermux/infer.sock.
package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
)

const timeoutMs = 5000

// Sample is one request to one of the sample engines (engines/make_samples.py).
type Sample struct {
	ID    int
	Model string
	Input string
	Shape []int
}

// Tensor is an entry of a header's `inputs` or `outputs`; Region is set for
// an output written into the client's shared memory (it then has no frame).
type Tensor struct {
	Name   string  `json:"name"`
	Dtype  string  `json:"dtype"`
	Shape  []int   `json:"shape"`
	Region *string `json:"region,omitempty"`
}

// Request is the header frame of a request.
type Request struct {
	Model     string   `json:"model"`
	ID        int      `json:"id"`
	TimeoutMs int      `json:"timeout_ms,omitempty"`
	Inputs    []Tensor `json:"inputs"`
}

// Reply is the header frame of a reply; ID is a pointer since it is null when
// the request's header could not be read.
type Reply struct {
	ID           *int     `json:"id"`
	Status       int      `json:"status"`
	Error        string   `json:"error"`
	RetryAfterMs int      `json:"retry_after_ms"`
	Model        string   `json:"model"`
	Version      string   `json:"version"`
	Outputs      []Tensor `json:"outputs"`
	Fallback     *struct {
		From   string `json:"from"`
		Reason string `json:"reason"`
	} `json:"fallback"`
	TimingUs struct {
		Total int64 `json:"total"`
	} `json:"timing_us"`
}

// sample is x[i] = (i % 17) / 16 as little-endian float32: the same in every example client.
func sample(shape []int) []byte {
	count := 1
	for _, d := range shape {
		count *= d
	}
	buf := make([]byte, 4*count)
	for i := 0; i < count; i++ {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(float32(i%17)/16))
	}
	return buf
}

// describe pairs frame i with the i-th output entry that has no region.
func describe(reply *Reply, frames [][]byte) string {
	var parts []string
	i := 0
	for _, meta := range reply.Outputs {
		if meta.Region != nil || i >= len(frames) {
			continue
		}
		frame := frames[i]
		i++
		dims := make([]string, len(meta.Shape))
		for k, d := range meta.Shape {
			dims[k] = fmt.Sprint(d)
		}
		text := fmt.Sprintf("%s %s[%s]", meta.Name, meta.Dtype, strings.Join(dims, ","))
		if meta.Dtype == "float32" && len(frame) >= 4 {
			top, best := 0, float32(math.Inf(-1))
			for k := 0; k < len(frame)/4; k++ {
				if v := math.Float32frombits(binary.LittleEndian.Uint32(frame[4*k:])); v > best {
					top, best = k, v
				}
			}
			text += fmt.Sprintf(", top class %d (%.6g)", top, best)
		}
		parts = append(parts, text)
	}
	return strings.Join(parts, "; ")
}

func run(endpoint string) error {
	samples := []Sample{{1, "classifier", "images", []int{1, 3, 64, 64}}, {2, "mlp", "features", []int{1, 256}}}
	sock, err := NewDealer(timeoutMs)
	if err != nil {
		return err
	}
	defer sock.Close()
	if err := sock.Connect(endpoint); err != nil {
		return err
	}
	pending := map[int]Sample{}
	for _, s := range samples { // both in flight at once
		header, _ := json.Marshal(Request{s.Model, s.ID, 5000, []Tensor{{s.Input, "float32", s.Shape, nil}}})
		// The empty first frame is the delimiter a REQ socket would add itself.
		if err := sock.Send([][]byte{{}, header, sample(s.Shape)}); err != nil {
			return err
		}
		pending[s.ID] = s
	}
	failed := false
	for len(pending) > 0 { // replies come in the order they finish
		frames, err := sock.Receive()
		if err == ErrTimeout {
			return fmt.Errorf("no reply from %s within %d ms: is infermux running there?", endpoint, timeoutMs)
		} else if err != nil {
			return err
		}
		if len(frames) < 2 {
			return fmt.Errorf("a reply of %d frames: expected the delimiter, then a header", len(frames))
		}
		var reply Reply
		if err := json.Unmarshal(frames[1], &reply); err != nil { // frames[0]: the delimiter
			return fmt.Errorf("unreadable reply header: %v", err)
		}
		if reply.ID == nil {
			continue // not ours: its header could not be read
		}
		s, ok := pending[*reply.ID]
		if !ok {
			continue
		}
		delete(pending, s.ID)
		if reply.Status != 200 {
			fmt.Printf("%s: status %d: %s\n", s.Model, reply.Status, reply.Error)
			failed = true
			continue
		}
		served := ""
		if reply.Fallback != nil {
			served = ", fallback from " + reply.Fallback.From
		}
		fmt.Printf("%s: status 200, version %s%s, %s, %d us in the daemon\n",
			s.Model, reply.Version, served, describe(&reply, frames[2:]), reply.TimingUs.Total)
	}
	if failed {
		return fmt.Errorf("not every request was served")
	}
	return nil
}

func main() {
	args := os.Args[1:]
	frames := len(args) > 0 && args[0] == "frames"
	if frames {
		args = args[1:]
	}
	endpoint, pipeline := "ipc:///run/infermux/infer.sock", "camera"
	if len(args) > 0 {
		endpoint = args[0]
	}
	if len(args) > 1 {
		pipeline = args[1]
	}
	var err error
	if frames {
		err = runFrames(endpoint, pipeline)
	} else {
		err = run(endpoint)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "infermux client:", err)
		os.Exit(1)
	}
}
