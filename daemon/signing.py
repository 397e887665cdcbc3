"""Engine signatures: the key pairs, the `FILE.sig` format and what a signature covers.

A publisher makes an Ed25519 key pair once (`infermux sign --keygen
PREFIX`: PREFIX.key, mode 0600, and PREFIX.pub) and signs each engine it
publishes (`infermux sign --key PREFIX.key FILE`), which writes `FILE.sig`
beside it. The signature covers the engine file's bytes and the
`model.toml` of its model folder (`<model>/<version>/model.<ext>` →
`<model>/model.toml`) when there is one, since that file chooses the
backend and its options. The daemon's check is models/verified.py;
docs/security.md#signed-engines is the workflow.

What is signed is a short statement of SHA-256 digests, not the file
itself, so a multi-GB plan is never held in memory:

    infermux engine signature 1
    engine sha256 <hex>
    model.toml sha256 <hex>            (or: model.toml none)

`FILE.sig` is text: a format line, the key's id (the first 16 hex digits
of the SHA-256 of its raw public key), the model.toml digest signed (so a
refusal can say "model.toml changed" rather than only "bad signature") and
the signature in base64. No cryptography is written here: the
`cryptography` package makes keys, signs and verifies.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SIG_SUFFIX = ".sig"
FORMAT = "infermux-signature 1"
STATEMENT = b"infermux engine signature 1\n"
SETTINGS_NAME = "model.toml"
BLOCK = 1 << 20
PRIVATE_SUFFIX, PUBLIC_SUFFIX = ".key", ".pub"
NEEDS = "engine signing needs the Python package `cryptography` (Debian: apt install python3-cryptography)"


@dataclass(frozen=True)
class Digests:
    """What a signature covers: the engine's SHA-256 and its model.toml's (None when there is none)."""

    engine: str
    settings: str | None

    def statement(self) -> bytes:
        toml = f"model.toml sha256 {self.settings}" if self.settings else "model.toml none"
        return STATEMENT + f"engine sha256 {self.engine}\n{toml}\n".encode()


@dataclass(frozen=True)
class SignatureFile:
    """The parsed contents of a `FILE.sig`."""

    key_id: str
    settings: str | None
    signature: bytes

    def text(self) -> str:
        return (f"{FORMAT}\nkey {self.key_id}\nmodel.toml {self.settings or 'none'}\n"
                f"signature {base64.b64encode(self.signature).decode()}\n")

    @classmethod
    def parse(cls, text: str) -> "SignatureFile":
        """Raises ValueError saying what is wrong with the file."""
        lines = text.splitlines()
        if not lines or lines[0].strip() != FORMAT:
            raise ValueError(f"not an infermux signature (its first line is not {FORMAT!r})")
        fields = dict(line.split(" ", 1) for line in lines[1:] if " " in line)
        try:
            signature = base64.b64decode(fields["signature"].strip(), validate=True)
            settings = fields["model.toml"].strip()
            return cls(fields["key"].strip(), None if settings == "none" else settings, signature)
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


def settings_digest(settings: bytes | None) -> str | None:
    return hashlib.sha256(settings).hexdigest() if settings is not None else None


def digest_file(path: Path, copy_to: Path | None = None) -> str:
    """SHA-256 of `path`, read once; each block also written to `copy_to` when given."""
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        out = open(copy_to, "xb") if copy_to is not None else None
        try:
            for block in iter(lambda: source.read(BLOCK), b""):
                digest.update(block)
                if out is not None:
                    out.write(block)
        finally:
            if out is not None:
                out.close()
    return digest.hexdigest()


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


def sign(key: "Ed25519PrivateKey", engine: Path) -> Path:
    """Write `engine`.sig, covering the engine and its model.toml as they are now; returns its path."""
    settings = read_settings(engine)
    digests = Digests(digest_file(engine), settings_digest(settings))
    sig = SignatureFile(key_id(key.public_key()), digests.settings, key.sign(digests.statement()))
    path = signature_path(engine)
    staged = path.with_name(f".{path.name}.partial")  # renamed into place: a watcher never sees half of it
    staged.write_text(sig.text(), encoding="ascii")
    staged.replace(path)
    return path


def verify(key: "Ed25519PublicKey", sig: SignatureFile, digests: Digests) -> bool:
    """Whether `sig` is `key`'s signature of what `digests` describe."""
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(sig.signature, digests.statement())
    except InvalidSignature:
        return False
    return True


def load_keys(paths: Sequence[Path]) -> dict[str, "Ed25519PublicKey"]:
    """Trusted public keys by id; ValueError or OSError naming a file that is not one."""
    keys = {}
    for path in paths:
        key = load_public(path)
        keys[key_id(key)] = key
    return keys
