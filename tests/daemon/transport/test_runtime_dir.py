"""The daemon starts however it is run: as root or an ordinary user, relative, absolute or tcp endpoints.

Started by hand there is no systemd to make /run/infermux: the daemon makes
its runtime folder itself (mode 0750, as RuntimeDirectory= would), and the
shared-memory socket lies beside the first ipc listener, where clients look
for it (docs/operating.md, "Tensors in shared memory"). Each start here points the
runtime folder at one that does not exist yet; "nobody" runs through
setpriv, which needs root (elsewhere that case runs as the calling user).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from support.harness import REPO, Daemon, free_port
from support.users import NOBODY, infermux_as
from infermux import config as cfg
from infermux.cli.keygen import make_keypair
from infermux.client import Client, SharedMemory
from infermux.transport.curve import client_options

X = np.zeros((1, 3, 64, 64), np.float32)

HEAD = """
[daemon]
listen = [{listen}]
runtime_dir = "{run}"
engine_dir = "{top}/engines"
watch = false
{curve}
[[models]]
name = "classifier"
engine = "{top}/engines/classifier/1/model.onnx"
"""


class HandStarted(Daemon):
    """A daemon started as an operator would by hand: no --runtime-dir, maybe as another user."""

    def __init__(self, workdir: Path, config_text: str, command: list[str]) -> None:
        super().__init__(workdir, config_text)
        self.command = command

    def start(self, wait_ready: bool = True, timeout: float = 60.0) -> "HandStarted":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([*self.command, "serve", "--config", str(self.config_path),
                                      "--state-dir", str(self.state_dir)],
                                     stdout=self._log, stderr=subprocess.STDOUT, cwd=self.workdir,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.wait_for(" ready ", timeout)
        return self


@pytest.fixture
def top() -> Iterator[Path]:
    """A folder every user may read (pytest's tmp_path is root's alone), with the sample engine."""
    path = Path(tempfile.mkdtemp(prefix="infermux-rt-"))
    path.chmod(0o755)
    shutil.copytree(REPO / "engines/classifier", path / "engines/classifier")
    (path / "work").mkdir(mode=0o777)
    (path / "work").chmod(0o777)  # the daemon's user writes its sockets below here
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _endpoint(kind: str, top: Path) -> tuple[str, str]:
    """(listen entry, where a client connects) for a relative, absolute or tcp listener."""
    if kind == "relative":
        return '"ipc://infer.sock"', f"ipc://{top}/work/run/infermux/infer.sock"
    if kind == "absolute":
        return f'"ipc://{top}/work/abs/infer.sock"', f"ipc://{top}/work/abs/infer.sock"
    port = free_port()
    return f'"tcp://127.0.0.1:{port}"', f"tcp://127.0.0.1:{port}"


def _curve(kind: str, top: Path, uid: int) -> str:
    """The [daemon] lines a tcp listener needs (CURVE), with keys the daemon's user `uid` owns."""
    if kind != "tcp":
        return ""
    keys = top / "keys"
    server_public, _ = make_keypair(keys / "server", "server")
    client_public, _ = make_keypair(keys / "client", "client")
    (keys / "authorized").mkdir()
    shutil.copy(client_public, keys / "authorized")
    shutil.copy(server_public, keys / "client/server.key")
    for path in [keys, *keys.rglob("*")]:
        os.chown(path, uid, -1)
    return (f'curve_secret_key = "{keys}/server/server.key_secret"\n'
            f'curve_authorized_dir = "{keys}/authorized"')


@pytest.mark.parametrize("kind", ["relative", "absolute", "tcp"])
@pytest.mark.parametrize("user", ["root", "nobody"])
def test_the_daemon_starts_without_its_runtime_folder(top: Path, user: str, kind: str, traversable: None) -> None:
    command = infermux_as(user)
    run = top / "work/run/infermux"          # does not exist: nobody made it
    listen, endpoint = _endpoint(kind, top)
    uid = NOBODY if user == "nobody" and os.geteuid() == 0 else os.geteuid()
    text = HEAD.format(listen=listen, run=run, top=top, curve=_curve(kind, top, uid))
    daemon = HandStarted(top / "work", text, command)
    try:
        daemon.start()
        curve = client_options(top / "keys/client") if kind == "tcp" else None
        with Client(endpoint, timeout_s=10, curve=curve) as client:
            assert client.infer("classifier", {"images": X}).status == 200
        # The runtime folder as the unit's RuntimeDirectory= would make it.
        info = run.stat()
        assert stat.S_IMODE(info.st_mode) == 0o750
        assert info.st_uid == uid
        if kind != "tcp":
            _regions_lie_beside(endpoint)
        else:
            assert (run / "regions.sock").exists()  # no ipc listener: in the runtime folder
    finally:
        assert daemon.stop() == 0, daemon.log()


def _regions_lie_beside(endpoint: str) -> None:
    """Where a client looks for regions.sock (beside infer.sock), the daemon listens."""
    with SharedMemory.beside(endpoint, 1 << 20, "rt") as shm:
        x = shm.ndarray((1, 3, 64, 64), "float32")
        x[:] = 0
        with Client(endpoint, timeout_s=10) as client:
            assert client.infer("classifier", {"images": shm.ref(x)}).status == 200


def test_regions_path_follows_the_first_ipc_listener(tmp_path: Path) -> None:
    def daemon(listen: list[str], shared_memory: str = "regions.sock") -> cfg.DaemonConfig:
        return cfg.DaemonConfig(listen=tuple(listen), shared_memory=shared_memory)

    run = tmp_path / "run"
    assert cfg.regions_path(daemon(["ipc://infer.sock"]), run) == run / "regions.sock"
    assert cfg.regions_path(daemon(["tcp://127.0.0.1:1", "ipc:///srv/x/infer.sock"]), run) == Path("/srv/x/regions.sock")
    assert cfg.regions_path(daemon(["tcp://127.0.0.1:1"]), run) == run / "regions.sock"
    assert cfg.regions_path(daemon(["ipc:///srv/x/infer.sock"], "/var/r.sock"), run) == Path("/var/r.sock")
    assert cfg.regions_path(daemon(["ipc:///srv/x/infer.sock"], ""), run) is None


def test_an_existing_runtime_folder_keeps_its_mode(tmp_path: Path) -> None:
    from infermux.transport import ipc

    made, kept = tmp_path / "a/b", tmp_path / "kept"
    kept.mkdir(mode=0o700)
    old = os.umask(0o077)  # the umask must not decide the mode
    try:
        ipc.make_dir(made)
        ipc.make_dir(kept)
    finally:
        os.umask(old)
    assert stat.S_IMODE(made.stat().st_mode) == 0o750
    assert stat.S_IMODE(kept.stat().st_mode) == 0o700
