"""Keeping placed models within the memory budget.

Before every load, hot or cold, `make_room` compares the version's estimated
need (budget.py) with what the placed models take and the memory free right
now; if it does not fit it stops idle cold workers, least recently used
first, or refuses the load saying who holds the memory, without stopping
anything in vain. After a load, `settle` corrects for an estimate that was
too low.

The registry owns the keeper, for both placements; the worker pool tells it
which cold versions may be stopped and stops them (`evict_with`).

Footprints (docs/architecture.md#memory-footprints) are taken one way per
placement, whichever path put the version there (`Placement.footprint`).
Hot (first load, unload/load, promote, hot swap, reload): the engine's own
figure, never the daemon's RSS growth, which counts libraries loaded once
for all, allocator reuse and concurrent loads. Cold (load on demand, demote,
restart): what the worker process costs, its RSS plus the GPU memory NVML
gives its pid, or what its load visibly took (`unseen`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Protocol

from infermux.config import COLD, ModelConfig
from infermux.execution.placement import Placement
from infermux.models import budget as mem
from infermux.models.version import ModelVersion, State

if TYPE_CHECKING:
    from infermux.models.registry import Registry

log = logging.getLogger("infermux.memory")


class ColdFootprint(Protocol):
    """What the keeper reads of a cold placement to take its footprint (workers/proxy.py)."""

    gpu_bytes: int  # its worker's GPU memory, as NVML gave it for the pid

    @property
    def pid(self) -> int: ...

    def footprint(self) -> int:
        """What its worker process costs now: RSS plus GPU memory (or what its load visibly took)."""
        ...


class MemoryKeeper:
    """Estimates, room before a load, LRU eviction of idle cold workers.

    The worker pool says which versions may be stopped (`stoppable`: cold, ready, idle, and
    not being moved) and stops them (`stop`); the keeper decides which and when. Until it
    does (`evict_with`), nothing may be stopped.
    """

    def __init__(self, registry: "Registry", budget: mem.MemoryBudget,
                 stop: Callable[[ModelVersion], None] = lambda mv: None,
                 stoppable: Callable[[ModelVersion], bool] = lambda mv: False) -> None:
        self.registry = registry
        self.events = registry.events
        self.budget = budget
        self._stop, self._stoppable = stop, stoppable
        self.footprints: dict[tuple[str, str], int] = {}  # last measured, kept after an unload
        self.worker_base = 0  # RSS of a fresh worker, from its HELLO
        self._lock = threading.Lock()

    def evict_with(self, stop: Callable[[ModelVersion], None], stoppable: Callable[[ModelVersion], bool]) -> None:
        """How idle cold versions are stopped to make room, and which may be (the worker pool's)."""
        self._stop, self._stoppable = stop, stoppable

    def placed(self, mc: ModelConfig, placement: Placement) -> int:
        """A version's footprint once `placement` serves it. A cold one's is remembered as its
        estimate for the next load; a hot one's is not: loading needs more than the engine
        keeps (the file read beside it: budget.FILE_FACTOR)."""
        footprint = placement.footprint()
        if placement.kind == COLD and footprint:
            self.footprints[mc.key] = footprint
        return footprint

    def estimate(self, mv: ModelVersion) -> int:
        return mem.estimate(mv.config, self.footprints.get(mv.config.key, 0), self.worker_base)

    def used(self, exclude: ModelVersion | None = None, device: int | None = None) -> int:
        """Bytes placed models take (on GPU `device`; None: all), counting versions still loading
        at their estimate."""
        total = 0
        for mv in self.registry.all_versions():
            if mv is exclude or (device is not None and self.budget.device_for(mv.config) != device):
                continue
            if mv.memory_bytes:
                total += mv.memory_bytes
            elif mv.state in (State.LOADING, State.WARMING):
                total += self.estimate(mv)
        return total

    def room_for_contexts(self, mv: ModelVersion, contexts: int) -> str | None:
        """Why `mv` may not grow to `contexts` contexts within the memory budget, or None. The growth
        is estimated as a load's is (the engine file's size per added copy: an onnxruntime session
        holds its own weights; a TensorRT engine's contexts share it, and are held by max_contexts)."""
        more = mem.estimate(replace(mv.config, contexts=contexts), 0, 0) - mem.estimate(mv.config, 0, 0)
        if more <= 0:
            return None
        config = self.registry.config
        self.budget.follow(config.daemon.memory_budget, config.path)
        device = self.budget.device_for(mv.config)
        limit, used = self.budget.limit_of(device), self.used(device=device)
        if used + more <= limit:
            return None
        return (f"{contexts} contexts would take about {mem.mb(more)} more, and {mem.mb(used)} of the "
                f"{mem.mb(limit)} memory budget is in use (memory_budget)")

    def make_room(self, mv: ModelVersion) -> None:
        """Stop least recently used idle cold workers until `mv` fits; BudgetExceeded if it cannot."""
        need = self.estimate(mv)
        config = self.registry.config
        self.budget.follow(config.daemon.memory_budget, config.path)  # SIGHUP may have changed it
        device = self.budget.device_for(mv.config)  # several GPUs: each has its own budget
        limit = self.budget.limit_of(device)
        with self._lock:
            while True:
                used, free = self.used(exclude=mv, device=device), self.budget.available(device)
                if used + need <= limit and need <= free:
                    return
                idle = self._same_device(self._idle_workers(exclude=mv), device)
                reclaimable = sum(v.memory_bytes for v in idle)
                fits = used - reclaimable + need <= limit and need <= free + reclaimable
                victim = min(idle, key=self._last_use) if idle and fits else None
                if victim is None:  # stopping every idle worker would not be enough: stop none
                    why = self._why(mv, need, used, free, device)
                    self.events.emit("refused", mv.name, mv.version, reason=why)
                    raise mem.BudgetExceeded(why)
                self._evict(victim, f"making room for {mv.name}:{mv.version}")

    def _why(self, mv: ModelVersion, need: int, used: int, free: int, device: int | None) -> str:
        where = self.budget.source if device is None else f"GPU {device}"
        if need > free:
            return (f"{mv.name}:{mv.version} needs about {mem.mb(need)} but only {mem.mb(free)} of "
                    f"{where} memory is free")
        holders = sorted((v for v in self.registry.all_versions() if v.memory_bytes and v is not mv),
                         key=lambda v: -v.memory_bytes)[:3]
        held = ", ".join(f"{v.name}:{v.version} {mem.mb(v.memory_bytes)}" for v in holders) or "nothing"
        return (f"memory budget: {mv.name}:{mv.version} needs about {mem.mb(need)}, {mem.mb(used)} of the "
                f"{mem.mb(self.budget.limit_of(device))}{'' if device is None else ' ' + where} budget is in use ({held}) and no idle cold model is left to stop")

    def _same_device(self, versions: list[ModelVersion], device: int | None) -> list[ModelVersion]:
        return [v for v in versions if device is None or self.budget.device_for(v.config) == device]

    def _idle_workers(self, exclude: ModelVersion) -> list[ModelVersion]:
        """Cold versions serving nothing right now: what may be stopped to make room."""
        return [mv for mv in self.registry.all_versions() if mv is not exclude and self._stoppable(mv)]

    @staticmethod
    def _last_use(mv: ModelVersion) -> float:
        placement = mv.placement
        return max(mv.last_used, placement.created if placement is not None else 0.0)

    def _evict(self, victim: ModelVersion, why: str) -> None:
        worker = victim.worker_info()
        self.events.emit("evicted", victim.name, victim.version, reason=why,
                         freed_mb=round(victim.memory_bytes / 2**20, 1), pid=worker["pid"] if worker else 0)
        self._stop(victim)

    def settle(self, loaded: ModelVersion) -> None:
        """After a load measured more than estimated: stop idle cold workers until under budget."""
        device = self.budget.device_for(loaded.config)  # only the GPU it loaded on can be over
        limit = self.budget.limit_of(device)
        with self._lock:
            while self.used(device=device) > limit:
                idle = self._same_device(self._idle_workers(exclude=loaded), device)
                victim = min(idle, key=self._last_use) if idle else None
                if victim is None:
                    log.warning("memory budget exceeded: %s in use, budget %s", mem.mb(self.used(device=device)),
                                mem.mb(limit))
                    return
                self._evict(victim, f"over budget after loading {loaded.name}:{loaded.version}")

    def unseen(self, free_before: int, rss_grown: int) -> int:
        """Memory the load took that the worker's RSS does not show (an estimate; concurrent loads blur it).

        GPU budget: the drop in free GPU memory, for when NVML cannot attribute it to the pid
        (containers). Jetson: the drop in available memory beyond the worker's RSS growth
        (`rss_grown`), which is where CUDA allocations (nvmap) show up. Elsewhere RSS says it all.
        """
        if self.budget.source == "host" and not self.budget.jetson:
            return 0  # RSS is the whole story, and other processes' churn would only add noise
        drop = max(0, free_before - self.budget.available())
        if self.budget.source == "gpu":
            return drop
        return max(0, drop - max(0, rss_grown))

    def measure(self, key: tuple[str, str], proxy: ColdFootprint, gpu: dict[int, int] | None = None) -> int:
        """A cold version's footprint now, remembered as its estimate for the next load; `gpu` is
        NVML's GPU memory by pid, where it was read this time."""
        if gpu is not None:
            proxy.gpu_bytes = gpu.get(proxy.pid, 0)
        footprint = proxy.footprint()
        if footprint:
            self.footprints[key] = footprint
        return footprint
