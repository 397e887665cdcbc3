"""Events through the sinks: events/s through MQTT and ZeroMQ PUB, CPU per event, event-to-subscriber latency.

    python tests/benchmarks/bench_events.py [--events 20000] [--rate 1000] [--seconds 5] [--batch 100]
                                            [--outage 60] [--no-write]

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

With `--outage S`, first: 50 events/s through the MQTT sink while the broker
is stopped for S seconds and the hub (the daemon's, with its spool) is
stopped and started again halfway through; a subscriber whose session the
broker keeps says whether every event arrived, in order per key.

Writes "## Events through the sinks" in RESULTS.md unless --no-write.
"""

from __future__ import annotations

import argparse
import getpass
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
from infermux.config import SinkConfig  # noqa: E402
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


# The outage's subscriber: a session the broker keeps (clean_session off, the broker's persistence on),
# so what is published while it reconnects waits for it; prints each event's (key, id) once it has `n` ids.
KEEPER = r"""
import json, sys, threading
from paho.mqtt import client as paho
port, n = int(sys.argv[1]), int(sys.argv[2])
got, ids, done, ready = [], set(), threading.Event(), threading.Event()
def on_message(client, userdata, message):
    e = json.loads(message.payload)
    got.append((e["key"], e["id"]))
    ids.add(e["id"])
    if len(ids) >= n:
        done.set()
c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="bench-keeper", clean_session=False)
c.on_message = on_message
c.on_connect = lambda c, u, f, r, p: c.subscribe("bench/+/events", qos=1)
c.on_subscribe = lambda *a: ready.set()
c.reconnect_delay_set(0.2, 1.0)
c.connect("127.0.0.1", port)
c.loop_start()
ready.wait(30)
print("ready", flush=True)
done.wait(float(sys.argv[3]))
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


def broker(folder: Path, port: int = 0) -> tuple[subprocess.Popen[bytes], int]:
    """Mosquitto on `port` (a free one by default), persistent in `folder`, as this user."""
    port = port or free_port()
    conf = folder / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
                    f"persistence_location {folder}/\nuser {getpass.getuser()}\n")
    proc = subprocess.Popen([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    return proc, port


def outage(rate: float, outage_s: float, around_s: float) -> str:
    """`rate` events/s over 4 keys for around_s, the broker stopped for outage_s (the hub, as the daemon
    has it, stopped and started again on its spool halfway), then around_s more: what arrived."""
    folder = Path(tempfile.mkdtemp(prefix="bench_events_outage."))
    proc, port = broker(folder)
    sink = SinkConfig("outage", "mqtt", {"host": "127.0.0.1", "port": port, "prefix": "bench"}, retry_s=0.2,
                      max_retry_s=2.0)
    total = int(rate * (2 * around_s + outage_s))
    keeper = subprocess.Popen([sys.executable, "-c", KEEPER, str(port), str(total), str(outage_s + 120)],
                              stdout=subprocess.PIPE, text=True)
    assert keeper.stdout is not None and keeper.stdout.readline().strip() == "ready"
    made: list[tuple[str, str]] = []
    hub = Hub((sink,), folder / "state", EventLog())
    start = time.perf_counter()
    phases = {around_s: "stop broker", around_s + outage_s / 2: "restart", around_s + outage_s: "start broker"}
    for i in range(total):
        at = i / rate
        for when in [w for w in phases if w <= at]:
            what = phases.pop(when)
            if what == "stop broker":
                proc.terminate()
                proc.wait(10)
            elif what == "restart":
                hub.stop()
                hub = Hub((sink,), folder / "state", EventLog())
            else:
                proc, _ = broker(folder, port)
                back = time.perf_counter()
        while time.perf_counter() < start + at:
            time.sleep(0.002)
        one = event(i)
        made.append((one["key"], one["id"]))
        hub.publish("bench", one)
    ended = time.perf_counter()
    out, _ = keeper.communicate(timeout=outage_s + 180)
    drained, caught_up = time.perf_counter() - ended, ended - back
    hub.stop()
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(folder, ignore_errors=True)
    got = [tuple(x) for x in json.loads(out.splitlines()[-1])]
    firsts = list(dict.fromkeys(got))
    in_order = all([i for k, i in firsts if k == key] == [i for k, i in made if k == key] for key in {k for k, _ in made})
    lost = len(set(made) - set(got))
    return (f"{len(made)} events at {rate:g}/s over 4 keys; the broker stopped {outage_s:g} s, the hub restarted on "
            f"its spool after {outage_s / 2:g} s of it: **{lost} lost**, {len(got) - len(firsts)} delivered twice "
            f"(same id), in order per key: **{'yes' if in_order else 'no'}**; the subscriber had every event "
            f"{drained:.1f} s after the last was made ({caught_up:.1f} s after the broker came back).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=100, help="the sinks' batch (events handed to a sink at once)")
    parser.add_argument("--outage", type=float, default=0.0, help="also: a broker outage of this many seconds "
                        "at 50 events/s, the hub restarted during it (0: not run)")
    parser.add_argument("--sinks", default="mqtt,zmq", help="which sinks to measure, comma-separated")
    parser.add_argument("--rounds", type=int, default=1, help="paced latency runs per sink (the median's p99 "
                        "is reported, every round's printed)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    lost = outage(50.0, args.outage, 5.0) if args.outage else ""
    if lost:
        print(lost, flush=True)
    folder = Path(tempfile.mkdtemp(prefix="bench_events."))
    mqtt_broker, port = broker(folder)
    pub = f"tcp://127.0.0.1:{free_port()}"
    sinks = {"mqtt": (SinkConfig("bench-mqtt", "mqtt", {"host": "127.0.0.1", "port": port, "prefix": "bench"}, batch=args.batch),
                      str(port)),
             "zmq": (SinkConfig("bench-pub", "zmq", {"bind": pub}, batch=args.batch), pub)}
    rows = []
    try:
        for kind, (sink, target) in sinks.items():
            if kind not in args.sinks.split(","):
                continue
            most = run(kind, sink, target, args.events, None)
            rounds = sorted((run(kind, sink, target, int(args.rate * args.seconds), args.rate)
                             for _ in range(args.rounds)), key=lambda r: r["p99_ms"])
            paced = rounds[len(rounds) // 2]
            each = [f"{r['p99_ms']:.2f}" for r in rounds]
            p99s = f" (rounds: {', '.join(each)})" if len(rounds) > 1 else ""
            rows.append([kind, f"{most['per_s']:,.0f}", f"{most['cpu_us']:.0f}", f"{paced['cpu_us']:.0f}",
                         f"{paced['cpu_us'] * args.rate / 1e6:.3f}", f"{paced['p50_ms']:.2f}",
                         f"{paced['p99_ms']:.2f}{p99s}"])
            print(kind, most, rounds, flush=True)
    finally:
        mqtt_broker.terminate()
        mqtt_broker.wait(10)
        shutil.rmtree(folder, ignore_errors=True)
    rate = f"{args.rate:g}"
    body = "\n\n".join([
        f"{stamp()} Command: `python tests/benchmarks/bench_events.py --events {args.events} --rate {rate} "
        f"--seconds {args.seconds:g} --sinks {args.sinks} --rounds {args.rounds}` (commit {os.popen('git rev-parse --short HEAD').read().strip()}).",
        markdown_table(["sink", "events/s (most)", "CPU µs/event (most)", f"CPU µs/event at {rate}/s",
                        f"cores at {rate}/s", "p50 ms", "p99 ms"], rows),
        "Latency: from the event's `time` (made) to its arrival at a subscriber in another process, at "
        f"{rate} events/s. CPU: this process (spool appends, fsyncs, the sink's thread), not the broker's.",
        *([f"Outage (`--outage {args.outage:g}`): {lost}"] if lost else [])])
    print_and_write(SECTION, body, write=not args.no_write, titled=True)


if __name__ == "__main__":
    main()
