"""The daemon's side of signed engines: load only an engine a trusted key signed, and load those bytes.

With `[daemon] engine_signing_keys` set, every load of a version (hot or
cold, configured or published, at start, on demand, in a hot swap or a
reload) first passes `EngineSigning.admit`, which refuses an engine whose
`FILE.sig` is missing, does not parse, is by a key not in the list, or does
not match the engine and its model.toml (signing.py says what is covered).

The engine is read once: each block is hashed and written into a private
copy (a fresh folder, mode 0700, in a store only the daemon's user can
open), and the backend loads that copy, never the published file. So a file
replaced between the check and the load cannot be what is loaded: what was
verified is what runs. The copy lives as long as the version stays loaded
(onnxruntime opens its file again for each new context) and is removed when
it unloads (`release`). `warmup.npz` (plain arrays, never unpickled) is copied
beside it, so a worker process warms up as before.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from infermux import signing
from infermux.config import ConfigError, ModelConfig, parse_model_settings

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


def verified_store(run_dir: Path) -> Path:
    """Where verified copies go: under systemd's StateDirectory (on disk, not in RAM like /run) when
    the service has one, else in the runtime directory; only the daemon's user can open it."""
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    return Path(state) / "verified" if state else run_dir / "verified"


class SignatureRefused(Exception):
    """An engine without a valid signature by a trusted key: the message names the file and why."""


class EngineSigning:
    """The check every load passes: `admit` a version's engine, or refuse it saying why.

    `keys` are the trusted public keys by id; `store` is where verified copies go (made afresh,
    mode 0700, by `prepare`; removed by `close`).
    """

    def __init__(self, keys: dict[str, "Ed25519PublicKey"], store: Path) -> None:
        self.keys = keys
        self.store = store

    @classmethod
    def from_files(cls, paths: Sequence[Path], store: Path) -> "EngineSigning":
        return cls(signing.load_keys(paths), store)

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
        sig = self._signature(engine)
        key = self.keys.get(sig.key_id)
        if key is None:
            raise SignatureRefused(f"{engine} is signed by an unknown key {sig.key_id} "
                                   f"(engine_signing_keys trusts {', '.join(sorted(self.keys)) or 'none'})")
        settings = signing.read_settings(engine)
        folder = Path(tempfile.mkdtemp(prefix=f"{_safe(mc.name)}-{_safe(mc.version)}-", dir=self.store))
        copy = folder / engine.name
        try:
            digests = signing.Digests(signing.digest_file(engine, copy), signing.settings_digest(settings))
            if not signing.verify(key, sig, digests):
                raise SignatureRefused(_mismatch(engine, sig, digests))
            if from_settings:
                _check_settings(mc, settings, engine)
            os.chmod(copy, 0o400)
            _copy_warmup(engine, folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return copy

    @staticmethod
    def _signature(engine: Path) -> signing.SignatureFile:
        sig_file = signing.signature_path(engine)
        try:
            text = sig_file.read_text(encoding="ascii")
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


def _mismatch(engine: Path, sig: signing.SignatureFile, digests: signing.Digests) -> str:
    name = signing.signature_path(engine)
    if sig.settings != digests.settings:
        said = "there was none" if sig.settings is None else "it held other bytes"
        now = "there is none now" if digests.settings is None else "it holds other bytes now"
        return f"bad signature {name}: {signing.SETTINGS_NAME} changed since it was signed ({said}; {now}); sign again"
    return (f"bad signature {name}: it does not match {engine.name} (the engine changed since it was signed, "
            "or the signature is damaged)")


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


def _copy_warmup(engine: Path, folder: Path) -> None:
    """warmup.npz beside the engine goes with the copy (warm-up inputs: plain arrays, never unpickled)."""
    warmup = engine.parent / "warmup.npz"
    if warmup.is_file():
        shutil.copyfile(warmup, folder / warmup.name)


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)[:40]
