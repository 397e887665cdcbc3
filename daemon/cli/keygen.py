"""`infermux keygen DIR [--name NAME]`: make a CURVE keypair for a tcp:// listener or a client.

    infermux keygen /etc/infermux/curve                 # the daemon's: server.key, server.key_secret
    infermux keygen ~/.config/infermux/curve --name cam1

The public half (NAME.key) may be shared; the secret half (NAME.key_secret)
is created mode 0600 and never leaves the machine. docs/security.md walks
through the whole setup.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from infermux.transport.curve import PUBLIC_SUFFIX, SECRET_SUFFIX, SERVER_NAME

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", help="directory for the key files (created mode 0700 if missing)")
    parser.add_argument("--name", default=SERVER_NAME,
                        help=f"file name stem: NAME{PUBLIC_SUFFIX} and NAME{SECRET_SUFFIX} "
                        f"(default {SERVER_NAME!r}: the daemon's own keys)")
    parser.add_argument("--force", action="store_true", help="replace existing key files of that name")


def make_keypair(folder: Path, name: str, force: bool = False) -> tuple[Path, Path]:
    """Write NAME.key (0644) and NAME.key_secret (0600) in `folder`; returns (public, secret)."""
    import zmq.auth

    if not _NAME.match(name):
        raise ValueError(f"name {name!r}: use letters, digits, '.', '_' or '-'")
    public, secret = folder / f"{name}{PUBLIC_SUFFIX}", folder / f"{name}{SECRET_SUFFIX}"
    existing = [p for p in (public, secret) if p.exists()]
    if existing and not force:
        raise FileExistsError(f"{existing[0]} exists; keep it, or pass --force to replace the keypair")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    # The umask makes the secret file private from its first byte, not after a chmod.
    old = os.umask(0o077)
    try:
        for path in existing:
            path.unlink()
        zmq.auth.create_certificates(folder, name)
    finally:
        os.umask(old)
    os.chmod(secret, 0o600)
    os.chmod(public, 0o644)
    return public, secret


def _instructions(public: Path, secret: Path, name: str) -> str:
    if name == SERVER_NAME:
        return (f"made {public} (public) and {secret} (secret, mode 0600)\n"
                f"on the daemon, in [daemon]:\n"
                f"  curve_secret_key = \"{secret}\"\n"
                f"  curve_authorized_dir = \"<a directory holding each client's NAME{PUBLIC_SUFFIX}>\"\n"
                f"give {public.name} to every client (beside its own key, or --curve-server-key);\n"
                f"the secret file stays here, readable by the daemon's user only")
    return (f"made {public} (public) and {secret} (secret, mode 0600)\n"
            f"copy {public.name} into the daemon's curve_authorized_dir, then `infermux ctl reload`;\n"
            f"put the daemon's {SERVER_NAME}{PUBLIC_SUFFIX} in {public.parent}, then:\n"
            f"  infermux infer MODEL --endpoint tcp://HOST:PORT --curve-key {secret} ...")


def run(args: argparse.Namespace) -> int:
    try:
        public, secret = make_keypair(Path(args.dir).expanduser(), args.name, args.force)
    except (ValueError, OSError) as exc:
        print(f"infermux keygen: {exc}", file=sys.stderr)
        return 1
    print(_instructions(public, secret, args.name))
    return 0
