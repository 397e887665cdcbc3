"""What the sink tests share: the events' schema check, a Mosquitto of the test's own, an HTTP endpoint."""

from __future__ import annotations

import getpass
import json
import shutil
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import jsonschema

from support import system_packages
from support.camera_files import camera
from support.harness import REPO, free_port
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
    for an outage: the same port, persistence off, so what it held is gone as after a crash)."""

    def __init__(self, folder: Path) -> None:
        system_packages.require({"mosquitto": "mosquitto"})
        self.binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.port = free_port()
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.conf = folder / "mosquitto.conf"
        # `user`: as root, mosquitto would switch to its own user, which may not write the test's folder.
        self.conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                             f"user {getpass.getuser()}\n")
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
    return f"""
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{workdir / 'engines'}"

[[models]]
name = "det"
engine = "det/1/model.onnx"

[[models]]
name = "classifier"
engine = "{REPO / 'engines/classifier/1/model.onnx'}"
{pipeline}{camera("front", str(clip), pipeline="tracked", fps=fps).format()}
[[sinks]]
name = "files"
kind = "jsonl"
options = {{ path = "{workdir / 'events.jsonl'}" }}

[[sinks]]
name = "failing"
kind = "webhook"
max_events = 5
retry_s = 0.05
max_retry_s = 0.1
options = {{ url = "{failing}", timeout_s = 1 }}

[[sinks]]
name = "stuck"
kind = "webhook"
max_events = 5
retry_s = 0.05
max_retry_s = 0.1
options = {{ url = "{stuck}", timeout_s = 0.5 }}
"""
