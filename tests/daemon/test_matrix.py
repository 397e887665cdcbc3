"""The feature-combination matrix: each placement of a model version × each behaviour that touches it.

Placements: `hot` (in the daemon), `cold` (`placement = "cold"`, in a
worker process), `promoted` (configured cold, moved hot live by admin
`promote`) and `demoted` (configured hot, moved cold live by admin
`demote`). Each placement gets one real daemon (module-scoped, so the
cells share it), serving one model per behaviour with the settings that
behaviour needs; a cell that changes state changes only its own model, and
drain/resume, the one daemon-wide cell, reopens intake whatever happens.

Each cell checks the status and outputs docs/ documents,
outputs against onnxruntime run here on the same engine file, and that the
daemon logged no traceback and counted no 500 while it ran
(docs/matrix.md has the table). A condition a cell relies on is made
certain by construction: a queue is filled by a burst the frontend reads in
microseconds behind requests that compute for tens of milliseconds, a
deadline of 5 ms waits behind such a compute, a worker is stopped with
SIGSTOP before the requests it is to hold are sent.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import onnxruntime as ort
import pytest

from support.harness import Daemon
from infermux.client import Pipeline, Reply, SharedMemory
from infermux.frontend.pacing import FIRST_HOLD_S
from support.matrix import MOVES, PLACEMENTS, WITH_WORKER, Placement, placement_daemon
from support.polling import eventually
from support.procfs import nice_values
from support.publish import PROBE, publish, wait_served
from support.traffic import Traffic
from support.workers import until_200, worker

# Every cell takes every placement, so that pytest runs each placement's cells together on one daemon;
# the cells that kill or stop a worker exist only for the two placements that have one.
every_placement = pytest.mark.parametrize("placed", PLACEMENTS, indirect=True)
worker_placements = pytest.mark.parametrize("placed", WITH_WORKER, indirect=True)
# Bursts that fill queues and deadlines that wait behind computes: tests/stress.sh runs the matrix.
pytestmark = pytest.mark.timing

RNG = np.random.default_rng(16)
ROW = RNG.random((1, 512), dtype=np.float32)  # one row: quick through any model
SLAB = RNG.random((64, 512), dtype=np.float32)  # 128 KB: a worker takes it through a shared-memory slot
HEAVY = RNG.random((256, 512), dtype=np.float32)  # tens of ms through SLOW: a burst of them is read before one is done
LONG = RNG.random((400, 512), dtype=np.float32)  # longer still: what a 5 ms deadline waits behind
X4 = PROBE  # for the 4-wide add-one models

SLOW, IDENTITY = "slow/1/model.onnx", "fast512/1/model.onnx"  # in conftest's `engines`
BATCH_DELAY_US = 8_000_000  # a batch that waited this long was not sent by its preferred size
STREAMS = 'queue_policy = "newest_per_key"\n'
NICE = 10  # nc's: its context threads run at a lower CPU priority

# A candidate mirrors whatever the CPUs' idle time, which a shared 2-core test box seldom has
# (test_rollout.py tests that gate).
SPARE = "min_idle_cpu = 0\n"
# Every version a placement serves (name, version, engine, settings), one model per behaviour.
PLACED = [
    ("nr", "1", SLOW, 'fallback = "fb"\n'),
    ("slowfb", "1", SLOW, 'fallback = "fb"\nmax_queue = 4\ntimeout_ms = 20000\n'),
    ("slow", "1", SLOW, "max_queue = 4\ntimeout_ms = 20000\n"),
    ("bt", "1", SLOW, f"max_batch = 64\nbatch_delay_us = {BATCH_DELAY_US}\npreferred_batch = [32]\n"
                      "timeout_ms = 60000\n"),
    ("wt", "1", "addone/1/model.onnx", 'strategy = "weighted"\n'),
    ("wt", "2", "addone/2/model.onnx", 'strategy = "weighted"\n'),
    ("hs", "1", "addone/1/model.onnx", 'strategy = "hash"\ncontexts = 2\n'),
    ("hs", "2", "addone/2/model.onnx", 'strategy = "hash"\ncontexts = 2\n'),
    ("sm", "1", SLOW, ""),
    ("nc", "1", SLOW, f'nice = {NICE}\nfallback = "fb"\nmax_queue = 4\ntimeout_ms = 20000\n'),
    ("ob", "1", SLOW, ""),  # replies over max_reply_bytes
    ("ex", "1", IDENTITY, ""),  # plain and quick: the express lane takes its repeated requests where it is hot
    ("sw", "1", "sw/1/model.onnx", ""),  # relative: in the watched engine_dir, where the swap publishes
    ("ov", "1", "ov/1/model.onnx", ""),  # live changes: also in the watched engine_dir (a new version inherits)
    # A published version of these is a candidate first (docs/hot-swap.md#shadow-rollout).
    ("cd", "1", "cd/1/model.onnx", "[models.rollout]\nshadow_requests = 1000000\n" + SPARE),  # promote-now decides
    ("cr", "1", "cr/1/model.onnx", "[models.rollout]\nshadow_requests = 8\n" + SPARE),
    ("cs", "1", "cs/1/model.onnx", "[models.rollout]\nshadow_requests = 1000000\n" + SPARE),  # superseded, removed
    # The rollout row: its versions' life meets reload, a swap, a move, a refusal and a rollback by removal.
    ("ro", "1", "ro/1/model.onnx", "[models.rollout]\nshadow_requests = 5\nmax_latency_ratio = 0\n" + SPARE),
    ("kl", "1", SLOW, "max_queue = 16\ntimeout_ms = 20000\n"),  # SIGKILL: only where a worker serves it
    ("hg", "1", IDENTITY, 'fallback = "fb"\n'),  # SIGSTOP: only where a worker serves it
    # Streams (queue_policy newest_per_key), one model per behaviour they meet.
    ("st", "1", SLOW, f"{STREAMS}timeout_ms = 20000\n"),
    ("sb", "1", SLOW, f"{STREAMS}max_batch = 64\nbatch_delay_us = 20000\ntimeout_ms = 20000\n"),
    ("sf", "1", SLOW, f'{STREAMS}fallback = "fb"\nmax_queue = 2\ntimeout_ms = 20000\n'),
    ("so", "1", SLOW, f"{STREAMS}max_queue = 2\ntimeout_ms = 20000\n"),
    ("ss", "1", "ss/1/model.onnx", f"{STREAMS}timeout_ms = 20000\n"),  # in the watched engine_dir: swapped
]
WORKER_ONLY = ("kl", "hg")
WATCHED = ("sw", "ov", "cd", "cr", "cs", "ro")  # served from the watched engine_dir, where new versions are published
# Always hot: the fallback of nr and slowfb (y = x, so a stand-in's outputs are its inputs).
FALLBACK = f'[[models]]\nname = "fb"\nengine = "{{engines}}/{IDENTITY}"\nmax_queue = 256\n'

HEAD = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{watched}"
max_message_bytes = 8388608
max_reply_bytes = 7340032
oversize_memory_s = 60
watch_settle_s = 0.4
watch_debounce_s = 0.02
watch_rescan_s = 1.0

[routing]
version_mismatch = "fallback"
"""


def engine_of(placed: Placement, model: str, version: str = "1") -> Path:
    """The engine file `model` (and `version`) is served from."""
    if model in (*WATCHED, "ss"):  # the swap, live-change, rollout and stream-swap cells publish a version 2
        return placed.watched / model / version / "model.onnx"
    if model == "fb":
        return placed.engines / IDENTITY
    return placed.engines / next(e for n, v, e, _ in PLACED if (n, v) == (model, version))


def config_text(placement: str, engines: Path, watched: Path) -> str:
    """HEAD, the fallback, and PLACED as configured before any move: cold for cold and promoted."""
    mode = 'placement = "cold"\npreload = true\n' if placement in ("cold", "promoted") else ""
    text = HEAD.format(watched=watched) + FALLBACK.format(engines=engines)
    for name, version, engine, settings in PLACED:
        if name in WORKER_ONLY and placement not in WITH_WORKER:
            continue
        path = engine if name in (*WATCHED, "ss") else f"{engines}/{engine}"
        text += f'[[models]]\nname = "{name}"\nversion = "{version}"\nengine = "{path}"\n{mode}{settings}'
    return text


@pytest.fixture(scope="module")
def placed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           engines: Path) -> Iterator[Placement]:
    """A daemon serving PLACED in one placement (`request.param`), moved live where the placement says."""
    name = request.param
    workdir = tmp_path_factory.mktemp(f"matrix-{name}")
    watched = workdir / "engines"
    for model in WATCHED:
        publish(watched, model, 1, offset=1, width=512 if model == "ov" else 4)
    publish_copy(engines / SLOW, watched, "ss", 1)
    d = placement_daemon(name, workdir, config_text(name, engines, watched))
    try:
        move_all(d, name)
        yield Placement(name, d, engines, watched)
    finally:
        assert d.stop() == 0, d.log()[-4000:]


def move_all(d: Daemon, placement: str) -> None:
    """Move every version but the fallback's live, as `placement` says (promoted, demoted)."""
    if placement not in MOVES:
        return
    with d.admin(timeout_s=60) as admin:
        for model in admin.call("models")["models"]:
            if model["name"] != "fb":
                admin.call(MOVES[placement], model=model["name"], version=model["version"])


def publish_copy(source: Path, root: Path, model: str, version: int) -> Path:
    """`source` published as `model` version `version` the documented way (a folder renamed into place)."""
    staged = root / model / f".{version}.tmp"
    staged.mkdir(parents=True)
    shutil.copyfile(source, staged / "model.onnx")
    final = root / model / str(version)
    os.rename(staged, final)
    return final / "model.onnx"


@lru_cache(maxsize=None)
def _session(path: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # the daemon's CPUs are the box's too
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def computed(path: Path, x: np.ndarray) -> np.ndarray:
    """What onnxruntime gives for `x` on `path` (every model here maps input "x" to output "y")."""
    return _session(str(path)).run(["y"], {"x": x})[0]


def assert_served(reply: Reply, placed: Placement, model: str, x: np.ndarray, version: str = "1") -> None:
    """200 from `model` (`version`) with the outputs onnxruntime computes for `x`."""
    assert reply.status == 200, reply.header
    assert (reply.model, reply.version) == (model, version), reply.header
    np.testing.assert_allclose(reply.outputs["y"], computed(engine_of(placed, model, version), x), rtol=1e-4, atol=1e-5)


def late_behind_a_long_compute(placed: Placement, model: str) -> Reply:
    """A 5 ms request sent right behind three LONG ones to `model` (one context, max_queue = 4).

    It is computed in time only if all three were done before the frontend read it; their 200s
    are checked, its reply returned."""
    with placed.daemon.pipeline(timeout_s=30) as pipe:
        # A long deadline for the three: on a busy box one of them could otherwise wait past the
        # model's default and go to the fallback itself.
        first = [pipe.submit(model, {"x": LONG}, timeout_ms=60_000) for _ in range(3)]
        late = pipe.submit(model, {"x": ROW}, timeout_ms=5)
        *done, reply = pipe.gather([*first, late])
    for reply_to_long in done:
        assert_served(reply_to_long, placed, model, LONG)
    return reply


# -- the cells, in the order they run on each placement's daemon ------------------------------------


@every_placement
def test_serves_what_onnxruntime_computes(cell: Placement) -> None:
    d = cell.daemon
    with d.admin() as admin:
        views = {(v["name"], v["version"]): v for v in admin.call("models")["models"]}
    with d.client() as client:
        for name, version, _, _ in PLACED:
            if (name, version) not in views:
                continue  # kl: worker placements only
            assert views[(name, version)]["placement"] == cell.where, views[(name, version)]
            x = X4 if name in ("wt", "hs", *WATCHED) and name != "ov" else SLAB  # ov: 512 wide, as its fallback fb
            assert_served(client.infer(name, {"x": x}, version=version), cell, name, x, version)


@every_placement
def test_fallback_when_not_ready(cell: Placement) -> None:
    with cell.daemon.admin() as admin:
        admin.call("unload", model="nr")  # cold: the worker stops; the next request starts it again
    with cell.daemon.client() as client:
        reply = client.infer("nr", {"x": SLAB})
    # Hot, it stays unloaded until `ctl load`: the fallback says so. Cold, the request starts it again.
    reason = "not_ready" if cell.name in WITH_WORKER else "unloaded"
    assert reply.fallback == {"from": "nr", "reason": reason}, reply.header
    assert_served(reply, cell, "fb", SLAB)
    if cell.name in WITH_WORKER:
        return
    with cell.daemon.admin() as admin:
        admin.call("set", model="nr", fallback="")
        with cell.daemon.client() as client:
            alone = client.infer("nr", {"x": SLAB})
        admin.call("set", model="nr", fallback="fb")
    assert alone.status == 503 and "does not come back by itself" in alone.error, alone.header
    assert "ctl load nr" in alone.error and "no fallback" in alone.error


def assert_a_full_queue_falls_back(cell: Placement, model: str) -> None:
    """24 HEAVY in a burst to `model` (max_queue = 4, fallback fb): some 200 from it, the rest from fb."""
    # At most 4 queued and 1 running: 24 in a burst find it full unless 19 of them are computed
    # while the frontend reads the burst. Those it refuses cost the fallback's copy alone.
    with cell.daemon.pipeline(timeout_s=30) as pipe:
        replies = pipe.gather([pipe.submit(model, {"x": HEAVY}) for _ in range(24)])
    served = [r for r in replies if r.model == model]
    stand_ins = [r for r in replies if r.model != model]
    assert served and stand_ins, [r.header for r in replies]
    for reply in served:
        assert reply.fallback is None
        assert_served(reply, cell, model, HEAVY)
    for reply in stand_ins:
        assert reply.fallback == {"from": model, "reason": "queue_full"}, reply.header
        assert_served(reply, cell, "fb", HEAVY)


def assert_a_late_request_falls_back(cell: Placement, model: str) -> None:
    """A 5 ms request to `model` (fallback fb) behind three long computes: fb's answer, `reason: deadline`."""
    stand_in = late_behind_a_long_compute(cell, model)
    assert stand_in.fallback == {"from": model, "reason": "deadline"}, stand_in.header
    if stand_in.status == 504:  # it keeps its 5 ms: a box busy enough can make the stand-in late too
        assert "waiting for model 'fb'" in stand_in.error, stand_in.header
    else:
        assert_served(stand_in, cell, "fb", ROW)


@every_placement
def test_fallback_when_the_queue_is_full(cell: Placement) -> None:
    assert_a_full_queue_falls_back(cell, "slowfb")


@every_placement
def test_fallback_when_the_deadline_would_pass(cell: Placement) -> None:
    assert_a_late_request_falls_back(cell, "slowfb")


@every_placement
def test_fallback_to_the_default_for_an_unknown_version(cell: Placement) -> None:
    with cell.daemon.client() as client:
        reply = client.infer("sm", {"x": SLAB}, version="9")
    assert reply.fallback == {"from": "sm", "reason": "version", "version": "9"}, reply.header
    assert_served(reply, cell, "sm", SLAB)


def flood_then_camera(cell: Placement) -> tuple[list[Reply], Reply, Reply]:
    """32 HEAVY requests from key "flood", one more ROW from it, then one ROW from key "camera",
    pipelined on one connection to `slow` (max_queue = 4): the flood's, its last and the camera's replies."""
    with cell.daemon.pipeline(timeout_s=30) as pipe:
        flood = [pipe.submit("slow", {"x": HEAVY}, key="flood") for _ in range(32)]
        same_key = pipe.submit("slow", {"x": ROW}, key="flood")
        camera = pipe.submit("slow", {"x": ROW}, key="camera")
        replies = {r.header["id"]: r for r in pipe.replies()}
    return [replies[i] for i in flood], replies[same_key], replies[camera]


@every_placement
def test_429_pushes_out_the_newest_request_of_the_key_holding_most(cell: Placement) -> None:
    if cell.where == "cold":
        # A cold version's queued requests are already in its worker and are not taken back
        # (docs/workers.md): a full queue answers 429 with a retry time to every key alike. As on
        # the hot path below, a compute that ends while the flood's last requests are read frees a
        # slot for them, so the scenario runs until the camera found the queue full (at most 3 times).
        for _ in range(3):
            flood, same_key, camera = flood_then_camera(cell)
            for reply, x in [*((r, HEAVY) for r in flood), (same_key, ROW), (camera, ROW)]:
                assert "holds the most" not in (reply.error or ""), reply.header  # nothing was pushed out
                if reply.status == 200:
                    assert_served(reply, cell, "slow", x)
                else:
                    assert reply.status == 429 and "queue is full" in reply.error, reply.header
                    assert reply.retry_after_ms >= 1, reply.header
            if camera.status == 429:
                break
        assert camera.status == 429, camera.header
        return
    # The flood fills the queue while the frontend reads it; the camera's request finds it full unless
    # a compute ended in the moment between reading the flood's last request and the camera's (a box
    # that deschedules the frontend there), which frees a slot and leaves nothing to push out. So the
    # scenario runs until the camera found the queue full, at most three times: a daemon that admits a
    # request past max_queue without pushing one out never gets there.
    for _ in range(3):
        flood, same_key, camera = flood_then_camera(cell)
        assert_served(camera, cell, "slow", ROW)  # into a free slot, or by pushing the flood's newest out
        for reply in flood:
            if reply.status != 429:
                assert_served(reply, cell, "slow", HEAVY)
        pushed = [r for r in flood if "holds the most" in (r.error or "")]
        if pushed:
            break
    assert len(pushed) == 1 and pushed[0].status == 429 and pushed[0].retry_after_ms >= 1, pushed
    assert same_key.status == 429 and "queue is full" in same_key.error, same_key.header
    assert "holds the most" not in same_key.error and same_key.retry_after_ms >= 1, same_key.header
    # At least max_queue - 1 of the flood: 4 queued (one pushed out), or 3 if none had started yet.
    assert sum(r.status == 200 for r in flood) >= 3


@every_placement
def test_preferred_batch_sizes_go_at_once_and_follow_a_reload(cell: Placement) -> None:
    # 16-row requests through the slow model: too long for the frontend to compute (inline.py), so
    # the context's batcher gathers them and only a preferred size sends a batch before 8 s.
    d = cell.daemon
    inputs = [RNG.random((16, 512), dtype=np.float32) for _ in range(5)]

    def batched(xs: list[np.ndarray], rows: int) -> None:
        with d.pipeline(timeout_s=30) as pipe:
            replies = pipe.gather([pipe.submit("bt", {"x": x}) for x in xs])
        for x, reply in zip(xs, replies):
            assert_served(reply, cell, "bt", x)
            assert reply.header.get("batch") == rows, reply.header
            assert reply.header["timing_us"]["queue"] < BATCH_DELAY_US, "waited out the delay: not preferred"

    batched(inputs[:2], 32)
    text = d.config_path.read_text()
    d.config_path.write_text(text.replace("preferred_batch = [32]", "preferred_batch = [48]"))
    with d.admin() as admin:
        assert admin.call("reload")["changes"]["changed"] == ["bt:1 ['preferred_batch']"]
    batched(inputs[2:], 48)


@every_placement
def test_weighted_routing_follows_the_weights(cell: Placement) -> None:
    with cell.daemon.admin() as admin, cell.daemon.pipeline() as pipe, cell.daemon.client() as client:
        for weights, version in (({"1": 1, "2": 0}, "1"), ({"1": 0, "2": 1}, "2")):
            admin.call("set", model="wt", weights=weights)
            for reply in pipe.gather([pipe.submit("wt", {"x": X4}) for _ in range(20)]):
                assert_served(reply, cell, "wt", X4, version)
        assert_served(client.infer("wt", {"x": X4}, version="1"), cell, "wt", X4, "1")  # named: never split


@every_placement
def test_hash_routing_keeps_each_key_on_one_version(cell: Placement) -> None:
    homes = {}
    with cell.daemon.pipeline() as pipe:
        for key in (f"cam-{i}" for i in range(12)):
            replies = pipe.gather([pipe.submit("hs", {"x": X4}, key=key) for _ in range(3)])
            homes[key] = replies[0].version
            for reply in replies:
                assert_served(reply, cell, "hs", X4, homes[key])
    assert set(homes.values()) == {"1", "2"}, homes  # these 12 keys land on both versions' ring points


@every_placement
def test_504_when_the_deadline_passes_without_a_fallback(cell: Placement) -> None:
    late = late_behind_a_long_compute(cell, "slow")
    assert late.status == 504 and "not computed" in late.error, late.header
    with cell.daemon.client() as client:
        assert_served(client.infer("slow", {"x": ROW}), cell, "slow", ROW)


def assert_regions_served(cell: Placement, model: str) -> None:
    """Requests to `model` with inputs and outputs in a shared-memory region, then an output in a frame."""
    d = cell.daemon
    with d.client() as client, SharedMemory.beside(d.endpoint, 1 << 20, f"matrix-{cell.name}-{model}") as shm:
        x = shm.ndarray(SLAB.shape, "float32")
        y = shm.ndarray(SLAB.shape, "float32", offset=x.nbytes)
        for k in (1, 2, 3):  # a worker learns the outputs' shapes once, then computes into place
            x[:] = SLAB * k  # the client rewrites its region between requests, as a camera would
            y[:] = -1
            reply = client.infer(model, {"x": shm.ref(x)}, output_regions={"y": shm.ref(y)})
            assert_served(reply, cell, model, x.copy())
            assert "region" in reply.header["outputs"][0], reply.header
            np.testing.assert_allclose(y, computed(engine_of(cell, model), x.copy()), rtol=1e-4, atol=1e-5)
        framed = client.infer(model, {"x": shm.ref(x)})  # the input in the region, the output in a frame
        assert_served(framed, cell, model, x.copy())
        assert "region" not in framed.header["outputs"][0]


@every_placement
def test_inputs_and_outputs_in_a_shared_memory_region(cell: Placement) -> None:
    assert_regions_served(cell, "sm")


@every_placement
def test_a_model_at_a_lower_cpu_priority_runs_niced_and_falls_back_and_serves_regions_as_any(
        cell: Placement) -> None:
    # nc: `nice = NICE`, SLOW, fallback fb, max_queue 4: its one context thread in the daemon, or every thread
    # of its worker process, runs at that nice value; it is served, overflows and misses deadlines as slowfb does.
    d = cell.daemon
    with d.client(timeout_s=30) as client:
        assert_served(client.infer("nc", {"x": SLAB}), cell, "nc", SLAB)  # cold: starts an idle worker again
    pid = d.proc.pid if cell.where == "hot" else worker(d, "nc")["pid"]
    if cell.where == "hot":
        eventually(lambda: nice_values(pid).count(NICE) == 1, f"one thread at nice {NICE} (its one context)")
    else:
        eventually(lambda: set(nice_values(pid)) == {NICE}, f"every thread of its worker at nice {NICE}")
    assert_a_full_queue_falls_back(cell, "nc")
    assert_a_late_request_falls_back(cell, "nc")
    assert_regions_served(cell, "nc")


@every_placement
def test_hot_swap_of_a_new_version_loses_no_request(cell: Placement) -> None:
    d, replies, errors, stop = cell.daemon, [], [], threading.Event()

    def load() -> None:
        try:
            with d.client() as client:
                while not stop.is_set():
                    replies.append(client.infer("sw", {"x": X4}))
        except Exception as exc:  # reported below: a thread's exception would vanish
            errors.append(exc)

    thread = threading.Thread(target=load)
    thread.start()
    try:
        publish(cell.watched, "sw", 2, offset=2)
        wait_served(d, "sw", "2", offset=2, timeout=30)
        taken = lane_served(d)  # hot: v2 (hot too) takes the express lane once its acceptance is learnt
        eventually(lambda: lane_served(d) > taken if cell.name == "hot" else True, "the lane to serve v2", 30)
    finally:
        stop.set()
        thread.join()
    assert not errors and replies, errors
    for reply in replies:
        assert_served(reply, cell, "sw", X4, reply.version or "")
    with d.client() as client:  # the configured version stays while its file does
        assert_served(client.infer("sw", {"x": X4}, version="1"), cell, "sw", X4, "1")


def lane_served(d: Daemon) -> int:
    """Requests the express lane answered so far (express.py); it is on where the compiled calls run."""
    with d.admin() as admin:
        return admin.call("status")["daemon"]["express"]["served"]


LANE = ("hot", "promoted")  # where a plain request to a version in the daemon meets the compiled calls


@every_placement
def test_the_express_lane_answers_a_hot_models_repeated_requests_as_onnxruntime_computes(cell: Placement) -> None:
    # hot, promoted: the lane takes them once the layout and its acceptance are learnt (the inline
    # gate may send some down the general path on a busy box); cold, demoted: the version is in a
    # worker, so none; pyzmq: no lane without the compiled calls.
    d = cell.daemon
    with d.admin() as admin:
        assert admin.call("status")["daemon"]["express"]["on"] is (cell.name != "pyzmq")
    before = lane_served(d)
    with d.client() as client:
        replies = [client.infer("ex", {"x": ROW}) for _ in range(30)]
    for reply in replies:
        assert_served(reply, cell, "ex", ROW)
    taken = lane_served(d) - before
    assert (taken > 0) if cell.name in LANE else (taken == 0), taken


def row(d: Daemon, model: str, version: str) -> dict:
    with d.admin() as admin:
        return next((m for m in admin.call("models")["models"] if (m["name"], m["version"]) == (model, version)), {})


@every_placement
def test_a_candidate_shadows_then_serves_from_its_configured_placement(cell: Placement) -> None:
    d = cell.daemon
    with Traffic(d, "cd") as traffic:
        publish(cell.watched, "cd", 2, offset=1)  # the same answers: it passes
        eventually(lambda: row(d, "cd", "2").get("state") == "candidate", "the candidate", 30)
        with d.admin() as admin, d.client() as client:
            weights = admin.call("set", check=False, model="cd", weights={"2": 1})
            # Moving, pinning or unloading it would act on an engine that has not earned its traffic.
            acted = [admin.call(cmd, check=False, model="cd", version="2") for cmd in ("promote", "demote", "pin",
                                                                                       "unload")]
            named = client.infer("cd", {"x": X4}, version="2")  # no version 2 serves yet
            try:
                assert admin.call("drain")["accepting"] is False
                refused = client.infer("cd", {"x": X4})
            finally:
                admin.call("resume")
        eventually(lambda: row(d, "cd", "2").get("rollout", {}).get("compared", 0) >= 3, "comparisons", 60)
        with d.admin() as admin:
            admin.call("promote-now", model="cd", version="2")
        wait_served(d, "cd", "2", offset=1, timeout=30)
        traffic.saw("2")
    assert not weights["ok"] and "no version '2'" in weights["error"]
    for reply in acted:
        assert not reply["ok"] and "cd:2 is a candidate" in reply["error"] and "promote-now cd 2" in reply["error"]
    assert named.status == 200 and named.version == "1" and named.header["fallback"]["reason"] == "version"
    assert refused.status == 503 and "draining" in refused.error
    assert traffic.replies
    served = [r.version for r in traffic.replies if r.status == 200]
    assert "2" in served and set(served[:served.index("2")]) == {"1"} and set(served[served.index("2"):]) == {"2"}
    for reply, x in traffic.sent:
        assert reply.status in (200, 503), reply.header  # 503 only while drained
        if reply.status == 200:
            assert_served(reply, cell, "cd", x, reply.version or "")
    # A published version loads as configured: cold in the promoted row, hot in the demoted one.
    assert row(d, "cd", "2")["placement"] == ("cold" if cell.name in ("cold", "promoted") else "hot")


@every_placement
def test_a_pin_holds_back_a_candidate_and_a_refused_one_leaves_the_serving_version(cell: Placement) -> None:
    d = cell.daemon
    with d.admin() as admin:
        admin.call("pin", model="cr", version="1")
        publish(cell.watched, "cr", 2, offset=5)  # answers otherwise
        d.wait_for('detected model=cr version=2 file=model.onnx bytes=', 30)
        assert not row(d, "cr", "2")  # no candidate while pinned
        with Traffic(d, "cr") as traffic:
            admin.call("unpin", model="cr")
            d.wait_for("rollout_failed model=cr version=2", 60)
    assert traffic.replies
    for reply, x in traffic.sent:
        assert reply.status == 200 and reply.version == "1", reply.header
        assert_served(reply, cell, "cr", x)
    refused = row(d, "cr", "2")
    assert refused["state"] == "failed" and "rollout failed" in refused["reason"]
    wait_served(d, "cr", "1", offset=1)


@every_placement
def test_a_newer_version_supersedes_a_candidate_and_removing_its_file_cancels_it(cell: Placement) -> None:
    d = cell.daemon
    with Traffic(d, "cs") as traffic:
        publish(cell.watched, "cs", 2, offset=5)  # answers otherwise: it would be refused, were it decided
        d.wait_for("rollout_started model=cs version=2", 30)
        publish(cell.watched, "cs", 3, offset=5)
        d.wait_for("rollout_started model=cs version=3", 30)
        d.wait_for('rollout_cancelled model=cs version=2 reason="superseded by version 3"', 30)
        shutil.rmtree(cell.watched / "cs" / "3")
        d.wait_for('rollout_cancelled model=cs version=3 reason="its engine file was removed"', 30)
        # Version 2 was never judged: with 3 gone it is the newest again, and a candidate again.
        eventually(lambda: row(d, "cs", "2").get("state") == "candidate", "version 2 a candidate again", 30)
    assert not row(d, "cs", "3")
    assert traffic.replies
    for reply, x in traffic.sent:
        assert reply.status == 200 and reply.version == "1", reply.header
        assert_served(reply, cell, "cs", x)


def listed_once(d: Daemon, model: str) -> dict[str, tuple[str, str]]:
    """version -> (state, reason) of `model` as the admin `models` reply (what `status` shows) lists it,
    checking that each version is listed once and that a refused one says why."""
    with d.admin() as admin:
        rows = [(m["version"], m["state"], m["reason"]) for m in admin.call("models")["models"] if m["name"] == model]
    assert len(rows) == len({v for v, _, _ in rows}), rows
    assert all(reason for _, state, reason in rows if state == "failed"), rows
    return {v: (state, reason) for v, state, reason in rows}


def reload_shadow_requests(d: Daemon, old: int, new: int) -> int:
    """A reload that changes the rollout model's `shadow_requests` from `old` to `new`, once the daemon said
    so; the daemon log's length before it (where to look for what the reload did)."""
    mark = len(d.log())
    d.config_path.write_text(d.config_path.read_text().replace(f"shadow_requests = {old}\n",
                                                               f"shadow_requests = {new}\n"))
    with d.admin() as admin:
        assert admin.call("reload")["ok"]
    d.wait_for('reloaded changed="ro:1', 30, since=mark)
    return mark


@every_placement
def test_a_rollout_keeps_a_serving_version_through_reload_swap_move_refusal_and_rollback(cell: Placement) -> None:
    """The rollout row: under traffic, v2 (the same answers) passes and serves, is moved as the placement moves
    versions, v3 (other answers) is refused, v2's folder is removed (a rollback), and a reload changes the
    model's rollout settings: every reply is a 200 (no 404, 500 or 503 from a switch), and the versions are
    listed once each, with their state and reason."""
    d = cell.daemon
    with Traffic(d, "ro") as traffic:
        publish(cell.watched, "ro", 2, offset=1)
        d.wait_for("rollout_passed model=ro version=2", 60)
        traffic.saw("2")
        if cell.name in MOVES:  # v2 loaded as configured: moved as this placement's versions were
            with d.admin() as admin:
                admin.call(MOVES[cell.name], model="ro", version="2")
        assert listed_once(d, "ro")["2"][0] == "ready"
        # A reload changing the model's rollout table while v2 serves: v2 takes the new settings as it serves,
        # and standing in for the refused v3 under them it is neither loaded again nor a candidate of itself.
        mark = reload_shadow_requests(d, 5, 6)
        wait_served(d, "ro", "2", offset=1, timeout=30)
        publish(cell.watched, "ro", 3, offset=5)  # answers otherwise: refused, v2 stays
        d.wait_for("rollout_failed model=ro version=3", 60)
        eventually(lambda: listed_once(d, "ro").get("3", ("", ""))[0] == "failed", "v3 listed refused", 30)
        d.wait_for("settled model=ro version=2", 30, since=mark)  # v2 stands in for v3, under the new settings
        wait_served(d, "ro", "2", offset=1, timeout=30)
        assert "rollout_started model=ro version=2" not in d.log()[mark:], d.log()[mark:]
        if cell.name in MOVES:  # the operator's move held through the new settings and the stand-in
            with d.admin() as admin:
                (placed,) = [m["placement"] for m in admin.call("models")["models"] if (m["name"], m["version"]) ==
                             ("ro", "2")]
            assert placed == ("hot" if MOVES[cell.name] == "promote" else "cold"), placed
        shutil.rmtree(cell.watched / "ro" / "2")  # a rollback by removal: v1 serves again at once
        wait_served(d, "ro", "1", offset=1, timeout=30)
        # A second reload changing it, v1 serving again: its own file under new settings is nothing to judge,
        # so it never shadows itself (and is never listed twice, serving and candidate).
        mark = reload_shadow_requests(d, 6, 7)
        wait_served(d, "ro", "1", offset=1, timeout=30)
        assert "rollout_started model=ro version=1" not in d.log()[mark:], d.log()[mark:]
        sent = len(traffic.replies)
        eventually(lambda: len(traffic.replies) > sent + 5, "requests after the rollback", 30)
    assert traffic.replies
    wrong = sorted({(r.status, r.error) for r in traffic.replies if r.status != 200})
    assert not wrong, wrong
    for reply, x in traffic.sent:  # v1 and v2 both add one (v2's file is gone: onnxruntime cannot be asked)
        assert reply.version in ("1", "2"), reply.header
        np.testing.assert_allclose(reply.outputs["y"], x + 1, rtol=1e-5, atol=1e-6)
    rows = listed_once(d, "ro")
    assert rows["1"][0] == "ready" and rows["3"][0] == "failed" and "rollout failed" in rows["3"][1], rows
    assert "2" not in rows or rows["2"][0] in ("unloaded", "draining"), rows


# 7.2 MiB in and out of SLOW: within max_message_bytes (8 MiB), its reply over max_reply_bytes (7 MiB).
OVER = RNG.random((3700, 512), dtype=np.float32)


@every_placement
def test_a_reply_over_max_reply_bytes_is_413_and_the_next_like_it_is_refused_without_computing(cell: Placement) -> None:
    def computed_200(admin) -> int:
        return next(m for m in admin.call("models")["models"] if m["name"] == "ob")["stats"]["by_status"].get("200", 0)

    with cell.daemon.client(timeout_s=30) as client, cell.daemon.admin() as admin:
        before = computed_200(admin)
        first = client.infer("ob", {"x": OVER})
        assert first.status == 413 and "(max_reply_bytes)" in first.error and "it was computed" in first.error, \
            first.header
        asked = time.monotonic()
        again = client.infer("ob", {"x": OVER})
        held_s = time.monotonic() - asked
        assert again.status == 413 and again.error.startswith("refused without computing it"), again.header
        assert held_s >= FIRST_HOLD_S, held_s  # held back: sent at once, it could only be earned again
        assert_served(client.infer("ob", {"x": SLAB}), cell, "ob", SLAB)  # other shapes: computed
        assert computed_200(admin) - before == 2  # the one over (its outputs dropped) and SLAB's


@every_placement
def test_drain_answers_what_it_accepted_and_resume_reopens(cell: Placement) -> None:
    # Intake closes for every model until `resume`, which runs whatever happens.
    d = cell.daemon
    with d.pipeline(timeout_s=30) as pipe, d.admin() as admin, d.client() as client:
        accepted = pipe.submit("slow", {"x": LONG})
        barrier = pipe.submit("fb", {"x": ROW})  # read after `accepted` on the same connection
        assert pipe.result(barrier).status == 200  # so `accepted` was admitted before the drain
        try:
            assert admin.call("drain")["accepting"] is False
            refused = client.infer("slow", {"x": ROW})
        finally:
            admin.call("resume")
        served = client.infer("slow", {"x": ROW})
        done = pipe.result(accepted)
    assert refused.status == 503 and "draining" in refused.error and refused.retry_after_ms, refused.header
    assert_served(done, cell, "slow", LONG)
    assert_served(served, cell, "slow", ROW)


@worker_placements
def test_sigkill_of_the_worker_answers_what_it_held_and_the_next_restarts_it(cell: Placement) -> None:
    d = cell.daemon
    pid = worker(d, "kl")["pid"]
    os.kill(pid, signal.SIGSTOP)  # it holds every request sent from now on, and answers none
    killed = False
    try:
        with d.pipeline(timeout_s=30) as pipe:
            ids = [pipe.submit("kl", {"x": SLAB}) for _ in range(4)]
            eventually(lambda: worker(d, "kl")["in_flight"] == 4, "the worker holding all four")
            os.kill(pid, signal.SIGKILL)
            killed = True
            racing = [pipe.submit("kl", {"x": SLAB}) for _ in range(4)]  # before or after the daemon notices
            held, restarting = pipe.gather(ids), pipe.gather(racing)
    finally:
        if not killed:
            os.kill(pid, signal.SIGCONT)
    for reply in held:
        assert reply.status == 503 and reply.model == "kl", reply.header
        assert "crashed (killed by SIGKILL)" in reply.error and reply.retry_after_ms >= 100, reply.header
    for reply in restarting:  # answered by the crash, or finding the version restarting (or restarted)
        if reply.status != 200:
            assert reply.status == 503 and reply.retry_after_ms, reply.header
        else:
            assert_served(reply, cell, "kl", SLAB)
    with d.client() as client:
        assert_served(until_200(client, "kl", SLAB), cell, "kl", SLAB)  # 503s while it restarts, then 200
    assert worker(d, "kl")["pid"] != pid


@worker_placements
def test_a_stopped_workers_requests_get_the_fallback_at_their_deadline(cell: Placement) -> None:
    d = cell.daemon
    pid = worker(d, "hg")["pid"]
    os.kill(pid, signal.SIGSTOP)  # it holds every request sent from now on, and answers none
    try:
        with d.pipeline(timeout_s=30) as pipe:
            replies = pipe.gather([pipe.submit("hg", {"x": ROW}, timeout_ms=300) for _ in range(3)])
        assert worker(d, "hg")["pid"] == pid  # answered at the deadline, not after worker_hang_s's kill (503)
    finally:
        os.kill(pid, signal.SIGCONT)
    for reply in replies:
        assert reply.fallback == {"from": "hg", "reason": "deadline"}, reply.header
        assert_served(reply, cell, "fb", ROW)
    eventually(lambda: worker(d, "hg")["expired"] == 0, "no expired request left")  # the resumed worker's late answers: dropped
    with d.client() as client:
        assert_served(client.infer("hg", {"x": ROW}), cell, "hg", ROW)


# -- live changes (ctl set) where they meet a reload, a move, a new version and a restart -----------

LIVE = {"contexts": 2, "timeout_ms": 3000, "max_batch": 4}


def settings_of(d: Daemon, model: str, version: str) -> dict:
    with d.admin() as admin:
        return next(m for m in admin.call("models")["models"] if (m["name"], m["version"]) == (model, version))


def assert_live(d: Daemon, model: str, version: str, placement: str) -> None:
    """`version` of `model` serves with LIVE and the fallback set live, each marked as a live change."""
    row = settings_of(d, model, version)
    assert {k: row[k] for k in LIVE} == LIVE and row["fallback"] == "fb" and row["placement"] == placement, row
    assert set(row["overrides"]) >= {*LIVE, "fallback"}, row["overrides"]


@every_placement
def test_live_changes_hold_across_a_reload_a_move_and_a_new_version(cell: Placement) -> None:
    d = cell.daemon
    other = "cold" if cell.where == "hot" else "hot"
    with d.admin(timeout_s=60) as admin:
        admin.call("set", model="ov", version="1", fallback="fb", **LIVE)
        changes = admin.call("reload")["changes"]
        assert not any(changes.values()), changes  # the unchanged file changes nothing, live changes included
        assert_live(d, "ov", "1", cell.where)
        for move, placement in ((MOVES["demoted" if cell.where == "hot" else "promoted"], other),
                                (MOVES["promoted" if cell.where == "hot" else "demoted"], cell.where)):
            admin.call(move, model="ov", version="1")
            assert_live(d, "ov", "1", placement)
    publish(cell.watched, "ov", 2, offset=2, width=512)  # takes version 1's live settings
    eventually(lambda: _ready(d, "ov", "2"), "ov:2 ready", 30)
    configured = "cold" if cell.name in ("cold", "promoted") else "hot"  # a move is no setting: the file's placement
    assert_live(d, "ov", "2", configured)
    with d.client() as client:
        assert_served(client.infer("ov", {"x": ROW}), cell, "ov", ROW, "2")


def _ready(d: Daemon, model: str, version: str) -> bool:
    with d.admin() as admin:
        return any((m["name"], m["version"], m["state"]) == (model, version, "ready")
                   for m in admin.call("models")["models"])


@every_placement
def test_live_changes_survive_a_restart(cell: Placement) -> None:
    # Last on each placement's daemon: it restarts it, then moves every version again as the placement says.
    d = cell.daemon
    with d.admin() as admin:
        admin.call("set", model="sm", timeout_ms=4321)
        admin.call("set", model="wt", weights={"1": 1, "2": 0})
    assert d.stop() == 0, d.log()[-4000:]
    d.start()
    move_all(d, cell.name)
    row = settings_of(d, "sm", "1")
    assert row["timeout_ms"] == 4321 and row["overrides"]["timeout_ms"] == {"live": 4321, "file": 1000}, row
    assert row["placement"] == cell.where
    with d.pipeline() as pipe:
        replies = pipe.gather([pipe.submit("wt", {"x": X4}) for _ in range(20)])
    assert {r.version for r in replies} == {"1"}, [r.header for r in replies][:2]
    with d.admin() as admin:
        for model in ("sm", "wt"):
            admin.call("reset", model=model)
    assert settings_of(d, "sm", "1")["timeout_ms"] == 1000


# -- streams (queue_policy = "newest_per_key"): a superseded request is a 409, never a 500, never lost ------

HUGE = RNG.random((3200, 512), dtype=np.float32)  # ~100 ms through SLOW: the frames sent behind it all queue


def behind_a_long_compute(placed: Placement, model: str, *frames: tuple[str, np.ndarray, int | None]) -> list[Reply]:
    """A HUGE request without a key to `model` (one context), then `frames` ((key, x, timeout_ms)) in
    the same burst, all queued while it computes: their replies (the HUGE one's 200 is checked)."""
    def send(pipe: Pipeline) -> list[int]:
        return [pipe.submit(model, {"x": x}, key=key, timeout_ms=ms or 20_000) for key, x, ms in frames]
    return _behind(placed, model, send)


def behind_a_held_compute(placed: Placement, model: str, *frames: tuple[str, np.ndarray]) -> list[Reply]:
    """As behind_a_long_compute, but what the queue holds is certain even where max_queue is small: hot,
    the frames go once the daemon computes the first request (so it is not in the queue); cold, its
    worker is stopped until the daemon has admitted them all (the daemon bounds what it sent there,
    and the worker's own queue takes all it is given)."""
    d = placed.daemon

    def send(pipe: Pipeline) -> list[int]:
        if placed.where != "cold":
            eventually(lambda: computing(d, model), f"{model} computing the first request", interval_s=0.002)
        return [pipe.submit(model, {"x": x}, key=key) for key, x in frames]
    return _behind(placed, model, send, hold_worker=placed.where == "cold")


def _behind(placed: Placement, model: str, send: Callable[[Pipeline], list[int]],
            hold_worker: bool = False) -> list[Reply]:
    """HUGE to `model`, then `send`'s frames, then a barrier to the always-hot `fb` on the same
    connection: its reply means the daemon admitted every frame (it reads a connection in order).

    A burst read only after HUGE was done (a box so busy that reading a few frames took longer than
    HUGE's compute) tests nothing: HUGE's reply then comes before the barrier's (replies leave in the
    order they are made) and the burst is sent again. With `hold_worker` the worker is stopped until
    the barrier's reply, which makes it certain."""
    d = placed.daemon
    for _ in range(5):
        pid = worker(d, model)["pid"] if hold_worker else 0
        if pid:
            os.kill(pid, signal.SIGSTOP)
        try:
            with d.pipeline(timeout_s=30) as pipe:
                blocker = pipe.submit(model, {"x": HUGE})
                ids = send(pipe)
                barrier = pipe.submit("fb", {"x": ROW})
                arrived: dict[int, Reply] = {}
                for reply in pipe.replies():
                    arrived[reply.header.get("id")] = reply
                    if reply.header.get("id") == barrier and pid:
                        os.kill(pid, signal.SIGCONT)
                        pid = 0
        finally:
            if pid:
                os.kill(pid, signal.SIGCONT)
        assert arrived[barrier].status == 200, arrived[barrier].header
        assert_served(arrived[blocker], placed, model, HUGE)
        order = list(arrived)
        if order.index(barrier) < order.index(blocker):
            return [arrived[i] for i in ids]
    pytest.fail("the box was too busy: five bursts in a row were read only after a ~100 ms compute was done")


def computing(d: Daemon, model: str) -> bool:
    with d.admin() as admin:
        view = next(v for v in admin.call("models")["models"] if v["name"] == model)
    return view["in_flight"] >= 1 and view["queue_depth"] == 0


def assert_superseded(reply: Reply, by: Reply, model: str) -> None:
    assert reply.status == 409 and reply.superseded_by == by.header["id"], reply.header
    assert "superseded by a newer request of key" in reply.error and reply.model == model, reply.header


@every_placement
def test_a_stream_s_newer_frame_supersedes_its_queued_one(cell: Placement) -> None:
    older, newer, other = behind_a_long_compute(cell, "st", ("cam", SLAB, None), ("cam", SLAB * 2, None),
                                                ("cam2", SLAB * 3, None))
    assert_superseded(older, newer, "st")
    assert_served(newer, cell, "st", SLAB * 2)
    assert_served(other, cell, "st", SLAB * 3)


@every_placement
def test_a_stream_s_newest_frames_still_batch(cell: Placement) -> None:
    # The HUGE request is over max_batch (64 rows): it runs alone, and the frames wait behind it.
    x = [RNG.random((16, 512), dtype=np.float32) for _ in range(3)]
    older, newer, other = behind_a_long_compute(cell, "sb", ("cam", x[0], None), ("cam", x[1], None),
                                                ("cam2", x[2], None))
    assert_superseded(older, newer, "sb")
    for reply, xs in ((newer, x[1]), (other, x[2])):
        assert_served(reply, cell, "sb", xs)
        assert reply.header.get("batch") == 32, reply.header  # the two newest frames in one call


@every_placement
def test_a_superseded_frame_is_not_sent_to_the_fallback(cell: Placement) -> None:
    # max_queue = 2: cam's and cam2's frames fill it; cam's next replaces its own (no 429, no fallback),
    # cam3's finds it full and goes to the fallback.
    older, other, newer, full = behind_a_held_compute(cell, "sf", ("cam", SLAB), ("cam2", SLAB * 2),
                                                      ("cam", SLAB * 3), ("cam3", SLAB * 4))
    assert_superseded(older, newer, "sf")
    assert older.fallback is None, older.header
    assert_served(other, cell, "sf", SLAB * 2)
    assert_served(newer, cell, "sf", SLAB * 3)
    assert full.fallback == {"from": "sf", "reason": "queue_full"}, full.header
    assert_served(full, cell, "fb", SLAB * 4)


@every_placement
def test_a_full_queue_takes_a_stream_s_newer_frame_and_refuses_a_new_stream(cell: Placement) -> None:
    older, other, newer, full = behind_a_held_compute(cell, "so", ("cam", SLAB), ("cam2", SLAB * 2),
                                                      ("cam", SLAB * 3), ("cam3", SLAB * 4))
    assert_superseded(older, newer, "so")
    assert_served(other, cell, "so", SLAB * 2)
    assert_served(newer, cell, "so", SLAB * 3)
    assert full.status == 429 and "queue is full" in full.error and full.retry_after_ms >= 1, full.header


@every_placement
def test_a_superseded_frame_is_a_409_not_a_504_and_deadlines_still_hold(cell: Placement) -> None:
    for _ in range(5):
        older, newer, late = behind_a_long_compute(cell, "st", ("cam", ROW, 5), ("cam", ROW * 2, None),
                                                   ("cam2", ROW, 5))
        assert_superseded(older, newer, "st")
        assert_served(newer, cell, "st", ROW * 2)
        if late.status == 200 and late.header["timing_us"]["queue"] < 5000:
            continue  # computed within its 5 ms: a busy box read the burst late in HUGE's compute; again
        assert late.status == 504 and "not computed" in late.error, late.header
        return
    pytest.fail("the box was too busy: five bursts in a row were read within 5 ms of the end of HUGE's compute")


@every_placement
def test_streams_through_a_hot_swap_lose_no_frame(cell: Placement) -> None:
    d, bursts, errors, stop = cell.daemon, [], [], threading.Event()

    def stream() -> None:  # bursts of a LONG frame and two more of one camera: the third replaces the second
        try:
            with d.pipeline(timeout_s=30) as pipe:
                while not stop.is_set():
                    ids = [pipe.submit("ss", {"x": x}, key="cam") for x in (LONG, SLAB, SLAB * 2)]
                    bursts.append(pipe.gather(ids))
        except Exception as exc:  # reported below: a thread's exception would vanish
            errors.append(exc)

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        publish_copy(cell.engines / SLOW, cell.watched, "ss", 2)
        eventually(lambda: any(r.version == "2" for burst in bursts[-2:] for r in burst), "version 2 serving", 30)
    finally:
        stop.set()
        thread.join()
    assert not errors and bursts, errors
    for burst in bursts:  # every frame answered: served, or replaced by a later frame of the burst
        later = [r.header["id"] for r in burst]
        for i, (reply, x) in enumerate(zip(burst, (LONG, SLAB, SLAB * 2))):
            if reply.status == 409:
                assert reply.superseded_by in later[i + 1:], reply.header
                assert_superseded(reply, next(r for r in burst if r.header["id"] == reply.superseded_by), "ss")
            else:
                assert_served(reply, cell, "ss", x, reply.version or "")
        assert burst[2].status == 200  # the newest frame is never replaced
    assert any(r.status == 409 for burst in bursts for r in burst)


@every_placement
def test_drain_answers_a_stream_s_queued_frames_and_refuses_its_next(cell: Placement) -> None:
    d = cell.daemon
    for _ in range(5):  # until a burst is read while HUGE computes (as in _behind)
        with d.pipeline(timeout_s=30) as pipe, d.admin() as admin, d.client() as client:
            blocker = pipe.submit("st", {"x": HUGE})
            older, newer = (pipe.submit("st", {"x": x}, key="cam") for x in (SLAB, SLAB * 2))
            barrier = pipe.submit("fb", {"x": ROW})  # read after the others on the same connection
            arrived: dict[int, Reply] = {}
            while barrier not in arrived:
                reply = pipe.next_reply()
                arrived[reply.header.get("id")] = reply
            assert arrived[barrier].status == 200  # so they were admitted before the drain
            in_time = blocker not in arrived
            try:
                assert admin.call("drain")["accepting"] is False  # returns once the queue is done
                refused = client.infer("st", {"x": ROW}, key="cam")
            finally:
                admin.call("resume")
            arrived.update((r.header.get("id"), r) for r in pipe.replies())
        if in_time:
            break
    else:
        pytest.fail("the box was too busy: five bursts in a row were read only after a ~100 ms compute was done")
    assert_served(arrived[blocker], cell, "st", HUGE)
    assert_superseded(arrived[older], arrived[newer], "st")
    assert_served(arrived[newer], cell, "st", SLAB * 2)
    assert refused.status == 503 and "draining" in refused.error, refused.header
