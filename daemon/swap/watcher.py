"""The engine-directory watcher: filesystem events in, complete files out.

It watches `<engine_dir>/<model>/<version>/model.{plan,engine,onnx}` (with
their `.sha256` and `.sig` beside them, and `<engine_dir>/<model>/model.toml`) with watchdog, waits until a burst of
events is over (debounce), rescans the whole tree, and hands a `Snapshot`
to a callback. A rescan rather than per-event bookkeeping: inotify drops
events on overflow and says nothing about files inside a directory renamed
into place, but a scan of a few folders costs microseconds and is always
right. A periodic rescan covers filesystems without inotify (NFS).

A file counts as complete ("stable") once it arrived by a rename
(`mv tmp model.onnx`: the documented way to publish), or its size, mtime and
inode have not changed for `settle_s`, or its mtime was already `settle_s`
old when first seen (files present at start). Temporary and hidden names
are never looked at: `.*`, `*.tmp`, `*.part`, `*.partial`, `*~`.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

log = logging.getLogger("infermux.watcher")

# Preference order when one version folder holds more than one engine file:
# a TensorRT plan is the one built for this device.
ENGINE_NAMES = ("model.plan", "model.engine", "model.onnx")
SETTINGS_NAME = "model.toml"
CHECKSUM_SUFFIX = ".sha256"
SIGNATURE_SUFFIX = ".sig"
_IGNORED_SUFFIXES = (".tmp", ".part", ".partial", "~", ".swp")


def ignored(name: str) -> bool:
    """Names a writer uses before the file is complete, and hidden ones."""
    return name.startswith(".") or name.endswith(_IGNORED_SUFFIXES)


@dataclass(frozen=True)
class FileSig:
    """What tells two versions of a file apart without reading it."""

    size: int
    mtime_ns: int
    inode: int

    @classmethod
    def of(cls, st: os.stat_result) -> "FileSig":
        return cls(st.st_size, st.st_mtime_ns, st.st_ino)


@dataclass(frozen=True)
class EngineFile:
    """One engine file found at `<model>/<version>/`, with its optional checksum file."""

    model: str
    version: str
    path: Path
    sig: FileSig
    stable: bool
    checksum: Path | None = None
    checksum_sig: FileSig | None = None
    signature_sig: FileSig | None = None  # its `.sig` (signing.py)

    @property
    def companions(self) -> tuple[FileSig | None, FileSig | None]:
        """The files beside it that decide whether it loads (checksum, signature): a new one is news."""
        return (self.checksum_sig, self.signature_sig)


def checksum_problem(f: EngineFile) -> str:
    """'' if the file matches its `model.<ext>.sha256` (or has none), else why not."""
    if f.checksum is None:
        return ""
    try:
        words = f.checksum.read_text(encoding="ascii", errors="replace").split()
    except OSError as exc:
        return f"cannot read {f.checksum.name}: {exc.strerror}"
    want = words[0].lower() if words else ""
    if len(want) != 64:
        return f"{f.checksum.name} holds no sha256 (expected 64 hex digits, as sha256sum writes)"
    digest = hashlib.sha256()
    try:
        with open(f.path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        return f"cannot read {f.path.name}: {exc.strerror}"
    have = digest.hexdigest()
    return "" if have == want else f"sha256 of {f.path.name} is {have[:16]}…, {f.checksum.name} says {want[:16]}…"


@dataclass(frozen=True)
class Snapshot:
    """The engine directory as one scan found it."""

    engines: dict[tuple[str, str], EngineFile] = field(default_factory=dict)
    settings: dict[str, tuple[Path, FileSig]] = field(default_factory=dict)  # model -> model.toml

    def models(self) -> set[str]:
        return {m for m, _ in self.engines} | set(self.settings)

    def versions(self, model: str) -> dict[str, EngineFile]:
        return {v: f for (m, v), f in self.engines.items() if m == model}


@dataclass
class _Seen:
    sig: FileSig
    since: float
    stable: bool


class Settler:
    """Decides when a file is complete; remembers what each path looked like."""

    def __init__(self, settle_s: float) -> None:
        self.settle_s = settle_s
        self._seen: dict[Path, _Seen] = {}
        self._renamed: set[Path] = set()
        self._lock = threading.Lock()

    def renamed_into_place(self, path: Path) -> None:
        with self._lock:
            self._renamed.add(path)

    def written(self, path: Path) -> None:
        with self._lock:
            self._renamed.discard(path)

    def observe(self, path: Path, sig: FileSig, now: float) -> bool:
        """True once `path` with this signature counts as complete."""
        with self._lock:
            renamed = path in self._renamed
            self._renamed.discard(path)
        seen = self._seen.get(path)
        if seen is None or seen.sig != sig:
            old_enough = time.time() - sig.mtime_ns / 1e9 >= self.settle_s
            seen = self._seen[path] = _Seen(sig, now, renamed or old_enough)
            log.debug("%s: %d bytes, %s", path, sig.size, "renamed into place" if renamed else
                      "old enough" if old_enough else f"waiting {self.settle_s} s for writes to stop")
        elif renamed or now - seen.since >= self.settle_s:
            seen.stable = True  # (a scan may see the renamed file before its event arrives)
        return seen.stable

    def next_check(self, now: float) -> float | None:
        """Seconds until the earliest unsettled file may have settled, or None."""
        waits = [s.since + self.settle_s - now for s in self._seen.values() if not s.stable]
        return max(0.0, min(waits)) if waits else None

    def forget_missing(self, present: set[Path]) -> None:
        for path in [p for p in self._seen if p not in present]:
            del self._seen[path]


def _stat(path: Path) -> os.stat_result | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st if path.is_file() else None


def _dirs(folder: Path) -> list[Path]:
    """Sub-folders that count. A folder removed meanwhile is empty; one we may not read fails the scan.

    (An unreadable folder must not look like "every version removed".)
    """
    try:
        return sorted(p for p in folder.iterdir() if not ignored(p.name) and p.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def scan(root: Path, settler: Settler) -> Snapshot:
    """One pass over the engine directory. Raises OSError if `root` itself cannot be read.

    A missing or unreadable root must not look like "every model removed".
    """
    if not root.is_dir():
        raise OSError(f"engine directory {root} does not exist or is not a folder")
    os.listdir(root)  # raises PermissionError now rather than an empty scan
    now = time.monotonic()
    engines: dict[tuple[str, str], EngineFile] = {}
    settings: dict[str, tuple[Path, FileSig]] = {}
    present: set[Path] = set()
    for model_dir in _dirs(root):
        toml = model_dir / SETTINGS_NAME
        st = _stat(toml)
        if st is not None:
            settings[model_dir.name] = (toml, FileSig.of(st))
        for version_dir in _dirs(model_dir):
            found = _engine_in(version_dir, settler, now)
            if found is not None:
                path, sig, stable, checksum, checksum_sig = found
                present.add(path)
                signature = _stat(path.with_name(path.name + SIGNATURE_SUFFIX))
                engines[(model_dir.name, version_dir.name)] = EngineFile(
                    model_dir.name, version_dir.name, path, sig, stable, checksum, checksum_sig,
                    FileSig.of(signature) if signature else None)
    settler.forget_missing(present)
    return Snapshot(engines, settings)


def _engine_in(folder: Path, settler: Settler,
               now: float) -> tuple[Path, FileSig, bool, Path | None, FileSig | None] | None:
    """The folder's engine file: (path, sig, stable, checksum file, its sig), or None."""
    for name in ENGINE_NAMES:
        path = folder / name
        st = _stat(path)
        if st is None:
            continue
        sig = FileSig.of(st)
        checksum = path.with_name(name + CHECKSUM_SUFFIX)
        cst = _stat(checksum)
        return (path, sig, settler.observe(path, sig, now), checksum if cst else None,
                FileSig.of(cst) if cst else None)
    return None


class _Handler(FileSystemEventHandler):
    """watchdog callback (its own thread): note what happened, ring the bell."""

    def __init__(self, watcher: "EngineWatcher") -> None:
        self.watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return  # reads (our own loads among them) change nothing
        src = Path(os.fsdecode(event.src_path))
        dest = Path(os.fsdecode(event.dest_path)) if getattr(event, "dest_path", "") else None
        if all(p is None or ignored(p.name) for p in (src, dest)):
            return  # a writer's temporary file; its rename into place is what counts
        settler = self.watcher.settler
        if event.event_type == "moved" and dest is not None and not ignored(dest.name):
            for path in _engine_files(dest) if event.is_directory else [dest]:
                settler.renamed_into_place(path)
        elif event.event_type in ("modified", "created", "closed"):
            settler.written(src)
        self.watcher.poke()


def _engine_files(folder: Path) -> list[Path]:
    """Engine files in a folder renamed into place: a version folder, or a model folder."""
    names = set(ENGINE_NAMES)
    try:
        return [p for p in folder.rglob("model.*") if p.name in names and len(p.relative_to(folder).parts) <= 2]
    except OSError:
        return []


MOVE_PAIRING_S = 0.05


def _shorten_move_pairing() -> None:
    """Make watchdog deliver a rename promptly.

    watchdog holds each IN_MOVED_FROM for 0.5 s to pair it with its
    IN_MOVED_TO, and a reader already waiting on it sleeps out the whole
    delay even once the pair is found, so a rename could reach us that much
    late. The kernel queues both halves of
    a rename together, so 50 ms is ample; an unpaired half only costs the
    settle window, never correctness.
    """
    for module, name in (("watchdog.observers.inotify_move_event_grouper", "InotifyMoveEventGrouper"),
                         ("watchdog.observers.inotify_buffer", "InotifyBuffer")):
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if isinstance(getattr(cls, "delay", None), (int, float)) and cls.delay > MOVE_PAIRING_S:
            cls.delay = MOVE_PAIRING_S


class EngineWatcher:
    """Watches `root`; calls `on_snapshot` after each burst of changes, on its own thread.

    `on_snapshot` runs on the watcher thread, so snapshots are handled one at
    a time and in order; changes made meanwhile are seen by the next scan.
    """

    def __init__(self, root: Path, on_snapshot: Callable[[Snapshot], None], settle_s: float = 1.0,
                 debounce_s: float = 0.05, rescan_s: float = 5.0) -> None:
        self.root = root
        self.settler = Settler(settle_s)
        self.debounce_s = debounce_s
        self.rescan_s = rescan_s
        self._on_snapshot = on_snapshot
        self._bell = threading.Event()
        self._stopping = False
        # Observer is a variable naming the platform's class; BaseObserver is the type.
        self._observer: BaseObserver | None = None
        self._thread = threading.Thread(target=self._run, name="engine-watcher", daemon=True)
        self._last_poke = 0.0

    def watch(self) -> bool:
        """Start receiving filesystem events (before the first scan, so none is missed)."""
        _shorten_move_pairing()
        observer = Observer()
        try:
            observer.schedule(_Handler(self), str(self.root), recursive=True)
            observer.start()
        except (OSError, RuntimeError) as exc:
            log.warning("cannot watch %s (%s); rescanning every %.1f s instead", self.root, exc,
                        self.rescan_s or 5.0)
            self.rescan_s = self.rescan_s or 5.0
            return False
        self._observer = observer
        return True

    def scan(self) -> Snapshot:
        return scan(self.root, self.settler)

    def start(self) -> None:
        """Start handling changes on the watcher thread."""
        self._thread.start()

    def poke(self) -> None:
        """Something changed (or someone wants a pass now): rescan soon."""
        self._last_poke = time.monotonic()
        self._bell.set()

    def stop(self) -> None:
        self._stopping = True
        self._bell.set()
        if self._observer is not None:
            self._observer.stop()

    def _wait(self) -> None:
        """Sleep until poked, a file may have settled, or the rescan interval ends; then debounce."""
        waits = [w for w in (self.settler.next_check(time.monotonic()), self.rescan_s or None) if w is not None]
        if self._bell.wait(min(waits) if waits else None):
            # Let a burst finish (a copy, an extraction) but never wait forever on a busy folder.
            limit = time.monotonic() + max(1.0, 20 * self.debounce_s)
            while time.monotonic() < limit:
                quiet = self.debounce_s - (time.monotonic() - self._last_poke)
                if quiet <= 0:
                    break
                time.sleep(quiet)
        self._bell.clear()

    def _run(self) -> None:
        while not self._stopping:
            try:
                snapshot = self.scan()
            except OSError as exc:
                log.warning("skipping a scan of the engine directory: %s", exc)
            else:
                try:
                    self._on_snapshot(snapshot)
                except Exception:  # a bad model or a bug in one pass must not stop the watcher
                    log.exception("handling a change in %s failed; watching on", self.root)
            if self._stopping:
                break
            self._wait()
