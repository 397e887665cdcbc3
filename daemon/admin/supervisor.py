"""systemd integration: what the service manager hears, and when (docs/architecture.md#systemd).

READY=1 only once every hot model is loaded and warm; STATUS= every few
seconds; WATCHDOG=1 from the frontend loop itself, so a wedged loop stops
the pings and systemd restarts us; EXTEND_TIMEOUT_USEC while engines load;
RELOADING=1 / READY=1 around SIGHUP; STOPPING=1 when the loop stops (SIGTERM).
"""

from __future__ import annotations

import signal
import threading
import time
from typing import TYPE_CHECKING, Callable, Protocol

from infermux.admin.notify import Notifier
from infermux.config import ConfigError

if TYPE_CHECKING:
    from infermux.events import EventLog
    from infermux.swap.reload import ReloadPlan

STATUS_EVERY_S = 2.0
EXTEND_EVERY_S = 10.0
EXTEND_BY_USEC = 30_000_000  # each extension covers three periods: a slow load never races it


class Supervised(Protocol):
    """What the supervisor drives of the daemon (app.py's App): the loop's ticks and what wakes it,
    its stop, its reload, and the one-line summary systemd shows."""

    ticks: list[Callable[[], None]]
    dues: list[Callable[[float], float | None]]
    on_stopping: list[Callable[[], object]]
    events: "EventLog"

    def stop(self) -> None: ...
    def wake(self) -> None: ...
    def summary(self) -> str: ...
    def reload(self) -> "ReloadPlan": ...


class Supervisor:
    """Feeds sd_notify from the daemon's loop and turns signals into its actions."""

    def __init__(self, server: Supervised, notifier: Notifier | None = None) -> None:
        self.server = server
        # The daemon's own children (cold workers) must not inherit NOTIFY_SOCKET.
        self.notifier = notifier or Notifier(unset_environment=True)
        self.watchdog_s = self.notifier.watchdog_interval_s()
        self.ready = False
        self._last = {"watchdog": 0.0, "status": 0.0, "extend": 0.0}
        self._reload_asked = False  # SIGHUP arrived; the next tick reloads
        server.ticks.append(self.tick)
        server.dues.append(self.due)
        server.on_stopping.append(self.notifier.stopping)

    def install_signals(self) -> None:
        """SIGTERM and SIGINT stop the daemon, SIGHUP reloads it.

        The handlers only set flags; the loop acts on them. A handler runs on
        the main thread between two bytecodes, possibly while that thread holds
        the notifier's lock in `tick`: a handler that sent STOPPING=1 itself
        waited on that lock for ever, and the daemon ignored SIGTERM until
        systemd's SIGKILL (a stress round caught it).
        """
        signal.signal(signal.SIGTERM, lambda *_: self.server.stop())
        signal.signal(signal.SIGINT, lambda *_: self.server.stop())
        signal.signal(signal.SIGHUP, lambda *_: self._ask_reload())

    def _ask_reload(self) -> None:
        self._reload_asked = True
        self.server.wake()  # an idle loop sleeps: the reload must not wait for its next turn

    def due(self, now: float) -> float | None:
        """Seconds from `now` until `tick` has something to send: the next WATCHDOG=1 (every half
        of WatchdogSec), STATUS= and EXTEND_TIMEOUT_USEC; None without a notification socket
        (all three are no-ops then)."""
        if not self.notifier.enabled:
            return None
        last = self._last
        soonest = last["status"] + STATUS_EVERY_S
        if self.watchdog_s:
            soonest = min(soonest, last["watchdog"] + self.watchdog_s)
        if not self.ready:
            soonest = min(soonest, last["extend"] + EXTEND_EVERY_S)
        return soonest - now

    def models_ready(self) -> None:
        """Every hot model is ready or failed: tell systemd we serve."""
        self.ready = True
        status = self.server.summary()
        self.server.events.emit("ready", status=status)
        self.notifier.ready(status)

    def tick(self) -> None:
        """Called by the frontend loop between its turns: when `due` says, at least every `poll_ms`,
        at most every TICK_S."""
        if self._reload_asked:
            self._reload_asked = False
            self.reload()
        now = time.monotonic()
        last = self._last
        if self.watchdog_s and now - last["watchdog"] >= self.watchdog_s:
            last["watchdog"] = now
            self.notifier.watchdog()
        if now - last["status"] >= STATUS_EVERY_S:
            last["status"] = now
            self.notifier.status(self.server.summary())
        if not self.ready and now - last["extend"] >= EXTEND_EVERY_S:
            last["extend"] = now
            self.notifier.extend_timeout(EXTEND_BY_USEC)

    def reload(self) -> None:
        """SIGHUP: re-read the configuration on a thread, bracketed by RELOADING/READY (the same
        `App.reload` as the admin command's: one at a time)."""
        def run() -> None:
            self.notifier.reloading()
            try:
                self.server.reload()
            except ConfigError:
                pass  # a `rejected` event says why; the running configuration stays
            self.notifier.ready(self.server.summary())

        threading.Thread(target=run, name="reload", daemon=True).start()
