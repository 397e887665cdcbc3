"""`infermux infer`: send one request and print the reply header and output shapes.

    infermux infer classifier                       # random inputs of the shapes the daemon reports
    infermux infer classifier --shape images=1x3x64x64
    infermux infer mlp --input features=x.npy --json
    infermux infer mlp -e tcp://box1:5555 -e tcp://box2:5555    # the first that answers
    infermux infer ocr --image page.png             # a frame to a pipeline (docs/pipelines.md)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from infermux.cli.common import (NO_DAEMON, USAGE, CliError, add_endpoint_arguments, add_input_arguments,
                                 add_model_arguments, endpoint_from, model_of, retried)
from infermux.client.inference import AdminError

__all__ = ["add_endpoint_arguments", "endpoint_from", "inputs_for", "parse_inputs", "random_inputs", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_endpoint_arguments(parser, several=True)
    add_input_arguments(parser)
    parser.add_argument("--image", metavar="FILE", help="send this JPEG or PNG file as the frame of a pipeline")
    parser.add_argument("--image-input", default="image", metavar="NAME",
                        help="the pipeline's input for --image (default: image)")
    parser.add_argument("--timeout-ms", type=int, help="deadline for this request")
    parser.add_argument("--key", help="affinity key for hash routing; with --image, the stream (camera) the "
                        "frame belongs to, which a pipeline's track step needs")
    parser.add_argument("--output", "-o", action="append", help="only return these outputs")
    parser.add_argument("--top", type=int, default=5, metavar="K",
                        help="for a 2-D float output (a classifier's scores), print each row's K best "
                        "classes (default 5; 0: none)")
    parser.add_argument("--save", metavar="DIR", help="write each output to DIR/NAME.npy")
    parser.add_argument("--json", action="store_true", help="print the reply header as JSON only")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="seconds to wait for the reply (default 10)")
    from infermux.transport import curve

    curve.add_arguments(parser)


def parse_inputs(files: list[str], shapes: list[str], dtype: str) -> dict[str, np.ndarray]:
    """`NAME=FILE.npy` and `NAME=1x3x64x64` arguments as arrays."""
    inputs: dict[str, np.ndarray] = {}
    for item in files:
        name, _, file = item.partition("=")
        try:
            inputs[name] = np.load(Path(file), allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise CliError(f"infermux: --input {item!r}: {exc}", USAGE) from None
    rng = np.random.default_rng(0)
    for item in shapes:
        name, _, dims = item.partition("=")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            raise CliError(f"infermux: --shape {item!r}: expected NAME=1x3x64x64", USAGE) from None
        inputs[name] = _random_array(rng, shape, np.dtype(dtype))
    return inputs


def _random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Random data of `dtype`: floats in [0, 1), anything else integers in [0, 100) cast to it."""
    array = rng.random(shape) if dtype.kind == "f" else rng.integers(0, 100, shape)
    return array.astype(dtype)


def inputs_for(args: argparse.Namespace, unknown_ok: bool = False, wait_s: float = 0.0) -> dict[str, np.ndarray]:
    """The inputs the command line gives, else random ones shaped as the daemon says the model wants.

    `unknown_ok`: a model the daemon does not serve gets no inputs rather than an error, so that the
    request goes out and the daemon's 404, which names the models it serves, is the answer (`infer`).
    `wait_s` (bench --wait): a version still loading or warming is asked again until it knows its
    inputs, for up to that long."""
    inputs = parse_inputs(args.input, args.shape, args.dtype)
    if inputs:
        return inputs
    hint = "give --shape NAME=DIMS or --input NAME=FILE.npy"
    try:
        specs = retried(lambda: model_inputs(args), NotKnownYet, wait_s)
    except UnknownModel as exc:
        if unknown_ok:
            return {}
        raise CliError(f"infermux: {exc}") from None
    except TimeoutError as exc:
        raise CliError(f"infermux: cannot ask the daemon for {args.model!r}'s inputs: {exc}; or {hint}",
                       NO_DAEMON) from None
    except (LookupError, AdminError) as exc:
        raise CliError(f"infermux: cannot ask the daemon for {args.model!r}'s inputs: {exc}; {hint}") from None
    except CliError as exc:  # no configuration to find the admin socket in
        raise CliError(f"{exc.message}; or {hint}", exc.exit_code) from None
    return random_inputs(specs)


class UnknownModel(LookupError):
    """The daemon serves no model of that name (it may be a pipeline, or a typo)."""


class NotKnownYet(LookupError):
    """The version is loading or warming: the daemon cannot say its inputs yet."""


def model_inputs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The input specs the admin socket reports for args.model (its default version, or args.version)."""
    from infermux.client import AdminClient

    admin_endpoint = endpoint_from(args, "admin")
    if not admin_endpoint:
        raise LookupError("no admin socket to ask (give --admin or --config)")
    with AdminClient(admin_endpoint, timeout_s=5.0) as admin:
        every = admin.call("models")["models"]
    rows = [m for m in every if m["name"] == args.model]
    if not rows:
        served = ", ".join(sorted({m["name"] for m in every})) or "none"
        raise UnknownModel(f"no model {args.model!r} is configured; served models: {served}")
    row = next((m for m in rows if m["version"] == args.version or (not args.version and m["default"])), rows[0])
    if "inputs" not in row:
        raise NotKnownYet(f"version {row['version']} is {row['state']}, so its inputs are not known yet")
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


def top_k(scores: np.ndarray, k: int) -> list[str]:
    """Each row's `k` highest classes as `class (score)`, best first; a line per row (the first 8 rows)."""
    k = min(k, scores.shape[1])
    lines = []
    for row, values in enumerate(scores[:8]):
        best = np.argsort(values)[::-1][:k]
        lines.append(f"  [{row}] top {k}: " + ", ".join(f"{c} ({values[c]:.4g})" for c in best))
    if len(scores) > 8:
        lines.append(f"  ... {len(scores) - 8} more rows (--save DIR keeps them all)")
    return lines


def describe(name: str, value: np.ndarray, k: int) -> list[str]:
    """An output as the terminal shows it: dtype, shape, range, and a classifier's best classes."""
    lines = [f"{name}: {value.dtype}{list(value.shape)}"
             + (f"  min={value.min():.4g} max={value.max():.4g}" if value.size else "")]
    if k > 0 and value.ndim == 2 and value.dtype.kind == "f" and value.size:
        lines += top_k(value, k)
    return lines


FORMATS = {".jpg": "jpeg", ".jpeg": "jpeg", ".png": "png"}


def image_of(path: str) -> tuple[bytes, str]:
    """The bytes of an image file and its format, from its name."""
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise CliError(f"infermux: --image {path!r}: give a .jpg, .jpeg or .png file", USAGE)
    try:
        return Path(path).read_bytes(), fmt
    except OSError as exc:
        raise CliError(f"infermux: --image {path!r}: {exc.strerror}", USAGE) from None


def send_image(client: Any, args: argparse.Namespace, data: bytes, fmt: str) -> Any:
    """One encoded frame to pipeline args.model, on the client's socket (pipelines/wire.py)."""
    from infermux.pipelines.wire import send_frame

    return send_frame(client._dealer.socket, args.model, data, fmt, timeout_s=args.timeout,
                      input=args.image_input, timeout_ms=args.timeout_ms, outputs=args.output, key=args.key)


def _show(reply: Any, top: int) -> None:
    """A reply as text: its header, then its regions, a classifier's classes, and each output (`top` values)."""
    print(json.dumps(reply.header))
    for region in reply.header.get("regions") or []:
        track = f"track {region['track_id']}  " if "track_id" in region else ""
        print(f"  {track}{region.get('text', region.get('label', ''))!r}  score {region['score']:.3f}  "
              f"box {region['box']}")
    for row in reply.header.get("classes") or []:  # a whole-frame classifier's answer, per batch row
        print("  " + ", ".join(f"{c.get('label') or c.get('index')!r} {c.get('score', 0):.3f}" for c in row))
    for name, value in reply.outputs.items():
        print("\n".join(describe(name, value, top)))


def run(args: argparse.Namespace) -> int:
    from infermux.transport import curve
    from infermux.client import Client

    model_of(args)
    image = image_of(args.image) if args.image else None
    inputs = inputs_for(args, unknown_ok=True) if image is None else {}
    try:
        keys = curve.options_from(args)
    except curve.CurveError as exc:
        raise CliError(f"infermux infer: {exc}", USAGE) from None
    more = getattr(args, "more_endpoints", [])  # several daemons: a missing one is failed over, not fatal
    endpoints = [endpoint_from(args, check=not more), *more]
    with Client(endpoints, curve=keys, timeout_s=args.timeout) as client:
        if image is not None:
            reply = send_image(client, args, *image)
        else:
            reply = client.infer(args.model, inputs, version=args.version, timeout_ms=args.timeout_ms,
                                 key=args.key, outputs=args.output)
    if args.json:
        print(json.dumps(reply.header, indent=2))
    else:
        _show(reply, args.top)
    if args.save:
        out = Path(args.save)
        out.mkdir(parents=True, exist_ok=True)
        for name, value in reply.outputs.items():
            np.save(out / f"{name}.npy", value)
    if not reply.ok:
        print(f"infermux: {reply.status}: {reply.error}", file=sys.stderr)
    return 0 if reply.ok else 1
