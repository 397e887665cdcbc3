"""Live statistics of one model version and its execution contexts: QPS, latency percentiles,
batch sizes and each context's load.

`record` sits on the hot path: executor threads and the frontend thread call
it for every request. It takes no lock: each thread writes its own shard
(preallocated ring buffers and per-second buckets, single writer), so
threads never wait for each other. Percentiles, means and QPS are computed
only by `snapshot()`, which pools the shards and which the stats publisher
calls a few times a second.

Counters (`by_status`, `batches`, `served`) are cumulative and never reset,
so consumers (console, Prometheus) can diff successive snapshots. Rates and
latencies cover a sliding window: QPS over `window_s` of `bucket_s`
buckets; latency over the samples of that window that still fit the ring
(`capacity` samples, so at high QPS the latency window is the last
`capacity` requests rather than the full `window_s`).
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

Clock = Callable[[], float]
Gauge = Callable[[], int]

OK = 200  # protocol.Status.OK; a literal keeps this module free of protocol imports
# A request replaced by a newer one of its stream (queue_policy newest_per_key): the policy working,
# counted by status but not as an error.
SUPERSEDED = 409

# Upper bounds (µs) of the cumulative latency histogram Prometheus scrapes.
LATENCY_BUCKETS_US = (100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000,
                      250_000, 500_000, 1_000_000, 2_500_000, 10_000_000)


def percentiles(values: Sequence[float] | np.ndarray,
                qs: Sequence[float] = (50, 90, 99)) -> tuple[float | None, ...]:
    """Nearest-rank percentiles: the smallest value with at least q % of samples at or below it.

    Nearest rank (not interpolation) so every reported latency is one that a
    request actually saw. Empty input gives None for each q.
    """
    data = np.sort(np.asarray(values, dtype=np.float64))
    if data.size == 0:
        return tuple(None for _ in qs)
    ranks = [min(data.size, max(1, math.ceil(q / 100 * data.size))) for q in qs]
    return tuple(float(data[r - 1]) for r in ranks)


@dataclass(frozen=True)
class StatsSnapshot:
    """What the stats socket publishes for one model version or one context.

    Latencies are µs over the sliding window, counting served (200) requests
    only: a 429 answered in 5 µs says nothing about service latency. None
    means no sample in the window.
    """

    window_s: float
    queue_depth: int
    in_flight: int
    qps: float                    # served requests per second over the window
    error_qps: float              # error replies per second over the window: neither 200 nor 409 (superseded)
    samples: int                  # latency samples behind the percentiles
    p50_us: float | None
    p90_us: float | None
    p99_us: float | None
    max_us: float | None
    queue_us: float | None        # mean time waiting in the queue
    compute_us: float | None      # mean time in the backend
    service_time_us: float | None  # EWMA of backend time per input row; None before the first call
    served: int                   # cumulative 200s
    by_status: Mapping[int, int]  # cumulative replies per status code
    batches: Mapping[int, int]    # cumulative backend calls per batch size (rows in the call)
    latency_hist: Mapping[int, int] = None  # type: ignore[assignment]  # cumulative 200s per bucket index
    sums_us: Mapping[str, float] = None  # type: ignore[assignment]  # cumulative total/queue/compute µs of 200s

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (status and batch keys become strings, as JSON requires)."""
        skip = ("by_status", "batches", "latency_hist")
        out = {k: v for k, v in self.__dict__.items() if k not in skip}
        out["by_status"] = {str(k): v for k, v in sorted(self.by_status.items())}
        out["batches"] = {str(k): v for k, v in sorted(self.batches.items())}
        hist = self.latency_hist or {}
        out["latency_le_us"] = {str(LATENCY_BUCKETS_US[i]) if i < len(LATENCY_BUCKETS_US) else "+Inf": n
                                for i, n in sorted(hist.items())}
        return out


@dataclass(frozen=True)
class _Window:
    """Raw material for a snapshot: what one or more shards hold for the window."""

    span_s: float
    ok: int
    errors: int
    total: np.ndarray
    queue: np.ndarray
    compute: np.ndarray
    by_status: dict[int, int]
    batches: dict[int, int]
    queue_depth: int
    in_flight: int
    hist: dict[int, int]
    sums: dict[str, float]


class _Shard:
    """One thread's share of a `Stats`: written only by that thread, so it needs no lock.

    The snapshot thread reads it while it may change; buffer copies and
    dict copies are atomic under the GIL, so a reader sees at worst a record
    that is half counted (in the buckets but not yet in the ring). The ring
    is `array('d')`: stores cost what list stores cost, and a snapshot copies
    it into numpy in one memcpy instead of boxing 4096 Python numbers.
    """

    __slots__ = ("owner", "bucket", "ok", "err", "written", "times", "total", "queue",
                 "compute", "status", "batches", "hist", "sums")

    def __init__(self, nbuckets: int, capacity: int, bucket: int) -> None:
        self.owner = threading.current_thread()
        self.bucket = bucket
        self.ok = [0] * nbuckets
        self.err = [0] * nbuckets
        self.written = 0
        self.times = array("d", bytes(8 * capacity))
        self.total = array("d", bytes(8 * capacity))
        self.queue = array("d", bytes(8 * capacity))
        self.compute = array("d", bytes(8 * capacity))
        self.status: dict[int, int] = {}
        self.batches: dict[int, int] = {}
        self.hist: dict[int, int] = {}
        self.sums: dict[str, float] = {"total": 0.0, "queue": 0.0, "compute": 0.0}

    def roll(self, bucket: int) -> None:
        """Advance to `bucket`, zeroing the buckets that went by without traffic."""
        nbuckets = len(self.ok)
        for step in range(1, min(bucket - self.bucket, nbuckets) + 1):
            slot = (self.bucket + step) % nbuckets
            self.ok[slot] = 0
            self.err[slot] = 0
        self.bucket = bucket

    def oldest_first(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Copies of the ring (times, total, queue, compute), oldest sample first."""
        written, capacity = self.written, len(self.times)
        head = written % capacity if written > capacity else 0
        n = min(written, capacity)
        rings = (np.array(xs) for xs in (self.times, self.total, self.queue, self.compute))
        return tuple(np.concatenate((a[head:n], a[:head])) for a in rings)  # type: ignore[return-value]

    def count_since(self, first: int) -> tuple[int, int]:
        """(served, errors) in buckets `first` .. current, without mutating (another thread owns us)."""
        nbuckets = len(self.ok)
        last = self.bucket
        lo = max(first, last - nbuckets + 1)
        slots = [k % nbuckets for k in range(lo, last + 1)]
        return sum(self.ok[s] for s in slots), sum(self.err[s] for s in slots)


class Stats:
    """Request statistics of one scheduling unit (a model version's router side, or one context).

    Thread-safe and lock-free on the hot path: each recording thread writes
    its own shard, and `snapshot` pools the shards. `record` costs about a
    microsecond, the same with one thread or several.
    """

    def __init__(self, *, window_s: float = 10.0, bucket_s: float = 1.0, capacity: int = 4096,
                 alpha: float = 0.1, clock: Clock = time.monotonic,
                 queue_depth: Gauge | None = None, in_flight: Gauge | None = None) -> None:
        if capacity <= 0 or capacity & (capacity - 1):
            raise ValueError(f"capacity must be a power of two, got {capacity}")
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.window_s = window_s
        self._bucket_s = bucket_s
        self._nbuckets = max(1, math.ceil(window_s / bucket_s))
        self._capacity = capacity
        self._mask = capacity - 1
        self._alpha = alpha
        self._clock = clock
        # Gauges are read at snapshot time only: the queue and the executor
        # already know their depth, so the hot path pays nothing for them.
        self._queue_depth = queue_depth
        self._in_flight = in_flight
        self._since = clock()
        self._local = threading.local()
        self._shards: tuple[_Shard, ...] = ()  # copy-on-write, appended under _lock
        self._retired: dict[str, dict[Any, Any]] = {"status": {}, "batches": {}, "hist": {}, "sums": {}}
        self._lock = threading.Lock()
        self._ewma: float | None = None
        self._soon: deque[tuple[int, int, int, int]] = deque()  # record_soon's, for settle

    def record(self, status: int, total_us: int, queue_us: int = 0, compute_us: int = 0,
               batch: int | None = None) -> None:
        """One reply sent: its status and where its time went (µs).

        `batch` is the size of the backend call the request ran in; call
        sites pass it where they have it, but the call itself is counted
        once, by `record_batch`, not once per request here.
        """
        try:
            shard = self._local.shard
        except AttributeError:
            shard = self._new_shard()
        now = self._clock()
        bucket = int(now / self._bucket_s)
        if bucket > shard.bucket:
            shard.roll(bucket)
        if status == OK:
            shard.ok[shard.bucket % self._nbuckets] += 1
            i = shard.written & self._mask
            shard.written += 1
            shard.times[i] = now
            shard.total[i] = total_us
            shard.queue[i] = queue_us
            shard.compute[i] = compute_us
            b = bisect.bisect_left(LATENCY_BUCKETS_US, total_us)
            shard.hist[b] = shard.hist.get(b, 0) + 1
            sums = shard.sums
            sums["total"] += total_us
            sums["queue"] += queue_us
            sums["compute"] += compute_us
        elif status != SUPERSEDED:
            shard.err[shard.bucket % self._nbuckets] += 1
        shard.status[status] = shard.status.get(status, 0) + 1

    def record_batch(self, size: int, compute_us: int) -> None:
        """One backend call over `size` input rows (the merged batch dimension) that took `compute_us`."""
        try:
            shard = self._local.shard
        except AttributeError:
            shard = self._new_shard()
        shard.batches[size] = shard.batches.get(size, 0) + 1
        per_request = compute_us / size if size > 0 else float(compute_us)
        # Shared by all threads without a lock: a rare lost update only
        # nudges an estimate, and a lock here would double the cost.
        ewma = self._ewma
        self._ewma = per_request if ewma is None else ewma + self._alpha * (per_request - ewma)

    def record_soon(self, total_us: int, queue_us: int, compute_us: int, rows: int) -> None:
        """`record` of a 200 and `record_batch` of the backend call it ran alone in, kept to be
        folded by `settle`: what the express lane pays per request is an append, and the
        recording runs once a burst, in one tight loop. Every reading (`snapshot`,
        `service_time_us`) settles first, so a reply already sent is never missing from one."""
        self._soon.append((total_us, queue_us, compute_us, rows))

    def settle(self) -> None:
        """Record what `record_soon` kept (from any thread: each is taken exactly once)."""
        soon = self._soon
        while soon:
            try:
                total_us, queue_us, compute_us, rows = soon.popleft()
            except IndexError:  # another thread settled the last one first
                return
            self.record(OK, total_us, queue_us, compute_us, rows)
            self.record_batch(rows, compute_us)

    def service_time_us(self) -> float:
        """EWMA of backend time per input row (µs); 0.0 before the first backend call.

        The router's Retry-After is queued rows × this; 0.0 (not None) keeps
        that arithmetic free of special cases while nothing is known yet.
        """
        if self._soon:
            self.settle()
        return self._ewma or 0.0

    def snapshot(self) -> StatsSnapshot:
        """Percentiles, rates and counters as of now."""
        return _summarize([self._window()], self.window_s, self._ewma)

    def mark(self) -> tuple[Any, ...]:
        """What changes whenever anything a snapshot shows could have: records (and those kept to
        settle), backend calls, retired counts, the EWMA and the gauges. Cheap: no ring is read."""
        shards = self._shards
        return (len(shards), len(self._soon), self._ewma,
                sum(sum(s.status.values()) + sum(s.batches.values()) for s in shards),
                sum(self._retired["status"].values()), sum(self._retired["batches"].values()),
                self._queue_depth() if self._queue_depth else 0, self._in_flight() if self._in_flight else 0)

    @property
    def quiet_s(self) -> float:
        """How long after its last record the window holds nothing (the sliding buckets and the ring)."""
        return (self._nbuckets + 1) * self._bucket_s

    def _new_shard(self) -> _Shard:
        shard = _Shard(self._nbuckets, self._capacity, int(self._clock() / self._bucket_s))
        self._local.shard = shard
        with self._lock:
            self._shards = (*self._shards, shard)
        return shard

    def _retire_dead_shards(self) -> None:
        """Fold the counters of threads that ended into `_retired`, so shards do not pile up."""
        with self._lock:
            dead = [s for s in self._shards if not s.owner.is_alive()]
            if not dead:
                return
            self._shards = tuple(s for s in self._shards if s.owner.is_alive())
            for shard in dead:
                _add_counts(self._retired["status"], shard.status)
                _add_counts(self._retired["batches"], shard.batches)
                _add_counts(self._retired["hist"], shard.hist)
                _add_counts(self._retired["sums"], shard.sums)

    def _window(self) -> _Window:
        """Pool the shards over the sliding window (outside any hot-path lock)."""
        self.settle()
        self._retire_dead_shards()
        queue_depth = self._queue_depth() if self._queue_depth else 0
        in_flight = self._in_flight() if self._in_flight else 0
        now = self._clock()
        bucket = int(now / self._bucket_s)
        first = bucket - self._nbuckets + 1
        # The current bucket is partly filled: count only the time it has run.
        covered = (self._nbuckets - 1) * self._bucket_s + (now - bucket * self._bucket_s)
        since = now - self.window_s
        ok = errors = 0
        totals: list[np.ndarray] = []
        queues: list[np.ndarray] = []
        computes: list[np.ndarray] = []
        with self._lock:
            shards = self._shards
            by_status = dict(self._retired["status"])
            batches = dict(self._retired["batches"])
            hist = dict(self._retired["hist"])
            sums = dict(self._retired["sums"])
        for shard in shards:
            served, failed = shard.count_since(first)
            ok, errors = ok + served, errors + failed
            times, total, queue, compute = shard.oldest_first()
            cut = int(np.searchsorted(times, since))  # the ring is in time order
            totals.append(total[cut:])
            queues.append(queue[cut:])
            computes.append(compute[cut:])
            _add_counts(by_status, dict(shard.status))
            _add_counts(batches, dict(shard.batches))
            _add_counts(hist, dict(shard.hist))
            _add_counts(sums, dict(shard.sums))
        return _Window(max(0.0, min(covered, now - self._since)), ok, errors, _concat(totals),
                       _concat(queues), _concat(computes), by_status, batches, queue_depth, in_flight,
                       hist, sums)

    def _absorb(self, window: _Window) -> None:
        """Fold a retired context's cumulative counters into this one."""
        with self._lock:
            _add_counts(self._retired["status"], window.by_status)
            _add_counts(self._retired["batches"], window.batches)
            _add_counts(self._retired["hist"], window.hist)
            _add_counts(self._retired["sums"], window.sums)


def _add_counts(into: dict[Any, Any], counts: Mapping[Any, Any]) -> None:
    for key, count in counts.items():
        into[key] = into.get(key, 0) + count


def _sum_counts(dicts: Iterable[Mapping[Any, Any]]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for d in dicts:
        _add_counts(out, d)
    return out


def _concat(arrays: Iterable[np.ndarray]) -> np.ndarray:
    arrays = list(arrays)
    if len(arrays) == 1:
        return arrays[0]
    return np.concatenate(arrays) if arrays else np.empty(0)


def _mean(values: np.ndarray) -> float | None:
    return float(values.mean()) if values.size else None


def _summarize(windows: Sequence[_Window], window_s: float,
               service_time_us: float | None) -> StatsSnapshot:
    """One snapshot over several units; rates add up, percentiles pool the samples."""
    total = _concat(w.total for w in windows)
    p50, p90, p99 = percentiles(total)
    by_status = _sum_counts(w.by_status for w in windows)
    return StatsSnapshot(
        window_s=window_s,
        queue_depth=sum(w.queue_depth for w in windows),
        in_flight=sum(w.in_flight for w in windows),
        qps=sum(w.ok / w.span_s for w in windows if w.span_s > 0),
        error_qps=sum(w.errors / w.span_s for w in windows if w.span_s > 0),
        samples=int(total.size), p50_us=p50, p90_us=p90, p99_us=p99,
        max_us=float(total.max()) if total.size else None,
        queue_us=_mean(_concat(w.queue for w in windows)),
        compute_us=_mean(_concat(w.compute for w in windows)),
        service_time_us=service_time_us,
        served=by_status.get(OK, 0), by_status=by_status,
        batches=_sum_counts(w.batches for w in windows),
        latency_hist=_sum_counts(w.hist for w in windows),
        sums_us=_sum_counts(w.sums for w in windows),
    )


@dataclass(frozen=True)
class ModelSnapshot:
    """One model version: the pooled totals and each context's own figures."""

    model: str
    version: str
    total: StatsSnapshot
    contexts: tuple[StatsSnapshot, ...]

    def as_json(self) -> dict[str, Any]:
        """The snapshot as JSON-ready dicts: built once per snapshot (an idle version's is reused
        snapshot after snapshot), a fresh copy of the outer dicts each call."""
        built = self.__dict__.get("_json")
        if built is None:
            built = {"model": self.model, "version": self.version, **self.total.as_json(),
                     "contexts": [c.as_json() for c in self.contexts]}
            object.__setattr__(self, "_json", built)  # frozen: a cache, not a field
        return {**built, "contexts": [dict(c) for c in built["contexts"]]}


class ModelStats:
    """Statistics of one model version: one `Stats` per context plus one for the router.

    Executors record on their context's `Stats`; the router records the
    replies no context saw (429, 503, 504 before dispatch) on `router`,
    which also carries the model queue's depth gauge. A snapshot pools them,
    so the hot path records each request exactly once.
    """

    def __init__(self, model: str, version: str, *, queue_depth: Gauge | None = None,
                 **options: Any) -> None:
        self.model = model
        self.version = version
        self._options = options
        self.router = Stats(queue_depth=queue_depth, **options)
        # Copy-on-write tuple: executors and the publisher read it without a lock.
        self._contexts: tuple[Stats, ...] = ()
        self._lock = threading.Lock()
        # A version without traffic: (its marks, since when they stand, the snapshot once its
        # window emptied). Snapshots of an idle version then cost a few sums, not a pass over rings.
        self._quiet: tuple[tuple[Any, ...], float, ModelSnapshot | None] | None = None

    @property
    def contexts(self) -> tuple[Stats, ...]:
        return self._contexts

    def follow_queue(self, queue_depth: Gauge) -> None:
        """Read the model queue's depth from `queue_depth` from now on (another placement serves
        the version, with these statistics: models/switch.py)."""
        self.router._queue_depth = queue_depth

    def add_context(self, *, in_flight: Gauge | None = None, queue_depth: Gauge | None = None) -> Stats:
        """A `Stats` for a new execution context (its own queue, if it has one)."""
        stats = Stats(in_flight=in_flight, queue_depth=queue_depth, **self._options)
        with self._lock:
            self._contexts = (*self._contexts, stats)
        return stats

    def remove_context(self, stats: Stats) -> None:
        """Retire a context; its cumulative counters stay in the model's totals."""
        with self._lock:
            self._contexts = tuple(s for s in self._contexts if s is not stats)
        self.router._absorb(stats._window())

    def service_time_us(self) -> float:
        """Time per input row of the contexts working in parallel (µs); 0.0 before any call.

        Contexts serve the queue side by side, so their rates add up:
        1 / Σ (1 / sᵢ). Retry-After = queued rows × this.
        """
        times = [t for t in (s.service_time_us() for s in self._contexts) if t]
        return 1.0 / sum(1.0 / t for t in times) if times else self.router.service_time_us()

    def snapshot(self) -> ModelSnapshot:
        """The model's totals and per-context figures as of now: nothing recorded since its window
        emptied, the same as the last one (every figure is then a count or empty)."""
        contexts = self._contexts
        marks = (contexts, self.router.mark(), *(s.mark() for s in contexts))
        now = self.router._clock()
        quiet = self._quiet
        if quiet is None or quiet[0] != marks:
            self._quiet = (marks, now, None)
        elif quiet[2] is not None:
            return quiet[2]
        snapshot = self._snapshot(contexts)
        if quiet is not None and quiet[0] == marks and now - quiet[1] > self.router.quiet_s:
            self._quiet = (marks, quiet[1], snapshot)
        return snapshot

    def _snapshot(self, contexts: tuple[Stats, ...]) -> ModelSnapshot:
        windows = [self.router._window()] + [s._window() for s in contexts]
        per_context = tuple(_summarize([w], s.window_s, s._ewma)
                            for w, s in zip(windows[1:], contexts))
        total = _summarize(windows, self.router.window_s, self.service_time_us() or None)
        return ModelSnapshot(self.model, self.version, total, per_context)
