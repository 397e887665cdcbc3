"""Text from clients and budgets per stream, against a real daemon: what one key can cost everyone else.

One daemon serves a "detector" (tests/support/models.py's brightness map,
read by `dbnet`) behind a `track` pipeline that keeps four streams, the test
classifier re-inferred per track within `max_calls_per_s`, and a plain model
for keys that come and go. The attacks: a key holding a lone surrogate (it
stopped /metrics for good), keys of 60 KB and keys cycling through `track`
(a log line each, with the whole key), keys that go silent by the hundred (an
event each), and one camera flooding a re-inferred step beside another.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from support import models, tracking  # noqa: E402
from support.harness import REPO, Daemon, dealer, free_port  # noqa: E402
from support.metrics import scrape  # noqa: E402
from support.polling import eventually  # noqa: E402
from support.tracking import classifying, detecting, png  # noqa: E402

from infermux.pipelines.wire import encode_frame, send_frame  # noqa: E402
from infermux.protocol import MAX_KEY_BYTES, decode_reply  # noqa: E402

CLASSIFIER = REPO / "engines/classifier/1/model.onnx"
X4 = np.ones((1, 4), np.float32)


def config_text(engines: Path, metrics_port: int) -> str:
    text = f"""
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"
metrics_port = {metrics_port}
stream_silent_s = 0.5
stream_max_keys = 4096

[[models]]
name = "det"
engine = "det/1/model.onnx"

[[models]]
name = "addone"
engine = "addone/1/model.onnx"

[[models]]
name = "cls"
engine = "{CLASSIFIER}"
max_batch = 32
"""
    text += detecting("tracks").replace('processor = "track"\n', 'processor = "track"\noptions = { max_keys = 4 }\n')
    text += classifying("budget", "cls", "max_calls_per_s = 20")
    return text


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    workdir = tmp_path_factory.mktemp("hostile_text")
    models.brightness_map(workdir / "engines/det/1/model.onnx")
    models.add_one(workdir / "engines/addone/1/model.onnx")
    port = free_port()
    d = Daemon(workdir, config_text(workdir / "engines", port)).start()
    d.metrics_port = port  # type: ignore[attr-defined]
    yield d
    assert d.stop() == 0, d.log()[-4000:]
    assert "Traceback" not in d.log(), d.log()[-6000:]


@pytest.fixture(scope="module")
def frame() -> bytes:
    return png(tracking.crowd().frame(0))


def ctl(daemon: Daemon, *words: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "infermux", "ctl", *words, "--endpoint", daemon.admin_endpoint],
                          capture_output=True, text=True, timeout=60, env=env)


def raw_key(key: str) -> list[bytes]:
    """A frame to `tracks` whose header carries `key` as JSON writes it (a lone surrogate as `\\ud800`)."""
    header, data = encode_frame("tracks", png(tracking.crowd().frame(0)), "png", key="placeholder", id=7)
    fields = json.loads(header)
    fields["key"] = key
    return [json.dumps(fields, ensure_ascii=True).encode(), bytes(data)]


def test_a_key_with_a_lone_surrogate_is_a_400_naming_the_key_and_metrics_keep_answering(daemon: Daemon) -> None:
    with dealer(daemon.endpoint) as sock:
        sock.send_multipart([b"", *raw_key("cam\ud800")])
        assert sock.poll(30_000), "no reply"
        reply = decode_reply(sock.recv_multipart()[1:])
        assert reply.status == 400 and "'key'" in reply.error and "surrogate" in reply.error, reply.header
        assert send_frame(sock, "tracks", png(tracking.crowd().frame(0)), "png", key="cam-ok").status == 200
    for _ in range(2):  # the page renders, and renders again
        samples = scrape(daemon.metrics_port)  # type: ignore[attr-defined]
        assert [name for name in samples if 'key="cam-ok"' in name], [n for n in samples if "stream" in n]
    listed = ctl(daemon, "streams")
    assert listed.returncode == 0 and "tracks/cam-ok" in listed.stdout, listed.stderr


def test_a_key_of_60_kb_is_a_400_naming_the_key_and_its_size(daemon: Daemon, frame: bytes) -> None:
    with dealer(daemon.endpoint) as sock:
        reply = send_frame(sock, "tracks", frame, "png", key="k" * 60_000)
        assert reply.status == 400 and "'key'" in reply.error and f"limit is {MAX_KEY_BYTES}" in reply.error
        assert send_frame(sock, "tracks", frame, "png", key="k" * MAX_KEY_BYTES).status == 200
    assert "k" * 1000 not in daemon.log()


def test_keys_cycling_through_track_log_a_line_an_interval_with_the_key_cut_short(daemon: Daemon,
                                                                                   frame: bytes) -> None:
    before = len(daemon.log())
    with dealer(daemon.endpoint) as sock:
        for n in range(200):  # max_keys = 4: each new key forgets one
            reply = send_frame(sock, "tracks", frame, "png", key=f"{n:04d}" + "c" * (MAX_KEY_BYTES - 4))
            assert reply.status == 200, reply.header
    lines = [line for line in daemon.log()[before:].splitlines() if "forgot" in line]
    assert 1 <= len(lines) <= 2, lines[:4]  # the first, and at most one that sums up an interval's
    assert all(len(line) < 600 for line in lines), lines[0][:800]


@pytest.mark.slow
def test_keys_going_silent_by_the_hundred_raise_a_few_events_and_one_that_counts_the_rest(daemon: Daemon) -> None:
    keys = [f"silent-{n}" for n in range(200)]
    with daemon.client() as client:
        for key in keys:
            for _ in range(2):
                assert client.infer("addone", {"x": X4}, key=key).status == 200

    def silent_events() -> list[dict]:
        with daemon.admin() as admin:
            return admin.call("events", limit=1000, kind="stream_silent")["events"]

    def all_told() -> list[dict]:
        found = silent_events()
        return found if sum(e.get("streams", 1) for e in found) >= len(keys) else []
    # Each interval (10 s) names a few; when it ends, one event counts the streams it did not name.
    found = eventually(all_told, "stream_silent events that name or count every silent key", timeout_s=90)
    named, summed = [e for e in found if "key" in e], [e for e in found if "streams" in e]
    assert summed and len(named) <= 5 * (len(summed) + 1), found
    assert sum(e.get("streams", 1) for e in found) == len(keys), found
    lines = [line for line in daemon.log().splitlines() if "stream_silent" in line]
    assert len(lines) <= 12, lines[:20]


@pytest.mark.slow
def test_a_flooding_key_leaves_another_camera_its_share_of_max_calls_per_s(daemon: Daemon) -> None:
    crowd, victim_seq = tracking.crowd(), tracking.stop_and_go()
    flood_frames = [png(crowd.frame(i)) for i in range(crowd.length)]
    stop = threading.Event()

    def flood() -> None:
        """Four frames in flight at all times, key "flood", as fast as the daemon answers them."""
        with dealer(daemon.endpoint) as sock:
            sent = 0
            for _ in range(4):
                sock.send_multipart([b"", *encode_frame("budget", flood_frames[sent % len(flood_frames)], "png",
                                                         key="flood", id=sent)])
                sent += 1
            while not stop.is_set():
                if sock.poll(1000):
                    sock.recv_multipart()
                    sock.send_multipart([b"", *encode_frame("budget", flood_frames[sent % len(flood_frames)],
                                                             "png", key="flood", id=sent)])
                    sent += 1
    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    headers = []
    try:
        with dealer(daemon.endpoint) as sock:
            send_frame(sock, "budget", flood_frames[0], "png", key="warm-up", timeout_s=60)
            start = time.monotonic()
            for i in range(40):  # a camera at 10 frames a second (its pace, not a wait for an outcome)
                headers.append(send_frame(sock, "budget", png(victim_seq.frame(i)), "png", key="victim",
                                          timeout_s=60).header)
                stop.wait(max(0.0, start + (i + 1) / 10 - time.monotonic()))
            elapsed = time.monotonic() - start
    finally:
        stop.set()
        flooder.join(30)
    victim = tracking.Replay(headers)
    assert set(victim.statuses) == {200}, victim.statuses
    regions = [region for header in victim.headers for region in header["regions"]]
    skipped = sum(1 for region in regions if region.get("skipped"))
    print(f"victim: {victim.computed()} of {len(regions)} regions computed in {elapsed:.1f} s, {skipped} skipped, "
          "beside a flood")
    # Its own share, half of 20 a second while the flood runs: under one shared budget the flood took
    # nearly every token, and the victim's new tracks were skipped.
    assert victim.computed() >= 0.4 * min(len(regions), 10 * elapsed), victim.computed()
    assert victim.computed() >= len(victim.by_track()), (victim.computed(), victim.by_track())
