"""Who may send a stream's key: anyone (`stream_keys = "open"`, the default), or under "bound" the
connection that sent it first, until the key has gone silent (docs/protocol.md#streams).

The attack: another client sends frames with a camera's key. Under newest_per_key its frame replaces
the camera's waiting one, which is answered 409 and never computed. The camera's frame is made to wait
by construction: the pipeline's one thread holds a first frame at a gate (test_streams.py does the same).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from infermux.cli.keygen import make_keypair
from infermux.client import Client, Frame
from infermux.config import ConfigError, parse
from infermux.execution.streams import HOLD_S, StreamTable
from support.clock import Clock
from infermux.transport.curve import client_options
from support.harness import CURVE_HEAD, DAEMON_HEAD, Daemon, free_port
from support.pipelines import gated_pipeline
from support.polling import eventually

FAST = '[[models]]\nname = "fast512"\nengine = "fast512/1/model.onnx"\nqueue_policy = "newest_per_key"\n'
PIXELS = np.full((48, 64, 3), 7, np.uint8).tobytes()
pytestmark = pytest.mark.timing


def head(keys: str) -> str:
    return DAEMON_HEAD + f'stream_keys = "{keys}"\nstream_silent_s = 1\n'


def frame() -> Frame:
    return Frame(PIXELS, "bgr", width=64, height=48)


def streams(d: Daemon) -> dict[str, dict]:
    with d.admin() as admin:
        return {s["key"]: s for s in admin.call("streams", model="cams")["streams"]}


def hijacked_camera(d: Daemon, gate: Path, bound: bool) -> tuple[int, int, int]:
    """The camera's frame of key cam-7 waits behind one held at the gate; meanwhile another client
    sends a frame with key cam-7. The camera's, the other's and the held frame's statuses."""
    with d.pipeline(timeout_s=30) as camera, d.pipeline(timeout_s=30) as other:
        held = camera.submit("cams", frame(), key="held")
        eventually(lambda: gate.with_suffix(".entered").exists(), "the first frame at the gate")
        mine = camera.submit("cams", frame(), key="cam-7")
        eventually(lambda: streams(d).get("cam-7", {}).get("received") == 1, "the camera's frame queued")
        theirs = other.submit("cams", frame(), key="cam-7")
        refused = other.result(theirs).status if bound else None  # answered at once, before the gate opens
        gate.touch()
        return camera.result(mine).status, refused or other.result(theirs).status, camera.result(held).status


def test_under_open_keys_another_client_supersedes_a_camera(make_daemon, tmp_path: Path) -> None:
    gate = tmp_path / "open"
    d = make_daemon(gated_pipeline(gate), head=head("open"))
    # The default: what "bound" is for. The other's frame replaces the camera's, which is never computed.
    assert hijacked_camera(d, gate, bound=False) == (409, 200, 200)


def test_under_bound_keys_another_client_gets_403_and_the_camera_is_served(make_daemon, tmp_path: Path) -> None:
    gate = tmp_path / "open"
    d = make_daemon(gated_pipeline(gate), head=head("bound"))
    assert hijacked_camera(d, gate, bound=True) == (200, 403, 200)
    cam = streams(d)["cam-7"]
    assert (cam["received"], cam["served"], cam["superseded"], cam["foreign"]) == (1, 1, 0, 1), cam


def test_a_bound_key_says_whose_it_is_and_is_free_once_silent(make_daemon) -> None:
    d = make_daemon(FAST, head=head("bound"))
    x = {"x": np.ones((1, 512), np.float32)}
    with d.client() as camera, d.client() as other:
        assert camera.infer("fast512", x, key="cam-7").status == 200
        refused = other.infer("fast512", x, key="cam-7")
        assert refused.status == 403, refused.header
        assert "stream key 'cam-7' of 'fast512' belongs to another client" in refused.error
        assert 'stream_keys = "bound"' in refused.error
        assert other.infer("fast512", x, key="cam-8").status == 200  # a key of its own
        assert camera.infer("fast512", x, key="cam-7").status == 200  # the owner keeps sending
        # Once the camera has sent nothing for stream_silent_s (1 s), the key is anyone's again.
        eventually(lambda: other.infer("fast512", x, key="cam-7").status == 200, "the key freed", timeout_s=30)
        assert camera.infer("fast512", x, key="cam-7").status == 403  # and now the other's
    assert d.stop() == 0


def test_stream_keys_takes_open_or_bound(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"daemon.stream_keys: must be 'open' or 'bound', got 'mine'"):
        parse('[daemon]\nstream_keys = "mine"\n', tmp_path / "infermux.toml")
    assert parse('[daemon]\nstream_keys = "bound"\n', tmp_path / "infermux.toml").daemon.stream_keys == "bound"


def test_a_key_is_held_while_its_holder_sends_and_freed_by_its_silence_alone() -> None:
    clock = Clock(1000.0)
    table = StreamTable(silent_s=2.0, clock=clock)  # type: ignore[arg-type]
    camera, other = (b"cam", b""), (b"other", b"")
    table.receive("m", "cam-7", camera)
    clock.now += 1.5
    assert table.foreign("m", "cam-7", other)  # held: the camera sent 1.5 s ago
    assert not table.foreign("m", "cam-7", camera) and not table.foreign("m", "cam-8", other)
    table.receive("m", "cam-7", camera)
    for _ in range(5):  # the other's refused requests never keep the key held
        clock.now += 0.5
        held = table.foreign("m", "cam-7", other)
    assert not held  # 2.5 s since the camera's last
    table.receive("m", "cam-7", other)
    assert table.foreign("m", "cam-7", camera)  # the other's now
    (view,) = table.view()
    assert (view["received"], view["foreign"]) == (3, 5), view  # 4 of the other's, 1 of the camera's
    table.silent_s = 0  # silence turned off: a key is held HOLD_S
    clock.now += HOLD_S - 0.1
    assert table.foreign("m", "cam-7", camera)
    clock.now += 0.2
    assert not table.foreign("m", "cam-7", camera)


BOUND_OVER_CURVE = CURVE_HEAD + 'stream_keys = "bound"\nstream_silent_s = 30\n'


def test_over_curve_a_key_is_held_by_the_client_key_across_its_connections(make_daemon, tmp_path: Path) -> None:
    root = tmp_path / "keys"
    server_public, _ = make_keypair(root / "server", "server")
    (root / "authorized").mkdir()
    for client in ("alice", "bob"):
        make_keypair(root / client, client)
        shutil.copy(server_public, root / client / "server.key")
        shutil.copy(root / client / f"{client}.key", root / "authorized")
    port = free_port()
    d = make_daemon(FAST, head=BOUND_OVER_CURVE, port=str(port), keys=str(root))
    x = {"x": np.ones((1, 512), np.float32)}

    def send(who: str, key: str) -> int:
        with Client(f"tcp://127.0.0.1:{port}", timeout_s=10, curve=client_options(root / who)) as client:
            return client.infer("fast512", x, key=key).status

    assert send("alice", "cam-7") == 200
    assert send("alice", "cam-7") == 200  # another connection, the same client key: still alice's
    assert send("bob", "cam-7") == 403
    with d.client() as local:  # ipc, no CURVE key: held by its connection, as without CURVE
        assert local.infer("fast512", x, key="cam-7").status == 403
        assert local.infer("fast512", x, key="cam-9").status == 200
    assert send("alice", "cam-9") == 403
    with d.admin() as admin:
        assert "stream_keys = \"bound\" with CURVE" in admin.call("status")["daemon"]["wire"]["detail"]
