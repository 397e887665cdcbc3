"""Health probes for load balancers and Kubernetes: is the loop alive, should traffic come here.

Both are read without a lock: the loop only stores a float per turn, and the
registry's model table is replaced whole on change (Registry.put), never
edited in place. docs/fleet.md says how to point probes at them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from infermux.config import HOT
from infermux.models.registry import State

if TYPE_CHECKING:
    from infermux.models.registry import Model, Registry

# The serving loop turns at least every `poll_ms` (1 s; idle, it sleeps until then
# or until a tick is due, the systemd watchdog's among them). Ten seconds without
# a turn is a wedged loop, not a busy one: well above a slow turn on a loaded
# small device, well under the packaged unit's WatchdogSec=30.
LIVE_WITHIN_S = 10.0


@dataclass(frozen=True)
class Verdict:
    """A probe's answer: HTTP 200 when ok, else 503; `reason` is the body."""

    ok: bool
    reason: str

    @property
    def status(self) -> int:
        return 200 if self.ok else 503


class Liveness:
    """Remembers the serving loop's last turn: a tick on the frontend loop's `ticks`, beside the watchdog's."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, within_s: float = LIVE_WITHIN_S) -> None:
        self._clock, self.within_s = clock, within_s
        self.last_turn: float | None = None

    def tick(self) -> None:
        self.last_turn = self._clock()

    def verdict(self, stopping: bool = False) -> Verdict:
        """Alive if the loop turned within `within_s`; a daemon draining to stop counts as alive."""
        if stopping:
            return Verdict(True, "alive, stopping (answering what it accepted)")
        last = self.last_turn
        if last is None:
            return Verdict(False, "the serving loop has not started")
        silent = self._clock() - last
        if silent > self.within_s:
            return Verdict(False, f"the serving loop has not turned for {silent:.1f} s")
        return Verdict(True, "alive")


class Serving(Protocol):
    """What readiness reads of the daemon (app.py's App): whether it stops or drains, and its models."""

    @property
    def stopping(self) -> bool: ...
    @property
    def draining(self) -> bool: ...
    @property
    def registry(self) -> "Registry": ...


def readiness(server: Serving) -> Verdict:
    """Ready when not draining and every hot model's serving version is ready."""
    if server.stopping:
        return Verdict(False, "not ready: shutting down")
    if server.draining:
        return Verdict(False, "not ready: draining (admin `resume` reopens it)")
    waiting = [problem for model in server.registry.models.values()
               if (problem := _not_serving(model)) is not None]
    if waiting:
        return Verdict(False, "not ready: " + "; ".join(waiting))
    return Verdict(True, "ready")


def _not_serving(model: "Model") -> str | None:
    """Why a hot model cannot serve yet (None if it can, or if it is cold and loads on demand)."""
    if not any(mv.config.placement == HOT or mv.config.preload for mv in model.ordered()):
        return None
    mv = model.default()
    if mv is None or mv.state is State.READY:
        return None
    why = f" ({mv.reason})" if mv.state is State.FAILED and mv.reason else ""
    return f"{mv.name}:{mv.version} is {mv.state.value}{why}"
