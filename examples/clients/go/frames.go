package main

// Two cameras sending raw frames to a pipeline, written from docs/protocol.md ("Streams",
// "Pipelines on the wire"): each camera is a stream (its own "key"), keeps at most one frame in
// flight, and a frame captured while one is in flight waits; a newer one replaces it. The newest
// frame wins, here as in a daemon whose pipeline has queue_policy = "newest_per_key".
//
//	./infermux-client frames [ENDPOINT] [PIPELINE]
//
// PIPELINE defaults to "camera" (a classifier pipeline: its reply's "classes" holds the frame's best class).

import (
	"encoding/json"
	"fmt"
	"time"
)

var cameras = []string{"cam-1", "cam-2"}

const (
	frameCount  = 8 // captured per camera, one every tick
	tick        = 10 * time.Millisecond
	frameWidth  = 64 // raw BGR, rows packed: stride = 3 * width
	frameHeight = 48
)

// Frame is the header entry of a frame: a uint8 tensor of its bytes, with its format and geometry.
type Frame struct {
	Name   string `json:"name"`
	Dtype  string `json:"dtype"`
	Shape  []int  `json:"shape"`
	Format string `json:"format"`
	Width  int    `json:"width"`
	Height int    `json:"height"`
	Stride int    `json:"stride"`
}

// FrameRequest is the header frame of a frame sent on a camera's stream.
type FrameRequest struct {
	Model  string  `json:"model"`
	ID     int     `json:"id"`
	Key    string  `json:"key"`
	Inputs []Frame `json:"inputs"`
}

// FrameReply is what is read of a pipeline's reply header.
type FrameReply struct {
	ID      *int   `json:"id"`
	Status  int    `json:"status"`
	Error   string `json:"error"`
	Classes [][]struct {
		Index int     `json:"index"`
		Score float64 `json:"score"`
	} `json:"classes"`
}

type camera struct{ inFlight, waiting, sent, replaced, served, last int }

// capture is frame n of camera cam: byte i is (7 i + 13 n + 101 cam) mod 256, as in every example client.
func capture(cam, n int) []byte {
	bytes := make([]byte, frameWidth*frameHeight*3)
	for i := range bytes {
		bytes[i] = byte((7*i + 13*n + 101*cam) % 256)
	}
	return bytes
}

func sendWaiting(sock *Socket, pipeline string, cams []camera, c int) error {
	cam := &cams[c]
	if cam.inFlight >= 0 || cam.waiting < 0 {
		return nil
	}
	cam.inFlight, cam.waiting = cam.waiting, -1
	cam.sent++
	size := frameWidth * frameHeight * 3
	// id: which camera, which frame; key: the stream, served in turn with the other cameras'.
	header, _ := json.Marshal(FrameRequest{pipeline, 1000*c + cam.inFlight, cameras[c],
		[]Frame{{"image", "uint8", []int{size}, "bgr", frameWidth, frameHeight, frameWidth * 3}}})
	return sock.Send([][]byte{{}, header, capture(c, cam.inFlight)}) // {}: the delimiter REQ would add
}

// receiveOne handles one reply if one comes within timeoutMs; false when none did.
func receiveOne(sock *Socket, pipeline string, cams []camera, timeoutMs int, failed *bool) (bool, error) {
	if ok, err := sock.Poll(timeoutMs); !ok || err != nil {
		return false, err
	}
	frames, err := sock.Receive()
	if err != nil || len(frames) < 2 {
		return true, err
	}
	var reply FrameReply
	if err := json.Unmarshal(frames[1], &reply); err != nil || reply.ID == nil {
		return true, nil // not ours: its header could not be read
	}
	c, n := *reply.ID/1000, *reply.ID%1000
	if c < 0 || c >= len(cams) || cams[c].inFlight != n {
		return true, nil
	}
	cams[c].inFlight = -1
	if reply.Status == 200 && len(reply.Classes) > 0 && len(reply.Classes[0]) > 0 {
		best := reply.Classes[0][0]
		cams[c].served++
		cams[c].last = n
		fmt.Printf("%s frame %d: status 200, class %d (%.6g)\n", cameras[c], n, best.Index, best.Score)
	} else {
		fmt.Printf("%s frame %d: status %d: %s\n", cameras[c], n, reply.Status, reply.Error)
		*failed = true
	}
	return true, sendWaiting(sock, pipeline, cams, c)
}

func runFrames(endpoint, pipeline string) error {
	sock, err := NewDealer(timeoutMs)
	if err != nil {
		return err
	}
	defer sock.Close()
	if err := sock.Connect(endpoint); err != nil {
		return err
	}
	cams := make([]camera, len(cameras))
	for c := range cams {
		cams[c] = camera{inFlight: -1, waiting: -1, last: -1}
	}
	failed := false
	for n := 0; n < frameCount; n++ {
		for c := range cams {
			if cams[c].waiting >= 0 {
				cams[c].replaced++ // the newer frame takes its place
			}
			cams[c].waiting = n
			if err := sendWaiting(sock, pipeline, cams, c); err != nil {
				return err
			}
		}
		for end := time.Now().Add(tick); time.Now().Before(end); { // replies until the next frame
			if _, err := receiveOne(sock, pipeline, cams, int(time.Until(end)/time.Millisecond), &failed); err != nil {
				return err
			}
		}
	}
	busy := func() bool {
		for _, cam := range cams {
			if cam.inFlight >= 0 || cam.waiting >= 0 {
				return true
			}
		}
		return false
	}
	for busy() { // while anything is in flight, a reply is on its way
		got, err := receiveOne(sock, pipeline, cams, 2*timeoutMs, &failed)
		if err != nil {
			return err
		}
		if !got {
			return fmt.Errorf("no reply from %s within %d ms: is infermux running there?", endpoint, 2*timeoutMs)
		}
	}
	for c, cam := range cams {
		fmt.Printf("%s: %d frames, %d sent, %d replaced, %d served\n", cameras[c], frameCount, cam.sent,
			cam.replaced, cam.served)
		if cam.last != frameCount-1 {
			failed = true // the newest frame is always answered
		}
	}
	if failed {
		return fmt.Errorf("not every frame sent was served")
	}
	return nil
}
