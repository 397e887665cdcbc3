"""Put engines into a watched engine directory the way docs/hot-swap.md says operators do."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np

from infermux.client import Reply
from support import models
from support.harness import Daemon, Value, daemon_head
from support.polling import eventually

PROBE = np.arange(8, dtype=np.float32).reshape(2, 4)  # a request for the published models (4 wide)
# A daemon watching its engine_dir closely: a version published there is seen within about a second.
WATCH_CLOSELY: dict[str, Value] = {"watch_settle_s": 0.4, "watch_debounce_s": 0.02, "watch_rescan_s": 1.0}


def watching(root: Path, **settings: Value) -> str:
    """A `[daemon]` table serving what is published under `root`, watched closely, with `settings`."""
    return daemon_head(root, **{**WATCH_CLOSELY, **settings})


def publish(root: Path, model: str, version: str | int, offset: float, width: int = 4,
            checksum: str | None = None, name: str = "model.onnx") -> Path:
    """An add_one model (y = x + offset), published the documented way.

    A new version: its folder is built under a hidden name and renamed into
    place. An existing version: the file is written under a hidden name
    beside the old one and renamed over it. `checksum`: "good" publishes a
    matching `model.onnx.sha256` first, "bad" a wrong one.
    """
    final = root / model / str(version) / name
    exists = final.parent.is_dir()
    staged = models.add_one((final.parent if exists else root / model / f".{version}.tmp") / f".{name}.tmp",
                            width=width, offset=offset)
    if checksum is not None:
        digest = hashlib.sha256(staged.read_bytes()).hexdigest() if checksum == "good" else "0" * 64
        write_atomically(staged.with_name(name + ".sha256"), f"{digest}  {name}\n".encode())
    if exists:
        os.replace(staged, final)
    else:
        os.replace(staged, staged.with_name(name))
        os.rename(staged.parent, final.parent)
    return final


def write_atomically(path: Path, data: bytes) -> None:
    """Write under a temporary name in the same folder, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_slowly(path: Path, data: bytes, steps: int, pause_s: float) -> None:
    """Write `data` in place in `steps` chunks with pauses: what a slow copy looks like."""
    path.parent.mkdir(parents=True, exist_ok=True)
    chunk = -(-len(data) // steps)
    with open(path, "wb") as f:
        for i in range(0, len(data), chunk):
            f.write(data[i:i + chunk])
            f.flush()
            os.fsync(f.fileno())
            time.sleep(pause_s)


def wait_served(daemon: Daemon, model: str, version: str, offset: float, timeout: float = 15.0) -> Reply:
    """Poll until requests naming no version are answered by `version` with outputs PROBE + `offset`."""
    with daemon.client() as client:
        def served() -> Reply | None:
            reply = client.infer(model, {"x": PROBE})
            ok = reply.status == 200 and reply.version == version and np.array_equal(reply.outputs["y"], PROBE + offset)
            return reply if ok else None

        try:
            return eventually(served, f"{model} version {version} served", timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}:\n{daemon.log()}") from None
