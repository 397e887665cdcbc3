"""Dynamic batching end to end: real daemon, real sockets.

The daemons here set `inline_max_us = 0` so that every request goes
through an executor's queue, where batches form; with it on, a request
reaching an idle context runs at once on the frontend thread.

Where a test needs requests to merge, the merge is certain, not likely:
the batch delay (LONG_US) is far longer than any stall of a busy box and
each batch is ended by its size (max_batch, or a preferred size) or by a
queued request that cannot join it, so no batch waits it out. A request
of another shape ends a batch the moment it is queued: a test sends each
shape's requests together, never interleaved.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

HEAD = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"
inline_max_us = 0
"""


# A batch delay no batch here waits out (each fills first), with deadlines that let it run.
LONG_US = 10_000_000
PATIENT = "timeout_ms = 60000\n"


def mlp_model(max_batch: int, delay_us: int, extra: str = "", name: str = "mlp") -> str:
    return (f'[[models]]\nname = "{name}"\nengine = "mlp/1/model.onnx"\nmax_queue = 256\n'
            f"max_batch = {max_batch}\nbatch_delay_us = {delay_us}\n{extra}")


def stats_of(daemon, name: str, version: str = "1") -> dict:
    with daemon.admin() as admin:
        views = admin.call("models")["models"]
    return next(v for v in views if v["name"] == name and v["version"] == version)["stats"]


# Executors form the batches (inline off), or the frontend does at the end of each burst of
# reads (the default, inline.py): either way rows are merged and come back apart.
BATCHERS = {"executors": (HEAD, LONG_US), "frontend": (HEAD.replace("inline_max_us = 0", "inline_max_us = 5000"), 300)}


@pytest.mark.timing
@pytest.mark.parametrize("batcher", sorted(BATCHERS))
def test_concurrent_requests_share_inferences_and_get_their_own_rows_back(make_daemon, engines: Path, batcher):
    head, delay_us = BATCHERS[batcher]
    d = make_daemon(mlp_model(16, delay_us, PATIENT), head=head)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((1, 256)).astype(np.float32) for _ in range(96)]  # 6 full batches
    with d.pipeline(timeout_s=60) as pipe:
        replies = pipe.gather([pipe.submit("mlp", {"features": x}) for x in inputs])
    assert all(r.status == 200 for r in replies)
    assert max(r.header.get("batch", 1) for r in replies) > 1
    assert all(r.header.get("batch", 1) <= 16 for r in replies)
    session = ort.InferenceSession(str(engines / "mlp/1/model.onnx"), providers=["CPUExecutionProvider"])
    for x, reply in zip(inputs, replies):  # each request gets exactly what running it alone gives
        alone = session.run(None, {"features": x})[0]
        np.testing.assert_allclose(reply.outputs["logits"], alone, rtol=1e-5, atol=1e-6)


@pytest.mark.timing
def test_stats_count_batch_sizes_and_statuses_and_they_move(make_daemon):
    d = make_daemon(mlp_model(8, LONG_US, PATIENT), head=HEAD)
    x = np.ones((1, 256), np.float32)
    before = stats_of(d, "mlp")
    with d.pipeline(timeout_s=60) as pipe:  # 4 full batches
        pipe.gather([pipe.submit("mlp", {"features": x}) for _ in range(32)])
    after = stats_of(d, "mlp")
    assert after["by_status"].get("200", 0) - before["by_status"].get("200", 0) == 32
    sizes = {int(k): n for k, n in after["batches"].items()}
    assert sum(k * n for k, n in sizes.items()) == 32  # rows computed = rows asked for
    assert max(sizes) > 1 and max(sizes) <= 8


@pytest.mark.timing
def test_max_batch_counts_rows_not_requests(make_daemon):
    d = make_daemon(mlp_model(8, LONG_US, PATIENT), head=HEAD)
    x = np.ones((3, 256), np.float32)
    with d.pipeline(timeout_s=60) as pipe:
        ids = [pipe.submit("mlp", {"features": x}) for _ in range(12)]
        # Last, a full batch of its own: the batch before it sees it cannot fit and goes.
        full = pipe.submit("mlp", {"features": np.ones((8, 256), np.float32)})
        replies = pipe.gather(ids)
        assert pipe.gather([full])[0].status == 200
    assert all(r.status == 200 and r.outputs["logits"].shape == (3, 10) for r in replies)
    assert {r.header.get("batch") for r in replies} <= {None, 6}  # two 3-row requests fit in 8, three do not
    assert 6 in {r.header.get("batch") for r in replies}


@pytest.mark.timing
def test_only_requests_with_the_same_shapes_merge(make_daemon, engines: Path):
    path = engines / "anywidth/1/model.onnx"  # y = x + 1, x float32 [N, M]: any width
    if not path.exists():
        graph = helper.make_graph(
            [helper.make_node("Add", ["x", "c"], ["y"])], "anywidth",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "M"])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "M"])],
            [helper.make_tensor("c", TensorProto.FLOAT, [1], [1.0])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(model.SerializeToString())
    d = make_daemon('[[models]]\nname = "anywidth"\nengine = "anywidth/1/model.onnx"\n'
                    f"max_batch = 16\nbatch_delay_us = {LONG_US}\n{PATIENT}", head=HEAD)
    # Two cameras of different widths, 8 frames each, then a full batch of the first width. A batch
    # goes once no queued request fits it, so the sizes are certain however the threads interleave:
    # each camera's 8 frames are queued before the request that cannot join them (the other width,
    # then a batch too big), and none waits out the delay.
    inputs = ([np.full((1, 8), i, np.float32) for i in range(8)] + [np.full((1, 4), i, np.float32) for i in range(8)]
              + [np.ones((16, 8), np.float32)])
    with d.pipeline(timeout_s=60) as pipe:
        replies = pipe.gather([pipe.submit("anywidth", {"x": x}, key=f"cam{x.shape[1]}") for x in inputs])
    for x, reply in zip(inputs, replies):
        assert reply.status == 200
        np.testing.assert_array_equal(reply.outputs["y"], x + 1)
    assert [r.header.get("batch", 1) for r in replies] == [8] * 16 + [1]


@pytest.mark.timing
def test_the_batch_delay_never_holds_a_request_past_its_deadline(make_daemon):
    # Seconds, not milliseconds: a thread a busy box wakes late must not decide the outcome. The
    # hurried request may wait half of its 2 s (executor.py, _patience), the patient one the 4 s delay.
    d = make_daemon(mlp_model(16, 4_000_000, "timeout_ms = 30000\n"), head=HEAD)
    x = np.ones((1, 256), np.float32)
    with d.client(timeout_s=60) as client:
        client.infer("mlp", {"features": x}, timeout_ms=2000)  # measures the compute time the wait keeps free
        start = time.monotonic()
        hurried = client.infer("mlp", {"features": x}, timeout_ms=2000)
        hurried_s = time.monotonic() - start
        start = time.monotonic()
        patient = client.infer("mlp", {"features": x})
        patient_s = time.monotonic() - start
    assert hurried.status == 200 and hurried.header["timing_us"]["queue"] < 2_000_000
    assert hurried_s < 3.0  # it did not wait out the delay
    assert patient.status == 200 and patient_s >= 3.95  # alone, it waits out the 4 s delay


@pytest.mark.timing
def test_a_preferred_batch_size_goes_without_waiting_out_the_delay(make_daemon):
    # A deadline far past the delay: with the default 1 s the batch would go after half of it anyway.
    d = make_daemon(mlp_model(16, LONG_US, "preferred_batch = [2]\n" + PATIENT), head=HEAD)
    x = np.ones((1, 256), np.float32)
    start = time.monotonic()
    with d.pipeline(timeout_s=60) as pipe:
        replies = pipe.gather([pipe.submit("mlp", {"features": x}) for _ in range(2)])
    assert time.monotonic() - start < LONG_US / 2e6
    assert [r.header.get("batch") for r in replies] == [2, 2]


@pytest.mark.timing
def test_requests_late_when_their_batch_is_taken_are_not_computed(make_daemon):
    d = make_daemon('[[models]]\nname = "slow"\nengine = "slow/1/model.onnx"\nmax_batch = 8\n'
                    "batch_delay_us = 1000\ntimeout_ms = 20000\n", head=HEAD)
    big = np.ones((400, 512), np.float32)  # runs alone (400 rows > 8), tens of ms
    with d.pipeline(timeout_s=60) as pipe:
        # Four of them ahead: the 5 ms requests wait behind a few hundred ms of compute,
        # even if this client is held off the CPU for a while after the first.
        first = [pipe.submit("slow", {"x": big}) for _ in range(4)]
        stale = [pipe.submit("slow", {"x": big[:1]}, timeout_ms=5) for _ in range(3)]
        replies = pipe.gather([*first, *stale])
    assert [r.status for r in replies[:4]] == [200] * 4
    assert [r.status for r in replies[4:]] == [504] * 3
    stats = stats_of(d, "slow")
    assert stats["batches"] == {"400": 4}  # the stale ones never reached the backend
    assert stats["by_status"] == {"200": 4, "504": 3}
