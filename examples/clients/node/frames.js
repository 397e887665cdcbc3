#!/usr/bin/env node
// Two cameras sending raw frames to a pipeline, written from docs/protocol.md ("Streams", "Pipelines on
// the wire"): each camera is a stream (its own "key"), keeps at most one frame in flight, and a frame
// captured while one is in flight waits; a newer one replaces it. The newest frame wins, here as in a
// daemon whose pipeline has queue_policy = "newest_per_key".
//
//   npm install && node frames.js [ENDPOINT] [PIPELINE]
//
// ENDPOINT defaults to ipc:///run/infermux/infer.sock, PIPELINE to "camera" (a classifier pipeline:
// its reply's "classes" holds the best class of the frame).
"use strict";
const zmq = require("zeromq");

const ENDPOINT = process.argv[2] || "ipc:///run/infermux/infer.sock";
const PIPELINE = process.argv[3] || "camera";
const CAMERAS = ["cam-1", "cam-2"];
const FRAMES = 8; // captured per camera, one every TICK_MS
const TICK_MS = 10;
const TIMEOUT_MS = 10000;
const [WIDTH, HEIGHT] = [64, 48]; // raw BGR, rows packed: stride = 3 * width

// Frame `n` of camera `cam`: byte i is (7 i + 13 n + 101 cam) mod 256, the same in every example client.
function capture(cam, n) {
  const bytes = Buffer.alloc(WIDTH * HEIGHT * 3);
  for (let i = 0; i < bytes.length; i++) bytes[i] = (7 * i + 13 * n + 101 * cam) % 256;
  return bytes;
}

function request(cam, n) {
  const header = {
    model: PIPELINE,
    id: 1000 * cam + n, // echoed in the reply: which camera, which frame
    key: CAMERAS[cam],  // the stream: a camera's frames are served in turn with the others'
    inputs: [{ name: "image", dtype: "uint8", shape: [WIDTH * HEIGHT * 3], format: "bgr",
               width: WIDTH, height: HEIGHT, stride: WIDTH * 3 }],
  };
  return ["", JSON.stringify(header), capture(cam, n)]; // "": the delimiter a REQ socket would add
}

async function main() {
  const sock = new zmq.Dealer({ receiveTimeout: TIMEOUT_MS, linger: 0 });
  sock.connect(ENDPOINT);
  const cams = CAMERAS.map(() => ({ inFlight: -1, waiting: -1, sent: 0, replaced: 0, served: 0, last: -1 }));
  let failed = false;
  let sending = Promise.resolve(); // zeromq.js takes one send at a time: they queue here

  function sendWaiting(c) {
    const cam = cams[c];
    if (cam.inFlight >= 0 || cam.waiting < 0) return;
    cam.inFlight = cam.waiting;
    cam.waiting = -1;
    cam.sent++;
    const frames = request(c, cam.inFlight);
    sending = sending.then(() => sock.send(frames));
  }

  const busy = () => cams.some((cam) => cam.inFlight >= 0 || cam.waiting >= 0);
  let capturedAll = false;
  const capturing = (async () => {
    for (let n = 0; n < FRAMES; n++) {
      for (let c = 0; c < cams.length; c++) {
        if (cams[c].waiting >= 0) cams[c].replaced++; // the newer frame takes its place
        cams[c].waiting = n;
        sendWaiting(c);
      }
      capturedAll = n === FRAMES - 1;
      await new Promise((resolve) => setTimeout(resolve, TICK_MS));
    }
  })();

  try {
    while (!capturedAll || busy()) { // while anything is in flight, a reply is on its way
      const [delimiter, head] = await sock.receive();
      const reply = JSON.parse(head.toString("utf8"));
      if (reply.id === null) continue; // not ours: its header could not be read
      const c = Math.floor(reply.id / 1000), n = reply.id % 1000;
      const cam = cams[c];
      if (cam === undefined || cam.inFlight !== n) continue;
      cam.inFlight = -1;
      if (reply.status === 200) {
        const best = reply.classes[0][0];
        cam.served++;
        cam.last = n;
        console.log(`${CAMERAS[c]} frame ${n}: status 200, class ${best.index} (${best.score.toPrecision(6)})`);
      } else {
        console.log(`${CAMERAS[c]} frame ${n}: status ${reply.status}: ${reply.error}`);
        failed = true;
      }
      sendWaiting(c);
    }
    await capturing;
    await sending;
  } catch (err) {
    if (err.code !== "EAGAIN") throw err;
    console.error(`no reply from ${ENDPOINT} within ${TIMEOUT_MS} ms: is infermux running there?`);
    failed = true;
  } finally {
    sock.close();
  }
  cams.forEach((cam, c) => {
    console.log(`${CAMERAS[c]}: ${FRAMES} frames, ${cam.sent} sent, ${cam.replaced} replaced, ${cam.served} served`);
    if (cam.last !== FRAMES - 1) failed = true; // the newest frame is always answered
  });
  process.exitCode = failed ? 1 : 0;
}

main().catch((err) => {
  console.error(`infermux frames: ${err.message}`);
  process.exitCode = 1;
});
