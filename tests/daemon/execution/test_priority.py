"""`nice`: a model's contexts and a pipeline's threads run at a lower CPU priority, hot and cold,
and are still served; a reload that changes it makes them anew at the new value."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from support.harness import DAEMON_HEAD
from support.pipelines import camera_pipeline
from support.polling import eventually
from support.procfs import nice_values
from support.workers import worker

pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

MODELS = """
[[models]]
name = "classifier"
engine = "classifier/1/model.onnx"
contexts = 2
nice = {hot_nice}
[[models]]
name = "cold"
engine = "fast512/1/model.onnx"
placement = "cold"
nice = 3
[[models]]
name = "plain"
engine = "fast512/1/model.onnx"
"""
IMAGE = np.zeros((1, 3, 64, 64), np.float32)
ROW = np.ones((1, 512), np.float32)


def config(hot_nice: int) -> str:
    pipeline = camera_pipeline("cams").replace('queue_policy = "newest_per_key"\n',
                                               'queue_policy = "newest_per_key"\nworkers = 3\nnice = 7\n')
    return MODELS.replace("{hot_nice}", str(hot_nice)) + pipeline


def test_contexts_and_pipeline_threads_run_at_their_nice_value_and_are_served(make_daemon) -> None:
    d = make_daemon(config(hot_nice=5))
    with d.client(timeout_s=30) as client:
        for _ in range(20):  # never on the frontend's thread: each on the model's own (niced) ones
            assert client.infer("classifier", {"images": IMAGE}).status == 200
        assert client.infer("plain", {"x": ROW}).status == 200
        eventually(lambda: client.infer("cold", {"x": ROW}).status == 200, "the cold model's worker serving",
                   timeout_s=60)  # the first request starts its worker (503 while it loads)
    daemon_nice = nice_values(d.proc.pid)
    assert daemon_nice.count(5) == 2 and daemon_nice.count(7) == 3, daemon_nice  # 2 contexts, 3 workers
    assert daemon_nice.count(0) == len(daemon_nice) - 5  # the frontend, plain's context, the rest: as started
    worker_pid = worker(d, "cold")["pid"]
    assert set(nice_values(worker_pid)) == {3}, nice_values(worker_pid)  # every thread of the cold model's worker
    with d.admin() as admin:  # each setting where an operator looks
        classifier = next(m for m in admin.call("models")["models"] if m["name"] == "classifier")
        pipeline = next(p for p in admin.call("status")["pipelines"] if p["name"] == "cams")
    assert classifier["stats"]["by_status"].get("200") == 20 and classifier["nice"] == 5 and pipeline["nice"] == 7


def test_a_reload_that_changes_nice_makes_the_contexts_anew_at_the_new_value(make_daemon) -> None:
    d = make_daemon(config(hot_nice=5))
    d.config_path.write_text(d.config_path.read_text().replace("nice = 5", "nice = 12"))
    with d.admin() as admin:
        admin.call("reload")
    eventually(lambda: nice_values(d.proc.pid).count(12) == 2, "two contexts at nice 12", timeout_s=30)
    with d.client(timeout_s=30) as client:
        assert client.infer("classifier", {"images": IMAGE}).status == 200
    eventually(lambda: nice_values(d.proc.pid).count(5) == 0, "the old contexts gone", timeout_s=30)


def test_a_lower_priority_model_batches_and_a_version_published_later_takes_its_priority(
        make_daemon, engines: Path, tmp_path: Path) -> None:
    watched = tmp_path / "watched"
    (watched / "b/1").mkdir(parents=True)
    shutil.copy(engines / "fast512/1/model.onnx", watched / "b/1/model.onnx")
    head = DAEMON_HEAD.replace('engine_dir = "{engines}"', 'engine_dir = "{watched}"') \
        .replace("watch = false", "watch = true\nwatch_settle_s = 0.4")
    d = make_daemon('[[models]]\nname = "b"\nengine = "b/1/model.onnx"\nnice = 4\nmax_batch = 8\n'
                    'batch_delay_us = 50000\n', head=head, watched=str(watched))
    with d.pipeline(timeout_s=30) as pipe:  # eight at once: they wait for each other and run as one call
        replies = pipe.gather([pipe.submit("b", {"x": ROW}) for _ in range(8)])
    assert all(r.status == 200 for r in replies) and max(r.header.get("batch", 0) for r in replies) > 1
    assert nice_values(d.proc.pid).count(4) == 1
    staged = watched / "b/.2.tmp"
    staged.mkdir()
    shutil.copy(watched / "b/1/model.onnx", staged / "model.onnx")
    staged.rename(watched / "b/2")  # published the documented way
    with d.client(timeout_s=30) as client:
        eventually(lambda: client.infer("b", {"x": ROW}).version == "2", "version 2 serving", timeout_s=60)
    # Version 1 stays (the file names it); version 2, found in the folder, runs at the model's nice too.
    eventually(lambda: nice_values(d.proc.pid).count(4) == 2, "version 2's context at nice 4", timeout_s=30)
