"""What the sink tests share: the events' schema check, a Mosquitto of the test's own, an HTTP endpoint, and
the daemon's configuration they start it with (`events_daemon` and its `[[sinks]]` sections)."""

from __future__ import annotations

import getpass
import json
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import jsonschema

from support import system_packages
from support.camera_files import camera
from support.harness import REPO, Daemon, Value, daemon_head, free_port, toml_lines, toml_value
from support.polling import eventually
from support.tracking import detecting

from infermux.sinks import SCHEMA

VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))


def valid(event: dict[str, Any]) -> dict[str, Any]:
    """`event`, once checked against the shipped schema (AssertionError naming what is wrong)."""
    errors = sorted(VALIDATOR.iter_errors(event), key=str)
    assert not errors, f"{event} does not follow the schema: {errors[0].message}"
    return event


class Mosquitto:
    """A broker on a free 127.0.0.1 port, started and stopped by the test (`stop` and `start` again
    for an outage: the same port; unless `persistent`, what it held is gone as after a crash)."""

    def __init__(self, folder: Path, persistent: bool = False) -> None:
        """`persistent`: the broker keeps its clients' sessions in `folder` across its restart, with no bound
        on the messages queued for a subscriber meanwhile (so that an outage loses it none)."""
        system_packages.require({"mosquitto": "mosquitto"})
        self.binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.port = free_port()
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.conf = folder / "mosquitto.conf"
        keep = f"persistence true\npersistence_location {folder}/\nmax_queued_messages 0\n" if persistent else \
            "persistence false\n"
        # `user`: as root, mosquitto would switch to its own user, which may not write the test's folder.
        self.conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n{keep}user {getpass.getuser()}\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "Mosquitto":
        self.proc = subprocess.Popen([self.binary, "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=open(self.folder / "mosquitto.log", "ab"))
        eventually(self._listening, "mosquitto listening", timeout_s=20)
        return self

    def _listening(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, (self.folder / "mosquitto.log").read_text()
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None


class Subscriber:
    """A paho client subscribed to `topic` at QoS 1, keeping every message (topic, payload, qos)."""

    def __init__(self, port: int, topic: str) -> None:
        from paho.mqtt import client as paho

        self.messages: list[tuple[str, bytes, int]] = []
        self._lock = threading.Lock()
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"test-sub-{port}", clean_session=False)
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, u, f, reason, p: c.subscribe(topic, qos=1)
        self.client.reconnect_delay_set(0.1, 0.5)
        self.client.connect("127.0.0.1", port, keepalive=5)
        self.client.loop_start()

    def connected(self) -> "Subscriber":
        """This subscriber, once connected (and so subscribed before anything the test makes next)."""
        waiting(lambda: self.client.is_connected(), "the subscriber's connection")
        return self

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        with self._lock:
            self.messages.append((message.topic, bytes(message.payload), message.qos))

    def events(self, suffix: str = "/events") -> list[dict[str, Any]]:
        with self._lock:
            return [valid(json.loads(p)) for t, p, _ in self.messages if t.endswith(suffix)]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Endpoint:
    """An HTTP server that answers each POST with the next of `answers` (the last one repeated),
    `None` meaning it never answers; it keeps the bodies it answered 2xx."""

    def __init__(self, answers: list[int | None]) -> None:
        self.answers, self.bodies, self.posts = list(answers), [], 0
        self.stall = threading.Event()  # set to let the never-answering calls return (at the end)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status = outer._next()
                if status is None:
                    outer.stall.wait(60)
                    return
                if 200 <= status < 300:
                    outer.bodies.append(valid(json.loads(body)))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _next(self) -> int | None:
        self.posts += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def close(self) -> None:
        self.stall.set()
        self.server.shutdown()
        self.server.server_close()


def by_track(events: list[dict[str, Any]]) -> dict[tuple[str, int], list[str]]:
    """(key, track id) -> the types of its events, in the order they came."""
    out: dict[tuple[str, int], list[str]] = {}
    for event in events:
        out.setdefault((event["key"], event["track_id"]), []).append(event["type"])
    return out


def first_of_each(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events without the repeats (a resent event has the id it had)."""
    seen: set[str] = set()
    out = []
    for event in events:
        if event["id"] not in seen:
            seen.add(event["id"])
            out.append(event)
    return out


def arrived_in_order(made: list[dict[str, Any]], got: list[dict[str, Any]], keys: list[str]) -> None:
    """Asserts that each of `keys` made events and that `got` holds each of them, in the order made,
    a repeat only with the contents it had."""
    for key in keys:
        want = [e["id"] for e in made if e["key"] == key]
        assert want, key
        assert [e["id"] for e in first_of_each(got) if e["key"] == key] == want, f"{key}: lost or out of order"
    by_id: dict[str, dict[str, Any]] = {}
    for event in got:
        assert by_id.setdefault(event["id"], event) == event, "an id came twice with different contents"


def waiting(check: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    """`eventually` with the sinks' longer bound (a broker coming back, a retry's backoff)."""
    return eventually(check, what, timeout_s=timeout_s, interval_s=0.05)


def self_signed(folder: Path, host: str = "127.0.0.1") -> tuple[Path, Path, Path]:
    """A CA and a server certificate for `host` it signed, in `folder`: (ca.pem, server.pem, server.key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("test ca")).issuer_name(name("test ca"))
          .public_key(ca_key.public_key()).serial_number(1).not_valid_before(now)
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(name(host)).issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(2).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def camera_and_webhooks(workdir: Path, clip: Path, fps: int, failing: str, stuck: str) -> str:
    """A daemon's configuration: camera `front` looping `clip` at `fps` into a tracked pipeline with object
    events (on models.brightness_map's `det` in workdir/engines), the sample classifier for plain clients,
    and three sinks: `files` (jsonl), and webhooks `failing` and `stuck` to those URLs, each spool bounded
    at 5 events (test_failing_sinks.py, bench_events.py --failing)."""
    pipeline = detecting("tracked", min_frames=2, end_after_s=0.5, update_every_s=0.2, min_score_gain=0.0)
    return events_daemon(workdir / "engines", pipeline,
                         jsonl(workdir / "events.jsonl"),
                         webhook("failing", failing, timeout_s=1, max_events=5),
                         webhook("stuck", stuck, timeout_s=0.5, max_events=5),
                         more=camera("front", str(clip), pipeline="tracked", fps=fps).format(), classifier=True)


# -- a daemon's configuration with sinks --------------------------------------------------------------

@dataclass(frozen=True)
class Sink:
    """One `[[sinks]]` section (docs/events.md#sinks): its kind's `options`, and the spool's bound and
    retry pace where the test sets them."""

    name: str
    kind: str
    options: dict[str, Value]
    max_events: int | None = None
    retry_s: float | None = None
    max_retry_s: float | None = None

    def section(self) -> str:
        spool = {"max_events": self.max_events, "retry_s": self.retry_s, "max_retry_s": self.max_retry_s}
        table = ", ".join(f"{key} = {toml_value(value)}" for key, value in self.options.items())
        return (f"\n[[sinks]]\n{toml_lines({'name': self.name, 'kind': self.kind})}"
                f"{toml_lines({k: v for k, v in spool.items() if v is not None})}options = {{ {table} }}\n")


def jsonl(path: Path, name: str = "files", **options: Value) -> Sink:
    """A `jsonl` sink writing `path`: the tests' reference of every event the daemon made."""
    return Sink(name, "jsonl", {"path": path, **options})


def mqtt(port: int, name: str = "broker", retry_s: float = 0.05, max_retry_s: float = 0.2, **options: Value) -> Sink:
    """An `mqtt` sink to the broker on 127.0.0.1:`port` (a Mosquitto of the test's)."""
    return Sink(name, "mqtt", {"host": "127.0.0.1", "port": port, **options}, retry_s=retry_s, max_retry_s=max_retry_s)


def webhook(name: str, url: str, timeout_s: float, max_events: int | None = None, retry_s: float = 0.05,
            max_retry_s: float = 0.1) -> Sink:
    """A `webhook` sink POSTing to `url` (an Endpoint of the test's, or nobody)."""
    return Sink(name, "webhook", {"url": url, "timeout_s": timeout_s}, max_events, retry_s, max_retry_s)


def publisher(bind: str, name: str = "pub") -> Sink:
    """A `zmq` sink binding a PUB socket at `bind`, each frame's result published too."""
    return Sink(name, "zmq", {"bind": bind, "results": True})


def events_daemon(engine_dir: Path, pipeline: str, *sinks: Sink, more: str = "", classifier: bool = False,
                  det: dict[str, Value] | None = None, **daemon: Value) -> str:
    """A daemon's configuration: `[daemon]` on ipc://infer.sock with `engine_dir` and the `daemon` settings
    (metrics_port, watch_settle_s...), model `det` (engine_dir/det/1/model.onnx: models.brightness_map) with
    `det`'s settings, with `classifier` the repository's test classifier too, then `pipeline`
    (tracking.detecting), `more` (cameras, [snapshots]) and `sinks`, last (a test may cut the text there)."""
    head = daemon_head(engine_dir, **daemon)
    models = '\n[[models]]\nname = "det"\nengine = "det/1/model.onnx"\n' + toml_lines(det or {})
    if classifier:
        models += '\n[[models]]\nname = "classifier"\n' + toml_lines({"engine": REPO / "engines/classifier/1/model.onnx"})
    return head + models + pipeline + more + "".join(sink.section() for sink in sinks)


def jsonl_events(path: Path) -> list[dict[str, Any]]:
    """The events a `jsonl` sink wrote to `path` so far, each checked against the schema."""
    return [valid(json.loads(line)) for line in path.read_text().splitlines()] if path.exists() else []


def until_ended(path: Path, objects: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """`path`'s events once `objects` objects have ended there (the file holds their last events)."""
    return waiting(lambda: (lambda e: e if sum(x["type"] == "end" for x in e) >= objects else None)(
        jsonl_events(path)), f"{objects} objects' end in {path.name}", timeout_s=timeout_s)


def sink_states(d: Daemon) -> dict[str, dict[str, Any]]:
    """Admin `sinks`, by sink name."""
    with d.admin() as admin:
        return {s["name"]: s for s in admin.call("sinks")["sinks"]}
