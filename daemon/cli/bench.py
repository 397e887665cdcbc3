"""Load generator: QPS and latency percentiles of a model or pipeline, or open-loop camera streams.

    infermux bench classifier --shape images=1x3x64x64 --concurrency 16 --duration 10
    infermux bench mlp --endpoint ipc:///tmp/x/infer.sock --input features=x.npy -n 5000 --json
    infermux bench ocr --image page.png --concurrency 4         # a pipeline: the same frame each time
    infermux bench ocr --streams 4 --fps 2 --duration 20        # 4 cameras, synthetic frames, open loop

With `--streams N --fps F` (benchstreams.py) N streams, each with its own
key, send F frames a second whatever the daemon does (open loop), and the
table says per stream: fps sent and served, superseded (409) and refused,
and the age of served frames (send to reply) at p50 and p99.

Closed loop: exactly `concurrency` requests are in flight; each reply sends
the next request. All of them share ONE DEALER socket driven by ONE thread,
not a thread (or a `client.Pipeline`) per request stream: on a 2-core box
the generator must not compete with the daemon for CPU or with itself for
the GIL, so it does the least work per request it can (see `_Stream`).
`run_load` is the reusable core (benchmark scripts and `infermux tune`
call it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

import numpy as np
import zmq

from infermux.client import Client
from infermux.cli.common import NO_DAEMON, USAGE, CliError, add_input_arguments, add_model_arguments, model_of
from infermux.cli.infer import add_endpoint_arguments, endpoint_from, inputs_for
from infermux.client.limits import RequestTooLarge, SizeCheck
from infermux.protocol import Frame, Reply, SharedTensor, Status, encode_request, parse_header
from infermux.execution.stats import percentiles
from infermux.transport import ipc

# progress(replies so far, seconds so far), called about once a second
Progress = Callable[[int, float], None]


@dataclass(frozen=True)
class BenchResult:
    """One measured run. Latencies are client-side round trips in µs, over all replies."""

    endpoint: str
    model: str
    concurrency: int
    requests: int                 # replies received in the measured phase
    duration_s: float
    qps: float                    # replies per second, whatever their status
    ok: int                       # replies with status 200
    p50_us: float | None
    p90_us: float | None
    p99_us: float | None
    max_us: float | None
    mean_us: float | None
    by_status: dict[int, int]

    @classmethod
    def from_latencies(cls, endpoint: str, model: str, concurrency: int, latencies_ns: list[int],
                       by_status: Mapping[int, int], elapsed_s: float) -> "BenchResult":
        """Summarise raw round-trip times (ns) and status counts of a run that took `elapsed_s`."""
        latencies_us = np.asarray(latencies_ns, dtype=np.float64) / 1000
        p50, p90, p99 = percentiles(latencies_us)
        replies = sum(by_status.values())
        return cls(
            endpoint=endpoint, model=model, concurrency=concurrency, requests=replies,
            duration_s=elapsed_s, qps=replies / elapsed_s if elapsed_s > 0 else 0.0,
            ok=by_status.get(Status.OK, 0), p50_us=p50, p90_us=p90, p99_us=p99,
            max_us=float(latencies_us.max()) if latencies_us.size else None,
            mean_us=float(latencies_us.mean()) if latencies_us.size else None,
            by_status=dict(by_status))

    @property
    def errors(self) -> int:
        return self.requests - self.ok

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (status keys become strings)."""
        out = asdict(self)
        out["by_status"] = {str(k): v for k, v in sorted(self.by_status.items())}
        out["errors"] = self.errors
        return out

    def summary(self) -> str:
        """A few human-readable lines."""
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value / 1000:.3f} ms"

        statuses = "  ".join(f"{code}: {n}" for code, n in sorted(self.by_status.items()))
        return (f"{self.model} at concurrency {self.concurrency}: {self.requests} replies "
                f"in {self.duration_s:.2f} s\n"
                f"  QPS      {self.qps:,.0f}\n"
                f"  latency  p50 {ms(self.p50_us)}  p90 {ms(self.p90_us)}  p99 {ms(self.p99_us)}  "
                f"max {ms(self.max_us)}\n"
                f"  status   {statuses or '-'}")


@dataclass
class _Tally:
    """What the measured phase collects; latencies in ns until the end."""

    latencies_ns: list[int]
    by_status: dict[int, int]
    elapsed_s: float


class _Stream:
    """One DEALER socket sending the same request over and over; only its `id` changes.

    The frames are encoded once by `protocol.encode_request`; each request's
    header is that header with its own id spliced in (`id_slot`), and each
    reply parses only its header. It takes less of the generator's CPU per
    request than `client.Pipeline` (which encodes every tensor and decodes
    every output), CPU a small device would otherwise take from the server
    under test (docs/performance.md has the figures).
    """

    def __init__(self, endpoint: str, model: str, inputs: Mapping[str, Any],
                 fields: Mapping[str, Any], timeout_s: float, curve: Mapping[str, bytes] | None = None) -> None:
        frames = encode_request(model, inputs, id=0, **fields)
        self._header = parse_header(frames[0])
        self._around_id = id_slot(json.dumps(self._header, separators=(",", ":")).encode())
        self._tensors = [bytes(f) for f in frames[1:]]
        self._endpoint = endpoint
        self._timeout_s = timeout_s
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))  # no poll() per reply
        for option, value in (curve or {}).items():  # CURVE keys for a tcp:// listener
            setattr(self._socket, option, value)
        ipc.check_directory(endpoint)
        self._socket.connect(endpoint)
        self.in_flight = 0

    def send(self, ident: int) -> None:
        slot = self._around_id
        if slot is not None:  # json.dumps's bytes, in a twentieth of its time
            header = b"%s%d%s" % (slot[0], ident, slot[1])
        else:
            self._header["id"] = ident
            header = json.dumps(self._header, separators=(",", ":")).encode()
        self._socket.send_multipart([b"", header, *self._tensors])  # b"": the REQ envelope
        self.in_flight += 1

    def recv(self) -> tuple[Any, int]:
        """(id, status) of the next reply."""
        try:
            frames = self._socket.recv_multipart(copy=False)
        except zmq.Again:
            raise TimeoutError(f"no reply from {self._endpoint} within {self._timeout_s:g} s") from None
        self.in_flight -= 1
        header = parse_header(frames[1].buffer if len(frames[0]) == 0 else frames[0].buffer)
        return header.get("id"), int(header.get("status", 0))

    def close(self) -> None:
        self._socket.close(0)


def id_slot(header: bytes) -> tuple[bytes, bytes] | None:
    """A header encoded with `"id":0`, cut around the 0: another int id between the two halves
    gives the bytes json.dumps would; None where `"id":0` is not found exactly once."""
    parts = header.split(b'"id":0')
    if len(parts) != 2 or parts[1][:1] not in (b",", b"}"):
        return None
    return parts[0] + b'"id":', parts[1]


def _drive(stream: _Stream, concurrency: int, count: int | None, duration_s: float | None,
           progress: Progress | None) -> _Tally:
    """Keep `concurrency` requests in flight until `count` are sent or `duration_s` is over."""
    clock = time.perf_counter_ns
    start = clock()
    deadline = None if duration_s is None else start + int(duration_s * 1e9)
    sent: dict[Any, int] = {}
    latencies: list[int] = []
    by_status: dict[int, int] = {}
    issued = 0

    def more() -> bool:
        return issued < count if count is not None else clock() < deadline  # type: ignore[operator]

    def submit() -> None:
        nonlocal issued
        issued += 1
        sent[issued] = clock()  # before the send: encoding is the client's share of latency
        stream.send(issued)

    while stream.in_flight < concurrency and more():
        submit()
    next_report = start + 1_000_000_000
    while stream.in_flight:
        ident, status = stream.recv()
        now = clock()
        t0 = sent.pop(ident, None)
        if t0 is not None:  # a reply without our id (malformed request) has no latency
            latencies.append(now - t0)
        by_status[status] = by_status.get(status, 0) + 1
        if more():
            submit()
        if progress and now >= next_report:
            progress(len(latencies), (now - start) / 1e9)
            next_report += 1_000_000_000
    return _Tally(latencies, by_status, (clock() - start) / 1e9)


def run_load(endpoint: str, model: str, inputs: Mapping[str, Any], *, concurrency: int = 1,
             count: int | None = None, duration_s: float | None = None, warmup: int = 0,
             fields: Mapping[str, Any] | None = None, progress: Progress | None = None,
             timeout_s: float = 10.0, curve: Mapping[str, bytes] | None = None) -> BenchResult:
    """Drive `model` closed-loop at `concurrency` and measure it.

    Give exactly one of `count` (requests) or `duration_s`. `warmup`
    requests run first at the same concurrency and are not measured.
    `fields` are extra request header fields (`version`, `key`,
    `timeout_ms`, `outputs`). Raises TimeoutError if a reply takes over
    `timeout_s`. `curve`: client CURVE options (`curve.client_options`).
    """
    if (count is None) == (duration_s is None):
        raise ValueError("give exactly one of count or duration_s")
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    fields = {k: v for k, v in (fields or {}).items() if v is not None}
    stream = _Stream(endpoint, model, inputs, fields, timeout_s, curve)
    try:
        if warmup:
            _drive(stream, concurrency, warmup, None, None)
        tally = _drive(stream, concurrency, count, duration_s, progress)
    finally:
        stream.close()
    return BenchResult.from_latencies(endpoint, model, concurrency, tally.latencies_ns,
                                      tally.by_status, tally.elapsed_s)


def wait_ready(endpoint: str, model: str, inputs: Mapping[str, Any], *, timeout_s: float = 30.0,
               fields: Mapping[str, Any] | None = None, curve: Mapping[str, bytes] | None = None) -> Reply:
    """Send one request at a time until a reply is not 503 (loading); return that reply.

    Raises TimeoutError if the model still is not ready (or nothing answers)
    after `timeout_s`. Check `.ok` on the result: 404 or 400 end the wait too.
    """
    fields = {k: v for k, v in (fields or {}).items() if v is not None}
    deadline = time.monotonic() + timeout_s
    last = "no reply"
    with Client(endpoint, timeout_s=1.0, curve=curve) as client:
        while time.monotonic() < deadline:
            try:
                reply = client.infer(model, inputs, **fields)
            except TimeoutError:
                continue  # not bound yet: the request waits in the socket; ask again
            if reply.status != Status.NOT_READY:
                return reply
            last = f"503 {reply.error}"
            time.sleep(min(1.0, (reply.retry_after_ms or 100) / 1000))
    raise TimeoutError(f"{model} at {endpoint} not ready after {timeout_s:g} s ({last})")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `infermux bench` (endpoint options shared with the other client commands)."""
    add_model_arguments(parser, old_flag=True)  # `bench MODEL`, as infer and tune; `--model MODEL` still works
    frames = parser.add_argument_group("pipelines and streams")
    frames.add_argument("--streams", type=int, metavar="N",
                        help="open loop: N streams (cameras), each with its own key, at --fps each (default: closed loop)")
    frames.add_argument("--fps", type=float, default=10.0, help="frames per second of each stream (default 10)")
    frames.add_argument("--key-prefix", default="stream", metavar="TEXT", help="stream keys: TEXT-0, TEXT-1, ...")
    source = frames.add_mutually_exclusive_group()
    source.add_argument("--image", metavar="FILE", help="send this JPEG or PNG file as every frame of a pipeline")
    source.add_argument("--synthetic", action="store_true",
                        help="send generated raw frames (the default for a pipeline without --image)")
    frames.add_argument("--size", default="640x480", metavar="WxH", help="size of the generated frames (640x480)")
    frames.add_argument("--image-input", metavar="NAME", help="the pipeline's input (default: what it says, or image)")
    add_endpoint_arguments(parser)
    parser.add_argument("--concurrency", type=int, default=1, help="requests kept in flight (default 1)")
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--requests", "-n", type=int, help="measure this many requests (default 1000)")
    stop.add_argument("--duration", "-d", type=float, help="measure for this many seconds (with --streams: the "
                      "cameras stop sending then, on time, and the replies in flight are waited for up to --timeout)")
    parser.add_argument("--warmup", type=int, default=100, help="unmeasured requests first (default 100)")
    add_input_arguments(parser)
    parser.add_argument("--key", help="affinity key for hash routing")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for any reply (default 10)")
    parser.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="first wait up to SECONDS for the daemon's socket, then for the model to answer 200 (it says 503 while loading)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--shared-memory", action="store_true",
                        help="keep inputs and outputs in a shared-memory region registered with the daemon "
                        "(ipc endpoints only; docs/operating.md, \"Tensors in shared memory\"); every request reads "
                        "the same inputs and writes the same outputs, which are not checked")
    from infermux.transport import curve

    curve.add_arguments(parser)


class _StderrProgress:
    """Progress on stderr, one line a second (rewritten in place on a terminal)."""

    def __init__(self, total: float, unit: str) -> None:
        self._of = f" of {total:g}{unit}"
        self._tty = sys.stderr.isatty()
        self._shown = False

    def __call__(self, done: int, elapsed: float) -> None:
        end = "" if self._tty else "\n"
        sys.stderr.write(f"\r{elapsed:6.1f} s{self._of}  {done} replies  {done / elapsed:,.0f}/s{end}")
        sys.stderr.flush()
        self._shown = True

    def finish(self) -> None:
        if self._shown and self._tty:
            sys.stderr.write("\n")


def pipeline_input(args: argparse.Namespace) -> str | None:
    """The input name of pipeline args.model, if it is one (asked of the admin socket; --image and
    --synthetic say so without asking); None for a model."""
    from infermux.client import AdminClient

    if args.image_input:
        return str(args.image_input)
    pipelines: list[dict[str, Any]] = []
    admin = None
    try:  # only a socket that is there and ours to use is asked: else the answer would be a 5 s timeout
        admin = endpoint_from(args, "admin", check=True)
    except (CliError, OSError, ValueError):  # NoDaemon (no socket file) is an OSError
        pass
    if admin and _may_connect(admin):
        try:
            with AdminClient(admin, timeout_s=5.0) as client:
                pipelines = client.call("pipelines")["pipelines"]
        except Exception:  # no admin socket to ask: only the flags tell
            pipelines = []
    found = next((p for p in pipelines if p["name"] == args.model), None)
    if found is not None:
        return str(found.get("input") or "image")
    return "image" if (args.image or args.synthetic) else None


def _await_socket(args: argparse.Namespace, timeout_s: float) -> None:
    """With --wait: a daemon still starting has not made its socket files yet; wait for them to appear
    (what cannot be resolved, or never appears, is reported where the endpoint is used). The admin
    socket, made after the inference one, is waited for too when bench must ask it the inputs."""
    from infermux.cli.common import NoDaemon, present, retried

    deadline = time.monotonic() + timeout_s
    asks_admin = not (args.shape or args.input or args.image or args.synthetic or args.image_input)
    for which in ("listen", "admin") if asks_admin else ("listen",):
        try:
            endpoint = endpoint_from(args, which, check=False)
            if endpoint:
                retried(lambda: present(endpoint), NoDaemon, max(0.0, deadline - time.monotonic()), every_s=0.05)
        except Exception:  # reported with its own message where the endpoint is used
            return


def _may_connect(endpoint: str) -> bool:
    """False for an ipc:// socket this user may not write to (admin.sock outside its group): asking
    it would only time out."""
    path = ipc.path_of(endpoint)
    return path is None or os.access(path, os.R_OK | os.W_OK)


def frame_source(args: argparse.Namespace, streams: int) -> Callable[[int, int], Frame]:
    """Frame n of stream s: the --image file's, or a generated one of --size."""
    from infermux.cli.benchstreams import synthetic_frames
    from infermux.cli.infer import image_of

    if args.image:
        data, fmt = image_of(args.image)
        image = Frame(data, fmt)
        return lambda stream, n: image
    try:
        width, height = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        raise CliError(f"infermux bench: --size {args.size!r}: expected WxH, e.g. 640x480", USAGE) from None
    return synthetic_frames(streams, width, height)


def run(args: argparse.Namespace) -> int:
    """`infermux bench`: exit 0 if every reply was 200 (open loop: if every frame was answered, and none
    but with 409, 429, 503 or 504), 1 if not, 2 if it could not run."""
    from infermux.transport import curve
    from infermux.config import ConfigError

    model_of(args)
    if args.wait:
        _await_socket(args, args.wait)
    inputs, stream_inputs = _inputs(args)
    try:
        endpoint = endpoint_from(args)
    except TimeoutError:  # NoDaemon, an OSError too: exit 3, not a configuration problem
        raise
    except (ConfigError, OSError, CliError) as exc:
        print(f"infermux bench: no endpoint: {getattr(exc, 'message', exc)} (give --endpoint or --config)",
              file=sys.stderr)
        return 2
    try:
        keys = curve.options_from(args)
    except curve.CurveError as exc:
        print(f"infermux bench: {exc}", file=sys.stderr)
        return 2
    if args.shared_memory and not endpoint.startswith("ipc://"):
        print(f"infermux bench: --shared-memory needs the daemon's local ipc:// endpoint, not {endpoint}",
              file=sys.stderr)
        return 2
    if args.streams is not None:
        return _run_streams(args, endpoint, stream_inputs, keys)
    return _closed_loop(args, endpoint, inputs, keys)


def _inputs(args: argparse.Namespace) -> tuple[dict[str, Any], Callable[[int, int], Mapping[str, Any]]]:
    """What each request sends, and what request `n` of stream `s` sends (a pipeline's: frames)."""
    image_input = pipeline_input(args)
    if image_input is None:
        inputs = inputs_for(args, wait_s=args.wait)  # exits with a message on bad specs
        return inputs, lambda s, n: inputs
    frame_of = frame_source(args, args.streams or 1)
    return {image_input: frame_of(0, 0)}, lambda s, n: {image_input: frame_of(s, n)}


def _closed_loop(args: argparse.Namespace, endpoint: str, inputs: dict[str, Any],
                 keys: Mapping[str, bytes] | None) -> int:
    """`bench` at --concurrency for --requests or --duration: a summary or JSON; 0 if every reply was 200."""
    count: int | None = None if args.duration is not None else (args.requests or 1000)
    progress = _StderrProgress(args.duration, " s") if count is None else _StderrProgress(count, " replies")
    fields: dict[str, Any] = {"version": args.version, "key": args.key}
    region = None
    try:
        if args.wait or args.shared_memory:
            ready = wait_ready(endpoint, args.model, inputs, timeout_s=args.wait or 5.0, fields=fields, curve=keys)
            if not ready.ok:
                print(f"infermux bench: {ready.status} {ready.error}", file=sys.stderr)
                return 1
            if args.shared_memory:
                region, inputs, fields["output_regions"] = in_shared_memory(endpoint, inputs, ready)
        # A request over max_message_bytes would be dropped unanswered, at every concurrency (client/limits.py).
        SizeCheck([endpoint], None, keys, args.timeout).check(encode_request(args.model, inputs, **fields))
        result = run_load(endpoint, args.model, inputs, concurrency=args.concurrency, count=count,
                          duration_s=args.duration, warmup=args.warmup, progress=progress,
                          fields=fields, timeout_s=args.timeout, curve=keys)
    except (TimeoutError, ValueError, ConnectionError) as exc:
        progress.finish()
        print(f"infermux bench: {exc}", file=sys.stderr)
        return NO_DAEMON if isinstance(exc, TimeoutError) else 1 if isinstance(exc, RequestTooLarge) else 2
    finally:
        if region is not None:
            inputs = fields = {}  # drop the arrays on the region before it is closed
            region.close()
    progress.finish()
    print(json.dumps(result.as_json(), indent=2) if args.json else result.summary())
    return 0 if result.errors == 0 else 1


def _run_streams(args: argparse.Namespace, endpoint: str, inputs: Callable[[int, int], Mapping[str, Any]],
                 keys: Mapping[str, bytes] | None) -> int:
    """`bench --streams N --fps F`: open-loop streams for --duration (default 10 s); a table or JSON."""
    from infermux.cli.benchstreams import run_streams

    duration = args.duration or 10.0
    progress = _StderrProgress(duration, " s")
    try:
        if args.wait:
            ready = wait_ready(endpoint, args.model, inputs(0, 0), timeout_s=args.wait, curve=keys)
            if not ready.ok:
                print(f"infermux bench: {ready.status} {ready.error}", file=sys.stderr)
                return 1
        result = run_streams(endpoint, args.model, inputs, streams=args.streams, fps=args.fps, duration_s=duration,
                             key_prefix=args.key_prefix, timeout_s=args.timeout, curve=keys, progress=progress,
                             fields={"version": args.version} if args.version else None)
    except (TimeoutError, ValueError, ConnectionError) as exc:
        progress.finish()
        print(f"infermux bench: {exc}", file=sys.stderr)
        return NO_DAEMON if isinstance(exc, TimeoutError) else 2
    progress.finish()
    print(json.dumps(result.as_json(), indent=2) if args.json else result.summary())
    everything = result.as_json()["all"]
    return 0 if not everything["other"] and not everything["unanswered"] else 1


def in_shared_memory(endpoint: str, inputs: Mapping[str, np.ndarray],
                     sample: Reply) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """A region registered beside `endpoint` holding `inputs`, with room after them for the outputs
    `sample` (a served reply) had: the region, the inputs as references, the output_regions field."""
    from infermux.client import SharedMemory
    from infermux.workers.slots import layout

    arrays = [np.ascontiguousarray(a) for a in inputs.values()] + list(sample.outputs.values())
    offsets, end = layout([a.nbytes for a in arrays])
    region = SharedMemory.beside(endpoint, max(end, 1), "infermux-bench")
    refs = []
    for array, offset in zip(arrays[:len(inputs)], offsets):
        view = region.ndarray(array.shape, array.dtype, offset)
        view[...] = array
        refs.append(region.ref(view))
    # An output place needs only its offset: the daemon writes what the model gives.
    places = [SharedTensor(region.token, offset, "uint8", (a.nbytes,))
              for a, offset in zip(arrays[len(inputs):], offsets[len(inputs):])]
    return region, dict(zip(inputs, refs)), dict(zip(sample.outputs, places))


def main(argv: list[str] | None = None) -> int:
    """`python -m infermux.cli.bench`: the same command without the other subcommands' imports."""
    parser = argparse.ArgumentParser(prog="infermux bench", description=__doc__.strip().splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
