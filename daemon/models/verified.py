"""The daemon's side of signed engines: load only an engine a trusted key signed, and load those bytes.

With `[daemon] engine_signing_keys` set, every load of a version (hot or
cold, configured or published, at start, on demand, in a hot swap or a
reload) first passes `EngineSigning.admit`, which refuses an engine whose
`FILE.sig` is missing, does not parse, is by a key not in the list, was
made for another model or version, or does not match the engine, the files
beside it and its model.toml (signing.py says what is covered).

The engine is read once: each block is hashed and written into a private
copy (a fresh folder, mode 0700, in a store only the daemon's user can
open), and the backend loads that copy, never the published file. So a file
replaced between the check and the load cannot be what is loaded: what was
verified is what runs. The copy lives as long as the version stays loaded
(onnxruntime opens its file again for each new context) and is removed when
it unloads (`release`). Every file the signature covers (signing.py:
`warmup.npz`, external weights, ...) is copied the same way beside it, so
a worker process warms up, and onnxruntime finds its external data, in the
checked copies. Before any byte is read, the signature itself is checked,
then the place it was made for (`<model>/<version>/`) and the folder's
listing: names, sizes, and no sparse file; a file of another size is
refused without being read.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from infermux import signing
from infermux.config import ConfigError, ModelConfig, parse_model_settings
from infermux.models.statefile import read_json, write_json

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


log = logging.getLogger("infermux.signing")

SPARSE_FROM = 1 << 20  # a file this large with less than half of it on disk is refused before it is read


def verified_store(run_dir: Path) -> Path:
    """Where verified copies go: under systemd's StateDirectory (on disk, not in RAM like /run) when
    the service has one, else in the runtime directory; only the daemon's user can open it."""
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    return Path(state) / "verified" if state else run_dir / "verified"


class SignatureRefused(Exception):
    """An engine without a valid signature by a trusted key: the message names the file and why."""


class Sequences:
    """The newest signing admitted of each model version (its statement's sequence), kept in
    `<state_dir>/signatures.json` across restarts when `path` is given: an older signing of the same
    version published again in its place (a downgrade) is refused. Signing the older build again
    gives it a newer sequence: that is how a rollback is published on purpose."""

    MAX_ENTRIES = 100_000

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._newest: dict[str, int] = self._read()

    def older(self, statement: signing.Statement) -> int | None:
        """The newer sequence admitted before for `statement`'s version, when it is older than that."""
        newest = self._newest.get(_label(statement))
        return newest if newest is not None and statement.sequence < newest else None

    def admitted(self, statement: signing.Statement) -> None:
        label = _label(statement)
        with self._lock:
            if statement.sequence <= self._newest.get(label, -1):
                return
            self._newest = {**self._newest, label: statement.sequence}
            if self.path is not None:
                try:
                    write_json(self.path, {"format": 1, "newest": self._newest})
                except OSError as exc:
                    log.warning("signing sequences not saved to %s (%s): a downgrade is caught until the next "
                                "restart only", self.path, exc)

    def _read(self) -> dict[str, int]:
        if self.path is None:
            return {}
        try:
            data = read_json(self.path)
            newest = data["newest"] if isinstance(data, dict) and data.get("format") == 1 else None
            if not isinstance(newest, dict) or len(newest) > self.MAX_ENTRIES or not all(
                    isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in newest.items()):
                raise ValueError("not a signing sequences file")
            return dict(newest)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError, KeyError) as exc:
            log.warning("%s cannot be read (%s): older signings are caught from now on only", self.path, exc)
            return {}


def _label(statement: signing.Statement) -> str:
    return f"{statement.model}/{statement.version}"


class EngineSigning:
    """The check every load passes: `admit` a version's engine, or refuse it saying why.

    `keys` are the trusted public keys by id; `store` is where verified copies go (made afresh,
    mode 0700, by `prepare`; removed by `close`).
    """

    def __init__(self, keys: dict[str, "Ed25519PublicKey"], store: Path, sequences: Sequences | None = None) -> None:
        self.keys = keys
        self.store = store
        self.sequences = sequences or Sequences()

    @classmethod
    def from_files(cls, paths: Sequence[Path], store: Path, sequences: Sequences | None = None) -> "EngineSigning":
        return cls(signing.load_keys(paths), store, sequences)

    def prepare(self) -> None:
        """Make the store afresh: a private folder of this user's, empty (a crash may have left copies)."""
        if self.store.is_symlink() or (self.store.exists() and not self.store.is_dir()):
            self.store.unlink()
        shutil.rmtree(self.store, ignore_errors=True)
        self.store.mkdir(mode=0o700, parents=True)
        os.chmod(self.store, 0o700)

    def close(self) -> None:
        shutil.rmtree(self.store, ignore_errors=True)

    def admit(self, mc: ModelConfig, from_settings: bool) -> Path:
        """The private copy of `mc.engine` to load, once its signature checks out; SignatureRefused
        otherwise. `from_settings`: `mc` was made from its model's model.toml (a discovered model),
        whose `backend` and `options` must then still be what was signed."""
        engine = mc.engine
        statement = self.statement(engine)
        settings = signing.read_settings(engine)
        if signing.settings_digest(settings) != statement.settings:
            raise SignatureRefused(_settings_changed(engine, statement.settings, settings))
        folder = Path(tempfile.mkdtemp(prefix=f"{_safe(mc.name)}-{_safe(mc.version)}-", dir=self.store))
        try:
            for source in _sources(engine, statement):
                got = signing.covered(source, copy_to=folder / source.name)
                if got != statement.file(source.name):
                    raise SignatureRefused(_changed(engine, source.name))
                os.chmod(folder / source.name, 0o400)
            if from_settings:
                _check_settings(mc, settings, engine)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self.sequences.admitted(statement)
        return folder / engine.name

    def statement(self, engine: Path) -> signing.Statement:
        """What `engine`'s signature says, once its key, its signature, the place it was signed for
        and its files' names and sizes check out (nothing is read but the .sig and directory entries)."""
        sig = self._signature(engine)
        key = self.keys.get(sig.key_id)
        if key is None:
            raise SignatureRefused(f"{engine} is signed by an unknown key {sig.key_id} "
                                   f"(engine_signing_keys trusts {', '.join(sorted(self.keys)) or 'none'})")
        statement = signing.verify(key, sig)
        name = signing.signature_path(engine)
        if statement is None:
            raise SignatureRefused(f"bad signature {name}: it is not the trusted key's signature of what it says "
                                   "(the signature is damaged or was edited)")
        here = signing.identity(engine)
        if (statement.model, statement.version) != here:
            raise SignatureRefused(f"bad signature {name}: it was made for {statement.model}/{statement.version}, "
                                   f"and the engine lies in {here[0]}/{here[1]}; a signature holds only where it "
                                   f"was made (sign it for this place: `infermux sign --key PUBLISHER.key {engine}`)")
        newer = self.sequences.older(statement)
        if newer is not None:
            raise SignatureRefused(f"bad signature {name}: an older signing of {statement.model}/{statement.version} "
                                   f"(sequence {statement.sequence}) than the one admitted before ({newer}): a "
                                   "downgrade; to publish an older build on purpose, sign it again")
        _check_listing(engine, statement)
        return statement

    def problem(self, mc: ModelConfig) -> str | None:
        """Why `mc`'s engine would be refused at its next load, or None (the same check as `admit`,
        in a scratch folder removed again)."""
        try:
            release(self.admit(mc, from_settings=False))
        except SignatureRefused as exc:
            return str(exc)
        except OSError as exc:
            return f"{mc.engine} cannot be read ({exc.strerror})"
        return None

    @staticmethod
    def _signature(engine: Path) -> signing.SignatureFile:
        sig_file = signing.signature_path(engine)
        try:
            with open(sig_file, "rb") as src:  # a statement's bound, plus its short head: never a whole big file
                raw = src.read(signing.MAX_STATEMENT + 1024)
            if len(raw) > signing.MAX_STATEMENT + 512:
                raise SignatureRefused(f"bad signature {sig_file}: over {signing.MAX_STATEMENT} bytes, not a signature")
            text = raw.decode("utf-8")  # names in the statement may be any printable text (signing.sign)
        except FileNotFoundError:
            raise SignatureRefused(f"{engine} is not signed: {sig_file.name} is missing (sign it with "
                                   f"`infermux sign --key PUBLISHER.key {engine}`)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SignatureRefused(f"bad signature {sig_file}: cannot read it ({exc})") from None
        try:
            return signing.SignatureFile.parse(text)
        except ValueError as exc:
            raise SignatureRefused(f"bad signature {sig_file}: {exc}") from None


def release(copy: Path | None) -> None:
    """Remove a verified copy (its folder) once the engine loaded from it is closed."""
    if copy is not None:
        shutil.rmtree(copy.parent, ignore_errors=True)


def _sources(engine: Path, statement: signing.Statement) -> list[Path]:
    return [engine.parent / f.name for f in statement.files]


def _check_listing(engine: Path, statement: signing.Statement) -> None:
    """The engine's folder holds exactly the signed files, each of its signed size and not sparse."""
    name = signing.signature_path(engine)
    try:
        present = {p.name: p for p in signing.folder_files(engine)}
    except (OSError, ValueError) as exc:
        raise SignatureRefused(f"bad signature {name}: {exc}") from None
    signed = {f.name: f for f in statement.files}
    if engine.name not in signed:
        raise SignatureRefused(f"bad signature {name}: it does not cover {engine.name}")
    added, missing = sorted(present.keys() - signed.keys()), sorted(signed.keys() - present.keys())
    if added or missing:
        what = f"{', '.join(added)} added" if added else f"{', '.join(missing)} missing"
        raise SignatureRefused(f"bad signature {name}: the folder's files changed since it was signed ({what}); "
                               "a signature covers every file beside the engine: sign again")
    for file in statement.files:
        info = present[file.name].stat()
        if info.st_size != file.size:
            raise SignatureRefused(_changed(engine, file.name))
        if info.st_size > SPARSE_FROM and info.st_blocks * 512 < info.st_size // 2:
            raise SignatureRefused(f"{present[file.name]} is a sparse file ({info.st_size} bytes, "
                                   f"{info.st_blocks * 512} on disk): not an engine anyone built")


def _changed(engine: Path, name: str) -> str:
    what = f"it does not match {name}" + (" (the engine changed since it was signed, or the signature is damaged)"
                                          if name == engine.name else " (changed since it was signed)")
    return f"bad signature {signing.signature_path(engine)}: {what}"


def _settings_changed(engine: Path, signed: signing.Covered | None, settings: bytes | None) -> str:
    said = "there was none" if signed is None else "it held other bytes"
    now = "there is none now" if settings is None else "it holds other bytes now"
    return (f"bad signature {signing.signature_path(engine)}: {signing.SETTINGS_NAME} changed since it was signed "
            f"({said}; {now}); sign again")


def _check_settings(mc: ModelConfig, settings: bytes | None, engine: Path) -> None:
    """What decides which code reads the engine (`backend`, `options`) must be what the signed
    model.toml says: that file may have been replaced and put back between the scan that read it
    and this check. (Operators change the other settings live: `ctl set`, promote, demote.)"""
    if settings is None:
        signed = ModelConfig(name=mc.name, engine=mc.engine)
    else:
        path = signing.settings_path(engine)
        try:
            signed = parse_model_settings(settings.decode("utf-8"), path, mc.name, path.parent.parent)
        except (ConfigError, UnicodeDecodeError) as exc:
            raise SignatureRefused(f"the signed {signing.SETTINGS_NAME} does not parse: {exc}") from None
    if (signed.backend, dict(signed.options)) != (mc.backend, dict(mc.options)):
        raise SignatureRefused(f"{signing.SETTINGS_NAME} changed between the scan that read it and the signature "
                               "check; the next scan applies what it says now")


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)[:40]
