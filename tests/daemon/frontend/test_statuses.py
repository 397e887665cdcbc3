"""Every status code of docs/protocol.md, produced end to end over a real socket."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from support.harness import REPO, Daemon
from infermux.protocol import encode_request

X4 = np.arange(8, dtype=np.float32).reshape(2, 4)


def test_200_serves_the_model_with_timing(daemon: Daemon) -> None:
    with daemon.client() as client:
        reply = client.infer("addone", {"x": X4}, version="1")
    assert reply.status == 200 and (reply.model, reply.version) == ("addone", "1")
    np.testing.assert_array_equal(reply.outputs["y"], X4 + 1)
    timing = reply.header["timing_us"]
    assert set(timing) == {"queue", "compute", "total"} and timing["total"] >= timing["compute"] >= 0


def test_200_classifier_matches_onnxruntime_called_directly(daemon: Daemon) -> None:
    images = np.random.default_rng(3).random((3, 3, 64, 64), dtype=np.float32)
    expected = ort.InferenceSession(str(REPO / "engines/classifier/1/model.onnx")).run(None, {"images": images})[0]
    with daemon.client() as client:
        reply = client.infer("classifier", {"images": images})
    np.testing.assert_allclose(reply.outputs["probs"], expected, rtol=1e-5, atol=1e-6)


def test_no_version_goes_to_the_newest(daemon: Daemon) -> None:
    with daemon.client() as client:
        reply = client.infer("addone", {"x": X4})
    assert reply.version == "2"
    np.testing.assert_array_equal(reply.outputs["y"], X4 + 2)


def test_outputs_filter_returns_only_what_was_asked(daemon: Daemon) -> None:
    a, b = np.ones((1, 3), np.float32) * 2, np.ones((1, 3), np.float32) * 5
    with daemon.client() as client:
        reply = client.infer("pair", {"a": a, "b": b}, outputs=["prod"])
        unknown = client.infer("pair", {"a": a, "b": b}, outputs=["quotient"])
    assert list(reply.outputs) == ["prod"] and reply.outputs["prod"].tolist() == [[10, 10, 10]]
    assert unknown.status == 400 and "no output 'quotient'" in unknown.error


def test_400_for_inputs_the_engine_does_not_accept(daemon: Daemon) -> None:
    with daemon.client() as client:
        wrong_width = client.infer("addone", {"x": np.zeros((1, 5), np.float32)})
        wrong_dtype = client.infer("addone", {"x": np.zeros((1, 4), np.int32)})
        wrong_name = client.infer("addone", {"z": np.zeros((1, 4), np.float32)})
        wrong_rank = client.infer("addone", {"x": np.zeros((4,), np.float32)})
    assert wrong_width.status == 400 and "dimension 1 must be 4" in wrong_width.error
    assert wrong_dtype.status == 400 and "must be float32, got int32" in wrong_dtype.error
    assert wrong_name.status == 400 and "takes inputs ['x'], got ['z']" in wrong_name.error
    assert wrong_rank.status == 400 and "rank 2" in wrong_rank.error


def test_404_for_an_unknown_model_lists_the_served_ones(daemon: Daemon) -> None:
    with daemon.client() as client:
        reply = client.infer("nosuch", {"x": X4})
    assert reply.status == 404 and "unknown model 'nosuch'" in reply.error and "addone" in reply.error


def test_unknown_version_falls_back_to_the_default_and_says_so(daemon: Daemon) -> None:
    with daemon.client() as client:
        reply = client.infer("addone", {"x": X4}, version="9")
    assert reply.status == 200 and reply.version == "2"
    assert reply.fallback == {"from": "addone", "reason": "version", "version": "9"}


def test_404_for_an_unknown_version_under_reject(make_daemon) -> None:
    d = make_daemon('[routing]\nversion_mismatch = "reject"\n[[models]]\nname = "addone"\nengine = "addone/1/model.onnx"\n')
    with d.client() as client:
        reply = client.infer("addone", {"x": X4}, version="9")
    assert reply.status == 404 and "has no version '9'; versions: 1" in reply.error


def test_413_for_a_message_over_max_message_bytes(daemon: Daemon) -> None:
    big = np.zeros((1, 270_000), np.float32)  # 1.08 MB > the 1 MiB limit in conftest, within the frame cap's slack
    with daemon.client() as client:
        # As a client that does not ask the limit first sends it (the project's own refuses it: test_oversize.py).
        reply = client.send_raw(encode_request("addone", {"x": big}, id=1))
        after = client.infer("addone", {"x": X4})
    assert reply.status == 413 and "limit is 1048576" in reply.error
    assert reply.header["id"] is not None  # a pipelined client can still match it
    assert after.status == 200


def test_429_with_retry_after_when_the_queue_is_full(daemon: Daemon) -> None:
    x = np.ones((64, 512), np.float32)  # tens of ms per call
    replies: list = []
    with daemon.pipeline() as pipe:
        # A burst of 8 against a queue of 2 fills it, unless a busy box spreads the burst out over
        # the computes: then the next burst, until one came together.
        for _ in range(5):
            replies += pipe.gather([pipe.submit("slow", {"x": x}) for _ in range(8)])
            if any(r.status == 429 for r in replies):
                break
    statuses = {r.status for r in replies}
    assert statuses == {200, 429}, statuses
    full = next(r for r in replies if r.status == 429)
    assert "queue is full (2 requests)" in full.error and full.retry_after_ms >= 1


def test_queue_full_degrades_to_the_fallback_model(daemon: Daemon) -> None:
    x = np.ones((64, 512), np.float32)
    with daemon.pipeline() as pipe:
        replies = pipe.gather([pipe.submit("slow_fb", {"x": x}) for _ in range(6)])
    stand_ins = [r for r in replies if r.fallback]
    assert all(r.status == 200 for r in replies)
    assert stand_ins and all(r.model == "fast512" and r.fallback["from"] == "slow_fb" for r in stand_ins)
    assert {r.fallback["reason"] for r in stand_ins} <= {"queue_full", "deadline"}
    np.testing.assert_array_equal(stand_ins[0].outputs["y"], x)  # fast512 adds 0


def test_500_when_the_backend_fails_and_the_daemon_carries_on(daemon: Daemon) -> None:
    x = np.zeros((1, 4), np.float32)
    with daemon.client() as client:
        bad = client.infer("reshaper", {"x": x, "shape": np.array([3, 5], np.int64)})
        good = client.infer("reshaper", {"x": x, "shape": np.array([2, 2], np.int64)})
    assert bad.status == 500 and "backend error" in bad.error
    assert good.status == 200 and good.outputs["y"].shape == (2, 2)


def test_503_with_retry_after_while_loading(make_daemon) -> None:
    d = make_daemon('[[models]]\nname = "late"\nengine = "addone/1/model.onnx"\nbackend = "slow_load:SlowLoadBackend"\n'
                    "[models.options]\nload_delay_s = 1.5\n", wait_ready=False)
    with d.client() as client:
        early = client.infer("late", {"x": X4})
        d.wait_for(" ready ")
        later = client.infer("late", {"x": X4})
    assert early.status == 503 and "is loading" in early.error
    assert 50 <= early.retry_after_ms <= 5000
    assert later.status == 200


def test_503_names_the_reason_a_model_failed(make_daemon, tmp_path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"this is not an onnx file")
    d = make_daemon(f'[[models]]\nname = "broken"\nengine = "{broken}"\n')
    with d.client() as client:
        reply = client.infer("broken", {"x": X4})
    assert reply.status == 503 and "failed" in reply.error and "onnxruntime cannot load" in reply.error
    assert "failed model=broken" in d.log()


@pytest.mark.timing
def test_504_stale_requests_are_answered_without_computing(make_daemon) -> None:
    # A daemon of its own with room to queue four long computes ahead of the 5 ms request: it is
    # late when taken even if this client is held off the CPU for a while after the first.
    d = make_daemon('[[models]]\nname = "slow"\nengine = "slow/1/model.onnx"\nmax_queue = 8\n'
                    "timeout_ms = 20000\n")
    big = np.ones((400, 512), np.float32)  # tens of ms of compute on the 2-core box
    with d.pipeline(timeout_s=30) as pipe:
        first = [pipe.submit("slow", {"x": big}) for _ in range(4)]
        stale = pipe.submit("slow", {"x": big[:1]}, timeout_ms=5)
        replies = pipe.gather([*first, stale])
    assert all(r.status == 200 and r.header["timing_us"]["compute"] > 5000 for r in replies[:4])
    assert replies[4].status == 504 and "not computed" in replies[4].error


def test_409_a_stream_s_newer_request_replaces_its_queued_one(make_daemon) -> None:
    d = make_daemon('[[models]]\nname = "slow"\nengine = "slower/1/model.onnx"\nqueue_policy = "newest_per_key"\n'
                    "timeout_ms = 20000\n")
    big = np.ones((400, 512), np.float32)  # ~50 ms through the 48-layer model: the frames queue behind it
    with d.pipeline(timeout_s=30) as pipe:
        first = pipe.submit("slow", {"x": big})
        older, newer = (pipe.submit("slow", {"x": big[:1]}, key="cam-7") for _ in range(2))
        replies = pipe.gather([first, older, newer])
    assert [r.status for r in replies] == [200, 409, 200], [r.header for r in replies]
    assert replies[1].superseded_by == newer and "key 'cam-7'" in replies[1].error, replies[1].header


def test_not_ready_degrades_to_the_fallback(make_daemon) -> None:
    d = make_daemon('[[models]]\nname = "late"\nengine = "fast512/1/model.onnx"\nfallback = "fast"\n'
                    'backend = "slow_load:SlowLoadBackend"\n[models.options]\nload_delay_s = 30\n'
                    '[[models]]\nname = "fast"\nengine = "fast512/1/model.onnx"\n', wait_ready=False)
    d.wait_for("loaded model=fast ")
    with d.client() as client:
        reply = client.infer("late", {"x": np.ones((1, 512), np.float32)})
    assert reply.status == 200 and reply.model == "fast"
    assert reply.fallback == {"from": "late", "reason": "not_ready"}


def test_a_plugin_that_returns_garbage_gets_500_and_its_context_lives_on(make_daemon) -> None:
    d = make_daemon('[[models]]\nname = "bad"\nengine = "addone/1/model.onnx"\nbackend = "bad_outputs:BadOutputsBackend"\n')
    with d.client() as client:
        broken = client.infer("bad", {"x": -(X4 + 1)})
        fine = client.infer("bad", {"x": X4})
    assert broken.status == 500 and "internal error" in broken.error
    assert fine.status == 200
    assert "executor error model=bad" in d.log()
