"""A placement: where one loaded model version runs, as the rest of the daemon sees it.

There are two, and "placement" means only these (`kind`, as the configuration's
`placement` key says it):

- hot, `Scheduler` (execution/scheduler.py): the version's contexts run on
  executor threads inside the daemon;
- cold, `WorkerProxy` (workers/proxy.py): they run in a worker process, and
  the proxy forwards requests to it and its replies to the clients.

A placer makes one (models/placer.py: `HotPlacer`, and the worker pool for
cold) and `ModelVersion.placement` holds it. The router admits requests to it
(`submit`, `push_out`, `expected_wait_us`) or computes one at once on an idle
context it offers (`idle_context`: the fast path, hot only), the registry changes (`apply`),
measures (`footprint`) and stops it, the switch hands one over to its
successor (`hand_over`: hot swap, reload, promote/demote), and the admin
views read it (`contexts`, `settings`, `worker_info`). Whatever one of them is
asked, the other answers too: `Placement` states it, and mypy checks both
against it (tests/unit/repository/test_typecheck.py). Nothing asks which class it is.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from infermux.execution.executor import Executor
from infermux.execution.job import Job
from infermux.plugins.base import Engine


class Admission(enum.Enum):
    """What `Placement.submit` did with a request."""

    QUEUED = "queued"  # it will be answered by the placement
    FULL = "full"  # the queue is at max_queue: push out, fall back, or 429
    CLOSED = "closed"  # the placement takes no more work (stopping, or its worker ended): 503


@dataclass(frozen=True)
class ContextLoad:
    """One execution context's queue, as the views show it."""

    queued: int
    in_flight: int


@dataclass(frozen=True)
class Settings:
    """The live settings of a placement (admin `set` and reload change them through `apply`)."""

    contexts: int
    max_queue: int
    max_batch: int
    batch_delay_us: int
    preferred_batch: tuple[int, ...]
    batching_allowed: bool  # whether the engine's tensors let requests merge at all (batcher.batchable)
    queue_policy: str = "fifo"  # config.QUEUE_POLICIES
    per_key_depth: int = 1


@dataclass(frozen=True)
class Change:
    """Settings to change live; None leaves one as it is."""

    contexts: int | None = None
    max_queue: int | None = None
    max_batch: int | None = None
    batch_delay_us: int | None = None
    preferred_batch: tuple[int, ...] | None = None
    queue_policy: str | None = None
    per_key_depth: int | None = None

    @classmethod
    def of(cls, settings: dict[str, Any]) -> "Change":
        """The change a dict of model settings (ModelConfig field names) asks for; other keys are ignored."""
        preferred = settings.get("preferred_batch")
        return cls(contexts=settings.get("contexts"), max_queue=settings.get("max_queue"),
                   max_batch=settings.get("max_batch"), batch_delay_us=settings.get("batch_delay_us"),
                   preferred_batch=None if preferred is None else tuple(preferred),
                   queue_policy=settings.get("queue_policy"), per_key_depth=settings.get("per_key_depth"))

    def __bool__(self) -> bool:
        return any(value is not None for value in asdict(self).values())


class Placement(Protocol):
    """Everything the daemon needs of where a model version runs (hot or cold)."""

    name: str
    version: str

    @property
    def kind(self) -> str:
        """"hot" (in the daemon) or "cold" (in a worker process): config.PLACEMENTS."""
        ...

    @property
    def engine(self) -> Engine:
        """Its engine; a cold one's only describes the tensors (workers/remote.py RemoteEngine)."""
        ...

    @property
    def backend(self) -> str:
        """The backend that runs it ("onnxruntime", "tensorrt", ...)."""
        ...

    @property
    def created(self) -> float:
        """When it was made (time.monotonic()): a version's idle time counts from here at the earliest."""
        ...

    # -- admission (the router, on the frontend thread) -------------------------------

    def submit(self, job: Job) -> Admission:
        """Take `job`, or say why not; QUEUED means the placement answers it."""
        ...

    def push_out(self, job: Job) -> Job | None:
        """The queue is full: a queued request of the key that holds the most of it, removed to
        make room for `job` (the caller refuses it); None when `job`'s key holds as much, or
        where queued requests cannot be taken back (cold: they are in the worker already).
        Under fifo the hog gives up its newest request, under newest_per_key its oldest."""
        ...

    def expected_wait_us(self) -> float:
        """Queueing plus service time for a request admitted now (deadline fallback, Retry-After)."""
        ...

    def idle_context(self, rows: int, key: Any = None) -> Executor | None:
        """The fast path: a context that may compute a request of `rows` rows (and `key`) on the
        calling thread at once, because nothing about it needs deciding (no batching, no queue, no
        key to place, the inline gate allows it), for `Executor.compute`; None where none may, and
        always for a cold placement (its contexts are in its worker). What the router asks, once,
        for the general path's checks and the express lane's alike (Router.idle)."""
        ...

    # -- what is queued ---------------------------------------------------------------

    def depth(self) -> int:
        """Requests waiting for a context."""
        ...

    def load(self) -> int:
        """Requests waiting or running (0: idle)."""
        ...

    def rows(self) -> int:
        """Input rows waiting or running: what the expected wait is measured in."""
        ...

    def contexts(self) -> list[ContextLoad]:
        """Each context's queue, for the views."""
        ...

    # -- settings and life --------------------------------------------------------------

    def settings(self) -> Settings:
        """The settings in force."""
        ...

    def apply(self, change: Change) -> None:
        """Change settings live (contexts are added now, removed ones finish their queue first)."""
        ...

    def hand_over(self, successor: "Placement", reason: str) -> None:
        """A switch replaced it (models/switch.py): a request still submitted to it once it stops
        taking work goes to `successor` instead; `reason` ("replaced", "promoted", ...) is what
        its end is logged as. `stop` still answers what it had accepted."""
        ...

    def stop(self, timeout: float | None = None, reason: str = "unloaded") -> bool:
        """Take no new requests, answer those accepted, release the contexts; True if all were
        answered within `timeout`. `reason` is why, for the log (a cold worker's `worker_stopped`)."""
        ...

    def footprint(self) -> int:
        """The memory it takes now, measured one way per placement (docs/architecture.md#memory-footprints):
        hot, its engine's own figure; cold, what its worker process costs (RSS plus GPU memory)."""
        ...

    def worker_info(self) -> dict[str, Any] | None:
        """The worker process serving it (pid, RSS, state...), None when it runs in the daemon."""
        ...


def wait_us(rows: int, service_time_us: float) -> float:
    """Expected wait behind `rows` rows for one more, the contexts working side by side at a
    combined `service_time_us` per row (ModelStats.service_time_us)."""
    return (rows + 1) * service_time_us
