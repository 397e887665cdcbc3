"""A recording on disk, as `infermux record` writes it and `infermux replay` reads it.

One folder:

    manifest.json      what was recorded: model, versions, count, why it ended, one entry per request
    000000.npz         request 0: arrays "inputs/<name>" and "outputs/<name>"
    000001.npz         ...

Plain files any numpy reads:

    import json, numpy as np
    manifest = json.load(open("rec/manifest.json"))
    for entry in manifest["requests"]:
        with np.load(f"rec/{entry['file']}") as data:
            x, y = data["inputs/x"], data["outputs/y"]

The manifest lists, per request, its file, the version that answered, the
daemon's latency (receipt to reply, µs) and each tensor's dtype and shape.
docs/hot-swap.md#record-and-replay.
"""

from __future__ import annotations

import json
import os
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import numpy as np

FORMAT = "infermux-recording 1"
MANIFEST = "manifest.json"
MAX_REQUEST_BYTES = 256 << 20  # one recorded request's arrays, decompressed: a zip bomb stops here


class RecordingError(Exception):
    """A folder that is not a readable recording; the message says what is wrong."""


@dataclass
class Entry:
    """One recorded request: its inputs and the outputs the serving version answered."""

    file: str
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    version: str = ""
    latency_us: int = 0

    def shapes(self) -> str:
        """The inputs as `x float32[2,4]`, for messages."""
        return ", ".join(f"{n} {a.dtype}[{','.join(map(str, a.shape))}]" for n, a in self.inputs.items())


@dataclass
class Writer:
    """Writes a recording into `folder` (created; it must be empty), entry by entry, then its manifest.

    Recorded tensors are clients' data: the folder is made 0700 and each file 0600, created exclusively
    and never through a symlink (a link planted in an existing folder fails the write, it is not
    followed), and a folder that other users may write is refused."""

    folder: Path
    model: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    created: bool = False  # the folder was made for it (`discard` removes it again)

    def __post_init__(self) -> None:
        if self.folder.is_symlink():
            raise RecordingError(f"{self.folder} is a symbolic link; give a new folder")
        if self.folder.exists() and (not self.folder.is_dir() or any(self.folder.iterdir())):
            raise RecordingError(f"{self.folder} exists and is not an empty folder; give a new one")
        self.created = not self.folder.exists()
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.folder.stat().st_mode & (stat.S_IWOTH | stat.S_IWGRP):
            self.discard()
            raise RecordingError(f"{self.folder} may be written by other users (mode "
                                 f"{stat.S_IMODE(self.folder.stat().st_mode):o}); give a folder only you may write")

    def discard(self) -> None:
        """Nothing was recorded after all: remove the folder if it was made for this."""
        if self.created and not self.requests:
            self.folder.rmdir()

    def add(self, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray], version: str,
            latency_us: int) -> None:
        name = f"{len(self.requests):06d}.npz"
        arrays = {f"inputs/{k}": v for k, v in inputs.items()}
        arrays.update({f"outputs/{k}": v for k, v in outputs.items()})
        with _create(self.folder / name) as f:
            getattr(np, "savez")(f, **arrays)  # (numpy's stub types **kwds as its own options)
        tensors = {kind: {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in group.items()}
                   for kind, group in (("inputs", inputs), ("outputs", outputs))}
        self.requests.append({"file": name, "version": version, "latency_us": latency_us, **tensors})

    def finish(self, ended: str, complete: bool) -> Path:
        """Write manifest.json (by rename: a reader never sees half of it); returns its path."""
        manifest = {"format": FORMAT, "model": self.model, "count": len(self.requests), "complete": complete,
                    "ended": ended, "versions": sorted({r["version"] for r in self.requests}),
                    "requests": self.requests}
        staged = self.folder / f".{MANIFEST}.partial"
        with _create(staged) as out:
            out.write((json.dumps(manifest, indent=1) + "\n").encode())
        os.replace(staged, self.folder / MANIFEST)  # replaces a link planted there, never writes through it
        return self.folder / MANIFEST


def _create(path: Path) -> BinaryIO:
    """A new file at `path`, 0600, created exclusively and never through a symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "wb")


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of the recording in `folder`; RecordingError when there is none fit to read."""
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordingError(f"{folder} holds no {MANIFEST}: not a recording (make one with `infermux record`)") \
            from None
    except (OSError, ValueError) as exc:
        raise RecordingError(f"cannot read {path}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(
            manifest.get("requests"), list):
        raise RecordingError(f"{path} is not an infermux recording manifest ({FORMAT!r})")
    return manifest


def entries(folder: Path, manifest: dict[str, Any], max_bytes: int = MAX_REQUEST_BYTES) -> Iterator[Entry]:
    """The recorded requests, one file at a time (a recording may not fit in memory). Only plain files
    directly inside `folder` are read, and none whose arrays would take more than `max_bytes`
    (declared sizes, checked before anything is decompressed)."""
    for item in manifest["requests"]:
        path = _member(folder, item.get("file", "") if isinstance(item, dict) else "")
        try:
            _check_size(path, max_bytes)
            with np.load(path, allow_pickle=False) as data:
                inputs = {k[len("inputs/"):]: data[k] for k in data.files if k.startswith("inputs/")}
                outputs = {k[len("outputs/"):]: data[k] for k in data.files if k.startswith("outputs/")}
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise RecordingError(f"cannot read {path}: {exc}") from None
        yield Entry(path.name, inputs, outputs, str(item.get("version", "")), int(item.get("latency_us", 0)))


def _member(folder: Path, name: Any) -> Path:
    """`folder/name` when `name` is a plain file's name inside the folder (no path, no link)."""
    text = str(name)
    path = folder / text
    if not text or text in (".", "..") or "/" in text or "\x00" in text or path.is_symlink() or not path.is_file():
        raise RecordingError(f"the manifest names {text[:80]!r}, which is not a plain file inside {folder}; "
                             "a recording lists only its own files")
    return path


def _check_size(path: Path, max_bytes: int) -> None:
    """ValueError when the .npz's members would decompress to more than `max_bytes` in all, by the zip's
    sizes and by the arrays' own headers (numpy allocates what a header says before reading the data)."""
    with zipfile.ZipFile(path) as archive:
        total = sum(info.file_size for info in archive.infolist())
        if total <= max_bytes:
            total = max(total, sum(_array_bytes(archive, info) for info in archive.infolist()))
    if total > max_bytes:
        raise ValueError(f"its arrays take {total} bytes, over the {max_bytes} a recorded request may "
                         "(infermux replay --max-request-mb raises it)")


def _array_bytes(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> int:
    """What the .npy member `info` says its array takes (0 for a member that is not one)."""
    if not info.filename.endswith(".npy"):
        return 0
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(member)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(member)
    return int(np.prod(shape, dtype=object)) * dtype.itemsize
