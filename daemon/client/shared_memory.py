"""A client's shared-memory region: sealed memory that its requests point into.

The daemon's side (registration socket, region table, workers' mappings)
is infermux.transport.regions; this is the part a client process runs.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import socket
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from infermux.protocol import DTYPES, SharedTensor, dtype_name
from infermux.transport import ipc

_PACKET = 4096


def regions_path(endpoint: str) -> Path:
    """Where a daemon listening on ipc `endpoint` takes registrations by default: beside it."""
    if not endpoint.startswith("ipc://"):
        raise ValueError(f"shared memory needs a local ipc:// endpoint, not {endpoint}")
    return Path(endpoint[len("ipc://"):]).parent / "regions.sock"


_OPEN: "weakref.WeakValueDictionary[str, SharedMemory]" = weakref.WeakValueDictionary()


def local_view(token: str, offset: int, nbytes: int) -> memoryview:
    """Bytes in one of this process's open regions (decode_reply's outputs written there)."""
    shm = _OPEN.get(token)
    if shm is None or shm._map is None:
        raise KeyError(f"region {token[:8]} is not open in this process (closed before the reply?)")
    if offset < 0 or offset + nbytes > shm.size:
        raise ValueError(f"bytes {offset}..{offset + nbytes} are outside the region of {shm.size} bytes")
    return memoryview(shm._map)[offset:offset + nbytes]


class SharedMemory:
    """A client's region: sealed memory that requests can point into.

        with SharedMemory.beside("ipc:///run/infermux/infer.sock", 8 << 20) as shm:
            frame = shm.ndarray((1, 3, 640, 640), "float32")
            frame[:] = camera.read()
            client.infer("detector", {"images": shm.ref(frame)})

    Do not write an array while a request that points at it is in flight.
    """

    def __init__(self, path: str | Path, nbytes: int, name: str = "infermux") -> None:
        self.size = nbytes
        self._map: mmap.mmap | None = None
        self._base: np.ndarray | None = None  # the region's bytes while it is open
        self._fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            os.ftruncate(self._fd, nbytes)
            fcntl.fcntl(self._fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self._map = mmap.mmap(self._fd, nbytes)
            # Every page written now, charged to this process: the daemon refuses inputs on pages never
            # written (holes: reading them would allocate pages for it), and the outputs it writes here
            # take no memory of its own. (fallocate reserves pages that still read as holes.)
            np.frombuffer(self._map, np.uint8).fill(0)
            self._sock.settimeout(10)
            ipc.check_directory(f"ipc://{path}")  # a socket anyone could have put there is not the daemon's
            try:
                self._sock.connect(str(path))
            except OSError as exc:
                raise ConnectionError(f"cannot register shared memory at {path}: {exc}; is `infermux serve` "
                                      "running, with [daemon] shared_memory on?") from None
            socket.send_fds(self._sock, [json.dumps({"op": "register", "name": name}).encode()], [self._fd])
            answer = json.loads(self._sock.recv(_PACKET) or b"{}")
        except BaseException:
            self.close()
            raise
        if not answer.get("ok"):
            self.close()
            raise ConnectionError(f"the daemon refused the region: {answer.get('error', 'no answer')}")
        self.token: str = answer["region"]
        self._base = np.frombuffer(self._map, dtype=np.uint8)
        _OPEN[self.token] = self

    @classmethod
    def beside(cls, endpoint: str, nbytes: int, name: str = "infermux") -> "SharedMemory":
        """A region registered with the daemon that listens on ipc `endpoint` (default layout)."""
        return cls(regions_path(endpoint), nbytes, name)

    def ndarray(self, shape: tuple[int, ...], dtype: Any = "float32", offset: int = 0) -> np.ndarray:
        """A writable array in the region at `offset` bytes."""
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        return self._bytes()[offset:offset + count * dt.itemsize].view(dt).reshape(shape)

    def ref(self, array: np.ndarray) -> SharedTensor:
        """What a request sends instead of `array`, which must lie in this region."""
        start = array.__array_interface__["data"][0] - self._bytes().__array_interface__["data"][0]
        if not array.flags.c_contiguous or start < 0 or start + array.nbytes > self.size:
            raise ValueError("ref() takes a C-contiguous array made by this region's ndarray()")
        dtype = dtype_name(array.dtype)
        if dtype not in DTYPES:
            raise ValueError(f"dtype {array.dtype} cannot go on the wire; use one of {', '.join(DTYPES)}")
        return SharedTensor(self.token, start, dtype, tuple(array.shape))

    def _bytes(self) -> np.ndarray:
        """The region as uint8; a closed region has none, and says so."""
        if self._base is None:
            raise ValueError("this SharedMemory is closed; open a new one")
        return self._base

    def close(self) -> None:
        """Unregister (closing the connection does it) and unmap; arrays on it must be dropped first."""
        self._sock.close()
        mapping, self._map = self._map, None
        self._base = None
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                pass  # arrays on it still live: the mapping goes with the last of them
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "SharedMemory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
