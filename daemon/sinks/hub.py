"""The sinks the configuration names, each a spool and a thread that delivers it (docs/events.md#sinks).

The pipelines hand every event to `Hub.publish`, which appends it to the
spool of each sink that takes the pipeline's events, and returns: a sink
that is slow, down or stuck delays nobody but itself. Each sink's thread
takes the oldest waiting events, hands them to the sink, and drops from the
spool those the sink acknowledged; after a failure it waits (`retry_s`,
doubling to `max_retry_s`) and offers the same events again, so they arrive
in order, at least once. One more thread fsyncs every spool every SYNC_S,
so that no delivery waits for the disk. A sink whose delivery never blocks
(`immediate`: the PUB socket) is handed each event by `publish` itself,
after the append, while it is up and its thread is not delivering: the
event then leaves without waiting for that thread to be woken and run. A reload replaces the sinks whose entry changed
and leaves the others running; a replaced sink's spool is kept (its name
is its folder), so nothing waiting is lost.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from infermux.events import EventLog
from infermux.plugins import sinks as plugins
from infermux.plugins.sinks import OutEvent, Sink, SinkDown
from infermux.config import SinkConfig
from infermux.sinks.spool import Spool

log = logging.getLogger("infermux.sinks")

SYNC_S = 0.05  # appended events are fsynced this often at most: one fsync covers many events
# A sink's thread woken for fewer than a batch waits this long for more before it delivers: a broker's
# round trip for each event, at a steady rate, costs far more than one for a batch.
LINGER_S = 0.01
IDLE_WAKE_S = 1.0  # a sink's thread with nothing to deliver looks again this often (an append wakes it at once)
DROPPED_EVERY_S = 10.0  # a spool that drops events says so once per this interval, with the count
MAX_ERROR_CHARS = 500
STOP_WAIT_S = 5.0  # a delivery under way when the sink stops may take this long; its events stay spooled


class Outlet(Protocol):
    """Where a pipeline hands its events and results (pipelines/lifecycle.py's Outlet)."""

    events: Callable[[str, dict[str, Any]], None] | None
    results: Callable[[str, str, dict[str, Any]], None] | None


class Runner:
    """One sink: its spool, its plugin, the thread that delivers, and its counts for the views."""

    def __init__(self, config: SinkConfig, folder: Path, events: EventLog, spool: Spool | None = None) -> None:
        self.config, self.events = config, events
        if spool is None:
            spool = Spool(folder / config.name, config.max_events, int(config.max_mb * (1 << 20)))
        spool.max_events, spool.max_bytes = config.max_events, int(config.max_mb * (1 << 20))
        self.spool = spool  # a reload that changes the sink hands its successor the same spool
        self.sink: Sink = plugins.create(config.kind, config.name, config.options)
        self.state = "starting"
        self.delivered = 0
        self.last_error = ""
        self.last_error_time: float | None = None
        self._reported_drops = 0
        self._reported_at = 0.0
        self._stop = threading.Event()
        # A sink whose delivery never blocks (a PUB socket) is handed an event on the appending thread,
        # saving it the sink thread's wake-up; the lock keeps the two deliveries one at a time, in order.
        self.immediate = bool(getattr(self.sink, "immediate", False))
        self._delivering = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"sink-{config.name}", daemon=True)
        self._thread.start()

    def takes(self, pipeline: str) -> bool:
        """Whether the sink takes `pipeline`'s events (`pipelines` in its entry; empty: every one)."""
        return not self.config.pipelines or pipeline in self.config.pipelines

    def _run(self) -> None:
        wait = self.config.retry_s
        while not self._stop.is_set():
            # No fsync here: the hub's syncer makes the spool durable, so an event never waits behind the disk.
            self.spool.wait(IDLE_WAKE_S)
            if not self.immediate and 0 < self.spool.backlog()[0] < self.config.batch:
                self._stop.wait(LINGER_S)
            try:
                with self._delivering:
                    delivered = self._deliver_some()
                if delivered:
                    wait = self.config.retry_s
                    continue
            except SinkDown as exc:
                self._down(str(exc))
            except Exception as exc:  # a plugin's bug: the sink retries, the daemon goes on
                log.exception("sink %r failed", self.config.name)
                self._down(f"{type(exc).__name__}: {exc}")
            else:
                continue
            self._stop.wait(wait)
            wait = min(wait * 2, self.config.max_retry_s)

    def append(self, data: bytes) -> None:
        """Spool one event; an `immediate` sink that is up and not delivering already gets it now, on
        the caller's thread, without waking the sink's; otherwise (and after any failure) the sink's
        thread delivers it, as ever."""
        if not self.immediate or self.state != "up":
            self.spool.append(data)
            return
        if not self.spool.append(data, wake=False) or not self._delivering.acquire(blocking=False):
            self.spool.wake()  # the sink's thread, delivering now, takes it next anyway
            return
        try:
            if not self._stop.is_set():  # a stopping sink's socket is closed, or about to be
                self._deliver_some()
        except Exception:  # noqa: BLE001 - the sink's thread meets it again, retries and says why
            pass
        finally:
            self._delivering.release()
        if self.spool.backlog()[0]:  # more than a batch waited, or this delivery failed
            self.spool.wake()

    def _deliver_some(self) -> bool:
        """Hand the oldest waiting events to the sink; True when any were acknowledged."""
        batch = self.spool.peek(self.config.batch)
        if not batch:
            return False
        events = [_out(data) for _, data in batch]
        done = self.sink.deliver(events)
        if not 0 < done <= len(events):  # a plugin that neither delivered nor said why: tried again later
            raise SinkDown(f"the sink acknowledged {done} of {len(events)} events")
        self.spool.ack(batch[done - 1][0])
        self.delivered += done
        if self.state != "up":
            if self.state == "down":
                self.events.emit("sink_up", sink=self.config.name)
            self.state = "up"
        return True

    def _down(self, error: str) -> None:
        self.last_error, self.last_error_time = error[:MAX_ERROR_CHARS], time.time()
        if self.state != "down":
            self.events.emit("sink_down", sink=self.config.name, error=self.last_error)
            self.state = "down"

    def sync(self) -> None:
        """Make the spool durable, and say how many it dropped (the hub's syncer, every SYNC_S)."""
        try:
            self.spool.sync()
        except OSError as exc:  # the state directory's disk: the events stay in memory and are still delivered
            self.spool.write_error = f"cannot sync: {exc.strerror or exc}"
        self._report_drops()

    def _report_drops(self) -> None:
        dropped = self.spool.dropped
        now = time.monotonic()
        if dropped > self._reported_drops and now - self._reported_at >= DROPPED_EVERY_S:
            self.events.emit("sink_dropped", sink=self.config.name, dropped=dropped - self._reported_drops,
                             max_events=self.config.max_events, max_mb=self.config.max_mb)
            self._reported_drops, self._reported_at = dropped, now

    def view(self) -> dict[str, Any]:
        """State, backlog and counts, as `ctl sinks`, the console and Prometheus show them."""
        waiting, size, oldest = self.spool.backlog()
        return {"name": self.config.name, "kind": self.config.kind, "state": self.state, "backlog": waiting,
                "backlog_bytes": size, "oldest_age_s": round(max(0.0, time.time() - oldest), 3) if oldest else None,
                "delivered": self.delivered, "dropped": self.spool.dropped, "max_events": self.config.max_events,
                "max_bytes": int(self.config.max_mb * (1 << 20)),
                "last_error": self.last_error or (f"spool: {self.spool.write_error}" if self.spool.write_error else ""),
                "last_error_time": self.last_error_time}

    def stop(self, close_spool: bool = True) -> None:
        """End the thread (after the delivery under way) and the sink; the spool too, unless handed on."""
        self._stop.set()
        self.spool.wake()
        self._thread.join(timeout=STOP_WAIT_S)
        # After a delivery under way on a pipeline's thread (an immediate sink's); one that hangs is
        # waited for no longer than the sink's thread is.
        held = self._delivering.acquire(timeout=STOP_WAIT_S)
        try:
            self.sink.close()
        finally:
            if held:
                self._delivering.release()
        if close_spool:
            self.spool.close()


def _out(data: bytes) -> OutEvent:
    event = json.loads(data)
    return OutEvent(str(event.get("key", "")), str(event.get("type", "")), str(event.get("id", "")), data)


class Hub:
    """Every configured sink by name; the pipelines' outlet (pipelines/lifecycle.py) feeds it."""

    def __init__(self, configs: tuple[SinkConfig, ...], folder: Path, events: EventLog) -> None:
        self.folder, self.events = folder, events
        self.runners: dict[str, Runner] = {}
        self._outlets: list[Outlet] = []
        self._dirtied = threading.Event()  # some spool has something to fsync: the syncer sleeps until then
        self.apply(configs)
        self._stopped = threading.Event()
        # Events of one stream come from its pipeline's threads and from the thread that ends unseen
        # objects: one at a time, so every sink's spool holds them in the same order.
        self._publishing = threading.Lock()
        # One thread fsyncs every spool, apart from the sinks' threads, which only deliver.
        self._syncer = threading.Thread(target=self._sync_all, name="sinks-sync", daemon=True)
        self._syncer.start()

    def _sync_all(self) -> None:
        """Fsync the spools SYNC_S after something was appended or acknowledged: asleep while idle."""
        while True:
            self._dirtied.wait()
            if self._stopped.wait(SYNC_S):  # the events of the next SYNC_S ride on the same fsync
                return
            self._dirtied.clear()  # before syncing: what is spooled after the clear is synced next time
            for runner in list(self.runners.values()):
                runner.sync()

    @property
    def wants_results(self) -> bool:
        return any(r.config.kind == "zmq" and r.config.options.get("results") for r in self.runners.values())

    def attach(self, outlet: Outlet) -> "Hub":
        """Take the pipelines' events (and their results while a sink publishes them)."""
        self._outlets.append(outlet)
        self._connect()
        return self

    def _connect(self) -> None:
        for runner in self.runners.values():  # the syncer's wake-up: new sinks' spools are handed it here
            runner.spool.dirtied = self._dirtied
        self._dirtied.set()  # what the spools held before they were handed it
        for outlet in self._outlets:
            outlet.events = self.publish
            outlet.results = self.result if self.wants_results else None

    def publish(self, pipeline: str, event: dict[str, Any]) -> None:
        """Append `event` to the spool of each sink taking `pipeline`'s events."""
        data = json.dumps(event, separators=(",", ":")).encode()
        with self._publishing:
            for runner in list(self.runners.values()):
                if runner.takes(pipeline):
                    runner.append(data)

    def result(self, pipeline: str, key: str, header: dict[str, Any]) -> None:
        """A frame's reply header, to the sinks that publish results (never waiting)."""
        data = json.dumps({"pipeline": pipeline, "key": key, **header}, separators=(",", ":")).encode()
        for runner in list(self.runners.values()):
            if runner.takes(pipeline):
                runner.sink.result(key, data)

    def apply(self, configs: tuple[SinkConfig, ...]) -> dict[str, list[str]]:
        """Move to `configs` (start, reload): unchanged sinks go on; changed ones restart on their spool."""
        wanted = {c.name: c for c in configs}
        changes: dict[str, list[str]] = {
            "added": [n for n in wanted if n not in self.runners],
            "removed": [n for n in self.runners if n not in wanted],
            "changed": [n for n in wanted if n in self.runners and self.runners[n].config != wanted[n]]}
        for name in changes["removed"]:
            self.runners.pop(name).stop()
        for name in changes["changed"]:  # the old runner's spool takes events until its successor has it
            old = self.runners[name]
            old.stop(close_spool=False)
            self.runners[name] = Runner(wanted[name], self.folder, self.events, old.spool)
        changes["added"] = [name for name in changes["added"] if self._start(wanted[name])]
        self._connect()
        for kind, names in changes.items():
            for name in names:
                self.events.emit(f"sink_{kind}", sink=name)
        return changes

    def _start(self, config: SinkConfig) -> bool:
        """Start a new sink on its spool; False (and `sink_failed`) where its spool cannot be opened."""
        try:
            self.runners[config.name] = Runner(config, self.folder, self.events)
        except OSError as exc:  # its spool's folder: the other sinks, and the daemon, go on without it
            self.events.emit("sink_failed", sink=config.name, error=f"cannot open its spool under {self.folder}: "
                             f"{exc.strerror or exc}; set [daemon] state_dir to a folder the daemon may write")
            return False
        return True

    def view(self) -> list[dict[str, Any]]:
        return [r.view() for r in self.runners.values()]

    def stop(self) -> None:
        self._stopped.set()
        self._dirtied.set()
        self._syncer.join(timeout=STOP_WAIT_S)
        for runner in list(self.runners.values()):
            runner.stop()
        self.runners.clear()
