"""What the operators' side (admin socket, stats, metrics, health) needs of the running daemon.

The composition root (app.py's App) satisfies `Daemon`; admin code is
written against these protocols, never against the root or the frontend
loop's class, so what admin reads is listed here and nowhere else.
`Frontend` is the part of it that is the loop's own: its counters and
the state of its sockets, which the status reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

import zmq

from infermux import config as cfg
from infermux.cameras.supervisor import Cameras
from infermux.events import EventLog
from infermux.execution.streams import StreamTable
from infermux.frontend.express import ExpressLane
from infermux.frontend.oversize import OversizeMemory
from infermux.frontend.parsecache import ParseCache
from infermux.frontend.recorder import Recorder
from infermux.frontend.router import Router
from infermux.models.registry import Registry
from infermux.pipelines.runner import Pipelines
from infermux.pipelines.snapshots import Snapshots
from infermux.sinks.hub import Hub
from infermux.swap.reload import ReloadPlan
from infermux.swap.rollout import Rollouts
from infermux.transport.peers import PeerGuard
from infermux.transport.regions import RegionServer, RegionTable
from infermux.transport.wire import Choice
from infermux.workers.pool import Workers


class Frontend(Protocol):
    """What the status reads of the frontend loop (frontend/server.py): counters and sockets."""

    @property
    def requests(self) -> int: ...
    @property
    def replies_too_large(self) -> int: ...
    @property
    def frontend_native_id(self) -> int | None: ...
    @property
    def wire_choice(self) -> Choice: ...
    @property
    def express(self) -> ExpressLane | None: ...
    @property
    def parses(self) -> ParseCache: ...
    @property
    def oversize(self) -> OversizeMemory: ...
    @property
    def peers(self) -> PeerGuard: ...
    @property
    def regions(self) -> RegionTable: ...
    @property
    def region_server(self) -> RegionServer | None: ...


class Daemon(Protocol):
    """What admin commands, the stats stream and the metrics page read and steer of the daemon."""

    config: cfg.Config  # the one in force: a reload replaces it
    run_dir: Path
    ctx: zmq.Context
    events: EventLog
    started: float  # time.time() at construction
    endpoints: list[str]
    registry: Registry
    router: Router
    rollouts: Rollouts
    recorder: Recorder
    pipelines: Pipelines
    streams: StreamTable
    workers: Workers
    ticks: list[Callable[[], None]]  # called on the loop's turns (the liveness probe's among them)
    draining: bool  # admin `drain` sets it: new requests are refused until `resume`
    cameras: Cameras | None  # [[cameras]]' processes, once started
    sinks: Hub  # where events go
    snapshots: Snapshots  # keyed streams' newest frames, objects' best frames (`ctl snapshot`)

    @property
    def frontend(self) -> Frontend: ...
    @property
    def stopping(self) -> bool: ...
    @property
    def requests(self) -> int: ...
    def reload(self) -> ReloadPlan: ...
    def summary(self) -> str: ...
