#!/usr/bin/env node
// A complete infermux client in Node.js with zeromq 6, written from docs/protocol.md:
// one DEALER socket, both sample models asked at once, replies matched by `id`.
//
//   npm install && node client.js [ENDPOINT]
//
// ENDPOINT defaults to the packaged daemon's ipc:///run/infermux/infer.sock.
"use strict";
const zmq = require("zeromq");

const ENDPOINT = process.argv[2] || "ipc:///run/infermux/infer.sock";
const TIMEOUT_MS = 5000;

// The sample engines (engines/make_samples.py): one input, one float32 output each.
const REQUESTS = [
  { id: 1, model: "classifier", input: "images", shape: [1, 3, 64, 64] },
  { id: 2, model: "mlp", input: "features", shape: [1, 256] },
];

// x[i] = (i % 17) / 16: the same sample in every example client, exact in float32.
function sample(count) {
  const buf = Buffer.alloc(count * 4);
  for (let i = 0; i < count; i++) buf.writeFloatLE((i % 17) / 16, i * 4); // the wire is little-endian
  return buf;
}

function frames(req) {
  const header = {
    model: req.model,
    id: req.id,         // echoed in the reply: how a DEALER matches replies to requests
    timeout_ms: 5000,   // optional: the deadline (default: the model's timeout_ms)
    inputs: [{ name: req.input, dtype: "float32", shape: req.shape }],
  };
  const count = req.shape.reduce((a, b) => a * b, 1);
  return ["", JSON.stringify(header), sample(count)]; // "": the delimiter a REQ socket would add
}

// Pair frame i with the i-th output entry that has no "region" (shared memory has no frame).
function describe(header, outputs) {
  const framed = header.outputs.filter((o) => !("region" in o));
  return framed.map((meta, i) => {
    const text = `${meta.name} ${meta.dtype}[${meta.shape.join(",")}]`;
    if (meta.dtype !== "float32") return text;
    const frame = outputs[i];
    let top = 0;
    for (let k = 1; k < frame.length / 4; k++) if (frame.readFloatLE(k * 4) > frame.readFloatLE(top * 4)) top = k;
    return `${text}, top class ${top} (${frame.readFloatLE(top * 4).toPrecision(6)})`;
  });
}

async function main() {
  const sock = new zmq.Dealer({ receiveTimeout: TIMEOUT_MS, linger: 0 });
  sock.connect(ENDPOINT);
  for (const req of REQUESTS) await sock.send(frames(req)); // both in flight at once
  const byId = new Map(REQUESTS.map((r) => [r.id, r]));
  let failed = false;
  try {
    while (byId.size) {
      const [delimiter, head, ...outputs] = await sock.receive(); // in the order they finish
      const header = JSON.parse(head.toString("utf8"));
      const req = byId.get(header.id);
      if (req === undefined) continue; // not ours (an id of null: the header could not be read)
      byId.delete(header.id);
      if (header.status !== 200) {
        const retry = header.retry_after_ms ? ` (retry after ${header.retry_after_ms} ms)` : "";
        console.log(`${req.model}: status ${header.status}: ${header.error}${retry}`);
        failed = true;
        continue;
      }
      const served = header.fallback ? `, fallback from ${header.fallback.from}` : "";
      console.log(`${req.model}: status 200, version ${header.version}${served}, ` +
                  `${describe(header, outputs).join("; ")}, ${header.timing_us.total} us in the daemon`);
    }
  } catch (err) {
    if (err.code !== "EAGAIN") throw err;
    console.error(`no reply from ${ENDPOINT} within ${TIMEOUT_MS} ms: is infermux running there?`);
    failed = true;
  } finally {
    sock.close();
  }
  process.exitCode = failed ? 1 : 0;
}

main().catch((err) => {
  console.error(`infermux client: ${err.message}`);
  process.exitCode = 1;
});
