"""The feature matrix's in-process cells: a pipeline's model step keeps every policy a client's request gets.

A model step hands its arrays to the model's placement from the pipeline's
own thread (daemon/pipelines/calls.py). Each cell here runs one policy
through a pipeline, hot and cold, and asserts both what a client would see
and that the step took the in-process path: the pipeline's statistics
count each model step's calls by the way they went (`calls`: in_process,
computed_here, via_frontend). The models: `m`, the test classifier (plain,
max_batch 1), `ref`, the same always hot (the fallback), and copies of
`heavy`, a classifier-shaped chain of matmuls that takes milliseconds a row,
each with the setting its cell is about.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import zmq
from onnx import TensorProto, helper, numpy_helper

from support.harness import Daemon, dealer
# `cell` (tests/daemon/conftest.py) takes this module's `placed`, and fails a cell on a traceback or a 500.
from support.matrix import Placement, placement_daemon
from support.polling import eventually

cv2 = pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from infermux.pipelines.wire import send_frame  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
CLASSIFIER = REPO / "engines/classifier/1/model.onnx"
PLACES = ("hot", "cold")
in_both = pytest.mark.parametrize("placed", PLACES, indirect=True)
pytestmark = pytest.mark.timing  # batching waits and deadlines: tests/stress.sh runs it
FRAME = cv2.imencode(".png", np.random.default_rng(23).integers(0, 255, (48, 64, 3), dtype=np.uint8))[1].tobytes()
LONG = np.random.default_rng(29).random((256, 3, 64, 64), dtype=np.float32)  # seconds through `heavy`
ONE = LONG[:1]

HEAD = """
[daemon]
listen = ["ipc://infer.sock"]

[[models]]
name = "ref"
engine = "{classifier}"
"""
HEAVY = {  # model -> its settings: one per policy
    "mb": "max_batch = 2\nbatch_delay_us = 2000000\ntimeout_ms = 20000\n",
    "md": "max_queue = 8\ntimeout_ms = 20000\n",
    "mo": "max_queue = 1\ntimeout_ms = 20000\n",
    "mf": 'max_queue = 1\nfallback = "ref"\ntimeout_ms = 20000\n',
    "mst": "timeout_ms = 20000\n",
}


def heavy(path: Path, layers: int = 800, width: int = 512) -> Path:
    """The classifier's input ("images", [N,3,64,64]) through a chain of [width,width] matmuls."""
    rng = np.random.default_rng(0)
    w0 = numpy_helper.from_array((rng.standard_normal((3 * 64 * 64, width)) / 110).astype(np.float32), "w0")
    w = numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), "w")
    nodes = [helper.make_node("Flatten", ["images"], ["flat"], axis=1),
             helper.make_node("MatMul", ["flat", "w0"], ["h0"])]
    for i in range(layers):
        nodes.append(helper.make_node("MatMul", [f"h{i}", "w"], ["y" if i == layers - 1 else f"h{i + 1}"]))
    graph = helper.make_graph(nodes, "heavy", [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                                             ["N", 3, 64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])], [w0, w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def pipeline(name: str, model: str, extra: str = "") -> str:
    return (f'[[pipelines]]\nname = "{name}"\n{extra}[[pipelines.steps]]\nprocessor = "decode"\n'
            '[[pipelines.steps]]\nprocessor = "resize"\noptions = { size = [64, 64] }\n'
            f'[[pipelines.steps]]\nprocessor = "normalize"\n[[pipelines.steps]]\nmodel = "{model}"\n')


def config_text(placement: str, workdir: Path) -> str:
    mode = 'placement = "cold"\npreload = true\n' if placement == "cold" else ""
    engine = heavy(workdir / "heavy.onnx")
    text = HEAD.format(classifier=CLASSIFIER)
    text += f'[[models]]\nname = "m"\nengine = "{CLASSIFIER}"\n{mode}'
    text += "".join(f'[[models]]\nname = "{m}"\nengine = "{engine}"\n{settings}{mode}' for m, settings in HEAVY.items())
    text += pipeline("pm", "m") + "".join(pipeline(f"p{m}", m) for m in ("mb", "md", "mo", "mf"))
    return text + pipeline("pst", "mst", 'queue_policy = "newest_per_key"\nworkers = 1\n')


@pytest.fixture(scope="module")
def placed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           engines: Path) -> Iterator[Placement]:
    name = request.param
    workdir = tmp_path_factory.mktemp(f"pipeline-steps-{name}")
    d = placement_daemon(name, workdir, config_text(name, workdir))
    try:
        yield Placement(name, d, engines, workdir)
    finally:
        assert d.stop() == 0, d.log()[-4000:]


@pytest.fixture
def sock(cell: Placement) -> Iterator[zmq.Socket]:
    with dealer(cell.daemon.endpoint) as s:
        yield s


def calls(d: Daemon, pipe: str, step: str) -> dict[str, int]:
    """How pipeline `pipe`'s model step `step` has been called so far, by the way each call went."""
    with d.admin() as admin:
        view = next(p for p in admin.call("pipelines")["pipelines"] if p["name"] == pipe)
    return view["steps"][step].get("calls", {"in_process": 0, "computed_here": 0, "via_frontend": 0})


def busy(d: Daemon, model: str) -> tuple[int, int]:
    """(running, queued or running) of `model`'s requests (a cold one's as its worker's last heartbeat said)."""
    with d.admin() as admin:
        view = next(m for m in admin.call("models")["models"] if m["name"] == model)
    return int(view["in_flight"]), int(view["queue_depth"] + view["in_flight"])


class Longs:
    """`n` LONG requests to `model` on their own connection, gathered on exit. Each is sent once the one
    before is held, the first running: sent at once, both could reach a `max_queue = 1` model before its
    context took the first, and the second would be refused instead of queued."""

    def __init__(self, d: Daemon, model: str, n: int) -> None:
        self._d, self._model, self._n = d, model, n

    def __enter__(self) -> "Longs":
        self._pipe = self._d.pipeline(timeout_s=60).__enter__()
        self._sent = []
        for i in range(1, self._n + 1):
            self._sent.append(self._pipe.submit(self._model, {"images": LONG}, timeout_ms=60_000))
            eventually(lambda i=i: (held := busy(self._d, self._model))[0] >= 1 and held[1] >= i,
                       f"{i} long request(s) in {self._model}, one running", 30)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            replies = self._pipe.gather(self._sent)
            assert all(r.status == 200 for r in replies), [r.header for r in replies]
        finally:
            self._pipe.__exit__(None, None, None)


# -- the cells ------------------------------------------------------------------------------------------


@in_both
def test_a_step_takes_the_in_process_path_on_its_placement(cell: Placement, sock: zmq.Socket) -> None:
    before = calls(cell.daemon, "pm", "m")
    for _ in range(3):
        reply = send_frame(sock, "pm", FRAME, "png", outputs=["m.probs"])
        assert reply.status == 200 and reply.outputs["m.probs"].shape == (1, 10), reply.header
    after = calls(cell.daemon, "pm", "m")
    assert after["in_process"] - before["in_process"] == 3 and after["via_frontend"] == before["via_frontend"]
    # Hot, the idle context computes it on the pipeline's thread; cold, its worker does.
    here = after["computed_here"] - before["computed_here"]
    assert here == (3 if cell.name == "hot" else 0), (before, after)


@in_both
def test_a_steps_request_batches_with_a_clients(cell: Placement, sock: zmq.Socket) -> None:
    before = calls(cell.daemon, "pmb", "mb")
    with cell.daemon.pipeline(timeout_s=30) as client:
        # Each waits up to 2 s for company (max_batch 2): whichever comes first is joined by the other.
        pending = client.submit("mb", {"images": ONE})
        frame = send_frame(sock, "pmb", FRAME, "png")
        mine = client.gather([pending])[0]
    assert frame.status == 200, frame.header
    assert mine.status == 200 and mine.header.get("batch") == 2, mine.header
    after = calls(cell.daemon, "pmb", "mb")
    assert after["in_process"] == before["in_process"] + 1 and after["computed_here"] == before["computed_here"]


@in_both
def test_a_steps_request_past_the_frames_deadline_in_the_models_queue_is_a_504(cell: Placement,
                                                                             sock: zmq.Socket) -> None:
    before = calls(cell.daemon, "pmd", "md")
    # Two: a cold worker's queue is seen by its heartbeat, a moment late; the frame still finds seconds of work.
    with Longs(cell.daemon, "md", 2):
        reply = send_frame(sock, "pmd", FRAME, "png", timeout_ms=300)
    # The model's 504 (the request waited past the frame's deadline), or, where the long request
    # outlasts that deadline by the step's grace too, the step's own.
    error = reply.header.get("error", "")
    assert reply.status == 504 and "step 'md'" in error, reply.header
    assert "waiting for model 'md'" in error or "did not answer before the deadline" in error, reply.header
    after = calls(cell.daemon, "pmd", "md")
    assert after["in_process"] == before["in_process"] + 1, (before, after)


@in_both
def test_a_steps_request_to_a_full_model_is_a_429_with_its_retry_time(cell: Placement, sock: zmq.Socket) -> None:
    before = calls(cell.daemon, "pmo", "mo")
    with Longs(cell.daemon, "mo", 2):  # one running, one queued: max_queue = 1
        reply = send_frame(sock, "pmo", FRAME, "png")
    assert reply.status == 429 and "step 'mo'" in reply.header["error"], reply.header
    assert reply.header["retry_after_ms"] > 0, reply.header
    after = calls(cell.daemon, "pmo", "mo")
    assert after["in_process"] == before["in_process"] + 1, (before, after)


@in_both
def test_a_steps_request_to_a_full_model_is_served_by_its_fallback(cell: Placement, sock: zmq.Socket) -> None:
    before = calls(cell.daemon, "pmf", "mf")
    with Longs(cell.daemon, "mf", 2):
        reply = send_frame(sock, "pmf", FRAME, "png", outputs=["mf.probs"])
    assert reply.status == 200, reply.header
    assert reply.header["fallbacks"] == [{"step": "mf", "from": "mf", "reason": "queue_full"}], reply.header
    assert reply.outputs["mf.probs"].shape == (1, 10)  # ref's, the classifier's
    after = calls(cell.daemon, "pmf", "mf")
    assert after["in_process"] == before["in_process"] + 1, (before, after)


@in_both
def test_a_cameras_newer_frame_supersedes_its_queued_one_and_its_steps_stay_in_process(
        cell: Placement, sock: zmq.Socket) -> None:
    before = calls(cell.daemon, "pst", "mst")
    statuses: list[int] = []
    lock = threading.Lock()

    def camera() -> None:
        with zmq.Context.instance().socket(zmq.DEALER) as s:
            s.setsockopt(zmq.LINGER, 0)
            s.connect(cell.daemon.endpoint)
            for _ in range(6):
                status = send_frame(s, "pst", FRAME, "png", key="cam").status
                with lock:
                    statuses.append(status)

    # Frames of one camera from several connections at once: one thread (workers = 1) computes
    # one, the camera's newer frame replaces its waiting one, which is answered 409.
    senders = [threading.Thread(target=camera) for _ in range(4)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    assert set(statuses) <= {200, 409} and 200 in statuses and 409 in statuses, statuses
    after = calls(cell.daemon, "pst", "mst")
    assert after["in_process"] - before["in_process"] == statuses.count(200), (before, after, statuses)


@in_both
def test_a_step_that_must_start_a_cold_worker_is_admitted_by_the_frontend_and_the_next_in_process(
        cell: Placement, sock: zmq.Socket) -> None:
    d = cell.daemon
    with d.admin(timeout_s=60) as admin:
        admin.call("unload", model="m")
    before = calls(d, "pm", "m")
    reply = send_frame(sock, "pm", FRAME, "png")
    assert reply.status == 503 and "step 'm'" in reply.header["error"], reply.header
    after = calls(d, "pm", "m")
    if cell.name == "hot":  # unloaded by an operator, it stays so: refused in-process
        assert after["in_process"] == before["in_process"] + 1 and after["via_frontend"] == before["via_frontend"]
        with d.admin(timeout_s=60) as admin:
            admin.call("load", model="m")
    else:  # only the frontend starts a worker: this step went there, and started it
        assert after["via_frontend"] == before["via_frontend"] + 1, (before, after)
        assert reply.header["retry_after_ms"] > 0, reply.header
    eventually(lambda: send_frame(sock, "pm", FRAME, "png").status == 200, "pm served again", 60)
    assert calls(d, "pm", "m")["in_process"] > after["in_process"]
