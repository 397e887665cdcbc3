"""Inputs in clients' shared memory (regions.py), against real daemons, workers and memfds."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from infermux.client import SharedMemory, SharedTensor
from infermux.client import regions_path
from infermux.transport.regions import MAX_REGIONS, MAX_REGIONS_PER_CLIENT, MappedRegions, RegionTable
from support.polling import eventually
from support.workers import head, start, stop_clean, until_200, worker

X = np.random.default_rng(9).random((64, 512), dtype=np.float32)  # 128 KB: a worker would copy it into a slot
MODELS = """
[[models]]
name = "hot"
engine = "fast512/1/model.onnx"

[[models]]
name = "cold"
engine = "fast512/1/model.onnx"
placement = "cold"
preload = true
"""


def mapped(pid: int, name: str) -> bool:
    """Whether process `pid` maps the memfd called `name` (its /proc maps show `/memfd:name`)."""
    return f"/memfd:{name} " in Path(f"/proc/{pid}/maps").read_text()


def register(path: Path, fds: list[int], message: object = None) -> dict:
    """One raw registration exchange, as a client in another language would do it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(5)
        sock.connect(str(path))
        body = json.dumps(message if message is not None else {"op": "register", "name": "raw"}).encode()
        socket.send_fds(sock, [body], fds)
        return json.loads(sock.recv(4096))


def sealed_memfd(size: int, seals: int = fcntl.F_SEAL_SHRINK) -> int:
    fd = os.memfd_create("raw", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def test_inputs_in_shared_memory_give_the_outputs_of_frames_hot_and_cold(make_daemon) -> None:
    d = start(make_daemon, MODELS)
    with d.client() as client, SharedMemory.beside(d.endpoint, 1 << 20, "infer-test") as shm:
        x = shm.ndarray(X.shape, X.dtype, offset=4096)
        x[:] = X
        by_frame = client.infer("hot", {"x": X})
        hot = client.infer("hot", {"x": shm.ref(x)})
        cold = [until_200(client, "cold", shm.ref(x)) for _ in range(3)]  # the later ones computed into a slot
        x[:2] *= 3  # the client rewrites its region between requests, as a camera would
        small = client.infer("cold", {"x": shm.ref(x[:2])})
        small_hot = client.infer("hot", {"x": X[:2] * 3})
        pid = worker(d, "cold")["pid"]
        assert worker(d, "cold")["regions"] == 1
        assert mapped(pid, "infer-test"), "the worker should read the client's region itself, not a copy"
        with d.admin() as admin:
            shared = admin.call("status")["daemon"]["shared_memory"]
        assert shared["regions"] == 1 and shared["bytes"] == 1 << 20
    assert hot.status == 200, hot.header
    np.testing.assert_array_equal(hot.outputs["y"], by_frame.outputs["y"])
    for reply in cold:
        assert reply.status == 200, reply.header
        np.testing.assert_array_equal(reply.outputs["y"], by_frame.outputs["y"])
    np.testing.assert_array_equal(small.outputs["y"], small_hot.outputs["y"])
    # The client closed its region: the daemon and the worker let go of it.
    eventually(lambda: "region_released name=infer-test" in d.log(), "the region released")
    eventually(lambda: not mapped(pid, "infer-test"), "the worker to unmap the region")
    assert not mapped(d.proc.pid, "infer-test")
    stop_clean(d)


def test_outputs_are_written_into_the_clients_region_hot_and_cold(make_daemon) -> None:
    d = start(make_daemon, MODELS)
    with d.client() as client, SharedMemory.beside(d.endpoint, 1 << 20, "outputs") as shm:
        x = shm.ndarray(X.shape, X.dtype)
        y = shm.ndarray(X.shape, X.dtype, offset=X.nbytes)
        x[:] = X
        expected = client.infer("hot", {"x": X}).outputs["y"]
        until_200(client, "cold", X)
        for model in ("hot", "cold", "cold", "hot"):
            y[:] = -1
            reply = client.infer(model, {"x": shm.ref(x)}, output_regions={"y": shm.ref(y)})
            assert reply.status == 200, reply.header
            assert reply.header["outputs"][0]["region"] == shm.token  # no frame: it is in the region
            np.testing.assert_array_equal(y, expected)
            assert np.shares_memory(reply.outputs["y"], y)
        # A region too small for the output: it comes back in a frame, as without output_regions.
        tail = shm.ndarray((4,), "float32", offset=(1 << 20) - 16)
        for model in ("hot", "cold"):
            reply = client.infer(model, {"x": X}, output_regions={"y": shm.ref(tail)})
            assert reply.status == 200 and "region" not in reply.header["outputs"][0], reply.header
            np.testing.assert_array_equal(reply.outputs["y"], expected)
    stop_clean(d)


def test_a_region_sealed_against_writes_takes_inputs_but_not_outputs(make_daemon) -> None:
    d = start(make_daemon, MODELS)
    fd = sealed_memfd(X.nbytes, 0)
    os.pwrite(fd, X.tobytes(), 0)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_WRITE)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock, d.client() as client:
            sock.connect(str(regions_path(d.endpoint)))
            socket.send_fds(sock, [b'{"op": "register", "name": "frozen"}'], [fd])
            token = json.loads(sock.recv(4096))["region"]
            ref = SharedTensor(token, 0, "float32", X.shape)
            assert client.infer("hot", {"x": ref}).status == 200
            assert until_200(client, "cold", ref).status == 200
            refused = client.infer("hot", {"x": X}, output_regions={"y": ref})
            assert refused.status == 400 and "F_SEAL_WRITE" in refused.error, refused.header
    finally:
        os.close(fd)
    stop_clean(d)


def test_an_input_in_a_region_and_another_in_a_frame_travel_together(make_daemon) -> None:
    d = start(make_daemon, '[[models]]\nname = "hot"\nengine = "reshaper/1/model.onnx"\n'
                           '[[models]]\nname = "cold"\nengine = "reshaper/1/model.onnx"\nplacement = "cold"\n')
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    shape = np.array([3, 8], dtype=np.int64)
    with d.client() as client, SharedMemory.beside(d.endpoint, 4096) as shm:
        rx, rshape = shm.ndarray(x.shape, x.dtype), shm.ndarray(shape.shape, shape.dtype, offset=1024)
        rx[:], rshape[:] = x, shape
        eventually(lambda: client.infer("cold", {"x": x, "shape": shape}).status == 200, "a 200 from cold")
        replies = [client.infer(model, inputs) for model in ("hot", "cold")
                   for inputs in ({"x": shm.ref(rx), "shape": shape}, {"x": x, "shape": shm.ref(rshape)},
                                  {"shape": shm.ref(rshape), "x": shm.ref(rx)})]
    for reply in replies:
        assert reply.status == 200, reply.header
        np.testing.assert_array_equal(reply.outputs["y"], x.reshape(3, 8))
    stop_clean(d)


def test_a_region_ends_with_its_client_even_when_the_client_is_killed(make_daemon) -> None:
    d = start(make_daemon, MODELS)
    script = (f"import sys, time; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
              "from infermux.client import SharedMemory\n"
              f"shm = SharedMemory.beside({d.endpoint!r}, 1 << 20, 'doomed')\n"
              "print(shm.ref(shm.ndarray((64, 512))).region, flush=True)\ntime.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    token = child.stdout.readline().strip()
    ref = SharedTensor(token, 0, "float32", (64, 512))
    with d.client() as client:
        assert client.infer("hot", {"x": ref}).status == 200  # another client may use a token it was given
        until_200(client, "cold", ref)
        child.send_signal(signal.SIGKILL)
        child.wait()
        eventually(lambda: "region_released name=doomed" in d.log(), "the killed client's region released")
        for model in ("hot", "cold"):
            reply = client.infer(model, {"x": ref})
            assert reply.status == 400 and "no shared-memory region" in reply.error, reply.header
            assert "register it again" in reply.error
    eventually(lambda: not mapped(worker(d, "cold")["pid"], "doomed"), "the worker to unmap the region")
    stop_clean(d)


def test_requests_pointing_outside_a_region_get_400_and_the_daemon_serves_on(make_daemon) -> None:
    d = start(make_daemon, MODELS)
    with d.client() as client, SharedMemory.beside(d.endpoint, 65536, "small") as shm:
        ref = shm.ref(shm.ndarray((8, 512)))
        cases = {"outside": dataclasses.replace(ref, offset=65536 - 100),
                 "too big": dataclasses.replace(ref, shape=(64, 512)),
                 "negative offset": dataclasses.replace(ref, offset=-4),
                 "not a token": dataclasses.replace(ref, region="0" * 32)}
        for case, bad in cases.items():
            for model in ("hot", "cold"):
                reply = client.infer(model, {"x": bad})
                assert reply.status == 400, (case, model, reply.header)
        assert "outside region 'small' of 65536 bytes" in client.infer("hot", {"x": cases["outside"]}).error
        assert until_200(client, "cold", ref).status == 200
    stop_clean(d)


def test_registrations_without_a_sealed_memfd_are_refused_with_what_to_do(make_daemon) -> None:
    d = start(make_daemon, MODELS)
    path = Path(d.endpoint[len("ipc://"):]).parent / "regions.sock"
    assert path == regions_path(d.endpoint)
    unsealed, empty, pipe_r = sealed_memfd(4096, 0), sealed_memfd(0), os.pipe()[0]
    try:
        assert "F_SEAL_SHRINK" in register(path, [unsealed])["error"]
        assert "1 to" in register(path, [empty])["error"]
        assert "not a memfd" in register(path, [pipe_r])["error"]
        assert "exactly one file descriptor" in register(path, [])["error"]
        assert "unknown op" in register(path, [], {"op": "steal"})["error"]
        assert "JSON object" in register(path, [], ["register"])["error"]
        assert "no region" in register(path, [], {"op": "unregister", "region": "x"})["error"]
    finally:
        for fd in (unsealed, empty, pipe_r):
            os.close(fd)
    with d.client() as client:
        assert client.infer("hot", {"x": X}).status == 200
    assert "region_registered" not in d.log()
    stop_clean(d)


def test_one_connection_holds_a_bounded_number_of_regions_and_can_unregister(make_daemon) -> None:
    d = start(make_daemon, MODELS)
    fds = [sealed_memfd(4096) for _ in range(MAX_REGIONS_PER_CLIENT + 1)]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.connect(str(regions_path(d.endpoint)))

            def ask(message: dict, fd_list: list[int]) -> dict:
                socket.send_fds(sock, [json.dumps(message).encode()], fd_list)
                return json.loads(sock.recv(4096))

            answers = [ask({"op": "register"}, [fd]) for fd in fds]
            assert all(a["ok"] for a in answers[:-1])
            assert not answers[-1]["ok"] and "regions per connection" in answers[-1]["error"]
            assert ask({"op": "unregister", "region": answers[0]["region"]}, []) == {"ok": True}
            assert ask({"op": "register"}, [fds[-1]])["ok"]
            with d.client() as client:
                gone = SharedTensor(answers[0]["region"], 0, "float32", (1, 512))
                assert client.infer("hot", {"x": gone}).status == 400
    finally:
        for fd in fds:
            os.close(fd)
    stop_clean(d)


def test_with_shared_memory_off_a_client_is_told_and_region_inputs_get_400(make_daemon) -> None:
    d = make_daemon(MODELS, head=head() + 'shared_memory = ""\n')
    with pytest.raises(ConnectionError, match="shared_memory"):
        SharedMemory.beside(d.endpoint, 4096)
    with d.client() as client:
        reply = client.infer("hot", {"x": SharedTensor("0" * 32, 0, "float32", (1, 512))})
    assert reply.status == 400 and "send the tensor in a frame" in reply.error
    stop_clean(d)


@pytest.mark.timing
def test_a_worker_that_crashes_with_a_region_mapped_is_given_it_again(make_daemon) -> None:
    d = start(make_daemon, MODELS)
    with d.client() as client, SharedMemory.beside(d.endpoint, 1 << 20, "survivor") as shm:
        x = shm.ndarray(X.shape, X.dtype)
        x[:] = X
        first = until_200(client, "cold", shm.ref(x))
        pid = worker(d, "cold")["pid"]
        os.kill(pid, signal.SIGKILL)
        again = until_200(client, "cold", shm.ref(x))
        new_pid = worker(d, "cold")["pid"]
        assert new_pid != pid and mapped(new_pid, "survivor")
    np.testing.assert_array_equal(first.outputs["y"], again.outputs["y"])
    stop_clean(d)


def test_a_worker_ignores_an_unmap_that_overtook_its_map() -> None:
    regions = MappedRegions()
    regions.unmap("late")  # UNMAP by the pipe, before the MAP still in the lane
    fd = sealed_memfd(4096)
    regions.map("late", os.dup(fd))
    assert len(regions) == 0
    regions.map("fresh", fd)  # map() closes the descriptor it is given, mapped or not
    assert regions.view("fresh", 1024, 16).nbytes == 16
    with pytest.raises(OSError):
        os.fstat(fd)


def test_the_region_table_names_what_is_wrong() -> None:
    table = RegionTable()
    with pytest.raises(Exception, match="never registered or its client closed it"):
        table.view("nope", 0, 4)
    assert table.info() == {"regions": 0, "bytes": 0, "clients": 0}


def test_garbage_on_the_registration_socket_costs_the_daemon_no_descriptor(make_daemon) -> None:
    d = start(make_daemon, MODELS)
    path = regions_path(d.endpoint)

    def open_fds() -> int:
        return len(os.listdir(f"/proc/{d.proc.pid}/fd"))

    with d.client() as client:
        assert client.infer("hot", {"x": X}).status == 200
    before = open_fds()
    rng = np.random.default_rng(3)
    makers = [lambda: os.open("/dev/null", os.O_RDONLY), lambda: os.pipe()[0], lambda: sealed_memfd(4096, 0),
              lambda: sealed_memfd(4096), lambda: sealed_memfd(0)]
    for round_ in range(150):
        fds = [makers[rng.integers(len(makers))]() for _ in range(rng.choice([0, 1, 1, 1, 3, 8]))]
        body = rng.choice([json.dumps({"op": "register", "name": "x" * int(rng.integers(0, 200))}).encode(),
                           json.dumps({"op": rng.choice(["unregister", "register", 7, None])}).encode(),
                           rng.bytes(int(rng.integers(1, 6000))), b"{}", b"null"])
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.connect(str(path))
            socket.send_fds(sock, [body], fds)
            if round_ % 3:  # the others hang up without reading the answer
                sock.settimeout(5)
                answer = json.loads(sock.recv(4096))
                assert set(answer) <= {"ok", "error", "region", "bytes"}
        for fd in fds:
            os.close(fd)
    # Every region went with its connection, and every descriptor that came with the garbage is closed.
    eventually(lambda: open_fds() <= before, f"the daemon back to {before} descriptors")
    with d.client() as client, d.admin() as admin:
        assert client.infer("hot", {"x": X}).status == 200
        assert admin.call("status")["daemon"]["shared_memory"]["regions"] == 0
    stop_clean(d)


def test_the_daemon_holds_a_bounded_number_of_regions_in_all(make_daemon) -> None:
    d = start(make_daemon, MODELS)
    fd = sealed_memfd(4096)
    socks = []
    try:
        answers = []
        for _ in range(MAX_REGIONS // MAX_REGIONS_PER_CLIENT + 1):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            socks.append(sock)
            sock.connect(str(regions_path(d.endpoint)))
            for _ in range(MAX_REGIONS_PER_CLIENT if len(answers) < MAX_REGIONS else 1):
                socket.send_fds(sock, [b'{"op": "register"}'], [fd])
                answers.append(json.loads(sock.recv(4096)))
        assert all(a["ok"] for a in answers[:MAX_REGIONS])
        assert not answers[-1]["ok"] and f"holds {MAX_REGIONS} regions" in answers[-1]["error"]
    finally:
        for sock in socks:
            sock.close()
        os.close(fd)
    with d.admin() as admin:
        eventually(lambda: admin.call("status")["daemon"]["shared_memory"]["regions"] == 0, "no region left")
    stop_clean(d)


def test_infermux_bench_can_measure_with_tensors_in_shared_memory(make_daemon, capsys) -> None:
    from infermux.cli import bench

    d = start(make_daemon, MODELS)
    for model in ("hot", "cold"):
        code = bench.main(["--endpoint", d.endpoint, "--model", model, "--shape", "x=64x512", "-n", "50",
                           "--warmup", "5", "--shared-memory", "--json"])
        assert code == 0 and json.loads(capsys.readouterr().out)["ok"] == 50
    assert d.log().count("region_registered name=infermux-bench") == 2
    eventually(lambda: d.log().count("region_released name=infermux-bench") == 2, "both bench regions released")
    code = bench.main(["--endpoint", "tcp://127.0.0.1:1", "--model", "hot", "--shape", "x=1x512", "-n", "1",
                       "--shared-memory", "--timeout", "0.5"])
    assert code == 2 and "needs the daemon's local ipc:// endpoint" in capsys.readouterr().err
    stop_clean(d)


def test_a_worker_given_a_descriptor_it_cannot_map_carries_on() -> None:
    regions = MappedRegions()
    read_end, write_end = os.pipe()
    regions.map("pipe", read_end)  # logs why; requests naming it then fail alone
    assert len(regions) == 0
    with pytest.raises(OSError):
        os.fstat(read_end)  # closed all the same
    os.close(write_end)


@pytest.mark.timing
def test_batched_requests_each_read_and_write_their_own_part_of_a_region(make_daemon) -> None:
    # Merging is made certain, not likely: nothing is computed on the reading thread
    # (inline_max_us = 0, inline.py), so every request waits in the executor's take,
    # which holds the batch open until it has max_batch rows (8 of these requests)
    # or the delay runs out. The delay is far longer than a stalled client, and
    # each batch fills long before it: the test does not wait it out.
    no_inline = head() + "inline_max_us = 0\n"
    batched = "max_batch = 16\nbatch_delay_us = 10000000\ntimeout_ms = 60000\n"
    d = make_daemon(f'[[models]]\nname = "hot"\nengine = "fast512/1/model.onnx"\n{batched}'
                    f'[[models]]\nname = "cold"\nengine = "fast512/1/model.onnx"\nplacement = "cold"\n'
                    f'preload = true\n{batched}', head=no_inline)
    rows = [np.full((2, 512), k, np.float32) for k in range(16)]
    with SharedMemory.beside(d.endpoint, 1 << 20, "batched") as shm, d.pipeline(timeout_s=60) as pipe:
        ins = [shm.ndarray((2, 512), "float32", offset=k * 4096) for k in range(16)]
        outs = [shm.ndarray((2, 512), "float32", offset=(16 + k) * 4096) for k in range(16)]
        for x, r in zip(ins, rows):
            x[:] = r
        with d.client(timeout_s=60) as client:
            until_200(client, "cold", np.zeros((16, 512), np.float32))  # a full batch: it never waits
        for model in ("hot", "cold"):
            for out in outs:
                out[:] = -1
            ids = [pipe.submit(model, {"x": shm.ref(x)}, output_regions={"y": shm.ref(out)})
                   for x, out in zip(ins, outs)]
            replies = pipe.gather(ids)
            assert all(r.status == 200 for r in replies), [r.header for r in replies if r.status != 200]
            assert max(r.header.get("batch", 1) for r in replies) > 1, model  # they shared runs
            for out, r in zip(outs, rows):
                np.testing.assert_array_equal(out, r)
            del replies
    stop_clean(d)
