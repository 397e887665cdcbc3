"""The feature matrix's pipeline row: a pipeline's model step × each placement of that model.

A pipeline calls ordinary models (docs/pipelines.md): hot or cold, with a
fallback, swapped, drained. Each placement (the matrix's five: hot,
cold, promoted, demoted, and hot on pyzmq's socket calls) gets one daemon serving three copies of the test
classifier behind a `decode → resize → normalize → model → classify`
pipeline each: `cls` (with the always-hot fallback `ref`), `cnf` (no
fallback) and `csw` (in the watched engine_dir, for the swap). A fourth
pipeline over `ref` is the reference the others' outputs must equal, as
the model is the same file. Each cell fails if the daemon logged a
traceback or counted a 500 while it ran (support/matrix.py's `cell`).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import zmq

from support import models, tracking
from support.harness import Daemon, dealer
# `cell` (tests/daemon/conftest.py) takes this module's `placed`, and fails a cell on a traceback or a 500.
from support.matrix import MOVES, PLACEMENTS, WITH_WORKER, Placement, placement_daemon, superseded_counted_as_errors
from support.polling import eventually
from support.procfs import nice_values
from support.tracking import every_nth, id_switches, idf1, replay

cv2 = pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from infermux.client import Frame  # noqa: E402
from infermux.pipelines.wire import send_frame  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
CLASSIFIER = REPO / "engines/classifier/1/model.onnx"
every_placement = pytest.mark.parametrize("placed", PLACEMENTS, indirect=True)
pytestmark = pytest.mark.timing  # swaps, restarts and deadlines, like test_matrix's: tests/stress.sh runs it
NICE = 5  # `cls` and its pipeline `pcls` run at a lower CPU priority: served, falling back, as the others
FRAME = cv2.imencode(".png", np.random.default_rng(19).integers(0, 255, (48, 64, 3), dtype=np.uint8))[1].tobytes()

HEAD = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{watched}"
watch_settle_s = 0.4
watch_debounce_s = 0.02
watch_rescan_s = 1.0

[[models]]
name = "ref"
engine = "{classifier}"
"""


def pipeline(name: str, model: str) -> str:
    niced = f"nice = {NICE}\n" if model == "cls" else ""
    return (f'[[pipelines]]\nname = "{name}"\n{niced}[[pipelines.steps]]\nprocessor = "decode"\n'
            '[[pipelines.steps]]\nprocessor = "resize"\noptions = { size = [64, 64] }\n'
            f'[[pipelines.steps]]\nprocessor = "normalize"\n[[pipelines.steps]]\nmodel = "{model}"\n'
            '[[pipelines.steps]]\nprocessor = "classify"\noptions = { k = 3 }\n')


# Tracking and per-track secondary inference: a detector (the brightness map, read by dbnet) and a
# classifier run on each tracked region every 4 frames of its track, both in the watched engine_dir.
TRACKED = tracking.classifying("ptrack", "tcls", "reinfer_every = 4", detector="tdet")
TRACKED_MODELS = ("tdet", "tcls")


def config_text(placement: str, watched: Path) -> str:
    """The models as configured before any move (cold for cold and promoted), and a pipeline each."""
    mode = 'placement = "cold"\npreload = true\n' if placement in ("cold", "promoted") else ""
    text = HEAD.format(watched=watched, classifier=CLASSIFIER)
    text += f'[[models]]\nname = "cls"\nengine = "{CLASSIFIER}"\nfallback = "ref"\nnice = {NICE}\n{mode}'
    text += f'[[models]]\nname = "cnf"\nengine = "{CLASSIFIER}"\n{mode}'
    text += f'[[models]]\nname = "csw"\nengine = "csw/1/model.onnx"\n{mode}'
    text += "".join(f'[[models]]\nname = "{m}"\nengine = "{m}/1/model.onnx"\n{mode}' for m in TRACKED_MODELS)
    return text + "".join(pipeline(f"p{m}", m) for m in ("ref", "cls", "cnf", "csw")) + TRACKED + streamed(watched)


def streamed(watched: Path) -> str:
    """`pstream`: cameras' frames over `cnf`, the newest of each camera kept; its one thread holds each frame
    at the gate processor until the gate file (beside the engine_dir) exists, so what waits is certain."""
    gate = watched.parent / "open"
    return ('[[pipelines]]\nname = "pstream"\nworkers = 1\nqueue_policy = "newest_per_key"\n'
            f'[[pipelines.steps]]\nprocessor = "gate_processor:Gate"\noptions = {{ path = "{gate}" }}\n'
            + pipeline("", "cnf").split("\n", 2)[2])


def publish_version(watched: Path, model: str, version: int) -> None:
    """The classifier (the brightness map for `tdet`) as `model`'s `version`, the documented way:
    built under a hidden name, renamed in."""
    staged = watched / model / f".{version}.tmp"
    staged.mkdir(parents=True)
    if model == "tdet":
        models.brightness_map(staged / "model.onnx")
    else:
        shutil.copyfile(CLASSIFIER, staged / "model.onnx")
    os.rename(staged, watched / model / str(version))


@pytest.fixture(scope="module")
def placed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           engines: Path) -> Iterator[Placement]:
    name = request.param
    workdir = tmp_path_factory.mktemp(f"pipeline-matrix-{name}")
    watched = workdir / "engines"
    for model in ("csw", *TRACKED_MODELS):
        publish_version(watched, model, 1)
    d = placement_daemon(name, workdir, config_text(name, watched))
    try:
        if name in MOVES:
            with d.admin(timeout_s=60) as admin:
                for model in ("cls", "cnf", "csw", *TRACKED_MODELS):
                    admin.call(MOVES[name], model=model)
        yield Placement(name, d, engines, watched)
    finally:
        assert d.stop() == 0, d.log()[-4000:]


@pytest.fixture
def sock(cell: Placement) -> Iterator[zmq.Socket]:
    with dealer(cell.daemon.endpoint) as s:
        yield s


def probs(sock: zmq.Socket, pipe: str, **fields: object) -> tuple[dict, np.ndarray]:
    """A 200 from pipeline `pipe` for FRAME: its header and its model step's probabilities."""
    model = pipe[1:]
    reply = send_frame(sock, pipe, FRAME, "png", outputs=[f"{model}.probs"], **fields)
    assert reply.status == 200, reply.header
    return reply.header, reply.outputs[f"{model}.probs"]


def placement_of(d: Daemon, model: str) -> str:
    with d.admin() as admin:
        return next(m for m in admin.call("models")["models"] if m["name"] == model)["placement"]


def states(d: Daemon, model: str) -> set[str]:
    with d.admin() as admin:
        return {m["state"] for m in admin.call("models")["models"] if m["name"] == model}


# -- the cells, in the order they run on each placement's daemon ------------------------------------


@every_placement
def test_a_pipeline_over_each_placement_computes_what_the_hot_reference_does(cell: Placement,
                                                                           sock: zmq.Socket) -> None:
    assert placement_of(cell.daemon, "cls") == cell.where
    _, expected = probs(sock, "pref")
    for pipe in ("pcls", "pcnf", "pcsw"):
        header, got = probs(sock, pipe)
        assert "fallbacks" not in header, header
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    with cell.daemon.admin() as admin:
        niced = {p["name"]: p["nice"] for p in admin.call("status")["pipelines"]}
    assert niced["pcls"] == NICE and niced["pcnf"] == 0, niced
    assert NICE in nice_values(cell.daemon.proc.pid)  # pcls's threads (and cls's context, where hot)


@every_placement
def test_a_pipeline_over_an_unloaded_model_is_answered_by_its_fallback_and_says_so(
        cell: Placement, sock: zmq.Socket) -> None:
    _, expected = probs(sock, "pref")
    with cell.daemon.admin(timeout_s=60) as admin:
        admin.call("unload", model="cls")
    # Hot, it stays unloaded until `ctl load`; cold, the frame starts its worker again.
    reason = "not_ready" if cell.name in WITH_WORKER else "unloaded"
    reply = send_frame(sock, "pcls", FRAME, "png", outputs=["cls.probs"])
    assert reply.status == 200, reply.header
    assert reply.header["fallbacks"] == [{"step": "cls", "from": "cls", "reason": reason}], reply.header
    np.testing.assert_allclose(reply.outputs["cls.probs"], expected, rtol=1e-5, atol=1e-6)
    if cell.name not in WITH_WORKER:
        with cell.daemon.admin(timeout_s=60) as admin:
            admin.call("load", model="cls")
    eventually(lambda: states(cell.daemon, "cls") == {"ready"}, "cls ready again", 30.0)
    header, _ = probs(sock, "pcls")
    assert "fallbacks" not in header, header


@every_placement
def test_a_pipeline_over_an_unloaded_model_without_fallback_is_a_503_naming_its_step(
        cell: Placement, sock: zmq.Socket) -> None:
    with cell.daemon.admin(timeout_s=60) as admin:
        admin.call("unload", model="cnf")
    reply = send_frame(sock, "pcnf", FRAME, "png")
    assert reply.status == 503 and "step 'cnf'" in reply.header["error"], reply.header
    if cell.name in WITH_WORKER:  # the frame started the worker: a retry after the time given is served
        assert reply.header["retry_after_ms"] > 0
        deadline = time.monotonic() + 30
        while reply.status == 503 and time.monotonic() < deadline:
            time.sleep(min(reply.header["retry_after_ms"], 50) / 1000)
            reply = send_frame(sock, "pcnf", FRAME, "png")
        assert reply.status == 200, reply.header
        return
    assert "ctl load cnf" in reply.header["error"], reply.header
    with cell.daemon.admin(timeout_s=60) as admin:
        admin.call("load", model="cnf")
    probs(sock, "pcnf")


@every_placement
def test_a_pipeline_whose_deadline_passes_in_its_processors_is_a_504(cell: Placement, sock: zmq.Socket) -> None:
    # A 2000x2000 PNG of noise takes tens of ms to decode: decode refuses it against a 1 ms deadline
    # ("the frame's deadline is 0 ms away"), or the deadline has passed by the next step, and the frame
    # goes no further: no step after, the model's included, runs.
    big = cv2.imencode(".png", np.random.default_rng(3).integers(0, 255, (2000, 2000, 3), dtype=np.uint8))[1]
    reply = send_frame(sock, "pcnf", big.tobytes(), "png", timeout_ms=1)
    assert reply.status == 504 and "the frame's deadline" in reply.header["error"], reply.header


@every_placement
def test_a_refused_frame_is_refused_again_from_memory_but_a_late_or_unserved_one_is_computed_again(
        cell: Placement, sock: zmq.Socket) -> None:
    def decode_runs() -> int:
        with cell.daemon.admin() as admin:
            pcls = next(p for p in admin.call("pipelines")["pipelines"] if p["name"] == "pcls")
        return sum(pcls["steps"]["decode"]["by_status"].values())

    before = decode_runs()
    first, again = (send_frame(sock, "pcls", b"\x89PNG not really", "png") for _ in range(2))
    assert first.status == again.status == 400, (first.header, again.header)
    assert "is not computed again for another" in again.header["error"] and decode_runs() == before + 1
    # A 504 (or a model's 503) says nothing of the frame: the same frame with time enough is served.
    big = cv2.imencode(".png", np.random.default_rng(5).integers(0, 255, (2000, 2000, 3), dtype=np.uint8))[1]
    assert send_frame(sock, "pcls", big.tobytes(), "png", timeout_ms=1).status == 504
    reply = send_frame(sock, "pcls", big.tobytes(), "png", timeout_ms=30_000)
    assert reply.status == 200, reply.header


@every_placement
def test_hot_swap_of_a_pipelines_model_loses_no_frame(cell: Placement, sock: zmq.Socket) -> None:
    stop, statuses = threading.Event(), []

    def frames() -> None:
        with zmq.Context.instance().socket(zmq.DEALER) as s:
            s.setsockopt(zmq.LINGER, 0)
            s.connect(cell.daemon.endpoint)
            while not stop.is_set():
                statuses.append(send_frame(s, "pcsw", FRAME, "png").status)

    sender = threading.Thread(target=frames)
    sender.start()
    try:
        publish_version(cell.watched, "csw", 2)
        eventually(lambda: served_by(cell.daemon, "csw", "2") > 0, "version 2 to serve the pipeline", 60,
                   interval_s=0.05)
    finally:
        stop.set()
        sender.join()
    assert statuses and set(statuses) == {200}, sorted(set(statuses))


def served_by(d: Daemon, model: str, version: str) -> int:
    with d.admin() as admin:
        rows = admin.call("models")["models"]
    return sum(m["stats"]["by_status"].get("200", 0) for m in rows
               if (m["name"], m["version"]) == (model, version))


@every_placement
def test_drain_refuses_frames_and_resume_reopens(cell: Placement, sock: zmq.Socket) -> None:
    with cell.daemon.admin() as admin:
        admin.call("drain")
        try:
            reply = send_frame(sock, "pcls", FRAME, "png")
        finally:
            admin.call("resume")
    assert reply.status == 503 and reply.header.get("draining") is True, reply.header
    probs(sock, "pcls")


# -- streams (queue_policy = "newest_per_key"): a superseded frame is a 409, never counted as an error ---


@every_placement
def test_a_camera_s_newer_frame_supersedes_its_waiting_one_and_the_409_is_not_an_error(cell: Placement) -> None:
    d, gate = cell.daemon, cell.watched.parent / "open"
    frame = Frame(FRAME, "png")
    with d.pipeline(timeout_s=60) as pipe:
        held = pipe.submit("pstream", frame, key="held")
        eventually(lambda: gate.with_suffix(".entered").exists(), "the first frame at the gate")
        ids = [pipe.submit("pstream", frame, key=key) for key in ("cam", "cam", "cam2")]
        eventually(lambda: queued(d, "pstream") == 2, "cam's newer frame in place of its older one, and cam2's")
        gate.touch()
        replies = pipe.gather([held, *ids])
    assert [r.status for r in replies] == [200, 409, 200, 200], [r.header for r in replies]
    assert replies[1].superseded_by == ids[1] and "superseded by a newer request of key 'cam'" in replies[1].error
    with d.admin() as admin:
        frames = next(p for p in admin.call("pipelines")["pipelines"] if p["name"] == "pstream")["frames"]
    assert frames["by_status"] == {"200": 3, "409": 1} and frames["error_qps"] == 0, frames
    assert not superseded_counted_as_errors(d)  # the models behind it too (the cell checks it again)


def queued(d: Daemon, name: str) -> int:
    with d.admin() as admin:
        return next(p for p in admin.call("pipelines")["pipelines"] if p["name"] == name)["queued"]


# -- tracking and per-track secondary inference: ptrack, over tdet and tcls -------------------------


def assert_followed(seq: tracking.Sequence, got: tracking.Replay) -> None:
    """Every frame 200, each object one id (IDF1 against what the detector can see), each track's
    answer computed on its 1st, 5th, 9th... frame and reused between."""
    assert set(got.statuses) == {200}, sorted(set(got.statuses))
    truth, predicted = seq.ground_truth(visible_boxes=True), got.predicted()
    assert idf1(truth, predicted).idf1 >= 0.9 and id_switches(truth, predicted) <= 1
    assert not every_nth(got, 4), every_nth(got, 4)


@every_placement
def test_tracking_and_reinference_over_each_placement_follow_their_tracks(cell: Placement,
                                                                          sock: zmq.Socket) -> None:
    assert {placement_of(cell.daemon, m) for m in TRACKED_MODELS} == {cell.where}
    seq = tracking.crossing()
    got = replay(sock, "ptrack", seq, f"placed-{cell.name}")
    assert_followed(seq, got)
    assert got.computed() < sum(len(h["regions"]) for h in got.headers) / 3


@every_placement
def test_hot_swap_of_both_models_keeps_the_tracks_and_their_answers(cell: Placement, sock: zmq.Socket) -> None:
    versions = {m: 1 + max(int(p.name) for p in (cell.watched / m).iterdir() if p.name.isdigit())
                for m in TRACKED_MODELS}

    def swap_midway(i: int) -> None:
        if i == 30:
            for model, version in versions.items():
                publish_version(cell.watched, model, version)
        if i == 60:  # the rest goes to the new versions; the tracks wait (they live 10 s)
            for model, version in versions.items():
                cell.daemon.wait_for(f"swapped model={model} version={version}", 60)
    seq = tracking.crossing()
    got = replay(sock, "ptrack", seq, f"swapped-{cell.name}", before=swap_midway)
    assert_followed(seq, got)  # a swap neither restarts the tracks nor recomputes their answers
    assert served_by(cell.daemon, "tdet", str(versions["tdet"])) >= seq.length - 60
    assert served_by(cell.daemon, "tcls", str(versions["tcls"])) > 0


@every_placement
def test_a_tracked_frame_past_its_deadline_is_a_504_and_its_stream_carries_on(cell: Placement,
                                                                            sock: zmq.Socket) -> None:
    big = cv2.imencode(".png", np.random.default_rng(5).integers(0, 255, (2000, 2000, 3), dtype=np.uint8))[1]
    key, late = f"deadline-{cell.name}", []

    def late_frame(i: int) -> None:
        if i == 30:
            late.append(send_frame(sock, "ptrack", big.tobytes(), "png", timeout_ms=1, key=key))
    seq = tracking.crossing()
    got = replay(sock, "ptrack", seq, key, before=late_frame)
    # Its deadline passes while it is decoded or resized: the step after that is not computed, and the
    # 504 names it (or, past those, the model step that did not answer in time).
    assert late[0].status == 504 and "deadline" in late[0].header["error"], late[0].header
    assert_followed(seq, got)
