"""The `mqtt` sink (paho-mqtt 2.x): events on `<prefix>/<key>/events` at QoS 1, acknowledged by PUBACK.

The sink announces itself on its availability topic (`<prefix>/available`:
"online", retained), and the broker says "offline" there for it when the
connection is lost (the last will). A delivery that gets no PUBACK in
`ack_timeout_s` closes the connection: the events not acknowledged stay in
the spool and are sent again on a fresh connection (never by paho's own
queue), so what a subscriber gets twice has the same id.

An `enter` or `exit` also publishes the count it carries, retained, on
`<prefix>/<key>/zones/<zone>/<label>`, and a `cross` on
`<prefix>/<key>/lines/<line>/<direction>/<label>`: a subscriber that comes
later reads every zone's count at once. The event is acknowledged once
both have their PUBACK.
"""

from __future__ import annotations

import importlib.util
import json
import os
import ssl
import threading
import time
from typing import Any, Mapping

from infermux.plugins.sinks.base import OutEvent, SinkConfigError, SinkDown, bounded, known, option, topic_key

KIND = "mqtt"
OPTIONS = {"host", "port", "prefix", "client_id", "keepalive_s", "ack_timeout_s", "tls", "ca_file", "cert_file",
           "key_file", "credentials_file", "availability_topic"}
MAX_CREDENTIALS_BYTES = 4096
MAX_INFLIGHT = 1000


def _paho_version() -> str:
    """paho-mqtt's version, "" when it is not installed (its package only: the client is imported later)."""
    if importlib.util.find_spec("paho") is None or importlib.util.find_spec("paho.mqtt") is None:
        return ""
    import paho.mqtt  # the package's __init__ holds only its version

    return str(getattr(paho.mqtt, "__version__", ""))


def _credentials(path: str) -> tuple[str, str]:
    """Username and password from `path`: its first line `user:password` (a file only its owner reads)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        text = handle.read(MAX_CREDENTIALS_BYTES).decode("utf-8", "replace")
    user, sep, password = text.splitlines()[0].partition(":") if text else ("", "", "")
    if not sep or not user:
        raise SinkDown(f"credentials_file {path}: its first line must be user:password")
    return user, password


COUNTED = ("enter", "exit", "cross")  # the events that carry a zone's or line's count


def count_topic(event: OutEvent) -> tuple[str, int]:
    """The topic levels under the key that an `enter`, `exit` or `cross` event's count goes to, and the
    count: `zones/<zone>/<label>` or `lines/<line>/<direction>/<label>`, the label it is counted under
    (escaped as a key is)."""
    body = json.loads(event.data)
    label = topic_key(str(body["counted"]))
    if event.type == "cross":
        return f"lines/{topic_key(str(body['line']))}/{body['direction']}/{label}", int(body["count"])
    return f"zones/{topic_key(str(body['zone']))}/{label}", int(body["count"])


def _acked(info: Any, deadline: float) -> bool:
    """Whether a publish got its PUBACK by `deadline` (False too when it was never queued: the
    connection went)."""
    try:
        info.wait_for_publish(max(0.0, deadline - time.monotonic()))
    except (RuntimeError, ValueError):
        return False
    return bool(info.is_published())


class MqttSink:
    """A connection to one broker; `deliver` publishes and waits for the PUBACKs."""

    @staticmethod
    def check(options: Mapping[str, Any]) -> None:
        known(KIND, options, OPTIONS)
        version = _paho_version()
        if not version.startswith("2."):
            found = f"found {version}" if version else "not installed"
            raise SinkConfigError(KIND, f"needs paho-mqtt 2.x ({found}): `pip install 'infermux[mqtt]'`, or "
                                  "`apt install python3-paho-mqtt` where it is 2.x (Debian 13)")
        if not option(KIND, options, "host", str, ""):
            raise SinkConfigError(KIND, "option 'host' is required (the broker's name or address)", "host")
        bounded(KIND, "port", option(KIND, options, "port", int, 1883), 1, 65535)
        prefix = option(KIND, options, "prefix", str, "infermux")
        if not prefix or any(c in prefix for c in "#+\0"):
            raise SinkConfigError(KIND, f"option 'prefix' must be a topic without wildcards, got {prefix!r}", "prefix")
        option(KIND, options, "client_id", str, "")
        option(KIND, options, "availability_topic", str, "")
        bounded(KIND, "keepalive_s", option(KIND, options, "keepalive_s", int, 30), 5, 3600)
        bounded(KIND, "ack_timeout_s", option(KIND, options, "ack_timeout_s", (int, float), 10.0), 0.1, 600)
        option(KIND, options, "tls", bool, False)
        for key in ("ca_file", "cert_file", "key_file", "credentials_file"):
            value = option(KIND, options, key, str, "")
            if value and not os.path.isabs(value):
                raise SinkConfigError(KIND, f"option {key!r} must be an absolute path, got {value!r}", key)

    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        self.check(options)
        self.options = dict(options)
        self.host, self.port = str(options["host"]), int(options.get("port", 1883))
        self.prefix = str(options.get("prefix", "infermux"))
        self.available = str(options.get("availability_topic") or f"{self.prefix}/available")
        self.client_id = str(options.get("client_id") or f"infermux-{name}")
        self.ack_timeout_s = float(options.get("ack_timeout_s", 10.0))
        self._client: Any = None
        self._connected = threading.Event()
        self._refused = ""

    @staticmethod
    def probe(options: Mapping[str, Any], timeout_s: float) -> str:
        """Connect once (TLS and credentials as configured) under a client id of its own, so that the
        running daemon's session is left alone; nothing is published, no last will is left."""
        ack = min(float(options.get("ack_timeout_s", 10.0)), timeout_s)
        sink = MqttSink("probe", {**options, "client_id": f"infermux-doctor-{os.getpid()}", "ack_timeout_s": ack})
        started = time.monotonic()
        MqttSink._drop(sink._open(announce=False))
        return f"broker {sink.host}:{sink.port} accepted the connection in {(time.monotonic() - started) * 1e3:.0f} ms"

    def _connect(self) -> Any:
        return self._open(announce=True)

    def _open(self, announce: bool) -> Any:
        """A connected client; with `announce`, the last will set and "online" published."""
        from paho.mqtt import client as paho  # imported when the sink first delivers (check() found it)

        client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=self.client_id, clean_session=True)
        if announce:
            client.will_set(self.available, "offline", qos=1, retain=True)
        try:  # a missing or unreadable file: said as the sink's error, not as a plugin's bug
            if self.options.get("credentials_file"):
                client.username_pw_set(*_credentials(self.options["credentials_file"]))
            if self.options.get("tls"):
                client.tls_set(ca_certs=self.options.get("ca_file") or None,
                               certfile=self.options.get("cert_file") or None,
                               keyfile=self.options.get("key_file") or None, tls_version=ssl.PROTOCOL_TLS_CLIENT)
        except (OSError, ValueError) as exc:
            raise SinkDown(f"credentials or TLS files: {exc}") from None
        client.max_inflight_messages_set(MAX_INFLIGHT)  # a delivery's batch goes out without waiting for PUBACKs
        client.on_connect = self._on_connect
        client.on_disconnect = lambda *args: self._connected.clear()
        client.connect_timeout = min(self.ack_timeout_s, 10.0)
        self._connected.clear()
        self._refused = ""
        try:
            client.connect(self.host, self.port, int(self.options.get("keepalive_s", 30)))
        except (OSError, ValueError) as exc:
            raise SinkDown(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        client.loop_start()
        if not self._connected.wait(self.ack_timeout_s):
            self._drop(client)
            raise SinkDown(f"broker {self.host}:{self.port} did not accept the connection"
                           f"{': ' + self._refused if self._refused else ''}")
        if announce:
            client.publish(self.available, "online", qos=1, retain=True)
        return client

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            self._refused = str(reason)
            return
        self._connected.set()

    @staticmethod
    def _drop(client: Any) -> None:
        try:
            client.disconnect()
        finally:
            client.loop_stop()

    def deliver(self, events: list[OutEvent]) -> int:
        """Publish at QoS 1 and wait for each PUBACK; the count acknowledged from the first."""
        if self._client is None or not self._connected.is_set():
            self.close()
            self._client = self._connect()
        infos = [self._publish(e) for e in events]
        deadline = time.monotonic() + self.ack_timeout_s
        acked = 0
        for published in infos:
            if not all(_acked(info, deadline) for info in published):
                break  # this one and the rest wait in the spool
            acked += 1
        if acked < len(events):
            self.close()  # a fresh connection resends the rest; paho's own queue is dropped with this one
            if acked == 0:
                raise SinkDown(f"no PUBACK from {self.host}:{self.port} within {self.ack_timeout_s:g} s")
        return acked

    def _publish(self, event: OutEvent) -> list[Any]:
        """An event on its key's events topic at QoS 1, and the count it carries retained beside it."""
        client = self._client
        infos = [client.publish(f"{self.prefix}/{topic_key(event.key)}/events", event.data, qos=1)]
        if event.type in COUNTED:
            topic, count = count_topic(event)
            infos.append(client.publish(f"{self.prefix}/{topic_key(event.key)}/{topic}", str(count), qos=1,
                                        retain=True))
        return infos

    def result(self, key: str, payload: bytes) -> None:
        """Per-frame results are not published over MQTT."""

    def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            try:
                self._drop(client)
            except Exception:  # noqa: BLE001 - a connection that is already gone
                pass
