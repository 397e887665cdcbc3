"""Events through the sinks: events/s through MQTT and ZeroMQ PUB, CPU per event, event-to-subscriber latency.

    python tests/benchmarks/bench_events.py [--events 20000] [--rate 1000] [--seconds 5] [--no-write]

The sinks' path as the daemon runs it (daemon/sinks/hub.py): `Hub.publish`
appends each event to the sink's durable spool under a temporary state
folder, and the sink's thread delivers it, to a real Mosquitto (QoS 1,
each PUBACK awaited) or to a PUB socket. The subscriber is another process
(paho for MQTT, a SUB socket for PUB) that records when each event arrived.

- **throughput**: `--events` published as fast as one thread can, the time
  until the subscriber had the last one (MQTT: each batch of 100 waits for
  its PUBACKs before the next);
- **CPU per event**: this process's user + system time over that run, less
  what the publishing thread spent outside `publish` (pacing, making the
  events): the appends, the fsyncs, the sink's thread, paho's or libzmq's
  I/O threads; not the broker's or the subscriber's; divided by the events;
- **latency**: `--rate` events/s for `--seconds`, from the event's `time`
  (when it was made) to its arrival at the subscriber, p50 and p99 (one
  clock: the same box).

Writes "## Events through the sinks" in RESULTS.md unless --no-write.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from results import markdown_table, print_and_write, stamp  # noqa: E402
from support.harness import free_port  # noqa: E402

from infermux.events import EventLog  # noqa: E402
from infermux.pipelines.lifecycle import IDS  # noqa: E402
from infermux.sinkconfig import SinkConfig  # noqa: E402
from infermux.sinks.hub import Hub  # noqa: E402

SECTION = "Events through the sinks"

# The subscriber, in a process of its own: prints, at the end, each event's (made, arrived) times.
SUBSCRIBER = r"""
import json, sys, time
kind, where, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
got = []
if kind == "zmq":
    import zmq
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 60000)
    sub.connect(where)
    print("ready", flush=True)
    while len(got) < n:
        topic, data = sub.recv_multipart()
        got.append((json.loads(data)["time"], time.time()))
else:
    import threading
    from paho.mqtt import client as paho
    done = threading.Event()
    def on_message(client, userdata, message):
        got.append((json.loads(message.payload)["time"], time.time()))
        if len(got) >= n:
            done.set()
    subscribed = threading.Event()
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="bench-sub")
    c.on_message = on_message
    c.on_connect = lambda c, u, f, r, p: c.subscribe("bench/+/events", qos=1)
    c.on_subscribe = lambda *a: subscribed.set()
    c.connect("127.0.0.1", int(where))
    c.loop_start()
    subscribed.wait(30)
    print("ready", flush=True)
    done.wait(120)
print(json.dumps(got))
"""


def event(i: int) -> dict[str, Any]:
    now = time.time()
    return {"id": IDS.new(), "type": "update", "time": now, "pipeline": "bench", "key": f"cam-{i % 4}",
            "track_id": 1 + i % 50, "label": "car", "score": 0.9, "box": [[1.0, 2.0], [30.0, 2.0], [30.0, 40.0],
                                                                           [1.0, 40.0]],
            "first_seen": now, "last_seen": now, "frames": i + 1, "zones": [], "captured": False}


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(kind: str, sink: SinkConfig, target: str, n: int, rate: float | None) -> dict[str, float]:
    """Publish `n` events (at `rate` a second, or as fast as possible) through one sink; the figures."""
    sub = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, kind, target, str(n)], stdout=subprocess.PIPE, text=True)
    assert sub.stdout is not None and sub.stdout.readline().strip() == "ready"
    with tempfile.TemporaryDirectory() as state:
        hub = Hub((sink,), Path(state), EventLog())
        time.sleep(0.5)  # the PUB subscriber's connection: a PUB socket sends to those already there
        start, cpu, mine, appending = time.perf_counter(), cpu_s(), time.thread_time(), 0.0
        for i in range(n):
            if rate is not None:
                due = start + i / rate
                while time.perf_counter() < due:
                    time.sleep(max(0.0, min(0.001, due - time.perf_counter())))
            one = event(i)
            before = time.thread_time()
            hub.publish("bench", one)
            appending += time.thread_time() - before
        out, _ = sub.communicate(timeout=180)
        # The process's CPU less this thread's pacing and event making: the appends and the sink's threads.
        wall, used = time.perf_counter() - start, cpu_s() - cpu - (time.thread_time() - mine - appending)
        hub.stop()
    lat = sorted(arrived - made for made, arrived in json.loads(out.splitlines()[-1]))
    return {"events": len(lat), "per_s": len(lat) / wall, "cpu_us": used / n * 1e6,
            "p50_ms": lat[len(lat) // 2] * 1e3, "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3}


def broker(folder: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    conf = folder / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    proc = subprocess.Popen([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    return proc, port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=100, help="the sinks' batch (events handed to a sink at once)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench_events."))
    mqtt_broker, port = broker(folder)
    pub = f"tcp://127.0.0.1:{free_port()}"
    sinks = {"mqtt": (SinkConfig("bench-mqtt", "mqtt", {"host": "127.0.0.1", "port": port, "prefix": "bench"}, batch=args.batch),
                      str(port)),
             "zmq": (SinkConfig("bench-pub", "zmq", {"bind": pub}, batch=args.batch), pub)}
    rows = []
    try:
        for kind, (sink, target) in sinks.items():
            most = run(kind, sink, target, args.events, None)
            paced = run(kind, sink, target, int(args.rate * args.seconds), args.rate)
            rows.append([kind, f"{most['per_s']:,.0f}", f"{most['cpu_us']:.0f}", f"{paced['cpu_us']:.0f}",
                         f"{paced['cpu_us'] * args.rate / 1e6:.3f}", f"{paced['p50_ms']:.2f}",
                         f"{paced['p99_ms']:.2f}"])
            print(kind, most, paced, flush=True)
    finally:
        mqtt_broker.terminate()
        mqtt_broker.wait(10)
        shutil.rmtree(folder, ignore_errors=True)
    rate = f"{args.rate:g}"
    body = "\n\n".join([
        f"{stamp()} Command: `python tests/benchmarks/bench_events.py --events {args.events} --rate {rate} "
        f"--seconds {args.seconds:g}` (commit {os.popen('git rev-parse --short HEAD').read().strip()}).",
        markdown_table(["sink", "events/s (most)", "CPU µs/event (most)", f"CPU µs/event at {rate}/s",
                        f"cores at {rate}/s", "p50 ms", "p99 ms"], rows),
        "Latency: from the event's `time` (made) to its arrival at a subscriber in another process, at "
        f"{rate} events/s. CPU: this process (spool appends, fsyncs, the sink's thread), not the broker's."])
    print_and_write(SECTION, body, write=not args.no_write, titled=True)


if __name__ == "__main__":
    main()
