"""What a request can make the daemon allocate beyond its message: inputs in shared memory, its reply,
and the contexts an admin sets (docs/security.md). Measured from /proc (VmHWM, VmRSS)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from support.polling import eventually
from support.procfs import peak_rss_mib, reset_peak, rss_mib

from infermux.protocol import SharedTensor

FAST = '[[models]]\nname = "fast512"\nengine = "fast512/1/model.onnx"\nmax_queue = 100000\n'


def _register(daemon, fd: int) -> tuple[socket.socket, str]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(str(daemon.run_dir / "regions.sock"))
    sock.settimeout(20)
    socket.send_fds(sock, [json.dumps({"op": "register", "name": "sparse"}).encode()], [fd])
    answer = json.loads(sock.recv(4096))
    assert answer["ok"], answer
    return sock, answer["region"]


def _sparse_memfd(size: int) -> int:
    """A memfd of `size` bytes the client never wrote: no page behind any of them."""
    fd = os.memfd_create("sparse", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd


def test_inputs_in_shared_memory_are_bounded_and_a_sparse_region_is_never_faulted_in(make_daemon) -> None:
    daemon = make_daemon(FAST)
    pid = daemon.proc.pid
    fd = _sparse_memfd(2 << 30)
    sock, token = _register(daemon, fd)
    try:
        with daemon.client(timeout_s=60) as client:
            cases = [  # (rows of 512 float32, status, words)
                (1 << 18, 413, ["inputs in shared memory are 536870912 bytes", "(max_shared_input_bytes)"]),
                (1 << 16, 400, ["were never written from byte 0", "write the input before sending"]),
                (1, 400, ["were never written from byte 0"]),
            ]
            for rows, status, words in cases:
                reset_peak(pid)
                before = rss_mib(pid)
                reply = client.infer("fast512", {"x": SharedTensor(token, 0, "float32", (rows, 512))})
                assert reply.status == status and all(w in reply.error for w in words), reply.header
                # Before: the 512 MiB one was read (its pages faulted in for the daemon) and computed.
                assert peak_rss_mib(pid) - before < 32, f"{rows} rows: peak {peak_rss_mib(pid) - before:.0f} MiB up"
            # The client writes its input: those pages are its own, and read as any region's.
            with os.fdopen(os.dup(fd), "r+b", buffering=0) as memory:
                memory.write(np.full((4, 512), 2, np.float32).tobytes())
                memory.seek(100)  # where the client's next write() would go
                reply = client.infer("fast512", {"x": SharedTensor(token, 0, "float32", (4, 512))})
                assert reply.status == 200 and float(reply.outputs["y"].min()) == 2.0, reply.header
                # Past what it wrote, the hole is named where it starts; the daemon's look for holes
                # left the client's file position (its descriptor's, shared with the daemon's) alone.
                reply = client.infer("fast512", {"x": SharedTensor(token, 0, "float32", (8, 512))})
                assert reply.status == 400 and "were never written from byte 8192" in reply.error, reply.header
                assert os.lseek(fd, 0, os.SEEK_CUR) == 100
    finally:
        sock.close()
        os.close(fd)
    assert daemon.stop() == 0


# -- what `set` may ask for ----------------------------------------------------------------------

HEAD_4MIB = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"
max_message_bytes = 4194304
watch = false
"""
WEIGHTED_AND_CLASSIFIER = """
[[models]]
name = "fast512"
engine = "fast512/1/model.onnx"
strategy = "weighted"
weight = 1

[[models]]
name = "classifier"
engine = "classifier/1/model.onnx"
max_queue = 256
[models.options]
share_session = false  # a session per context, so that each context costs memory (as on a GPU)
"""


def test_set_refuses_huge_weights_and_contexts_past_the_bound_or_the_budget(make_daemon) -> None:
    # The classifier's file is 22 KB: an estimate of 44 KB per onnxruntime session; 200 KB of budget.
    daemon = make_daemon(WEIGHTED_AND_CLASSIFIER, head=HEAD_4MIB + "memory_budget = 200000\n")
    x = np.ones((1, 512), np.float32)
    with daemon.admin() as admin:
        reply = admin.call("set", check=False, model="fast512", weights={"1": 10**400})
        assert not reply["ok"] and "weight of '1' must be an integer 0..1000000" in reply["error"], reply
        with daemon.client() as client:
            assert client.infer("fast512", {"x": x}).status == 200  # before: every request 500
        reply = admin.call("set", check=False, model="fast512", contexts=1024)
        assert not reply["ok"] and "1024 contexts is over [daemon] max_contexts (32)" in reply["error"], reply
        reply = admin.call("set", check=False, model="classifier", contexts=8)
        assert not reply["ok"] and "memory budget is in use (memory_budget)" in reply["error"], reply
        assert admin.call("set", model="classifier", contexts=3)["set"] == {"contexts": 3}
        models = {m["name"]: m for m in admin.call("models")["models"]}
    assert models["classifier"]["contexts"] == 3 and models["fast512"]["contexts"] == 1
    assert daemon.stop() == 0


def test_contexts_set_lower_give_their_memory_back(make_daemon) -> None:
    # A session per context, each with its own arena: what going back to one context must give back.
    daemon = make_daemon('[[models]]\nname = "classifier"\nengine = "classifier/1/model.onnx"\nmax_queue = 256\n'
                         '[models.options]\nshare_session = false\n', head=HEAD_4MIB)
    pid = daemon.proc.pid
    images = np.ones((32, 3, 64, 64), np.float32)
    with daemon.client() as client:
        assert client.infer("classifier", {"images": images}).status == 200
    start = rss_mib(pid)
    with daemon.admin(timeout_s=120) as admin:
        admin.call("set", model="classifier", contexts=32)
        with daemon.pipeline(timeout_s=120) as pipeline:  # every context computes: its session's arena grows
            ids = [pipeline.submit("classifier", {"images": images}) for _ in range(128)]
            assert {r.status for r in pipeline.gather(ids)} == {200}
        grown = rss_mib(pid)
        admin.call("set", model="classifier", contexts=1)
    kept = rss_mib(pid) - start
    print(f"RSS {start:.0f} MiB, {grown:.0f} with 32 contexts busy, {start + kept:.0f} back at 1")
    assert grown - start > 64  # the sessions' memory was real (about 260 MiB on the 2-core box)
    assert kept < 24, f"{kept:.0f} MiB kept after going back to one context"  # before: about 50 MiB
    assert daemon.stop() == 0


# -- replies -------------------------------------------------------------------------------------

# onnxruntime's CPU arena would keep the outputs' high-water mark: the bound on the reply is what is
# measured here, so the model gives its memory back after each call. A 250 MiB output takes seconds
# on a busy box, and the next request waits for it: the deadline is far from what is measured.
TILER = ('[[models]]\nname = "tile"\nengine = "tile/1/model.onnx"\nmax_queue = 64\ntimeout_ms = 60000\n'
         'options = {{ cpu_arena = false }}\n')


@pytest.fixture
def tile_engines(engines: Path, tmp_path: Path) -> Path:
    from support import models

    root = tmp_path / "engines"
    shutil.copytree(engines, root)
    models.tiler(root / "tile/1/model.onnx")
    return root


@pytest.mark.parametrize("placement", ["hot", "cold"])
def test_a_reply_over_max_reply_bytes_is_a_413_and_its_memory_is_let_go(make_daemon, tile_engines, placement) -> None:
    # max_reply_bytes is not set: it is max_message_bytes, 4 MiB here. Cold, the worker's outputs
    # reach the daemon (through its pipe: they do not fit the slot) and are refused there.
    models = TILER + f'placement = "{placement}"\npreload = true\n'
    daemon = make_daemon(models, head=HEAD_4MIB.replace("{engines}", str(tile_engines)))  # TILER: {{ }} for format()
    pid = daemon.proc.pid
    x = np.ones((2000, 512), np.float32)  # 3.9 MiB in
    with daemon.client(timeout_s=60) as client:
        small = client.infer("tile", {"x": x[:4], "repeats": np.array([2, 1], np.int64)})
        assert small.status == 200 and small.outputs["y"].shape == (8, 512)
        before = rss_mib(pid)
        for rows in (2000, 1999, 1998):  # 250 MiB out, each time: before, each was queued for the client whole
            # (each of other shapes: the same again would be refused without computing it, below)
            reply = client.infer("tile", {"x": x[:rows], "repeats": np.array([64, 1], np.int64)})
            assert reply.status == 413, reply.header
            assert "the reply would be 26" in reply.error and "the limit is 4194304 (max_reply_bytes)" in reply.error
            assert reply.header["model"] == "tile" and reply.header["id"] is not None
    # The executor thread lets go of the outputs just after the 413 has gone.
    eventually(lambda: rss_mib(pid) - before < 64, f"RSS back within 64 MiB of {before:.0f} MiB")
    with daemon.admin() as admin:
        assert admin.call("status")["daemon"]["replies_too_large"] == 3
    assert daemon.stop() == 0


# -- requests like one whose reply was too large -------------------------------------------------

BIG = np.ones((2000, 512), np.float32)  # 3.9 MiB in; repeats [64, 1]: 250 MiB out


def _tile(client, rows: int = 2000, repeat: int = 64, version: str | None = None):
    return client.infer("tile", {"x": BIG[:rows], "repeats": np.array([repeat, 1], np.int64)}, version=version)


def _computed(admin) -> int:
    """Requests the tiler computed (every one it computed counts 200 there, a reply dropped for its size too)."""
    stats = next(m for m in admin.call("models")["models"] if m["name"] == "tile")["stats"]
    return stats["by_status"].get("200", 0)


def _tiler(make_daemon, tile_engines: Path, placement: str, memory_s: float):
    models = TILER + f'placement = "{placement}"\npreload = true\n'
    head = HEAD_4MIB.replace("{engines}", str(tile_engines)) + f"oversize_memory_s = {memory_s}\n"
    return make_daemon(models, head=head)


# hot, no version asked: the fast path may take it; a version asked: the general path; cold: a worker's.
@pytest.mark.parametrize(("placement", "version"), [("hot", None), ("hot", "1"), ("cold", None)])
def test_requests_like_one_whose_reply_was_too_large_are_refused_without_computing(
        make_daemon, tile_engines, placement, version) -> None:
    # The time a kind is remembered is long here: on a busy box the next request may come a second later.
    daemon = _tiler(make_daemon, tile_engines, placement, memory_s=60)
    with daemon.client(timeout_s=60) as client, daemon.client(timeout_s=60) as other, daemon.admin() as admin:
        first = _tile(client, version=version)
        assert first.status == 413 and "it was computed" in first.error, first.header
        assert _computed(admin) == 1
        for repeat in (64, 64, 1):  # the same shapes (the repeats' values are not looked at)
            start = time.monotonic()
            again = _tile(client, repeat=repeat, version=version)
            assert again.status == 413, again.header
            assert time.monotonic() - start >= 0.1  # held back: a client looping on it cannot spin
            assert again.error.startswith("refused without computing it: a request of the same shapes from this "
                                          "connection just made a reply of 26"), again.error
            assert "(max_reply_bytes): ask for fewer outputs" in again.error and "computed again 60 s" in again.error
            assert again.header["model"] == "tile" and again.header["id"] is not None
        assert _computed(admin) == 1  # before: each was computed (250 MiB written, then dropped)
        # Other shapes from the same connection, and another connection's requests, are computed as ever.
        assert _tile(client, rows=4, repeat=2, version=version).status == 200
        assert _tile(other, rows=4, repeat=2, version=version).status == 200
        theirs = _tile(other, version=version)  # the same shapes, from another connection: its own first
        assert theirs.status == 413 and "it was computed" in theirs.error, theirs.header
        assert _computed(admin) == 4
        daemon_view = admin.call("status")["daemon"]
        assert daemon_view["replies_too_large"] == 2 and daemon_view["requests_refused_oversize"] == 3
    assert "refused without computing it" in daemon.log()
    assert daemon.stop() == 0


def test_after_the_memory_one_request_of_the_kind_is_computed_again_and_one_that_fits_forgets_it(
        make_daemon, tile_engines) -> None:
    daemon = _tiler(make_daemon, tile_engines, "hot", memory_s=0.5)
    with daemon.client(timeout_s=60) as client, daemon.admin() as admin:
        assert _tile(client).status == 413 and _computed(admin) == 1
        time.sleep(0.6)
        again = _tile(client)  # over again: computed, and remembered afresh
        assert again.status == 413 and "it was computed" in again.error, again.header
        assert _computed(admin) == 2
        time.sleep(0.6)
        small = _tile(client, repeat=1)  # the same shapes, a reply that fits (outputs depend on values)
        assert small.status == 200 and small.outputs["y"].shape == (2000, 512), small.header
        # Forgotten at once: the next of the kind is computed even within the time.
        again = _tile(client)
        assert again.status == 413 and "it was computed" in again.error, again.header
        assert _computed(admin) == 4
        assert admin.call("status")["daemon"]["requests_refused_oversize"] == 0
    assert daemon.stop() == 0
