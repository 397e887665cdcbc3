"""What a request can make the daemon allocate beyond its message: inputs in shared memory, its reply,
and the contexts an admin sets (docs/security.md). Measured from /proc (VmHWM, VmRSS)."""

from __future__ import annotations

import fcntl
import json
import os
import socket

import numpy as np
import pytest

from procfs import peak_rss_mib, reset_peak, rss_mib

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
                (1 << 16, 400, ["are not in memory from byte 0", "write the input before sending"]),
                (1, 400, ["are not in memory from byte 0"]),
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
            reply = client.infer("fast512", {"x": SharedTensor(token, 0, "float32", (4, 512))})
            assert reply.status == 200 and float(reply.outputs["y"].min()) == 2.0, reply.header
    finally:
        sock.close()
        os.close(fd)
    assert daemon.stop() == 0
