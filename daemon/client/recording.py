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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

FORMAT = "infermux-recording 1"
MANIFEST = "manifest.json"


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
    """Writes a recording into `folder` (created; it must be empty), entry by entry, then its manifest."""

    folder: Path
    model: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    created: bool = False  # the folder was made for it (`discard` removes it again)

    def __post_init__(self) -> None:
        if self.folder.exists() and (not self.folder.is_dir() or any(self.folder.iterdir())):
            raise RecordingError(f"{self.folder} exists and is not an empty folder; give a new one")
        self.created = not self.folder.exists()
        self.folder.mkdir(parents=True, exist_ok=True)

    def discard(self) -> None:
        """Nothing was recorded after all: remove the folder if it was made for this."""
        if self.created and not self.requests:
            self.folder.rmdir()

    def add(self, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray], version: str,
            latency_us: int) -> None:
        name = f"{len(self.requests):06d}.npz"
        arrays = {f"inputs/{k}": v for k, v in inputs.items()}
        arrays.update({f"outputs/{k}": v for k, v in outputs.items()})
        with open(self.folder / name, "wb") as f:
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
        staged.write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(staged, self.folder / MANIFEST)
        return self.folder / MANIFEST


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


def entries(folder: Path, manifest: dict[str, Any]) -> Iterator[Entry]:
    """The recorded requests, one file at a time (a recording may not fit in memory)."""
    for item in manifest["requests"]:
        path = folder / str(item.get("file", ""))
        try:
            with np.load(path, allow_pickle=False) as data:
                inputs = {k[len("inputs/"):]: data[k] for k in data.files if k.startswith("inputs/")}
                outputs = {k[len("outputs/"):]: data[k] for k in data.files if k.startswith("outputs/")}
        except (OSError, ValueError) as exc:
            raise RecordingError(f"cannot read {path}: {exc}") from None
        yield Entry(path.name, inputs, outputs, str(item.get("version", "")), int(item.get("latency_us", 0)))
