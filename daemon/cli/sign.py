"""`infermux sign`: make a publisher's key pair, sign engines, check signatures.

    infermux sign --keygen ~/keys/publisher          # publisher.key (0600) and publisher.pub
    infermux sign --key ~/keys/publisher.key engines/det/4/model.plan
    infermux sign --check ~/keys/publisher.pub engines/det/4/model.plan

A daemon with `[daemon] engine_signing_keys = ["/etc/infermux/publisher.pub"]`
loads only engines signed by one of those keys. The signature (FILE.sig)
binds the engine to the model and version it is published as (its folders,
`<model>/<version>/FILE`, or --model and --version) and covers every file
beside it and its model folder's model.toml: sign after the last edit of
any, in the place it will be published. docs/security.md#signed-engines
walks through publishing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--keygen", metavar="PREFIX", help="write a new Ed25519 key pair: PREFIX.key (private, "
                      "mode 0600) and PREFIX.pub (for engine_signing_keys)")
    what.add_argument("--key", metavar="PREFIX.key", help="sign each FILE with this private key (writes FILE.sig)")
    what.add_argument("--check", metavar="PREFIX.pub", help="check each FILE's signature against this public key "
                      "as the daemon would")
    parser.add_argument("files", nargs="*", metavar="FILE", help="engine files (model.plan, model.onnx, ...)")
    parser.add_argument("--force", action="store_true", help="with --keygen: replace an existing key pair")
    parser.add_argument("--model", help="with --key: the model name the engine is published as (default: the "
                        "folder above its version folder)")
    parser.add_argument("--version", dest="as_version", metavar="VERSION",
                        help="with --key: the version it is published as (default: its folder's name)")


def _fail(message: str, code: int = 1) -> int:
    print(f"infermux sign: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    from infermux import signing

    files = [Path(f).expanduser() for f in args.files]
    if args.keygen and files:
        return _fail("--keygen takes a PREFIX only, no FILE", 2)
    if not args.keygen and not files:
        return _fail(f"{'--key' if args.key else '--check'} needs at least one engine FILE", 2)
    try:
        if args.keygen:
            private, public = signing.keygen(Path(args.keygen).expanduser(), args.force)
            print(f"made {private} (private, mode 0600: keep it off the devices) and {public}\n"
                  f"on each device, in [daemon]: engine_signing_keys = [\"/etc/infermux/{public.name}\"]")
            return 0
        if args.key:
            private = Path(args.key).expanduser()
            why = signing.key_problem(private, private=True)
            if why:
                return _fail(f"will not sign with {why}")
            key = signing.load_private(private)
            for f in files:
                print(f"signed {f} -> {signing.sign(key, f, args.model, args.as_version)}")
            return 0
        return _check(signing.load_keys([Path(args.check).expanduser()]), files)
    except (ValueError, ImportError, FileExistsError) as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))


def _check(keys: dict, files: list[Path]) -> int:
    import tempfile

    from infermux.config import ModelConfig
    from infermux.models.verified import EngineSigning, SignatureRefused

    bad = 0
    with tempfile.TemporaryDirectory() as scratch:
        checker = EngineSigning(keys, Path(scratch))
        for f in files:
            try:
                checker.admit(ModelConfig(name="check", engine=f), from_settings=False)
                print(f"ok {f}")
            except SignatureRefused as exc:
                bad += 1
                print(f"refused {f}: {exc}")
    return 1 if bad else 0
