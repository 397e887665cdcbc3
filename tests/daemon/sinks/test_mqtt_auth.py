"""The mqtt sink's TLS and credentials against a real Mosquitto that requires both (no daemon: the sinks' hub,
as the daemon runs it, in this process).

The broker listens with TLS (a CA and a server certificate the test makes)
and a password file (`mosquitto_passwd`); the sink trusts the CA and reads
its user and password from a credentials file. The right ones deliver;
a wrong password leaves the sink down with the broker's refusal as its
last error and the events waiting.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("paho.mqtt", reason="the mqtt sink needs paho-mqtt: pip install -e '.[mqtt]'")

from support.sinks import Mosquitto, self_signed, waiting  # noqa: E402

from infermux.events import EventLog  # noqa: E402
from infermux.pipelines.lifecycle import IDS  # noqa: E402
from infermux.config import SinkConfig  # noqa: E402
from infermux.sinks.hub import Hub  # noqa: E402


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Mosquitto, Path]]:
    folder = tmp_path_factory.mktemp("mqtt_auth")
    mosquitto = Mosquitto(folder / "broker")
    ca, cert, key = self_signed(folder)
    passwords = folder / "passwords"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(passwords), "infermux", "right horse"], check=True,
                   capture_output=True)
    mosquitto.conf.write_text(
        f"listener {mosquitto.port} 127.0.0.1\nallow_anonymous false\npassword_file {passwords}\n"
        f"cafile {ca}\ncertfile {cert}\nkeyfile {key}\npersistence false\n"
        + "".join(line + "\n" for line in mosquitto.conf.read_text().splitlines() if line.startswith("user ")))
    yield mosquitto.start(), ca
    mosquitto.stop()


def hub_for(broker: Mosquitto, ca: Path, folder: Path, password: str) -> Hub:
    credentials = folder / "credentials"
    credentials.write_text(f"infermux:{password}\n")
    credentials.chmod(0o600)
    sink = SinkConfig("secure", "mqtt", {"host": "127.0.0.1", "port": broker.port, "tls": True, "ca_file": str(ca),
                                         "credentials_file": str(credentials), "ack_timeout_s": 3},
                      retry_s=0.1, max_retry_s=0.5)
    return Hub((sink,), folder / "state", EventLog())


def event(n: int) -> dict[str, Any]:
    return {"id": IDS.new(), "type": "new", "time": 1.0, "pipeline": "p", "key": "cam", "track_id": n, "label": None,
            "score": 0.9, "box": [[0, 0], [1, 0], [1, 1], [0, 1]], "first_seen": 1.0, "last_seen": 1.0, "frames": 1,
            "zones": [], "captured": False}


def test_the_right_credentials_over_tls_deliver(broker: tuple[Mosquitto, Path], tmp_path: Path) -> None:
    mosquitto, ca = broker
    hub = hub_for(mosquitto, ca, tmp_path, "right horse")
    sent = [event(i + 1) for i in range(5)]
    for one in sent:
        hub.publish("p", one)
    view = waiting(lambda: (lambda s: s if s["delivered"] == 5 else None)(hub.view()[0]), "five delivered")
    assert view["state"] == "up" and view["backlog"] == 0
    hub.stop()


def test_a_wrong_password_leaves_the_sink_down_with_the_brokers_refusal(broker: tuple[Mosquitto, Path],
                                                                        tmp_path: Path) -> None:
    mosquitto, ca = broker
    hub = hub_for(mosquitto, ca, tmp_path, "wrong horse")
    hub.publish("p", event(1))
    view = waiting(lambda: (lambda s: s if s["state"] == "down" else None)(hub.view()[0]), "the sink down")
    assert "did not accept" in view["last_error"] and "uthori" in view["last_error"], view
    assert view["backlog"] == 1 and view["delivered"] == 0
    hub.stop()
