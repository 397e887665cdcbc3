"""`infermux infer`: send one request and print the reply header and output shapes.

    infermux infer classifier                       # random inputs of the shapes the daemon reports
    infermux infer classifier --shape images=1x3x64x64
    infermux infer mlp --input features=x.npy --json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from infermux.protocol import DTYPES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="model name")
    add_endpoint_arguments(parser)
    parser.add_argument("--version", help="model version (default: the model's default)")
    parser.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy",
                        help="an input from a .npy file (repeatable)")
    parser.add_argument("--shape", "-s", action="append", default=[], metavar="NAME=1x3x64x64",
                        help="a random input of this shape (repeatable; with neither this nor --input, "
                        "random inputs of the shapes the daemon reports for the model)")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="dtype of --shape inputs")
    parser.add_argument("--timeout-ms", type=int, help="deadline for this request")
    parser.add_argument("--key", help="affinity key for hash routing")
    parser.add_argument("--output", "-o", action="append", help="only return these outputs")
    parser.add_argument("--save", metavar="DIR", help="write each output to DIR/NAME.npy")
    parser.add_argument("--json", action="store_true", help="print the reply header as JSON only")
    from infermux.transport import curve

    curve.add_arguments(parser)


def add_endpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """--endpoint / --config / --runtime-dir, shared by every client command."""
    parser.add_argument("--endpoint", "-e", help="inference socket (default: the first `listen` of --config)")
    parser.add_argument("--config", "-c", help="daemon configuration to take the endpoint from "
                        "(default: $INFERMUX_CONFIG or /etc/infermux/infermux.toml)")
    parser.add_argument("--runtime-dir", help="the daemon's --runtime-dir, if it was started with one")


def endpoint_from(args: argparse.Namespace, which: str = "listen") -> str:
    """The socket to talk to: --endpoint, else the config's `listen` (or admin/stats) resolved."""
    import os

    from infermux import config as cfg

    if getattr(args, "endpoint", None):
        return args.endpoint
    path = args.config or os.environ.get("INFERMUX_CONFIG", "/etc/infermux/infermux.toml")
    config = cfg.load(path)
    raw = config.daemon.listen[0] if which == "listen" else getattr(config.daemon, which)
    return cfg.resolve_endpoint(raw, cfg.runtime_dir(config.daemon, args.runtime_dir))


def parse_inputs(files: list[str], shapes: list[str], dtype: str) -> dict[str, np.ndarray]:
    """`NAME=FILE.npy` and `NAME=1x3x64x64` arguments as arrays."""
    inputs: dict[str, np.ndarray] = {}
    for item in files:
        name, _, file = item.partition("=")
        inputs[name] = np.load(Path(file), allow_pickle=False)
    rng = np.random.default_rng(0)
    for item in shapes:
        name, _, dims = item.partition("=")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            raise SystemExit(f"infermux: --shape {item!r}: expected NAME=1x3x64x64") from None
        inputs[name] = _random_array(rng, shape, np.dtype(dtype))
    return inputs


def _random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Random data of `dtype`: floats in [0, 1), anything else integers in [0, 100) cast to it."""
    array = rng.random(shape) if dtype.kind == "f" else rng.integers(0, 100, shape)
    return array.astype(dtype)


def inputs_for(args: argparse.Namespace) -> dict[str, np.ndarray]:
    """The inputs the command line gives, else random ones shaped as the daemon says the model wants."""
    inputs = parse_inputs(args.input, args.shape, args.dtype)
    if inputs:
        return inputs
    try:
        specs = model_inputs(args)
    except Exception as exc:  # no config, no daemon, no such model: say what to do instead
        raise SystemExit(f"infermux: cannot ask the daemon for {args.model!r}'s inputs ({exc}); "
                         f"give --shape NAME=DIMS or --input NAME=FILE.npy") from None
    return random_inputs(specs)


def model_inputs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The input specs the admin socket reports for args.model (its default version, or args.version)."""
    from infermux.client import AdminClient

    with AdminClient(getattr(args, "admin", None) or endpoint_from(args, "admin"), timeout_s=5.0) as admin:
        rows = [m for m in admin.call("models")["models"] if m["name"] == args.model]
    if not rows:
        raise LookupError(f"no model {args.model!r} is configured")
    row = next((m for m in rows if m["version"] == args.version or (not args.version and m["default"])), rows[0])
    if "inputs" not in row:
        raise LookupError(f"version {row['version']} is {row['state']}, so its inputs are not known yet")
    return row["inputs"]


def random_inputs(specs: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Random arrays for `specs` (TensorSpec as JSON); a dynamic dimension takes its smallest size, else 1."""
    rng = np.random.default_rng(0)
    inputs = {}
    for spec in specs:
        low = spec.get("min_shape") or [1] * len(spec["shape"])
        shape = tuple(d if d > 0 else max(1, lo) for d, lo in zip(spec["shape"], low))
        inputs[spec["name"]] = _random_array(rng, shape, np.dtype(spec["dtype"]))
    return inputs


def run(args: argparse.Namespace) -> int:
    from infermux.transport import curve
    from infermux.client import Client

    inputs = inputs_for(args)
    try:
        keys = curve.options_from(args)
    except curve.CurveError as exc:
        print(f"infermux infer: {exc}", file=sys.stderr)
        return 2
    with Client(endpoint_from(args), curve=keys) as client:
        reply = client.infer(args.model, inputs, version=args.version, timeout_ms=args.timeout_ms,
                             key=args.key, outputs=args.output)
    if args.json:
        print(json.dumps(reply.header, indent=2))
    else:
        print(json.dumps(reply.header))
        for name, value in reply.outputs.items():
            print(f"{name}: {value.dtype}{list(value.shape)}  min={value.min():.4g} max={value.max():.4g}")
    if args.save:
        out = Path(args.save)
        out.mkdir(parents=True, exist_ok=True)
        for name, value in reply.outputs.items():
            np.save(out / f"{name}.npy", value)
    if not reply.ok:
        print(f"infermux: {reply.status}: {reply.error}", file=sys.stderr)
    return 0 if reply.ok else 1
