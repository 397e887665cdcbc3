"""Engine signatures: the key pairs, the `FILE.sig` format and what a signature covers.

A publisher makes an Ed25519 key pair once (`infermux sign --keygen
PREFIX`: PREFIX.key, mode 0600, and PREFIX.pub) and signs each engine it
publishes (`infermux sign --key PREFIX.key FILE`), which writes `FILE.sig`
beside it. The daemon's check is models/verified.py;
docs/security.md#signed-engines is the workflow.

A signature binds the engine to its place and to everything loaded with it:

- the model's name and version it is published as (`<model>/<version>/`
  in the engine directory: the engine's folder and the one above), so a
  copy under another name or version is refused;
- every file in the engine's folder (the engine, `warmup.npz`, ONNX
  external weights such as `model.onnx.data`, whatever else the backend
  may open), by name, size and SHA-256 — a file added, removed or changed
  after signing voids it;
- the model folder's `model.toml`, which chooses the backend and options;
- a sequence number that grows with every signing (microseconds since
  the epoch, or one more than the signature it replaces).

What is signed is that statement, short text of digests, not the files, so
a multi-GB plan is never held in memory; and since it carries the sizes,
the daemon refuses a file of the wrong size before reading a byte of it:

    infermux engine signature 2
    model det
    version 4
    sequence 1765070000123456
    settings 41 <sha256 hex>            (or: settings none)
    file 8123 <sha256 hex> model.onnx
    file 2048 <sha256 hex> warmup.npz

`FILE.sig` is text: a format line, the key's id (the first 16 hex digits
of the SHA-256 of its raw public key), the signature in base64, an empty
line, then the statement itself. No cryptography is written here: the
`cryptography` package makes keys, signs and verifies.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SIG_SUFFIX = ".sig"
FORMAT = "infermux-signature 2"
OLD_FORMAT = "infermux-signature 1"
STATEMENT = "infermux engine signature 2"
SETTINGS_NAME = "model.toml"
BLOCK = 1 << 20
MAX_FILES = 64  # files in one engine's folder: more is a folder shared by engines, not one version's
MAX_STATEMENT = 64 << 10
PRIVATE_SUFFIX, PUBLIC_SUFFIX = ".key", ".pub"
NEEDS = "engine signing needs the Python package `cryptography` (Debian: apt install python3-cryptography)"


@dataclass(frozen=True)
class Covered:
    """One file a signature covers: its name in the engine's folder, size and SHA-256."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Statement:
    """What a signature says: the identity the engine is published as, and every file loaded with it."""

    model: str
    version: str
    sequence: int
    settings: Covered | None  # the model folder's model.toml (named "model.toml"), None when there is none
    files: tuple[Covered, ...] = field(default=())

    def text(self) -> str:
        settings = f"settings {self.settings.size} {self.settings.sha256}" if self.settings else "settings none"
        lines = [STATEMENT, f"model {self.model}", f"version {self.version}", f"sequence {self.sequence}", settings]
        lines += [f"file {f.size} {f.sha256} {f.name}" for f in self.files]
        return "\n".join(lines) + "\n"

    @classmethod
    def parse(cls, text: str) -> "Statement":
        """Raises ValueError saying what is wrong."""
        lines = text.splitlines()
        if not lines or lines[0] != STATEMENT:
            raise ValueError(f"its statement does not start with {STATEMENT!r}")
        head = dict(line.split(" ", 1) for line in lines[1:5] if " " in line)
        try:
            settings = None if head["settings"] == "none" else _covered(SETTINGS_NAME, head["settings"])
            files = tuple(_file_line(line) for line in lines[5:])
            return cls(head["model"], head["version"], int(head["sequence"]), settings, files)
        except KeyError as exc:
            raise ValueError(f"its statement has no {exc.args[0]!r} line") from None
        except (ValueError, IndexError):
            raise ValueError("its statement does not parse (was it edited?)") from None

    def file(self, name: str) -> Covered | None:
        return next((f for f in self.files if f.name == name), None)


def _file_line(line: str) -> Covered:
    word, size, digest, name = line.split(" ", 3)
    if word != "file" or not plain_name(name):
        raise ValueError(line)
    return _covered(name, f"{size} {digest}")


def _covered(name: str, size_and_digest: str) -> Covered:
    size, digest = size_and_digest.split(" ")
    if not (size.isdigit() and len(digest) == 64):
        raise ValueError(size_and_digest)
    return Covered(name, int(size), digest)


@dataclass(frozen=True)
class SignatureFile:
    """The parsed contents of a `FILE.sig`: whose key, the signature, and the statement it signs."""

    key_id: str
    signature: bytes
    statement: str

    def text(self) -> str:
        return (f"{FORMAT}\nkey {self.key_id}\nsignature {base64.b64encode(self.signature).decode()}\n\n"
                f"{self.statement}")

    @classmethod
    def parse(cls, text: str) -> "SignatureFile":
        """Raises ValueError saying what is wrong with the file."""
        head, _, statement = text.partition("\n\n")
        lines = head.splitlines()
        if lines and lines[0].strip() == OLD_FORMAT:
            raise ValueError("it is in the first signature format, which binds neither the model's name nor its "
                             "version nor its other files; sign it again with `infermux sign`")
        if not lines or lines[0].strip() != FORMAT:
            raise ValueError(f"not an infermux signature (its first line is not {FORMAT!r})")
        fields = dict(line.split(" ", 1) for line in lines[1:] if " " in line)
        try:
            signature = base64.b64decode(fields["signature"].strip(), validate=True)
            return cls(fields["key"].strip(), signature, statement)
        except KeyError as exc:
            raise ValueError(f"its {exc.args[0]!r} line is missing") from None
        except binascii.Error:
            raise ValueError("its signature is not base64") from None


def signature_path(engine: Path) -> Path:
    """Where the signature of `engine` lies: FILE.sig beside it."""
    return engine.with_name(engine.name + SIG_SUFFIX)


def settings_path(engine: Path) -> Path:
    """The model.toml a signature of `engine` covers: the one of its model folder."""
    return engine.parent.parent / SETTINGS_NAME


def _crypto() -> None:
    """Raise ImportError saying what to install when `cryptography` is missing."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise ImportError(NEEDS) from None


def key_id(public: "Ed25519PublicKey") -> str:
    """A short, stable name for a public key (the `key` line of a signature)."""
    from cryptography.hazmat.primitives import serialization

    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def read_settings(engine: Path) -> bytes | None:
    """The bytes of the model.toml a signature of `engine` covers, None when there is none."""
    try:
        return settings_path(engine).read_bytes()
    except FileNotFoundError:
        return None


def identity(engine: Path) -> tuple[str, str]:
    """The model and version an engine is published as: `<model>/<version>/FILE`. A version folder
    being staged under a hidden name (`.4` or `.4.tmp`, renamed to `4` to publish it) is the version
    it will be."""
    version = engine.parent.name
    if version.startswith("."):
        version = version.lstrip(".").removesuffix(".tmp")
    return engine.parent.parent.name, version


def plain_name(name: str) -> bool:
    """A file name a signature may list: no folder, not hidden, printable."""
    return bool(name) and "/" not in name and not name.startswith(".") and name.isprintable()


def folder_files(engine: Path) -> list[Path]:
    """The files a signature of `engine` covers: every plain, non-hidden file in its folder but
    signatures; ValueError when there are more than MAX_FILES (a folder shared by several engines)."""
    found = sorted(p for p in engine.parent.iterdir()
                   if plain_name(p.name) and not p.name.endswith(SIG_SUFFIX) and p.is_file())
    if len(found) > MAX_FILES:
        raise ValueError(f"{engine.parent} holds {len(found)} files: a signature covers every file in an "
                         f"engine's folder (at most {MAX_FILES}); give each engine a folder of its own "
                         "(<model>/<version>/)")
    return found


def covered(path: Path, name: str | None = None, copy_to: Path | None = None) -> Covered:
    """`path`'s size and SHA-256 (copied to `copy_to` on the way when given)."""
    digest, size = digest_file(path, copy_to)
    return Covered(name or path.name, size, digest)


def settings_digest(settings: bytes | None) -> Covered | None:
    if settings is None:
        return None
    return Covered(SETTINGS_NAME, len(settings), hashlib.sha256(settings).hexdigest())


def digest_file(path: Path, copy_to: Path | None = None) -> tuple[str, int]:
    """SHA-256 and size of `path`, read once; each block also written to `copy_to` when given
    (created exclusively, never through a link)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as source:
        out = None
        if copy_to is not None:
            fd = os.open(copy_to, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            out = os.fdopen(fd, "wb")
        try:
            for block in iter(lambda: source.read(BLOCK), b""):
                digest.update(block)
                size += len(block)
                if out is not None:
                    out.write(block)
        finally:
            if out is not None:
                out.close()
    return digest.hexdigest(), size


def key_problem(path: Path, private: bool) -> str | None:
    """Why a key file may not be trusted, or None: it must belong to root or to this user, and no one
    else may write it (a private key: nor read it)."""
    try:
        info = path.stat()
    except OSError:
        return None  # reading it says what is wrong
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid not in (0, os.geteuid()):
        return f"{path} belongs to user {info.st_uid}, neither root nor this process's user ({os.geteuid()})"
    forbidden = 0o077 if private else 0o022
    if mode & forbidden:
        what = "read or written" if private else "written"
        fix = "chmod 600" if private else "chmod 644"
        return f"{path} may be {what} by other users (mode {mode:o}); `{fix} {path}`"
    return None


# -- keys -------------------------------------------------------------------------------------------


def keygen(prefix: Path, force: bool = False) -> tuple[Path, Path]:
    """Write PREFIX.key (private, mode 0600 from its first byte) and PREFIX.pub; returns both."""
    _crypto()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private, public = prefix.with_name(prefix.name + PRIVATE_SUFFIX), prefix.with_name(prefix.name + PUBLIC_SUFFIX)
    existing = [p for p in (private, public) if p.exists()]
    if existing and not force:
        raise FileExistsError(f"{existing[0]} exists; keep it, or pass --force to replace the key pair")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    for path in existing:
        path.unlink()
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    os.chmod(public, 0o644)
    return private, public


def load_private(path: Path) -> "Ed25519PrivateKey":
    """Raises ValueError (or OSError) saying why `path` is not an Ed25519 private key."""
    _crypto()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path} is not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} is not an Ed25519 key (make one with `infermux sign --keygen PREFIX`)")
    return key


def load_public(path: Path) -> "Ed25519PublicKey":
    """Raises ValueError (or OSError) saying why `path` is not an Ed25519 public key."""
    _crypto()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path} is not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path} is not an Ed25519 public key (`infermux sign --keygen PREFIX` makes PREFIX.pub)")
    return key


def statement_of(engine: Path, model: str, version: str, sequence: int) -> Statement:
    """The statement a signature of `engine` makes now, as `model` `version`."""
    files = tuple(covered(p) for p in folder_files(engine))
    if not any(f.name == engine.name for f in files):
        raise ValueError(f"{engine} is not a plain file in its folder")
    return Statement(model, version, sequence, settings_digest(read_settings(engine)), files)


def sign(key: "Ed25519PrivateKey", engine: Path, model: str | None = None, version: str | None = None) -> Path:
    """Write `engine`.sig, covering the engine, its folder's files and its model.toml as they are now,
    as `model` `version` (default: where it lies, `<model>/<version>/`); returns its path."""
    here = identity(engine)
    path = signature_path(engine)
    sequence = max(time.time_ns() // 1000, _previous_sequence(path) + 1)
    statement = statement_of(engine, model or here[0], version or here[1], sequence).text()
    sig = SignatureFile(key_id(key.public_key()), key.sign(statement.encode()), statement)
    staged = path.with_name(f".{path.name}.partial")  # renamed into place: a watcher never sees half of it
    staged.unlink(missing_ok=True)
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(sig.text())
    staged.replace(path)
    return path


def _previous_sequence(path: Path) -> int:
    try:
        return Statement.parse(SignatureFile.parse(path.read_text(encoding="utf-8")).statement).sequence
    except (OSError, ValueError, UnicodeDecodeError):
        return 0


def verify(key: "Ed25519PublicKey", sig: SignatureFile) -> Statement | None:
    """The statement `sig` signs when it is `key`'s signature of it, else None."""
    from cryptography.exceptions import InvalidSignature

    if len(sig.statement) > MAX_STATEMENT:
        return None
    try:
        key.verify(sig.signature, sig.statement.encode())
    except InvalidSignature:
        return None
    try:
        return Statement.parse(sig.statement)
    except ValueError:
        return None


def load_keys(paths: Sequence[Path]) -> dict[str, "Ed25519PublicKey"]:
    """Trusted public keys by id; ValueError or OSError naming a file that is not one."""
    keys = {}
    for path in paths:
        key = load_public(path)
        keys[key_id(key)] = key
    return keys
