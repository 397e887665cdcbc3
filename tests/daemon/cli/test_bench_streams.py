"""`infermux bench` against a real daemon: it drives a pipeline (closed loop, frames), and with
`--streams N --fps F` open-loop streams, whose table and JSON agree with what the daemon counted."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Iterator

import numpy as np
import pytest

from support.harness import Daemon
from support.pipelines import camera_pipeline

cv2 = pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

CONFIG = """
[[models]]
name = "classifier"
engine = "classifier/1/model.onnx"
[[models]]
name = "slow"
engine = "slower/1/model.onnx"
queue_policy = "newest_per_key"
timeout_ms = 20000
"""


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, engines) -> Iterator[Daemon]:
    from support.harness import DAEMON_HEAD

    daemon = Daemon(tmp_path_factory.mktemp("bench-streams"), (DAEMON_HEAD + CONFIG + camera_pipeline("cams")).format(engines=engines)).start()
    yield daemon
    daemon.stop()


def bench(d: Daemon, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infermux", "bench", *argv, "-c", str(d.config_path),
                           "--runtime-dir", str(d.run_dir)], capture_output=True, text=True, timeout=120)


def streams(d: Daemon, model: str) -> dict[str, dict]:
    with d.admin() as admin:
        return {s["key"]: s for s in admin.call("streams", model=model)["streams"]}


def test_bench_drives_a_pipeline_with_generated_frames_or_an_image(d: Daemon, tmp_path) -> None:
    proc = bench(d, "cams", "-n", "30", "--warmup", "5", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["by_status"] == {"200": 30}
    png = tmp_path / "page.png"
    png.write_bytes(cv2.imencode(".png", np.full((40, 60, 3), 128, np.uint8))[1].tobytes())
    proc = bench(d, "cams", "--image", str(png), "-n", "10", "--warmup", "0", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["ok"] == 10, proc.stderr


def test_open_loop_streams_are_counted_per_stream_as_the_daemon_counts_them(d: Daemon) -> None:
    proc = bench(d, "cams", "--streams", "3", "--fps", "10", "--duration", "1.5", "--key-prefix", "cam", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["streams"], result["fps"]) == (3, 10.0)
    counted = streams(d, "cams")
    for row in result["per_stream"]:
        # 15 due in 1.5 s; a sender that fell behind on a busy box stops on time with one or two fewer
        assert 13 <= row["sent"] <= 15 and row["unanswered"] == 0 and row["other"] == 0, row
        assert row["served"] + row["superseded"] + row["refused"] == row["sent"]
        daemon = counted[row["key"]]
        assert (daemon["received"], daemon["served"], daemon["superseded"], daemon["refused"]) == \
            (row["sent"], row["served"], row["superseded"], row["refused"])
        assert row["age_ms"]["p50"] is not None and row["fps_sent"] == pytest.approx(10, rel=0.2)


def test_streams_past_what_a_model_serves_are_superseded_not_refused(d: Daemon) -> None:
    x = "x=" + str(d.workdir / "x.npy")
    np.save(d.workdir / "x.npy", np.ones((200, 512), np.float32))  # ~25 ms each through the slower model
    proc = bench(d, "slow", "--input", x, "--streams", "4", "--fps", "40", "--duration", "2")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # the seconds it took to send them: 2.0 or a little more on a busy box
    assert re.fullmatch(r"slow: 4 streams at 40 fps each for \d+\.\d s \(open loop\)", lines[0]), lines[0]
    assert lines[1].split()[:6] == ["STREAM", "SENT", "FPS", "SENT", "FPS", "SERVED"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"stream-0", "stream-1", "stream-2", "stream-3", "all"}
    sent, served, superseded, refused = (int(v) for v in (rows["all"][1], rows["all"][4], rows["all"][5], rows["all"][6]))
    assert 300 <= sent <= 320 and superseded > 0 and refused == 0 and served + superseded == sent


def test_duration_stops_the_streams_on_time_even_when_the_sender_falls_behind(d: Daemon) -> None:
    # 2 x 5000 frames a second is more than one Python thread sends on a busy box: the old fixed count
    # (10,000 frames) ran for several times --duration.
    proc = bench(d, "cams", "--streams", "2", "--fps", "5000", "--duration", "1", "--size", "64x48",
                 "--key-prefix", "fast", "--json")
    result = json.loads(proc.stdout)
    assert result["duration_s"] <= 1.3, result["duration_s"]  # the sending, measured by bench itself
    counted = streams(d, "cams")
    for row in result["per_stream"]:
        assert 0 < row["sent"] <= 5000 and row["unanswered"] == 0, row
        assert counted[row["key"]]["received"] == row["sent"], (row, counted[row["key"]])


def test_bench_says_what_is_wrong_in_one_line(d: Daemon) -> None:
    proc = bench(d, "cams", "--streams", "2", "--fps", "0", "--duration", "1")
    assert proc.returncode == 2 and "must be positive" in proc.stderr and "Traceback" not in proc.stderr
    proc = bench(d, "cams", "--size", "big", "-n", "1")
    assert proc.returncode == 2 and "--size 'big': expected WxH" in proc.stderr
