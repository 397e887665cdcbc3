"""Baseline servers the daemon is measured against, one process each.

    python tests/benchmarks/baselines.py echo ENDPOINT [--reply probs=1x10]
    python tests/benchmarks/baselines.py bare ENDPOINT ENGINE.onnx
    python tests/benchmarks/baselines.py compiled-bare ENDPOINT ENGINE.onnx BUILD_DIR

`echo`: a ROUTER that answers every request with a fixed reply of the
model's output size; it reads only the header's `id` (so a pipelined client
can match replies). It measures the transport and the load generator: the
ceiling no server on this socket can beat.

`bare`: a ROUTER + onnxruntime loop with no routing: receive, parse with
infermux.protocol, infer on one context (1 intra-op thread), reply. This is
the floor of any real server, and the daemon must reach ≥ 0.7× of it.

`compiled-bare`: the bare loop's receive, parse and reply in C (bare.c,
built into BUILD_DIR by compiled.py), calling the same onnxruntime context.

All run until killed; all speak wire protocol v1, so `infermux bench`
drives them unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

import zmq

from infermux.cli.infer import parse_inputs
from infermux.plugins.backends.onnxruntime import OnnxRuntimeBackend
from infermux.plugins.base import BackendError, InputRejected
from infermux.protocol import ProtocolError, Status, encode_reply, error_header, parse_request, request_id

# frames of one request (after the envelope) -> frames of its reply
Handler = Callable[[list[memoryview]], list]


def serve(endpoint: str, handle: Handler) -> None:
    """Answer requests on a ROUTER forever, one at a time, on this thread."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    while True:
        frames = sock.recv_multipart(copy=False)
        # [peer identity, empty delimiter (REQ/DEALER envelope), header, tensors...]
        body = [f.buffer for f in frames[2:]]
        sock.send_multipart([frames[0], b"", *handle(body)])


def echo_handler(reply_spec: str) -> Handler:
    """A fixed 200 reply shaped like the model's output; only the id is echoed."""
    outputs = parse_inputs([], [reply_spec], "float32")

    def handle(body: list[memoryview]) -> list:
        ident = json.loads(bytes(body[0])).get("id")
        return encode_reply({"id": ident, "status": int(Status.OK)}, outputs)

    return handle


def bare_handler(engine: Path) -> Handler:
    """Parse, infer on one onnxruntime context, reply: the daemon's work minus routing."""
    context = OnnxRuntimeBackend().load(engine, {"intra_op_num_threads": 1}).create_context()
    return handler_for(context.infer)


def handler_for(infer: Callable[[Any], dict[str, Any]]) -> Handler:
    """The bare loop's handler around `infer` (a context's call): parse, infer, encode."""

    def handle(body: list[memoryview]) -> list:
        try:
            request = parse_request(body)
            outputs = infer(request.inputs)
        except ProtocolError as exc:
            return encode_reply(error_header(exc.status, exc.message, request_id(body)))
        except InputRejected as exc:
            return encode_reply(error_header(Status.BAD_REQUEST, str(exc), request.id))
        except BackendError as exc:
            return encode_reply(error_header(Status.BACKEND_ERROR, str(exc), request.id))
        return encode_reply({"id": request.id, "status": int(Status.OK), "model": request.model}, outputs)

    return handle


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    echo = sub.add_parser("echo")
    echo.add_argument("endpoint")
    echo.add_argument("--reply", default="probs=1x10", help="reply tensor NAME=DIMS (float32)")
    bare = sub.add_parser("bare")
    bare.add_argument("endpoint")
    bare.add_argument("engine", type=Path)
    compiled = sub.add_parser("compiled-bare")
    compiled.add_argument("endpoint")
    compiled.add_argument("engine", type=Path)
    compiled.add_argument("build_dir", type=Path, help="where compiled.build_bare put the _cbare module")
    args = parser.parse_args(argv)
    try:
        if args.kind == "compiled-bare":
            serve_compiled(args.endpoint, args.engine, args.build_dir)
        else:
            serve(args.endpoint, echo_handler(args.reply) if args.kind == "echo" else bare_handler(args.engine))
    except KeyboardInterrupt:
        pass


def serve_compiled(endpoint: str, engine: Path, build_dir: Path) -> None:
    """The bare loop's work with its loop in C: the _cbare module calls the context's infer for each request."""
    sys.path.insert(0, str(build_dir))
    import _cbare  # type: ignore[import-not-found]  # built at run time (compiled.py)

    context = OnnxRuntimeBackend().load(engine, {"intra_op_num_threads": 1}).create_context()
    _cbare.serve(endpoint, context.infer)


if __name__ == "__main__":
    main(sys.argv[1:])
